"""The critical path of every iteration across all ranks (DESIGN.md "Critical path").

From the last activity to end in an iteration, follow each node's binding edge (the dependency that
actually set its time, :mod:`tracekit.analysis.graph.dag`) back to the iteration's start. Every step is a segment of
the path, labelled by what the time was spent on:

``compute``, ``memory``   device kernels and copies
``transfer``              communication moving data (after every member arrived)
``CPU``                   operators on a CPU thread, including work before a launch or after a wait
                          (on CPU-only ranks — gloo jobs — operators are the ``compute``)
``launch``                between a launch call and its kernel starting (queueing, launch latency)
``idle``                  nothing traced runs: a thread waking up after what it waited for (explained), or a gap
                          no recorded or inferred dependency explains (``unexplained_share`` of the summary)
``waiting on rank k``     the path runs through rank k while the other members of a collective had
                          already arrived and waited for k (the skew of that instance)

Segments cover the iteration's span on the job clock exactly (from the earliest rank's window start
to the latest rank's window end), so the path length equals the iteration time to the nanosecond.
Overlapped communication never appears on the path: it never binds what follows it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import polars as pl
import pyarrow as pa

from tracekit.analysis.graph import dag
from tracekit.analysis.graph.collective_edges import sources
from tracekit.analysis.graph.dag import EDGE_TYPES, Graph, bind
from tracekit.model import schema

_ET = {name: i for i, name in enumerate(EDGE_TYPES)}
LABELS = ("compute", "memory", "transfer", "CPU", "launch", "idle", "waiting")

SEGMENT_SCHEMA = {
    "iteration": pl.Int64, "step": pl.Int64, "rank": pl.Int32, "lane": pl.String, "start_ns": pl.Int64,
    "end_ns": pl.Int64, "dur_ns": pl.Int64, "label": pl.String, "waiting_on": pl.Int32, "name": pl.String,
    "event_row": pl.Int64, "edge": pl.String,
}


def iteration_spans(iterations: pa.Table, ranks: pa.Table | None) -> pl.DataFrame:
    """Per iteration, its span on the job clock: ``iteration, start_ns, end_ns``."""
    it = pl.from_arrow(iterations)
    assert isinstance(it, pl.DataFrame)
    off = pl.DataFrame({"rank": [], "off": []}, schema={"rank": pl.Int32, "off": pl.Int64})
    if ranks is not None and ranks.num_rows:
        off = pl.from_arrow(ranks.select(["rank", "clock_offset_ns"]))  # type: ignore[assignment]
        off = off.rename({"clock_offset_ns": "off"}).with_columns(pl.col("off").fill_null(0))  # type: ignore[union-attr]
    it = it.join(off, on="rank", how="left").with_columns(pl.col("off").fill_null(0))
    return it.group_by("iteration").agg((pl.col("start_ns") + pl.col("off")).min().alias("start_ns"),
                                        (pl.col("end_ns") + pl.col("off")).max().alias("end_ns")).sort("iteration")


def _lag_label(etype: int) -> str:
    """What the structural lag of an edge is spent on."""
    name = EDGE_TYPES[etype]
    if name == "collective":
        return "transfer"
    if name in ("launch", "enqueue", "sync"):
        return "CPU"  # the operator's own work before its launch / after its wait
    return "idle"


def _slack_label(etype: int) -> str:
    """What measured slack on a binding edge is."""
    name = EDGE_TYPES[etype]
    if name in ("launch", "enqueue"):
        return "launch"
    if name == "collective":
        return "transfer"
    return "idle"


#: where an idle segment's edge says nothing traced or inferred explains it: a gap in a lane's program order, or
#: before the first activity nothing binds (the ``tail`` after an iteration's last activity is the next
#: iteration's own chain up to its first counted activity, not a gap)
UNEXPLAINED_EDGES = ("program", "source")
#: a path's labels and edge names as codes while it is followed (strings only in its frame): :data:`LABELS`, and the
#: edge types with "source" (the chain's first node, bound by nothing) and "tail" (after the iteration's last end)
_CODE = {label: i for i, label in enumerate(LABELS)}
EDGE_CODE = {name: i for i, name in enumerate((*EDGE_TYPES, "source", "tail"))}
_LABEL_SERIES = pl.Series(LABELS, dtype=pl.String)
#: an activity's label by its kind (then a CPU-only rank's operators are compute, a launch call is a launch)
_KINDS = ("compute", "memory", "comm", "cpu_op", "runtime")
_KIND_LABEL = np.asarray([_CODE[x] for x in ("compute", "memory", "transfer", "CPU", "CPU", "CPU")], dtype=np.int8)
#: :data:`_KINDS`' index of each kind of :data:`tracekit.model.schema.KINDS` (as the build codes them; the last, for
#: code -1, and any other kind: ``len(_KINDS)``)
_KIND_OF_CODE = np.asarray([_KINDS.index(k) if k in _KINDS else len(_KINDS) for k in schema.KINDS] + [len(_KINDS)],
                           dtype=np.int64)
_EDGE_SERIES = pl.Series(list(EDGE_CODE), dtype=pl.String)
_LAG_CODE = np.asarray([_CODE[_lag_label(i)] for i in range(len(EDGE_TYPES))], dtype=np.int8)
_SLACK_CODE = np.asarray([_CODE[_slack_label(i)] for i in range(len(EDGE_TYPES))], dtype=np.int8)


def of_schedule(graph: Graph, times: np.ndarray, weight: np.ndarray,
                extra: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> Graph:
    """``graph`` as a replay scheduled it (``times`` under edge weights ``weight``, plus the replay's ``extra``
    edges — transfers queued on a link — as collective edges): :func:`paths` of it is the chain that would set the
    pace, and its idle on gaps nothing explains (the measured slack every replay keeps) shows where a prediction
    rests on unexplained time."""
    # a replay's weight is the edge's (re-costed) structural lag plus the measured slack it keeps
    # an edge from a hub comes from the member latest in this schedule
    src, dst, etype, slack = sources(graph, times), graph.dst, graph.etype, graph.slack
    w = weight
    gap = graph.gap
    if gap is not None:  # a merged run's untraced gaps scale with its lag where a replay scaled it
        lag = w - slack
        gap = np.where(graph.lag > 0, np.rint(gap * (lag / np.maximum(graph.lag, 1))), 0).astype(np.int64)
        gap = np.clip(gap, 0, np.maximum(lag, 0))
    if extra is not None and extra[0].size:
        src = np.concatenate([src, extra[0]])
        dst = np.concatenate([dst, extra[1]])
        w = np.concatenate([w, extra[2]])
        slack = np.concatenate([slack, np.zeros(extra[0].size, dtype=slack.dtype)])
        etype = np.concatenate([etype, np.full(extra[0].size, _ET["collective"], dtype=etype.dtype)])
        if gap is not None:
            gap = np.concatenate([gap, np.zeros(extra[0].size, dtype=gap.dtype)])
    binding, _ = bind(src, dst, w, times)
    out = Graph(act=graph.act, src=src, dst=dst, lag=w - slack, etype=etype, node_time=times, binding=binding,
                slack=slack, violated=graph.violated, gap=gap, hubs=graph.hubs, kind=graph.kind)
    out.__dict__["_lists"] = _cache(graph)  # the same activities: what the paths read of them is the same
    out.__dict__["_queued_after"] = graph.src.size  # edges from here on are the replay's queues, not members
    if "gpu_ranks" in graph.__dict__:
        out.__dict__["gpu_ranks"] = graph.gpu_ranks
    return out


def schedule_spans(iteration_of: np.ndarray, times: np.ndarray) -> pl.DataFrame:
    """``iteration, start_ns, end_ns`` of a replayed schedule: each iteration from its first counted activity's start
    (``iteration_of``: per activity, its iteration or a huge negative number where it does not count, as
    :attr:`tracekit.analysis.graph.whatif.Model.iteration_of`) to the next one's, the last to its last end."""
    ok = iteration_of > -(1 << 61)
    return bounds_spans(iteration_of[ok], times[0::2][ok], times[1::2][ok])


