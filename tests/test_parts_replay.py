"""A job's graph replayed rank by rank, collective by collective (:mod:`tracekit.engine.parts`,
:mod:`tracekit.scale.exchange`): each rank's part settles what it can, reports its members' arrivals, and a hub is
released once all its members arrived — the times must be those of the replay of the whole graph, to the nanosecond,
for every scenario at once, with the what-if's queued transfers and its "stragglers removed"."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest

import tracekit
from benchmarks import jobgen
from tracekit.analysis.graph import parts, replay
from tracekit.analysis.graph.dag import Graph
from tracekit.analysis.graph.replay import _expanded_weight, expanded
from tracekit.analysis.graph.whatif import Scenario, _changes
from tracekit.engine import parts as engine_parts
from tracekit.engine.parts import Part
from tracekit.scale import exchange

pytest.importorskip("tracekit.engine._kernels")

DDP = jobgen.JobSpec(ranks=8, gpus_per_host=2, steps=4, layers=8, param_bytes=8 << 20, bucket_bytes=16 << 20,
                     clock_skew_ns=500_000, stragglers=((5, 1.3),))
SPECS = {"ddp": DDP, "fsdp": replace(DDP, parallel="fsdp", stragglers=((2, 1.2),)),
         "mesh": jobgen.JobSpec(ranks=16, gpus_per_host=4, tp=2, pp=2, microbatches=2, steps=4, layers=8,
                                clock_skew_ns=500_000, inter_bps=25e9, intra_bps=400e9)}
QUEUED = [Scenario(), Scenario(bandwidth_scale=4), Scenario(bandwidth_scale=0.25), Scenario(balanced=True)]


@dataclass(frozen=True)
class Split:
    """The parts of a graph (one per rank, in rank order ``ranks``), each part's nodes (``nodes[i]``: the graph's node
    of each of part ``i``'s) and edges (``edges[i]``: the edge, of the graph as a replay sees it with its extra edges
    after its own, that each of part ``i``'s edges is), and every hub's member count."""

    ranks: list[int]
    parts: list[Part]
    nodes: list[np.ndarray]
    edges: list[np.ndarray]
    members: np.ndarray

    def weights(self, weight: np.ndarray) -> list[np.ndarray]:
        """Each part's weights (scenarios × its edges) from the graph's (scenarios × edges, or one row)."""
        w = np.atleast_2d(weight)
        return [w[:, e] for e in self.edges]

    def times(self, parts: list[np.ndarray], n: int) -> np.ndarray:
        """The graph's node times (nodes × scenarios) from each part's."""
        out = np.empty((n, parts[0].shape[1] if parts else 1), np.int64)
        for nodes, t in zip(self.nodes, parts, strict=True):
            out[nodes] = t
        return out


def split(graph: Graph, extra: tuple[np.ndarray, np.ndarray] | None = None) -> Split:
    """``graph`` (with ``extra`` edges ``(src, dst)`` numbered after those of its :func:`expanded` form) in parts by
    rank, from the job's graph itself: the reference the exchange is held to here (a graph in memory, with a what-if's
    queued transfers), while :func:`tracekit.analysis.graph.parts.rank_part` makes the parts where the ranks are."""
    x = expanded(graph)
    n = graph.n_nodes
    src = x.src if extra is None else np.concatenate([x.src, extra[0]])
    dst = x.dst if extra is None else np.concatenate([x.dst, extra[1]])
    hubs = x.n_nodes - n
    rank = graph.act.get_column("rank").to_numpy().astype(np.int64)
    ranks = np.unique(rank)
    part_of = np.repeat(np.searchsorted(ranks, rank), 2)
    s_hub, d_hub = src >= n, dst >= n
    s_part = np.where(s_hub, -1, part_of[np.minimum(src, n - 1)])
    d_part = np.where(d_hub, -1, part_of[np.minimum(dst, n - 1)])
    across = ~s_hub & ~d_hub & (s_part != d_part)
    pair = np.flatnonzero(across)  # an edge between ranks: a hub of its own, its source the one member
    hub_of_src = np.where(s_hub, src - n, -1)
    hub_of_src[pair] = hubs + np.arange(pair.size)
    member_src = np.where(d_hub, src, -1)
    member_hub = np.where(d_hub, dst - n, -1)
    member_src[pair], member_hub[pair] = src[pair], hubs + np.arange(pair.size)
    local = (s_part == d_part) & ~s_hub & ~d_hub
    target = hub_of_src >= 0
    member = member_hub >= 0
    counts = np.bincount(member_hub[member], minlength=hubs + pair.size)
    order = np.argsort(part_of, kind="stable")
    bounds = np.searchsorted(part_of[order], np.arange(ranks.size + 1))
    local_id = np.empty(n, np.int64)
    parts, nodes, edges = [], [], []
    e_all = np.arange(src.size)
    for i in range(ranks.size):
        mine = order[bounds[i]:bounds[i + 1]]
        local_id[mine] = np.arange(mine.size)
        own = local & (s_part == i)
        into = target & (d_part == i)
        arrive = member & (part_of[np.where(member, member_src, 0)] == i)
        h = np.unique(np.concatenate([hub_of_src[into], member_hub[arrive]]))
        parts.append(Part(start=graph.node_time[mine], src=local_id[src[own]], dst=local_id[dst[own]],
                          tgt_hub=np.searchsorted(h, hub_of_src[into]), tgt_dst=local_id[dst[into]],
                          mem_node=local_id[member_src[arrive]], mem_hub=np.searchsorted(h, member_hub[arrive]),
                          hubs=h))
        nodes.append(mine)
        edges.append(np.concatenate([e_all[own], e_all[into]]))
    return Split(ranks=ranks.tolist(), parts=parts, nodes=nodes, edges=edges, members=counts)


def replay_weight(graph: Graph, weight: np.ndarray, extra: np.ndarray | None = None) -> np.ndarray:
    """Per edge of :func:`split`'s numbering: the graph's ``weight``, 0 into hubs, then the extra edges' weights."""
    w = _expanded_weight(graph, weight)
    return w if extra is None else np.concatenate([w, extra])


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
        weights.append(replay_weight(g, w, None if extra is None else extra[2]))
    assert (extra is None) == free
    sp = split(g, None if extra is None else extra[:2])
    assert len(sp.parts) == len(set(g.act.get_column("rank").to_list()))
    hosts = [exchange.Parts(sp.parts[i::2], sp.weights(np.stack(weights))[i::2]) for i in range(2)]
    hub_t, rounds = exchange.settle(hosts, sp.members, len(scenarios))
    assert rounds > 2 and hub_t.shape == (sp.members.size, len(scenarios))
    got = _times(sp, hosts, g.n_nodes)
    for i, sc in enumerate(scenarios):
        assert np.array_equal(got[:, i], want[i]), sc
    assert not np.array_equal(want[0], want[-1])  # the scenarios differ: each column is its own


