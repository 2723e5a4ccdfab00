"""The dependency graph of a job (DESIGN.md "Critical path"), as arrays.

Activities are what can be on a critical path: top-level operators and runtime calls on each CPU
thread (nested calls are folded into their outermost operator, at their offset in it), device
kernels and copies, and gloo work. Each activity ``i`` is two nodes, its start ``2i`` and its end
``2i+1``, on the job clock. Edges say "the destination cannot happen before the source plus a lag":

``own``        start → end of an activity: its own work (for communication: the transfer only)
``program``    end → next start on the same CPU thread or device stream
``launch``     an operator's start → the kernel it launched (lag: where in the op the launch was)
``sync``       a kernel's end → the end of the operator that waited for it (stream/device/event
               synchronisation and blocking copies; lag: the operator's work after the wait)
``stream``     a stream waiting for another: the last kernel launched on another stream before a
               communication kernel's launch → its start; a communication kernel's end → a kernel
               that was launched earlier but started only when it ended
``enqueue``    gloo: the operator that enqueued the work → the work on the gloo thread
``consume``    gloo: the work's end → the first operator of the enqueuing thread after it, when
               that thread sat idle until then (DDP waits for its buckets without a traced op)
``collective`` across ranks: no member ends an instance before every member has arrived; from each
               member's start to each member's end, with the transfer as lag. An instance of many members
               keeps one edge per member, from its *hub* (the latest of every member's start: :class:`Hubs`),
               not one per pair: the same constraints in a number of edges that grows with the group, not
               with its square
``handoff``    inferred from PyTorch's threading (docs/dependencies.md): the calling thread's last operation
               before ``backward()`` → the autograd engine thread's first backward operation, and the engine's
               last → the caller's next operation

Every node's measured time is at least the max over its incoming edges of (source time + lag). The
difference on the *binding* edge (the one attaining the max) is measured slack: untraced CPU work,
launch queueing, wake-up latency. It is kept on that edge, so replaying the graph with unchanged
durations reproduces the trace exactly and the critical path accounts for every nanosecond.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from types import ModuleType

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.analysis.graph import inferred
from tracekit.analysis.graph.collective_edges import Hubs, collective_edges, hubs_of
from tracekit.analysis.intervals import PACK_SHIFT, first_match, lane_order, packs, prev_max_end, runs
from tracekit.model import schema
from tracekit.model.schema import normalise_op

EDGE_TYPES = ("own", "program", "launch", "sync", "stream", "enqueue", "consume", "collective", "handoff")
_ET = {name: i for i, name in enumerate(EDGE_TYPES)}
ACTIVITY_KINDS = ("compute", "comm", "memory", "cpu_op", "runtime")
#: consume edges only bind when the thread wakes up this soon after the work ends
CONSUME_MAX_LAG_NS = 5_000_000
#: a consumer may start this long before the recorded end of the gloo work it waited for ...
CONSUME_EARLY_NS = 10_000_000
#: ... after an idle gap at least this long
CONSUME_MIN_GAP_NS = 500_000
#: stream edges out of a comm kernel only when the waiting kernel starts this soon after it
STREAM_MAX_LAG_NS = 50_000
#: ... and only when the comm kernel ended more than this after the waiting kernel's own stream's previous kernel and
#: its launch call (else those explain its start as well: the resolution of Kineto's older whole-µs timestamps)
STREAM_TIE_NS = 1_000
#: activity columns only :func:`build` reads (the graph keeps the others: critical path, what-if, results cache)
_BUILD_ONLY = ("_id", "top", "ancestor", "comm_parent")
#: runtime calls that block the CPU until device work is done (cudaMemcpyAsync does not)
SYNC_CALL = r"Synchronize|^(?:cuda|hip)Memcpy(?:2D|3D)?$|^cuMemcpy(?:DtoH|HtoD|DtoD)?(?:_v2)?$"


@dataclass
class Graph:
    """Activities (one row each) and edges between their start/end nodes."""

    act: pl.DataFrame  # a, rank, lane, lane_id, kind, name (categorical), start, end, dur, iteration, device, ...
    src: np.ndarray  # node ids
    dst: np.ndarray
    lag: np.ndarray  # structural lag (ns) before measured slack is added
    etype: np.ndarray  # index into EDGE_TYPES
    node_time: np.ndarray  # measured time of every node (job clock)
    binding: np.ndarray  # per node: index of its binding edge, -1 for a source
    slack: np.ndarray  # per edge: measured slack added to the lag (nonzero only on binding edges)
    violated: dict[str, int]  # edges dropped because the measured schedule contradicts them, by type
    #: per edge, how much of its lag is untraced gaps on a thread (idle nothing explains), where activities were merged
    #: into one (:mod:`tracekit.analysis.graph.compact`); None when no edge has any
    gap: np.ndarray | None = None
    #: collective edges whose source is the latest member's start, whichever member that is (None: none such)
    hubs: Hubs | None = None
    #: per activity, its kind's index in :data:`tracekit.model.schema.KINDS` (-1: none), where the build read them
    #: off the events' dictionary (None: read ``act``'s text, as for a graph made otherwise)
    kind: np.ndarray | None = None

    @property
    def n_nodes(self) -> int:
        return self.node_time.size

    @cached_property
    def gpu_ranks(self) -> set[int]:
        """Ranks with device activity (the rank column alone filtered: the activities' frame is not copied)."""
        return set(self.act.select(pl.col("rank").filter(pl.col("device").is_not_null()).unique()).to_series()
                   .to_list())

    def weight(self) -> np.ndarray:
        """Edge weights of the measured schedule (lag + slack)."""
        return self.lag + self.slack


def own_edges(graph: Graph) -> np.ndarray:
    """Per node of ``graph``: the own edge into it (an activity's start → end: its end node has one), or -1; kept on
    the graph (the what-if model, the balance and each rank's replay all read it)."""
    kept = graph.__dict__.get("_own_edges")
    if kept is None:
        own = graph.etype == EDGE_TYPES.index("own")
        kept = np.full(graph.n_nodes, -1, dtype=np.int64)
        kept[graph.dst[own]] = np.flatnonzero(own)
        graph.__dict__["_own_edges"] = kept
    return kept


def clock_offsets(ranks: pa.Table | None) -> dict[int, int]:
    """Each rank's clock offset (ns onto the job clock; 0 where unknown) from the ``ranks`` table."""
    if ranks is None or ranks.num_rows == 0:
        return {}
    r = ranks.column("rank").to_pylist()
    o = ranks.column("clock_offset_ns").to_pylist()
    return {int(a): int(b or 0) for a, b in zip(r, o, strict=True) if a is not None}


def _event_kinds(events: pa.Table) -> np.ndarray:
    """Per event, its kind's index in :data:`tracekit.model.schema.KINDS` (-1: none or another), read off the
    column's dictionary: one string per distinct kind, not per event."""
    kind = events.column("kind").combine_chunks()
    known = np.array([schema.KINDS.index(k) if k in schema.KINDS else -1 for k in kind.dictionary.to_pylist()]
                     + [-1], dtype=np.int8)
    return known[pc.fill_null(kind.indices, known.size - 1).to_numpy(zero_copy_only=False)]


def activities(events: pa.Table, ranks: pa.Table | None = None) -> tuple[pl.DataFrame, np.ndarray]:
    """The activities of the graph, with their top-level ancestor for nested CPU calls; and per event its kind's
    index in :data:`tracekit.model.schema.KINDS` (-1: none), which :func:`build` keeps for the activities."""
    kind = _event_kinds(events)
    df = pl.from_arrow(events.select(
        ["rank", "lane", "kind", "name", "start_ns", "dur_ns", "device", "stream", "correlation", "iteration",
         "collective_id"]))
    assert isinstance(df, pl.DataFrame)
    # kind and name stay categorical until the top-level activities are picked (build casts those)
    df = df.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias("event_row"))
    offsets = clock_offsets(ranks)
    if offsets:
        df = df.with_columns(_rank_offsets(df.get_column("rank"), offsets))
    else:
        df = df.with_columns(pl.lit(0, dtype=pl.Int64).alias("_off"))
    df = df.with_columns((pl.col("start_ns") + pl.col("_off")).alias("start"),
                         (pl.col("start_ns") + pl.col("_off") + pl.col("dur_ns")).alias("end"),
                         pl.col("dur_ns").alias("dur")).drop("_off", "dur_ns")  # every sort below moves fewer columns
    # device-side records of synchronisation (cuda_sync) are the CPU's waiting seen from the GPU, not
    # device work: they only tell which stream a sync call waited for
    keep = np.isin(kind, [schema.KINDS.index(k) for k in ACTIVITY_KINDS]) & ~(
        df.get_column("device").is_not_null().to_numpy() & (kind == schema.KINDS.index("runtime")))
    df = _kept_by_lane(df, np.flatnonzero(keep), lane_codes(events.column("lane")))
    # communication recorded on a CPU thread inside other activity (gloo send/recv annotate the caller's thread,
    # often running on while the thread goes on) is activity of its own, on a lane beside the thread; it would
    # otherwise swallow every operator it overlaps. Its operator starts it (gloo's enqueue/consume edges) and,
    # when it lies wholly inside that operator, waits for it (edges in build)
    nested = ~df.get_column("top") & (df.get_column("kind") == "comm") & df.get_column("device").is_null()
    if nested.any():
        df = df.with_columns(pl.col("lane").cast(pl.String))  # the lanes beside a thread are named after its text
        ids = df.get_column("_id").to_numpy()
        parent = pl.Series("comm_parent", np.where(nested.to_numpy(), ids[df.get_column("ancestor").to_numpy()], -1))
        slot = _slots(df.get_column("rank").to_numpy(), df.get_column("lane").to_numpy(),
                      df.get_column("start").to_numpy(), df.get_column("end").to_numpy(), nested.to_numpy())
        df = df.with_columns(parent.replace(-1, None), pl.when(nested).then(
            pl.col("lane") + " (comm" + pl.Series(slot).cast(pl.String).replace("0", "") + ")").otherwise(
            pl.col("lane")).alias("lane"))
        df = _nest(df.drop("top", "ancestor", "lane_id"))
    else:
        df = df.with_columns(pl.lit(None, dtype=pl.Int64).alias("comm_parent"))
    return _split_waits(df), kind