def bounds_spans(iteration: np.ndarray, start: np.ndarray, end: np.ndarray) -> pl.DataFrame:
    """:func:`schedule_spans` from rows of ``iteration, start, end`` (counted activities, or each rank's earliest start
    and latest end of an iteration where the ranks replayed apart)."""
    df = pl.DataFrame({"iteration": iteration, "s": start, "e": end}).group_by(
        "iteration").agg(pl.col("s").min().alias("start_ns"), pl.col("e").max().alias("_last")).sort("iteration")
    return df.with_columns(pl.col("start_ns").shift(-1).fill_null(pl.col("_last")).alias("end_ns")).drop("_last")


def paths(graph: Graph, iterations: pa.Table, ranks: pa.Table | None = None,
          iteration: int | list[int] | None = None, spans: pl.DataFrame | None = None) -> pl.DataFrame:
    """Critical-path segments of every iteration (or one, or those listed), in time order (``spans``: the
    iterations' spans on the job clock where they are not the measured ones, as for a replayed schedule)."""
    spans = iteration_spans(iterations, ranks) if spans is None else spans
    if iteration is not None:
        spans = spans.filter(pl.col("iteration").is_in(iteration if isinstance(iteration, list) else [iteration]))
    # the graph's times: a gloo work recorded as ending after its consumer woke up ends earlier there
    a_end = graph.node_time[1::2]
    out: list[Segments] = []
    its: list[int] = []
    # each iteration's activities, found by binary search in one stable sort (not a mask over all per iteration)
    by_iter, sorted_iter = _by_iteration(graph)
    for it_no, s0, s1 in spans.iter_rows():
        mine = by_iter[np.searchsorted(sorted_iter, it_no, "left"):np.searchsorted(sorted_iter, it_no, "right")]
        mask = mine[(a_end[mine] <= s1) & (a_end[mine] > s0)]
        if mask.size == 0:
            continue
        sink_act = int(mask[np.argmax(a_end[mask])])
        seg = with_tail(_walk(graph, 2 * sink_act + 1, s0), int(a_end[sink_act]), s1, sink_act)
        out.append(_waiting_labels(graph, seg))
        its.append(it_no)
    if not out:
        return pl.DataFrame(schema=SEGMENT_SCHEMA)
    return _frame(graph, its, out)


