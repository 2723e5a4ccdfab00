"""Iterations (DESIGN.md "Iterations"): which iteration each event belongs to, and each iteration's
window on each rank.

Steps come from ``ProfilerStep#N`` annotations (or a user regex). CPU activity belongs to the step
that encloses it in time; device activity belongs to the step that encloses the CPU call that
launched it (correlation id, then External id), because GPU work spills past the step's end. A
window runs from the first *activity* of its iteration to the first activity of the next one (the
last to its last end), where activity means device kernels/copies on ranks that have them and CPU
work on CPU-only ranks — the lanes attribution looks at.
"""

from __future__ import annotations

import re

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.analysis.intervals import PACK_SHIFT, first_match, packs, runs
from tracekit.model import schema
from tracekit.model.diagnostics import TraceError

DEFAULT_STEP = r"ProfilerStep\s*#\s*(\d+)"
ACTIVITY_KINDS = ("compute", "comm", "memory")


def _dict_flags(col: pa.ChunkedArray | pa.Array, predicate) -> np.ndarray:
    """Evaluate ``predicate`` once per dictionary value and map it to every row (nulls are False)."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_encode()
    flags = np.array([bool(predicate(v)) for v in arr.dictionary.to_pylist()] + [False], dtype=bool)
    idx = pc.fill_null(arr.indices, len(flags) - 1).to_numpy(zero_copy_only=False)
    return flags[idx]


def _frame(events: pa.Table) -> pl.DataFrame:
    """The columns iteration finding needs, with string tests done once per dictionary value."""
    kind = events.column("kind")
    is_cpu = _dict_flags(events.column("lane"), lambda v: v is not None and v.startswith("cpu"))
    df = pl.from_arrow(events.select(["rank", "start_ns", "dur_ns", "correlation", "external_id"]))
    assert isinstance(df, pl.DataFrame)
    return df.with_columns(
        pl.int_range(pl.len(), dtype=pl.Int64).alias("row"),
        pl.Series("is_cpu", is_cpu),
        pl.Series("on_device", pc.is_valid(events.column("device")).to_numpy(zero_copy_only=False)),
        pl.Series("is_runtime", _dict_flags(kind, lambda v: v == "runtime")),
        pl.Series("is_cpu_op", _dict_flags(kind, lambda v: v == "cpu_op")),
        pl.Series("is_activity", _dict_flags(kind, lambda v: v in ACTIVITY_KINDS)),
        pl.Series("is_step_kind", _dict_flags(kind, lambda v: v in ("annotation", "cpu_op")) & is_cpu),
    )


def step_annotations(events: pa.Table, df: pl.DataFrame, step_marker: str | None) -> pl.DataFrame:
    """Step intervals per rank: ``rank, iteration, s_start, s_end`` from annotations on CPU lanes."""
    pattern = step_marker or DEFAULT_STEP
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise TraceError(None, f"step_marker={pattern!r} is not a valid regular expression: {exc}") from exc
    matches = _dict_flags(events.column("name"), lambda v: v is not None and regex.search(v) is not None)
    rows = np.flatnonzero(matches & df.get_column("is_step_kind").to_numpy())
    empty = pl.DataFrame(schema={"rank": pl.Int32, "iteration": pl.Int64, "s_start": pl.Int64, "s_end": pl.Int64})
    if rows.size == 0:
        return empty
    names = events.column("name").take(pa.array(rows)).cast(pa.string()).to_pylist()
    numbers = []
    for nm in names:
        m = regex.search(nm)
        g = m.group(1) if m and m.groups() else None
        # a number beyond int64 is no step number: such steps are numbered by order like unnumbered ones
        numbers.append(int(g) if g is not None and g.isdigit() and len(g) < 19 else None)
    cand = df[rows].with_columns(pl.Series("number", numbers, dtype=pl.Int64)).sort(["rank", "start_ns"],
                                                                                     maintain_order=True)
    # without a numeric group, number the matches in order per rank
    cand = cand.with_columns(pl.coalesce("number", pl.int_range(pl.len()).over("rank").cast(pl.Int64))
                             .alias("iteration"))
    # a step name may repeat (e.g. nested markers): keep the outermost, first occurrence
    cand = cand.unique(["rank", "iteration"], keep="first", maintain_order=True)
    return cand.select(["rank", "iteration", pl.col("start_ns").alias("s_start"),
                        (pl.col("start_ns") + pl.col("dur_ns")).alias("s_end")]).sort(["rank", "s_start"])


def assign(events: pa.Table, step_marker: str | None = None, *, require_steps: bool = True
           ) -> tuple[pa.Table, pa.Table]:
    """Return ``(events with the iteration column filled, iterations table)``.

    A ``step_marker`` that matches nothing is an error, unless ``require_steps`` is False (one rank of
    many: the caller decides once it has seen them all)."""
    if events.num_rows == 0:
        return events, schema.empty(schema.ITERATIONS)
    df = _frame(events)
    steps = step_annotations(events, df, step_marker)
    method = "step-marker" if step_marker else "ProfilerStep"
    if step_marker and steps.height == 0 and require_steps:
        raise TraceError(None, f"step_marker={step_marker!r} matches no annotation in the traces")
    it, ok = step_of(df.get_column("rank").to_numpy(), df.get_column("start_ns").to_numpy(), steps)
    if steps.height:
        # device activity: through the launching CPU call (External id first, then the CUPTI
        # correlation, which is 1:1 and overrides it); only the few rows involved are touched
        by_time_it, by_time_ok = it.copy(), ok.copy()
        col = df.get_column
        is_cpu = col("is_cpu").to_numpy()
        on_device = col("on_device").to_numpy()
        for key, source in (("external_id", is_cpu & col("is_cpu_op").to_numpy()),
                            ("correlation", is_cpu & col("is_runtime").to_numpy())):
            rows, found = _through(df, key, source & by_time_ok, on_device, by_time_it)
            it[rows] = found
            ok[rows] = True
    iteration = pa.array(it, pa.int64(), mask=~ok)
    events = events.set_column(events.schema.get_field_index("iteration"), schema.EVENTS.field("iteration"),
                               iteration)
    windows = _windows(df.with_columns(pl.Series("iteration", iteration)), steps, method)
    return events, windows


def _fits_key(rank: np.ndarray, values: np.ndarray, used: np.ndarray) -> bool:
    """Whether the ``used`` rows' rank and key fit the packed key (:func:`~tracekit.analysis.intervals.packs`):
    checked on every row first (plain reductions), on the used rows only where that fails (masked reductions are
    several times slower)."""
    def fits(where: np.ndarray | None) -> bool:
        big = np.iinfo(np.int64).max
        kw = {} if where is None else {"where": where}
        return packs(rank.min(initial=big, **kw), rank.max(initial=-1, **kw), values.min(initial=big, **kw),
                     values.max(initial=-1, **kw))

    return fits(None) or fits(used)


def _through(df: pl.DataFrame, key: str, source: np.ndarray, target: np.ndarray, it: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray]:
    """The ``target`` rows whose ``key`` (on their rank) a ``source`` row has, and the iteration ``it`` of the
    first such source row in file order: on one packed int64 key (rank and key) with numpy when ranks and
    keys fit it, else with a polars join."""
    k = df.get_column(key)
    valid = k.is_not_null().to_numpy()
    src = np.flatnonzero(source & valid)
    dst = np.flatnonzero(target & valid)
    if src.size == 0 or dst.size == 0:
        return dst[:0], it[:0]
    rank = df.get_column("rank").to_numpy().astype(np.int64)
    values = k.fill_null(0).to_numpy()
    if _fits_key(rank, values, (source | target) & valid):
        packed = rank * (1 << PACK_SHIFT) + values
        hit, first = first_match(packed[src], packed[dst])
        return dst[hit], it[src[first[hit]]]
    sources = pl.DataFrame({"rank": rank[src], key: values[src], "it": it[src]}).unique(
        ["rank", key], keep="first", maintain_order=True)
    hits = pl.DataFrame({"row": dst, "rank": rank[dst], key: values[dst]}).join(sources, on=["rank", key],
                                                                                   how="inner")
    return hits.get_column("row").to_numpy(), hits.get_column("it").to_numpy()


def step_of(rank: np.ndarray, start: np.ndarray, steps: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Iteration of each event by time: the step on its rank whose interval contains its start.

    Returns ``(iteration int64, found bool)``. Exact for any int64 times (a search per rank that has
    steps, no combined keys); among steps starting at the same instant the highest number wins. An
    elementwise function of each event, so it gives the same answer batch by batch as on a whole table.
    """
    n = len(start)
    out = np.zeros(n, dtype=np.int64)
    found = np.zeros(n, dtype=bool)
    if steps.height == 0 or n == 0:
        return out, found
    s_rank = steps.get_column("rank").to_numpy().astype(np.int64)
    s_start = steps.get_column("s_start").to_numpy()
    s_end = steps.get_column("s_end").to_numpy()
    s_it = steps.get_column("iteration").to_numpy()
    so = np.lexsort((s_it, s_start, s_rank))
    s_rank, s_start, s_end, s_it = s_rank[so], s_start[so], s_end[so], s_it[so]
    rank = np.asarray(rank).astype(np.int64)
    ranks = np.unique(s_rank)
    segments: list[tuple[int, np.ndarray | slice]]
    by_run = runs(rank)
    if by_run is not None:  # a job's events come rank by rank: each rank is a slice
        at = {v: i for i, v in enumerate(by_run[0].tolist())}
        b = by_run[1].tolist()
        segments = [(r, slice(b[at[r]], b[at[r] + 1]) if r in at else slice(0, 0)) for r in ranks.tolist()]
    elif ranks.size == 1:
        segments = [(int(ranks[0]), np.flatnonzero(rank == ranks[0]))]
    else:
        eo = np.argsort(rank, kind="stable")
        r_sorted = rank[eo]
        segments = [(int(r), eo[np.searchsorted(r_sorted, r, "left") : np.searchsorted(r_sorted, r, "right")])
                    for r in ranks]
    for r, idx in segments:
        if (idx.stop <= idx.start) if isinstance(idx, slice) else not idx.size:
            continue
        lo, hi = np.searchsorted(s_rank, r, "left"), np.searchsorted(s_rank, r, "right")
        t = start[idx]
        pos = np.searchsorted(s_start[lo:hi], t, side="right") - 1
        j = lo + np.maximum(pos, 0)
        inside = (pos >= 0) & (t < s_end[j])
        out[idx] = np.where(inside, s_it[j], 0)
        found[idx] = inside
    return out, found


