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
import os
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from tracekit.analysis import background, balance, link_classes
from tracekit.analysis.graph import contention, dag, replay
from tracekit.analysis.graph.comm_table import (
    HOST_NS_PER_BYTE,
    HOST_NS_PER_BYTE_MAX,
    SIZE_ESTIMATED,
    SIZE_MEASURED,
    SIZE_UNKNOWN,
    WIRE_EFFICIENCY,
    bus_factor,
    comm_activities,
    comm_table,
    consistent_members,
    fifo_edges,
    sizes_and_speeds,
    tail_edges,
)
from tracekit.analysis.graph.compute_leaves import compute_leaves
from tracekit.analysis.graph.dag import EDGE_TYPES, Graph, own_edges
from tracekit.analysis.intervals import distinct
from tracekit.model.units import count, format_duration, format_rate

_OWN = EDGE_TYPES.index("own")
_COLLECTIVE = EDGE_TYPES.index("collective")

#: replays that re-cost compute by the predicted schedule's overlap with transfers (a fixed-point iteration)
CONTENTION_ROUNDS = 2
#: encode + decode cost of gradient compression, ns per payload byte (about 15 ms for ResNet-50's
#: 102 MB, in the range Agarwal et al. (MLSys 2022) measured for PowerSGD / top-k on V100s)
DEFAULT_CODEC_NS_PER_BYTE = 0.15


@dataclass(frozen=True)
class Scenario:
    """One what-if question. ``None`` means "as the job ran".

    ``bandwidth_bps`` sets the line rate of every link; ``links`` sets it for the links of some process groups
    only — ``(selector, rate)`` pairs where the selector is a process group's name or description
    (``dp`` also matches DeviceMesh's ``mesh_dp``) or a link class (``intra``: every member on one host,
    ``inter``: across hosts) — and wins over ``bandwidth_bps`` where both apply."""

    bandwidth_bps: float | None = None
    compression: float = 1.0
    workers: int | None = None
    efficiency: str | float = "measured"  # "measured", "full" (= 1.0) or a number in (0, 1]
    codec_ns_per_byte: float = DEFAULT_CODEC_NS_PER_BYTE
    free: bool = False  # communication costs nothing (the reference for the scaling factor)
    links: tuple[tuple[str, float], ...] = ()
    bandwidth_scale: float = 1.0  # every link's rate (as set above, else as the job ran) times this
    #: every rank's work brought down to the median rank's (:mod:`tracekit.analysis.balance`): stragglers removed
    balanced: bool = False


#: :attr:`Model.iteration_of` of an activity that does not count towards an iteration's window
NOT_COUNTED = -(1 << 62)
#: how to get sizes, for every message that has to admit they are unknown
RECORD_SHAPES_HINT = ("record with tracekit.torch.profile(), which sets record_shapes=True, or give the job's NCCL "
                      "debug log (NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL)")


class UnknownSizes(ValueError):
    """A scenario needs transfer sizes that neither the traces nor a line rate can give."""


