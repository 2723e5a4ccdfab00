"""Replay a dependency graph with new edge weights: the as-soon-as-possible schedule it implies.

Every node happens at the max over its incoming edges of (source time + weight); sources keep their
measured times. Edges along a lane (an activity's own work, program order) form chains, solved for a
whole lane at once as a max-plus prefix scan: ``T[m] = max(X[m], T[m-1] + w[m])`` is
``A[m] + cummax(X - A)`` with ``A`` the prefix sum of chain weights. Cross-lane edges feed ``X``; the
two steps alternate until nothing moves, which takes one round per lane change on the longest
dependency chain, not one per node. Replaying the measured weights reproduces the trace exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from tracekit.analysis.dag import EDGE_TYPES, Graph

_OWN = EDGE_TYPES.index("own")
_PROGRAM = EDGE_TYPES.index("program")
MAX_ROUNDS = 100_000
#: "auto" gives the rounds this many node-rounds (nodes x rounds, ~12 ns each) before it turns to the compiled
#: sweep: about what numba's import and loading its compiled code cost (~0.4 s). Most traces settle in a few
#: rounds; a small graph settles in thousands before the sweep would have paid for itself
AUTO_NODE_ROUNDS = 30_000_000
#: ... and at least this many rounds, however big the graph
AUTO_MIN_ROUNDS = 8


@dataclass(frozen=True)
class Chains:
    """The graph split into lane chains and cross edges (computed once, reused for every scenario)."""

    chain_edge: np.ndarray  # per node: the edge from its chain predecessor, -1 at a lane's start
    seg: np.ndarray  # per node: chain segment id (nondecreasing)
    cross: np.ndarray  # indices of cross edges, sorted by destination
    cross_dst_bounds: np.ndarray  # reduceat boundaries into cross (one per distinct destination)
    cross_dsts: np.ndarray  # the distinct destinations
    sources: np.ndarray  # nodes without any incoming edge


def chains(graph: Graph) -> Chains:
    """Split ``graph`` into per-lane chains (own + program edges) and cross edges."""
    n = graph.n_nodes
    # own: S_i -> E_i (consecutive nodes); program: E_i -> S_{i+1} (consecutive activities on a lane); masks over
    # every edge in order, not gathers through the chain edges' ids (a job's edges are millions)
    on_chain = (graph.etype == _OWN) | (graph.etype == _PROGRAM)
    on_chain &= graph.dst == graph.src + 1
    ce = np.flatnonzero(on_chain)
    chain_edge = np.full(n, -1, dtype=np.int64)
    chain_edge[graph.dst[ce]] = ce
    seg = np.cumsum(chain_edge < 0) - 1
    cross = np.flatnonzero(~on_chain)
    cross = cross[np.argsort(graph.dst[cross], kind="stable")]
    d = graph.dst[cross]
    starts = np.flatnonzero(np.concatenate(([True], d[1:] != d[:-1]))) if d.size else np.zeros(0, np.int64)
    has_in = np.zeros(n, dtype=bool)
    has_in[graph.dst] = True
    return Chains(chain_edge=chain_edge, seg=seg, cross=cross, cross_dst_bounds=starts,
                  cross_dsts=d[starts] if d.size else d, sources=np.flatnonzero(~has_in))


def _with_extra(graph: Graph, ch: Chains, extra_dst: np.ndarray) -> Chains:
    """``ch`` with extra cross edges (numbered after the graph's own) merged in, sorted by destination."""
    ids = np.arange(graph.src.size, graph.src.size + extra_dst.size)
    cross = np.concatenate([ch.cross, ids])
    dst = np.concatenate([graph.dst[ch.cross], extra_dst])
    order = np.argsort(dst, kind="stable")
    cross, dst = cross[order], dst[order]
    starts = np.flatnonzero(np.concatenate(([True], dst[1:] != dst[:-1])))
    return Chains(chain_edge=ch.chain_edge, seg=ch.seg, cross=cross, cross_dst_bounds=starts,
                  cross_dsts=dst[starts], sources=np.setdiff1d(ch.sources, extra_dst))


def _edges(graph: Graph, weight: np.ndarray, extra: tuple[np.ndarray, np.ndarray, np.ndarray] | None
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``src, dst, weight`` of the graph's edges followed by the replay's extra ones (numbered after them)."""
    if extra is None:
        return graph.src, graph.dst, weight
    return (np.concatenate([graph.src, extra[0]]), np.concatenate([graph.dst, extra[1]]),
            np.concatenate([weight, extra[2]]))


def _pick(base: np.ndarray, more: np.ndarray | None, idx: np.ndarray) -> np.ndarray:
    """``concatenate([base, more])[idx]`` without the concatenation (a graph's edges are 1 M per column; the
    cross edges a replay reads are a fifth of them)."""
    if more is None or not more.size:
        return base[idx]
    out = np.empty(idx.size, dtype=np.result_type(base, more))
    own = idx < base.size
    out[own] = base[idx[own]]
    out[~own] = more[idx[~own] - base.size]
    return out


def _plan_key(extra: tuple[np.ndarray, np.ndarray, np.ndarray] | None) -> tuple[bytes, bytes] | None:
    """What a graph's plan depends on besides the graph: the extra edges' endpoints."""
    if extra is None or not extra[0].size:
        return None
    return np.asarray(extra[0], np.int64).tobytes(), np.asarray(extra[1], np.int64).tobytes()


def _sweep(graph: Graph, weight: np.ndarray, extra: tuple[np.ndarray, np.ndarray, np.ndarray] | None
           ) -> np.ndarray | None:
    """The compiled sweep's times, or None when it cannot give them exactly (a cycle; int64 overflow risk on
    damaged timestamps spanning centuries). The graph keeps its plan for each set of extra edges."""
    n = graph.n_nodes
    if n == 0:
        return graph.node_time.copy()
    t_meas = graph.node_time
    t0 = int(t_meas.min())
    src, dst, w = _edges(graph, weight, extra)
    bound = int(t_meas.max()) - t0 + (int(np.abs(w).sum(dtype=np.float64)) if w.size else 0)
    if bound >= 1 << 62:
        return None
    try:
        from tracekit.analysis import topological
    except ImportError:  # numba has no build for this interpreter yet: the rounds give the same times
        return None

    key = _plan_key(extra)
    plans = graph.__dict__.setdefault("_plans", {})
    if key not in plans:
        plans[key] = topological.plan(n, src, dst)
    p = plans[key]
    return None if p is None else topological.asap(p, w, t_meas - t0) + t0


def replay(graph: Graph, weight: np.ndarray, ch: Chains | None = None, max_rounds: int = MAX_ROUNDS,
           extra: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None, method: str = "auto"
           ) -> tuple[np.ndarray, int]:
    """Node times of the ASAP schedule under ``weight`` (one per edge); returns (times, rounds).

    ``extra`` adds edges ``(src, dst, weight)`` that only this replay has (e.g. transfers sharing a
    link one after the other, which the measured schedule overlapped). ``method``: ``"rounds"`` (the
    vectorised lane scans below), ``"sweep"`` (one compiled topological pass,
    :mod:`tracekit.analysis.topological`; reported as 1 round) or ``"auto"``: rounds up to a budget
    (:data:`AUTO_NODE_ROUNDS`), then the sweep (and only the sweep for the graph's later replays). All give
    the same times; a graph with a zero-weight cycle (no topological order) is always settled by the rounds.
    """
    if method == "rounds":
        times, rounds, _ = _rounds(graph, weight, ch, max_rounds, extra)
        return times, rounds
    if method == "auto" and not graph.__dict__.get("_sweeps"):
        budget = max(AUTO_MIN_ROUNDS, AUTO_NODE_ROUNDS // max(graph.n_nodes, 1))
        times, rounds, settled = _rounds(graph, weight, ch, min(max_rounds, budget), extra)
        if settled:
            return times, rounds
        graph.__dict__["_sweeps"] = True  # its other replays will not settle in a few rounds either
    swept = _sweep(graph, weight, extra)
    if swept is not None:
        return swept, 1
    times, rounds, _ = _rounds(graph, weight, ch, max_rounds, extra)
    return times, rounds


def _rounds(graph: Graph, weight: np.ndarray, ch: Chains | None, max_rounds: int,
            extra: tuple[np.ndarray, np.ndarray, np.ndarray] | None) -> tuple[np.ndarray, int, bool]:
    """The replay by alternating lane scans and cross edges: ``(times, rounds, settled)``."""
    ch = ch or chains(graph)
    if extra is not None and extra[0].size:
        ch = _with_extra(graph, ch, extra[1])
    n = graph.n_nodes
    t_meas = graph.node_time
    t0 = int(t_meas.min()) if n else 0
    span = int(t_meas.max()) - t0 + 1 if n else 1
    # a[m]: sum of the chain weights from the first node of m's lane up to m (prefix sums per segment), built in
    # one array: a replay's arrays are the graph's size, and two replays may run at once (whatif.predict_many)
    lane_start = ch.chain_edge < 0
    a = weight[np.maximum(ch.chain_edge, 0)].astype(np.int64, copy=False)
    a[lane_start] = 0
    np.cumsum(a, out=a)
    a -= a[np.flatnonzero(lane_start)][ch.seg]
    del lane_start
    scale = int(max(span, max(int(a.max()), -int(a.min())) if a.size else 0,
                    int(weight.max()) if weight.size else 0)) + 1
    n_seg = int(ch.seg.max()) + 1 if ch.seg.size else 1
    # exact int64 arithmetic while every value stays far from overflow; damaged timestamps spanning years
    # fall back to float64 (the replay of such a trace is not worth nanoseconds)
    exact = 64 * scale < 1 << 62
    dt = np.int64 if exact else np.float64
    neg = -8 * scale if exact else -8.0 * scale  # "no constraint", far below any real time (relative to t0)
    # segments are separated in one running max by offsets, when those fit; else a per-segment cummax
    big = 32 * scale  # separates segments in the running max
    offsets = exact and big * (n_seg + 1) < 1 << 62
    seg_off = None
    if offsets:
        seg_off = ch.seg.astype(np.int64)  # a copy (astype copies), scaled in place
        seg_off *= big
    a = a.astype(dt, copy=False)
    t_src = (t_meas[ch.sources] - t0).astype(dt, copy=False)  # the sources keep their measured times
    x = np.full(n, neg, dtype=dt)
    x[ch.sources] = t_src
    times = np.full(n, neg, dtype=dt)
    src = _pick(graph.src, extra[0] if extra is not None else None, ch.cross)
    w = _pick(weight, extra[2] if extra is not None else None, ch.cross).astype(dt, copy=False)
    rounds = 0
    settled = False
    # every round reuses the same buffers: a fresh array per step costs its page faults each round, which on a
    # VM is most of a round's time on millions of nodes
    new = np.empty(n, dtype=dt)
    vals = np.empty(src.size, dtype=dt)
    low = np.empty(max(n, src.size), dtype=bool)
    while rounds < max_rounds:
        rounds += 1
        # chain scan: T = A + segmented cummax(X - A)
        np.subtract(x, a, out=new)
        np.maximum(new, neg, out=new)
        if seg_off is not None:
            new += seg_off
            np.maximum.accumulate(new, out=new)
            new -= seg_off
        else:
            new[:] = pl.DataFrame({"s": ch.seg, "v": new}).select(pl.col("v").cum_max().over("s")).to_series(
                ).to_numpy()
        new += a
        np.less(new, neg // 2, out=low[:n])
        new[low[:n]] = neg
        if np.array_equal(new, times):
            settled = True
            break
        times, new = new, times
        # cross edges: X = max over incoming (T[src] + w), sources keep their time
        if ch.cross.size:
            np.take(times, src, out=vals)
            np.less_equal(vals, neg // 2, out=low[:src.size])
            vals += w
            vals[low[:src.size]] = neg
            best = np.maximum.reduceat(vals, ch.cross_dst_bounds)
            x.fill(neg)
            x[ch.cross_dsts] = best
            x[ch.sources] = t_src
    if not exact:
        times = np.rint(times).astype(np.int64)
    times += t0  # in place: the buffer is this replay's own
    return times, rounds, settled