def _rank_offsets(rank: pl.Series, offsets: dict[int, int]) -> pl.Series:
    """``_off``: each row's clock offset by its rank (0 for a rank without one, or none): repeated per run of
    equal ranks (a job's events come rank by rank, so a few runs), else looked up row by row."""
    by_run = runs(rank.to_numpy()) if not rank.has_nulls() else None
    if by_run is None:
        return rank.replace_strict(list(offsets), list(offsets.values()), default=0, return_dtype=pl.Int64
                                   ).fill_null(0).alias("_off")
    values, bounds = by_run
    return pl.Series("_off", np.repeat([offsets.get(int(v), 0) for v in values.tolist()], np.diff(bounds)),
                     dtype=pl.Int64)


def lane_codes(lane: pa.ChunkedArray) -> np.ndarray | None:
    """Per row, its lane's rank in the lanes' text order (equal texts, equal ranks), read off the dictionary: one
    string per distinct lane, not per row. None when a lane is null or the column is not dictionary-encoded."""
    if lane.null_count or not pa.types.is_dictionary(lane.type):
        return None
    lane = lane.unify_dictionaries()
    if lane.num_chunks == 0:
        return np.zeros(0, dtype=np.int64)
    values = np.array(lane.chunk(0).dictionary.to_pylist(), dtype=object)
    if any(v is None for v in values):
        return None
    rank = np.unique(values, return_inverse=True)[1].astype(np.int64) if values.size else np.zeros(0, np.int64)
    return np.concatenate([rank[c.indices.to_numpy(zero_copy_only=False)] for c in lane.chunks])


