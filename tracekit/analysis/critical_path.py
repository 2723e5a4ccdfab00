"""The critical path of every iteration across all ranks (DESIGN.md "Critical path").

From the last activity to end in an iteration, follow each node's binding edge (the dependency that
actually set its time, :mod:`tracekit.analysis.dag`) back to the iteration's start. Every step is a segment of
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

import sys
from typing import NamedTuple

import numpy as np
import polars as pl
import pyarrow as pa

from tracekit.analysis.dag import EDGE_TYPES, Graph

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


def _activity_label(kind: str, name: str, cpu_only: bool) -> str:
    if kind == "compute" or (cpu_only and kind == "cpu_op"):  # CPU jobs compute on the CPU
        return "compute"
    if kind == "memory":
        return "memory"
    if kind == "comm":
        return "transfer"
    if kind == "runtime" and "Launch" in name:
        return "launch"
    return "CPU"


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
_LAG_LABEL = [_lag_label(i) for i in range(len(EDGE_TYPES))]
_SLACK_LABEL = [_slack_label(i) for i in range(len(EDGE_TYPES))]


def of_schedule(graph: Graph, times: np.ndarray, weight: np.ndarray,
                extra: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> Graph:
    """``graph`` as a replay scheduled it (``times`` under edge weights ``weight``, plus the replay's ``extra``
    edges — transfers queued on a link — as collective edges): :func:`paths` of it is the chain that would set the
    pace, and its idle on gaps nothing explains (the measured slack every replay keeps) shows where a prediction
    rests on unexplained time."""
    # a replay's weight is the edge's (re-costed) structural lag plus the measured slack it keeps
    src, dst, etype, slack = graph.src, graph.dst, graph.etype, graph.slack
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
    from tracekit.analysis.dag import bind

    binding, _ = bind(src, dst, w, times)
    return Graph(act=graph.act, src=src, dst=dst, lag=w - slack, etype=etype, node_time=times, binding=binding,
                 slack=slack, violated=graph.violated, gap=gap)


def schedule_spans(iteration_of: np.ndarray, times: np.ndarray) -> pl.DataFrame:
    """``iteration, start_ns, end_ns`` of a replayed schedule: each iteration from its first counted activity's start
    (``iteration_of``: per activity, its iteration or a huge negative number where it does not count, as
    :attr:`tracekit.analysis.whatif.Model.iteration_of`) to the next one's, the last to its last end."""
    ok = iteration_of > -(1 << 61)
    df = pl.DataFrame({"iteration": iteration_of[ok], "s": times[0::2][ok], "e": times[1::2][ok]}).group_by(
        "iteration").agg(pl.col("s").min().alias("start_ns"), pl.col("e").max().alias("_last")).sort("iteration")
    return df.with_columns(pl.col("start_ns").shift(-1).fill_null(pl.col("_last")).alias("end_ns")).drop("_last")


def paths(graph: Graph, iterations: pa.Table, ranks: pa.Table | None = None,
          iteration: int | list[int] | None = None, spans: pl.DataFrame | None = None) -> pl.DataFrame:
    """Critical-path segments of every iteration (or one, or those listed), in time order (``spans``: the
    iterations' spans on the job clock where they are not the measured ones, as for a replayed schedule)."""
    spans = iteration_spans(iterations, ranks) if spans is None else spans
    if iteration is not None:
        spans = spans.filter(pl.col("iteration").is_in(iteration if isinstance(iteration, list) else [iteration]))
    act = graph.act
    a_iter = act.get_column("iteration").fill_null(-(1 << 62)).to_numpy()
    # the graph's times: a gloo work recorded as ending after its consumer woke up ends earlier there
    a_end = graph.node_time[1::2]
    out: list[pl.DataFrame] = []
    # each iteration's activities, found by binary search in one stable sort (not a mask over all per iteration)
    by_iter = np.argsort(a_iter, kind="stable")
    sorted_iter = a_iter[by_iter]
    for it_no, s0, s1 in spans.iter_rows():
        mine = by_iter[np.searchsorted(sorted_iter, it_no, "left"):np.searchsorted(sorted_iter, it_no, "right")]
        mask = mine[(a_end[mine] <= s1) & (a_end[mine] > s0)]
        if mask.size == 0:
            continue
        sink_act = int(mask[np.argmax(a_end[mask])])
        seg = _walk(graph, 2 * sink_act + 1, s0)
        if a_end[sink_act] < s1:  # the iteration ends after its last activity: idle until then
            tail = _Segments(np.array([a_end[sink_act]]), np.array([s1]), np.array(["idle"], dtype=object),
                             np.array([sink_act]), np.array(["tail"], dtype=object))
            seg = _Segments(*(np.concatenate([x, y]) for x, y in zip(tail, seg, strict=True)))
        df = _frame(graph, it_no, seg)
        df = _waiting_labels(df, graph, seg)
        out.append(df.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias("step")))
    if not out:
        return pl.DataFrame(schema=SEGMENT_SCHEMA)
    return pl.concat(out).select(list(SEGMENT_SCHEMA))