@dataclass
class Model:
    """Everything a scenario needs, computed once per job.

    ``comm`` has one row per communication activity: ``a`` (activity), ``rank``, ``transfer_ns`` (measured),
    ``op``, ``nranks``, ``instance``, ``link`` (its process group), ``link_class`` (``intra``/``inter``/null),
    ``bus`` (bus bytes at the job's group size; NaN when unknown), ``size`` (:data:`SIZE_MEASURED`,
    :data:`SIZE_ESTIMATED` from transfer time at the line rate, or :data:`SIZE_UNKNOWN`), ``line_rate_bps``
    (the rate its link ran at, NaN when not given) and ``speed`` (its link's measured bus bandwidth, bytes/ns).
    """

    graph: Graph | None  # None where the ranks' graphs are held apart (``remote`` replays them)
    comm: pl.DataFrame
    own_edge: np.ndarray  # per comm row: its own edge index
    coll_edges: np.ndarray  # collective edges, and the comm row of their destination
    coll_edge_row: np.ndarray
    iteration_of: np.ndarray  # per activity: its iteration (or a huge negative number)
    fifo: tuple[np.ndarray, np.ndarray, np.ndarray]  # consecutive transfers on a rank's link: (prev row, row, dst)
    line_rate_bps: float | None
    workers: int
    latency_ns: int
    measured_iteration_ns: int
    backend: str = "nccl"
    pg_desc: dict[str, str] = field(default_factory=dict)  # process group name -> description (pg_config)
    #: compute slowed by communication in flight (:mod:`tracekit.analysis.graph.contention`), and per compute activity
    #: its own edge, the duration it would take alone, and its rank
    contention: contention.Contention = contention.NONE
    compute_edge: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    compute_base: np.ndarray = field(default_factory=lambda: np.zeros(0))
    compute_act: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    #: the most host work per byte a measured link is credited with (None: :data:`HOST_NS_PER_BYTE_MAX` of the
    #: backend); a bound of :mod:`tracekit.analysis.ranges` sets 0 (all beyond the wire scales with the rate) or inf
    host_share_max: float | None = None
    #: the replays of a job whose ranks' graphs are held apart (:class:`tracekit.scale.rank_whatif.RankReplays`)
    remote: Any = None
    #: sync edges into a communication activity's end (:func:`tracekit.analysis.graph.comm_table.tail_edges`), the comm
    #: row of their destination, and their lag less that row's measured transfer (:func:`tail_weights`)
    tail_edges: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    tail_edge_row: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    tail_base: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def receiver(self) -> np.ndarray:
        """Per comm row: the receiving side of a matched send/recv pair (its link time is the sender's)."""
        if "send" not in self.comm.columns:
            return np.zeros(self.comm.height, dtype=bool)
        return (self.comm.get_column("send") == False).fill_null(False).to_numpy()  # noqa: E712

    @property
    def sizes(self) -> dict[str, Any]:
        """How the transfer sizes the model uses were obtained: counts per kind, and the assumption behind the
        estimated ones (``None`` when every size was recorded)."""
        size = self.comm.get_column("size")
        n = {k: int((size == k).sum()) for k in (SIZE_MEASURED, SIZE_ESTIMATED, SIZE_UNKNOWN)}
        note = None
        if n[SIZE_ESTIMATED]:
            host = HOST_NS_PER_BYTE.get(self.backend, 0.0)
            note = (f"transfer sizes of {n[SIZE_ESTIMATED]} of {count(self.comm.height, 'call')} are not in the "
                    "traces: they were estimated from the transfer times at the line rate the job ran on, assuming the "
                    f"link carried payload at {100 * WIRE_EFFICIENCY:.0f} % of it"
                    + (f" plus {host:g} ns of host work per byte ({self.backend})" if host else ""))
        elif n[SIZE_UNKNOWN]:
            note = (f"transfer sizes of {n[SIZE_UNKNOWN]} of {count(self.comm.height, 'call')} are not in the "
                    "traces and no line rate was given to estimate them from transfer times")
        return {**n, "calls": self.comm.height, "note": note}

    @property
    def balance(self) -> balance.Balance:
        """Each rank's work and its excess over the median rank's (computed on first use)."""
        if self.remote is not None:
            return self.remote.balance(self)
        if "_balance" not in self.__dict__:
            it = self.iteration_of
            n = int(distinct(it[it > -(1 << 61)]).size)
            self.__dict__["_balance"] = balance.measure(self.graph, n)
        return self.__dict__["_balance"]

    @property
    def scaling(self) -> balance.Scaling:
        """What removing every rank's excess (:attr:`balance`) does to the graph's edges (computed on first use)."""
        if "_scaling" not in self.__dict__:
            self.__dict__["_scaling"] = balance.scaling(self.graph, self.balance)
        return self.__dict__["_scaling"]

    @property
    def replayed_iteration_ns(self) -> int:
        """The job replayed as measured (:func:`predict` of ``Scenario()``, once per per-call latency): what the
        predictions' speed-ups are against, so that the model's own error cancels in them."""
        done = self.__dict__.setdefault("_replayed", {})
        if self.latency_ns not in done:
            done[self.latency_ns] = predict(self, Scenario())
        return done[self.latency_ns]

    @property
    def self_check(self) -> str:
        """How close the replay of the job as measured comes to the measured iteration: the model's self-check."""
        return self_check(self.measured_iteration_ns, self.replayed_iteration_ns)

    @property
    def line_rate_known(self) -> bool:
        """Whether every communication activity's link has a known line rate."""
        return bool(self.comm.height) and not self.comm.get_column("line_rate_bps").is_nan().any()


