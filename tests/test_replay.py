"""The two replays of a dependency graph — vectorised lane rounds and the compiled topological sweep
(:mod:`tracekit.engine`) — give the same schedule on any graph, with or without extra edges; the sweep hands cycles
and int64 overflow risks to the rounds; "auto" sweeps a graph the engine takes at once, and turns to the sweep on
another only when the rounds do not settle within their budget."""

from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.analysis.graph import dag, replay
from tracekit.analysis.graph.dag import EDGE_TYPES, Graph

#: the tests of the sweep itself need the engine's extension (elsewhere the numpy rounds stand in for it)
needs_engine = pytest.mark.skipif(dag.engine() is None, reason="the engine's extension is not built")

OWN, PROGRAM, LAUNCH = (EDGE_TYPES.index(k) for k in ("own", "program", "launch"))


def random_graph(seed: int, lanes: int, per_lane: int, cross: int) -> tuple[Graph, np.ndarray]:
    """Lanes of activities (own + program edges, as dag.build numbers them) and random cross edges forward in
    measured time (so the graph has no cycle); returns the graph and new random weights."""
    rng = np.random.default_rng(seed)
    n_act = lanes * per_lane
    start = np.sort(rng.integers(0, 10**9, (lanes, per_lane)), axis=1).ravel()
    start += np.arange(n_act)  # distinct times: edges forward in time cannot close a loop
    dur = rng.integers(0, 1000, n_act)
    node_time = np.empty(2 * n_act, np.int64)
    node_time[0::2] = start
    node_time[1::2] = start + dur
    a = np.arange(n_act)
    same = (a[1:] // per_lane) == (a[:-1] // per_lane)
    prog_ok = node_time[2 * a[:-1] + 1] <= node_time[2 * a[1:]]
    keep = same & prog_ok
    u = rng.integers(0, 2 * n_act, cross)
    v = rng.integers(0, 2 * n_act, cross)
    fwd = node_time[u] < node_time[v]
    src = np.concatenate([2 * a, 2 * a[:-1][keep] + 1, u[fwd]])
    dst = np.concatenate([2 * a + 1, 2 * a[1:][keep], v[fwd]])
    etype = np.concatenate([np.full(n_act, OWN), np.full(int(keep.sum()), PROGRAM),
                            np.full(int(fwd.sum()), LAUNCH)]).astype(np.int8)
    lag = np.maximum(node_time[dst] - node_time[src], 0) // 2
    g = Graph(act=pl.DataFrame({"a": a}), src=src, dst=dst, lag=lag, etype=etype, node_time=node_time,
              binding=np.full(2 * n_act, -1), slack=np.zeros(src.size, np.int64), violated={})
    return g, rng.integers(0, 5_000_000, src.size)


@needs_engine
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), lanes=st.integers(1, 6), per_lane=st.integers(1, 40),
       cross=st.integers(0, 200), extra=st.integers(0, 30))
def test_sweep_and_rounds_give_the_same_schedule(seed: int, lanes: int, per_lane: int, cross: int,
                                                 extra: int) -> None:
    g, w = random_graph(seed, lanes, per_lane, cross)
    rounds, _ = replay.replay(g, w, method="rounds")
    swept, n = replay.replay(g, w, method="sweep")
    assert n == 1
    assert np.array_equal(swept, rounds)
    if extra:  # extra edges (a link's queue) forward in measured time
        rng = np.random.default_rng(seed + 1)
        u, v = rng.integers(0, g.n_nodes, (2, extra))
        fwd = g.node_time[u] < g.node_time[v]
        more = (u[fwd], v[fwd], rng.integers(0, 10**7, int(fwd.sum())))
        assert np.array_equal(replay.replay(g, w, extra=more, method="sweep")[0],
                              replay.replay(g, w, extra=more, method="rounds")[0])


def test_every_node_is_at_least_each_predecessor_plus_its_weight() -> None:
    g, w = random_graph(7, 5, 300, 2000)
    t, _ = replay.replay(g, w, method="sweep")
    assert (t[g.dst] >= t[g.src] + w).all()
    has_in = np.zeros(g.n_nodes, bool)
    has_in[g.dst] = True
    assert np.array_equal(t[~has_in], g.node_time[~has_in])  # sources keep their measured time
    # every other node is attained by one of its incoming edges (ASAP, not merely feasible)
    best = pl.DataFrame({"d": g.dst, "v": t[g.src] + w}).group_by("d").agg(pl.col("v").max())
    assert np.array_equal(t[best["d"].to_numpy()], best["v"].to_numpy())