def _kept_by_lane(df: pl.DataFrame, rows: np.ndarray, codes: np.ndarray | None) -> pl.DataFrame:
    """``rows`` of ``df`` (original order) with ``_id`` (their position among them), sorted and nested by
    :func:`_nest`. With the rows' lane codes it sorts on those and gathers once, and the lanes stay categorical
    (:func:`build` makes text of the activities' only); without, it sorts on the lanes' text. The order is the same."""
    rank, start = df.get_column("rank"), df.get_column("start")
    if codes is None or rank.has_nulls() or start.has_nulls() or not rows.size:
        df = df[rows].with_columns(pl.col("lane").cast(pl.String), pl.Series("_id", np.arange(rows.size)))
        return _nest(df)
    order, group = lane_order(rank.to_numpy()[rows].astype(np.int64), codes[rows], start.to_numpy()[rows],
                              df.get_column("end").to_numpy()[rows])
    df = df[rows[order]].with_columns(pl.Series("_id", order.astype(np.int64)))  # lanes stay codes: see build
    return _nested(df, _lane_numbers(group))


def _split_waits(df: pl.DataFrame) -> pl.DataFrame:
    """Cut top-level CPU operators where they wait inside for communication of their rank: a gap of at least
    :data:`CONSUME_MIN_GAP_NS` in which none of the operator's innermost calls runs (before the first, between
    two, or after the last) and gloo work of the rank ends (FSDP's backward hooks wait for all-gathers inside
    ``autograd::engine::evaluate_function``; a pipeline schedule waits for its receives). The wait becomes idle
    time between two pieces of the operator, which the consume edges then tie to the work it waited for —
    otherwise the wait would count as the operator's own work, and no faster link would ever shorten it."""
    cpu = df.get_column("device").is_null().to_numpy()
    is_comm = (df.get_column("kind") == "comm").fill_null(False).to_numpy()
    comm = cpu & is_comm
    top = df.get_column("top").to_numpy()
    anc_all = df.get_column("ancestor").to_numpy()
    start = df.get_column("start").to_numpy()
    end = df.get_column("end").to_numpy()
    # leaves: nothing starts inside them on their lane (rows are sorted by lane and start)
    lane_id = df.get_column("lane_id").to_numpy()
    leaf = np.ones(df.height, dtype=bool)
    leaf[:-1] = ~((lane_id[1:] == lane_id[:-1]) & (start[1:] < end[:-1]))
    # a wait is where no leaf runs: an intermediate operator (RegisterPostBackwardFunctionBackward) may span it
    child = cpu & ~top & leaf & ~is_comm[anc_all]  # operators, never communication itself
    if not comm.any() or not child.any():
        return df
    rank = df.get_column("rank").to_numpy().astype(np.int64)
    anc = df.get_column("ancestor").to_numpy()
    ci = np.flatnonzero(child)
    a = anc[ci]
    prev = prev_max_end(a.astype(np.int64), start[ci], end[ci])
    lo = np.iinfo(np.int64).min
    gap_s = np.where(prev == lo, start[a], prev)
    gap_e = start[ci]
    # after the last child until the operator ends
    tail_a = a[np.flatnonzero(np.append(a[1:] != a[:-1], True))]
    child_end_max = pl.DataFrame({"a": a, "e": end[ci]}).group_by("a", maintain_order=True).agg(
        pl.col("e").max()).get_column("e").to_numpy()
    g_a = np.concatenate([a, tail_a])
    g_s = np.concatenate([gap_s, child_end_max])
    g_e = np.concatenate([gap_e, end[tail_a]])
    big = (g_e - g_s) >= CONSUME_MIN_GAP_NS
    g_a, g_s, g_e = g_a[big], g_s[big], g_e[big]
    if g_a.size == 0:
        return df
    # gloo work of the same rank (on another lane) ending inside the gap
    t0 = int(min(start.min(), g_s.min()))
    span = int(max(end.max(), g_e.max())) - t0 + 2
    ck = np.sort(rank[comm] * span + (end[comm] - t0))
    gr = rank[g_a] * span
    hits = np.searchsorted(ck, gr + (g_e - t0), side="right") - np.searchsorted(ck, gr + (g_s - t0), side="left")
    keep = hits > 0
    g_a, g_s, g_e = g_a[keep], g_s[keep], g_e[keep]
    if g_a.size == 0:
        return df
    ua = np.unique(g_a)
    seg_a = np.concatenate([ua, g_a])
    seg_start = np.concatenate([start[ua], g_e])
    seg_end = np.concatenate([end[ua], g_s])
    o1 = np.lexsort((seg_start, seg_a))
    o2 = np.lexsort((seg_end, seg_a))
    seg_a, seg_start, seg_end = seg_a[o1], seg_start[o1], seg_end[o2]
    pieces = df[seg_a].with_columns(pl.Series("start", seg_start), pl.Series("end", seg_end),
                                    pl.Series("dur", seg_end - seg_start))
    rest = df.filter(~pl.Series(np.isin(np.arange(df.height), ua)))
    both = pl.concat([rest, pieces]).drop("top", "ancestor", "lane_id")
    return _nest(both.with_columns(pl.col("lane").cast(pl.String)))  # sorted by the lanes' text


def _slots(rank: np.ndarray, lane: np.ndarray, start: np.ndarray, end: np.ndarray, pick: np.ndarray) -> np.ndarray:
    """Per picked row, the lowest slot free at its start among the picked rows of its (rank, lane) — so that
    asynchronous work that overlaps on one thread gets lanes of its own (interval colouring; only the few
    communication rows recorded inside other activity go through it)."""
    import heapq

    out = np.zeros(len(start), dtype=np.int64)
    rows = np.flatnonzero(pick)
    rows = rows[np.lexsort((start[rows], lane[rows], rank[rows]))]
    key = None
    busy: list[tuple[int, int]] = []  # (end, slot) of open rows
    free: list[int] = []
    for i in rows.tolist():
        k = (rank[i], lane[i])
        if k != key:
            key, busy, free = k, [], []
        while busy and busy[0][0] <= start[i]:
            heapq.heappush(free, heapq.heappop(busy)[1])
        slot = heapq.heappop(free) if free else len(busy)
        out[i] = slot
        heapq.heappush(busy, (int(end[i]), slot))
    return out


