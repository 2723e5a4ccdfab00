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
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from tracekit.analysis import iterations
from tracekit.analysis.graph.dag import EDGE_TYPES, Graph

if TYPE_CHECKING:
    from tracekit.engine import Iterations, Plan

_OWN = EDGE_TYPES.index("own")
_PROGRAM = EDGE_TYPES.index("program")
MAX_ROUNDS = 100_000
#: where the engine is not there to sweep at once, "auto" gives the rounds this many node-rounds (nodes x rounds, ~12
#: ns each) before it turns to the sweep (which then has the rounds answer too: without the engine, no sweep)
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


def expanded(graph: Graph) -> Graph:
    """``graph`` as a replay sees it: each hub of its collective edges
    (:class:`tracekit.analysis.graph.collective_edges.Hubs`) a node of its own after the graph's nodes, every
    member's start → the hub (weight 0) and the hub → each edge that leaves it; the graph's own edges keep their
    numbers (the hubs' are after them). The graph itself where it has no hubs; kept on the graph."""
    h = graph.hubs
    if h is None or h.edge.size == 0:
        return graph
    kept = graph.__dict__.get("_expanded")
    if kept is not None:
        return kept
    n = graph.n_nodes
    src = np.concatenate([graph.src, h.member])
    src[h.edge] = n + h.hub
    into = n + np.repeat(np.arange(h.count, dtype=np.int64), np.diff(h.ptr))
    start = graph.node_time[h.member]
    hub_time = np.maximum.reduceat(start, h.ptr[:-1]) if start.size else start
    m = src.size
    # a replay reads the measured weights (lag + slack: all on lag here) and never a binding: the arrays it does not
    # read are left unwritten (np.zeros maps no memory until written)
    out = Graph(act=graph.act, src=src, dst=np.concatenate([graph.dst, into]),
                lag=_expanded_weight(graph, graph.weight()), etype=np.concatenate(
                    [graph.etype, np.full(h.member.size, EDGE_TYPES.index("collective"), np.int8)]),
                node_time=np.concatenate([graph.node_time, hub_time]), binding=np.zeros(n + h.count, np.int64),
                slack=np.zeros(m, np.int64), violated=graph.violated, kind=graph.kind)
    graph.__dict__["_expanded"] = out
    return out


def _expanded_weight(graph: Graph, weight: np.ndarray) -> np.ndarray:
    """Per edge of :func:`expanded` ``graph``: ``weight`` (the graph's own edges), then 0 on the edges into hubs."""
    h = graph.hubs
    if h is None or h.edge.size == 0:
        return weight
    return np.concatenate([weight, np.zeros(h.member.size, weight.dtype)])


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


def plan(graph: Graph, extra: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None, exact: bool = False
         ) -> Plan | None:
    """The graph's :class:`tracekit.engine.Plan` with the ``extra`` edges (numbered after its own), kept on the graph
    per set of extra edges; None where the edges close a cycle or the engine is not there. Without extra edges, a plan
    made with some serves (:func:`tracekit.engine.asap` leaves out edges it is given no weight for), unless
    ``exact``."""
    from tracekit.analysis.graph.dag import engine

    compiled = engine()
    if compiled is None:
        return None
    graph = expanded(graph)
    if graph.n_nodes > compiled.MAX_SIZE or graph.src.size + (0 if extra is None else extra[0].size) > \
            compiled.MAX_SIZE:
        return None
    key = _plan_key(extra)
    plans = graph.__dict__.setdefault("_plans", {})
    if key is None and not exact and key not in plans:
        with_more = [p for k, p in plans.items() if k is not None and p is not None]
        if with_more:
            return with_more[0]
    if key not in plans:
        plans[key] = compiled.plan(graph.n_nodes, graph.src, graph.dst, None if extra is None else extra[:2])
    return plans[key]


def _sweep(graph: Graph, weight: np.ndarray, extra: tuple[np.ndarray, np.ndarray, np.ndarray] | None
           ) -> np.ndarray | None:
    """The compiled sweep's times, or None when it cannot give them exactly (a cycle; int64 overflow risk on
    damaged timestamps spanning centuries; the engine not there). The graph keeps its plan for each set of extra
    edges."""
    n = graph.n_nodes
    if n == 0:
        return graph.node_time.copy()
    t_meas = graph.node_time
    t0, t1 = int(t_meas.min()), int(t_meas.max())
    more = None if extra is None else extra[2]
    reach = sum(int(np.abs(x).sum(dtype=np.float64)) for x in (weight, more) if x is not None and x.size)
    if t1 - t0 + reach >= 1 << 62:
        return None
    p = plan(graph, extra)
    if p is None:
        return None
    from tracekit.engine import asap

    if t0 - reach > -(1 << 62) and t1 + reach < 1 << 62:  # every time within int64 as it is
        return asap(p, weight, t_meas, more)
    out = asap(p, weight, t_meas - t0, more)
    out += t0
    return out


