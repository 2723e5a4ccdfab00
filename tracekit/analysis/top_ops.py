"""The kernels and CPU operators behind each attribution class: which ops the compute, overlapped, exposed
communication and memory time of every rank was spent in (the kernel breakdown Holistic Trace Analysis
users know, cut along tracekit's classes).

Every activity attribution looks at (:func:`tracekit.analysis.attribution.activity`) is measured against the
rank's attribution of each instant, inside the iteration windows:

- compute kernels (and, on CPU-only ranks, the CPU operators) count in ``compute`` and ``overlapped``;
- communication (NCCL kernels, gloo work) in ``overlapped`` and ``exposed_comm``;
- copies and sets in ``memory`` (a copy running under a kernel is that kernel's class, not memory).

An op's ``time_ns`` in a class is the time at least one of its calls ran in the instants of that class
(calls of one op running at once — gloo work on two threads, one kernel on two streams — count once), so
``class_share`` — how much of the class the op covers — is at most 1; different ops running at once each
count, so the ops of a class can add up to more than the class. CPU operators nest: only each thread's
top-level operators are listed (their nested calls folded in, as the critical path names them), so a
thread's time is never counted twice.

One sweep over the activity (:func:`tracekit.analysis.intervals.sweep`) gives the class segments; each op's time
per class is a difference of prefix sums at its start and end (one ``searchsorted`` per rank); an op's calls
are merged into runs first (a cumulative maximum per op), so its time is their union.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.analysis import attribution
from tracekit.analysis.intervals import lane_order, prev_max_end, runs, sweep
from tracekit.model import schema

#: the classes ops are listed under, in display order (idle has no ops)
CLASSES = ("compute", "overlapped", "exposed_comm", "memory")
#: classes an activity of each attribution interval class can be in
_ELIGIBLE = {attribution.COMPUTE: (0, 1), attribution.TRANSFER: (1, 2), attribution.MEMORY: (3,)}


def class_segments(act: pl.DataFrame, iterations: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The attribution of every instant inside the windows, as segments in time order per rank:
    ``(rank, start, length, class)`` with class an index of :data:`CLASSES`, -1 for idle."""
    win = attribution.sorted_windows(iterations)
    w_rank = win.get_column("rank").to_numpy().astype(np.int64)
    s = sweep(act.get_column("rank").to_numpy().astype(np.int64), act.get_column("start_ns").to_numpy(),
              act.get_column("end_ns").to_numpy(), act.get_column("cls").to_numpy(), 5, w_rank,
              win.get_column("start_ns").to_numpy(), win.get_column("end_ns").to_numpy())
    assert s.start is not None
    c = (s.state & (1 << attribution.COMPUTE)) != 0
    comm = (s.state & ((1 << attribution.TRANSFER) | (1 << attribution.WAIT) | (1 << attribution.UNSPLIT))) != 0
    mem = (s.state & (1 << attribution.MEMORY)) != 0
    code = np.select([c & ~comm, c & comm, ~c & comm, mem], [0, 1, 2, 3], -1)
    return w_rank[s.window], s.start, s.length, code


