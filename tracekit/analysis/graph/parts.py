"""A job's dependency graph split into its ranks' parts (:class:`tracekit.engine.parts.Part`), which meet only at hubs:
the replay a rank's unit can run where the rank's graph is, exchanging one time per hub
(:mod:`tracekit.scale.exchange`).

The hubs are the graph's own (:class:`tracekit.analysis.graph.collective_edges.Hubs`: an instance's latest member
start), and one more for each edge between two ranks that does not leave a hub (the pair edges of small collectives
and of members whose clocks the offsets did not fix): a hub of one member, its source. A replay of the parts gives the
times of :func:`tracekit.analysis.graph.replay.replay` of the graph, to the nanosecond.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tracekit.analysis.graph.crossings import Crossings, RankGraph
from tracekit.analysis.graph.dag import Graph
from tracekit.analysis.graph.replay import _expanded_weight, expanded
from tracekit.engine.parts import Part


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
    rank."""
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


def rank_part(rg: RankGraph, cross: Crossings) -> tuple[Part, np.ndarray]:
    """One rank's :class:`Part` from its graph with the collective edges into it
    (:func:`tracekit.analysis.graph.crossings.rank_graph`), and each part edge's edge of that graph (its weights). Hub
    ``h`` of ``cross`` is hub ``h`` here; member ``m``'s start is also hub ``H + m`` of one member (``H``: the hubs of
    ``cross``), which the pair edges it is the source of leave. A pair edge from a member of the same rank stays one of
    the part's own. Every member of the rank arrives at its instance's hub (if any) and at its own."""
    g = rg.graph
    n = 2 * rg.activities
    hubs = cross.hub_ptr.size - 1
    coll = np.arange(rg.coll_first, rg.coll_first + (0 if rg.coll_edge is None else rg.coll_edge.size))
    hub = cross.hub[rg.coll_edge] if rg.coll_edge is not None else np.zeros(0, np.int64)
    src_m = cross.src[rg.coll_edge] if rg.coll_edge is not None else np.zeros(0, np.int64)
    is_coll = np.zeros(g.src.size, bool)
    is_coll[coll] = True
    from_hub = np.zeros(g.src.size, np.int64) - 1
    from_hub[coll] = np.where(hub >= 0, hub, np.where(g.src[coll] >= n, hubs + src_m, -1))
    own = from_hub < 0
    target = ~own
    mine = np.flatnonzero(rg.member_of >= 0)
    m = rg.member_of[mine]
    inst = np.full(cross.members.height, -1, np.int64)
    inst[cross.hub_member] = np.repeat(np.arange(hubs), np.diff(cross.hub_ptr))
    in_hub = inst[m] >= 0
    mem_node = np.concatenate([2 * mine[in_hub], 2 * mine])
    mem_global = np.concatenate([inst[m][in_hub], hubs + m])
    used = np.unique(np.concatenate([from_hub[target], mem_global]))
    part = Part(start=g.node_time[:n], src=g.src[own], dst=g.dst[own], tgt_hub=np.searchsorted(used, from_hub[target]),
                tgt_dst=g.dst[target], mem_node=mem_node, mem_hub=np.searchsorted(used, mem_global), hubs=used)
    return part, np.concatenate([np.flatnonzero(own), np.flatnonzero(target)])


def hub_members(cross: Crossings) -> np.ndarray:
    """Each hub's member count in :func:`rank_part`'s numbering: the instances' hubs, then one per member."""
    return np.concatenate([np.diff(cross.hub_ptr), np.ones(cross.members.height, np.int64)])
