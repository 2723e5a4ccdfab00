"""One rank's share of the what-if (:mod:`tracekit.analysis.graph.whatif`) where the rank's graph is held apart
(:class:`tracekit.analysis.graph.crossings.RankGraph`): the rows of its communication activities the client's model is
made from, its work for the balance, and its part of a replay (:mod:`tracekit.engine.parts`) under any of the model's
scenarios — every edge weighted where the rank is, as :func:`tracekit.analysis.graph.whatif.schedule` weights the
job's graph, and what each iteration's window is in the replayed schedule.

The client sends what crosses ranks: each communication activity's new transfer per scenario, the transfers queued
after another on a link (:attr:`tracekit.analysis.graph.whatif.Model.fifo`: an edge between two ranks where a send/recv
pair's receive queues behind another receiver's, through a hub of its own) and the balance's factors per operation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import polars as pl

from tracekit.analysis import balance
from tracekit.analysis.graph import contention, whatif
from tracekit.analysis.graph.comm_table import tail_edges
from tracekit.analysis.graph.crossings import Crossings, RankGraph
from tracekit.analysis.graph.dag import own_edges
from tracekit.analysis.graph.parts import Extra, rank_part
from tracekit.analysis.intervals import runs

#: the weight of an edge a scenario leaves out (the queues, when communication is free): it never wins a max
OFF = -(1 << 62)


def comm_rows(rg: RankGraph) -> pl.DataFrame:
    """The rank's communication activities as :func:`tracekit.analysis.graph.whatif.comm_activities` gives them
    (``a`` the activity in the rank's graph), with the transfer each carries (``transfer_ns``)."""
    acts, _, transfer = whatif.comm_activities(rg.graph)
    return acts.with_columns(pl.Series("transfer_ns", transfer))


def work(rg: RankGraph) -> balance.Work:
    """The rank's work (:func:`tracekit.analysis.balance.work`), its operations keyed by their names' text."""
    return balance.work(rg.graph, text=True)


@dataclass(frozen=True)
class Queues:
    """The transfers queued after another that touch one rank (:attr:`tracekit.analysis.graph.whatif.Model.fifo`, those
    a replay queues): into the rank, the model's ``row`` of the queued transfer and ``dst`` its activity here, after
    ``src`` (an activity here, or -1) or hub ``hub`` (the end of a transfer on another rank); out of the rank, the
    activities ``out`` whose end is hub ``out_hub`` for another rank's queue."""

    row: np.ndarray
    dst: np.ndarray
    src: np.ndarray
    hub: np.ndarray
    out: np.ndarray
    out_hub: np.ndarray


@dataclass(frozen=True)
class Job:
    """One replay: ``transfer`` (ns, per row of the model's communication table: each transfer's new time), whether
    communication is free (no queues), whether every rank's excess is removed, and how much slower compute runs
    while communication is in flight (1: as measured, not re-costed)."""

    transfer: np.ndarray
    free: bool = False
    balanced: bool = False
    slowdown: float = 1.0


class RankReplay:
    """One rank's part of the job's replay and what a :class:`Job` re-weights of it. ``rows``: per communication
    activity of the rank (:func:`comm_rows` order) its row of the model's table; ``receiver`` per row of that table,
    whether it is the receiving side of a pair (its own edge is local work, left as measured); ``t0`` the time every
    host measures from (the replay runs on offsets from it)."""

    def __init__(self, rg: RankGraph, cross: Crossings, rows: np.ndarray, receiver: np.ndarray, queues: Queues,
                 t0: int) -> None:
        g = rg.graph
        self.rg, self.t0 = rg, t0
        n_edges = g.src.size
        acts, own_edge, self.comm_transfer = whatif.comm_activities(g)
        a = acts.get_column("a").to_numpy()
        row_of = np.full(rg.activities, -1, np.int64)
        row_of[a] = rows
        keep = ~receiver[rows] & (own_edge >= 0)
        self.own_edge, self.own_row = own_edge[keep], rows[keep]
        coll = np.arange(rg.coll_first, rg.coll_first + rg.coll_edge.size)
        self.coll_edge, self.coll_row = coll, row_of[g.dst[coll] // 2]
        self.tail_edge, self.tail_row, self.tail_base = tail_edges(g, row_of, receiver)
        same = queues.src >= 0
        extra = Extra(own_src=2 * queues.src[same] + 1, own_dst=2 * queues.dst[same] + 1, tgt_hub=queues.hub[~same],
                      tgt_dst=2 * queues.dst[~same] + 1, mem_node=2 * queues.out + 1, mem_hub=queues.out_hub)
        part, emap = rank_part(rg, cross, extra)
        self.part = replace(part, start=part.start - t0)
        self.emap = emap
        # the queued edges among the weights: the rank's edges, then the queues from here, then those from hubs
        self.queue_row = np.concatenate([queues.row[same], queues.row[~same]])
        self.n_edges = n_edges
        it = whatif.counted_iterations(g.act)
        ok = np.flatnonzero(it != whatif.NOT_COUNTED)
        self.comm_a, self.comm_rows = a, rows  # the rank's communication activities and their rows
        self.counted = ok[np.argsort(it[ok], kind="stable")]  # the counted activities by iteration
        self.iterations, bounds = runs(it[self.counted])  # type: ignore[misc]  (sorted: never None)
        self.bounds = bounds[:-1]  # where each iteration's run begins
        self.scaling: balance.Scaling | None = None
        ok = self.coll_row >= 0
        #: the edges whose weight a job sets (:meth:`graph_weights`' numbering: the communication activities' own
        #: edges, the collective edges into the rank, the sync edges into their ends, the queues), in
        #: :meth:`set_weights`' order; every other edge weighs its :meth:`base_weights` under every job without a
        #: slowdown to re-cost
        self.set_edges = np.concatenate([self.own_edge, self.coll_edge[ok], self.tail_edge,
                                         n_edges + np.arange(self.queue_row.size)])
        #: per edge of :attr:`set_edges`, whether the balance scales it (a balanced job weighs it as its base does:
        #: the balance applies after the transfers are set)
        self.balance_scaled = np.zeros(self.set_edges.size, bool)

    def balance(self, b: balance.Balance) -> None:
        """Take the balance's factors (those of this rank's operations and its gaps)."""
        s = self.scaling = balance.scaling(self.rg.graph, b, text=True)
        scaled = s.own_edge[(s.act_factor < 1.0) & (s.own_edge >= 0)]
        self.balance_scaled = np.isin(self.set_edges, np.concatenate([scaled, s.gap_edges[s.gap_factor < 1.0]]))

    def _transfer_spans(self, times: np.ndarray, transfer: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each communication activity's transfer in the schedule ``times`` (per node) as
        :func:`tracekit.analysis.graph.whatif._transfer_spans` has it."""
        end = times[2 * self.comm_a + 1]
        return np.maximum(end - transfer, times[2 * self.comm_a]), end

    def samples(self, leaves: pl.DataFrame) -> tuple[pl.DataFrame, int]:
        """The contention fit's samples of the rank (:func:`tracekit.analysis.graph.contention.samples`) from its
        compute leaves (``rank, iteration, name, start, end``, job clock) and its measured transfers."""
        cs, ce = self._transfer_spans(self.rg.graph.node_time, self.comm_transfer)
        lf = contention.coverage(leaves.get_column("start").to_numpy(), leaves.get_column("end").to_numpy(),
                                 np.zeros(leaves.height, np.int64), cs, ce, np.zeros(cs.size, np.int64))
        return contention.samples(leaves.with_columns(pl.col("name").cast(pl.String)), lf,
                                  np.ones(leaves.height, dtype=bool))

    def _compute(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The compute activities a slowdown re-costs (:func:`tracekit.analysis.graph.whatif._compute_costs`): their
        indices, own edges, measured lags and measured overlap with the rank's transfers (made once)."""
        if "_costs" not in self.__dict__:
            g = self.rg.graph
            idx = np.flatnonzero(whatif.compute_mask(g))
            edge = own_edges(g)[2 * idx + 1]
            ok = edge >= 0
            cs, ce = self._transfer_spans(g.node_time, self.comm_transfer)
            f = contention.coverage(g.node_time[2 * idx], g.node_time[2 * idx + 1], np.zeros(idx.size, np.int64), cs,
                                    ce, np.zeros(cs.size, np.int64))
            self.__dict__["_costs"] = (idx[ok], edge[ok], g.lag[edge[ok]].astype(np.float64), f[ok])
        return self.__dict__["_costs"]

    def set_weights(self, jobs: list[Job]) -> np.ndarray:
        """:meth:`graph_weights` of :attr:`set_edges` (× ``jobs``), without a slowdown re-costed; a balanced job's
        weights of the edges the balance scales are its :meth:`base_weights`' (:attr:`balance_scaled`)."""
        g = self.rg.graph
        ok = self.coll_row >= 0
        own, coll, tail = self.own_edge.size, int(ok.sum()), self.tail_edge.size
        slack_own, slack_coll = g.slack[self.own_edge], g.slack[self.coll_edge[ok]]
        coll_row = self.coll_row[ok]
        out = np.empty((own + coll + tail + self.queue_row.size, len(jobs)), np.int64)
        for i, job in enumerate(jobs):
            t = job.transfer
            out[:own, i] = t[self.own_row] + slack_own
            out[own:own + coll, i] = t[coll_row] + slack_coll
            out[own + coll:own + coll + tail, i] = whatif.tail_weights(self.tail_base, t[self.tail_row],
                                                                      g.slack[self.tail_edge])
            out[own + coll + tail:, i] = OFF if job.free else t[self.queue_row]
        return out

    def base_weights(self, balanced: bool) -> np.ndarray:
        """:meth:`graph_weights` of the edges a job leaves alone: as measured (the queues: 0), or with every rank's
        excess removed."""
        g = self.rg.graph
        w = np.concatenate([g.weight(), np.zeros(self.queue_row.size, np.int64)])
        if balanced:
            if self.scaling is None:
                raise RuntimeError("a balanced replay before the balance's factors came")
            balance.apply(g, self.scaling, w)
        return w

    def graph_weights(self, job: Job, times: np.ndarray | None = None) -> np.ndarray:
        """One job's weight of every edge of the rank's graph, then the queues: its :meth:`base_weights` with the edges
        it sets written over them; with ``times`` (the part's nodes in the replay before), the compute of a job with a
        slowdown re-costed by its overlap with the transfers there (one round of
        :func:`tracekit.analysis.graph.whatif.schedule`'s)."""
        g = self.rg.graph
        t = job.transfer
        w = self.base_weights(job.balanced)
        kept = ~self.balance_scaled if job.balanced else slice(None)
        w[self.set_edges[kept]] = self.set_weights([job])[kept, 0]
        if times is not None and job.slowdown > 1.0:
            act, edge, lag, f0 = self._compute()
            alone = contention.base(lag, f0, job.slowdown)
            if job.balanced:
                alone = alone * self.scaling.act_factor[act]  # type: ignore[union-attr]
            if job.free:
                f = np.zeros(act.size)
            else:
                cs, ce = self._transfer_spans(times, t[self.comm_rows])
                f = contention.coverage(times[2 * act], times[2 * act + 1], np.zeros(act.size, np.int64), cs, ce,
                                        np.zeros(cs.size, np.int64))
            w[edge] = np.rint(contention.recost(alone, f, job.slowdown)).astype(np.int64) + g.slack[edge]
        return w

    def spans(self, times: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per iteration counted here (ascending), the earliest start and the latest end of its counted activities in
        each replayed schedule (``times``: the part's nodes × jobs): ``(iterations, starts, ends)``, jobs × iterations,
        on the job clock."""
        if self.counted.size == 0:
            none = np.zeros((times.shape[1], 0), np.int64)
            return self.iterations, none, none
        s = times[2 * self.counted] + self.t0
        e = times[2 * self.counted + 1] + self.t0
        return (self.iterations, np.minimum.reduceat(s, self.bounds, axis=0).T.copy(),
                np.maximum.reduceat(e, self.bounds, axis=0).T.copy())


def replayed(rg: RankGraph, cross: Crossings, src: np.ndarray, times: np.ndarray, weight: np.ndarray,
             m_start: np.ndarray) -> RankGraph:
    """The rank's graph as a replay scheduled it (:func:`tracekit.analysis.graph.critical_path.of_schedule` of the
    job's graph, restricted to the rank): its activities at ``times`` (job clock) under edge weights ``weight``, each
    collective edge into it from ``src`` (per edge of ``cross``: the member it leaves in this schedule, the latest of a
    hub's), a member of another rank as a ghost at its start in the schedule (``m_start``, per member)."""
    from tracekit.analysis.graph.critical_path import of_schedule
    from tracekit.analysis.graph.dag import Graph

    g = rg.graph
    k = rg.activities
    rank = cross.members.get_column("rank").to_numpy()
    m_a = cross.members.get_column("a").to_numpy()
    own_rank = rank[cross.dst[rg.coll_edge[0]]] if rg.coll_edge.size else None
    c_src_m = src[rg.coll_edge]
    foreign = rank[c_src_m] != own_rank
    ghost = np.unique(c_src_m[foreign])
    new_src = g.src.copy()
    new_src[rg.coll_first:rg.coll_first + rg.coll_edge.size] = np.where(
        foreign, 2 * k + np.searchsorted(ghost, c_src_m), 2 * m_a[c_src_m])
    node_time = np.concatenate([times, m_start[ghost]])
    base = Graph(act=g.act, src=new_src, dst=g.dst, lag=g.lag, etype=g.etype, node_time=node_time, binding=g.binding,
                 slack=g.slack, violated={}, gap=g.gap, kind=g.kind)
    base.__dict__["_lists"] = g.__dict__.setdefault("_lists", {})  # the same activities: what paths read of them
    return RankGraph(graph=of_schedule(base, node_time, weight), ghost=ghost, member_of=rg.member_of,
                     coll_first=rg.coll_first, coll_edge=rg.coll_edge)
