"""Roll-ups of the breakdown and of the matched collectives: per rank, per iteration across ranks, for the
whole job, stragglers, and collectives by op.

Link figures roll up as sums, never as means of ratios: a rank's ``busbw_gbps`` is its total bus bytes over
its total link-active time, its ``link_utilisation`` its total ideal time over its total wall time.
"""

from __future__ import annotations

from typing import Any

import polars as pl
import pyarrow as pa

from tracekit.analysis.collectives import stragglers, transfer_sizes  # noqa: F401 (the views read them from here)
from tracekit.analysis.iterations import measured_iteration_ns
from tracekit.model.schema import CLASSES

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
        *_link_aggs(),
    ).sort("rank")
    agg = agg.with_columns(
        *[(pl.col(f"{c}_ns") / pl.col("wall_ns")).alias(f"{c}_share") for c in CLASSES],
        pl.when(pl.col("_no_split")).then(None).otherwise(pl.col("wait_ns")).alias("wait_ns"),
        pl.when(pl.col("_no_split")).then(None).otherwise(pl.col("transfer_ns")).alias("transfer_ns"),
        pl.when(pl.col("_bytes_known") > 0).then(pl.col("comm_bytes") / pl.col("_bytes_known"))
        .cast(pl.Int64).alias("comm_bytes_per_iteration"),
        *_link_shares(),
    ).drop("_no_split", "_bytes_known", "_bus_wall", "_bus_active", "_bus_known", "_ideal_wall", "_ideal_known")
    return agg.with_columns(_wait_share()).drop("_exposed_split")


def _link_aggs() -> list[pl.Expr]:
    """Sums behind the link figures, over windows whose bus bytes (and ideal time) are known."""
    known = pl.col("bus_bytes").is_not_null()
    ideal = pl.col("ideal_comm_ns").is_not_null()
    return [
        pl.col("link_active_ns").sum(),
        pl.col("bus_bytes").sum(),
        known.sum().alias("_bus_known"),
        pl.col("wall_ns").filter(known).sum().alias("_bus_wall"),
        pl.col("link_active_ns").filter(known).sum().alias("_bus_active"),
        pl.col("ideal_comm_ns").sum(),
        ideal.sum().alias("_ideal_known"),
        pl.col("wall_ns").filter(ideal).sum().alias("_ideal_wall"),
        pl.col("exposed_comm_ns").filter(pl.col("wait_ns").is_not_null()).sum().alias("_exposed_split"),
    ]


def _link_shares() -> list[pl.Expr]:
    return [
        (pl.col("link_active_ns") / pl.col("wall_ns")).alias("link_busy_share"),
        pl.when(pl.col("_bus_known") > 0).then(pl.col("bus_bytes") / pl.col("_bus_known")).cast(pl.Int64)
        .alias("bus_bytes_per_iteration"),
        pl.when(pl.col("_bus_active") > 0).then(pl.col("bus_bytes") * 8 / pl.col("_bus_active"))
        .alias("busbw_gbps"),
        pl.when(pl.col("_ideal_known") > 0).then(pl.col("ideal_comm_ns") / pl.col("_ideal_wall"))
        .alias("link_utilisation"),
        pl.when(pl.col("_ideal_known") > 0).then(pl.col("ideal_comm_ns")).alias("ideal_comm_ns"),
    ]


def _wait_share() -> pl.Expr:
    """Waiting's share of exposed communication, over the windows where the split is known."""
    return pl.when(pl.col("wait_ns").is_not_null() & (pl.col("_exposed_split") > 0)) \
        .then(pl.col("wait_ns") / pl.col("_exposed_split")).alias("wait_share_of_exposed")


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


def without_iterations(breakdown: pa.Table, ranks: pa.Table) -> list[int]:
    """The ranks of ``ranks`` with no iteration window in ``breakdown``: shown as such, never dropped."""
    seen = set(breakdown.column("rank").to_pylist()) if breakdown.num_rows else set()
    return sorted(int(r) for r in ranks.column("rank").to_pylist() if r is not None and r not in seen)


def job(breakdown: pa.Table, ranks: pa.Table | None = None) -> dict[str, Any]:
    """Whole-job figures: shares of time per class, iteration times, worst iteration, most exposed rank.
    ``median_iteration_ns`` is the job's measured iteration time, the one figure every view gives
    (:func:`tracekit.analysis.iterations.measured_iteration_ns`; ``ranks`` put each rank's windows on the job
    clock)."""
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
    out["median_iteration_ns"] = measured_iteration_ns(breakdown, ranks)
    worst = it.sort("iteration_ns", descending=True).row(0, named=True)
    out["worst_iteration"] = {"iteration": worst["iteration"], "iteration_ns": worst["iteration_ns"],
                              "slowest_rank": worst["slowest_rank"]}
    pr = per_rank(breakdown)
    exposed = pr.sort("exposed_comm_share", descending=True).row(0, named=True)
    out["most_exposed_rank"] = {"rank": exposed["rank"], "exposed_comm_share": exposed["exposed_comm_share"],
                                "exposed_comm_ns": exposed["exposed_comm_ns"]}
    known = b.get_column("comm_bytes").drop_nulls()
    out["comm_bytes_per_iteration"] = int(known.mean()) if known.len() else None  # type: ignore[arg-type]
    links = b.with_columns(pl.lit(0).alias("rank")).group_by("rank").agg(
        pl.col("wall_ns").sum(), pl.col("exposed_comm_ns").sum(), pl.col("wait_ns").sum(), *_link_aggs()
    ).with_columns(*_link_shares()).with_columns(_wait_share()).row(0, named=True)
    for k in ("link_active_ns", "link_busy_share", "bus_bytes_per_iteration", "busbw_gbps", "ideal_comm_ns",
              "link_utilisation"):
        out[k] = links[k]
    out["wait_share_of_exposed"] = links["wait_share_of_exposed"] if "wait_ns" in out else None
    # the share of exposed communication that wait_share_of_exposed covers (collectives matched on all their ranks)
    out["exposed_split_share"] = links["_exposed_split"] / links["exposed_comm_ns"] \
        if "wait_ns" in out and links["exposed_comm_ns"] else None
    return out


