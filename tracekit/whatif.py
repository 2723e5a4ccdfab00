"""What-if: replay the job's dependency graph with other links (DESIGN.md "What-if").

Every communication activity's transfer is re-costed; compute, CPU work and the measured slack stay as
they were; the graph decides what moves. A transfer of ``B`` bus bytes costs

    latency + B / (c · R' · η)        (+ encode/decode of the payload when c > 1)

for line rate ``R'``, compression ratio ``c`` and efficiency ``η``: 1 for full utilisation of the link,
or as measured. As measured, a rank's link achieved some bus bandwidth ``A`` over the union of its
transfer time while running at line rate ``R`` (``--link-bw``); that time is wire time at the protocol's
efficiency (:data:`WIRE_EFFICIENCY`) plus per-byte work of the hosts (reductions, copies, the network
stack: ``1/A - 1/(0.95 R)`` per byte), and only the wire time scales with the line rate. A job limited
by its hosts therefore stays limited by them on a faster link, and a job limited by its link speeds up
with it. ``n'`` workers change the bus bytes through the bus factor of each op
(all-reduce ``2(n−1)/n``, ...) with the per-worker work unchanged (weak scaling, as data parallelism is).

The predicted iteration time is the median time between consecutive iteration starts of the replayed
schedule; the scaling factor is the iteration time with free communication divided by the predicted
one — Zhang et al.'s ``T_n / (n·T)`` for a job whose per-worker work does not change with ``n``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa

from tracekit import dag, replay
from tracekit.dag import EDGE_TYPES, Graph
from tracekit.intervals import union_length
from tracekit.links import bus_bytes_expr

_OWN = EDGE_TYPES.index("own")
_COLLECTIVE = EDGE_TYPES.index("collective")

#: fixed cost of one collective call, by backend; small against real transfers, large against tiny ones
DEFAULT_LATENCY_NS = {"nccl": 20_000, "gloo": 100_000}
#: share of the line rate a busy link carries as payload (headers, acknowledgements; TCP over Ethernet
#: carries 1448 of 1514 bytes per frame, 95.6 %; InfiniBand is similar)
WIRE_EFFICIENCY = 0.95
#: encode + decode cost of gradient compression, ns per payload byte (about 15 ms for ResNet-50's
#: 102 MB, in the range Agarwal et al. (MLSys 2022) measured for PowerSGD / top-k on V100s)
DEFAULT_CODEC_NS_PER_BYTE = 0.15


@dataclass(frozen=True)
class Scenario:
    """One what-if question. ``None`` means "as the job ran"."""

    bandwidth_bps: float | None = None
    compression: float = 1.0
    workers: int | None = None
    efficiency: str | float = "measured"  # "measured", "full" (= 1.0) or a number in (0, 1]
    codec_ns_per_byte: float = DEFAULT_CODEC_NS_PER_BYTE
    free: bool = False  # communication costs nothing (the reference for the scaling factor)


@dataclass
class Model:
    """Everything a scenario needs, computed once per job."""

    graph: Graph
    chains: replay.Chains
    comm: pl.DataFrame  # a (activity), transfer_ns, bytes, op, nranks, instance (null if unmatched)
    own_edge: np.ndarray  # per comm row: its own edge index
    coll_edges: np.ndarray  # collective edges, and the comm row of their destination
    coll_edge_row: np.ndarray
    iteration_of: np.ndarray  # per activity: its iteration (or a huge negative number)
    link_speed: np.ndarray  # per comm row: its rank's measured link bus bandwidth (bytes/ns)
    fifo: tuple[np.ndarray, np.ndarray, np.ndarray]  # consecutive transfers of a rank: (prev row, row, dst node)
    line_rate_bps: float | None
    workers: int
    latency_ns: int
    measured_iteration_ns: int


def consistent_members(members: pa.Table | None, instances: pa.Table | None) -> pl.DataFrame | None:
    """``rank, collective_id, instance`` of the members of instances that are consistent in time (the
    collective edges of the dependency graph)."""
    if members is None or members.num_rows == 0:
        return None
    m = pl.from_arrow(members.select(["instance", "rank", "collective_id"]))
    assert isinstance(m, pl.DataFrame)
    if instances is not None and instances.num_rows and "consistent" in instances.column_names:
        ok = pl.from_arrow(instances.select(["instance", "consistent"]))
        assert isinstance(ok, pl.DataFrame)
        m = m.join(ok.filter(pl.col("consistent").fill_null(False)).select("instance"), on="instance", how="semi")
    return m


def build(events: pa.Table, collectives: pa.Table, ranks: pa.Table | None = None,
          members: pa.Table | None = None, instances: pa.Table | None = None,
          line_rate_bps: float | None = None, latency_ns: int | None = None, graph: Graph | None = None) -> Model:
    """The dependency graph of the job (built here unless given) plus what re-costing transfers needs."""
    inst = consistent_members(members, instances)
    g = graph if graph is not None else dag.build(events, ranks, inst)
    act = g.act
    coll = pl.from_arrow(collectives.select(["rank", "collective_id", "op", "bytes", "nranks", "source"]))
    assert isinstance(coll, pl.DataFrame)
    comm = act.filter(pl.col("kind") == "comm").select(["a", "rank", "collective_id", "start", "end"]).join(
        coll, on=["rank", "collective_id"], how="left")
    if inst is not None:
        comm = comm.join(inst.with_columns(pl.col("rank").cast(pl.Int32)), on=["rank", "collective_id"], how="left")
    else:
        comm = comm.with_columns(pl.lit(None, dtype=pl.Int64).alias("instance"))
    a = comm.get_column("a").to_numpy()
    # each comm activity's own edge (start -> end) carries its transfer
    own_mask = g.etype == _OWN
    own_of_node = np.full(g.n_nodes, -1, dtype=np.int64)
    own_of_node[g.dst[own_mask]] = np.flatnonzero(own_mask)
    own_edge = own_of_node[2 * a + 1]
    transfer = g.lag[own_edge]
    comm = comm.with_columns(pl.Series("transfer_ns", transfer))
    row_of_act = np.full(act.height, -1, dtype=np.int64)
    row_of_act[a] = np.arange(a.size)
    coll_edges = np.flatnonzero(g.etype == _COLLECTIVE)
    coll_edge_row = row_of_act[g.dst[coll_edges] // 2]
    link_speed, fifo = _links(comm, transfer, g)
    n = comm.get_column("nranks").drop_nulls()
    workers = int(n.max()) if n.len() else (ranks.num_rows if ranks is not None else 1)  # type: ignore[arg-type]
    backend = "gloo" if (comm.get_column("source") == "gloo").any() else "nccl"
    # iteration windows count device work on ranks that have it, everything on CPU-only ranks
    # (as tracekit.iterations does)
    on_dev = act.get_column("device").is_not_null().to_numpy()
    dev_rank = np.isin(act.get_column("rank").to_numpy(), act.filter(pl.col("device").is_not_null())
                       .get_column("rank").unique().to_numpy())
    it = act.get_column("iteration").fill_null(-(1 << 62)).to_numpy()
    it = np.where(dev_rank & ~on_dev, -(1 << 62), it)
    model = Model(graph=g, chains=replay.chains(g), comm=comm, own_edge=own_edge, coll_edges=coll_edges,
                  coll_edge_row=coll_edge_row, iteration_of=it, link_speed=link_speed, fifo=fifo,
                  line_rate_bps=line_rate_bps, workers=workers,
                  latency_ns=DEFAULT_LATENCY_NS[backend] if latency_ns is None else latency_ns,
                  measured_iteration_ns=0)
    model.measured_iteration_ns = iteration_time(model, g.node_time)
    return model


def _links(comm: pl.DataFrame, transfer: np.ndarray, g: Graph
           ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per rank: the link's measured bus bandwidth (bus bytes over the union of transfer time, so
    concurrent transfers sharing the link count once), and the order transfers use it in."""
    end = comm.get_column("end").to_numpy()
    start = end - transfer
    rank = comm.get_column("rank").to_numpy().astype(np.int64)
    bus = _bus_bytes(comm, None)
    ranks = np.unique(rank)
    if ranks.size == 0:
        return np.zeros(0), (np.zeros(0, np.int64),) * 3  # type: ignore[return-value]
    lo = np.array([start[rank == r].min() for r in ranks])
    hi = np.array([end[rank == r].max() for r in ranks]) + 1
    active = union_length(rank, start, end, ranks, lo, hi)
    total = np.array([bus[rank == r].sum() for r in ranks])
    speed_of = dict(zip(ranks.tolist(), (total / np.maximum(active, 1)).tolist(), strict=True))
    speed = np.array([speed_of[r] for r in rank.tolist()])
    # FIFO: a rank's transfers in arrival order
    order = np.lexsort((comm.get_column("start").to_numpy(), rank))
    same = rank[order][1:] == rank[order][:-1]
    prev, cur = order[:-1][same], order[1:][same]
    dst = 2 * comm.get_column("a").to_numpy()[cur] + 1
    return speed, (prev, cur, dst)