def _codes(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, pa.Array]:
    """Dictionary codes of a column (-1 for null) and the dictionary they index."""
    if isinstance(col, pa.ChunkedArray):
        col = col.unify_dictionaries() if pa.types.is_dictionary(col.type) else col
        col = col.combine_chunks() if col.num_chunks else pa.array([], col.type)
    if not pa.types.is_dictionary(col.type):
        col = col.dictionary_encode()
    codes = pc.fill_null(col.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    return codes, col.dictionary.cast(pa.string())


def _listed(events: pa.Table, act: pl.DataFrame) -> tuple[pl.DataFrame, pa.Array, pa.Array]:
    """The activities an op row can name — device activity as is, CPU work only at the top of its thread — with
    integer ``lane, kind, name`` codes (sorting and grouping on codes, not strings), and the kind and name
    dictionaries."""
    rows = act.get_column("row").to_numpy()
    lane, _ = _codes(events.column("lane"))
    kind, kinds = _codes(events.column("kind"))
    name, names = _codes(events.column("name"))
    dev = np.asarray(pc.is_valid(events.column("device")).to_numpy(zero_copy_only=False), dtype=bool)
    a = act.with_columns(pl.Series("lane", lane[rows]), pl.Series("kind", kind[rows]), pl.Series("name", name[rows]),
                         pl.Series("on_device", dev[rows]))
    r = a.get_column("rank").to_numpy().astype(np.int64)
    ln = a.get_column("lane").to_numpy()
    start = a.get_column("start_ns").to_numpy()
    order, group = lane_order(r, ln, start, a.get_column("end_ns").to_numpy())
    a = a[order]
    reach = prev_max_end(group, start[order], a.get_column("end_ns").to_numpy())
    top = a.get_column("on_device").to_numpy() | (start[order] >= reach)
    return a.filter(pl.Series(top)), kinds, names


def _class_times(segs: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], rank: np.ndarray, start: np.ndarray,
                 end: np.ndarray) -> np.ndarray:
    """Time of each interval ``[start, end)`` of ``rank`` in each class (a column per :data:`CLASSES`), and in
    the windows in all (the last column): per rank and class, a prefix sum of the segments' lengths in that class,
    read at both ends of each interval (one class at a time, so that the working memory is a few columns of the
    rank's segments, not one per class at once)."""
    seg_rank, seg_start, seg_len, seg_code = segs
    k = len(CLASSES)
    times = np.zeros((rank.size, k + 1), dtype=np.int64)
    rows_of, segs_of = _rank_rows(rank), _rank_rows(seg_rank)
    for r in _ranks(seg_rank):
        mine, count = rows_of(int(r))
        if count == 0:
            continue
        sel = segs_of(int(r))[0]
        st, ln, code = seg_start[sel], seg_len[sel], seg_code[sel]
        ends = []  # per end of the intervals: whether a segment starts before it, that segment, the time into it
        for t in (start[mine], end[mine]):
            i = np.searchsorted(st, t, side="right") - 1
            j = np.maximum(i, 0)
            ends.append((i >= 0, j, np.clip(t - st[j], 0, ln[j])))
        cum = np.zeros(code.size + 1, dtype=np.int64)
        for c in range(k + 1):
            in_class = code == c if c < k else np.ones(code.size, dtype=bool)
            np.cumsum(np.where(in_class, ln, 0), out=cum[1:])
            upto = [np.where(some, cum[j] + np.where(in_class[j], part, 0), 0) for some, j, part in ends]
            times[mine, c] = upto[1] - upto[0]
    return times


def _ranks(rank: np.ndarray) -> np.ndarray:
    """``np.unique(rank)``, without its sort where ``rank`` is sorted already (a sweep's millions of segments)."""
    r = runs(rank)
    return np.unique(rank) if r is None else r[0]


def _rank_rows(rank: np.ndarray) -> Callable[[int], tuple[np.ndarray | slice, int]]:
    """Rank -> (its rows of ``rank``, how many): a slice where ``rank`` is sorted (a sweep's segments and the ops
    come rank by rank), else their indices."""
    r = runs(rank)
    if r is None:
        return lambda v: (idx := np.flatnonzero(rank == v), idx.size)
    bounds = {int(v): (int(r[1][i]), int(r[1][i + 1])) for i, v in enumerate(r[0].tolist())}

    def rows(v: int) -> tuple[np.ndarray | slice, int]:
        lo, hi = bounds.get(v, (0, 0))
        return slice(lo, hi), hi - lo
    return rows


def _eligible(cls: np.ndarray) -> np.ndarray:
    """Which classes an activity of each attribution interval class can be listed under."""
    out = np.zeros((cls.size, len(CLASSES)), dtype=bool)
    for c, allowed in _ELIGIBLE.items():
        out[np.ix_(cls == c, list(allowed))] = True
    return out


_KEY = ["rank", "kind", "name"]


class OpTimes(NamedTuple):
    """What :func:`table` and :func:`totals` are both made of (:func:`op_times`)."""

    calls: pl.DataFrame
    time: pl.DataFrame
    totals: dict[int, np.ndarray]


