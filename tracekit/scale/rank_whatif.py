"""The what-if of a job analysed rank by rank without combining its graph: the client holds the model's table of
communication activities (a row per call, made from the hosts' rows by the same code as the job graph's,
:func:`tracekit.analysis.graph.comm_table.comm_table`) and what crosses ranks; the ranks' graphs stay on the hosts
(:mod:`tracekit.scale.rank_parts`), which replay their parts collective by collective (:mod:`tracekit.scale.exchange`)
under each scenario's transfers and report each iteration's window. The predictions equal the combined graph's.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from tracekit.analysis import balance, iterations
from tracekit.analysis.graph import collective_edges, comm_table, contention, critical_path, parts, whatif
from tracekit.analysis.graph.rank_model import Job, Queues
from tracekit.analysis.graph.whatif import Model, Scenario
from tracekit.analysis.intervals import Grouped
from tracekit.scale import exchange
from tracekit.scale.rank_paths import JobTables, RankPaths

#: jobs one replay of the hosts' parts runs at once, at most (each holds its weights and times per edge and node of
#: every part) ...
REPLAY_BATCH = 8
#: ... and as many as fit this many bytes on the host with the most ranks' edges and nodes (besides its graphs)
REPLAY_BYTES = 512 << 20
#: bytes a job's replay holds per edge (its weights) and per node (its times)
BYTES_PER_EDGE, BYTES_PER_NODE = 8, 8


@dataclass
class Bounds:
    """A replayed schedule's counted activities per rank and iteration: the earliest start and latest end."""

    iteration: np.ndarray
    start: np.ndarray
    end: np.ndarray

    def period(self) -> int:
        """The schedule's iteration time (:func:`tracekit.analysis.iterations.period`, the figure
        :func:`tracekit.analysis.graph.replay.period` gives of the whole schedule)."""
        return iterations.period(self.iteration, self.start, self.end)

    def spans(self) -> pl.DataFrame:
        """:func:`tracekit.analysis.graph.critical_path.schedule_spans` of the schedule."""
        return critical_path.bounds_spans(self.iteration, self.start, self.end)