def _times(sp: Split, hosts: list[exchange.Parts], n: int) -> np.ndarray:
    """The graph's times from the hosts of :func:`test_rank_by_rank_replay_equals_the_whole_graphs` (parts dealt in
    turn)."""
    per = [None] * len(sp.parts)
    for h, host in enumerate(hosts):
        for j, t in enumerate(host.times()):
            per[h + 2 * j] = t
    return sp.times(per, n)


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


def test_arrivals_that_do_not_fit_wait_for_room() -> None:
    # one node, a member of two hubs: with room for one arrival the kernel says so and leaves the node unsettled
    from tracekit.engine import _kernels

    p = engine_parts.Part(start=np.array([4]), src=np.zeros(0, np.int64), dst=np.zeros(0, np.int64),
                          tgt_hub=np.zeros(0, np.int64), tgt_dst=np.zeros(0, np.int64), mem_node=np.array([0, 0]),
                          mem_hub=np.array([0, 1]), hubs=np.array([3, 5]))
    r = engine_parts.Replay(p, np.zeros((1, 0), np.int64))
    lay, none = p.layout, np.zeros(0, np.int32)
    call = (lay.out_ptr, lay.out_dst, r.w_out, r.left, r.acc, r.stack, r.top, lay.tgt_ptr, lay.tgt_dst, r.w_tgt,
            lay.mem_ptr, lay.mem_hub, none, np.zeros(0, np.int64))
    assert _kernels.advance(*call, r.arr_hub[:1], r.arr_time[:1].reshape(-1)) == -1
    assert r.top[0] == 1  # still to do
    assert r.advance(np.zeros(0, np.int64), np.zeros((0, 1), np.int64))[0].tolist() == [3, 5]
    assert r.settled and r.times[0, 0] == 4
