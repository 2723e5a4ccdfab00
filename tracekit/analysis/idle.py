"""Why a device sat idle: the ``idle_ns`` of every breakdown window of a GPU rank split into host-bound,
synchronisation and other idle time (the idle-time breakdown Holistic Trace Analysis users know, on the
rank's whole device rather than stream by stream).

An *idle gap* is a maximal stretch of an iteration window with nothing on any compute, communication or
memory lane of the rank — exactly the instants attribution counts as idle (:mod:`tracekit.analysis.attribution`:
lanes unioned), so the gaps of a window add up to its ``idle_ns`` to the nanosecond. Each gap is:

``host_bound``  when the device activity that ends it (the first to start at or after the gap's end) was
                launched by a runtime call (same correlation id) that *started after the gap began*: the
                device had nothing queued and waited for the CPU to launch. The whole gap counts.
``sync``        otherwise, the instants of the gap during which a host thread of the rank was inside a
                synchronisation call (``cuda*Synchronize``, ``*StreamWaitEvent``, blocking ``cudaMemcpy``,
                Kineto's ``cuda_sync`` records of them);
``other``       the rest: work queued before the gap that started late (launch latency, a stream waiting on
                an event), or nothing traced explains it.

So ``host_bound_ns + sync_ns + other_ns = idle_ns`` in every window. A gap whose next activity has no
launch call in the trace (no correlation) is not host-bound: the trace cannot say. On CPU-only ranks
(gloo jobs) there is no device to wait, and the split is null — not zero.

Everything is one vectorised sweep (:func:`tracekit.analysis.intervals.sweep`) plus an as-of join; no loop over
events.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.analysis import attribution
from tracekit.analysis.graph.dag import SYNC_CALL, correlation_key
from tracekit.analysis.intervals import PACK_SHIFT, distinct, packs, sweep
from tracekit.model import schema
from tracekit.model.schema import dict_in, dict_match

#: runtime calls during which the host waits for the device: blocking calls, and stream waits on events
SYNC_NAME = SYNC_CALL + r"|WaitEvent"
#: Kineto's records of synchronisation (on the device rows, but timed as the host's wait)
SYNC_CATS = ("cuda_sync",)
_BUSY, _SYNC = 0, 1


def device_ranks(events: pa.Table) -> np.ndarray:
    """Ranks with device activity (kernels, copies, device-side communication): the ranks the split applies to."""
    on_dev = np.asarray(pc.is_valid(events.column("device")).to_numpy(zero_copy_only=False), dtype=bool)
    kind = dict_in(events.column("kind"), ("compute", "comm", "memory"))
    rank = events.column("rank").to_numpy(zero_copy_only=False)
    sel = on_dev & kind
    return distinct(rank[sel]).astype(np.int64) if sel.any() else np.zeros(0, np.int64)


def sync_intervals(events: pa.Table) -> pl.DataFrame:
    """``rank, start_ns, end_ns`` of the host's synchronisation calls (:data:`SYNC_NAME`, :data:`SYNC_CATS`)."""
    runtime = dict_in(events.column("kind"), ("runtime",))
    hit = runtime & (dict_match(events.column("name"), SYNC_NAME) | dict_in(events.column("cat"), SYNC_CATS))
    rows = np.flatnonzero(hit)
    sub = events.select(["rank", "start_ns", "dur_ns"]).take(pa.array(rows, pa.int64()))
    df = pl.from_arrow(sub)
    assert isinstance(df, pl.DataFrame)
    return df.select(pl.col("rank").cast(pl.Int64), "start_ns", (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"))


def launch_of_next(events: pa.Table, act: pl.DataFrame) -> pl.DataFrame:
    """Per rank and start time of an activity: ``rank, start_ns, launch_ns`` — the earliest start of the runtime
    calls that launched the activities starting then (null when none of them has a launch in the trace)."""
    ev = pl.from_arrow(events.select(["rank", "start_ns", "correlation"]))
    assert isinstance(ev, pl.DataFrame)
    on_dev = pl.Series(np.asarray(pc.is_valid(events.column("device")).to_numpy(zero_copy_only=False), dtype=bool))
    runtime = pl.Series(dict_in(events.column("kind"), ("runtime",)))
    ev = ev.with_columns(on_dev.alias("_dev"), runtime.alias("_rt"))
    calls = ev.filter(pl.col("_rt") & ~pl.col("_dev") & pl.col("correlation").is_not_null()).select(
        pl.col("rank").cast(pl.Int32), "correlation", "start_ns")
    corr = ev.select(pl.col("correlation").gather(act.get_column("row")), pl.col("_dev").gather(act.get_column("row")))
    a = act.select(pl.col("rank").cast(pl.Int32), "start_ns").with_columns(
        pl.when(corr.get_column("_dev")).then(corr.get_column("correlation")).alias("correlation"))
    # the earliest call per (rank, correlation), grouped on one int64 key where the pair fits it
    key = correlation_key(a.drop_nulls("correlation"), calls)
    if key is None:
        launches = calls.group_by(["rank", "correlation"]).agg(pl.col("start_ns").min().alias("launch_ns"))
        a = a.join(launches, on=["rank", "correlation"], how="left")
    else:
        launches = calls.group_by(key).agg(pl.col("start_ns").min().alias("launch_ns"))
        a = a.with_columns(key).join(launches, on="_k", how="left")
    return _earliest_per_start(a)


def _earliest_per_start(a: pl.DataFrame) -> pl.DataFrame:
    """``rank, start_ns, launch_ns``: the earliest launch per (rank, start), in (rank, start) order — grouped and
    sorted on one packed int64 key where rank and start fit it (a job's millions of rows sort several times faster
    on one column than on two), else on the pair."""
    if a.height and not a.get_column("rank").has_nulls() and not a.get_column("start_ns").has_nulls():
        b = a.select(pl.col("rank").min().alias("r0"), pl.col("rank").max().alias("r1"),
                     pl.col("start_ns").min().alias("t0"), pl.col("start_ns").max().alias("t1")).row(0)
        if None not in b and b[0] >= 0 and (b[1] + 1) * (b[3] - b[2] + 1) < 1 << 62:
            span = b[3] - b[2] + 1
            g = a.group_by((pl.col("rank").cast(pl.Int64) * span + (pl.col("start_ns") - b[2])).alias("_g")).agg(
                pl.col("launch_ns").min()).sort("_g")
            return g.select((pl.col("_g") // span).alias("rank"), (pl.col("_g") % span + b[2]).alias("start_ns"),
                            "launch_ns")
    return (a.group_by(["rank", "start_ns"]).agg(pl.col("launch_ns").min())
            .with_columns(pl.col("rank").cast(pl.Int64)).sort(["rank", "start_ns"]))


def _host_bound_joined(events: pa.Table, act: pl.DataFrame, g_rank: np.ndarray, g_start: np.ndarray,
                       g_end: np.ndarray) -> np.ndarray:
    """Per gap (``rank``, ``[start, end)``), whether it is host-bound: the earliest launch of the activities that
    start first at or after its end (:func:`launch_of_next`, a forward as-of join) began after the gap did."""
    nxt = launch_of_next(events, act)
    gaps = pl.DataFrame({"gap": np.arange(g_rank.size), "rank": g_rank, "g_end": g_end,
                         "g_start": g_start}).sort(["rank", "g_end"])
    j = gaps.join_asof(nxt, left_on="g_end", right_on="start_ns", by="rank", strategy="forward",
                       check_sortedness=False)
    hb = (pl.col("launch_ns").is_not_null() & (pl.col("launch_ns") > pl.col("g_start"))).fill_null(False)
    return j.with_columns(hb.alias("_hb")).sort("gap").get_column("_hb").to_numpy()


def _host_bound(events: pa.Table, act: pl.DataFrame, g_rank: np.ndarray, g_start: np.ndarray, g_end: np.ndarray
                ) -> np.ndarray | None:
    """:func:`_host_bound_joined` on packed int64 keys in numpy (a 300 MB trace's 215 k activities and 184 k gaps:
    two sorts and two searches, 0.14 s less CPU than polars' group-bys and joins); None where rank and correlation
    or rank and time do not fit one int64."""
    on_dev = np.asarray(pc.is_valid(events.column("device")).to_numpy(zero_copy_only=False), dtype=bool)
    corr = events.column("correlation")
    has_corr = np.asarray(pc.is_valid(corr).to_numpy(zero_copy_only=False), dtype=bool)
    corr = pc.fill_null(corr, 0).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    ev_rank = events.column("rank").to_numpy(zero_copy_only=False).astype(np.int64)
    ev_start = events.column("start_ns").to_numpy(zero_copy_only=False)
    call = np.flatnonzero(dict_in(events.column("kind"), ("runtime",)) & ~on_dev & has_corr)
    row = act.get_column("row").to_numpy()
    a_rank = act.get_column("rank").to_numpy().astype(np.int64)
    a_start = act.get_column("start_ns").to_numpy()
    launched = np.flatnonzero(on_dev[row] & has_corr[row])  # activities whose launch may be in the trace
    for r, v in ((ev_rank[call], corr[call]), (a_rank[launched], corr[row[launched]])):
        if r.size and not packs(int(r.min()), int(r.max()), int(v.min()), int(v.max())):
            return None
    # the earliest call per (rank, correlation), then per activity (int64 max: no launch in the trace)
    none = np.iinfo(np.int64).max
    launch = np.full(a_start.size, none, dtype=np.int64)
    if call.size and launched.size:
        ck = (ev_rank[call] << PACK_SHIFT) + corr[call]
        order = np.argsort(ck, kind="stable")
        ck = ck[order]
        firsts = np.flatnonzero(np.concatenate(([True], ck[1:] != ck[:-1])))
        earliest = np.minimum.reduceat(ev_start[call][order], firsts)
        keys = ck[firsts]
        ak = (a_rank[launched] << PACK_SHIFT) + corr[row[launched]]
        pos = np.minimum(np.searchsorted(keys, ak), keys.size - 1)
        hit = keys[pos] == ak
        launch[launched[hit]] = earliest[pos[hit]]
    # per (rank, start) of an activity, the earliest launch; each gap's is the first at or after its end
    t0 = min(int(a_start.min()), int(g_end.min()))
    span = max(int(a_start.max()), int(g_end.max())) - t0 + 1
    r0, r1 = min(int(a_rank.min()), int(g_rank.min())), max(int(a_rank.max()), int(g_rank.max()))
    if r0 < 0 or (r1 + 1) * span >= 1 << 62:
        return None
    key = a_rank * span + (a_start - t0)
    order = np.argsort(key, kind="stable")
    key = key[order]
    firsts = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1])))
    earliest = np.minimum.reduceat(launch[order], firsts)
    keys = key[firsts]
    pos = np.searchsorted(keys, g_rank * span + (g_end - t0))
    found = pos < keys.size
    pos = np.minimum(pos, keys.size - 1)
    found &= keys[pos] // span == g_rank
    got = earliest[pos]
    return found & (got != none) & (got > g_start)


