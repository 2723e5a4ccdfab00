"""A job's dependency graph as its ranks' parts (:class:`tracekit.engine.parts.Part`), which meet only at hubs: the
replay a rank's unit can run where the rank's graph is, exchanging one time per hub (:mod:`tracekit.scale.exchange`).

Each part comes from its rank's own graph with the collective edges into it
(:func:`tracekit.analysis.graph.crossings.rank_graph`), never the job's. The hubs are the instances' own
(:class:`tracekit.analysis.graph.collective_edges.Hubs`: an instance's latest member start), and one more per member
for the collective edges between two ranks that do not leave a hub (the pair edges of small collectives and of members
whose clocks the offsets did not fix): a hub of one member, its start. A replay of the parts gives the times of
:func:`tracekit.analysis.graph.replay.replay` of the job's graph, to the nanosecond.
"""

from __future__ import annotations

import numpy as np

from tracekit.analysis.graph.crossings import Crossings, RankGraph
from tracekit.engine.parts import Part


def rank_part(rg: RankGraph, cross: Crossings) -> tuple[Part, np.ndarray]:
    """One rank's :class:`Part` from its graph with the collective edges into it
    (:func:`tracekit.analysis.graph.crossings.rank_graph`), and each part edge's edge of that graph (its weights). Hub
    ``h`` of ``cross`` is hub ``h`` here; member ``m``'s start is also hub ``H + m`` of one member (``H``: the hubs of
    ``cross``), which the pair edges it is the source of leave. A pair edge from a member of the same rank stays one of
    the part's own. Every member of the rank arrives at its instance's hub (if any) and at its own."""
    g = rg.graph
    n = 2 * rg.activities
    hubs = cross.hub_ptr.size - 1
    coll = np.arange(rg.coll_first, rg.coll_first + rg.coll_edge.size)
    hub = cross.hub[rg.coll_edge]
    from_hub = np.full(g.src.size, -1, np.int64)  # per edge, the hub it leaves (-1: one of the part's own)
    from_hub[coll] = np.where(hub >= 0, hub, np.where(g.src[coll] >= n, hubs + cross.src[rg.coll_edge], -1))
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