class RankReplays:
    """The replays of a model whose ranks' graphs are held on ``paths``' hosts (its :attr:`Model.remote`)."""

    def __init__(self, paths: RankPaths, members: np.ndarray, local: np.ndarray, t0: int, batch: int) -> None:
        self.paths, self.t0, self.members, self.local, self.batch = paths, t0, members, local, batch
        self._balance: balance.Balance | None = None
        self.hub_times = np.zeros((0, 0), np.int64)  # the last batch's hubs' times (× its jobs; offsets from t0)
        self.done: dict[tuple, Bounds] = {}  # every job replayed so far, by :func:`_key`
        #: the jobs whose node times the hosts keep apart (:meth:`HeldReplays.replays_spans`), by :func:`_key`: their
        #: place there and their hubs' times
        self.stashed: dict[tuple, tuple[int, np.ndarray]] = {}

    def measured(self) -> Bounds:
        """The measured schedule's bounds (the ranks' graphs' own times)."""
        with self.paths.lock:
            got = self.paths.hosts.ask_all("replays_measured")
        return Bounds(*(np.concatenate([g[i] for g in got]) for i in range(3)))

    def replay(self, jobs: list[tuple[Model, Scenario]]) -> list[Bounds]:
        """Each (model, scenario) replayed on the hosts, up to :data:`REPLAY_BATCH` at a time."""
        with self.paths.lock:
            return self._replay(jobs)

    def _replay(self, jobs: list[tuple[Model, Scenario]], keep: bool = False) -> list[Bounds]:
        """:meth:`replay`; a job the hosts replayed before (the same transfers, free, balanced and slowdown: all they
        are told) is answered from then — the verdict, the ranges and the bottleneck ask some of the same — unless
        ``keep`` (the hosts keep that replay for :meth:`replays_bind`, so it runs)."""
        asked = [_job(m, sc) for m, sc in jobs]
        keys = [_key(j) for j in asked]
        todo = list({k: j for k, j in zip(keys, asked, strict=True) if keep or k not in self.done}.items())
        for i in range(0, len(todo), self.batch):
            batch = [j for _, j in todo[i:i + self.batch]]
            for (k, _), b in zip(todo[i:i + self.batch], self._run(batch, keep), strict=True):
                self.done[k] = b
        return [self.done[k] for k in keys]

    def _run(self, batch: list[Job], keep: bool) -> list[Bounds]:
        """One replay of the hosts' parts under ``batch``: each job's bounds."""
        if any(j.balanced for j in batch):
            self._balanced()
        hosts = self.paths.hosts
        slow = any(j.slowdown > 1.0 for j in batch)
        hosts.ask_all("replays_start", batch)
        self.hub_times, _ = exchange.settle([hosts], self.members, len(batch), self.local)
        for _ in range(whatif.CONTENTION_ROUNDS if slow else 0):
            hosts.ask_all("replays_recost")
            self.hub_times, _ = exchange.settle([hosts], self.members, len(batch), self.local)
        stash = [] if keep or slow else [j for j, job in enumerate(batch) if job.free]
        got = hosts.ask_all("replays_spans", keep, stash)
        if stash:  # the free-communication jobs' times kept on the hosts: the verdict's caveat follows one's path
            self.stashed = {_key(batch[j]): (i, self.hub_times[:, j].copy()) for i, j in enumerate(stash)}
        it = np.concatenate([g[0] for g in got])
        start = np.concatenate([g[1] for g in got], axis=1)
        end = np.concatenate([g[2] for g in got], axis=1)
        return [Bounds(it, start[j], end[j]) for j in range(len(batch))]

    def unexplained(self, model: Model, sc: Scenario, iterations: Any, ranks: Any) -> float | None:
        """:func:`tracekit.analysis.verdict.replay_unexplained` of ``sc``: the share of its schedule's critical path
        (its middle iteration) on gaps no dependency explains, the path followed where the ranks' graphs are."""
        with self.paths.lock:
            return self._unexplained(model, sc, iterations, ranks)

    def _unexplained(self, model: Model, sc: Scenario, iterations: Any, ranks: Any) -> float | None:
        key = _key(_job(model, sc))
        stashed = key in self.stashed  # its times kept on the hosts since a batch ran it
        if stashed:
            job, hub_times = self.stashed[key]
            b = self.done[key]
        else:
            (b,) = self._replay([(model, sc)], keep=True)
            job, hub_times = 0, self.hub_times[:, 0]
        spans = b.spans()
        if spans.height == 0:
            return None
        it = int(spans.get_column("iteration")[spans.height // 2])
        cross = self.paths.cross
        first = cross.hub_ptr.size - 1
        m_start = hub_times[first:first + cross.members.height] + self.t0
        src = cross.src.copy()
        hubbed = cross.hub >= 0
        src[hubbed] = collective_edges.latest_other(cross.hub_ptr, cross.hub_member, m_start[cross.hub_member],
                                                    cross.hub[hubbed], cross.dst[hubbed])
        self.paths.hosts.ask_all("replays_bind", job, src, m_start, stashed)
        try:
            segs = self.paths.paths(iterations, ranks, iteration=it, spans=spans, m_start=m_start)
        finally:
            self.paths.hosts.ask_all("replays_unbind")  # (and the replay kept for it)
        summ = critical_path.summary(segs, iterations, ranks, spans=spans)
        return float(summ.get_column("unexplained_share")[0]) if summ.height else None

    def balance(self, model: Model) -> balance.Balance:
        """Every rank's excess over its median peer's work, measured on the hosts and its factors given to them."""
        with self.paths.lock:
            return self._balanced()

    def _balanced(self) -> balance.Balance:
        if self._balance is None:
            works = {}
            for got in self.paths.hosts.ask_all("work"):
                works.update(got)
            w = balance.Work.concat([works[r] for r in sorted(works)])
            b = balance.balance(w, int(np.unique(self.measured().iteration).size))
            self.paths.hosts.ask_all("replays_balance", b)
            self._balance = b
        return self._balance


def _job(model: Model, sc: Scenario) -> Job:
    """What the hosts replay of ``sc`` under ``model``: each transfer's new time (:func:`whatif.transfers`)."""
    con = model.contention
    return Job(np.rint(whatif.transfers(model, sc)).astype(np.int64), free=sc.free, balanced=sc.balanced,
               slowdown=con.slowdown if con.measured and con.slowdown > 1.0 else 1.0)


def _key(job: Job) -> tuple:
    """What tells one job of the hosts' from another: the same key, the same replay."""
    return (hashlib.blake2b(job.transfer.tobytes(), digest_size=16).digest(), job.transfer.size, job.free,
            job.balanced, job.slowdown)


def _contention(paths: RankPaths) -> contention.Contention:
    """The contention fit (:func:`tracekit.analysis.graph.contention.fit`) of the samples the hosts took of their ranks'
    compute leaves (of their compute activities where no rank has leaves), joined in the job's rank order."""
    got: dict[int, tuple[pl.DataFrame | None, int, int]] = {}
    for part in paths.hosts.ask_all("replays_samples"):
        got.update(part)
    if not any(n for _, _, n in got.values()):
        for part in paths.hosts.ask_all("replays_samples", True):
            got.update(part)
    kept = [got[s.rank] for s in paths.sources if s.rank in got and got[s.rank][0] is not None]
    if not kept:
        return contention.NONE
    return contention.fit(pl.concat([k[0] for k in kept]), sum(k[1] for k in kept))


def _hub_hosts(paths: RankPaths, queue_ranks: np.ndarray, queue_hub: np.ndarray, queue_to: np.ndarray
               ) -> np.ndarray:
    """Per hub of the replay (:func:`tracekit.analysis.graph.parts.hub_members`' numbering), the host that holds all
    its members and every rank an edge from it goes into — which may release it itself —, or -1 where they are on
    several. ``queue_ranks``: the rank of each queue hub's member; ``queue_hub``, ``queue_to``: each queued edge from
    a hub and the rank it goes into."""
    cross = paths.cross
    home = paths.hosts.home
    known = np.array(sorted(home), np.int64)
    where = np.array([home[int(r)] for r in known], np.int64)

    def host(ranks: np.ndarray) -> np.ndarray:
        ranks = ranks.astype(np.int64)
        at = np.minimum(np.searchsorted(known, ranks), max(known.size - 1, 0))
        return np.where(known[at] == ranks, where[at], 0) if known.size else np.zeros(ranks.size, np.int64)

    n_inst, n_mem = cross.hub_ptr.size - 1, cross.members.height
    m_host = host(paths.m_rank)
    inst = np.repeat(np.arange(n_inst), np.diff(cross.hub_ptr))
    pair = cross.hub < 0  # pair edges leave their source member's own hub (into the destination's rank)
    hub = np.concatenate([inst, n_inst + np.arange(n_mem), n_inst + cross.src[pair],
                          n_inst + n_mem + np.arange(queue_ranks.size), queue_hub])
    at = np.concatenate([m_host[cross.hub_member], m_host, m_host[cross.dst[pair]], host(queue_ranks),
                         host(queue_to)])
    total = n_inst + n_mem + queue_ranks.size
    lo = np.full(total, np.iinfo(np.int64).max, np.int64)
    hi = np.full(total, -1, np.int64)
    np.minimum.at(lo, hub, at)
    np.maximum.at(hi, hub, at)
    return np.where(lo == hi, lo, -1)


def open_model(paths: RankPaths, analysis: JobTables, line_rate_bps: float | None = None,
               line_rates: dict[str, float] | None = None, pg_desc: dict[str, str] | None = None,
               group_links: Any = None, latency_ns: int | None = None) -> Model:
    """The what-if model of the job whose ranks' graphs ``paths`` holds, its replays on the hosts."""
    hosts = paths.hosts
    got: dict[int, pl.DataFrame] = {}
    with paths.lock:  # (the critical path may be asking the hosts meanwhile)
        for part in hosts.ask_all("comm"):
            got.update(part)
    held = list(got)
    frames = [got.pop(s.rank).with_columns(pl.col("a").alias("_a"), pl.col("a") + int(paths.base[i]))
              for i, s in enumerate(paths.sources) if s.rank in got]  # each rank's frame let go as it is taken
    acts = pl.concat(frames) if frames else pl.DataFrame()
    del frames
    transfer = acts.get_column("transfer_ns").to_numpy()
    local = acts.get_column("_a").to_numpy()
    comm, backend, latency, workers = comm_table.comm_table(
        acts.drop("transfer_ns", "_a"), transfer, analysis.collectives, analysis.consistent_members, analysis.members,
        analysis.ranks, line_rate_bps, latency_ns, line_rates, pg_desc, group_links)
    del acts  # (the job's calls once more each: not held through the hosts' opening below)
    at = comm.get_column("_row").to_numpy()
    comm = comm.drop("_row")
    none = np.zeros(0, np.int64)
    model = Model(graph=None, comm=comm, own_edge=none, coll_edges=none, coll_edge_row=none, iteration_of=none,
                  fifo=comm_table.fifo_edges(comm), line_rate_bps=line_rate_bps, workers=workers, latency_ns=latency,
                  measured_iteration_ns=0, backend=backend, pg_desc=dict(pg_desc or {}))
    # each row's rank and activity there; each rank's rows in its activities' order
    rank = comm.get_column("rank").to_numpy().astype(np.int64)
    a = local[at]
    prev, cur, _ = whatif.queued(model)
    same = rank[prev] == rank[cur]
    far = np.unique(prev[~same])
    first = paths.cross.hub_ptr.size - 1 + paths.cross.members.height  # the queues' hubs come after the members'
    hub = np.full(prev.size, -1, np.int64)
    hub[~same] = first + np.searchsorted(far, prev[~same])
    specs: dict[int, tuple[np.ndarray, Queues]] = {}
    rows = Grouped.by(rank, np.lexsort((a, rank)))  # (each a look-up per rank, not a scan of the job's rows)
    to_rank = Grouped.by(rank[cur])
    far_rank = Grouped.by(rank[far])
    for r in held:
        mine = rows.of(r)
        into = to_rank.of(r)
        out = far[far_rank.of(r)]
        specs[r] = (mine, Queues(row=cur[into], dst=a[cur[into]], src=np.where(same[into], a[prev[into]], -1),
                                 hub=hub[into], out=a[out], out_hub=first + np.searchsorted(far, out)))
    members = paths.cross.members.get_column("start")
    t0 = int(members.min()) if members.len() else 0
    receiver = model.receiver
    members = parts.hub_members(paths.cross, int(far.size))
    into = hub >= 0
    home = _hub_hosts(paths, rank[far], hub[into], rank[cur[into]])
    with paths.lock:
        sizes = hosts.ask_each("replays_open", lambda h: ({r: s for r, s in specs.items() if hosts.home.get(r, 0) == h},
                                                          receiver, t0, members, home == h))
        if comm.height:
            model.contention = _contention(paths)
    per_job = max([BYTES_PER_EDGE * e + BYTES_PER_NODE * n for e, n in sizes] + [1])
    batch = int(min(REPLAY_BATCH, max(1, REPLAY_BYTES // per_job)))
    model.remote = RankReplays(paths, members, home >= 0, t0, batch)
    model.measured_iteration_ns = model.remote.measured().period()
    return model
