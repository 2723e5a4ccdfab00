"""Roll-ups of the breakdown: per rank, per iteration across ranks, and for the whole job."""

from __future__ import annotations

from typing import Any

import polars as pl
import pyarrow as pa

from tracekit.schema import CLASSES

_NS = [f"{c}_ns" for c in CLASSES]


def per_rank(breakdown: pa.Table) -> pl.DataFrame:
    """One row per rank: iterations, time per class and its share of the rank's wall time."""
    b = pl.from_arrow(breakdown)
    assert isinstance(b, pl.DataFrame)
    if b.height == 0:
        return pl.DataFrame()
    agg = b.group_by("rank").agg(
        pl.len().alias("iterations"),
        pl.col("wall_ns").sum(),
        *[pl.col(c).sum() for c in _NS],
        pl.col("wait_ns").sum(), pl.col("transfer_ns").sum(),
        pl.col("wait_ns").is_null().all().alias("_no_split"),
        pl.col("comm_ns").sum(), pl.col("comm_bytes").sum(),
        pl.col("comm_bytes").is_not_null().sum().alias("_bytes_known"),
        pl.col("wall_ns").median().cast(pl.Int64).alias("median_iteration_ns"),
    ).sort("rank")
    agg = agg.with_columns(
        *[(pl.col(f"{c}_ns") / pl.col("wall_ns")).alias(f"{c}_share") for c in CLASSES],
        pl.when(pl.col("_no_split")).then(None).otherwise(pl.col("wait_ns")).alias("wait_ns"),
        pl.when(pl.col("_no_split")).then(None).otherwise(pl.col("transfer_ns")).alias("transfer_ns"),
        pl.when(pl.col("_bytes_known") > 0).then(pl.col("comm_bytes") / pl.col("_bytes_known"))
        .cast(pl.Int64).alias("comm_bytes_per_iteration"),
    ).drop("_no_split", "_bytes_known")
    return agg


def per_iteration(breakdown: pa.Table) -> pl.DataFrame:
    """One row per iteration: its time is the slowest rank's window (everyone waits for it)."""
    b = pl.from_arrow(breakdown)
    assert isinstance(b, pl.DataFrame)
    if b.height == 0:
        return pl.DataFrame()
    return b.group_by("iteration").agg(
        pl.col("wall_ns").max().alias("iteration_ns"),
        pl.col("rank").sort_by("wall_ns").last().alias("slowest_rank"),
        pl.col("exposed_comm_ns").mean().cast(pl.Int64).alias("mean_exposed_comm_ns"),
        pl.len().alias("ranks"),
    ).sort("iteration")


def job(breakdown: pa.Table) -> dict[str, Any]:
    """Whole-job figures: shares of time per class, iteration times, worst iteration, most exposed rank."""
    b = pl.from_arrow(breakdown)
    assert isinstance(b, pl.DataFrame)
    if b.height == 0:
        return {"ranks": 0, "iterations": 0}
    wall = int(b.get_column("wall_ns").sum())
    out: dict[str, Any] = {
        "ranks": b.get_column("rank").n_unique(),
        "iterations": b.get_column("iteration").n_unique(),
        "wall_ns": wall,
    }
    for c in CLASSES:
        total = int(b.get_column(f"{c}_ns").sum())
        out[f"{c}_ns"] = total
        out[f"{c}_share"] = total / wall if wall else 0.0
    if b.get_column("wait_ns").null_count() < b.height:
        out["wait_ns"] = int(b.get_column("wait_ns").sum())
        out["transfer_ns"] = int(b.get_column("transfer_ns").sum())
    it = per_iteration(breakdown)
    out["median_iteration_ns"] = int(it.get_column("iteration_ns").median())  # type: ignore[arg-type]
    worst = it.sort("iteration_ns", descending=True).row(0, named=True)
    out["worst_iteration"] = {"iteration": worst["iteration"], "iteration_ns": worst["iteration_ns"],
                              "slowest_rank": worst["slowest_rank"]}
    pr = per_rank(breakdown)
    exposed = pr.sort("exposed_comm_share", descending=True).row(0, named=True)
    out["most_exposed_rank"] = {"rank": exposed["rank"], "exposed_comm_share": exposed["exposed_comm_share"],
                                "exposed_comm_ns": exposed["exposed_comm_ns"]}
    known = b.get_column("comm_bytes").drop_nulls()
    out["comm_bytes_per_iteration"] = int(known.mean()) if known.len() else None  # type: ignore[arg-type]
    return out

