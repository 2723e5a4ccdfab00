"""The graph engine (:mod:`tracekit.engine`, its loops in C) gives the answers of the numpy paths it replaces: the
same binding edges and slack, the same chains back along them, the same schedules and iteration times — for one
scenario and for a grid of them — and, on recorded jobs, the same summary and what-if as without it."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_replay import random_graph
from tracekit.analysis.graph import critical_path, dag, replay, whatif

engine = dag.engine()
if engine is None:  # CI (TRACEKIT_REQUIRE_EXTENSION=1) fails here; elsewhere the numpy paths stand in for it
    if os.environ.get("TRACEKIT_REQUIRE_EXTENSION", "0") not in ("", "0"):
        raise ImportError("the graph engine's extension (tracekit/engine/_kernels.c) is not built")
    pytest.skip("the engine's extension is not built (or TRACEKIT_NO_EXTENSION=1)", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]


def _numpy_bind(src: np.ndarray, dst: np.ndarray, lag: np.ndarray, times: np.ndarray, monkeypatch) -> tuple:
    with monkeypatch.context() as m:
        m.setattr(dag, "engine", lambda n_nodes=None: None)
        return dag.bind(src, dst, lag, times)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), lanes=st.integers(1, 5), per_lane=st.integers(1, 30),
       cross=st.integers(0, 150))
def test_binding_edges_and_slack_are_numpys(seed: int, lanes: int, per_lane: int, cross: int) -> None:
    g, _ = random_graph(seed, lanes, per_lane, cross)
    rng = np.random.default_rng(seed)
    lag = rng.integers(0, 3, g.src.size) * (g.lag // 2)  # many ties between edges into one node
    mp = pytest.MonkeyPatch()
    try:
        expected = _numpy_bind(g.src, g.dst, lag, g.node_time, mp)
    finally:
        mp.undo()
    got = engine.bind(g.src, g.dst, lag, g.node_time)
    assert np.array_equal(got[0], expected[0]) and np.array_equal(got[1], expected[1])


def test_chains_back_are_the_loops(monkeypatch) -> None:
    g, _ = random_graph(21, 5, 200, 1500)
    binding, slack = engine.bind(g.src, g.dst, g.lag, g.node_time)
    g.binding, g.slack = binding, slack
    sinks = np.argsort(g.node_time)[-5:]
    compiled = [engine.chase(binding, g.src, g.node_time, int(s), int(g.node_time.min()) + 1) for s in sinks]
    monkeypatch.setattr(dag, "engine", lambda n_nodes=None: None)
    for s, (nodes, edges) in zip(sinks, compiled, strict=True):
        loop = critical_path._chase(g, int(s), int(g.node_time.min()) + 1)
        assert nodes.size > 1 and np.array_equal(nodes, loop[0]) and np.array_equal(edges, loop[1])


def test_a_plan_with_more_edges_is_the_plan_of_all_of_them() -> None:
    g, w = random_graph(5, 4, 100, 600)
    rng = np.random.default_rng(1)
    u, v = rng.integers(0, g.n_nodes, (2, 200))
    fwd = g.node_time[u] < g.node_time[v]
    more = (u[fwd], v[fwd], rng.integers(0, 10**6, int(fwd.sum())))
    split = engine.plan(g.n_nodes, g.src, g.dst, more[:2])
    joined = engine.plan(g.n_nodes, np.concatenate([g.src, more[0]]), np.concatenate([g.dst, more[1]]))
    assert split is not None and joined is not None
    assert np.array_equal(engine.asap(split, w, g.node_time, more[2]),
                          engine.asap(joined, np.concatenate([w, more[2]]), g.node_time))


def _iteration_of(g, n_its: int, seed: int) -> np.ndarray:
    """Iterations by time (a few activities not counted), as whatif.Model.iteration_of has them."""
    start = g.node_time[0::2]
    it = np.searchsorted(np.quantile(start, np.linspace(0, 1, n_its + 1)[1:-1]), start).astype(np.int64)
    it[np.random.default_rng(seed).random(it.size) < 0.1] = -(1 << 62)
    return it


def _polars_period(g, times: np.ndarray, it: np.ndarray, monkeypatch) -> int:
    with monkeypatch.context() as m:
        m.setattr(replay, "_sweep_first", lambda graph: False)
        return replay.period(g, times, it)


@pytest.mark.parametrize("n_its", [1, 2, 7])
def test_iteration_times_are_the_polars_ones(n_its: int, monkeypatch) -> None:
    g, w = random_graph(8 + n_its, 6, 150, 1200)
    it = _iteration_of(g, n_its, n_its)
    times, _ = replay.replay(g, w, method="sweep")
    for t in (g.node_time, times):
        assert replay.period(g, t, it) == _polars_period(g, t, it, monkeypatch) > 0


def test_a_grid_of_scenarios_is_each_scenario_replayed_alone(monkeypatch) -> None:
    g, w = random_graph(31, 6, 150, 1500)
    g.lag = w.copy()  # the measured weights of the grid's base are the graph's lag + slack
    it = _iteration_of(g, 5, 3)
    rng = np.random.default_rng(4)
    u, v = rng.integers(0, g.n_nodes, (2, 40))
    fwd = g.node_time[u] < g.node_time[v]
    extra_ends = (u[fwd], v[fwd])
    changes = []
    for k in range(9):
        edges = np.unique(rng.integers(0, g.src.size, 30 * k))
        weights = rng.integers(0, 5_000_000, edges.size)
        extra = (*extra_ends, rng.integers(0, 10**7, extra_ends[0].size)) if k % 3 else None
        changes.append((edges, weights, extra))
    one_by_one = []
    for edges, weights, extra in changes:
        ww = g.weight()
        ww[edges] = weights
        times, _ = replay.replay(g, ww, extra=extra, method="rounds")
        one_by_one.append(_polars_period(g, times, it, monkeypatch))
    assert len(set(one_by_one)) > 3
    with_extra = [c for c in changes if c[2] is not None]
    without = [c for c in changes if c[2] is None]
    for threads in (1, 3):
        got = replay.iteration_times(g, with_extra, it, threads) + replay.iteration_times(g, without, it, threads)
        assert got == [t for c, t in zip(changes, one_by_one, strict=True) if c[2] is not None] + \
            [t for c, t in zip(changes, one_by_one, strict=True) if c[2] is None]


@pytest.fixture(scope="module")
def pipeline_job() -> Path:
    return ROOT / "tests" / "data" / "jobs" / "pipeline-1gbit"


def _summary(path: Path, monkeypatch, compiled: bool) -> tuple[dict, list[int]]:
    """``summary --json``'s payload and a what-if grid of the job, with the engine taking every graph or none."""
    import tracekit

    with monkeypatch.context() as m:
        if compiled:
            m.setattr(whatif, "GRID_SCENARIOS", 2)
        else:
            m.setattr(dag, "engine", lambda n_nodes=None: None)
        job = tracekit.load([str(path)], link_bw="1gbit", cache=False)
        grid = [whatif.Scenario(bandwidth_bps=r, compression=c) for r in (2e8, 1e9, 5e9) for c in (1, 2)]
        rows = whatif.predict_many(job.analysis.whatif, [whatif.Scenario(free=True), *grid])
        return json.loads(json.dumps(job.summary(), default=str)), rows


