"""The critical path of a job analysed rank by rank, followed where the ranks' graphs are held
(:mod:`tracekit.scale.rank_parts`): from each iteration's last end (the latest of the ranks' own), back along binding
edges on one rank until the path reaches a member of another rank's collective, then on at that rank — the segments of
:func:`tracekit.analysis.graph.critical_path.paths` of the job's graph, to the nanosecond, with only the members of the
collectives (:class:`tracekit.analysis.graph.crossings.Crossings`) and the path itself on the client.
"""

from __future__ import annotations

import threading
from typing import Protocol

import numpy as np
import polars as pl
import pyarrow as pa

from tracekit.analysis.graph import critical_path
from tracekit.analysis.graph.critical_path import SEGMENT_SCHEMA, Segments, frame, label_waiting, with_tail
from tracekit.analysis.graph.crossings import Crossings, crossings
from tracekit.scale.rank_parts import Hosts, Piece, Source


class JobTables(Protocol):
    """What the ranks' graphs are put together with: the job's analysis (:class:`tracekit.analysis.pipeline.Analysis`,
    named here, not imported, so that the analysis and the dataset that builds the graphs do not import each other)."""

    ranks: pa.Table
    members: pa.Table
    instances: pa.Table
    collectives: pa.Table
    iterations: pa.Table

    @property
    def consistent_members(self) -> pl.DataFrame | None:
        """:func:`tracekit.analysis.graph.whatif.consistent_members` of the tables above."""


