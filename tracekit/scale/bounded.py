"""One rank's iterations and breakdown in bounded memory, from its events read batch by batch.

For a trace larger than the memory budget the parser spills its events to an Arrow IPC file
(``ParsedFile.events_file``). This module analyses that file without ever holding the events table:
three passes over its batches find the steps, the iteration of every launching CPU call, and then
each event's iteration (handing every batch, with its iteration filled, to a sink — the per-rank
Parquet writer), while collecting only compact arrays: step candidates, ``(key, iteration)`` of the
launching calls, and ``(start, end, class)`` of the intervals attribution sweeps. The sweep itself
runs over time slabs of at most :data:`SLAB` intervals.

The results are those of :func:`tracekit.analysis.iterations.assign` and :func:`tracekit.analysis.attribution.breakdown`
on the whole table (the same functions do the parts that are not per batch; tests compare both).
Memory is one batch plus about 40 bytes per device activity or launching call.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.analysis import attribution, iterations
from tracekit.model import schema
from tracekit.model.diagnostics import TraceError

#: at most this many intervals are swept at once (sweep temporaries are ~100 bytes per interval)
SLAB = 250_000
Sink = Callable[[pa.RecordBatch], None]


def batches(events_file: str, rank: int) -> Iterator[pa.RecordBatch]:
    """The batches of an events IPC file, read (not memory-mapped: one batch resident at a time), with
    ``rank`` filled in."""
    with pa.OSFile(events_file, "rb") as f:
        reader = pa.ipc.open_file(f)
        col = reader.schema.get_field_index("rank")
        for i in range(reader.num_record_batches):
            b = reader.get_batch(i)
            yield b.set_column(col, schema.EVENTS.field("rank"), pa.array(np.full(b.num_rows, rank, np.int32)))


def _codes(col: pa.Array) -> tuple[np.ndarray, list]:
    """Dictionary indices (nulls → ``len(values)``) and the dictionary's values."""
    values = col.dictionary.to_pylist()
    return pc.fill_null(col.indices, len(values)).to_numpy(zero_copy_only=False).astype(np.int64), values


@dataclass
class _Flags:
    """Per-dictionary-value flags, evaluated once: an IPC file has one dictionary per column."""

    is_cpu: np.ndarray
    kind: list
    step_name: np.ndarray

    @classmethod
    def of(cls, b: pa.RecordBatch, regex: re.Pattern) -> _Flags:
        lanes = b.column("lane").dictionary.to_pylist()
        names = b.column("name").dictionary.to_pylist()
        return cls(np.array([v is not None and v.startswith("cpu") for v in lanes] + [False]),
                   b.column("kind").dictionary.to_pylist(),
                   np.array([v is not None and regex.search(v) is not None for v in names] + [False]))


@dataclass
class _Cols:
    """The numpy columns of one batch that the analysis looks at."""

    kind: np.ndarray  # kind names as codes into ``KINDS``
    lane: np.ndarray
    name: np.ndarray
    is_cpu: np.ndarray
    on_device: np.ndarray
    start: np.ndarray
    dur: np.ndarray
    corr: np.ndarray
    corr_ok: np.ndarray
    ext: np.ndarray
    ext_ok: np.ndarray

    @classmethod
    def of(cls, b: pa.RecordBatch, f: _Flags) -> _Cols:
        kind_idx, _ = _codes(b.column("kind"))
        kmap = np.array([schema.KINDS.index(k) if k in schema.KINDS else -1 for k in f.kind] + [-1])
        lane, _ = _codes(b.column("lane"))
        name, _ = _codes(b.column("name"))
        corr = b.column("correlation")
        ext = b.column("external_id")
        return cls(kmap[kind_idx], lane, name, f.is_cpu[lane], pc.is_valid(b.column("device")).to_numpy(
            zero_copy_only=False), b.column("start_ns").to_numpy(), b.column("dur_ns").to_numpy(),
            pc.fill_null(corr, 0).to_numpy(zero_copy_only=False), pc.is_valid(corr).to_numpy(zero_copy_only=False),
            pc.fill_null(ext, 0).to_numpy(zero_copy_only=False), pc.is_valid(ext).to_numpy(zero_copy_only=False))