@pytest.mark.parametrize("name", ["pipeline-1gbit", "fsdp-1gbit", "class-straggler-bound"])
def test_a_recorded_jobs_answers_are_the_same_with_the_engine(name: str, monkeypatch) -> None:
    path = ROOT / "tests" / "data" / "jobs" / name
    with_engine = _summary(path, monkeypatch, True)
    without = _summary(path, monkeypatch, False)
    assert with_engine[1] == without[1] and len(set(without[1])) > 2
    assert with_engine[0] == without[0]


@pytest.mark.parametrize("name", ["pipeline-1gbit", "class-straggler-bound", "dp-tp-300mbit"])
def test_critical_paths_are_the_numpy_ones(name: str, monkeypatch) -> None:
    """Every iteration's path (chain, segments, labels, waiting on other ranks) by the engine and without it."""
    import tracekit

    job = tracekit.load([str(ROOT / "tests" / "data" / "jobs" / name)], cache=False)
    a = job.analysis
    compiled = critical_path.paths(a.graph, a.iterations, a.ranks)
    assert (compiled["label"] == "waiting").any() or name != "class-straggler-bound"
    monkeypatch.setattr(dag, "engine", lambda n_nodes=None: None)
    g = dataclasses.replace(a.graph)  # nothing the engine's paths kept on the graph
    assert compiled.equals(critical_path.paths(g, a.iterations, a.ranks))


def test_paths_of_a_replayed_schedule_share_what_they_read_of_the_activities() -> None:
    g, w = random_graph(41, 3, 50, 200)
    g.act = g.act.with_columns(pl.lit("compute").alias("kind"), pl.lit("k").alias("name"),
                               pl.lit(0, dtype=pl.Int32).alias("rank"), pl.lit(0).alias("device"),
                               pl.lit(0, dtype=pl.Int64).alias("iteration"))
    labels = critical_path._activity_labels(g)
    times, _ = replay.replay(g, w, method="sweep")
    s = critical_path.of_schedule(g, times, w)
    assert critical_path._activity_labels(s) is labels
    assert (labels == critical_path.LABELS.index("compute")).all()
