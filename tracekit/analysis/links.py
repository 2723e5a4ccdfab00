"""Links (DESIGN.md "Links"): how much each collective put on the wire, how long the links were busy and
how fast they went, and — with a line rate — how close that is to what the link could do.

**Bus bytes** follow nccl-tests' ``PERFORMANCE.md`` (FORMATS.md §4): ``busBytes = S × factor`` with factor
``2(n−1)/n`` for all-reduce, ``(n−1)/n`` for all-gather, reduce-scatter, all-to-all, gather and scatter,
``1`` for broadcast, reduce and send/recv, ``0`` for barriers; n is the group size. They approximate the
traffic on each rank's busiest link, so they are what a link's rate is compared with.

**Per rank and window** (columns of ``breakdown``): ``bus_bytes`` of the collectives starting in the window;
``link_active_ns`` (measured by :func:`tracekit.analysis.attribution.breakdown`: union of transfer time when the
window's collectives were matched across ranks, of all communication time otherwise — ``wait_ns``
tells which: it is non-null exactly when transfer time was used); ``link_idle_ns = wall − active``;
``busbw_gbps = 8 · bus_bytes / link_active_ns`` (Gbit/s, 10⁹ bits per second; nccl-tests prints GB/s,
i.e. this divided by 8); and with a line rate R: ``ideal_comm_ns = bus_bytes / R`` and
``link_utilisation = bus_bytes / (R · wall)``.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

from tracekit.analysis.attribution import bytes_per_window
from tracekit.model import schema

#: bus factor per op as a function of the group size n (nccl-tests PERFORMANCE.md)
_FACTOR_KIND = {
    "allreduce": "2(n-1)/n",
    "allgather": "(n-1)/n", "reduce_scatter": "(n-1)/n", "all_to_all": "(n-1)/n", "gather": "(n-1)/n",
    "scatter": "(n-1)/n",
    "broadcast": "1", "reduce": "1", "send": "1", "recv": "1", "sendrecv": "1",
    "barrier": "0",
}


def bus_factor(op: str | None, n: int | None) -> float | None:
    """The bus factor of one call (None when the op or group size is unknown)."""
    kind = _FACTOR_KIND.get(op or "")
    if kind is None or (kind != "1" and kind != "0" and not n):
        return None
    if kind == "0":
        return 0.0
    if kind == "1":
        return 1.0
    assert n
    base = (n - 1) / n
    return 2 * base if kind == "2(n-1)/n" else base


def bus_factor_expr(op: str = "op", n: str = "nranks") -> pl.Expr:
    """Polars expression: the bus factor (float64) of calls from their op and group size; null when unknown."""
    nn = pl.col(n).cast(pl.Float64)
    kind = pl.col(op).replace_strict(_FACTOR_KIND, default=None, return_dtype=pl.String)
    return (pl.when(kind == "2(n-1)/n").then(2 * (nn - 1) / nn)
            .when(kind == "(n-1)/n").then((nn - 1) / nn)
            .when(kind == "1").then(pl.lit(1.0))
            .when(kind == "0").then(pl.lit(0.0)))


def bus_bytes_expr(op: str = "op", nbytes: str = "bytes", n: str = "nranks") -> pl.Expr:
    """Polars expression: bus bytes (int64) of calls from their op, S and group size; null when unknown
    (a barrier moves no data: 0 whatever its size)."""
    barrier = pl.col(op).replace_strict(_FACTOR_KIND, default=None, return_dtype=pl.String) == "0"
    return pl.when(barrier).then(pl.lit(0, pl.Int64)).otherwise(
        (pl.col(nbytes).cast(pl.Float64) * bus_factor_expr(op, n)).round().cast(pl.Int64))


def call_bus_bytes(collectives: pa.Table) -> pl.DataFrame:
    """``rank, start_ns, bus_bytes`` of every collective call (each rank's own view)."""
    c = pl.from_arrow(collectives.select(["rank", "op", "bytes", "nranks", "start_ns"]))
    assert isinstance(c, pl.DataFrame)
    return c.select("rank", "start_ns", bus_bytes_expr().alias("bus_bytes"))


def line_rate(given_bps: float | None, topology: pa.Table | None = None) -> tuple[float | None, str | None]:
    """The line rate to compare with, in bits per second, and where it came from.

    ``--link-bw`` wins. Otherwise a topology with a ``rate_bps`` column (an NCCL-log parser that reads
    the NICs' speeds) gives the slowest rate it names; without either there is none, and the columns
    that need one stay null.
    """
    if given_bps:
        return float(given_bps), "given"
    if topology is not None and topology.num_rows and "rate_bps" in topology.column_names:
        rates = pl.from_arrow(topology.select(["rate_bps"])).get_column("rate_bps").drop_nulls()  # type: ignore[union-attr]
        rates = rates.filter(rates > 0)
        if rates.len():
            return float(rates.min()), "topology"  # type: ignore[arg-type]
    return None, None


def window_links(breakdown: pa.Table, collectives: pa.Table | None, rate_bps: float | None) -> pa.Table:
    """Fill the link columns of ``breakdown`` (module docstring). ``link_active_ns`` must already be there."""
    if breakdown.num_rows == 0:
        return breakdown
    b = pl.from_arrow(breakdown)
    assert isinstance(b, pl.DataFrame)
    w_rank = b.get_column("rank").to_numpy().astype(np.int64)
    w_start = b.get_column("start_ns").to_numpy()
    w_end = b.get_column("end_ns").to_numpy()
    calls = call_bus_bytes(collectives) if collectives is not None and collectives.num_rows else None
    bus = pl.from_arrow(bytes_per_window(calls, w_rank, w_start, w_end, column="bus_bytes"))
    assert isinstance(bus, pl.Series)
    b = b.with_columns(bus.alias("bus_bytes"))
    active = pl.col("link_active_ns")
    b = b.with_columns(
        (pl.col("wall_ns") - active).alias("link_idle_ns"),
        pl.when(active > 0).then(pl.col("bus_bytes") * 8 / active).alias("busbw_gbps"),
    )
    if rate_bps:
        b = b.with_columns(
            (pl.col("bus_bytes") * 8e9 / rate_bps).round().cast(pl.Int64).alias("ideal_comm_ns"),
            pl.when(pl.col("wall_ns") > 0).then(pl.col("bus_bytes") * 8e9 / (rate_bps * pl.col("wall_ns")))
            .alias("link_utilisation"),
        )
    else:
        b = b.with_columns(pl.lit(None, dtype=pl.Int64).alias("ideal_comm_ns"),
                           pl.lit(None, dtype=pl.Float64).alias("link_utilisation"))
    return schema.conform(b.to_arrow(), schema.BREAKDOWN)


def instance_links(instances: pa.Table, rate_bps: float | None) -> pa.Table:
    """Fill ``link_utilisation`` of collective instances: achieved bus bandwidth over the line rate."""
    if instances.num_rows == 0 or not rate_bps:
        return instances
    i = pl.from_arrow(instances)
    assert isinstance(i, pl.DataFrame)
    i = i.with_columns((pl.col("busbw_gbps") * 1e9 / rate_bps).alias("link_utilisation"))
    return schema.conform(i.to_arrow(), schema.COLLECTIVE_INSTANCES)