def _bus_bytes(comm: pl.DataFrame, workers: int | None) -> np.ndarray:
    """Bus bytes of every comm activity, for its own group size or ``workers``."""
    n = pl.lit(workers, dtype=pl.Int64) if workers else pl.col("nranks").cast(pl.Int64)
    out = comm.with_columns(n.alias("_n")).select(bus_bytes_expr(nbytes="bytes", n="_n").alias("bus"))
    return out.get_column("bus").fill_null(0).to_numpy().astype(np.float64)


def transfers(model: Model, sc: Scenario) -> np.ndarray:
    """New transfer time (ns) of every communication activity under ``sc``, each on its own."""
    comm = model.comm
    t = comm.get_column("transfer_ns").to_numpy().astype(np.float64)
    if sc.free:
        return np.zeros_like(t)
    nbytes = comm.get_column("bytes").fill_null(0).to_numpy().astype(np.float64)
    new_bus = _bus_bytes(comm, sc.workers)
    known = new_bus > 0
    c = max(sc.compression, 1.0)
    codec = sc.codec_ns_per_byte * nbytes if c > 1 else 0.0
    r_line = model.line_rate_bps
    r_new = sc.bandwidth_bps or r_line
    if sc.efficiency == "measured":
        if sc.bandwidth_bps is not None and r_line is None:
            raise ValueError("--efficiency measured needs the line rate the job ran on (--link-bw)")
        if r_line and r_new:
            # what the link achieved = wire time at the protocol's efficiency + per-byte work of the hosts
            # (reductions, copies, the network stack), which a faster link does not shrink
            wire = 8e9 / (WIRE_EFFICIENCY * r_line)  # ns per byte on the wire
            host = np.maximum(1.0 / np.maximum(model.link_speed, 1e-12) - wire, 0.0)
            speed = 1.0 / (8e9 / (WIRE_EFFICIENCY * r_new) + host)
        else:
            speed = model.link_speed
    else:
        eta = 1.0 if sc.efficiency == "full" else float(sc.efficiency)
        if not r_new:
            raise ValueError("efficiency 'full' needs a line rate (--bandwidth or --link-bw)")
        speed = np.full_like(t, eta * r_new / 8e9)  # bytes per ns
    new = model.latency_ns + new_bus / (c * np.maximum(speed, 1e-12)) + codec
    # calls of unknown size keep their measured cost
    return np.where(known, new, t)