def op_times(events: pa.Table, iterations: pa.Table, act: pl.DataFrame | None = None) -> OpTimes:
    """Per op (rank, kind, name) and class: ``calls`` (its events with time in the class) and ``time_ns`` (the
    time at least one of them ran in the class: calls of one op running at once count once), with class -1 for
    the windows as a whole; and each rank's time per class. A caller making both :func:`table` and :func:`totals`
    gives them these (each would make them again)."""
    act = attribution.activity(events) if act is None else act
    segs = class_segments(act, iterations)
    seg_rank, _, seg_len, seg_code = segs
    k = len(CLASSES)
    segs_of = _rank_rows(seg_rank)
    totals = {}
    for r in _ranks(seg_rank).tolist():
        sel = segs_of(r)[0]
        ln, code = seg_len[sel], seg_code[sel]
        totals[int(r)] = np.array([ln[code == c].sum() for c in range(k)], dtype=np.int64)
    ops, kinds, names = _listed(events, act)
    # every op's calls together, in time order: an op is a run of rows, its merged calls runs within it
    o = ops.with_columns(pl.max_horizontal("start_ns", "end_ns").alias("end_ns")).sort([*_KEY, "start_ns"],
                                                                                        maintain_order=True)
    rank = o.get_column("rank").to_numpy().astype(np.int64)
    start, end = o.get_column("start_ns").to_numpy(), o.get_column("end_ns").to_numpy()
    cls = o.get_column("cls").to_numpy()
    new_op = np.ones(o.height, dtype=bool)
    new_op[1:] = np.logical_or.reduce([o.get_column(c).to_numpy()[1:] != o.get_column(c).to_numpy()[:-1]
                                       for c in _KEY])
    op_first = np.flatnonzero(new_op)
    # the union of each op's calls: runs of overlapping calls merged (class of the run's first call)
    reach = prev_max_end(np.cumsum(new_op), start, end)
    run_first = np.flatnonzero(new_op | (start > reach))
    run_end = np.maximum.reduceat(end, run_first) if run_first.size else end[:0]
    run_of_op = np.searchsorted(run_first, op_first)  # an op's first row starts its first run

    def per_op(first: np.ndarray, s: np.ndarray, e: np.ndarray, starts: np.ndarray, count: bool) -> np.ndarray:
        """Per op and class (+ the windows): calls with time in it (count) or their summed time."""
        t = _class_times(segs, rank[first], s, e)
        t[:, :k][~_eligible(cls[first])] = 0  # in place: a job's ops are a million rows of five columns
        if starts.size == 0:
            return np.zeros((0, k + 1), dtype=np.int64)
        return np.add.reduceat(t > 0, starts, axis=0, dtype=np.int64) if count else np.add.reduceat(t, starts, axis=0)

    def long(values: np.ndarray, name: str) -> pl.DataFrame:
        idx, cidx = np.nonzero(values > 0)
        rows = op_first[idx]
        return pl.DataFrame({"rank": rank[rows].astype(np.int32), "kind": o.get_column("kind").gather(rows),
                             "name": o.get_column("name").gather(rows),
                             "_c": np.where(cidx == k, -1, cidx).astype(np.int64), name: values[idx, cidx]})

    calls = long(per_op(np.arange(o.height), start, end, op_first, True), "calls")
    time = long(per_op(run_first, start[run_first], run_end, run_of_op, False), "time_ns")

    def named(frame: pl.DataFrame) -> pl.DataFrame:
        k_idx, n_idx = frame.get_column("kind").to_numpy(), frame.get_column("name").to_numpy()
        kind_s = pl.Series("kind", kinds.take(pa.array(np.maximum(k_idx, 0))), dtype=pl.String)
        name_s = pl.Series("name", names.take(pa.array(np.maximum(n_idx, 0))), dtype=pl.String)
        return frame.with_columns(pl.when(pl.Series(k_idx >= 0)).then(kind_s).alias("kind"),
                                  pl.when(pl.Series(n_idx >= 0)).then(name_s).alias("name"))

    return OpTimes(named(calls), named(time), totals)


def _windows(iterations: pa.Table) -> pl.DataFrame:
    w = pl.from_arrow(iterations.select(["rank"]))
    assert isinstance(w, pl.DataFrame)
    return w.group_by("rank").len().rename({"len": "_windows"}).with_columns(pl.col("rank").cast(pl.Int32))


def table(events: pa.Table, iterations: pa.Table, act: pl.DataFrame | None = None,
          times: OpTimes | None = None) -> pa.Table:
    """The ``top_ops`` table (:data:`schema.TOP_OPS`): per rank, class and op (kind, name), the calls and time,
    largest first within each class. ``act``: :func:`tracekit.analysis.attribution.activity` of ``events``, when
    the caller has it already; ``times``: :func:`op_times` of them, likewise."""
    if iterations.num_rows == 0 or events.num_rows == 0:
        return schema.empty(schema.TOP_OPS)
    calls, time, totals = times if times is not None else op_times(events, iterations, act)
    k = len(CLASSES)
    tot = pl.DataFrame({"rank": np.repeat(np.array(list(totals), dtype=np.int32), k),
                        "_c": np.tile(np.arange(k, dtype=np.int64), len(totals)),
                        "_class_ns": np.concatenate(list(totals.values())) if totals else np.zeros(0, np.int64)})
    out = (time.lazy().filter(pl.col("_c") >= 0).join(calls.lazy(), on=[*_KEY, "_c"], how="left")
           .join(_windows(iterations).lazy(), on="rank", how="left").join(tot.lazy(), on=["rank", "_c"], how="left")
           .with_columns((pl.col("time_ns") / pl.col("_windows")).round().cast(pl.Int64).alias("per_iteration_ns"),
                         (pl.col("time_ns") / pl.col("_class_ns")).alias("class_share"),
                         pl.col("_c").replace_strict(dict(enumerate(CLASSES)), return_dtype=pl.String).alias("class"))
           .sort(["rank", "_c", "time_ns", "name"], descending=[False, False, True, False])
           .with_columns(pl.int_range(1, pl.len() + 1, dtype=pl.Int64).over(["rank", "_c"]).alias("rank_in_class"))
           .select(schema.TOP_OPS.names).collect(engine="in-memory"))
    return schema.conform(out.to_arrow(), schema.TOP_OPS)