K = {k: schema.KINDS.index(k) for k in schema.KINDS}


def _is(c: _Cols, *kinds: str) -> np.ndarray:
    return np.isin(c.kind, [K[k] for k in kinds])


class _Map:
    """``key -> iteration`` of the first source in file order, from per-batch pieces."""

    def __init__(self) -> None:
        self.keys: list[np.ndarray] = []
        self.values: list[np.ndarray] = []

    def add(self, keys: np.ndarray, values: np.ndarray) -> None:
        if keys.size:
            self.keys.append(keys)
            self.values.append(values)

    def freeze(self) -> None:
        keys = np.concatenate(self.keys) if self.keys else np.zeros(0, np.int64)
        self.keys = []
        values = np.concatenate(self.values) if self.values else np.zeros(0, np.int64)
        self.values = []
        self.k, first = np.unique(keys, return_index=True)
        del keys
        self.v = values[first]

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if not self.k.size:
            return np.zeros(keys.size, np.int64), np.zeros(keys.size, bool)
        pos = np.minimum(np.searchsorted(self.k, keys), self.k.size - 1)
        hit = self.k[pos] == keys
        return self.v[pos], hit


def analyse(events_file: str, rank: int, collectives: pa.Table, step_marker: str | None = None,
            sink: Sink | None = None, *, require_steps: bool = True) -> tuple[pa.Table, pa.Table]:
    """``(iterations, breakdown)`` of the one rank whose events are in ``events_file``; every events batch,
    its iteration filled, goes to ``sink``. ``collectives`` must carry ``rank`` (for the bytes per window);
    ``require_steps`` as in :func:`tracekit.analysis.iterations.assign`."""
    regex_text = step_marker or iterations.DEFAULT_STEP
    try:
        regex = re.compile(regex_text)
    except re.error as exc:
        raise TraceError(None, f"step_marker={regex_text!r} is not a valid regular expression: {exc}") from exc
    method = "step-marker" if step_marker else "ProfilerStep"
    flags: _Flags | None = None
    # pass 1: step candidates and whether the rank has device activity
    cands: list[pa.RecordBatch] = []
    gpu = False
    for b in batches(events_file, rank):
        flags = flags or _Flags.of(b, regex)
        c = _Cols.of(b, flags)
        gpu = gpu or bool((c.on_device & _is(c, *iterations.ACTIVITY_KINDS)).any())
        m = flags.step_name[c.name] & _is(c, "annotation", "cpu_op") & c.is_cpu
        if m.any():
            cands.append(b.filter(pa.array(m)))
    if flags is None:
        return schema.empty(schema.ITERATIONS), schema.empty(schema.BREAKDOWN)
    mini = pa.Table.from_batches(cands, schema=schema.EVENTS) if cands else schema.empty(schema.EVENTS)
    steps = iterations.step_annotations(mini, iterations._frame(mini), step_marker) if mini.num_rows else \
        iterations.step_annotations(schema.empty(schema.EVENTS), iterations._frame(schema.empty(schema.EVENTS)),
                                    step_marker)
    if step_marker and steps.height == 0 and require_steps:
        raise TraceError(None, f"step_marker={step_marker!r} matches no annotation in the traces")
    # pass 2: the iteration of every launching CPU call (External id, correlation)
    by_ext, by_corr = _Map(), _Map()
    if steps.height:
        for b in batches(events_file, rank):
            c = _Cols.of(b, flags)
            it, ok = iterations.step_of(np.full(b.num_rows, rank), c.start, steps)
            src = c.is_cpu & _is(c, "cpu_op") & c.ext_ok & ok
            by_ext.add(c.ext[src], it[src])
            src = c.is_cpu & _is(c, "runtime") & c.corr_ok & ok
            by_corr.add(c.corr[src], it[src])
    by_ext.freeze()
    by_corr.freeze()
    # pass 3: every event's iteration; window aggregates; the intervals to sweep
    aggs: list[pl.DataFrame] = []
    starts, ends, classes, cpu_lanes = [], [], [], []
    comm_lanes: set[int] = set()
    for b in batches(events_file, rank):
        c = _Cols.of(b, flags)
        it, ok = iterations.step_of(np.full(b.num_rows, rank), c.start, steps)
        if steps.height:
            for key, key_ok, table in ((c.ext, c.ext_ok, by_ext), (c.corr, c.corr_ok, by_corr)):
                dst = np.flatnonzero(c.on_device & key_ok)
                v, hit = table.lookup(key[dst])
                it[dst[hit]] = v[hit]
                ok[dst[hit]] = True
        if sink is not None:
            col = b.schema.get_field_index("iteration")
            sink(b.set_column(col, schema.EVENTS.field("iteration"), pa.array(it, pa.int64(), mask=~ok)))
        is_activity = _is(c, *iterations.ACTIVITY_KINDS)
        act = (c.on_device & is_activity) if gpu else (is_activity | _is(c, "cpu_op"))
        end = c.start + c.dur
        if steps.height:
            sel = act & ok
            if sel.any():
                aggs.append(pl.DataFrame({"iteration": it[sel], "start_ns": c.start[sel], "end_ns": end[sel]})
                            .group_by("iteration").agg(pl.col("start_ns").min().alias("first"),
                                                       pl.col("end_ns").max().alias("last")))
        elif act.any():
            aggs.append(pl.DataFrame({"iteration": [0], "first": [int(c.start[act].min())],
                                      "last": [int(end[act].max())]}))
        # attribution's intervals (attribution.activity): compute, transfer, memory
        is_comm = _is(c, "comm")
        comm_lanes.update(np.unique(c.lane[is_comm]).tolist())
        compute = (c.on_device & _is(c, "compute")) if gpu else _is(c, "cpu_op")
        for mask, cls in ((compute, attribution.COMPUTE), (is_comm, attribution.TRANSFER),
                          (_is(c, "memory"), attribution.MEMORY)):
            if mask.any():
                starts.append(c.start[mask])
                ends.append(end[mask])
                classes.append(np.full(int(mask.sum()), cls, np.int8))
                if not gpu:  # CPU operators may be dropped later, by lane
                    cpu_lanes.append(c.lane[mask] if cls == attribution.COMPUTE else
                                     np.full(int(mask.sum()), -1, np.int64))
    iters = _windows(aggs, steps, rank, gpu, method)
    if iters.num_rows == 0:
        return iters, schema.empty(schema.BREAKDOWN)
    # the compact arrays are the only per-event memory left: build each once, free the pieces at once
    start = _concat(starts, np.int64)
    end = _concat(ends, np.int64)
    cls = _concat(classes, np.int8)
    if not gpu and comm_lanes:  # CPU operators on threads that communicate are not compute
        keep = ~np.isin(_concat(cpu_lanes, np.int64), np.array(sorted(comm_lanes)))
        start, end, cls = start[keep], end[keep], cls[keep]
    win = attribution.sorted_windows(iters)
    totals = sweep_in_slabs(start, end, cls, win.get_column("start_ns").to_numpy(),
                            win.get_column("end_ns").to_numpy(), in_place=True)
    return iters, attribution.table(win, totals, collectives)


