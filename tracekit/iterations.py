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

import polars as pl
import pyarrow as pa

from tracekit import schema
from tracekit.diagnostics import TraceError

DEFAULT_STEP = r"ProfilerStep\s*#\s*(\d+)"
ACTIVITY_KINDS = ("compute", "comm", "memory")


def _frame(events: pa.Table) -> pl.DataFrame:
    df = pl.from_arrow(events.select(["rank", "lane", "kind", "name", "start_ns", "dur_ns", "device",
                                      "correlation", "external_id"]))
    assert isinstance(df, pl.DataFrame)
    return df.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias("row"),
                           pl.col("lane").cast(pl.String), pl.col("kind").cast(pl.String),
                           pl.col("name").cast(pl.String))


def step_annotations(df: pl.DataFrame, step_marker: str | None) -> pl.DataFrame:
    """Step intervals per rank: ``rank, iteration, s_start, s_end`` from annotations on CPU lanes."""
    pattern = step_marker or DEFAULT_STEP
    try:
        re.compile(pattern)
    except re.error as exc:
        raise TraceError(None, f"--step-marker {pattern!r} is not a valid regular expression: {exc}") from exc
    cand = df.filter(pl.col("lane").str.starts_with("cpu") & pl.col("kind").is_in(["annotation", "cpu_op"])
                     & pl.col("name").str.contains(pattern))
    if cand.height == 0:
        return pl.DataFrame(schema={"rank": pl.Int32, "iteration": pl.Int64, "s_start": pl.Int64,
                                    "s_end": pl.Int64})
    number = cand.get_column("name").str.extract(pattern, 1).cast(pl.Int64, strict=False)
    cand = cand.with_columns(number.alias("number")).sort(["rank", "start_ns"])
    # without a numeric group, number the matches in order per rank
    cand = cand.with_columns(pl.coalesce("number", pl.int_range(pl.len()).over("rank").cast(pl.Int64))
                             .alias("iteration"))
    # a step name may repeat (e.g. nested markers): keep the outermost, first occurrence
    cand = cand.unique(["rank", "iteration"], keep="first", maintain_order=True)
    return cand.select(["rank", "iteration", pl.col("start_ns").alias("s_start"),
                        (pl.col("start_ns") + pl.col("dur_ns")).alias("s_end")]).sort(["rank", "s_start"])


def assign(events: pa.Table, step_marker: str | None = None) -> tuple[pa.Table, pa.Table]:
    """Return ``(events with the iteration column filled, iterations table)``."""
    if events.num_rows == 0:
        return events, schema.empty(schema.ITERATIONS)
    df = _frame(events)
    steps = step_annotations(df, step_marker)
    method = "step-marker" if step_marker else "ProfilerStep"
    if step_marker and steps.height == 0:
        raise TraceError(None, f"--step-marker {step_marker!r} matches no annotation in the traces")
    iteration = _by_time(df, steps)
    if steps.height:
        # device activity: through the launching CPU call
        dev = df.filter(pl.col("device").is_not_null() & pl.col("correlation").is_not_null())
        launch = (df.with_columns(iteration.alias("it"))
                  .filter(pl.col("lane").str.starts_with("cpu") & pl.col("correlation").is_not_null()
                          & (pl.col("kind") == "runtime"))
                  .select(["rank", "correlation", "it"]).unique(["rank", "correlation"], keep="first"))
        via_corr = dev.select(["row", "rank", "correlation"]).join(launch, on=["rank", "correlation"],
                                                                     how="inner")
        ops = (df.with_columns(iteration.alias("it"))
               .filter(pl.col("lane").str.starts_with("cpu") & pl.col("external_id").is_not_null()
                       & (pl.col("kind") == "cpu_op"))
               .select(["rank", "external_id", "it"]).unique(["rank", "external_id"], keep="first"))
        dev_ext = df.filter(pl.col("device").is_not_null() & pl.col("external_id").is_not_null())
        via_ext = dev_ext.select(["row", "rank", "external_id"]).join(ops, on=["rank", "external_id"],
                                                                      how="inner")
        # correlation (CUPTI, 1:1) first, then External id, then time
        override = pl.concat([via_corr.select(["row", "it"]), via_ext.select(["row", "it"])]) \
            .filter(pl.col("it").is_not_null()).unique("row", keep="first", maintain_order=True)
        iteration = (df.select("row").with_columns(iteration.alias("by_time"))
                     .join(override, on="row", how="left")
                     .sort("row")
                     .select(pl.coalesce("it", "by_time").alias("iteration"))
                     .get_column("iteration"))
    events = events.set_column(events.schema.get_field_index("iteration"), schema.EVENTS.field("iteration"),
                               iteration.to_arrow().cast(pa.int64()))
    windows = _windows(df.with_columns(iteration.alias("iteration")), steps, method)
    return events, windows


def _by_time(df: pl.DataFrame, steps: pl.DataFrame) -> pl.Series:
    """Iteration of each event by time: the step (on its rank) whose interval contains its start."""
    if steps.height == 0:
        return pl.Series("iteration", [None] * df.height, dtype=pl.Int64)
    j = (df.select(["row", "rank", "start_ns"]).sort("start_ns")
         .join_asof(steps.sort("s_start"), left_on="start_ns", right_on="s_start", by="rank",
                    strategy="backward", check_sortedness=False)
         .with_columns(pl.when(pl.col("start_ns") < pl.col("s_end")).then(pl.col("iteration"))
                       .alias("iteration"))
         .sort("row"))
    return j.get_column("iteration").cast(pl.Int64)


def _windows(df: pl.DataFrame, steps: pl.DataFrame, method: str) -> pa.Table:
    """Iteration windows per rank from the activity that belongs to each iteration."""
    gpu_ranks = df.filter(pl.col("device").is_not_null() & pl.col("kind").is_in(ACTIVITY_KINDS)) \
        .get_column("rank").unique()
    is_gpu = pl.col("rank").is_in(gpu_ranks.implode())
    activity = df.filter(
        (is_gpu & pl.col("device").is_not_null() & pl.col("kind").is_in(ACTIVITY_KINDS))
        | (~is_gpu & pl.col("kind").is_in([*ACTIVITY_KINDS, "cpu_op"])))
    if steps.height == 0:
        whole = activity.group_by("rank").agg(pl.col("start_ns").min().alias("start_ns"),
                                              (pl.col("start_ns") + pl.col("dur_ns")).max().alias("end_ns"))
        return schema.table(schema.ITERATIONS, {
            "rank": whole.get_column("rank").to_arrow(), "iteration": [0] * whole.height,
            "start_ns": whole.get_column("start_ns").to_arrow(), "end_ns": whole.get_column("end_ns").to_arrow(),
            "method": ["whole-trace"] * whole.height}).sort_by([("rank", "ascending")])
    act = activity.filter(pl.col("iteration").is_not_null()).group_by(["rank", "iteration"]).agg(
        pl.col("start_ns").min().alias("first"), (pl.col("start_ns") + pl.col("dur_ns")).max().alias("last"))
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