def _nest(df: pl.DataFrame) -> pl.DataFrame:
    """Sort by lane and time and mark nesting on each lane: ``top`` (starts after everything before it on its
    lane ended), ``ancestor`` (position of its top-level ancestor) and ``lane_id``."""
    return _nested(*sort_by_lane(df))


def _nested(df: pl.DataFrame, lane_key: np.ndarray) -> pl.DataFrame:
    """``df`` (sorted by lane and time; ``lane_key`` its lane numbers) with ``top``, ``ancestor`` and ``lane_id``."""
    end = df.get_column("end").to_numpy()
    start = df.get_column("start").to_numpy()
    prev_max = prev_max_end(lane_key.astype(np.int64), start, end)
    top = start >= prev_max
    ancestor = np.maximum.accumulate(np.where(top, np.arange(df.height), -1))
    return df.with_columns(pl.Series("top", top), pl.Series("ancestor", ancestor), pl.Series("lane_id", lane_key))


def sort_by_lane(df: pl.DataFrame, start: str = "start", end: str = "end") -> tuple[pl.DataFrame, np.ndarray]:
    """``df`` sorted by rank, lane, ``start`` and ``end`` (descending), and each row's lane number (1, 2, ... in
    that order): by :func:`tracekit.analysis.intervals.lane_order` on each lane's rank among the distinct lanes."""
    rank, lane, first = df.get_column("rank"), df.get_column("lane"), df.get_column(start)
    if df.height and not rank.has_nulls() and not lane.has_nulls() and not first.has_nulls():
        lanes = lane.unique().sort()
        code = lane.replace_strict(lanes, pl.int_range(lanes.len(), eager=True, dtype=pl.Int64),
                                   return_dtype=pl.Int64).to_numpy()
        order, group = lane_order(rank.to_numpy().astype(np.int64), code, first.to_numpy(),
                                  df.get_column(end).to_numpy())
        return df[order], _lane_numbers(group)
    df = df.sort(["rank", "lane", start, end], descending=[False, False, False, True])
    return df, df.select(pl.struct(["rank", "lane"]).rank("dense").alias("k")).to_series().to_numpy()


def _lane_numbers(group: np.ndarray) -> np.ndarray:
    """1, 2, ... per run of equal ``group`` values (rows sorted by lane)."""
    return np.cumsum(np.concatenate(([1], group[1:] != group[:-1]))).astype(np.uint32)


def _running_argmax(values: np.ndarray) -> np.ndarray:
    """Index of the maximum of ``values[:i+1]`` for every i (the latest one on ties)."""
    is_new = values >= np.maximum.accumulate(values)
    return np.maximum.accumulate(np.where(is_new, np.arange(values.size), 0))