def breakdown(events: pa.Table, iterations: pa.Table, windows: pa.Table | None = None,
              act: pl.DataFrame | None = None) -> pa.Table:
    """The ``idle_breakdown`` table: one row per iteration window of every rank (:data:`schema.IDLE_BREAKDOWN`).

    ``windows`` is the job's ``breakdown`` table: its ``idle_ns`` is carried over, and a window whose gaps do not
    add up to it (activity attribution did not see here, e.g. a merged Horovod timeline's phases) gets a null
    split rather than one that does not add up. ``act``: :func:`tracekit.analysis.attribution.activity` of
    ``events``, when the caller has it already."""
    if iterations.num_rows == 0:
        return schema.empty(schema.IDLE_BREAKDOWN)
    win = attribution.sorted_windows(iterations)
    w_rank = win.get_column("rank").to_numpy().astype(np.int64)
    w_start = win.get_column("start_ns").to_numpy()
    w_end = win.get_column("end_ns").to_numpy()
    m = w_start.size
    act = attribution.activity(events) if act is None else act
    syncs = sync_intervals(events)
    rank = np.concatenate([act.get_column("rank").to_numpy().astype(np.int64), syncs.get_column("rank").to_numpy()])
    start = np.concatenate([act.get_column("start_ns").to_numpy(), syncs.get_column("start_ns").to_numpy()])
    end = np.concatenate([act.get_column("end_ns").to_numpy(), syncs.get_column("end_ns").to_numpy()])
    cls = np.concatenate([np.full(act.height, _BUSY, np.int64), np.full(syncs.height, _SYNC, np.int64)])
    s = sweep(rank, start, end, cls, 2, w_rank, w_start, w_end)
    assert s.start is not None
    idle = (s.state & (1 << _BUSY)) == 0
    seg_w, seg_start, seg_len = s.window[idle], s.start[idle], s.length[idle]
    seg_sync = (s.state[idle] & (1 << _SYNC)) != 0
    seg_end = seg_start + seg_len
    # gaps: runs of touching idle segments in one window
    new = np.ones(seg_w.size, dtype=bool)
    if seg_w.size > 1:
        new[1:] = (seg_w[1:] != seg_w[:-1]) | (seg_start[1:] != seg_end[:-1])
    gap_of = np.cumsum(new) - 1
    first = np.flatnonzero(new)
    gap_w = seg_w[first]
    gap_start = seg_start[first]
    gap_end = np.maximum.reduceat(seg_end, first) if first.size else np.zeros(0, np.int64)
    # host-bound: the next activity's launch began after the gap did
    host = np.zeros(first.size, dtype=bool)
    if first.size and act.height:
        host = _host_bound(events, act, w_rank[gap_w], gap_start, gap_end)
        if host is None:
            host = _host_bound_joined(events, act, w_rank[gap_w], gap_start, gap_end)
    seg_host = host[gap_of] if gap_of.size else np.zeros(0, dtype=bool)
    seg_syn = ~seg_host & seg_sync

    def per_window(mask: np.ndarray) -> np.ndarray:
        return np.bincount(seg_w[mask], weights=seg_len[mask], minlength=m).round().astype(np.int64)

    idle_ns = per_window(np.ones(seg_w.size, dtype=bool))
    host_ns, sync_ns = per_window(seg_host), per_window(seg_syn)
    other_ns = idle_ns - host_ns - sync_ns
    n_gaps = np.bincount(gap_w, minlength=m).astype(np.int64)
    dev = np.isin(w_rank, device_ranks(events))
    known = dev.copy()
    if windows is not None and windows.num_rows:
        b = pl.from_arrow(windows.select(["rank", "start_ns", "idle_ns"]))
        assert isinstance(b, pl.DataFrame)
        mine = pl.DataFrame({"rank": w_rank.astype(np.int32), "start_ns": w_start, "_i": np.arange(m)})
        got = mine.join(b.with_columns(pl.col("rank").cast(pl.Int32)), on=["rank", "start_ns"], how="left").sort("_i")
        theirs = got.get_column("idle_ns")
        agree = (theirs == pl.Series(idle_ns)).fill_null(False).to_numpy()
        idle_ns = np.where(theirs.is_null().to_numpy(), idle_ns, theirs.fill_null(0).to_numpy())
        known &= agree
    return schema.table(schema.IDLE_BREAKDOWN, {
        "rank": win.get_column("rank").to_arrow(), "iteration": win.get_column("iteration").to_arrow(),
        "start_ns": w_start, "end_ns": w_end, "idle_ns": idle_ns,
        "host_bound_ns": pa.array(host_ns, mask=~known), "sync_ns": pa.array(sync_ns, mask=~known),
        "other_ns": pa.array(other_ns, mask=~known), "gaps": pa.array(n_gaps, mask=~dev), "device": dev,
    })