def activity_mask(df: pl.DataFrame, gpu_ranks: pl.Series) -> pl.Expr:
    """Rows that open and close iteration windows: device activity on ranks that have it, CPU work
    (activity or operators) on CPU-only ranks — the lanes attribution looks at."""
    is_gpu = pl.col("rank").is_in(gpu_ranks.implode())
    return ((is_gpu & pl.col("on_device") & pl.col("is_activity"))
            | (~is_gpu & (pl.col("is_activity") | pl.col("is_cpu_op"))))


def aggregate(activity: pl.DataFrame) -> pl.DataFrame:
    """Per (rank, iteration): first start and last end of the activity (partial aggregates of batches
    combine by min/max)."""
    return activity.filter(pl.col("iteration").is_not_null()).group_by(["rank", "iteration"]).agg(
        pl.col("start_ns").min().alias("first"), (pl.col("start_ns") + pl.col("dur_ns")).max().alias("last"))


def aggregate_whole(activity: pl.DataFrame) -> pl.DataFrame:
    """Per rank: first start and last end of the activity (for the whole-trace window)."""
    return activity.group_by("rank").agg(pl.col("start_ns").min().alias("start_ns"),
                                         (pl.col("start_ns") + pl.col("dur_ns")).max().alias("end_ns"))


def whole_trace_windows(whole: pl.DataFrame) -> pa.Table:
    """One window per rank over all its activity, when there are no steps."""
    whole = whole.sort("rank")
    return schema.table(schema.ITERATIONS, {
        "rank": whole.get_column("rank").to_arrow(), "iteration": [0] * whole.height,
        "start_ns": whole.get_column("start_ns").to_arrow(), "end_ns": whole.get_column("end_ns").to_arrow(),
        "method": ["whole-trace"] * whole.height})


