"""The ASAP schedule of a dependency graph in one compiled topological sweep.

Every node happens at the max over its incoming edges of (source time + weight); nodes without any
incoming edge keep their given time. One pass over the nodes in topological order settles every node,
however many lane changes the graph's longest chain has — the vectorised rounds of
:mod:`tracekit.analysis.replay` need one whole-graph scan per lane change, which is hundreds on a job whose
communication sets the pace. A :class:`Plan` (the order and the incoming edges in it, Kahn's algorithm) is
made once per graph; each replay with new weights is then one pass. The loops are compiled by numba
(imported only here, when a graph is big enough to pay for it); a cycle (zero-weight loops in damaged
traces) is reported, not guessed around.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _kahn(n: int, src: np.ndarray, dst: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:  # pragma: no cover - compiled
    """Topological order (nodes whose predecessors all came before them; a node without incoming edges as
    early as its number allows) and the incoming edges of every position: ``order, in_ptr, in_src, in_edge,
    settled`` (``in_src`` as positions; ``settled < n``: a cycle)."""
    m = src.size
    indeg = np.zeros(n, np.int64)
    out_ptr = np.zeros(n + 1, np.int64)
    for e in range(m):
        indeg[dst[e]] += 1
        out_ptr[src[e] + 1] += 1
    for v in range(n):
        out_ptr[v + 1] += out_ptr[v]
    fill = out_ptr[:-1].copy()
    out = np.empty(m, np.int64)
    for e in range(m):
        out[fill[src[e]]] = e
        fill[src[e]] += 1
    order = np.empty(n, np.int64)
    pos = np.full(n, -1, np.int64)
    left = indeg.copy()
    tail = 0
    for v in range(n):
        if left[v] == 0:
            order[tail] = v
            pos[v] = tail
            tail += 1
    head = 0
    while head < tail:
        u = order[head]
        head += 1
        for k in range(out_ptr[u], out_ptr[u + 1]):
            v = dst[out[k]]
            left[v] -= 1
            if left[v] == 0:
                order[tail] = v
                pos[v] = tail
                tail += 1
    in_ptr = np.zeros(n + 1, np.int64)
    for e in range(m):
        in_ptr[pos[dst[e]] + 1] += 1 if pos[dst[e]] >= 0 else 0
    for i in range(n):
        in_ptr[i + 1] += in_ptr[i]
    fill = in_ptr[:-1].copy()
    in_src = np.empty(m, np.int64)
    in_edge = np.empty(m, np.int64)
    for e in range(m):
        p = pos[dst[e]]
        if p >= 0:
            in_src[fill[p]] = pos[src[e]]
            in_edge[fill[p]] = e
            fill[p] += 1
    return order, in_ptr, in_src, in_edge, tail


@njit(cache=True, nogil=True)
def _settle(in_ptr: np.ndarray, in_src: np.ndarray, w: np.ndarray, start: np.ndarray
            ) -> np.ndarray:  # pragma: no cover - compiled
    """Times by position: ``start`` where no edge comes in, else the max of (predecessor + weight); ``w`` is
    by incoming-edge slot (gathered by numpy beforehand: independent loads run far faster there than inside
    this loop, whose loads wait on each other)."""
    n = start.size
    t = np.empty(n, np.int64)
    for i in range(n):
        lo = in_ptr[i]
        hi = in_ptr[i + 1]
        if lo == hi:
            t[i] = start[i]
            continue
        best = t[in_src[lo]] + w[lo]
        for k in range(lo + 1, hi):
            c = t[in_src[k]] + w[k]
            if c > best:
                best = c
        t[i] = best
    return t


@dataclass(frozen=True)
class Plan:
    """A graph's nodes in topological order with their incoming edges (reused for every set of weights)."""

    order: np.ndarray  # node at each position
    in_ptr: np.ndarray  # incoming edges of position i: in_ptr[i]:in_ptr[i+1]
    in_src: np.ndarray  # their sources, as positions
    in_edge: np.ndarray  # their indices into the edge list the plan was made from
    sources: np.ndarray  # positions without incoming edges


def plan(n: int, src: np.ndarray, dst: np.ndarray) -> Plan | None:
    """The plan of the graph with ``n`` nodes and edges ``src -> dst``, or None when they form a cycle."""
    order, in_ptr, in_src, in_edge, settled = _kahn(n, np.ascontiguousarray(src, np.int64),
                                                    np.ascontiguousarray(dst, np.int64))
    if settled < n:
        return None
    return Plan(order, in_ptr, in_src, in_edge, np.flatnonzero(in_ptr[1:] == in_ptr[:-1]))


def asap(p: Plan, weight: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Node times (int64) of the ASAP schedule under ``weight`` (per edge of the plan's list); nodes without
    incoming edges keep ``start``."""
    first = np.zeros(p.order.size, np.int64)
    first[p.sources] = start[p.order[p.sources]]
    t = _settle(p.in_ptr, p.in_src, np.ascontiguousarray(weight[p.in_edge], np.int64), first)
    out = np.empty_like(t)
    out[p.order] = t
    return out


@njit(cache=True, nogil=True)
def _chase(binding: np.ndarray, src: np.ndarray, times: np.ndarray, sink: int, s0: int
           ) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - compiled
    """The nodes from ``sink`` back along binding edges while their time is after ``s0``, and each one's binding
    edge (-1 at a source, where the chain stops)."""
    nodes = np.empty(64, np.int64)
    edges = np.empty(64, np.int64)
    k = 0
    node = sink
    while times[node] > s0:
        if k == nodes.size:
            nodes = np.concatenate((nodes, np.empty(nodes.size, np.int64)))
            edges = np.concatenate((edges, np.empty(edges.size, np.int64)))
        e = binding[node]
        nodes[k] = node
        edges[k] = e
        k += 1
        if e < 0:
            break
        node = src[e]
    return nodes[:k], edges[:k]


def chase(binding: np.ndarray, src: np.ndarray, times: np.ndarray, sink: int, s0: int
          ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`tracekit.analysis.critical_path._walk`'s pointer chase, compiled: the nodes back from ``sink`` along
    binding edges while after ``s0``, and their binding edges."""
    return _chase(binding, src, times, int(sink), int(s0))