@needs_engine
def test_plans_are_kept_per_graph_and_extra_edges() -> None:
    g, w = random_graph(3, 4, 50, 100)
    e = (np.array([0]), np.array([g.n_nodes - 1]), np.array([10**9]))
    replay.replay(g, w, method="sweep")
    replay.replay(g, w, extra=e, method="sweep")
    assert len(g.__dict__["_plans"]) == 2
    t, _ = replay.replay(g, w, extra=e, method="sweep")
    assert t[-1] >= t[0] + 10**9


@needs_engine
def test_a_cycle_is_settled_by_the_rounds() -> None:
    """A zero-weight loop (zero-length activities in damaged traces) has no topological order."""
    g, w = random_graph(5, 3, 20, 30)
    own = np.flatnonzero(g.etype == OWN)[4]
    loop = (g.dst[own:own + 1], g.src[own:own + 1], -w[own:own + 1])  # end -> start, cancelling the own edge
    assert dag.engine().plan(g.n_nodes, np.append(g.src, loop[0]), np.append(g.dst, loop[1])) is None
    rounds, _ = replay.replay(g, w, extra=loop, method="rounds")
    swept, n = replay.replay(g, w, extra=loop, method="sweep")
    assert n > 1 and np.array_equal(swept, rounds)


@needs_engine
def test_spans_beyond_int64_go_to_the_rounds() -> None:
    g, w = random_graph(9, 3, 20, 30)
    huge = dataclasses.replace(g, node_time=g.node_time.copy())
    huge.node_time[-1] += 1 << 62
    swept, n = replay.replay(huge, w, method="sweep")
    assert n > 1
    assert np.array_equal(swept, replay.replay(huge, w, method="rounds")[0])


@needs_engine
def test_auto_turns_to_the_sweep_when_the_rounds_run_out(monkeypatch) -> None:
    g, w = random_graph(11, 6, 200, 3000)
    expected, needed = replay.replay(g, w, method="rounds")
    assert needed > 3
    monkeypatch.setattr(replay, "_sweep_first", lambda graph: False)  # as without the engine
    monkeypatch.setattr(replay, "AUTO_NODE_ROUNDS", 0)
    monkeypatch.setattr(replay, "AUTO_MIN_ROUNDS", 2)
    t, n = replay.replay(g, w)
    assert n == 1 and np.array_equal(t, expected)
    assert g.__dict__["_sweeps"]  # and the graph's later replays go straight to the sweep
    assert replay.replay(g, g.weight())[1] == 1
    small, _ = random_graph(11, 6, 200, 3000)
    monkeypatch.setattr(replay, "AUTO_MIN_ROUNDS", needed)
    t, n = replay.replay(small, w)  # rounds enough to settle: no sweep
    assert n == needed and np.array_equal(t, expected) and not small.__dict__.get("_sweeps")


@needs_engine
def test_auto_sweeps_at_once_where_the_engine_is_built() -> None:
    g, w = random_graph(12, 6, 200, 3000)
    expected, needed = replay.replay(g, w, method="rounds")
    assert needed > 1
    t, n = replay.replay(g, w)
    assert n == 1 and np.array_equal(t, expected)


@pytest.mark.parametrize("how", ["env", "not built"])
def test_without_the_engine_the_rounds_answer(monkeypatch, how: str) -> None:
    """Without the engine's C extension (no compiler at install, or ``TRACEKIT_NO_EXTENSION=1``) every graph still
    replays, by the rounds."""
    import sys

    g, w = random_graph(13, 4, 100, 800)
    expected, _ = replay.replay(g, w, method="rounds")
    if how == "env":
        monkeypatch.setenv("TRACEKIT_NO_EXTENSION", "1")
    else:
        monkeypatch.setitem(sys.modules, "tracekit.engine._kernels", None)  # an import of it fails
        for name in ("tracekit.engine", "tracekit.engine.schedule", "tracekit.engine.paths",
                     "tracekit.engine.scenarios"):
            monkeypatch.delitem(sys.modules, name, raising=False)
    assert dag.engine() is None
    t, n = replay.replay(g, w, method="sweep")
    assert n > 1 and np.array_equal(t, expected)