def windows_from(act: pl.DataFrame, steps: pl.DataFrame, gpu_ranks: pl.Series, method: str) -> pa.Table:
    """Iteration windows from the per-(rank, iteration) activity aggregates."""
    # CPU-only ranks: the step annotation itself opens the iteration
    cpu_steps = steps.filter(~pl.col("rank").is_in(gpu_ranks.implode())).select(
        ["rank", "iteration", pl.col("s_start").alias("first_s")])
    act = act.join(cpu_steps, on=["rank", "iteration"], how="left").with_columns(
        pl.min_horizontal("first", "first_s").alias("first")).drop("first_s")
    act = act.sort(["rank", "iteration"]).with_columns(
        pl.col("first").cum_max().over("rank").alias("first"))
    act = act.with_columns(
        pl.col("first").shift(-1).over("rank").alias("next"))
    act = act.with_columns(pl.coalesce("next", pl.max_horizontal("last", "first")).alias("end"))
    act = act.filter(pl.col("end") > pl.col("first"))
    return schema.table(schema.ITERATIONS, {
        "rank": act.get_column("rank").to_arrow(), "iteration": act.get_column("iteration").to_arrow(),
        "start_ns": act.get_column("first").to_arrow(), "end_ns": act.get_column("end").to_arrow(),
        "method": [method] * act.height})


