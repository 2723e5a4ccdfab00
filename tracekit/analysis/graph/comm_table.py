"""The what-if's table of communication activities (:attr:`tracekit.analysis.graph.whatif.Model.comm`): a row per
call with its transfer, process group and link, its bus bytes — recorded, or estimated from its time at the line
rate — and each link's measured bus bandwidth, and the order transfers went through each link (the queues a replay
keeps). Made from a job's graph, or from the rows of its ranks' graphs held apart
(:mod:`tracekit.scale.rank_whatif`): the same table either way.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

from tracekit.analysis import link_classes
from tracekit.analysis.graph.dag import EDGE_TYPES, Graph, own_edges
from tracekit.analysis.intervals import Grouped, union_length
from tracekit.analysis.links import bus_bytes_expr, bus_factor_expr

#: fixed cost of one collective call, by backend; small against real transfers, large against tiny ones
DEFAULT_LATENCY_NS = {"nccl": 20_000, "gloo": 100_000}
#: share of the line rate a busy link carries as payload (headers, acknowledgements; TCP over Ethernet
#: carries 1448 of 1514 bytes per frame, 95.6 %; InfiniBand is similar)
WIRE_EFFICIENCY = 0.95
#: what a transfer's size rests on, per communication activity of the model (``Model.comm["size"]``)
SIZE_MEASURED, SIZE_ESTIMATED, SIZE_UNKNOWN = "measured", "estimated", "unknown"
#: host work per byte of a transfer (reductions, copies, the network stack) assumed when no transfer of the
#: job has a known size: gloo's CPU reduction and TCP stack took 0.6-1.2 ns/B beyond the wire (median 0.8) in the
#: 3 Gbit/s blocks of this project's interleaved DDP recordings with sizes recorded (docs/accuracy.md; 1.4-2.9
#: ns/B measured earlier in separate recordings on the loaded VM held the machine's noise too); NCCL reduces on
#: the GPU, off the host's path
HOST_NS_PER_BYTE = {"gloo": 0.8, "nccl": 0.0}
#: the most host work per byte a measured link is credited with; what a slow link loses beyond the wire and
#: this is the protocol's inefficiency (TCP at a low rate, small messages), which shrinks with a faster link.
#: gloo: the most this VM's cores spent reducing and pushing a byte through TCP on a fast link (up to 1.2 ns/B
#: in the 3 Gbit/s blocks of the interleaved recordings, docs/accuracy.md); NCCL reduces on the GPU
HOST_NS_PER_BYTE_MAX = {"gloo": 1.2, "nccl": 0.0}


def consistent_members(members: pa.Table | None, instances: pa.Table | None,
                       collectives: pa.Table | None = None) -> pl.DataFrame | None:
    """``rank, collective_id, instance, send`` of the members of instances that are consistent in time (the
    collective edges of the dependency graph); ``send`` is true for the sending member of a send/recv pair,
    false for the receiving one, null in a collective (from ``collectives``' ops when given)."""
    if members is None or members.num_rows == 0:
        return None
    m = pl.from_arrow(members.select(["instance", "rank", "collective_id"]))
    assert isinstance(m, pl.DataFrame)
    if instances is not None and instances.num_rows and "consistent" in instances.column_names:
        ok = pl.from_arrow(instances.select(["instance", "consistent"]))
        assert isinstance(ok, pl.DataFrame)
        m = m.join(ok.filter(pl.col("consistent").fill_null(False)).select("instance"), on="instance", how="semi")
    pairs = None
    if collectives is not None and collectives.num_rows and instances is not None and instances.num_rows:
        pair = pl.from_arrow(instances.select(["instance", "op"]))
        assert isinstance(pair, pl.DataFrame)
        pairs = pair.filter(pl.col("op") == "sendrecv").select("instance")
    if pairs is not None and pairs.height:  # (the calls' ops joined only where a member may be a send)
        ops = pl.from_arrow(collectives.select(["rank", "collective_id", "op"]))  # type: ignore[union-attr]
        assert isinstance(ops, pl.DataFrame)
        m = m.join(ops.with_columns(pl.col("rank").cast(pl.Int32)), on=["rank", "collective_id"], how="left").join(
            pairs.with_columns(pl.lit(True).alias("_p2p")), on="instance", how="left").with_columns(
            pl.when(pl.col("_p2p")).then(pl.col("op") == "send").alias("send")).drop("op", "_p2p")
    else:
        m = m.with_columns(pl.lit(None, dtype=pl.Boolean).alias("send"))
    return m


def comm_activities(g: Graph) -> tuple[pl.DataFrame, np.ndarray, np.ndarray]:
    """The communication activities of ``g`` (``a, rank, collective_id, start, end, iteration`` and ``node_end``, the
    time of its end node, which can be earlier than the recorded end), each one's own edge and the transfer it carries
    (that edge's lag): what :func:`comm_table` is made from, of a job's graph or of each rank's held apart."""
    act = g.act
    comm = act.filter(pl.col("kind") == "comm").select(["a", "rank", "collective_id", "start", "end", "iteration"])
    a = comm.get_column("a").to_numpy()
    own_edge = own_edges(g)[2 * a + 1]
    return comm.with_columns(pl.Series("node_end", g.node_time[2 * a + 1])), own_edge, g.lag[own_edge]


def tail_edges(g: Graph, row_of: np.ndarray, receiver: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sync edges into a communication activity's end, the comm row of that activity and the edge's lag less the
    activity's measured transfer (its own edge's lag, as :func:`comm_activities` has it). A blocking call inside it
    (gloo's wait for the copy of CUDA tensors to the host) binds its end to the device work it waited for, with the
    activity's time after the call as lag — which holds its transfer and its wait for the other members, so a
    scenario re-weighs it (:func:`tracekit.analysis.graph.whatif.tail_weights`). ``row_of``: per activity its comm
    row (-1: none); ``receiver``: per row, the receiving side of a pair (its own edge is local work, left as
    measured: so is its tail)."""
    is_comm = (g.act.get_column("kind") == "comm").to_numpy()
    e = np.flatnonzero((g.etype == EDGE_TYPES.index("sync")) & (g.dst % 2 == 1))
    e = e[is_comm[g.dst[e] // 2]]
    row = row_of[g.dst[e] // 2]
    ok = row >= 0
    ok[ok] = ~receiver[row[ok]]
    e, row = e[ok], row[ok]
    return e, row, g.lag[e] - g.lag[own_edges(g)[g.dst[e]]]


def comm_table(acts: pl.DataFrame, transfer: np.ndarray, collectives: pa.Table, inst: pl.DataFrame | None,
               members: pa.Table | None, ranks: pa.Table | None, line_rate_bps: float | None, latency_ns: int | None,
               line_rates: dict[str, float] | None, pg_desc: dict[str, str] | None, group_links: pa.Table | None
               ) -> tuple[pl.DataFrame, str, int, int]:
    """:attr:`Model.comm` from the communication activities (:func:`comm_activities`) and the transfers they carry,
    with ``_row`` (each row's index into ``acts``); the backend, per-call latency and worker count it implies."""
    coll = pl.from_arrow(collectives.select(["rank", "collective_id", "op", "bytes", "nranks", "source", "pg"]))
    assert isinstance(coll, pl.DataFrame)
    comm = acts.with_columns(pl.Series("transfer_ns", transfer)).with_row_index("_row")
    comm = comm.join(coll, on=["rank", "collective_id"], how="left", maintain_order="left")
    if inst is not None:
        comm = comm.join(inst.with_columns(pl.col("rank").cast(pl.Int32)), on=["rank", "collective_id"], how="left",
                         maintain_order="left")
    else:
        comm = comm.with_columns(pl.lit(None, dtype=pl.Int64).alias("instance"))
    comm = comm.with_columns(pl.coalesce("pg", pl.lit("default")).alias("link"),
                             link_classes.call_link_class(comm, members, ranks))
    comm = link_classes.with_group_links(comm, group_links)
    backend = "gloo" if (comm.get_column("source") == "gloo").any() else "nccl"
    descs = pg_desc or {}
    rate = np.full(comm.height, float(line_rate_bps) if line_rate_bps else np.nan)
    for sel, r in (line_rates or {}).items():
        rate[link_classes.selected(comm, sel, descs)] = r
    comm = comm.with_columns(pl.Series("line_rate_bps", rate))
    latency = DEFAULT_LATENCY_NS[backend] if latency_ns is None else latency_ns
    comm = sizes_and_speeds(_data_spans(comm), backend, latency)
    n = comm.get_column("nranks").drop_nulls()
    workers = int(n.max()) if n.len() else (ranks.num_rows if ranks is not None else 1)
    return comm, backend, latency, workers


def _data_spans(comm: pl.DataFrame) -> pl.DataFrame:
    """Add when each call's data was on the wire (``x_start``, ``x_end``) and whose link carried it (``x_rank``,
    ``x_link``): a collective's transfer on its own rank's link; both sides of a send/recv pair, the span from
    the send's start to the receive's end, on the sender's link (a send can return before its data arrives, or
    wait for a receiver that is late; the data leaves with the send and has come when the receive ends)."""
    end = pl.col("end")
    comm = comm.with_columns((end - pl.col("transfer_ns")).alias("x_start"), end.alias("x_end"),
                             pl.col("rank").alias("x_rank"), pl.col("link").alias("x_link"))
    if "send" not in comm.columns or comm.get_column("send").is_null().all():
        return comm
    pair = comm.filter(pl.col("send").is_not_null()).group_by("instance").agg(
        pl.col("start").filter(pl.col("send")).first().alias("_ss"),
        pl.col("start").filter(~pl.col("send")).first().alias("_rs"),
        pl.col("end").filter(~pl.col("send")).first().alias("_re"),
        pl.col("rank").filter(pl.col("send")).first().alias("_sr"),
        pl.col("link").filter(pl.col("send")).first().alias("_sl"),
    ).filter(pl.all_horizontal(pl.col(c).is_not_null() for c in ("_ss", "_rs", "_re", "_sr")))
    comm = comm.join(pair, on="instance", how="left")
    p2p = pl.col("send").is_not_null() & pl.col("_re").is_not_null()
    return comm.with_columns(
        pl.when(p2p).then(pl.col("_ss")).otherwise("x_start").alias("x_start"),
        pl.when(p2p).then(pl.col("_re")).otherwise("x_end").alias("x_end"),
        pl.when(p2p).then(pl.col("_sr")).otherwise("x_rank").alias("x_rank"),
        pl.when(p2p).then(pl.col("_sl")).otherwise("x_link").alias("x_link"),
    ).drop("_ss", "_rs", "_re", "_sr", "_sl")


def _busy_for_bytes(active: float, calls: int, latency_ns: int) -> float:
    """The part of a link's busy time spent moving bytes: its union of transfer time less each call's fixed cost
    (the latency every replay adds back), but never below half of it (calls that overlap share their latency)."""
    return max(active - calls * latency_ns, 0.5 * active, 1.0)


def sizes_and_speeds(comm: pl.DataFrame, backend: str, latency_ns: int = 0,
                      host_ns_per_byte: float | None = None) -> pl.DataFrame:
    """Add ``bus``, ``size`` and ``speed`` to ``comm``.

    Per rank and link, the link's bus bandwidth is measured as bus bytes over the union of transfer time of the
    calls of known size (concurrent transfers sharing the link count once), less each call's fixed cost
    (``latency_ns``: a replay costs a transfer ``latency + bytes / speed``, so the same link replays as measured,
    and a latency is not mistaken for a rate that a faster link would shorten). Where no call of a link has a known
    size but its line rate R is known, the link is taken to have run at ``1 / (8 / (0.95 R) + h)`` bytes per ns
    (payload at :data:`WIRE_EFFICIENCY` of the line rate, plus :data:`HOST_NS_PER_BYTE` of the backend, or
    ``host_ns_per_byte`` where given), and a
    call of unknown size is given the bus bytes that speed moves in its share of the link's busy time. Never is
    an unknown size taken as zero."""
    bus = _bus_bytes(comm, None)
    barrier = (comm.get_column("op") == "barrier").fill_null(False).to_numpy()
    known = ~np.isnan(bus) | barrier
    bus = np.where(barrier, 0.0, bus)
    # each call's data on the wire, on the link that carried it (:func:`_data_spans`); the receive of a pair
    # shares its send's bytes, so only one side is counted
    end = comm.get_column("x_end").to_numpy()
    start = comm.get_column("x_start").to_numpy()
    t = (end - start).astype(np.float64)
    counted = ~((comm.get_column("send") == False).fill_null(False).to_numpy()) if "send" in comm.columns \
        else np.ones(comm.height, dtype=bool)  # noqa: E712
    key = comm.select(pl.struct(["x_rank", "x_link"]).rank("dense")).to_series().to_numpy().astype(np.int64) \
        if comm.height else np.zeros(0, np.int64)
    rate = comm.get_column("line_rate_bps").to_numpy()
    speed = np.full(comm.height, np.nan)
    estimated = np.zeros(comm.height, dtype=bool)
    host = HOST_NS_PER_BYTE.get(backend, 0.0) if host_ns_per_byte is None else host_ns_per_byte
    links = Grouped.by(key)  # each link's rows looked up, not a scan of every row per link
    for k in np.unique(key):
        grp = links.of(int(k))
        kn = grp[known[grp] & (bus[grp] > 0) & counted[grp]]
        if kn.size:
            active = union_length(np.zeros(kn.size, np.int64), start[kn], end[kn], np.zeros(1, np.int64),
                                  np.array([start[kn].min()]), np.array([end[kn].max() + 1]))[0]
            speed[grp] = bus[kn].sum() / _busy_for_bytes(float(active), kn.size, latency_ns)
        elif np.isfinite(rate[grp]).all():
            speed[grp] = 1.0 / (8e9 / (WIRE_EFFICIENCY * rate[grp]) + host)
        unk = grp[~known[grp]]
        if unk.size and np.isfinite(speed[unk]).all():
            active = union_length(np.zeros(unk.size, np.int64), start[unk], end[unk], np.zeros(1, np.int64),
                                  np.array([start[unk].min()]), np.array([end[unk].max() + 1]))[0]
            share = t[unk] / max(float(t[unk].sum()), 1.0)
            bus[unk] = speed[unk] * _busy_for_bytes(float(active), unk.size, latency_ns) * share
            estimated[unk] = True
    if estimated.any() and "iteration" in comm.columns:
        bus = _steady_sizes(comm, bus, estimated, key)
    size = np.where(known, SIZE_MEASURED, np.where(estimated, SIZE_ESTIMATED, SIZE_UNKNOWN))
    return comm.with_columns(pl.Series("bus", bus), pl.Series("size", size), pl.Series("speed", speed))


def _steady_sizes(comm: pl.DataFrame, bus: np.ndarray, estimated: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Estimated sizes made the same for the same call of every iteration. A training loop makes the same calls
    with the same sizes every iteration; what their transfer times say varies with what else the hosts did (on a
    link limited by its hosts, an iteration's transfers can take twice another's). Each estimated call is the
    n-th of its op on its link in its iteration; all those of one (link, op, n) get their median estimate, scaled
    so that each link's total stays what its busy time at its speed moves."""
    rows = np.flatnonzero(estimated & comm.get_column("iteration").is_not_null().to_numpy())
    if rows.size == 0:
        return bus
    df = pl.DataFrame({"row": rows, "key": key[rows], "op": comm.get_column("op")[rows],
                       "it": comm.get_column("iteration")[rows], "t": comm.get_column("x_start")[rows],
                       "bus": bus[rows]})
    df = df.with_columns(pl.col("t").rank("ordinal").over(["key", "op", "it"]).alias("n"))
    df = df.with_columns(pl.col("bus").median().over(["key", "op", "n"]).alias("med"))
    df = df.with_columns((pl.col("med") * (pl.col("bus").sum() / pl.col("med").sum()).over("key")).alias("steady"))
    out = bus.copy()
    out[df.get_column("row").to_numpy()] = df.get_column("steady").fill_nan(None).fill_null(0.0).to_numpy()
    return out


def fifo_edges(comm: pl.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Consecutive transfers on each link (a rank's link per process group) in the order they went through it:
    ``(previous row, row, destination node)`` — the FIFO channel of Zhang et al. that a replay queues transfers
    on. A FIFO channel finishes its transfers in the order it serves them, so the order is the measured ends' (the
    graph's times of the end nodes, ``node_end``; the data's start breaks ties): never against the measured schedule,
    nor against a stream's own order (the data's start is not: on a straggler a call's data can seem to go out after
    the next call's, and an edge against a stream's order closes a cycle no replay gets out of). A send/recv pair is
    queued
    by its receive (the data has crossed when the receive ends, on the sender's link); the send itself is left out
    (it returns once its data is handed over)."""
    if comm.height == 0:
        return (np.zeros(0, np.int64),) * 3  # type: ignore[return-value]
    rows = np.flatnonzero(~(comm.get_column("send") == True).fill_null(False).to_numpy()) \
        if "send" in comm.columns else np.arange(comm.height)  # noqa: E712
    sub = comm.select("x_rank", "x_link", "x_start", "node_end")[rows]  # (not the table's every column copied)
    key = sub.select(pl.struct(["x_rank", "x_link"]).rank("dense")).to_series().to_numpy().astype(np.int64)
    a = comm.get_column("a").to_numpy()
    x_start = sub.get_column("x_start").to_numpy()
    ends = sub.get_column("node_end").to_numpy()
    order = np.lexsort((x_start, ends, key))
    same = key[order][1:] == key[order][:-1]
    prev, cur = rows[order[:-1][same]], rows[order[1:][same]]
    dst = 2 * a[cur] + 1
    return prev, cur, dst


def bus_factor(comm: pl.DataFrame, workers: int | None) -> np.ndarray:
    """Bus factor of every comm activity for its own group size or ``workers`` (NaN when unknown)."""
    n = pl.lit(workers, dtype=pl.Int64) if workers else pl.col("nranks").cast(pl.Int64)
    out = comm.with_columns(n.alias("_n")).select(bus_factor_expr(n="_n").alias("f"))
    return out.get_column("f").fill_null(np.nan).to_numpy()


def _bus_bytes(comm: pl.DataFrame, workers: int | None) -> np.ndarray:
    """Bus bytes of every comm activity, for its own group size or ``workers`` (NaN when unknown)."""
    n = pl.lit(workers, dtype=pl.Int64) if workers else pl.col("nranks").cast(pl.Int64)
    out = comm.with_columns(n.alias("_n")).select(bus_bytes_expr(nbytes="bytes", n="_n").alias("bus"))
    return out.get_column("bus").cast(pl.Float64).fill_null(np.nan).to_numpy()
