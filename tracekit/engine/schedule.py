"""The ASAP schedule of a dependency graph in one topological sweep.

Every node happens at the max over its incoming edges of (source time + weight); nodes without any incoming edge
keep their given time. One pass over the nodes in topological order settles every node, however many lane changes
the graph's longest chain has. A :class:`Plan` (Kahn's order and every node's incoming edges in it) is made once per
graph and set of edges; each schedule with new weights is then one pass. A cycle (zero-weight loops in damaged
traces) is reported (no plan), not guessed around.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tracekit.engine import _kernels

#: the most nodes or edges a plan holds (its indices are int32)
MAX_SIZE = np.iinfo(np.int32).max - 1


@dataclass(frozen=True)
class Plan:
    """A graph's nodes in topological order with their incoming edges (reused for every set of weights)."""

    order: np.ndarray  # node at each position (int32)
    in_ptr: np.ndarray  # incoming edges of node v: the slots in_ptr[v]:in_ptr[v+1] (int32)
    in_src: np.ndarray  # their sources, as positions (int32)
    in_edge: np.ndarray  # their indices into the edge list the plan was made from (int32)


def _i64(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, np.int64)


def plan(n: int, src: np.ndarray, dst: np.ndarray, more: tuple[np.ndarray, np.ndarray] | None = None
         ) -> Plan | None:
    """The plan of the graph with ``n`` nodes and edges ``src -> dst`` (and ``more``: ``(src, dst)`` of edges
    numbered after those), or None when they form a cycle. Kahn's algorithm with a last-in first-out queue: the order
    follows a lane's chain while it can, so that a sweep reads what it wrote just before."""
    s1, d1 = (_i64(more[0]), _i64(more[1])) if more is not None else (np.zeros(0, np.int64),) * 2
    m = src.size + s1.size
    if max(n, m) > MAX_SIZE:
        raise ValueError(f"a graph of {n} nodes and {m} edges is beyond the engine's int32 indices")
    order = np.empty(n, np.int32)
    in_ptr = np.empty(n + 1, np.int32)
    in_src = np.empty(m, np.int32)
    in_edge = np.empty(m, np.int32)
    if _kernels.kahn(_i64(src), _i64(dst), s1, d1, order, in_ptr, in_src, in_edge) < n:
        return None
    return Plan(order, in_ptr, in_src, in_edge)


def asap(p: Plan, weight: np.ndarray, start: np.ndarray, more: np.ndarray | None = None) -> np.ndarray:
    """Node times (int64) of the ASAP schedule under ``weight`` (per edge of the plan's list; ``more``: the weights
    of edges numbered after ``weight``'s, where the plan was made with more). Edges of the plan beyond those are
    left out (a plan of a graph with more edges is a plan of the graph without them: its order stays topological);
    nodes without incoming edges keep ``start``. The caller keeps every time within int64."""
    out = np.empty(p.order.size, np.int64)
    _kernels.asap(p.order, p.in_ptr, p.in_src, p.in_edge, _i64(weight),
                  np.zeros(0, np.int64) if more is None else _i64(more), _i64(start), out)
    return out