def _by_iteration(graph: Graph) -> tuple[np.ndarray, np.ndarray]:
    """The activities in a stable sort by iteration, and their iterations so sorted (cached on the graph)."""
    cache = _cache(graph)
    if "_by_iter" not in cache:
        col = graph.act.get_column("iteration")
        a_iter = col.fill_null(-(1 << 62)).to_numpy()
        counted = a_iter > -(1 << 61) if col.has_nulls() else None  # (None: all counted, no masked reductions)
        seen = a_iter if counted is None else a_iter[counted]
        lo, hi = (int(seen.min()), int(seen.max())) if seen.size else (0, 0)
        if hi - lo < (1 << 16) - 2:  # a few thousand iterations: their 16-bit ranks sort in one radix pass (8-bit,
            # fewer than 254: half the passes); the uncounted first, as their -2**62 sorts
            small = np.uint8 if hi - lo < (1 << 8) - 2 else np.uint16
            key = a_iter - (lo - 1) if counted is None else np.where(counted, a_iter - (lo - 1), 0)
            by_iter = np.argsort(key.astype(small), kind="stable")
        else:
            by_iter = np.argsort(a_iter, kind="stable")
        cache["_by_iter"] = (by_iter, a_iter[by_iter])
    return cache["_by_iter"]


class Segments(NamedTuple):
    """Segments of one path, as arrays: start, end, label (its index in :data:`LABELS`), activity, edge (its code in
    ``EDGE_CODE``)."""

    start: np.ndarray
    end: np.ndarray
    label: np.ndarray
    act: np.ndarray
    edge: np.ndarray