def predict(model: Model, sc: Scenario) -> int:
    """Predicted iteration time (ns) under ``sc``: transfers re-costed and queued one after the other on
    their rank's link (Zhang et al.'s FIFO channel), everything else as measured."""
    g = model.graph
    w = g.weight().copy()
    new_t = np.rint(transfers(model, sc)).astype(np.int64)
    valid = model.own_edge >= 0
    w[model.own_edge[valid]] = new_t[valid] + g.slack[model.own_edge[valid]]
    ok = model.coll_edge_row >= 0
    w[model.coll_edges[ok]] = new_t[model.coll_edge_row[ok]] + g.slack[model.coll_edges[ok]]
    extra = None
    if not sc.free:
        prev, cur, dst = model.fifo
        a = model.comm.get_column("a").to_numpy()
        extra = (2 * a[prev] + 1, dst, new_t[cur])
    times, _ = replay.replay(g, w, model.chains, extra=extra)
    return iteration_time(model, times)


def iteration_time(model: Model, times: np.ndarray) -> int:
    """Median time between consecutive iteration starts (one iteration: its span)."""
    it = model.iteration_of
    valid = it > -(1 << 61)
    if times.size == 0:
        return 0
    if not valid.any():
        return int(times.max() - times.min())
    starts = pl.DataFrame({"it": it[valid], "s": times[0::2][valid], "e": times[1::2][valid]}).group_by("it").agg(
        pl.col("s").min(), pl.col("e").max()).sort("it")
    s = starts.get_column("s").to_numpy()
    gaps = np.diff(s)
    gaps = gaps[gaps > 0]  # ranks from unrelated runs can put iteration k+1 no later than k: not a period
    if gaps.size == 0:
        return int(np.median(starts.get_column("e").to_numpy() - s))
    return int(np.median(gaps))