def build(events: pa.Table, ranks: pa.Table | None = None, instances: pl.DataFrame | None = None) -> Graph:
    """Build the dependency graph of every activity of ``events``.

    ``instances`` (optional) maps ``rank, collective_id`` to ``instance``: the same collective call on
    every member (from :mod:`tracekit.analysis.collectives`); without it communication is plain activity.
    """
    full, event_kind = activities(events, ranks)
    # lanes as text for the activities only (a third of the rows are nested calls, which need none)
    act = full.filter(pl.col("top")).with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias("a"),
                                                  pl.col("kind").cast(pl.String), pl.col("lane").cast(pl.String))
    # their kinds as codes too, read off the events' (the critical path labels every activity by its kind)
    act_kind = event_kind[act.get_column("event_row").to_numpy()]
    del event_kind
    # map every row of `full` to the activity index of its top-level ancestor
    a_of_pos = np.full(full.height, -1, dtype=np.int64)
    top_pos = np.flatnonzero(full.get_column("top").to_numpy())
    a_of_pos[top_pos] = np.arange(top_pos.size)
    anc_act = a_of_pos[full.get_column("ancestor").to_numpy()]
    # only what the launches and gloo's edges read of every row is kept (the rest is a third of the build's peak)
    full = full.select(["rank", "kind", "name", "device", "correlation", "start", "end", "lane_id",
                        pl.Series("anc", anc_act)])
    n = act.height
    start = act.get_column("start").to_numpy()
    end = act.get_column("end").to_numpy().copy()
    # a job with no activity has no edges: start each list with an empty array of its type
    srcs: list[np.ndarray] = [np.zeros(0, np.int64)]
    dsts: list[np.ndarray] = [np.zeros(0, np.int64)]
    lags: list[np.ndarray] = [np.zeros(0, np.int64)]
    types: list[np.ndarray] = [np.zeros(0, np.int8)]

    def add(s: np.ndarray, d: np.ndarray, lag: np.ndarray | int, etype: str) -> None:
        s = np.asarray(s, dtype=np.int64)
        d = np.asarray(d, dtype=np.int64)
        if s.size == 0:
            return
        srcs.append(s)
        dsts.append(d)
        lags.append(np.broadcast_to(np.asarray(lag, dtype=np.int64), s.shape).copy())
        types.append(np.full(s.size, _ET[etype], dtype=np.int8))

    idx = np.arange(n, dtype=np.int64)
    # launches: CPU runtime call (nested or not) with a correlation -> device activity with it (edges added below)
    launches = full.filter(pl.col("device").is_null() & (pl.col("kind") == "runtime")
                           & pl.col("correlation").is_not_null()).select(
        ["rank", "correlation", pl.col("start").alias("l_start"), pl.col("end").alias("l_end"), "anc",
         pl.col("name").alias("l_name")])
    # gloo: enqueue -> work -> the wait that consumes it (may move a work's effective end earlier)
    _gloo_edges(add, act, full, start, end)
    del full  # every nested row (a job's largest frame here) is done with: the edges below need less
    own = end - start
    _blocking_comm_edges(add, act, start, end, own)
    node_time = np.empty(2 * n, dtype=np.int64)
    node_time[0::2] = start
    node_time[1::2] = end
    # communication: own work is the transfer once the collective is matched (set below)
    is_comm = (act.get_column("kind") == "comm").fill_null(False).to_numpy()
    # program order on each lane
    lane_id = act.get_column("lane_id").to_numpy()
    same = lane_id[1:] == lane_id[:-1]
    add(2 * idx[:-1][same] + 1, 2 * idx[1:][same], 0, "program")
    # PyTorch's hand-offs between the calling thread and the autograd engine's thread
    inferred.handoff_edges(add, act, events)
    dev_act = act.filter(pl.col("device").is_not_null() & pl.col("correlation").is_not_null()).select(
        ["a", "rank", "correlation", "start", "device", "stream"])
    # in the device activity's order, so that edges are numbered the same on every run; on one int64 key when
    # rank and correlation fit in it (a join on one column is several times faster on millions of launches)
    on: str | list[str] = ["rank", "correlation"]
    key = correlation_key(launches, dev_act)
    if key is not None:
        launches, dev_act, on = launches.with_columns(key), dev_act.with_columns(key), "_k"
    lk = _launched(dev_act, launches, on)
    if lk.height:
        anc = lk.get_column("anc").to_numpy()
        add(2 * anc, 2 * lk.get_column("a").to_numpy(), lk.get_column("l_start").to_numpy() - start[anc], "launch")
    # synchronisation: a CPU call that blocks until device work ends -> the end of its operator
    names = launches.get_column("l_name").unique()  # the calls' few names matched, not every call's
    sync_calls = launches.filter(pl.col("l_name").is_in(names.filter(names.cast(pl.String).str.contains(SYNC_CALL))
                                                        .implode()))
    if sync_calls.height and lk.height:
        # the device-side record of a synchronisation names the stream it waited for
        sync_streams = _sync_streams(events)
        _sync_edges(add, lk, sync_calls, sync_streams, end, own)
    # communication kernels wait for the streams they depend on (stream-wait-event)
    if lk.height:
        wait_names = names.filter(names.cast(pl.String).str.contains(inferred.STREAM_WAIT_CALL)).implode()
        waits = launches.filter(pl.col("l_name").is_in(wait_names)).select(["rank", "l_start"])
        _stream_edges(add, act, lk, end, start, waits)
    # collectives across ranks
    hub_spec = None
    if instances is not None and instances.height and is_comm.any():
        hub_spec = collective_edges(add, act, instances, start, end, own)
    # own work
    add(2 * idx, 2 * idx + 1, own, "own")
    if n == 0:  # a job with no activity: an empty graph
        none = np.zeros(0, np.int64)
        return Graph(act=act.drop(_BUILD_ONLY, strict=False), src=none, dst=none, lag=none,
                     etype=np.zeros(0, np.int8), node_time=node_time,
                     binding=none, slack=none, violated={}, kind=act_kind)
    del launches, lk, dev_act, sync_calls
    # an edge the measured schedule violates is not a real dependency (a wrong guess, or clock error
    # across ranks beyond what the offsets fixed): drop it, part by part (a part it leaves whole is not copied)
    bad = np.zeros(len(EDGE_TYPES), dtype=np.int64)
    for i in range(len(srcs)):
        keep = node_time[srcs[i]] + lags[i] <= node_time[dsts[i]]
        if not keep.all():
            bad += np.bincount(types[i][~keep], minlength=len(EDGE_TYPES))
            srcs[i], dsts[i], lags[i], types[i] = srcs[i][keep], dsts[i][keep], lags[i][keep], types[i][keep]
    violated = {EDGE_TYPES[k]: int(bad[k]) for k in np.flatnonzero(bad).tolist()}
    src, dst, lag, etype = (_take_all(parts) for parts in (srcs, dsts, lags, types))
    binding, slack = bind(src, dst, lag, node_time)
    # what only the build reads (nesting and gloo bookkeeping) is left out of the graph
    act = act.drop(_BUILD_ONLY, strict=False)
    return Graph(act=act, src=src, dst=dst, lag=lag, etype=etype, node_time=node_time, binding=binding,
                 slack=slack, violated=violated, hubs=hubs_of(dst, etype, hub_spec, _ET["collective"]), kind=act_kind)


def _take_all(parts: list[np.ndarray]) -> np.ndarray:
    """The parts concatenated, the list emptied: each part is freed as soon as it is copied (a job's edges are
    tens of MB per column)."""
    out = np.concatenate(parts)
    parts.clear()
    return out


def _launched(dev_act: pl.DataFrame, launches: pl.DataFrame, on: str | list[str]) -> pl.DataFrame:
    """Each device activity with the first launch of its rank and correlation (an inner join in the device
    activity's order): on the one-column key ``_k`` by :func:`~tracekit.analysis.intervals.first_match` (a polars
    ``unique`` and join on 200 k launches cost ~4x more), else by polars."""
    right = launches.drop(["rank", "correlation"] if on == "_k" else [])
    if on != "_k" or launches.get_column("_k").has_nulls() or dev_act.get_column("_k").has_nulls():
        return dev_act.join(right.unique(on, keep="first"), on=on, how="inner", maintain_order="left")
    hit, first = first_match(launches.get_column("_k").to_numpy(), dev_act.get_column("_k").to_numpy())
    return pl.concat([dev_act.filter(pl.Series(hit)), right.drop("_k")[first[hit]]], how="horizontal")


def correlation_key(*frames: pl.DataFrame) -> pl.Expr | None:
    """``_k``: rank and correlation packed (:data:`~tracekit.analysis.intervals.PACK_SHIFT`), one int64 join key,
    when every frame has rows and all their ranks and correlations fit it; else None."""
    for df in frames:
        if df.height == 0:
            return None
        r = df.select(pl.col("rank").min().alias("r0"), pl.col("rank").max().alias("r1"),
                      pl.col("correlation").min().alias("c0"), pl.col("correlation").max().alias("c1")).row(0)
        if None in r or not packs(*r):
            return None
    return (pl.col("rank").cast(pl.Int64) * (1 << PACK_SHIFT) + pl.col("correlation")).alias("_k")


