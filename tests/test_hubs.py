"""Collective edges from a hub (:class:`tracekit.analysis.graph.collective_edges.Hubs`): a collective of many members
keeps one edge per member, from the latest member's start, instead of one per pair. The constraints are the same, so
every answer must be too: replays, critical paths (with who was waited on), replayed schedules' paths and the verdict
equal those of the graph with an edge per pair, to the nanosecond, in memory, rank by rank and from the cache."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import tracekit
from benchmarks import jobgen
from tracekit.analysis.graph import collective_edges, critical_path, replay
from tracekit.analysis.graph.dag import EDGE_TYPES
from tracekit.analysis.graph.whatif import Scenario, predict_many, schedule

#: 8 ranks on 4 hosts, DDP all-reduces over all 8; rank 5 computes 30 % slower; clocks skewed
DDP = jobgen.JobSpec(ranks=8, gpus_per_host=2, steps=4, layers=8, param_bytes=8 << 20, bucket_bytes=16 << 20,
                     clock_skew_ns=500_000, stragglers=((5, 1.3),))
#: FSDP over 8 ranks: all-gathers and reduce-scatters of 8 members, queued on one link
FSDP = replace(DDP, parallel="fsdp", stragglers=((2, 1.2),))
SCENARIOS = [Scenario(free=True), Scenario(), Scenario(bandwidth_scale=4), Scenario(bandwidth_scale=0.25),
             Scenario(efficiency="full"), Scenario(balanced=True)]
_COLL = EDGE_TYPES.index("collective")


@pytest.fixture(scope="module", params=["ddp", "fsdp"])
def job(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp(request.param)
    jobgen.write_job(root, DDP if request.param == "ddp" else FSDP)
    return root


def _pairs(monkeypatch: pytest.MonkeyPatch, path: Path, **kw) -> tracekit.Job:
    """The job with an edge per pair of members (no hubs: the graph as it was built before them)."""
    with monkeypatch.context() as m:
        m.setattr(collective_edges, "HUB_MEMBERS", 1 << 30)
        job = tracekit.load(path, cache=False, link_bw="10gbit", **kw)
        job.analysis.graph  # noqa: B018 - built inside the patch
        return job


def _paths_equal(a: pl.DataFrame, b: pl.DataFrame) -> None:
    assert a.columns == b.columns
    assert a.height == b.height and a.height > 0
    assert a.equals(b), "critical paths differ"


def test_hubs_keep_one_edge_per_member(job: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hubbed = tracekit.load(job, cache=False, link_bw="10gbit").analysis.graph
    pairs = _pairs(monkeypatch, job).analysis.graph
    assert pairs.hubs is None and hubbed.hubs is not None
    h = hubbed.hubs
    members = np.diff(h.ptr)
    assert (members == 8).all() and h.edge.size == members.sum()  # one edge per member of every instance
    n_pairs = int((pairs.etype == _COLL).sum())
    n_hub = int((hubbed.etype == _COLL).sum())
    assert n_hub == h.edge.size and n_pairs == 7 * n_hub  # 8 x 7 pairs per instance against 8 edges
    # the edge kept is the binding one of the pairs: the same binding edge (source and lag) into every node
    eb, ep = hubbed.binding, pairs.binding
    assert np.array_equal(eb >= 0, ep >= 0)
    bound = eb >= 0
    assert np.array_equal(hubbed.src[eb[bound]], pairs.src[ep[bound]])
    assert np.array_equal(hubbed.weight()[eb[bound]], pairs.weight()[ep[bound]])
    assert np.array_equal(hubbed.etype[eb[bound]], pairs.etype[ep[bound]])


def test_hubs_answer_as_pairs(job: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hubbed = tracekit.load(job, cache=False, link_bw="10gbit")
    pairs = _pairs(monkeypatch, job)
    ma, mb = hubbed.analysis.whatif, pairs.analysis.whatif
    assert predict_many(ma, SCENARIOS) == predict_many(mb, SCENARIOS)
    # a replay's nodes, each scenario, one by one (the grid above, the replay here)
    for sc in SCENARIOS:
        assert np.array_equal(schedule(ma, sc).times, schedule(mb, sc).times), sc
    a, b = hubbed.analysis, pairs.analysis
    _paths_equal(a.critical_path, b.critical_path)
    # the critical path of replayed schedules: the hub's edge comes from the member latest in that schedule
    for sc in (Scenario(bandwidth_scale=0.25), Scenario(balanced=True), Scenario(free=True)):
        sa, sb = schedule(ma, sc), schedule(mb, sc)
        ga = critical_path.of_schedule(ma.graph, sa.times, sa.weight, sa.extra)
        gb = critical_path.of_schedule(mb.graph, sb.times, sb.weight, sb.extra)
        spans = critical_path.schedule_spans(ma.iteration_of, sa.times)
        _paths_equal(critical_path.paths(ga, a.iterations, a.ranks, spans=spans),
                     critical_path.paths(gb, b.iterations, b.ranks, spans=spans))
    assert a.verdict.text == b.verdict.text
    assert a.verdict.as_dict() == b.verdict.as_dict()


def test_a_late_member_is_waited_on_through_the_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slowing rank 5's link changes which member arrives last at some instances: the replay must take every
    member's arrival (the hub), not the one that was last as measured."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        jobgen.write_job(Path(d), replace(DDP, stragglers=((5, 1.05), (2, 1.04))))
        hubbed = tracekit.load(d, cache=False, link_bw="10gbit")
        pairs = _pairs(monkeypatch, Path(d))
        ma, mb = hubbed.analysis.whatif, pairs.analysis.whatif
        # a replay in which the compute of rank 2 takes twice as long: members arrive in another order
        times = []
        for g in (ma.graph, mb.graph):
            w = g.weight()
            act = g.act
            slow = ((act.get_column("rank") == 2) & (act.get_column("kind") == "compute")).to_numpy()
            own = np.flatnonzero(g.etype == EDGE_TYPES.index("own"))
            own = own[slow[g.dst[own] // 2]]
            assert own.size > 10
            w[own] += g.lag[own]
            times.append(replay.replay(g, w)[0])
        ta, tb = times
        g = ma.graph
        assert np.array_equal(ta, tb)
        assert not np.array_equal(ta, g.node_time)


def test_rank_by_rank_and_the_cache_keep_the_hubs(job: Path, tmp_path: Path) -> None:
    a = tracekit.load(job, cache=False, link_bw="10gbit")
    b = tracekit.load(job, link_bw="10gbit", dataset=tmp_path / "ds")
    gb = b.analysis.graph
    assert gb.hubs is not None and gb.hubs.edge.size == a.analysis.graph.hubs.edge.size
    pa, pb = predict_many(a.analysis.whatif, SCENARIOS), predict_many(b.analysis.whatif, SCENARIOS)
    exact = [not sc.balanced for sc in SCENARIOS]
    assert [x for x, e in zip(pa, exact, strict=True) if e] == [x for x, e in zip(pb, exact, strict=True) if e]
    # "stragglers removed" scales a merged run of the compact graph once, not member by member (compact.py)
    assert pa[-1] == pytest.approx(pb[-1], abs=1_000)
    assert a.critical_path_summary.get_column("path_ns").to_list() == \
        b.critical_path_summary.get_column("path_ns").to_list()
    cache = tmp_path / "cache"
    first = tracekit.load(job, link_bw="10gbit", cache_dir=cache)
    first.analysis.verdict  # noqa: B018 - stores the graph with the results
    again = tracekit.load(job, link_bw="10gbit", cache_dir=cache)
    g = again.analysis.graph
    assert g.hubs is not None
    h0 = a.analysis.graph.hubs
    assert np.array_equal(g.hubs.edge, h0.edge) and np.array_equal(g.hubs.member, h0.member)
    assert predict_many(again.analysis.whatif, SCENARIOS) == predict_many(a.analysis.whatif, SCENARIOS)
