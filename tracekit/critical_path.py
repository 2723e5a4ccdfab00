"""The critical path of every iteration across all ranks (DESIGN.md "Critical path").

From the last activity to end in an iteration, follow each node's binding edge (the dependency that
actually set its time, :mod:`tracekit.dag`) back to the iteration's start. Every step is a segment of
the path, labelled by what the time was spent on:

``compute``, ``memory``   device kernels and copies
``transfer``              communication moving data (after every member arrived)
``CPU``                   operators on a CPU thread, including work before a launch or after a wait
                          (on CPU-only ranks — gloo jobs — operators are the ``compute``)
``launch``                between a launch call and its kernel starting (queueing, launch latency)
``idle``                  nothing traced explains the time (untraced CPU work, wake-up latency)
``waiting on rank k``     the path runs through rank k while the other members of a collective had
                          already arrived and waited for k (the skew of that instance)

Segments cover the iteration's span on the job clock exactly (from the earliest rank's window start
to the latest rank's window end), so the path length equals the iteration time to the nanosecond.
Overlapped communication never appears on the path: it never binds what follows it.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

from tracekit.dag import EDGE_TYPES, Graph

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


_LAG_LABEL = [_lag_label(i) for i in range(len(EDGE_TYPES))]
_SLACK_LABEL = [_slack_label(i) for i in range(len(EDGE_TYPES))]


def paths(graph: Graph, iterations: pa.Table, ranks: pa.Table | None = None,
          iteration: int | None = None) -> pl.DataFrame:
    """Critical-path segments of every iteration (or one), in time order."""
    spans = iteration_spans(iterations, ranks)
    if iteration is not None:
        spans = spans.filter(pl.col("iteration") == iteration)
    act = graph.act
    a_iter = act.get_column("iteration").fill_null(-(1 << 62)).to_numpy()
    a_rank = act.get_column("rank").to_numpy()
    a_lane = act.get_column("lane").to_numpy()
    a_name = act.get_column("name").to_numpy()
    a_row = act.get_column("event_row").to_numpy()
    # the graph's times: a gloo work recorded as ending after its consumer woke up ends earlier there
    a_start = graph.node_time[0::2]
    a_end = graph.node_time[1::2]
    out: list[pl.DataFrame] = []
    for it_no, s0, s1 in spans.iter_rows():
        mask = np.flatnonzero((a_iter == it_no) & (a_end <= s1) & (a_end > s0))
        if mask.size == 0:
            continue
        sink_act = mask[np.argmax(a_end[mask])]
        segs = _walk(graph, 2 * sink_act + 1, s0)
        rows: dict[str, list] = {k: [] for k in SEGMENT_SCHEMA}
        if a_end[sink_act] < s1:
            _append(rows, it_no, a_rank[sink_act], a_lane[sink_act], a_end[sink_act], s1, "idle", None, None,
                    None, "tail")
        for seg_start, seg_end, label, act_i, edge in segs:
            _append(rows, it_no, a_rank[act_i], a_lane[act_i], seg_start, seg_end, label,
                    a_name[act_i] if label not in ("idle",) else None, int(a_row[act_i]), None, edge)
        df = pl.DataFrame(rows, schema=SEGMENT_SCHEMA).sort("start_ns")
        df = _waiting_labels(df, graph, segs, a_rank, a_start)
        out.append(df.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias("step")))
    if not out:
        return pl.DataFrame(schema=SEGMENT_SCHEMA)
    return pl.concat(out).select(list(SEGMENT_SCHEMA))


def _append(rows: dict[str, list], it_no: int, rank: int, lane: str, s: int, e: int, label: str,
            name: str | None, row: int | None, waiting: int | None, edge: str) -> None:
    rows["iteration"].append(it_no)
    rows["step"].append(0)
    rows["rank"].append(int(rank))
    rows["lane"].append(lane)
    rows["start_ns"].append(int(s))
    rows["end_ns"].append(int(e))
    rows["dur_ns"].append(int(e - s))
    rows["label"].append(label)
    rows["waiting_on"].append(waiting)
    rows["name"].append(name)
    rows["event_row"].append(row)
    rows["edge"].append(edge)


def _walk(graph: Graph, sink: int, s0: int) -> list[tuple]:
    """Follow binding edges back from ``sink`` to time ``s0``; returns (start, end, label, activity, edge)."""
    segs: list[tuple] = []
    node = sink
    # plain lists: a Python walk indexes them several times faster than numpy arrays
    binding = graph.binding_list
    src = graph.src_list
    etype = graph.etype_list
    lags = graph.lag_list
    times = graph.time_list
    kinds = graph.column_list("kind")
    names = graph.column_list("name")
    ranks = graph.column_list("rank")
    gpu_ranks = graph.gpu_ranks
    own, launch, enqueue = _ET["own"], _ET["launch"], _ET["enqueue"]
    while times[node] > s0:
        e = binding[node]
        if e < 0:
            segs.append((s0, times[node], "idle", node // 2, "source"))
            break
        p = src[e]
        et = etype[e]
        a_dst = node // 2
        a_src = p // 2
        t_node = times[node]
        lag_e = lags[e]
        t_struct = times[p] + lag_e
        # slack: from the structural bound to the node
        if t_node > t_struct:
            segs.append((max(t_struct, s0), t_node, _SLACK_LABEL[et], a_dst, EDGE_TYPES[et]))
        if lag_e > 0 and t_struct > s0:
            if et == own:
                label = _activity_label(kinds[a_dst], names[a_dst], ranks[a_dst] not in gpu_ranks)
                owner = a_dst
            else:
                label = _LAG_LABEL[et]
                owner = a_src if et in (launch, enqueue) else a_dst
            segs.append((max(times[p], s0), min(t_struct, t_node), label, owner, EDGE_TYPES[et]))
        node = p
    return [s for s in segs if s[1] > s[0]]


def _waiting_labels(df: pl.DataFrame, graph: Graph, segs: list[tuple], a_rank: np.ndarray,
                    a_start: np.ndarray) -> pl.DataFrame:
    """Where the path crosses ranks at a collective, the time the other members had already arrived
    and waited (first arrival → the straggler's arrival) is "waiting on rank <straggler>"."""
    if graph.etype.size == 0 or df.height == 0:
        return df
    windows: list[tuple[int, int, int]] = []
    coll = _ET["collective"]
    # for every collective edge on the path: its instance's first arrival
    cross = [s for s in segs if s[4] == "collective"]
    if not cross:
        return df
    dst_act = np.array([s[3] for s in cross])
    # the straggler is the source of the binding collective edge into the member's end
    for d in dst_act:
        e = graph.binding[2 * d + 1]
        if e < 0 or graph.etype[e] != coll:
            continue
        k = graph.src[e] // 2
        members = graph.src[(graph.dst == 2 * d + 1) & (graph.etype == coll)] // 2
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


def summary(segments: pl.DataFrame, iterations: pa.Table, ranks: pa.Table | None = None) -> pl.DataFrame:
    """Per iteration: path length (= iteration time), share of the path per label, the ranks it crosses
    and the rank most waited on (the longest in all; null when the path never waits)."""
    if segments.height == 0:
        return pl.DataFrame()
    spans = iteration_spans(iterations, ranks)
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
    out = agg.join(per, on="iteration").join(spans.rename({"start_ns": "span_start_ns", "end_ns": "span_end_ns"}),
                                             on="iteration")
    out = out.with_columns((pl.col("span_end_ns") - pl.col("span_start_ns")).alias("iteration_ns"))
    for lab in LABELS:
        if lab not in out.columns:
            out = out.with_columns(pl.lit(0, dtype=pl.Int64).alias(lab))
        out = out.with_columns((pl.col(lab) / pl.col("path_ns")).alias(f"{lab}_share"))
    cols = ["iteration", "path_ns", "iteration_ns", "ranks", "most_waited_on",
            *[f"{lab}_share" for lab in LABELS]]
    return out.select(cols).sort("iteration")