def engine(n_nodes: int = 0) -> ModuleType | None:
    """:mod:`tracekit.engine` (the graph's loops in C) where it is built and takes a graph of ``n_nodes`` nodes, else
    None: the numpy paths give the same answers, slower (``TRACEKIT_NO_EXTENSION=1`` asks for them, as for the
    parser's scanner)."""
    if os.environ.get("TRACEKIT_NO_EXTENSION", "0") not in ("", "0"):
        return None
    try:
        import tracekit.engine as compiled
    except ImportError:
        return None
    return compiled if n_nodes <= compiled.MAX_SIZE else None


def bind(src: np.ndarray, dst: np.ndarray, lag: np.ndarray, node_time: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray]:
    """Per node, the edge attaining max(source time + lag) (the last such edge on a tie), and the slack left on it:
    by the engine (:func:`tracekit.engine.bind`), else by numpy, which gives the same. Each numpy temporary (an edge
    list's size: ~9 MB per million edges) is dropped as soon as it is used: this is the graph build's peak."""
    compiled = engine(node_time.size)
    if compiled is not None:
        return compiled.bind(src, dst, lag, node_time)
    val = node_time[src]
    val += lag  # in place: the gather is a new array
    lo = np.iinfo(np.int64).min
    best = np.full(node_time.size, lo, dtype=np.int64)
    np.maximum.at(best, dst, val)
    # among the edges attaining the max, the last one (as a stable sort by value would pick)
    hit = np.flatnonzero(val == best[dst])
    del val
    binding = np.full(node_time.size, -1, dtype=np.int64)
    np.maximum.at(binding, dst[hit], hit)
    del hit
    # a bound node's binding edge attains best[node]: its slack is the node's time beyond that
    nodes = np.flatnonzero(binding >= 0)
    gap = node_time[nodes]
    gap -= best[nodes]
    del best
    np.maximum(gap, 0, out=gap)
    slack = np.zeros(src.size, dtype=np.int64)
    slack[binding[nodes]] = gap
    return binding, slack


def _sync_streams(events: pa.Table) -> pl.DataFrame:
    """``rank, correlation → synced_stream`` from the device-side records of synchronisation."""
    df = pl.from_arrow(events.select(["rank", "kind", "device", "stream", "correlation", "sync_stream"]))
    assert isinstance(df, pl.DataFrame)
    return (df.filter(pl.col("device").is_not_null() & (pl.col("kind") == "runtime")
                      & pl.col("correlation").is_not_null())
            .select(["rank", "correlation", pl.coalesce(pl.col("sync_stream"), pl.when(pl.col("stream") >= 0)
                                                        .then(pl.col("stream"))).alias("synced_stream")])
            .unique(["rank", "correlation"], keep="first"))


def _last_before(group: np.ndarray, time: np.ndarray, ends: np.ndarray, q_group: np.ndarray,
                 q_time: np.ndarray) -> np.ndarray:
    """For each query, the index (into the items) of the latest-ending item of its group that started
    (was launched) before the query time; -1 if none. Items must be sorted by (group, time)."""
    if time.size == 0:
        return np.full(q_time.size, -1, dtype=np.int64)
    t0 = int(min(time.min(), q_time.min()))
    span = int(max(time.max(), q_time.max())) - t0 + 1
    key = group * span + (time - t0)
    e_span = int(ends.max()) - int(ends.min()) + 1
    best = _running_argmax((ends - int(ends.min())) + group * e_span)
    pos = np.searchsorted(key, q_group * span + (q_time - t0), side="left") - 1
    ok = (pos >= 0) & (group[np.maximum(pos, 0)] == q_group)
    return np.where(ok, best[np.maximum(pos, 0)], -1)


def _sync_edges(add, lk: pl.DataFrame, sync_calls: pl.DataFrame, sync_streams: pl.DataFrame, end: np.ndarray,
                own: np.ndarray) -> None:
    """A blocking call ends after the device work it waited for: the latest-ending activity launched
    before it on the stream it synchronised (from the trace's ``cuda_sync`` record when there is one),
    else on its device."""
    dev = lk.select(["a", "rank", "stream", pl.col("l_start").alias("launch")]).with_columns(
        pl.Series("end", end[lk.get_column("a").to_numpy()]))
    sc = sync_calls.join(sync_streams, on=["rank", "correlation"], how="left")
    a_all = np.full(sc.height, -1, dtype=np.int64)
    # per stream where known
    by_stream = dev.sort(["rank", "stream", "launch"])
    g_rank = by_stream.get_column("rank").to_numpy().astype(np.int64)
    g_stream = by_stream.get_column("stream").fill_null(-1).to_numpy().astype(np.int64)
    s_group = g_rank * (1 << 32) + (g_stream & 0xFFFFFFFF)
    known = sc.get_column("synced_stream").is_not_null().to_numpy()
    q_rank = sc.get_column("rank").to_numpy().astype(np.int64)
    q_time = sc.get_column("l_start").to_numpy()
    if known.any():
        q_stream = sc.get_column("synced_stream").fill_null(-1).to_numpy().astype(np.int64)
        hit = _last_before(s_group, by_stream.get_column("launch").to_numpy(), by_stream.get_column("end").to_numpy(),
                           q_rank * (1 << 32) + (q_stream & 0xFFFFFFFF), q_time)
        ids = by_stream.get_column("a").to_numpy()
        a_all[known] = np.where(hit[known] >= 0, ids[np.maximum(hit[known], 0)], -1)
    # device-wide otherwise
    by_rank = dev.sort(["rank", "launch"])
    hit = _last_before(by_rank.get_column("rank").to_numpy().astype(np.int64), by_rank.get_column("launch").to_numpy(),
                       by_rank.get_column("end").to_numpy(), q_rank, q_time)
    ids = by_rank.get_column("a").to_numpy()
    a_all[~known] = np.where(hit[~known] >= 0, ids[np.maximum(hit[~known], 0)], -1)
    ok = a_all >= 0
    anc = sc.get_column("anc").to_numpy()[ok]
    l_end = sc.get_column("l_end").to_numpy()[ok]
    waited = a_all[ok]
    tail = np.maximum(end[anc] - l_end, 0)
    add(2 * waited + 1, 2 * anc + 1, tail, "sync")
    # the time an operator spent blocked in the call is waiting, not its own work
    blocked = (sc.get_column("l_end") - sc.get_column("l_start")).to_numpy()[ok]
    np.subtract.at(own, anc, blocked)
    np.maximum(own, 0, out=own)