class _Segments(NamedTuple):
    """Segments of one path, as arrays: start, end, label, activity, edge type name."""

    start: np.ndarray
    end: np.ndarray
    label: np.ndarray
    act: np.ndarray
    edge: np.ndarray


def _frame(graph: Graph, it_no: int, seg: _Segments) -> pl.DataFrame:
    """The SEGMENT_SCHEMA rows of one iteration's segments, in time order."""
    act = graph.act
    # a walk's segments come latest first: reversed they are in time order (a stable sort where they are not), put
    # in order on the arrays before any frame is built (a polars sort moves every column, strings included)
    order = np.arange(seg.start.size)[::-1]
    if seg.start.size > 1 and (np.diff(seg.start[order]) <= 0).any():  # ties: their order as a stable sort gives
        order = np.argsort(seg.start, kind="stable")
    seg = _Segments(*(x[order] for x in seg))
    idx = pl.Series(seg.act)
    idle = pl.Series(seg.label == "idle")
    return pl.DataFrame({
        "iteration": np.full(seg.act.size, it_no, dtype=np.int64), "step": np.zeros(seg.act.size, dtype=np.int64),
        "rank": act.get_column("rank").gather(idx), "lane": act.get_column("lane").gather(idx),
        "start_ns": seg.start, "end_ns": seg.end, "dur_ns": seg.end - seg.start,
        # strings as lists (a path has thousands of segments): polars reads object arrays as Object
        "label": seg.label.tolist(), "waiting_on": pl.Series([None] * seg.act.size, dtype=pl.Int32),
        "name": act.get_column("name").gather(idx).cast(pl.String).set(idle, None),
        "event_row": act.get_column("event_row").gather(idx).set(pl.Series(seg.edge == "tail"), None),
        "edge": seg.edge.tolist(),
    }, schema=SEGMENT_SCHEMA)


def _activity_labels(graph: Graph) -> np.ndarray:
    """What each activity's own work is on a path (cached on the graph)."""
    cache = graph.__dict__.setdefault("_lists", {})
    if "_label" not in cache:
        act = graph.act
        cpu_only = ~act.get_column("rank").is_in(sorted(graph.gpu_ranks))
        kind = pl.col("kind")
        name = pl.col("name").cast(pl.String)
        label = (pl.when((kind == "compute") | (pl.Series(cpu_only) & (kind == "cpu_op"))).then(pl.lit("compute"))
                 .when(kind == "memory").then(pl.lit("memory"))
                 .when(kind == "comm").then(pl.lit("transfer"))
                 .when((kind == "runtime") & name.str.contains("Launch", literal=True)).then(pl.lit("launch"))
                 .otherwise(pl.lit("CPU")))
        cache["_label"] = act.select(label.alias("l")).get_column("l").to_numpy().astype(object)
    return cache["_label"]


#: graphs of at least this many nodes follow their chains compiled (numba's import and cached code cost ~0.4 s once,
#: a Python step ~0.5 µs: a big job's paths are millions of steps); a smaller graph only when numba is loaded already
COMPILED_CHASE_NODES = 1_000_000


def _chase(graph: Graph, sink: int, s0: int) -> tuple[np.ndarray, np.ndarray]:
    """The nodes back from ``sink`` along binding edges while after ``s0``, and each one's binding edge."""
    if graph.n_nodes >= COMPILED_CHASE_NODES or "tracekit.analysis.topological" in sys.modules:
        try:
            from tracekit.analysis import topological
        except ImportError:  # numba has no build for this interpreter: the loop below gives the same chain
            pass
        else:
            return topological.chase(graph.binding, graph.src, graph.node_time, sink, s0)
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