#: the least share of the line rate a protocol is credited with on a link's wire: a link measured slower than
#: this is busy with something that does not scale with its rate (cores shared with compute, a sender
#: starved of CPU), which is kept as a fixed cost per byte rather than multiplied by a slower rate
MIN_PROTOCOL_EFFICIENCY = 0.5


def build(events: pa.Table, collectives: pa.Table, ranks: pa.Table | None = None,
          members: pa.Table | None = None, instances: pa.Table | None = None,
          line_rate_bps: float | None = None, latency_ns: int | None = None, graph: Graph | None = None,
          line_rates: dict[str, float] | None = None, pg_desc: dict[str, str] | None = None,
          group_links: pa.Table | None = None, leaves: pl.DataFrame | None = None,
          consistent: pl.DataFrame | None = None) -> Model:
    """The dependency graph of the job (built here unless given) plus what re-costing transfers needs.

    ``line_rate_bps`` is the rate every link ran at; ``line_rates`` maps selectors
    (`tracekit.analysis.link_classes.selects`) to the rate of some links only, and wins where both apply.
    ``pg_desc`` names process groups' descriptions; ``group_links`` (GROUP_LINKS, from the job's NCCL logs) each
    group's link class and transport. ``leaves`` are the innermost compute operations the contention fit reads
    (:func:`compute_leaves`, job clock) where ``events`` are not at hand (a job analysed rank by rank,
    :mod:`tracekit.analysis.graph.compact`). ``consistent``: :func:`consistent_members` of the tables where the
    caller made it already."""
    inst = consistent if consistent is not None else consistent_members(members, instances, collectives)
    g = graph if graph is not None else dag.build(events, ranks, inst)
    acts, own_edge, transfer = comm_activities(g)
    # the contention fit's compute leaves come from the events alone: found on a second thread meanwhile
    compute = compute_mask(g)
    found_leaves = None
    if events is not None and compute.any() and acts.height and leaves is None:
        found_leaves = background.start(compute_leaves, events, g, name="tracekit-leaves")
    comm, backend, latency, workers = comm_table(acts, transfer, collectives, inst, members, ranks, line_rate_bps,
                                                 latency_ns, line_rates, pg_desc, group_links)
    a = comm.get_column("a").to_numpy()
    own_edge = own_edge[comm.get_column("_row").to_numpy()]
    comm = comm.drop("_row")
    row_of_act = np.full(g.act.height, -1, dtype=np.int64)
    row_of_act[a] = np.arange(a.size)
    coll_edges = np.flatnonzero(g.etype == _COLLECTIVE)
    coll_edge_row = row_of_act[g.dst[coll_edges] // 2]
    it = counted_iterations(g.act)
    descs = pg_desc or {}
    model = Model(graph=g, comm=comm, own_edge=own_edge, coll_edges=coll_edges,
                  coll_edge_row=coll_edge_row, iteration_of=it, fifo=fifo_edges(comm),
                  line_rate_bps=line_rate_bps, workers=workers,
                  latency_ns=latency,
                  measured_iteration_ns=0, backend=backend, pg_desc=dict(descs))
    model.tail_edges, model.tail_edge_row, model.tail_base = tail_edges(g, row_of_act, model.receiver)
    _measure_contention(model, own_edges(g), compute, found_leaves.result() if found_leaves is not None else leaves)
    model.measured_iteration_ns = iteration_time(model, g.node_time)
    return model


def counted_iterations(act: pl.DataFrame) -> np.ndarray:
    """Per activity: its iteration where it counts towards the iteration's window, else a huge negative number — the
    device work on ranks that have it, everything on CPU-only ranks (as :mod:`tracekit.analysis.iterations`
    counts)."""
    on_dev = act.get_column("device").is_not_null().to_numpy()
    dev_rank = np.isin(act.get_column("rank").to_numpy(), act.filter(pl.col("device").is_not_null())
                       .get_column("rank").unique().to_numpy())
    it = act.get_column("iteration").fill_null(NOT_COUNTED).to_numpy()
    return np.where(dev_rank & ~on_dev, NOT_COUNTED, it)


def compute_mask(g: Graph) -> np.ndarray:
    """Activities that are compute: device kernels on ranks with devices, CPU operators on CPU-only ranks."""
    act = g.act
    kind = act.get_column("kind")
    rank = act.get_column("rank").to_numpy()
    gpu = np.isin(rank, np.array(sorted(g.gpu_ranks), dtype=rank.dtype))
    is_compute = (kind == "compute").fill_null(False).to_numpy()
    return np.where(gpu, is_compute, (kind == "cpu_op").fill_null(False).to_numpy())


def _transfer_spans(model: Model, times: np.ndarray, new_t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of every communication activity's transfer in the schedule ``times`` (node times)."""
    a = model.comm.get_column("a").to_numpy()
    end = times[2 * a + 1]
    return np.maximum(end - new_t, times[2 * a]), end


def _measure_contention(model: Model, own_of_node: np.ndarray, compute: np.ndarray,
                        leaves: pl.DataFrame | None) -> None:
    """Fill the model's contention fields: fitted on the innermost compute operations of the trace (``leaves``,
    :func:`compute_leaves`; an operator with calls inside may hide a wait, which grows with communication in
    flight for another reason), applied to the graph's compute activities (``compute``, :func:`compute_mask`).
    Without the trace's events (``leaves`` None), fitted on those activities."""
    g = model.graph
    if not compute.any() or model.comm.height == 0:
        return
    t = model.comm.get_column("transfer_ns").to_numpy()
    cs, ce = _transfer_spans(model, g.node_time, t)
    crank = model.comm.get_column("rank").to_numpy()
    if leaves is None:
        leaves = g.act.filter(pl.Series(compute))
    if leaves.height == 0:
        return
    lf = contention.coverage(leaves.get_column("start").to_numpy(), leaves.get_column("end").to_numpy(),
                             leaves.get_column("rank").to_numpy(), cs, ce, crank)
    found = contention.measure(leaves, lf, np.ones(leaves.height, dtype=bool))
    model.contention = found
    if not found.measured or found.slowdown <= 1.0:
        return
    model.compute_act, model.compute_edge, model.compute_base = _compute_costs(model, own_of_node, compute,
                                                                               found.slowdown)


def _compute_costs(model: Model, own_of_node: np.ndarray, compute: np.ndarray, slowdown: float
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The compute activities a replay re-costs under ``slowdown``: their indices, own edges and the durations they
    would take alone (from their measured overlap with transfers)."""
    g = model.graph
    cs, ce = _transfer_spans(model, g.node_time, model.comm.get_column("transfer_ns").to_numpy())
    idx = np.flatnonzero(compute)
    f = contention.coverage(g.node_time[2 * idx], g.node_time[2 * idx + 1], g.act.get_column("rank").to_numpy()[idx],
                            cs, ce, model.comm.get_column("rank").to_numpy())
    edge = own_of_node[2 * idx + 1]
    ok = edge >= 0
    return idx[ok], edge[ok], contention.base(g.lag[edge[ok]].astype(np.float64), f[ok], slowdown)


def recost_compute(model: Model, slowdown: float) -> Model:
    """``model`` with compute slowed by ``slowdown`` while communication is in flight (a bound of the contention
    fit, :mod:`tracekit.analysis.ranges`); the graph is shared, not copied."""
    found = replace(model.contention, slowdown=slowdown, measured=True)
    if model.remote is not None:  # its hosts re-cost their ranks' compute under the scenarios' slowdown
        return replace(model, contention=found)
    g = model.graph
    act, edge, base = _compute_costs(model, own_edges(g), compute_mask(g), slowdown)
    return replace(model, contention=found, compute_act=act, compute_edge=edge, compute_base=base)


def with_host_share(model: Model, host_ns_per_byte: float) -> Model:
    """``model`` with the transfer sizes it estimated from time estimated again, taking ``host_ns_per_byte`` of each
    byte's time as host work (0: all of it on the wire) — a bound of what estimated sizes rest on."""
    comm = sizes_and_speeds(model.comm.drop("bus", "size", "speed"), model.backend, model.latency_ns,
                             host_ns_per_byte=host_ns_per_byte)
    return replace(model, comm=comm)


def transfers(model: Model, sc: Scenario) -> np.ndarray:
    """New transfer time (ns) of every communication activity under ``sc``, each on its own.

    Raises :class:`UnknownSizes` when the scenario changes a transfer whose size is unknown (no size in the
    traces and no line rate to estimate it from), and ``ValueError`` when it needs a line rate nobody gave."""
    t = _column(model, "transfer_ns").astype(np.float64)
    if sc.free:
        return np.zeros_like(t)
    r_line = _column(model, "line_rate_bps")
    r_new = np.full(t.size, float(sc.bandwidth_bps) if sc.bandwidth_bps else np.nan)
    r_new = np.where(np.isnan(r_new), r_line, r_new)
    for sel, r in sc.links:
        hit = _selected(model, sel)
        if not hit.any():
            raise ValueError(f"no link matches {sel!r}: give a process group's name or description "
                             f"({', '.join(_link_names(model)) or 'none named'}), intra or inter, or a transport of "
                             f"the job's NCCL logs ({', '.join(_transport_names(model)) or 'none known: give its '}"
                             f"{'' if _transport_names(model) else 'NCCL_DEBUG=INFO log'})")
        r_new[hit] = r
    r_new = r_new * sc.bandwidth_scale
    c = max(sc.compression, 1.0)
    job_factor = _factor(model, None)
    new_factor = _factor(model, sc.workers)
    bus = _column(model, "bus")
    new_bus = bus * np.where(job_factor > 0, new_factor / np.where(job_factor > 0, job_factor, 1.0), 0.0)
    payload = bus / np.where(job_factor > 0, job_factor, np.nan)
    codec = sc.codec_ns_per_byte * np.nan_to_num(payload) if c > 1 else 0.0
    changed = (~np.isclose(r_new, r_line) & ~(np.isnan(r_new) & np.isnan(r_line))) | (c > 1) \
        | (sc.workers is not None and sc.workers != model.workers) | (sc.efficiency != "measured")
    if sc.efficiency == "measured":
        need = changed & ~np.isnan(r_new) & np.isnan(r_line)
        if need.any():
            raise ValueError("efficiency='measured' needs the line rate the job ran on (link_bw=)")
        speed = _column(model, "speed")
        wire = 8e9 / (WIRE_EFFICIENCY * r_line)  # ns per byte on the wire
        per_byte = 1.0 / np.maximum(speed, 1e-12)
        # what the link lost beyond the wire: host work per byte up to what the backend's hosts plausibly
        # spend, the rest the protocol's inefficiency on the wire, which scales with the line rate
        cap = HOST_NS_PER_BYTE_MAX.get(model.backend, 0.0) if model.host_share_max is None else model.host_share_max
        host = np.minimum(np.maximum(per_byte - wire, 0.0), cap)
        eta = np.minimum(wire / np.maximum(per_byte - host, 1e-12), 1.0)
        starved = eta < MIN_PROTOCOL_EFFICIENCY
        eta = np.where(starved, MIN_PROTOCOL_EFFICIENCY, eta)
        host = np.where(starved, per_byte - wire / MIN_PROTOCOL_EFFICIENCY, host)
        speed = np.where(np.isnan(r_line) | np.isnan(r_new), speed,
                         1.0 / (8e9 / (WIRE_EFFICIENCY * r_new) / eta + host))
    else:
        eta = 1.0 if sc.efficiency == "full" else float(sc.efficiency)
        if np.isnan(r_new).any():
            raise ValueError("efficiency='full' needs a line rate (bandwidth= or link_bw=)")
        speed = eta * r_new / 8e9  # bytes per ns
    unknown = np.isnan(new_bus) | np.isnan(speed)
    if (unknown & changed).any():
        raise UnknownSizes("the transfer sizes are not in the traces, so another link cannot be costed: pass "
                           "link_bw= (the line rate the job ran on) to estimate them from transfer times, or "
                           + RECORD_SHAPES_HINT)
    new = model.latency_ns + new_bus / (c * np.maximum(np.nan_to_num(speed, nan=1.0), 1e-12)) + codec
    # the send of a pair takes what it measured, changed by how much longer or shorter its data now is on the
    # wire: what it spent on a late receiver stays
    sender = _column(model, "sender")
    if sender.any():
        before = model.latency_ns + bus / np.maximum(np.nan_to_num(_column(model, "speed"), nan=1.0), 1e-12)
        new = np.where(sender, np.maximum(t + new - before, model.latency_ns), new)
    # calls the scenario leaves alone and whose size is unknown keep their measured cost
    return np.where(unknown, t, new)


def _column(model: Model, name: str) -> np.ndarray:
    """A column of the model's communication rows as numpy (``sender``: the sending side of a pair), read once per
    model: every scenario of a grid reads the same ones."""
    cols = model.__dict__.setdefault("_columns", {})
    if name not in cols:
        comm = model.comm
        cols[name] = ((comm.get_column("send") == True).fill_null(False).to_numpy() if "send" in comm.columns  # noqa: E712
                      else np.zeros(comm.height, dtype=bool)) if name == "sender" else comm.get_column(name).to_numpy()
    return cols[name]


def _factor(model: Model, workers: int | None) -> np.ndarray:
    """:func:`bus_factor` of the model's communication rows for ``workers`` (computed once per model and count)."""
    factors = model.__dict__.setdefault("_factors", {})
    if workers not in factors:
        factors[workers] = bus_factor(model.comm, workers)
    return factors[workers]


def _selected(model: Model, selector: str) -> np.ndarray:
    """Which of the model's communication rows ``selector`` names (`tracekit.analysis.link_classes.selects`;
    once per model and selector)."""
    hits = model.__dict__.setdefault("_selected", {})
    if selector not in hits:
        hits[selector] = link_classes.selected(model.comm, selector, model.pg_desc)
    return hits[selector]


def _transport_names(model: Model) -> list[str]:
    """The transports of this job's links, as the NCCL logs name them (none without a log)."""
    return sorted(set(model.comm.get_column("transport").drop_nulls().to_list())) \
        if "transport" in model.comm.columns else []


def _link_names(model: Model) -> list[str]:
    """The selectors a user can give for this job's links."""
    names = sorted(set(model.comm.get_column("link").drop_nulls().to_list()))
    out = [f"{n} ({model.pg_desc[n]})" if model.pg_desc.get(n) else n for n in names]
    return out[:8] + (["…"] if len(out) > 8 else [])


@dataclass(frozen=True)
class Schedule:
    """A replayed schedule: node times, the graph's edge weights it used and the replay's own extra edges
    (``src, dst, weight``: transfers queued on a link), enough to follow its critical path
    (:func:`tracekit.analysis.graph.critical_path.of_schedule`)."""

    times: np.ndarray
    weight: np.ndarray
    extra: tuple[np.ndarray, np.ndarray, np.ndarray] | None


def predict(model: Model, sc: Scenario) -> int:
    """Predicted iteration time (ns) under ``sc``: transfers re-costed and queued one after the other on
    their rank's link (Zhang et al.'s FIFO channel), everything else as measured."""
    if model.remote is not None:
        return predict_many(model, [sc])[0]
    return iteration_time(model, schedule(model, sc).times)


def _changes(model: Model, sc: Scenario) -> tuple[np.ndarray, np.ndarray, tuple | None, np.ndarray]:
    """What ``sc`` changes of the measured schedule: the graph's edges it re-weights and their weights, its extra
    edges (``src, dst, weight``: transfers queued on their link; None with free communication) and every
    communication activity's new transfer time."""
    g = model.graph
    new_t = np.rint(transfers(model, sc)).astype(np.int64)
    # the receiver of a send/recv pair: the data's time is on the edge from the send; its own edge is local work
    valid = (model.own_edge >= 0) & ~model.receiver
    ok = model.coll_edge_row >= 0
    edges = [model.own_edge[valid], model.coll_edges[ok]]
    weights = [new_t[valid] + g.slack[edges[0]], new_t[model.coll_edge_row[ok]] + g.slack[edges[1]]]
    edges.append(model.tail_edges)
    weights.append(tail_weights(model.tail_base, new_t[model.tail_edge_row], g.slack[model.tail_edges]))
    if sc.balanced:
        edges.append(_balanced(model)[0])
        weights.append(_balanced(model)[1])
    extra = None
    if not sc.free:
        prev, cur, dst = queued(model)
        extra = (2 * model.comm.get_column("a").to_numpy()[prev] + 1, dst, new_t[cur])
    return np.concatenate(edges), np.concatenate(weights), extra, new_t


def tail_weights(base: np.ndarray, transfer: np.ndarray, slack: np.ndarray) -> np.ndarray:
    """The weights of sync edges into communication activities' ends (:attr:`Model.tail_edges`) under new transfers:
    the call's time after its blocking wait with the measured transfer replaced by the new one, and no more than the
    new transfer — time beyond it there was waiting for the other members, which the collective edges carry (kept in
    the lag, a late member removed from the job would still hold the call's end)."""
    return np.maximum(np.minimum(base, 0) + transfer, 0) + slack


def queued(model: Model) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The transfers queued on their link in a replay (:attr:`Model.fifo`): a transfer of unknown size keeps its
    measured time, which already includes sharing the link with concurrent transfers, so it is not queued (that
    would count it twice)."""
    prev, cur, dst = model.fifo
    sized = model.comm.get_column("size").to_numpy() != SIZE_UNKNOWN
    q = sized[prev] & sized[cur]
    return prev[q], cur[q], dst[q]


def _balanced(model: Model) -> tuple[np.ndarray, np.ndarray]:
    """The edges "stragglers removed" re-weights (:func:`tracekit.analysis.balance.apply`) and their weights
    (computed once per model)."""
    if "_balanced" not in model.__dict__:
        w = model.graph.weight()
        balance.apply(model.graph, model.scaling, w)
        e = np.flatnonzero(w != model.graph.weight())
        model.__dict__["_balanced"] = (e, w[e])
    return model.__dict__["_balanced"]


def schedule(model: Model, sc: Scenario) -> Schedule:
    """The replayed schedule under ``sc`` (see :func:`predict`); only of a model that holds its graph."""
    g = model.graph
    if g is None:
        raise TypeError("a schedule of every node needs the job's graph, which this model's hosts hold apart")
    w = g.weight()  # a new array: this prediction's own
    edges, weights, extra, new_t = _changes(model, sc)
    w[edges] = weights
    base = model.compute_base
    if sc.balanced and base.size:
        base = base * model.scaling.act_factor[model.compute_act]
    times, _ = replay.replay(g, w, extra=extra)
    if model.compute_act.size:  # compute slowed by transfers in flight: re-cost it by the new overlap
        rank = g.act.get_column("rank").to_numpy()
        crank = model.comm.get_column("rank").to_numpy()
        a = model.compute_act
        for _ in range(CONTENTION_ROUNDS):
            cs, ce = _transfer_spans(model, times, new_t) if not sc.free else (np.zeros(0, np.int64),) * 2
            f = contention.coverage(times[2 * a], times[2 * a + 1], rank[a], cs, ce, crank[:cs.size])
            w[model.compute_edge] = np.rint(contention.recost(base, f, model.contention.slowdown)
                                            ).astype(np.int64) + g.slack[model.compute_edge]
            times, _ = replay.replay(g, w, extra=extra)
    return Schedule(times, w, extra)


#: replays run at once by :func:`predict_many` (each holds a few arrays of the graph's nodes and edges)
PARALLEL_REPLAYS = 4
#: scenarios of one plan that :func:`predict_many` answers by the compiled grid (:func:`tracekit.engine.grid`:
#: its layout costs about two replays, each scenario then a sweep without an array of the graph's size)
GRID_SCENARIOS = 4


def predict_many(model: Model, scenarios: list[Scenario]) -> list[int]:
    """:func:`predict` of each scenario, in that order (the same predictions as one after the other). On a graph
    the engine takes (:func:`tracekit.analysis.graph.dag.engine`) and without contention to re-cost, the scenarios of
    one plan (free communication, or links with queues) run as one compiled grid when there are enough of them
    (:data:`GRID_SCENARIOS`); the rest replay on as many threads as there are cores (up to
    :data:`PARALLEL_REPLAYS`): the replays run without the GIL, and the scenarios are independent. A model whose
    ranks' graphs are held apart replays them all on its hosts (:attr:`Model.remote`)."""
    if model.remote is not None:
        return [b.period() for b in model.remote.replay([(model, sc) for sc in scenarios])]
    out: dict[int, int] = {}
    compiled = dag.engine(model.graph.n_nodes) is not None
    if compiled and not model.compute_act.size:
        for free in (True, False):
            idx = [i for i, sc in enumerate(scenarios) if sc.free == free]
            if len(idx) >= GRID_SCENARIOS:
                out.update(zip(idx, _grid_times(model, [scenarios[i] for i in idx]) or [], strict=False))
    rest = [i for i in range(len(scenarios)) if i not in out]
    first = {scenarios[i].free: scenarios[i] for i in reversed(rest)}  # of each plan, its first scenario
    for free in sorted(first) if compiled else ():  # each plan made once, before threads share it (queues' first:
        try:                                         # free communication's replays take the same plan)
            replay.plan(model.graph, _changes(model, first[free])[2])
        except ValueError:  # a scenario nobody can cost: its prediction raises, in its turn
            continue
    workers = min(len(rest), os.cpu_count() or 1, PARALLEL_REPLAYS)
    if workers < 2:
        out.update((i, predict(model, scenarios[i])) for i in rest)
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(workers, thread_name_prefix="tracekit-replay") as pool:
            out.update(zip(rest, pool.map(lambda i: predict(model, scenarios[i]), rest), strict=True))
    return [out[i] for i in range(len(scenarios))]


def _grid_times(model: Model, scenarios: list[Scenario]) -> list[int] | None:
    """The iteration times of scenarios of one plan (all free, or none) by the compiled grid
    (:func:`tracekit.analysis.graph.replay.iteration_times`), or None where it cannot give them."""
    changes = [_changes(model, sc)[:3] for sc in scenarios]
    return replay.iteration_times(model.graph, changes, model.iteration_of, min(os.cpu_count() or 1,
                                                                                  PARALLEL_REPLAYS))


def iteration_time(model: Model, times: np.ndarray) -> int:
    """Median time between consecutive iteration starts (one iteration: its span):
    `tracekit.analysis.graph.replay.period`
    of the model's iterations, the figure `tracekit.analysis.iterations.period` gives of the measured job."""
    return replay.period(model.graph, times, model.iteration_of)


def self_check(measured_ns: int | None, replayed_ns: int | None) -> str:
    """The model's self-check as a sentence: how far its replay of the job as measured is from the measured
    iteration ("the model replays the measured job within 1.7 % (237 ms against 233 ms measured)")."""
    if not measured_ns or not replayed_ns:
        return "The model's replay of the job as measured has no iteration time to check."
    off = abs(replayed_ns / measured_ns - 1)
    within = f"{100 * off:.1f} %" if off >= 0.001 else "0.1 %"
    return (f"The model replays the measured job within {within} ({format_duration(replayed_ns)} against "
            f"{format_duration(measured_ns)} measured).")


def sweep(model: Model, scenarios: list[Scenario]) -> pl.DataFrame:
    """Rows ``bandwidth_bps, compression, workers, efficiency, links, stragglers_removed, iteration_ns, speedup,
    scaling_factor`` (``bandwidth_bps`` NaN where links keep different rates; ``links`` the per-link rates a scenario
    set; ``stragglers_removed`` whether every rank's excess over the median rank's work was removed). ``speedup`` is
    against the job replayed as measured (:attr:`Model.replayed_iteration_ns`: the model's own error cancels), never
    against the measured iteration, from which the replay may differ (:attr:`Model.self_check`)."""
    free, *predicted = predict_many(model, [Scenario(free=True), *scenarios])
    return sweep_rows(model, scenarios, free, predicted)


def sweep_rows(model: Model, scenarios: list[Scenario], free: int, predicted: list[int]) -> pl.DataFrame:
    """:func:`sweep`'s rows from the replays already made: ``free`` with free communication, ``predicted`` one per
    scenario."""
    now = model.replayed_iteration_ns
    rows = []
    for sc, t in zip(scenarios, predicted, strict=True):
        rows.append({
            "bandwidth_bps": (sc.bandwidth_bps or model.line_rate_bps or math.nan) * sc.bandwidth_scale,
            "compression": sc.compression,
            "workers": sc.workers or model.workers,
            "efficiency": str(sc.efficiency),
            "links": ",".join(f"{k}={format_rate(v)}" for k, v in sc.links) or None,
            "stragglers_removed": sc.balanced,
            "iteration_ns": t,
            "speedup": now / t if t else math.inf,
            "scaling_factor": free / t if t else 1.0,
        })
    return pl.DataFrame(rows, schema={"bandwidth_bps": pl.Float64, "compression": pl.Float64, "workers": pl.Int64,
                                      "efficiency": pl.String, "links": pl.String, "stragglers_removed": pl.Boolean,
                                      "iteration_ns": pl.Int64,
                                      "speedup": pl.Float64, "scaling_factor": pl.Float64})