def with_tail(seg: Segments, last_end: int, s1: int, sink: int) -> Segments:
    """A path's segments (latest first) with idle from its last activity's end to the iteration's end ``s1`` before
    them, where the iteration ends later (the ``tail``, owned by that activity ``sink``)."""
    if last_end >= s1:
        return seg
    tail = Segments(np.array([last_end]), np.array([s1]), np.array([_CODE["idle"]], np.int8), np.array([sink]),
                    np.array([EDGE_CODE["tail"]], np.int8))
    return Segments(*(np.concatenate([x, y]) for x, y in zip(tail, seg, strict=True)))


def _in_time_order(seg: Segments) -> np.ndarray:
    """The order that puts a walk's segments (latest first) in time order: reversed, or a stable sort by start where
    reversing does not."""
    order = np.arange(seg.start.size)[::-1]
    if seg.start.size > 1 and (np.diff(seg.start[order]) <= 0).any():
        order = np.argsort(seg.start, kind="stable")
    return order


def _frame(graph: Graph, its: list[int], paths: list[_Labelled]) -> pl.DataFrame:
    """The SEGMENT_SCHEMA rows of the iterations' paths (each in time order), one frame built once for them all."""
    acts = np.concatenate([p.act for p in paths])
    return frame(its, paths, graph.act.select("rank", "lane", "name", "event_row")[acts])  # one gather for all


def frame(its: list[int], paths: list[_Labelled], of: pl.DataFrame) -> pl.DataFrame:
    """The SEGMENT_SCHEMA rows of the iterations' paths (each in time order); ``of``: the ``rank, lane, name,
    event_row`` of every segment's activity, the paths' segments one after the other."""
    seg = _Labelled(*(np.concatenate(x) for x in zip(*paths, strict=True)))
    sizes = np.array([p.start.size for p in paths])
    bounds = np.cumsum(sizes) - sizes
    step = np.arange(seg.start.size, dtype=np.int64) - np.repeat(bounds, sizes)
    waiting = pl.Series(np.where(seg.waiting_on >= 0, seg.waiting_on, 0), dtype=pl.Int32)
    return pl.DataFrame({
        "iteration": np.repeat(np.asarray(its, dtype=np.int64), sizes), "step": step,
        "rank": of.get_column("rank"), "lane": of.get_column("lane"),
        "start_ns": seg.start, "end_ns": seg.end, "dur_ns": seg.end - seg.start,
        "label": _LABEL_SERIES.gather(seg.label),
        "waiting_on": waiting.set(pl.Series(seg.waiting_on < 0), None),
        "name": of.get_column("name").cast(pl.String).set(pl.Series(seg.unnamed), None),
        "event_row": of.get_column("event_row").set(pl.Series(seg.edge == EDGE_CODE["tail"]), None),
        "edge": _EDGE_SERIES.gather(seg.edge),
    }, schema=SEGMENT_SCHEMA)


def _cache(graph: Graph) -> dict:
    """What the paths read of a graph's activities, kept on it (and shared with the graphs of its replays, which
    have the same activities: :func:`of_schedule`)."""
    return graph.__dict__.setdefault("_lists", {})


def _activity_labels(graph: Graph) -> np.ndarray:
    """What each activity's own work is on a path, as its index in :data:`LABELS` (cached on the graph)."""
    cache = _cache(graph)
    if "_label" not in cache:
        act = graph.act
        # one pass over the kinds (an unknown one is CPU work, as any kind but those below): the build's codes where
        # it kept them, else the text's
        if graph.kind is not None and graph.kind.size == act.height:
            kind = _KIND_OF_CODE[graph.kind]
        else:
            kind = act.get_column("kind").cast(pl.Enum(_KINDS), strict=False).to_physical().fill_null(len(_KINDS))
            kind = kind.to_numpy()
        code = _KIND_LABEL[kind]
        # CPU jobs compute on the CPU: the operators of ranks without device activity (of an unknown rank: CPU work)
        ops = np.flatnonzero(kind == _KINDS.index("cpu_op"))
        on_cpu = ~act.get_column("rank").gather(ops).is_in(sorted(graph.gpu_ranks))
        code[ops[on_cpu.fill_null(False).to_numpy()]] = _CODE["compute"]
        runtime = np.flatnonzero(kind == _KINDS.index("runtime"))
        launch = act.get_column("name").gather(runtime).cast(pl.String).str.contains("Launch", literal=True)
        code[runtime[launch.fill_null(False).to_numpy()]] = _CODE["launch"]
        cache["_label"] = code
    return cache["_label"]


