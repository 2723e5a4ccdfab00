"""Binding edges and the chains back along them: what a critical path is read from.

A node's *binding* edge is the incoming edge that attains its time (the max over its incoming edges of source time
+ lag; the last such edge in the list on a tie), and the *slack* on it is the node's time beyond that: measured time
nothing traced accounts for. A critical path is the chain of binding edges back from an iteration's last node.
"""

from __future__ import annotations

import numpy as np

from tracekit.engine import _kernels


def _i64(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, np.int64)


def bind(src: np.ndarray, dst: np.ndarray, lag: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per node, its binding edge (-1 where no edge comes in), and per edge the slack left on it (nonzero only on
    binding edges)."""
    binding = np.empty(times.size, np.int64)
    slack = np.empty(src.size, np.int64)
    _kernels.bind(_i64(src), _i64(dst), _i64(lag), _i64(times), binding, slack, np.empty(times.size, np.int64))
    return binding, slack


def chase(binding: np.ndarray, src: np.ndarray, times: np.ndarray, sink: int, s0: int
          ) -> tuple[np.ndarray, np.ndarray]:
    """The nodes back from ``sink`` along binding edges while their time is after ``s0``, and each one's binding
    edge (-1 at a node nothing binds, where the chain stops)."""
    binding, src, times = _i64(binding), _i64(src), _i64(times)
    cap = min(times.size, 4096)
    while True:
        nodes = np.empty(cap, np.int64)
        edges = np.empty(cap, np.int64)
        k = _kernels.chase(binding, src, times, int(sink), int(s0), nodes, edges)
        if k >= 0:
            return nodes[:k], edges[:k]
        cap = times.size  # a chain visits a node once


def walk(nodes: np.ndarray, edges: np.ndarray, src: np.ndarray, etype: np.ndarray, lag: np.ndarray,
         gap: np.ndarray | None, times: np.ndarray, act_label: np.ndarray, lag_label: np.ndarray,
         slack_label: np.ndarray, s0: int, codes: tuple[int, int, int, int, int, int]
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The segments of a critical path from its chain (:func:`chase`: ``nodes``, ``edges``), latest first:
    ``start, end, label, owner, edge``. Per step, the slack beyond the binding edge's bound (labelled
    ``slack_label[etype]``), the untraced gaps inside its lag (``gap``, per edge, or None: labelled idle, on program
    order) and the lag itself (``act_label`` of its activity on an own edge, else ``lag_label[etype]``; owned by the
    source activity on a launch or enqueue edge), each cut at ``s0``; where the chain ends at a node nothing binds,
    idle from ``s0``. Only segments that last are kept. ``codes``: the own, launch and enqueue edge types, the idle
    label, and the edge codes of program order and of the chain's source."""
    k = nodes.size
    start, end, owner = (np.empty(3 * k + 1, np.int64) for _ in range(3))
    label, edge = np.empty(3 * k + 1, np.int8), np.empty(3 * k + 1, np.int8)
    n = _kernels.walk(_i64(nodes), _i64(edges), _i64(src), np.ascontiguousarray(etype, np.int8), _i64(lag),
                      np.zeros(0, np.int64) if gap is None else _i64(gap), _i64(times),
                      np.ascontiguousarray(act_label, np.int8), np.ascontiguousarray(lag_label, np.int8),
                      np.ascontiguousarray(slack_label, np.int8), int(s0), np.asarray(codes, np.int64), start, end,
                      label, owner, edge)
    return start[:n], end[:n], label[:n], owner[:n], edge[:n]