class RankPaths:
    """A job's ranks' graphs on ``hosts``, loaded once (:meth:`open`), and what crosses ranks."""

    def __init__(self, hosts: Hosts, cross: Crossings, sources: list[Source], counts: dict[int, int]) -> None:
        self.hosts, self.cross, self.sources = hosts, cross, sources
        #: held by whoever talks to the hosts: one question at a time (the verdict asks from several threads)
        self.lock = threading.RLock()
        self.part_rank = np.array([s.rank for s in sources], np.int64)
        sizes = np.array([counts.get(s.rank, 0) for s in sources], np.int64)
        self.base = np.concatenate(([0], np.cumsum(sizes)))[:-1]  # each rank's first activity in the job's numbering
        self.pos = {s.rank: i for i, s in enumerate(sources)}
        # each member's rank, activity on it and start
        self.m_rank = cross.members.get_column("rank").to_numpy()
        self.m_a = cross.members.get_column("a").to_numpy()
        self.m_start = cross.members.get_column("start").to_numpy()
        d = cross.dst
        self.by_dst = np.argsort(d, kind="stable")
        self.dst_sorted = d[self.by_dst]

    @classmethod
    def open(cls, hosts: Hosts, src: list[Source], analysis: JobTables) -> RankPaths:
        """Load the ranks' stored graphs ``src`` (:func:`tracekit.scale.graphs.sources`) onto ``hosts``."""
        rows = hosts.read(src)  # read where they will be held; only the members' rows come back
        cross = crossings(rows, analysis.consistent_members)
        return cls(hosts, cross, src, hosts.bind(cross))

    def rank_of(self, acts: np.ndarray) -> np.ndarray:
        """The rank of activities in the job's numbering."""
        return self.part_rank[np.searchsorted(self.base, acts, "right") - 1]

    def _windows(self, pieces: list[Piece], start: np.ndarray) -> list[tuple[int, int, int]]:
        """:func:`tracekit.analysis.graph.critical_path._windows` from the pieces' collective segments, in order
        (``start``: each member's start in the schedule followed)."""
        rank = self.m_rank
        out = []
        for p in pieces:
            for d, k in zip(p.dst_member[p.src_member >= 0].tolist(), p.src_member[p.src_member >= 0].tolist(),
                            strict=True):
                lo, hi = np.searchsorted(self.dst_sorted, [d, d + 1])
                into = self.by_dst[lo:hi]
                hub = self.cross.hub[into]
                if (hub >= 0).any():
                    h = int(hub[hub >= 0][0])
                    mem = self.cross.hub_member[self.cross.hub_ptr[h]:self.cross.hub_ptr[h + 1]]
                else:
                    mem = self.cross.src[into]
                first = int(min(start[mem].min(), start[d]))
                last = int(start[k])
                if last > first:
                    out.append((first, last, int(rank[k])))
        return out

    def paths(self, iterations: pa.Table, ranks: pa.Table | None, iteration: int | list[int] | None = None,
              spans: pl.DataFrame | None = None, m_start: np.ndarray | None = None) -> pl.DataFrame:
        """:func:`tracekit.analysis.graph.critical_path.paths` of the job's graph; with ``m_start`` (each member's start
        in a replayed schedule, whose iterations' ``spans`` are given), of the schedule the hosts bound last
        (:meth:`tracekit.scale.rank_replays.HeldReplays.replays_bind`)."""
        with self.lock:
            return self._paths(iterations, ranks, iteration, spans, m_start)

    def _paths(self, iterations: pa.Table, ranks: pa.Table | None, iteration: int | list[int] | None,
               spans: pl.DataFrame | None, m_start: np.ndarray | None) -> pl.DataFrame:
        replayed = m_start is not None
        start = m_start if replayed else self.m_start
        spans = critical_path.iteration_spans(iterations, ranks) if spans is None else spans
        if iteration is not None:
            spans = spans.filter(pl.col("iteration").is_in(iteration if isinstance(iteration, list) else [iteration]))
        it = spans.get_column("iteration").to_numpy()
        s0 = spans.get_column("start_ns").to_numpy()
        s1 = spans.get_column("end_ns").to_numpy()
        best: dict[int, tuple[int, int, int]] = {}  # iteration index -> (end, position of its rank, activity)
        for r, (k, end, a) in self.hosts.sinks(it, s0, s1, replayed).items():
            p = self.pos[r]
            for ki, e, ai in zip(k.tolist(), end.tolist(), a.tolist(), strict=True):
                if ki not in best or (e, -p, -ai) > (best[ki][0], -best[ki][1], -best[ki][2]):
                    best[ki] = (e, p, ai)
        out, its = [], []
        for i, (it_no, begin, stop) in enumerate(zip(it.tolist(), s0.tolist(), s1.tolist(), strict=True)):
            if i not in best:
                continue
            end, p, a = best[i]
            rank, node, pieces = int(self.part_rank[p]), 2 * a + 1, []
            while True:
                piece = self.hosts.walk(rank, node, begin, replayed)
                pieces.append((self.base[self.pos[rank]], piece))
                if piece.hop < 0:
                    break
                rank, node = int(self.m_rank[piece.hop]), 2 * int(self.m_a[piece.hop])
            seg = Segments(*(np.concatenate([getattr(pc, f) for _, pc in pieces]) for f in ("start", "end", "label")),
                           np.concatenate([b + pc.act for b, pc in pieces]),
                           np.concatenate([pc.edge for _, pc in pieces]))
            seg = with_tail(seg, end, stop, int(self.base[p] + a))
            out.append(label_waiting(seg, self._windows([pc for _, pc in pieces], start), self.rank_of))
            its.append(it_no)
        if not out:
            return pl.DataFrame(schema=SEGMENT_SCHEMA)
        return frame(its, out, self.describe(np.concatenate([p.act for p in out])))

    def describe(self, acts: np.ndarray) -> pl.DataFrame:
        """``rank, lane, name, event_row`` of activities in the job's numbering, in that order (asked of their
        hosts, rank by rank)."""
        rank = self.rank_of(acts)
        order = np.argsort(rank, kind="stable")
        parts = []
        bounds = np.flatnonzero(np.diff(rank[order])) + 1
        for grp in np.split(order, bounds):
            if grp.size == 0:
                continue
            r = int(rank[grp[0]])
            parts.append(self.hosts.describe(r, acts[grp] - self.base[self.pos[r]]))
        rows = pl.concat(parts)
        return rows[np.argsort(order)]