def _windows(df: pl.DataFrame, steps: pl.DataFrame, method: str) -> pa.Table:
    """Iteration windows per rank from the activity that belongs to each iteration."""
    gpu_ranks = df.filter(pl.col("on_device") & pl.col("is_activity")).get_column("rank").unique()
    activity = df.filter(activity_mask(df, gpu_ranks))
    if steps.height == 0:
        return whole_trace_windows(aggregate_whole(activity))
    return windows_from(aggregate(activity), steps, gpu_ranks, method)


def parse_selection(text: str) -> frozenset[int]:
    """``"3-8"``, ``"3,5,7-9"`` → the iteration numbers they name (ranges inclusive); one-line TraceError
    otherwise."""
    out: set[int] = set()
    for part in str(text).split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d{1,18})(?:\s*-\s*(\d{1,18}))?", part)
        if not m:
            raise TraceError(None, f"iterations={text!r}: expected iteration numbers and ranges, e.g. 3-8 or "
                                   "2,4,6-9")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise TraceError(None, f"iterations={text!r}: the range {part} is empty")
        if hi - lo > 10_000_000:
            raise TraceError(None, f"iterations={text!r}: the range {part} is too long")
        out.update(range(lo, hi + 1))
    return frozenset(out)


def select(events: pa.Table, iters: pa.Table, collectives: pa.Table, only: frozenset[int]
           ) -> tuple[pa.Table, pa.Table, pa.Table]:
    """The job restricted to the iterations ``only`` (``--iterations``), once iterations are assigned: their
    events (an event of no iteration goes too), their windows, and the collective calls their events made (a
    call no event refers to stays when it has no time, else when it started within its rank's selected windows).
    Every later analysis — attribution, matching, the dependency graph and its replays — then sees only them."""
    want = pa.array(sorted(only), pa.int64())
    keep = pc.fill_null(pc.is_in(events.column("iteration"), value_set=want), False)
    dropped = events.filter(pc.invert(keep))
    events = events.filter(keep)
    iters = iters.filter(pc.is_in(iters.column("iteration"), value_set=want))
    if iters.num_rows == 0:
        have = pc.unique(dropped.column("iteration").drop_null()).to_pylist()
        span = f"{min(have)}..{max(have)}" if have else "none"
        raise TraceError(None, f"iterations= matches no iteration of the job (its iterations: {span})")
    if collectives.num_rows == 0:
        return events, iters, collectives
    ref = pl.from_arrow(events.select(["rank", "collective_id"]))
    gone = pl.from_arrow(dropped.select(["rank", "collective_id"]))
    assert isinstance(ref, pl.DataFrame) and isinstance(gone, pl.DataFrame)
    ref, gone = (f.filter(pl.col("collective_id").is_not_null()).unique() for f in (ref, gone))
    win = pl.from_arrow(iters.select(["rank", "start_ns", "end_ns"]))
    assert isinstance(win, pl.DataFrame)
    win = win.group_by("rank").agg(pl.col("start_ns").min().alias("_lo"), pl.col("end_ns").max().alias("_hi"))
    c = pl.from_arrow(collectives.select(["rank", "collective_id", "start_ns"]))
    assert isinstance(c, pl.DataFrame)
    c = c.with_row_index("_row").join(ref.with_columns(pl.lit(True).alias("_kept")), on=["rank", "collective_id"],
                                      how="left") \
        .join(gone.with_columns(pl.lit(True).alias("_gone")), on=["rank", "collective_id"], how="left") \
        .join(win, on="rank", how="left")
    start = pl.col("start_ns")
    inside = start.is_null() | ((start >= pl.col("_lo")) & (start < pl.col("_hi")))
    c = c.with_columns(pl.when(pl.col("_kept")).then(True).when(pl.col("_gone")).then(False)
                       .otherwise(inside.fill_null(False)).alias("_keep")).sort("_row")
    return events, iters, collectives.filter(pa.array(c.get_column("_keep").to_numpy()))


