"""The innermost compute operations of a job: what the what-if's contention fit reads
(:mod:`tracekit.analysis.graph.contention`, :func:`tracekit.analysis.graph.whatif.build`): device kernels on ranks with
devices, CPU operators with nothing nested inside on CPU-only ranks, on the job clock of the dependency graph."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

from tracekit.analysis.graph.dag import Graph, lane_codes, sort_by_lane


def compute_leaves(events: pa.Table, g: Graph) -> pl.DataFrame:
    """``rank, iteration, name, start, end`` (job clock) of the innermost compute operations: device kernels
    on ranks with devices, CPU operators with nothing nested inside on CPU-only ranks."""
    ev = pl.from_arrow(events.select(["rank", "lane", "kind", "name", "start_ns", "dur_ns", "device", "iteration"]))
    assert isinstance(ev, pl.DataFrame)
    codes = lane_codes(events.column("lane"))
    if codes is not None:  # the lanes' order from their dictionary: no lane text per row
        ev = ev.with_columns(pl.Series("lane", codes))
    gpu = sorted(g.gpu_ranks)
    ev = ev.filter(pl.when(pl.col("rank").is_in(gpu)).then(pl.col("kind") == "compute")
                   .otherwise((pl.col("kind") == "cpu_op") & pl.col("device").is_null())
                   & pl.col("iteration").is_not_null())
    # only what the fit reads is sorted; the lane's text for the rows kept where its codes do not order it; names
    # stay categorical (the fit groups by them)
    lane_col = pl.col("lane") if codes is not None else pl.col("lane").cast(pl.String)
    ev = ev.select("rank", lane_col, "iteration", "name", "start_ns",
                   (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"))
    ev, lane = sort_by_lane(ev, "start_ns", "end_ns")
    start = ev.get_column("start_ns").to_numpy()
    end = ev.get_column("end_ns").to_numpy()
    leaf = np.ones(ev.height, dtype=bool)
    leaf[:-1] = ~((lane[1:] == lane[:-1]) & (start[1:] < end[:-1]))
    # the graph's clock offset of each rank (its activities' start minus their own-clock start)
    off = g.act.group_by("rank").agg((pl.col("start") - pl.col("start_ns")).first().alias("_off"))
    ev = ev.join(off, on="rank", how="left").with_columns(pl.col("_off").fill_null(0))
    shift = ev.get_column("_off").to_numpy()
    return ev.select(["rank", "iteration", "name"]).with_columns(
        pl.Series("start", start + shift), pl.Series("end", end + shift)).filter(pl.Series(leaf))
