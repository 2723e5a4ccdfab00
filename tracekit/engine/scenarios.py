"""Many scenarios of one graph at once: each a few edges re-weighted, each answered by its iteration time.

A what-if grid changes the same few edges of one graph in every scenario (transfers, the queue on each link):
the graph's plan and its weights by slot are laid out once, and each scenario is then its changed slots written,
one sweep (:mod:`tracekit.engine.schedule`) and its iteration time read off the schedule — no array of the graph's
size made per scenario. Scenarios run on threads (the kernels release the GIL), each with its own buffers.

The iteration time of a schedule (:func:`period`) is the median time between consecutive iteration starts (each
iteration's earliest counted start), or where no iteration starts after another, the median iteration span.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from tracekit.engine import _kernels
from tracekit.engine.schedule import Plan


@dataclass(frozen=True)
class Iterations:
    """Which nodes an iteration time is read from: the start and end nodes of the counted activities, each with its
    iteration (``*_code``: 0, 1, ... in iteration order), and how many iterations there are."""

    start: np.ndarray
    start_code: np.ndarray
    end: np.ndarray
    end_code: np.ndarray
    count: int

    def at(self, pos: np.ndarray) -> Iterations:
        """The same with nodes given as positions of a plan (``pos``: per node, its position), in position order (a
        sweep's times are then read front to back; each node is counted once, so no sort is needed)."""
        return Iterations(*_in_order(pos[self.start], self.start_code, pos.size),
                          *_in_order(pos[self.end], self.end_code, pos.size), self.count)


def _in_order(at: np.ndarray, code: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``at`` (distinct positions below ``n``) in increasing order, with their codes."""
    by = np.full(n, -1, np.int32)
    by[at] = code
    kept = np.flatnonzero(by >= 0)
    return kept.astype(np.int32), by[kept]


def iterations(iteration_of: np.ndarray, counted: np.ndarray) -> Iterations:
    """:class:`Iterations` of a graph whose activity ``a`` (nodes ``2a``, ``2a + 1``) belongs to iteration
    ``iteration_of[a]`` and counts where ``counted``."""
    a = np.flatnonzero(counted)
    values, code = np.unique(iteration_of[a], return_inverse=True)
    code = code.astype(np.int32)
    nodes = (2 * a).astype(np.int32)
    return Iterations(nodes, code, nodes + 1, code, int(values.size))


def period(times: np.ndarray, its: Iterations) -> int:
    """The iteration time of the schedule ``times`` (per node; module docstring). Without counted activities, the
    schedule's whole span; without nodes, 0."""
    if times.size == 0:
        return 0
    if its.count == 0:
        return int(times.max() - times.min())
    return _kernels.period(np.ascontiguousarray(times, np.int64), its.start, its.start_code, its.end, its.end_code,
                           its.count)


@dataclass(frozen=True)
class Grid:
    """A plan laid out for many scenarios, by position in its order: the incoming edges (``ptr``, ``src``), the
    base weights by slot, the sources' times, each edge's slot and the iteration nodes."""

    ptr: np.ndarray
    src: np.ndarray
    base: np.ndarray
    first: np.ndarray
    slot: np.ndarray
    its: Iterations


def grid(p: Plan, weight: np.ndarray, start: np.ndarray, its: Iterations) -> Grid:
    """Lay out plan ``p`` for scenarios that change some of the base ``weight`` (per edge of the plan's list); nodes
    without incoming edges keep ``start``; iteration times are read from ``its``."""
    n, m = p.order.size, p.in_edge.size
    ptr, src = np.empty(n + 1, np.int32), np.empty(m, np.int32)
    slot, base, first, pos = np.empty(m, np.int64), np.empty(m, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
    _kernels.layout(p.order, p.in_ptr, p.in_src, p.in_edge, np.ascontiguousarray(weight, np.int64),
                    np.ascontiguousarray(start, np.int64), ptr, src, slot, base, first, pos)
    return Grid(ptr, src, base, first, slot, its.at(pos))


def iteration_times(g: Grid, changes: list[tuple[np.ndarray, np.ndarray]], threads: int | None = None
                    ) -> np.ndarray:
    """Per scenario — ``(edges, weights)``: the edges it re-weights and their weights — its iteration time, on up to
    ``threads`` threads (default: one per core)."""
    n = len(changes)
    out = np.zeros(n, np.int64)
    if n == 0:
        return out
    sizes = np.array([c[0].size for c in changes], np.int64)
    ptr = np.zeros(n + 1, np.int64)
    np.cumsum(sizes, out=ptr[1:])
    slot = g.slot[np.concatenate([np.asarray(c[0], np.int64) for c in changes])] if ptr[-1] else \
        np.zeros(0, np.int64)
    w = np.concatenate([np.asarray(c[1], np.int64) for c in changes]) if ptr[-1] else np.zeros(0, np.int64)
    its = g.its
    args = (g.ptr, g.src, g.base, g.first, ptr, slot, w)
    tail = (its.start, its.start_code, its.end, its.end_code, its.count, out)
    workers = max(1, min(n, threads or os.cpu_count() or 1))
    if workers == 1:
        _kernels.run(*args, 0, n, *tail)
        return out
    from concurrent.futures import ThreadPoolExecutor

    bounds = np.linspace(0, n, workers + 1).round().astype(int)
    with ThreadPoolExecutor(workers, thread_name_prefix="tracekit-grid") as pool:
        for f in [pool.submit(_kernels.run, *args, a, b, *tail) for a, b in pairwise(bounds.tolist())]:
            f.result()
    return out