def _walk(graph: Graph, sink: int, s0: int) -> _Segments:
    """Follow binding edges back from ``sink`` to time ``s0``: the segments of the path (latest first)."""
    times = graph.node_time
    # the chain itself is pointer chasing (a scalar loop), compiled on a big graph; everything about its steps is
    # vectorised
    nd, ed = _chase(graph, sink, s0)
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
    names = np.asarray(EDGE_TYPES, dtype=object)
    # slack: from the structural bound to the node
    slack_label = np.asarray(_SLACK_LABEL, dtype=object)[et]
    # structural lag: the activity's own work, or what the edge's lag is spent on
    own = et == _ET["own"]
    lag_label = np.where(own, _activity_labels(graph)[a_dst], np.asarray(_LAG_LABEL, dtype=object)[et])
    lag_owner = np.where(np.isin(et, [_ET["launch"], _ET["enqueue"]]) & ~own, a_src, a_dst)
    # the untraced gaps inside a merged run's own work (:mod:`tracekit.analysis.compact`): idle on program order, at
    # the end of its lag
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
    label = np.empty(3 * k, dtype=object)
    label[0::3], label[1::3], label[2::3] = slack_label, "idle", lag_label
    owner = np.empty(3 * k, dtype=np.int64)
    owner[0::3], owner[1::3], owner[2::3] = a_dst, a_dst, lag_owner
    edge = np.empty(3 * k, dtype=object)
    edge[0::3] = edge[2::3] = names[et]
    edge[1::3] = "program"
    keep = np.empty(3 * k, dtype=bool)
    keep[0::3], keep[1::3], keep[2::3] = t_node > t_struct, (gap > 0) & (t_struct > s0), has_lag
    if source.any():  # the chain ends at a node nothing binds: idle from the iteration's start
        last = nd[source][0]
        start = np.append(start[keep], s0)
        end = np.append(end[keep], times[last])
        label = np.append(label[keep], "idle")
        owner = np.append(owner[keep], last // 2)
        edge = np.append(edge[keep], "source")
    else:
        start, end, label, owner, edge = start[keep], end[keep], label[keep], owner[keep], edge[keep]
    pos = end > start
    return _Segments(start[pos], end[pos], label[pos].astype(object), owner[pos], edge[pos].astype(object))


def _waiting_labels(df: pl.DataFrame, graph: Graph, seg: _Segments) -> pl.DataFrame:
    """Where the path crosses ranks at a collective, the time the other members had already arrived
    and waited (first arrival → the straggler's arrival) is "waiting on rank <straggler>"."""
    if graph.etype.size == 0 or df.height == 0:
        return df
    coll = _ET["collective"]
    # for every collective edge on the path: its instance's first arrival
    dst_act = seg.act[seg.edge == "collective"]
    if dst_act.size == 0:
        return df
    a_start = graph.node_time[0::2]
    a_rank = graph.act.get_column("rank").to_numpy()
    ce = np.flatnonzero(graph.etype == coll)
    ce = ce[np.argsort(graph.dst[ce], kind="stable")]
    ce_dst = graph.dst[ce]
    windows: list[tuple[int, int, int]] = []
    # the straggler is the source of the binding collective edge into the member's end
    for d in dst_act.tolist():
        e = graph.binding[2 * d + 1]
        if e < 0 or graph.etype[e] != coll:
            continue
        k = graph.src[e] // 2
        lo, hi = np.searchsorted(ce_dst, [2 * d + 1, 2 * d + 2])
        members = graph.src[ce[lo:hi]] // 2
        first = int(min(a_start[members].min(), a_start[d]))
        last = int(a_start[k])
        if last > first:
            windows.append((first, last, int(a_rank[k])))
    if not windows:
        return df
    out = df
    for first, last, k in windows:
        inside = (pl.col("start_ns") < last) & (pl.col("end_ns") > first) & (pl.col("rank") == k) & (
            pl.col("label") != "transfer")
        # split segments that straddle the window's start
        straddle = out.filter(inside & (pl.col("start_ns") < first))
        if straddle.height:
            before = straddle.with_columns(pl.lit(first).alias("end_ns"))
            after = straddle.with_columns(pl.lit(first).alias("start_ns"))
            out = pl.concat([out.filter(~(inside & (pl.col("start_ns") < first))), before, after])
        inside = (pl.col("start_ns") >= first) & (pl.col("start_ns") < last) & (pl.col("rank") == k) & (
            pl.col("label") != "transfer")
        out = out.with_columns(
            pl.when(inside).then(pl.lit("waiting")).otherwise(pl.col("label")).alias("label"),
            pl.when(inside).then(pl.lit(k, dtype=pl.Int32)).otherwise(pl.col("waiting_on")).alias("waiting_on"))
    return out.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns")).sort("start_ns")


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