def period(iteration: np.ndarray, start: np.ndarray, end: np.ndarray) -> int:
    """The job's iteration time from rows of ``iteration, start, end`` (job clock): the median time between
    consecutive iteration starts (an iteration starts at its earliest row on any rank); one iteration alone: its span.
    The one figure every view gives as the measured iteration, and what the replays predict."""
    if start.size == 0:
        return 0
    per = pl.DataFrame({"it": iteration, "s": start, "e": end}).group_by("it").agg(
        pl.col("s").min(), pl.col("e").max()).sort("it")
    s = per.get_column("s").to_numpy()
    gaps = np.diff(s)
    gaps = gaps[gaps > 0]  # ranks from unrelated runs can put iteration k+1 no later than k: not a period
    if gaps.size == 0:
        return int(np.median(per.get_column("e").to_numpy() - s))
    return int(np.median(gaps))


def measured_iteration_ns(windows: pa.Table, ranks: pa.Table | None = None) -> int | None:
    """The measured iteration time (:func:`period`) of the iteration windows ``windows`` (``rank, iteration,
    start_ns, end_ns``: the iterations or breakdown table), each rank's on the job clock (``ranks``'
    ``clock_offset_ns``); None without a window."""
    if windows.num_rows == 0:
        return None
    w = pl.from_arrow(windows.select(["rank", "iteration", "start_ns", "end_ns"]))
    assert isinstance(w, pl.DataFrame)
    if ranks is not None and ranks.num_rows and "clock_offset_ns" in ranks.column_names:
        off = pl.from_arrow(ranks.select(["rank", "clock_offset_ns"]))
        assert isinstance(off, pl.DataFrame)
        w = w.join(off.with_columns(pl.col("rank").cast(w.schema["rank"])).unique("rank"), on="rank", how="left")
        shift = pl.col("clock_offset_ns").fill_null(0)
    else:
        shift = pl.lit(0)
    w = w.with_columns(pl.col("start_ns") + shift, pl.col("end_ns") + shift).drop_nulls(["iteration", "start_ns"])
    return period(w.get_column("iteration").to_numpy(), w.get_column("start_ns").to_numpy(),
                  w.get_column("end_ns").to_numpy())