def sweep(model: Model, scenarios: list[Scenario]) -> pl.DataFrame:
    """Rows ``bandwidth_bps, compression, workers, efficiency, iteration_ns, speedup, scaling_factor``."""
    free = predict(model, Scenario(free=True))
    rows = []
    for sc in scenarios:
        t = predict(model, sc)
        rows.append({
            "bandwidth_bps": sc.bandwidth_bps or model.line_rate_bps,
            "compression": sc.compression,
            "workers": sc.workers or model.workers,
            "efficiency": str(sc.efficiency),
            "iteration_ns": t,
            "speedup": model.measured_iteration_ns / t if t else math.inf,
            "scaling_factor": free / t if t else 1.0,
        })
    return pl.DataFrame(rows, schema={"bandwidth_bps": pl.Float64, "compression": pl.Float64, "workers": pl.Int64,
                                      "efficiency": pl.String, "iteration_ns": pl.Int64, "speedup": pl.Float64,
                                      "scaling_factor": pl.Float64})


@dataclass(frozen=True)
class Bottleneck:
    """The answer to "is the network the bottleneck?", in Zhang et al.'s terms."""

    measured_ns: int
    free_ns: int
    scaling_measured: float
    scaling_full: float | None  # at full utilisation of the job's line rate
    line_rate_bps: float | None
    compression_needed: float | None  # for the target scaling at full utilisation of the same link
    bandwidth_needed_bps: float | None
    target: float
    text: str


def bottleneck(model: Model, target: float = 0.9) -> Bottleneck | None:
    """Measured vs full-utilisation vs infinite-bandwidth predictions, and what would reach ``target``; None
    when the replay predicts no iteration time to compare."""
    from tracekit.units import format_rate

    free = predict(model, Scenario(free=True))
    measured = predict(model, Scenario())
    if free <= 0 or measured <= 0:
        return None
    sf_measured = free / measured if measured else 1.0
    rate = model.line_rate_bps
    if rate is None:
        text = (f"Communication free, this job would run {measured / free:.2f}x faster (scaling factor "
                f"{sf_measured:.2f} now). Pass --link-bw (the line rate the job ran on) to learn whether the link "
                "or its use is the bottleneck.")
        return Bottleneck(measured, free, sf_measured, None, None, None, None, target, text)
    full = predict(model, Scenario(bandwidth_bps=rate, efficiency="full"))
    sf_full = free / full if full else 1.0
    r = format_rate(rate)
    if sf_measured >= target:
        text = (f"The network is not the bottleneck: the job scales at {sf_measured:.2f} on the {r} link "
                f"(communication costs {100 * (1 - sf_measured):.0f} % of an iteration).")
        return Bottleneck(measured, free, sf_measured, sf_full, rate, None, None, target, text)
    if sf_full >= target:
        text = (f"At full utilisation of the {r} link this job would scale at {sf_full:.2f} instead of "
                f"{sf_measured:.2f}: the link is not the bottleneck, its use is.")
        return Bottleneck(measured, free, sf_measured, sf_full, rate, None, None, target, text)
    need_c = None
    for c in (1.5, 2, 3, 4, 5, 8, 10, 16, 32, 64, 100):
        if free / predict(model, Scenario(bandwidth_bps=rate, efficiency="full", compression=c)) >= target:
            need_c = float(c)
            break
    need_r = None
    for mult in (1.5, 2, 2.5, 4, 5, 8, 10, 16, 25, 40, 64, 100, 250, 1000):
        if free / predict(model, Scenario(bandwidth_bps=rate * mult, efficiency="full")) >= target:
            need_r = rate * mult
            break
    wants = []
    if need_c:
        wants.append(f"≥ {need_c:g}x compression")
    if need_r:
        wants.append(f"≥ {format_rate(need_r)}")
    want = " or ".join(wants) if wants else "more than 100x compression or 1000x the bandwidth"
    text = (f"The link is the bottleneck: even at full utilisation of the {r} link this job would scale at "
            f"{sf_full:.2f} (now {sf_measured:.2f}); it needs {want} to reach {target:.1f}.")
    return Bottleneck(measured, free, sf_measured, sf_full, rate, need_c, need_r, target, text)
