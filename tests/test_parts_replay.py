"""A job's graph replayed rank by rank, collective by collective (:mod:`tracekit.engine.parts`,
:mod:`tracekit.scale.exchange`): each rank's part settles what it can, reports its members' arrivals, and a hub is
released once all its members arrived — the times must be those of the replay of the whole graph, to the nanosecond,
for every scenario at once, with the what-if's queued transfers and its "stragglers removed"."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import tracekit
from benchmarks import jobgen
from tracekit.analysis.graph import parts, replay
from tracekit.analysis.graph.whatif import Scenario, _changes
from tracekit.engine import parts as engine_parts
from tracekit.scale import exchange

pytest.importorskip("tracekit.engine._kernels")

DDP = jobgen.JobSpec(ranks=8, gpus_per_host=2, steps=4, layers=8, param_bytes=8 << 20, bucket_bytes=16 << 20,
                     clock_skew_ns=500_000, stragglers=((5, 1.3),))
SPECS = {"ddp": DDP, "fsdp": replace(DDP, parallel="fsdp", stragglers=((2, 1.2),)),
         "mesh": jobgen.JobSpec(ranks=16, gpus_per_host=4, tp=2, pp=2, microbatches=2, steps=4, layers=8,
                                clock_skew_ns=500_000, inter_bps=25e9, intra_bps=400e9)}
QUEUED = [Scenario(), Scenario(bandwidth_scale=4), Scenario(bandwidth_scale=0.25), Scenario(balanced=True)]


@pytest.fixture(scope="module", params=list(SPECS))
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp(request.param)
    jobgen.write_job(root, SPECS[request.param])
    return tracekit.load(root, cache=False, link_bw="10gbit").analysis.whatif


@pytest.mark.parametrize("free", [True, False])
def test_rank_by_rank_replay_equals_the_whole_graphs(model, free: bool) -> None:
    g = model.graph
    scenarios = [Scenario(free=True), Scenario(free=True, balanced=True)] if free else QUEUED
    want, weights, extra = [], [], None
    for sc in scenarios:
        edges, w_new, extra, _ = _changes(model, sc)
        w = g.weight()
        w[edges] = w_new
        want.append(replay.replay(g, w, extra=extra)[0])
        weights.append(parts.replay_weight(g, w, None if extra is None else extra[2]))
    assert (extra is None) == free
    split = parts.split(g, None if extra is None else extra[:2])
    assert len(split.parts) == len(set(g.act.get_column("rank").to_list()))
    hosts = [exchange.Parts(split.parts[i::2], split.weights(np.stack(weights))[i::2]) for i in range(2)]
    hub_t, rounds = exchange.settle(hosts, split.members, len(scenarios))
    assert rounds > 2 and hub_t.shape == (split.members.size, len(scenarios))
    got = _times(split, hosts, g.n_nodes)
    for i, sc in enumerate(scenarios):
        assert np.array_equal(got[:, i], want[i]), sc
    assert not np.array_equal(want[0], want[-1])  # the scenarios differ: each column is its own


def _times(split: parts.Split, hosts: list[exchange.Parts], n: int) -> np.ndarray:
    """The graph's times from the hosts of :func:`test_rank_by_rank_replay_equals_the_whole_graphs` (parts dealt in
    turn)."""
    per = [None] * len(split.parts)
    for h, host in enumerate(hosts):
        for j, t in enumerate(host.times()):
            per[h + 2 * j] = t
    return split.times(per, n)


def test_a_cycle_through_hubs_is_reported() -> None:
    # two parts, each waiting for the other's member before its own arrives
    a = engine_parts.Part(start=np.array([0, 0]), src=np.array([1]), dst=np.array([0]), tgt_hub=np.array([0]),
                          tgt_dst=np.array([1]), mem_node=np.array([0]), mem_hub=np.array([1]), hubs=np.array([0, 1]))
    b = engine_parts.Part(start=np.array([0, 0]), src=np.array([1]), dst=np.array([0]), tgt_hub=np.array([1]),
                          tgt_dst=np.array([1]), mem_node=np.array([0]), mem_hub=np.array([0]), hubs=np.array([0, 1]))
    host = exchange.Parts([a, b], [np.zeros((1, 2), np.int64)] * 2)
    with pytest.raises(ValueError, match="never released"):
        exchange.settle([host], np.array([1, 1]), 1)


def test_a_hub_waits_for_its_latest_member() -> None:
    # three parts of one node each arrive at hub 0 at 5, 9 and 7; each then ends 2 after the hub
    ps = [engine_parts.Part(start=np.array([t, 0]), src=np.zeros(0, np.int64), dst=np.zeros(0, np.int64),
                            tgt_hub=np.array([0]), tgt_dst=np.array([1]), mem_node=np.array([0]),
                            mem_hub=np.array([0]), hubs=np.array([7])) for t in (5, 9, 7)]
    members = np.zeros(8, np.int64)
    members[7] = 3
    members[:7] = 0
    host = exchange.Parts(ps, [np.array([[2], [3]])] * 3)  # two scenarios: the hub edge weighs 2, then 3
    hub_t, _ = exchange.settle([host], members, 2)
    assert hub_t[7].tolist() == [9, 9]
    assert [t[:, 0].tolist() for t in host.times()] == [[5, 11], [9, 11], [7, 11]]
    assert [t[1, 1] for t in host.times()] == [12, 12, 12]


def test_each_ranks_part_from_its_own_graph(tmp_path: Path) -> None:
    """The parts built where the ranks are — each from its rank's stored graph and the members' crossings
    (:func:`tracekit.analysis.graph.parts.rank_part`), never the combined graph — replay any weights as the job's
    graph does."""
    import polars as pl
    import pyarrow.parquet as pq

    from tracekit.analysis.graph import whatif
    from tracekit.analysis.graph.crossings import crossings, member_rows, rank_graph
    from tracekit.scale import graphs

    jobgen.write_job(tmp_path / "job", SPECS["mesh"])  # hubs (dp) and pair edges (tp, pp)
    with tracekit.load(tmp_path / "job", link_bw="10gbit", dataset=tmp_path / "ds", graphs=True) as job:
        an = job.analysis
        src = graphs.sources(an.dataset, an)
        read = [(pq.read_table(str(Path(s.root) / s.part / "graph.act.parquet")),
                 pq.read_table(str(Path(s.root) / s.part / "graph.edges.parquet"))) for s in src]
        cross = crossings(pl.concat([member_rows(a, s.rank, s.offset) for s, (a, _) in zip(src, read, strict=True)]),
                          whatif.consistent_members(an.members, an.instances, an.collectives))
        ranks = [rank_graph(a, e, s.rank, s.offset, cross) for s, (a, e) in zip(src, read, strict=True)]
        g = an.graph
        # each rank's edges among the job graph's: its own but the own edges, the collective edges, its own edges
        n_first = sum(r.coll_first for r in ranks)
        firsts = np.cumsum([0] + [r.coll_first for r in ranks])
        owns = np.cumsum([0] + [r.graph.src.size - r.coll_first - r.coll_edge.size for r in ranks])
        weight = np.random.default_rng(0).uniform(0.5, 2.0, g.src.size)
        weight = np.stack([g.weight(), np.rint(g.weight() * weight).astype(np.int64)])
        want = [g.node_time, replay.replay(g, weight[1])[0]]
        built, ws = [], []
        for i, r in enumerate(ranks):
            j = np.arange(r.graph.src.size)
            coll = (j >= r.coll_first) & (j < r.coll_first + r.coll_edge.size)
            mine = np.where(j < r.coll_first, firsts[i] + j, n_first + cross.src.size + owns[i]
                            + (j - r.coll_first - r.coll_edge.size))
            mine[coll] = n_first + r.coll_edge
            assert np.array_equal(g.weight()[mine], r.graph.weight())
            p, e = parts.rank_part(r, cross)
            built.append(p)
            ws.append(weight[:, mine[e]])
        host = exchange.Parts(built, ws)
        _, rounds = exchange.settle([host], parts.hub_members(cross), 2)
        got = np.concatenate(host.times())
        assert rounds > 10
        assert np.array_equal(got[:, 0], want[0]) and np.array_equal(got[:, 1], want[1])