def _concat(pieces: list[np.ndarray], dtype: type) -> np.ndarray:
    """Concatenate and empty ``pieces`` (so the pieces are freed as soon as the whole exists)."""
    out = np.concatenate(pieces).astype(dtype, copy=False) if pieces else np.zeros(0, dtype)
    pieces.clear()
    return out


def _windows(aggs: list[pl.DataFrame], steps: pl.DataFrame, rank: int, gpu: bool, method: str) -> pa.Table:
    """Combine the per-batch aggregates into windows, with the same code as the whole-table path."""
    gpu_ranks = pl.Series("rank", [rank] if gpu else [], dtype=pl.Int32)
    if not aggs:
        if steps.height == 0:
            return schema.empty(schema.ITERATIONS)
        act = pl.DataFrame(schema={"rank": pl.Int32, "iteration": pl.Int64, "first": pl.Int64, "last": pl.Int64})
        return iterations.windows_from(act, steps, gpu_ranks, method)
    agg = pl.concat(aggs).group_by("iteration").agg(pl.col("first").min(), pl.col("last").max()) \
        .with_columns(pl.lit(rank, pl.Int32).alias("rank"))
    if steps.height == 0:
        whole = agg.select(["rank", pl.col("first").alias("start_ns"), pl.col("last").alias("end_ns")])
        return iterations.whole_trace_windows(whole)
    return iterations.windows_from(agg.select(["rank", "iteration", "first", "last"]), steps, gpu_ranks, method)