#: columns of :func:`totals`
TOTALS_SCHEMA = pa.schema([("rank", pa.int32()), ("kind", pa.string()), ("name", pa.string()), ("calls", pa.int64()),
                           ("time_ns", pa.int64()), ("per_iteration_ns", pa.int64())])


def totals(events: pa.Table, iterations: pa.Table, act: pl.DataFrame | None = None,
           times: OpTimes | None = None) -> pa.Table:
    """Per rank and op (kind, name; the ops :func:`table` lists): ``calls`` (with time inside the iteration
    windows), ``time_ns`` (the time at least one of them ran inside the windows, whatever the class) and
    ``per_iteration_ns``. ``act`` and ``times``: as for :func:`table`."""
    if iterations.num_rows == 0 or events.num_rows == 0:
        return TOTALS_SCHEMA.empty_table()
    calls, time, _ = times if times is not None else op_times(events, iterations, act)
    out = (time.lazy().filter(pl.col("_c") == -1)
           .join(calls.lazy().filter(pl.col("_c") == -1), on=[*_KEY, "_c"], how="left")
           .join(_windows(iterations).lazy(), on="rank", how="left")
           .with_columns((pl.col("time_ns") / pl.col("_windows")).round().cast(pl.Int64).alias("per_iteration_ns"))
           .sort(["rank", "time_ns", "name"], descending=[False, True, False])
           .select(TOTALS_SCHEMA.names).collect(engine="in-memory"))
    return out.to_arrow().cast(TOTALS_SCHEMA)


def job_level(top_ops: pa.Table | pl.DataFrame, breakdown: pa.Table | pl.DataFrame, n: int | None = 10
              ) -> pl.DataFrame:
    """The job's top ops per class over every rank: ``class, kind, name, calls, time_ns, per_iteration_ns`` (per
    rank-iteration window), ``class_share`` (of the class's time over all ranks, from ``breakdown``) and
    ``rank_in_class``; the first ``n`` per class (all with ``n=None``)."""
    t = pl.from_arrow(top_ops) if isinstance(top_ops, pa.Table) else top_ops
    b = pl.from_arrow(breakdown) if isinstance(breakdown, pa.Table) else breakdown
    assert isinstance(t, pl.DataFrame) and isinstance(b, pl.DataFrame)
    cols = {"class": pl.String, "kind": pl.String, "name": pl.String, "calls": pl.Int64, "time_ns": pl.Int64,
            "per_iteration_ns": pl.Int64, "class_share": pl.Float64, "rank_in_class": pl.Int64}
    if t.height == 0 or b.height == 0:
        return pl.DataFrame(schema=cols)
    windows = b.height
    class_ns = {c: int(b.get_column(f"{c}_ns").sum()) for c in CLASSES}
    order = {c: i for i, c in enumerate(CLASSES)}
    out = (t.group_by(["class", "kind", "name"]).agg(pl.col("calls").sum(), pl.col("time_ns").sum())
           .with_columns((pl.col("time_ns") / windows).round().cast(pl.Int64).alias("per_iteration_ns"),
                         (pl.col("time_ns") / pl.col("class").replace_strict(class_ns, return_dtype=pl.Float64))
                         .alias("class_share"),
                         pl.col("class").replace_strict(order, return_dtype=pl.Int64).alias("_o"))
           .sort(["_o", "time_ns", "name"], descending=[False, True, False])
           .with_columns(pl.int_range(1, pl.len() + 1, dtype=pl.Int64).over("class").alias("rank_in_class")))
    if n is not None:
        out = out.filter(pl.col("rank_in_class") <= n)
    return out.select(list(cols))