def _stream_edges(add, act: pl.DataFrame, lk: pl.DataFrame, end: np.ndarray, start: np.ndarray,
                  waits: pl.DataFrame | None = None) -> None:
    """Communication kernels and the compute streams of the same device wait for each other.

    Inbound: the last computation or copy launched on another stream before the communication kernel's launch
    (PyTorch makes the NCCL stream wait for an event recorded on the current stream at enqueue; another
    communication kernel launched in between is on an NCCL stream of its own, which is not the current stream).
    Outbound: the first kernel on another stream that was launched before the communication ended
    but started only right after it (the consumer waited for the result), when the communication's end is the best
    explanation of its start: it ended after the consumer's own stream's previous kernel and after the consumer's
    launch call returned (by more than :data:`STREAM_TIE_NS`; a kernel that started as its stream's previous one
    ended, or as it was launched, was waiting for that). Where the rank's stream-wait calls are traced (``waits``:
    ``rank, l_start`` of ``cudaStreamWaitEvent``), the consumer must also have been told to wait: the rank's last
    such call before its launch came after the communication's launch, with no other communication launched in
    between (that call was the communication's own wait for the compute stream) — a kernel that merely happened to
    start as a transfer ended is no consumer.
    """
    comm_act = (act.get_column("kind") == "comm").fill_null(False).to_numpy()
    # by rank, device and launch, stably (launches at the same nanosecond keep their order); a missing rank first
    rank = lk.get_column("rank").cast(pl.Int64).fill_null(np.iinfo(np.int64).min).to_numpy()
    device = lk.get_column("device").cast(pl.Int64).to_numpy()
    launch = lk.get_column("l_start").to_numpy()
    by = np.lexsort((launch, device, rank))
    a_ids = lk.get_column("a").to_numpy()[by]
    is_comm = comm_act[a_ids]
    if not is_comm.any():
        return
    rank, device, launch = rank[by], device[by], launch[by]
    new_group = np.ones(by.size, dtype=bool)
    new_group[1:] = (rank[1:] != rank[:-1]) | (device[1:] != device[:-1])
    group = np.cumsum(new_group)
    stream = lk.get_column("stream").fill_null(-1).to_numpy()[by]
    # inbound: the last computation or copy launched before it (the current stream's work; another communication
    # kernel is on a stream of its own, which the NCCL stream does not wait for), on another stream
    prev = np.maximum.accumulate(np.where(~is_comm, np.arange(a_ids.size), -1))
    ok = is_comm & (prev >= 0) & (group[np.maximum(prev, 0)] == group) & (stream[np.maximum(prev, 0)] != stream)
    add(2 * a_ids[prev[ok]] + 1, 2 * a_ids[ok], 0, "stream")
    # outbound: first kernel of the device (other stream) starting at/after the comm's end; only computation and
    # copies consume a transfer (another communication kernel that starts then is queued on its own stream)
    order = np.lexsort((start[a_ids], group))
    order = order[~is_comm[order]]
    if order.size == 0:
        return
    g_sorted = group[order]
    s_sorted = start[a_ids][order]
    span = int(s_sorted.max() - s_sorted.min()) + 2 + STREAM_MAX_LAG_NS
    base = int(s_sorted.min())
    key = g_sorted * span + (s_sorted - base)
    ci = np.flatnonzero(is_comm)
    e = end[a_ids[ci]]
    pos = np.searchsorted(key, group[ci] * span + (e - base), side="left")
    pos = np.minimum(pos, key.size - 1)
    cand = order[pos]
    ok = ((group[cand] == group[ci]) & (stream[cand] != stream[ci]) & (start[a_ids[cand]] >= e)
          & (start[a_ids[cand]] - e <= STREAM_MAX_LAG_NS) & (launch[cand] < e))
    # the best explanation: not the consumer's own stream's previous kernel, nor its launch
    before = _stream_prev_end(rank, device, stream, start[a_ids], end[a_ids])
    ok &= e > before[cand] + STREAM_TIE_NS
    if "l_end" in lk.columns:
        ok &= e > lk.get_column("l_end").to_numpy()[by][cand] + STREAM_TIE_NS
    if waits is not None and waits.height:
        ok &= inferred.told_to_wait(waits, rank[ci], launch[ci], launch[cand], rank[is_comm], launch[is_comm])
    add(2 * a_ids[ci[ok]] + 1, 2 * a_ids[cand[ok]], 0, "stream")


def _stream_prev_end(rank: np.ndarray, device: np.ndarray, stream: np.ndarray, start: np.ndarray, end: np.ndarray
                     ) -> np.ndarray:
    """Per kernel: the end of the kernel before it on its own stream (of its rank and device; by start), the
    smallest int64 for a stream's first."""
    order = np.lexsort((start, stream, device, rank))
    out = np.full(start.size, np.iinfo(np.int64).min, dtype=np.int64)
    same = ((rank[order][1:] == rank[order][:-1]) & (device[order][1:] == device[order][:-1])
            & (stream[order][1:] == stream[order][:-1]))
    out[order[1:][same]] = end[order[:-1][same]]
    return out