def sweep_in_slabs(start: np.ndarray, end: np.ndarray, cls: np.ndarray, w_start: np.ndarray, w_end: np.ndarray,
                   slab: int | None = None, in_place: bool = False) -> dict[str, np.ndarray]:
    """:func:`tracekit.analysis.attribution.window_totals` for one rank's sorted, disjoint windows, sweeping at most
    about ``slab`` intervals at a time.

    Windows are cut into pieces at every ``slab``-th interval start (time per class adds up over the
    pieces of a window exactly), consecutive pieces are grouped while their intervals stay under
    ``slab``, and each group is swept with just the intervals that overlap it. With ``in_place`` the
    interval arrays are sorted in place (no copies: the caller gives them up).
    """
    slab = slab or SLAB
    m = len(w_start)
    totals = {k: np.zeros(m, dtype=np.int64) for k in attribution.TOTALS}
    if m == 0:
        return totals
    if not in_place:  # the caller keeps its arrays: work on copies
        start, end, cls = start.copy(), end.copy(), cls.copy()
    # sort by start in place (one temporary at a time: memory stays ~3 words per interval)
    order = np.argsort(start, kind="stable")
    for a in (start, end, cls):
        a[:] = a[order]
    del order
    np.maximum(end, start, out=end)
    s, e, c = start, end, cls
    reach = np.maximum.accumulate(e) if e.size else e  # the latest end of any interval up to here
    # pieces of windows: (start, end, owning window)
    first = np.searchsorted(s, w_start, "left")
    last = np.searchsorted(s, w_end, "left")
    p_start, p_end, p_win = [], [], []
    for w in range(m):
        cuts = [int(w_start[w]), *s[first[w] + slab : last[w] : slab].tolist(), int(w_end[w])]
        for a, z in itertools.pairwise(cuts):
            if z > a:
                p_start.append(a)
                p_end.append(z)
                p_win.append(w)
    ps, pe, pw = np.array(p_start, np.int64), np.array(p_end, np.int64), np.array(p_win, np.int64)
    lo = np.searchsorted(reach, ps, "right")  # intervals before lo all end by the piece's start
    hi = np.searchsorted(s, pe, "left")  # intervals from hi all start at or after the piece's end
    i = 0
    while i < ps.size:
        j = max(int(np.searchsorted(hi, lo[i] + slab, "right")), i + 1)
        sel = slice(int(lo[i]), int(hi[j - 1]))
        live = e[sel] > ps[i]
        part = attribution.window_totals(np.zeros(int(live.sum()), np.int64), s[sel][live], e[sel][live],
                                         c[sel][live].astype(np.int64), np.zeros(j - i, np.int64), ps[i:j], pe[i:j])
        for k in totals:
            np.add.at(totals[k], pw[i:j], part[k])
        i = j
    return totals