def _chase(graph: Graph, sink: int, s0: int) -> tuple[np.ndarray, np.ndarray]:
    """The nodes back from ``sink`` along binding edges while after ``s0``, and each one's binding edge: compiled on a
    big graph (:func:`tracekit.engine.chase`), else the loop below, which gives the same chain."""
    compiled = dag.engine(graph.n_nodes)
    if compiled is not None:
        return compiled.chase(graph.binding, graph.src, graph.node_time, sink, s0)
    b_item, s_item, t_item = graph.binding.item, graph.src.item, graph.node_time.item
    nodes: list[int] = []
    edges: list[int] = []
    node = sink
    while t_item(node) > s0:
        e = b_item(node)
        nodes.append(node)
        edges.append(e)
        if e < 0:
            break
        node = s_item(e)
    return np.asarray(nodes, dtype=np.int64), np.asarray(edges, dtype=np.int64)


_WALK_CODES = (_ET["own"], _ET["launch"], _ET["enqueue"], _CODE["idle"], EDGE_CODE["program"], EDGE_CODE["source"])


def _walk(graph: Graph, sink: int, s0: int) -> Segments:
    """Follow binding edges back from ``sink`` to time ``s0``: the segments of the path (latest first)."""
    return _walk_chain(graph, *_chase(graph, sink, s0), s0)


def walk_part(graph: Graph, sink: int, s0: int, ghosts: int) -> tuple[Segments, int]:
    """:func:`_walk` on one rank's graph whose nodes from ``ghosts`` on stand for other ranks' members
    (:func:`tracekit.analysis.graph.crossings.rank_graph`): the segments up to the first ghost the chain reaches, and
    that ghost (-1 where the chain ends on the rank)."""
    nd, ed = _chase(graph, sink, s0)
    hop = -1
    if nd.size and nd[-1] >= ghosts:
        hop, nd, ed = int(nd[-1]), nd[:-1], ed[:-1]
    return _walk_chain(graph, nd, ed, s0), hop