def _gloo_family(name: str) -> str:
    """The op a c10d operator or a gloo work item runs, as gloo runs it (see :func:`_gloo_edges`)."""
    op = normalise_op(name) or name
    return "allreduce" if op == "reduce_scatter" else op


def _gloo_edges(add, act: pl.DataFrame, full: pl.DataFrame, start: np.ndarray, end: np.ndarray) -> None:
    """CPU jobs: c10d enqueue → gloo work (k-th enqueue of a size → k-th work of that size, FIFO), and
    the work's end → the next operator of the enqueuing thread when that thread idled until then."""
    name = pl.col("name").cast(pl.String)  # of the few CPU communication rows only (a job has millions of rows)
    work = act.filter((pl.col("kind") == "comm") & pl.col("device").is_null()).with_columns(name).filter(
        pl.col("name").str.starts_with("gloo:"))
    if work.height == 0:
        return
    enq = full.filter(pl.col("name").cast(pl.String).str.starts_with("c10d::") & pl.col("device").is_null()).select(
        ["rank", pl.col("name").cast(pl.String), "start", "end", "anc", "lane_id"])
    if enq.height == 0:
        return
    # c10d::allreduce_ and gloo:all_reduce are the same op: pair the k-th of each per rank and op
    # the same op on both sides (c10d::_allgather_base_ is gloo:all_gather); gloo runs a reduce-scatter as an
    # all-reduce (FSDP on gloo), so the two pair up too
    names = pl.concat([work.get_column("name"), enq.get_column("name")]).unique().to_list()
    family = pl.col("name").replace_strict({n: _gloo_family(n) for n in names}, return_dtype=pl.String).alias("op")
    work = work.sort(["rank", "start"]).with_columns(family).with_columns(
        pl.int_range(pl.len()).over(["rank", "op"]).alias("k"))
    enq = enq.sort(["rank", "start"]).with_columns(family).with_columns(
        pl.int_range(pl.len()).over(["rank", "op"]).alias("k"))
    pair = work.select(["a", "rank", "op", "k"]).join(enq.drop("name"), on=["rank", "op", "k"], how="inner")
    if pair.height == 0:
        return
    anc = pair.get_column("anc").to_numpy()
    a = pair.get_column("a").to_numpy()
    add(2 * anc, 2 * a, pair.get_column("start").to_numpy() - start[anc], "enqueue")
    # consume: the operator that ends the idle gap of the enqueuing thread in which the work ended.
    lane_of = act.get_column("lane_id").to_numpy().astype(np.int64)
    thread = lane_of[anc]
    t0 = int(start.min())
    span = int(end.max()) - t0 + 2 + CONSUME_EARLY_NS
    order = np.lexsort((start, lane_of))
    s_lane = lane_of[order]
    s_start = start[order]
    key = s_lane * span + (s_start - t0)
    prev_end = np.empty(order.size, dtype=np.int64)
    prev_end[1:] = end[order[:-1]]
    first = np.ones(order.size, dtype=bool)
    first[1:] = s_lane[1:] != s_lane[:-1]
    prev_end[first] = np.iinfo(np.int64).min // 4
    e = end[a].copy()
    # normal case: the thread is idle when the work ends and wakes up soon after
    pos = np.searchsorted(key, thread * span + (e - t0), side="left")
    valid = pos < key.size
    pos = np.minimum(pos, key.size - 1)
    normal = valid & (s_lane[pos] == thread) & (prev_end[pos] <= e) & (s_start[pos] - e <= CONSUME_MAX_LAG_NS)
    # late record: the work's end is recorded after its consumer started (the gloo thread was preempted
    # after signalling completion): the consumer is the last operator in the preceding window that
    # follows an idle gap which began while the work was running
    big_gap = (s_start - prev_end) >= CONSUME_MIN_GAP_NS
    last_big = np.maximum.accumulate(np.where(big_gap, np.arange(order.size), -1))
    hi = np.searchsorted(key, thread * span + (e - t0), side="left") - 1
    lo = np.searchsorted(key, thread * span + (e - CONSUME_EARLY_NS - t0), side="left")
    j = last_big[np.maximum(hi, 0)]
    late = (~normal & (hi >= 0) & (j >= lo) & (j >= 0) & (s_lane[np.maximum(j, 0)] == thread)
            & (prev_end[np.maximum(j, 0)] >= start[a]))
    consumer = np.where(normal, order[pos], order[np.maximum(j, 0)])
    ok = normal | late
    end[a[late]] = start[consumer[late]]
    add(2 * a[ok] + 1, 2 * consumer[ok], 0, "consume")


def _blocking_comm_edges(add, act: pl.DataFrame, start: np.ndarray, end: np.ndarray, own: np.ndarray) -> None:
    """An operator that runs communication on its own thread and lies around all of it (``comm_parent``, see
    :func:`activities`) starts it (``enqueue``, lag: where in the operator it began) and waits for it (``sync``,
    lag: the operator's work after it); the time it was blocked is not its own work. Communication that runs
    on past its operator is asynchronous: gloo's enqueue and consume edges place it."""
    child = act.filter(pl.col("comm_parent").is_not_null()).select(["a", "comm_parent"])
    if child.height == 0:
        return
    ids = act.get_column("_id").to_numpy()
    a_of_id = np.full(int(max(ids.max(), child.get_column("comm_parent").max())) + 1, -1, dtype=np.int64)  # type: ignore[arg-type]
    a_of_id[ids] = act.get_column("a").to_numpy()
    parent = a_of_id[child.get_column("comm_parent").to_numpy()]
    c = child.get_column("a").to_numpy()
    ok = (parent >= 0) & (end[c] <= end[np.maximum(parent, 0)]) & (start[c] >= start[np.maximum(parent, 0)])
    c, parent = c[ok], parent[ok]
    add(2 * parent, 2 * c, start[c] - start[parent], "enqueue")
    add(2 * c + 1, 2 * parent + 1, np.maximum(end[parent] - end[c], 0), "sync")
    np.subtract.at(own, parent, end[c] - start[c])
    np.maximum(own, 0, out=own)