def collectives_overview(instances: pa.Table) -> dict[str, Any]:
    """Counts of collective instances: all, matched across ranks, complete, partial, inconsistent, with
    disagreeing sizes, and judged (with a straggler)."""
    i = pl.from_arrow(instances.select(["ranks", "partial", "consistent", "sizes_agree", "straggler_rank"]))
    assert isinstance(i, pl.DataFrame)
    if i.height == 0:
        return {"instances": 0, "matched": 0, "partial": 0, "inconsistent": 0, "size_mismatch": 0, "judged": 0}
    multi = i.get_column("ranks").list.len() >= 2
    return {
        "instances": i.height,
        "matched": int(multi.sum()),
        "partial": int(i.get_column("partial").sum()),
        "inconsistent": int((~i.get_column("consistent")).sum()),
        "size_mismatch": int((~i.get_column("sizes_agree")).sum()),
        "judged": int(i.get_column("straggler_rank").is_not_null().sum()),
    }


def by_op(instances: pa.Table) -> pl.DataFrame:
    """Collective instances per op: calls, distinct sizes, bus bytes, median skew, total wait, median transfer
    and the bus bandwidth over all of them (total bus bytes / total transfer time)."""
    i = pl.from_arrow(instances)
    assert isinstance(i, pl.DataFrame)
    if i.height == 0:
        return pl.DataFrame()
    timed = pl.col("transfer_ns").is_not_null() & pl.col("bus_bytes").is_not_null()
    return i.group_by("op").agg(
        pl.len().alias("calls"), pl.col("bytes").n_unique().alias("sizes"), pl.col("bus_bytes").sum(),
        pl.col("skew_ns").median().round().cast(pl.Int64).alias("median_skew_ns"), pl.col("wait_ns").sum(),
        pl.col("transfer_ns").median().round().cast(pl.Int64).alias("median_transfer_ns"),
        (pl.col("bus_bytes").filter(timed).sum() * 8 / pl.col("transfer_ns").filter(timed).sum()).alias("busbw_gbps"),
    ).sort("bus_bytes", descending=True, nulls_last=True)


def nccl_overview(collectives: pa.Table, topology: pa.Table) -> pl.DataFrame:
    """One row per NCCL communicator seen in debug logs: its size, the ranks whose logs mention it, its
    calls by op and volume, the algorithms and protocols NCCL chose, and the transports it connected with."""
    c = pl.from_arrow(collectives)
    assert isinstance(c, pl.DataFrame)
    c = c.filter(pl.col("source") == "nccl-log")
    if c.height == 0:
        return pl.DataFrame()
    per_op = (c.group_by(["pg", "op"]).agg(pl.len().alias("n"), pl.col("bytes").sum().alias("b"),
                                          pl.col("rank").n_unique().alias("r"))
              .sort(["pg", "n", "op"], descending=[False, True, False])  # ties by name: the same text every run
              .with_columns(pl.concat_str([pl.col("op"), pl.lit("×"), (pl.col("n") // pl.col("r")).cast(pl.String)])
                            .alias("label")))
    out = c.group_by("pg").agg(
        pl.col("nranks").max(),
        pl.col("rank").unique().sort().alias("ranks_logged"),
        pl.len().alias("calls"),
        (pl.col("bytes").sum() // pl.col("rank").n_unique()).alias("bytes_per_rank"),
        pl.col("algorithm").drop_nulls().unique().sort().alias("algorithms"),
        pl.col("protocol").drop_nulls().unique().sort().alias("protocols"),
    ).join(per_op.group_by("pg").agg(pl.col("label").alias("ops")), on="pg", how="left")
    t = pl.from_arrow(topology)
    assert isinstance(t, pl.DataFrame)
    if t.height:
        tr = t.filter(pl.col("comm_id").is_not_null()).group_by("comm_id").agg(
            pl.col("transport").drop_nulls().unique().sort().alias("transports"))
        out = out.join(tr.rename({"comm_id": "pg"}), on="pg", how="left")
    else:
        out = out.with_columns(pl.lit(None, dtype=pl.List(pl.String)).alias("transports"))
    return out.rename({"pg": "comm_id"}).sort("comm_id")
