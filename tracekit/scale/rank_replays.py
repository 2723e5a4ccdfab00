"""The what-if's replays where the ranks' graphs are held (a host's side: :class:`tracekit.scale.rank_parts.Held` takes
these calls): each rank's communication rows and work for the client's model, then its part of every replay the client
asks for (:class:`tracekit.analysis.graph.rank_model.RankReplay`), advanced as the client releases hubs
(:func:`tracekit.scale.exchange.settle`), and each iteration's window in the replayed schedules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from tracekit.analysis import balance
from tracekit.analysis.graph import rank_model
from tracekit.analysis.graph.crossings import Crossings, RankGraph
from tracekit.analysis.graph.rank_model import Job, Queues, RankReplay
from tracekit.engine.parts import Replay, merge
from tracekit.scale.exchange import arrive


class HeldReplays:
    """A host's replays of the ranks it holds (``ranks``: rank → its graph, filled by the host's binding, with the
    job's collective edges it was bound with, ``cross``)."""

    ranks: dict[int, RankGraph]
    cross: Crossings | None
    replayed: dict[int, RankGraph]
    sources: dict[int, Any]  # where each held rank's graph was read from (:class:`tracekit.scale.rank_parts.Source`)
    table: Callable[..., Any]  # a stored table, read ahead or now (:meth:`tracekit.scale.rank_parts.Held.table`)

    def comm(self) -> dict[int, pl.DataFrame]:
        """Each rank's communication rows (:func:`tracekit.analysis.graph.rank_model.comm_rows`)."""
        return {r: rank_model.comm_rows(rg) for r, rg in self.ranks.items()}

    def work(self) -> dict[int, balance.Work]:
        """Each rank's work (:func:`tracekit.analysis.graph.rank_model.work`)."""
        return {r: rank_model.work(rg) for r, rg in self.ranks.items()}

    def replays_open(self, specs: dict[int, tuple[np.ndarray, Queues]], receiver: np.ndarray, t0: int,
                     members: np.ndarray, local: np.ndarray) -> tuple[int, int]:
        """Make each held rank's replay part (``specs`` per rank its rows of the model's communication table and the
        queues touching it; ``receiver`` per row, whether it receives a pair's data) and the host's one part of them
        all, on the collective edges the ranks were bound with (not sent again: the job's members each). ``members``:
        each hub's member count; ``local``: the hubs whose members are all on this host, released here as their last
        member arrives (the client releases the others). Returns the host part's edges and nodes (what a job's replay
        holds here: its weights and times)."""
        cross = self.cross
        assert cross is not None, "replays opened before the ranks were bound"
        self.replaying = {r: RankReplay(rg, cross, specs[r][0], receiver, specs[r][1], t0)
                          for r, rg in self.ranks.items()}
        self.part, first, self.pos = merge([rr.part for rr in self.replaying.values()])
        self.first = dict(zip(self.replaying, first.tolist(), strict=True))
        self.nodes = {r: rr.part.n for r, rr in self.replaying.items()}
        for rr in self.replaying.values():
            rr.part = None  # type: ignore[assignment]  # (the host's part holds them: one copy)
        self.members, self.local = members, local
        self.running: Replay | None = None
        self.laid: list[tuple[np.ndarray, np.ndarray]] | None = None  # (see :meth:`_laid`)
        self.bases: dict[bool, np.ndarray] = {}  # (see :meth:`_base`)
        self.stash: list[tuple[Job, np.ndarray]] = []  # (see :meth:`replays_spans`)
        return self.part.edges, self.part.n

    def _times(self, r: int) -> np.ndarray:
        """Rank ``r``'s nodes × jobs of the running replay."""
        assert self.running is not None
        lo = self.first[r]
        return self.running.times[lo:lo + self.nodes[r]]

    def _laid(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per held rank: the row in the host part's kernel order of each edge of its :meth:`graph_weights
        <tracekit.analysis.graph.rank_model.RankReplay.graph_weights>` (its part's edges are all of them, in another
        order), and the rows of its :attr:`~tracekit.analysis.graph.rank_model.RankReplay.set_edges` (made once)."""
        if self.laid is None:
            slot = self.part.layout.slot
            self.laid = []
            for pos, rr in zip(self.pos, self.replaying.values(), strict=True):
                row = np.empty(rr.emap.size, np.int64)
                row[rr.emap] = slot[pos]
                self.laid.append((row, row[rr.set_edges]))
        return self.laid

    def _base(self, balanced: bool) -> np.ndarray:
        """The weights, in the kernel's order, of the edges no job sets (:meth:`RankReplay.base_weights
        <tracekit.analysis.graph.rank_model.RankReplay.base_weights>`), as measured or balanced (made once each)."""
        if balanced not in self.bases:
            w = np.empty(self.part.edges, np.int64)
            for (row, _), rr in zip(self._laid(), self.replaying.values(), strict=True):
                w[row] = rr.base_weights(balanced)
            self.bases[balanced] = w
        return self.bases[balanced]

    def _start(self, before: dict[int, np.ndarray] | None = None) -> None:
        """Run the host's part under :attr:`jobs`: each job's weights its base (:meth:`_base`) with the edges it sets
        written over them, rank by rank; with ``before`` (per rank its nodes × jobs in the replay before), the compute
        of jobs with a slowdown re-costed (those weigh every edge rank by rank)."""
        jobs = self.jobs
        w = np.empty((self.part.edges, len(jobs)), np.int64)  # in the kernel's order: kept, not copied
        recost = [j for j, job in enumerate(jobs) if before is not None and job.slowdown > 1.0]
        plain = [j for j in range(len(jobs)) if j not in recost]
        balanced = [i for i, j in enumerate(plain) if jobs[j].balanced]
        if len(balanced) < len(plain):  # (a row at a time: a column at a time would pass over it once per job)
            w[:] = self._base(False)[:, None]
        if balanced:
            w[:, [plain[i] for i in balanced]] = self._base(True)[:, None]
        for (r, rr), (row, set_rows) in zip(self.replaying.items(), self._laid(), strict=True):
            got = rr.set_weights([jobs[j] for j in plain])
            if balanced:  # the edges the balance scales weigh what the balanced base has
                scaled = rr.balance_scaled
                got[np.ix_(scaled, balanced)] = self._base(True)[set_rows[scaled], None]
            w[np.ix_(set_rows, plain)] = got
            for j in recost:
                assert before is not None
                w[row, j] = rr.graph_weights(jobs[j], before[r][:, j])
        self.running = Replay(self.part, w, laid=True)
        self.left = self.members.copy()
        self.left_time = np.full((self.members.size, len(self.jobs)), np.iinfo(np.int64).min, np.int64)

    def replays_measured(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`replays_spans` of the measured schedule (the ranks' graphs' own times)."""
        parts = [rr.spans(self.part.start[self.first[r]:self.first[r] + self.nodes[r], None])
                 for r, rr in self.replaying.items()]
        if not parts:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
        return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1][0] for p in parts]),
                np.concatenate([p[2][0] for p in parts]))

    def replays_balance(self, b: balance.Balance) -> None:
        """Give every held rank's replay the balance's factors (for the jobs that remove the excess): each its own
        rows of them (a rank joined with every rank's rows made the balance quadratic in ranks)."""
        mine = b.factors.filter(pl.col("rank").is_in(list(self.replaying))).partition_by("rank", as_dict=True)
        none = b.factors.clear()
        for r, rr in self.replaying.items():
            rr.balance(replace(b, factors=mine.get((r,), none)))
        self.bases.pop(True, None)

    def replays_samples(self, activities: bool = False) -> dict[int, tuple[pl.DataFrame, int, int]]:
        """Per held rank: the contention fit's samples (:meth:`tracekit.analysis.graph.rank_model.RankReplay.samples`),
        their identities and how many compute leaves the rank has; from its compute activities instead of its stored
        leaves where ``activities`` (no rank of the job has leaves)."""
        from tracekit.analysis.graph.whatif import compute_mask

        out = {}
        for r, rr in self.replaying.items():
            if activities:
                g = rr.rg.graph
                leaves = g.act.filter(pl.Series(compute_mask(g))).select("rank", "iteration", "name", "start", "end")
            else:
                s = self.sources[r]
                t = pl.from_arrow(self.table(Path(s.root) / s.part / "graph.leaves.parquet"))
                assert isinstance(t, pl.DataFrame)
                leaves = t.with_columns(pl.lit(r, pl.Int32).alias("rank"), pl.col("start") + s.offset,
                                        pl.col("end") + s.offset)
            out[r] = (*rr.samples(leaves), leaves.height) if leaves.height else (None, 0, 0)
        return out

    def replays_start(self, jobs: list[Job]) -> None:
        """Start a replay of every held rank under ``jobs`` (all at once: the host's one part, jobs as its
        scenarios)."""
        self.jobs = jobs
        self.before: dict[int, np.ndarray] = {}
        self._start()

    def replays_recost(self) -> None:
        """Replay again, the compute of jobs with a slowdown re-costed by the schedules just replayed."""
        self.before = {r: self._times(r) for r in self.replaying}
        self._start(self.before)

    def replays_unbind(self) -> None:
        """Let go of the ranks' graphs as the last replay bound scheduled them (:meth:`replays_bind`), and of that
        replay."""
        self.replayed, self.running, self.before = {}, None, {}

    def replays_bind(self, job: int, src: np.ndarray, m_start: np.ndarray, stashed: bool = False) -> None:
        """Each held rank's graph as job ``job`` of the running replay scheduled it (with ``stashed``: the job of that
        place in :meth:`replays_spans`'s stash) (:func:`tracekit.analysis.graph.rank_model.replayed`: collective
        edges from ``src``, per edge of the crossings the replay was opened with; members of other ranks at
        ``m_start``), held for the critical path of the schedule (``replayed=True`` of the path's calls)."""
        self.replayed = {}
        if stashed:
            done, times = self.stash[job]
        for r, rr in self.replaying.items():
            if stashed:
                w = rr.graph_weights(done)
                t = times[self.first[r]:self.first[r] + self.nodes[r]]
            else:
                before = self.before.get(r)
                w = rr.graph_weights(self.jobs[job], None if before is None else before[:, job])
                t = self._times(r)[:, job]
            self.replayed[r] = rank_model.replayed(rr.rg, self.cross, src, t + rr.t0, w[:rr.n_edges], m_start)

    def advance(self, hubs: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Release ``hubs`` at ``times`` (× jobs, on the offsets of the replays) to the running part and settle what
        that allows, releasing here every hub of this host's alone as its last member arrives; every arrival
        meanwhile (:meth:`tracekit.engine.parts.Replay.advance`: the client counts them all)."""
        assert self.running is not None
        got_h, got_t = self.running.advance(hubs, times)
        out_h, out_t = [got_h], [got_t]
        while True:
            mine = self.local[got_h]
            if not mine.any():
                break
            done = arrive(self.left, self.left_time, got_h[mine], got_t[mine])
            if done.size == 0:
                break
            got_h, got_t = self.running.advance(done, self.left_time[done])
            out_h.append(got_h)
            out_t.append(got_t)
        return np.concatenate(out_h), np.concatenate(out_t)

    def replays_spans(self, keep: bool = False, stash: Sequence[int] = ()
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per held rank and counted iteration, its earliest start and latest end in each job's schedule
        (:meth:`tracekit.analysis.graph.rank_model.RankReplay.spans`): ``(iterations, starts, ends)``, the ranks'
        iterations one after the other (starts and ends: jobs × them). The replay is let go unless ``keep`` (for
        :meth:`replays_bind`); the node times of the jobs ``stash`` names (without a slowdown re-costed) are kept
        apart, in that order, for :meth:`replays_bind` later (one column each: a verdict's caveat follows the path of
        a replay the bottleneck's first batch ran), in place of those kept before."""
        parts = [rr.spans(self._times(r)) for r, rr in self.replaying.items()]
        if stash:
            assert self.running is not None and not self.before
            self.stash = [(self.jobs[j], self.running.times[:, j].copy()) for j in stash]
        if not keep:
            self.running, self.before = None, {}
        jobs = len(self.jobs)
        if not parts:
            none = np.zeros((jobs, 0), np.int64)
            return np.zeros(0, np.int64), none, none
        return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts], axis=1),
                np.concatenate([p[2] for p in parts], axis=1))