_PARTS = ("host_bound", "sync", "other")


def per_rank(idle: pa.Table | pl.DataFrame) -> pl.DataFrame:
    """Per rank: windows, ``idle_ns`` and its parts summed, and each part's share of the idle time
    (``host_bound_share`` …; null where the split is not applicable — CPU-only ranks — or unknown)."""
    df = pl.from_arrow(idle) if isinstance(idle, pa.Table) else idle
    assert isinstance(df, pl.DataFrame)
    if df.height == 0:
        return pl.DataFrame(schema={"rank": pl.Int32, "windows": pl.UInt32, "device": pl.Boolean,
                                    "idle_ns": pl.Int64, **{f"{p}_ns": pl.Int64 for p in _PARTS},
                                    **{f"{p}_share": pl.Float64 for p in _PARTS}})
    return _rollup(df.group_by("rank")).sort("rank")


def job(idle: pa.Table | pl.DataFrame) -> dict[str, object]:
    """The whole job's idle split (sums over the windows where it is known) as plain Python."""
    df = pl.from_arrow(idle) if isinstance(idle, pa.Table) else idle
    assert isinstance(df, pl.DataFrame)
    if df.height == 0:
        return {"windows": 0, "device": False, "idle_ns": 0, **{f"{p}_ns": None for p in _PARTS},
                **{f"{p}_share": None for p in _PARTS}}
    row = _rollup(df.with_columns(pl.lit(0).alias("_all")).group_by("_all")).drop("_all").row(0, named=True)
    return row


def _rollup(grouped: pl.dataframe.group_by.GroupBy) -> pl.DataFrame:
    known = pl.col("host_bound_ns").is_not_null()
    out = grouped.agg(
        pl.len().alias("windows"), pl.col("device").any(), pl.col("idle_ns").sum(),
        pl.col("idle_ns").filter(known).sum().alias("_known_idle"), known.any().alias("_any"),
        *[pl.col(f"{p}_ns").sum() for p in _PARTS])
    return out.with_columns(
        *[pl.when(pl.col("_any")).then(pl.col(f"{p}_ns")).alias(f"{p}_ns") for p in _PARTS],
        *[pl.when(pl.col("_any") & (pl.col("_known_idle") > 0)).then(pl.col(f"{p}_ns") / pl.col("_known_idle"))
          .alias(f"{p}_share") for p in _PARTS],
    ).drop("_known_idle", "_any")