def replay(graph: Graph, weight: np.ndarray, ch: Chains | None = None, max_rounds: int = MAX_ROUNDS,
           extra: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None, method: str = "auto"
           ) -> tuple[np.ndarray, int]:
    """Node times of the ASAP schedule under ``weight`` (one per edge); returns (times, rounds).

    ``extra`` adds edges ``(src, dst, weight)`` that only this replay has (e.g. transfers sharing a
    link one after the other, which the measured schedule overlapped). ``method``: ``"rounds"`` (the
    vectorised lane scans below), ``"sweep"`` (one compiled topological pass, :mod:`tracekit.engine`;
    reported as 1 round) or ``"auto"``: the sweep on a graph the engine takes
    (:func:`tracekit.analysis.graph.dag.engine`), else rounds up to a budget (:data:`AUTO_NODE_ROUNDS`), then the
    sweep (and only the sweep for the graph's later replays). All give the same times; a graph with a zero-weight
    cycle (no topological order) is always settled by the rounds. A graph with hubs replays as :func:`expanded`
    (``ch`` is then that graph's), its times returned for the graph's own nodes.
    """
    if graph.hubs is not None and graph.hubs.edge.size:
        n = graph.n_nodes
        times, rounds = replay(expanded(graph), _expanded_weight(graph, weight), ch, max_rounds, extra, method)
        return times[:n], rounds
    if method == "rounds":
        times, rounds, _ = _rounds(graph, weight, ch, max_rounds, extra)
        return times, rounds
    if method == "auto" and not graph.__dict__.get("_sweeps"):
        if not _sweep_first(graph):
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


def iteration_times(graph: Graph, changes: list[tuple[np.ndarray, np.ndarray, tuple | None]],
                    iteration_of: np.ndarray, threads: int = 1) -> list[int] | None:
    """The iteration time (:func:`period`) of each scenario of ``graph`` — ``(edges, weights, extra)``: the edges it
    re-weights from the measured weights, and its extra edges, the same ones in every scenario (or None in all) —
    by the compiled grid (:func:`tracekit.engine.iteration_times`, on ``threads`` threads); None where the engine is
    not there, the edges close a cycle or a time could leave int64 (replay them one by one then)."""
    extra = changes[0][2] if changes else None
    graph = expanded(graph)  # the hubs' edges are after the graph's own: the changes' edge numbers hold
    t = graph.node_time
    if "_reach" not in graph.__dict__:  # how far the measured weights can move a time
        graph.__dict__["_reach"] = float(np.abs(graph.weight()).sum())
    reach = graph.__dict__["_reach"] + sum(
        float(np.abs(w).sum()) + (float(np.abs(x[2]).sum()) if x is not None else 0.0) for _, w, x in changes)
    if not changes or not t.size or int(t.max()) - int(t.min()) + reach >= 1 << 62:
        return None
    p = plan(graph, extra, exact=True)
    if p is None:
        return None
    from tracekit import engine

    grids = graph.__dict__.setdefault("_grids", {})
    key = _plan_key(extra)
    if key not in grids:  # the measured weights (the extra edges' are each scenario's own), times from the earliest
        more = np.zeros(0 if extra is None else extra[0].size, np.int64)
        grids[key] = engine.grid(p, np.concatenate([graph.weight(), more]), t - t.min(), _iterations(graph,
                                                                                                   iteration_of))
    m = graph.src.size
    scen = [(np.concatenate([e, m + np.arange(x[0].size)]), np.concatenate([w, x[2]])) if x is not None else (e, w)
            for e, w, x in changes]
    return engine.iteration_times(grids[key], scen, threads).tolist()


def _iterations(graph: Graph, iteration_of: np.ndarray) -> Iterations:
    """The engine's view of which activities an iteration time is read from (kept on the graph with the
    ``iteration_of`` it was made from: every what-if of a graph counts the same activities)."""
    kept = graph.__dict__.get("_iterations")
    if kept is None or not (kept[0] is iteration_of or np.array_equal(kept[0], iteration_of)):
        from tracekit import engine

        kept = graph.__dict__["_iterations"] = (iteration_of, engine.iterations(iteration_of,
                                                                                iteration_of > -(1 << 61)))
    return kept[1]


def period(graph: Graph, times: np.ndarray, iteration_of: np.ndarray) -> int:
    """The iteration time of the schedule ``times`` of ``graph``: the median time between consecutive iteration
    starts, each iteration from its earliest activity that counts (``iteration_of``: per activity its iteration, or
    a huge negative number where it does not count); where no iteration starts after another, the median iteration
    span. Compiled on a graph the engine takes (:func:`tracekit.engine.period`, the same figure)."""
    valid = iteration_of > -(1 << 61)
    if times.size == 0:
        return 0
    if not valid.any():
        return int(times.max() - times.min())
    if _sweep_first(graph):
        from tracekit import engine

        return engine.period(times, _iterations(graph, iteration_of))
    return iterations.period(iteration_of[valid], times[0::2][valid], times[1::2][valid])


def _sweep_first(graph: Graph) -> bool:
    """Whether "auto" sweeps ``graph`` at once: when the engine takes it
    (:func:`tracekit.analysis.graph.dag.engine`)."""
    from tracekit.analysis.graph.dag import engine

    return engine(graph.n_nodes) is not None


def _rounds(graph: Graph, weight: np.ndarray, ch: Chains | None, max_rounds: int,
            extra: tuple[np.ndarray, np.ndarray, np.ndarray] | None) -> tuple[np.ndarray, int, bool]:
    """The replay by alternating lane scans and cross edges: ``(times, rounds, settled)``."""
    if ch is None:  # kept on the graph: every replay of it splits it the same way
        ch = graph.__dict__.get("_chains") or graph.__dict__.setdefault("_chains", chains(graph))
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