def _walk_chain(graph: Graph, nd: np.ndarray, ed: np.ndarray, s0: int) -> Segments:
    """The segments of the chain ``nd`` (nodes back along their binding edges ``ed``) after ``s0``: by the engine
    (:func:`tracekit.engine.walk`), else by numpy as below."""
    times = graph.node_time
    compiled = dag.engine(graph.n_nodes)
    if compiled is not None:
        return Segments(*compiled.walk(nd, ed, graph.src, graph.etype, graph.lag, graph.gap, times,
                                        _activity_labels(graph), _LAG_CODE, _SLACK_CODE, s0, _WALK_CODES))
    source = ed < 0
    ok = ~source
    e = ed[ok]
    n = nd[ok]
    p = graph.src[e]
    et = graph.etype[e]
    lag = graph.lag[e]
    t_node = times[n]
    t_struct = times[p] + lag
    a_dst, a_src = n // 2, p // 2
    # slack: from the structural bound to the node
    slack_label = _SLACK_CODE[et]
    # structural lag: the activity's own work, or what the edge's lag is spent on
    own = et == _ET["own"]
    lag_label = np.where(own, _activity_labels(graph)[a_dst], _LAG_CODE[et])
    lag_owner = np.where(np.isin(et, [_ET["launch"], _ET["enqueue"]]) & ~own, a_src, a_dst)
    # the untraced gaps inside a merged run's own work (:mod:`tracekit.analysis.graph.compact`): idle on program order,
    # at the end of its lag
    gap = graph.gap[e] if graph.gap is not None else np.zeros(e.size, dtype=np.int64)
    t_work = t_struct - gap
    has_lag = (lag - gap > 0) & (t_work > s0)
    k = n.size
    # per step: the slack segment, the gaps, then the lag segment (the order the path is read in, latest first)
    start = np.empty(3 * k, dtype=np.int64)
    end = np.empty(3 * k, dtype=np.int64)
    start[0::3], end[0::3] = np.maximum(t_struct, s0), t_node
    start[1::3], end[1::3] = np.maximum(t_work, s0), np.minimum(t_struct, t_node)
    start[2::3], end[2::3] = np.maximum(times[p], s0), np.minimum(t_work, t_node)
    label = np.empty(3 * k, dtype=np.int8)
    label[0::3], label[1::3], label[2::3] = slack_label, _CODE["idle"], lag_label
    owner = np.empty(3 * k, dtype=np.int64)
    owner[0::3], owner[1::3], owner[2::3] = a_dst, a_dst, lag_owner
    edge = np.empty(3 * k, dtype=np.int8)
    edge[0::3] = edge[2::3] = et
    edge[1::3] = EDGE_CODE["program"]
    keep = np.empty(3 * k, dtype=bool)
    keep[0::3], keep[1::3], keep[2::3] = t_node > t_struct, (gap > 0) & (t_struct > s0), has_lag
    if source.any():  # the chain ends at a node nothing binds: idle from the iteration's start
        last = nd[source][0]
        start = np.append(start[keep], s0)
        end = np.append(end[keep], times[last])
        label = np.append(label[keep], np.int8(_CODE["idle"]))
        owner = np.append(owner[keep], last // 2)
        edge = np.append(edge[keep], np.int8(EDGE_CODE["source"]))
    else:
        start, end, label, owner, edge = start[keep], end[keep], label[keep], owner[keep], edge[keep]
    pos = end > start
    return Segments(start[pos], end[pos], label[pos], owner[pos], edge[pos])


class _Labelled(NamedTuple):
    """A path's segments in time order, labelled: :class:`Segments` with the rank each waited on (-1: none) and
    whether it names no activity (idle)."""

    start: np.ndarray
    end: np.ndarray
    label: np.ndarray
    act: np.ndarray
    edge: np.ndarray
    waiting_on: np.ndarray
    unnamed: np.ndarray


def _waiting_labels(graph: Graph, seg: Segments) -> _Labelled:
    """The path's segments in time order, where it crosses ranks at a collective the time the other members had
    already arrived and waited (first arrival → the straggler's arrival) labelled "waiting on rank <straggler>"."""
    if graph.etype.size == 0 or seg.start.size == 0:
        return label_waiting(seg, [], lambda a: a)
    a_rank = graph.act.get_column("rank").to_numpy()
    return label_waiting(seg, _windows(graph, seg, a_rank), lambda a: a_rank[a])


def _windows(graph: Graph, seg: Segments, a_rank: np.ndarray) -> list[tuple[int, int, int]]:
    """Per collective edge on the path (in the walk's order, latest first) where a member waited: ``(first arrival,
    the straggler's arrival, the straggler's rank)`` (``a_rank``: each activity's rank)."""
    coll = _ET["collective"]
    dst_act = seg.act[seg.edge == EDGE_CODE["collective"]]
    if dst_act.size == 0:
        return []
    a_start = graph.node_time[0::2]
    ce = np.flatnonzero(graph.etype == coll)
    # a replay's queued transfers (the previous one on the link) are not members of the instance
    ce = ce[ce < graph.__dict__.get("_queued_after", graph.src.size)]
    ce = ce[np.argsort(graph.dst[ce], kind="stable")]
    ce_dst = graph.dst[ce]
    windows: list[tuple[int, int, int]] = []
    # the straggler is the source of the binding collective edge into the member's end
    hubs = graph.hubs
    for d in dst_act.tolist():
        e = graph.binding[2 * d + 1]
        if e < 0 or graph.etype[e] != coll:
            continue
        k = graph.src[e] // 2
        at = np.searchsorted(hubs.edge, e) if hubs is not None else 0
        if hubs is not None and at < hubs.edge.size and hubs.edge[at] == e:  # every member of the hub's instance
            h = hubs.hub[at]
            members = hubs.member[hubs.ptr[h]:hubs.ptr[h + 1]] // 2
        else:
            lo, hi = np.searchsorted(ce_dst, [2 * d + 1, 2 * d + 2])
            members = graph.src[ce[lo:hi]] // 2
        first = int(min(a_start[members].min(), a_start[d]))
        last = int(a_start[k])
        if last > first:
            windows.append((first, last, int(a_rank[k])))
    return windows


def label_waiting(seg: Segments, windows: list[tuple[int, int, int]], rank_of: Callable[[np.ndarray], np.ndarray]
                  ) -> _Labelled:
    """The path's segments in time order, each of ``windows`` (:func:`_windows`) labelling the straggler's segments
    inside it "waiting on rank <straggler>" (``rank_of``: the rank of activities)."""
    order = _in_time_order(seg)
    out = _Labelled(*(x[order] for x in seg), np.full(order.size, -1, np.int64), seg.label[order] == _CODE["idle"])
    if not windows:
        return out
    for first, last, k in windows:
        rank = rank_of(out.act)
        inside = (out.start < last) & (out.end > first) & (rank == k) & (out.label != _CODE["transfer"])
        # split segments that straddle the window's start: the part before it stays, the part after may wait
        cut = np.flatnonzero(inside & (out.start < first))
        if cut.size:
            before = out._replace(end=out.end.copy())
            before.end[cut] = first
            after = _Labelled(*(x[cut] for x in out))._replace(start=np.full(cut.size, first, np.int64))
            out = _Labelled(*(np.concatenate([x, y]) for x, y in zip(before, after, strict=True)))
            rank = rank_of(out.act)
        inside = (out.start >= first) & (out.start < last) & (rank == k) & (out.label != _CODE["transfer"])
        out.label[inside] = _CODE["waiting"]
        out.waiting_on[inside] = k
    # in time order again (every segment starts where no other does: the path covers its span once)
    return _Labelled(*(x[np.argsort(out.start, kind="stable")] for x in out))


def runs(segments: pl.DataFrame) -> pl.DataFrame:
    """Consecutive segments (in time order) of one iteration with the same rank, label and activity merged
    into one run, as a person reads a path: ``iteration, start_ns, end_ns, dur_ns, rank, lane, label,
    waiting_on, what, name, segments``. ``what`` is the label, with waiting spelled ``waiting on rank k``;
    ``lane`` is the run's first segment's; ``name`` is "" for segments without an activity (idle)."""
    if segments.height == 0:
        return pl.DataFrame(schema={"iteration": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64,
                                    "dur_ns": pl.Int64, "rank": pl.Int32, "lane": pl.String, "label": pl.String,
                                    "waiting_on": pl.Int32, "what": pl.String, "name": pl.String,
                                    "segments": pl.UInt32})
    what = pl.when(pl.col("label") == "waiting").then(
        pl.concat_str(pl.lit("waiting on rank "), pl.col("waiting_on").cast(pl.String))).otherwise(pl.col("label"))
    changed = ((pl.col("what") != pl.col("what").shift(1)) | (pl.col("rank") != pl.col("rank").shift(1))
               | (pl.col("name") != pl.col("name").shift(1))
               | (pl.col("iteration") != pl.col("iteration").shift(1))).fill_null(True)
    return (segments.sort(["iteration", "start_ns"]).with_columns(what.alias("what"), pl.col("name").fill_null(""))
            .with_columns(changed.cum_sum().alias("_run"))
            .group_by("_run", maintain_order=True)
            .agg(pl.col("iteration").first(), pl.col("start_ns").first(), pl.col("end_ns").max(),
                 pl.col("dur_ns").sum(), pl.col("rank").first(), pl.col("lane").first(), pl.col("label").first(),
                 pl.col("waiting_on").first(), pl.col("what").first(), pl.col("name").first(),
                 pl.len().alias("segments"))
            .drop("_run"))


#: the verdict reads the critical path of at most this many iterations, spread evenly over the job (all of a job
#: with fewer): what the path is made of, without following every iteration of a long trace
SAMPLE_ITERATIONS = 12


def sample(iteration_numbers: list[int], most: int = SAMPLE_ITERATIONS) -> list[int]:
    """At most ``most`` of the iterations, spread evenly from the first to the last (all when there are fewer)."""
    its = sorted(iteration_numbers)
    if len(its) <= most:
        return its
    return sorted({its[round(i * (len(its) - 1) / (most - 1))] for i in range(most)})


def summary(segments: pl.DataFrame, iterations: pa.Table, ranks: pa.Table | None = None,
            spans: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per iteration: path length (= iteration time), share of the path per label, the ranks it crosses,
    the rank most waited on (the longest in all; null when the path never waits) and ``unexplained_share``: the
    part of the idle share that no recorded or inferred dependency explains (:data:`UNEXPLAINED_EDGES`), which
    every what-if replay keeps as measured."""
    if segments.height == 0:
        return pl.DataFrame()
    spans = iteration_spans(iterations, ranks) if spans is None else spans
    label = pl.when(pl.col("label") == "waiting").then(pl.lit("waiting")).otherwise(pl.col("label"))
    base = segments.with_columns(label.alias("label"))
    per = base.group_by(["iteration", "label"]).agg(pl.col("dur_ns").sum()).pivot(
        on="label", index="iteration", values="dur_ns").fill_null(0)
    agg = base.group_by("iteration").agg(
        pl.col("dur_ns").sum().alias("path_ns"),
        pl.col("rank").unique().sort().alias("ranks"),
    )
    # the rank the path waited on longest (the lowest on a tie: the same answer on every run)
    waited = (base.filter(pl.col("waiting_on").is_not_null()).group_by(["iteration", "waiting_on"])
              .agg(pl.col("dur_ns").sum().alias("_waited"))
              .sort(["iteration", "_waited", "waiting_on"], descending=[False, True, False])
              .group_by("iteration", maintain_order=True).agg(pl.col("waiting_on").first().alias("most_waited_on")))
    agg = agg.join(waited, on="iteration", how="left")
    # idle that no recorded or inferred dependency explains: a gap on a lane's program order, or before the path's
    # first activity — every replay keeps it as measured
    unexplained = (base.filter((pl.col("label") == "idle") & pl.col("edge").is_in(UNEXPLAINED_EDGES))
                   .group_by("iteration").agg(pl.col("dur_ns").sum().alias("unexplained")))
    agg = agg.join(unexplained, on="iteration", how="left").with_columns(pl.col("unexplained").fill_null(0))
    out = agg.join(per, on="iteration").join(spans.rename({"start_ns": "span_start_ns", "end_ns": "span_end_ns"}),
                                             on="iteration")
    out = out.with_columns((pl.col("span_end_ns") - pl.col("span_start_ns")).alias("iteration_ns"))
    for lab in LABELS:
        if lab not in out.columns:
            out = out.with_columns(pl.lit(0, dtype=pl.Int64).alias(lab))
        out = out.with_columns((pl.col(lab) / pl.col("path_ns")).alias(f"{lab}_share"))
    out = out.with_columns((pl.col("unexplained") / pl.col("path_ns")).alias("unexplained_share"))
    cols = ["iteration", "path_ns", "iteration_ns", "ranks", "most_waited_on",
            *[f"{lab}_share" for lab in LABELS], "unexplained_share"]
    return out.select(cols).sort("iteration")
