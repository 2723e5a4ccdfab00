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

from dataclasses import dataclass, field

import numpy as np

from tracekit.analysis.graph.crossings import Crossings, RankGraph
from tracekit.engine.parts import Part


def _none() -> np.ndarray:
    return np.zeros(0, np.int64)


@dataclass(frozen=True)
class Extra:
    """Edges a replay adds to a rank's part (a what-if's queued transfers, :mod:`tracekit.analysis.graph.rank_model`):
    between two of its nodes (``own_src`` → ``own_dst``), from hubs (``tgt_hub`` → ``tgt_dst``), and nodes that arrive
    at hubs (``mem_node`` → ``mem_hub``); hubs numbered in the whole graph."""

    own_src: np.ndarray = field(default_factory=_none)
    own_dst: np.ndarray = field(default_factory=_none)
    tgt_hub: np.ndarray = field(default_factory=_none)
    tgt_dst: np.ndarray = field(default_factory=_none)
    mem_node: np.ndarray = field(default_factory=_none)
    mem_hub: np.ndarray = field(default_factory=_none)


def rank_part(rg: RankGraph, cross: Crossings, extra: Extra | None = None) -> tuple[Part, np.ndarray]:
    """One rank's :class:`Part` from its graph with the collective edges into it
    (:func:`tracekit.analysis.graph.crossings.rank_graph`), and each part edge's edge of that graph (its weights). Hub
    ``h`` of ``cross`` is hub ``h`` here; member ``m``'s start is also hub ``H + m`` of one member (``H``: the hubs of
    ``cross``), which the pair edges it is the source of leave. A pair edge from a member of the same rank stays one of
    the part's own. Every member of the rank arrives at its instance's hub (if any) and at its own. ``extra`` edges are
    numbered after the graph's (``g.src.size + i``: its own edges, then those from hubs) in the map returned."""
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
    inst = cross.member_hub
    in_hub = inst[m] >= 0
    mem_node = np.concatenate([2 * mine[in_hub], 2 * mine])
    mem_global = np.concatenate([inst[m][in_hub], hubs + m])
    x = extra if extra is not None else Extra()
    m_edges = g.src.size
    mem_node = np.concatenate([mem_node, x.mem_node])
    mem_global = np.concatenate([mem_global, x.mem_hub])
    used = np.unique(np.concatenate([from_hub[target], x.tgt_hub, mem_global]))
    part = Part(start=g.node_time[:n], src=np.concatenate([g.src[own], x.own_src]),
                dst=np.concatenate([g.dst[own], x.own_dst]),
                tgt_hub=np.searchsorted(used, np.concatenate([from_hub[target], x.tgt_hub])),
                tgt_dst=np.concatenate([g.dst[target], x.tgt_dst]), mem_node=mem_node,
                mem_hub=np.searchsorted(used, mem_global), hubs=used)
    k = x.own_src.size
    return part, np.concatenate([np.flatnonzero(own), m_edges + np.arange(k), np.flatnonzero(target),
                                 m_edges + k + np.arange(x.tgt_hub.size)])


def hub_members(cross: Crossings, more: int = 0) -> np.ndarray:
    """Each hub's member count in :func:`rank_part`'s numbering: the instances' hubs, then one per member, then
    ``more`` hubs of one member each (the ends of queued transfers, :class:`Extra`)."""
    return np.concatenate([np.diff(cross.hub_ptr), np.ones(cross.members.height + more, np.int64)])
