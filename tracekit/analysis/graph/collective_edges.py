"""The collective edges of a job's dependency graph (DESIGN.md "Collectives across ranks"): no member ends an instance
before every member has arrived. Written pair by pair that is an edge from each member's start to each other member's
end, n × (n − 1) edges for n members; an instance of :data:`HUB_MEMBERS` or more keeps one edge per member instead,
from its *hub* (:class:`Hubs`: the latest of its members' starts) — the same constraints in a number of edges that grows
with the group, not with its square. :mod:`tracekit.analysis.graph.dag` and the combine step of a job analysed rank by
rank (:mod:`tracekit.analysis.graph.compact`) both add them here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import polars as pl

from tracekit.analysis.intervals import runs

#: what :func:`collective_edges` returns for :func:`hubs_of`: the hub edges' destinations, their hubs, every hub's
#: members (start nodes) and their offsets
HubSpec = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@dataclass(frozen=True)
class Hubs:
    """Collective edges that leave a *hub*: the latest start among an instance's members. Such an edge ``e`` says
    that its destination (a member's end) comes no earlier than every member's start plus its weight; ``src[e]`` is
    the member (other than the destination's own) that is latest in the graph's own schedule, the edge one pair of
    members would have (:func:`sources` finds it for another schedule). Replays see the hub itself
    (:func:`tracekit.analysis.graph.replay.expanded`)."""

    edge: np.ndarray  # indices of the edges that leave a hub, ascending
    hub: np.ndarray  # the hub of each
    member: np.ndarray  # the start nodes of every hub's members, hub after hub, in the instance's member order
    ptr: np.ndarray  # hub h's members are member[ptr[h]:ptr[h + 1]]

    @property
    def count(self) -> int:
        return self.ptr.size - 1


class Edges(Protocol):
    """What :func:`sources` reads of a :class:`tracekit.analysis.graph.dag.Graph` (named here, not imported: the
    graph imports this module)."""

    src: np.ndarray
    dst: np.ndarray
    hubs: Hubs | None


def sources(graph: Edges, times: np.ndarray) -> np.ndarray:
    """The edges' sources in the schedule ``times``: the graph's own, except that an edge leaving a hub comes from its
    latest member other than its destination's own (the last of them in member order on a tie: the pair edge a
    binding would pick)."""
    h = graph.hubs
    if h is None or h.edge.size == 0:
        return graph.src
    src = graph.src.copy()
    src[h.edge] = latest_other(h.ptr, h.member, times[h.member], h.hub, graph.dst[h.edge] - 1)
    return src


def latest_other(ptr: np.ndarray, member: np.ndarray, start: np.ndarray, hub: np.ndarray, own: np.ndarray
                 ) -> np.ndarray:
    """Per edge leaving hub ``hub`` into the member ``own``: the hub's latest member other than ``own`` (the last in
    member order on a tie), hub ``i``'s members being ``member[ptr[i]:ptr[i + 1]]`` with starts ``start``."""
    i1, i2 = _top_two(ptr, start)
    top1, top2 = member[i1], member[i2]
    first = top1[hub]
    return np.where(first == own, top2[hub], first)


def _top_two(ptr: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per segment ``t[ptr[i]:ptr[i + 1]]``, the position of its largest value and of the largest but one (the last
    in order on a tie, as the last edge attaining a node's time binds it; a segment of one: itself twice)."""
    seg = np.repeat(np.arange(ptr.size - 1), np.diff(ptr))
    order = np.lexsort((np.arange(t.size), t, seg))
    last = ptr[1:] - 1
    return order[last], order[np.maximum(last - 1, ptr[:-1])]


def hubs_of(dst: np.ndarray, etype: np.ndarray, spec: HubSpec | None, collective: int) -> Hubs | None:
    """The :class:`Hubs` of a graph's final edge list (``collective``: the collective edges' type) from what
    :func:`collective_edges` returned (``dst`` nodes of hub edges, their hub, members, offsets)."""
    if spec is None or spec[0].size == 0:
        return None
    h_dst, h_hub, member, ptr = spec
    coll = np.flatnonzero(etype == collective)
    order = np.argsort(h_dst)
    pos = np.searchsorted(h_dst[order], dst[coll])
    pos = np.minimum(pos, h_dst.size - 1)
    hit = h_dst[order][pos] == dst[coll]
    return Hubs(edge=coll[hit], hub=h_hub[order][pos[hit]], member=member, ptr=ptr)


#: collectives of this many members or more leave their collective edges from a hub (:class:`Hubs`)
HUB_MEMBERS = 4


def collective_edges(add, act: pl.DataFrame, instances: pl.DataFrame, start: np.ndarray, end: np.ndarray,
                      own: np.ndarray) -> HubSpec | None:
    """No member ends before the data could move: member k's start → member j's end, lag = j's transfer (its
    end minus the latest start); j's own work becomes that transfer. A send/recv pair (``send`` known) is
    one-sided: the receive cannot end before the send began plus its transfer, while an eager send may
    finish before the receive is posted — one edge, send start → receive end. A collective of
    :data:`HUB_MEMBERS` or more has one edge per member, from its hub (:func:`_hub_edges`; what is returned, for
    :func:`hubs_of`)."""
    cols = ["rank", "collective_id", "instance", *(["send"] if "send" in instances.columns else [])]
    comm = act.filter((pl.col("kind") == "comm") & pl.col("collective_id").is_not_null()).select(
        ["a", "rank", "collective_id"])
    m = comm.join(instances.select(cols).with_columns(
        pl.col("rank").cast(pl.Int32), pl.col("collective_id").cast(pl.Int64)),
        on=["rank", "collective_id"], how="inner")
    if "send" not in m.columns:
        m = m.with_columns(pl.lit(None, dtype=pl.Boolean).alias("send"))
    if m.height == 0:
        return None
    m = m.with_columns(pl.Series("s", start[m.get_column("a").to_numpy()]),
                       pl.Series("e", end[m.get_column("a").to_numpy()]))
    p2p = pl.col("send").is_not_null().any().over("instance")
    m = m.with_columns(pl.when(p2p).then(pl.col("s").filter(pl.col("send")).min().over("instance"))
                       .otherwise(pl.col("s").max().over("instance")).alias("last"),
                       pl.len().over("instance").alias("n"), p2p.alias("p2p"))
    m = m.filter((pl.col("n") > 1) & pl.col("last").is_not_null())
    if m.height == 0:
        return None
    receives = ~(m.get_column("p2p") & m.get_column("send").fill_null(False)).to_numpy()  # ends constrained
    p2p = m.get_column("p2p").to_numpy()
    last = m.get_column("last").to_numpy()
    s = m.get_column("s").to_numpy()
    e = m.get_column("e").to_numpy()
    # a collective member transfers from the last arrival; a receive gets its data from the send's start on,
    # however late it was posted (at a slow link the data is still on the wire), so its own work is nil and
    # the data's time is all on the edge from the send
    transfer = np.where(p2p, np.maximum(e - last, 0), np.maximum(e - np.maximum(last, s), 0))
    a = m.get_column("a").to_numpy()
    own[a[receives]] = np.where(p2p[receives], 0, transfer[receives])
    m = m.with_columns(pl.Series("t", transfer), pl.Series("_in", receives))
    # an instance of many members: one edge per member, from the hub (the latest member's start), not one per pair
    big = ~p2p & (m.get_column("n").to_numpy() >= HUB_MEMBERS)
    _pair_edges(add, m.filter(pl.Series(~big)))
    if not big.any():
        return None
    return _hub_edges(add, m.filter(pl.Series(big)))


def _pair_edges(add, m: pl.DataFrame) -> None:
    """One collective edge per pair of members (from every member of a collective, or the sender of a pair, to every
    other member that receives)."""
    if m.height == 0:
        return
    src = m.filter(~pl.col("p2p") | pl.col("send").fill_null(False)).select(["instance", pl.col("a").alias("src")])
    pairs = src.join(m.filter(pl.col("_in")).select(["instance", pl.col("a").alias("dst"), "t"]), on="instance")
    pairs = pairs.filter(pl.col("src") != pl.col("dst"))
    add(2 * pairs.get_column("src").to_numpy(), 2 * pairs.get_column("dst").to_numpy() + 1,
        pairs.get_column("t").to_numpy(), "collective")


def _hub_edges(add, m: pl.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One collective edge per member of each instance in ``m`` (collectives of :data:`HUB_MEMBERS` or more), from
    the latest other member's start (the pair edge that binds among that member's pair edges); a member that
    ended before that (clocks the offsets did not fix) gets its pair edges, which the build then checks one by one.
    Returns the hubs (:func:`hubs_of` makes :class:`Hubs` of them once the edges are final)."""
    inst = m.get_column("instance").to_numpy()
    order = np.argsort(inst, kind="stable")  # each instance's members together, in member order
    a = m.get_column("a").to_numpy()[order]
    s = m.get_column("s").to_numpy()[order]
    e = m.get_column("e").to_numpy()[order]
    t = m.get_column("t").to_numpy()[order]
    found = runs(inst[order])  # sorted: always runs
    assert found is not None
    ptr = found[1]
    r1, r2 = _top_two(ptr, s)
    hub = np.repeat(np.arange(ptr.size - 1), np.diff(ptr))
    row = np.arange(a.size)
    k = np.where(r1[hub] == row, r2[hub], r1[hub])  # the latest member other than the row's own
    ok = s[k] + t <= e
    add(2 * a[k[ok]], 2 * a[ok] + 1, t[ok], "collective")
    bad = np.flatnonzero(~ok)
    if bad.size:  # every other member of the instance, in member order
        size = np.diff(ptr)[hub[bad]]
        dst_rows = np.repeat(bad, size)
        src_rows = np.repeat(ptr[hub[bad]], size) + (np.arange(dst_rows.size) - np.repeat(np.cumsum(size) - size,
                                                                                             size))
        other = src_rows != dst_rows
        add(2 * a[src_rows[other]], 2 * a[dst_rows[other]] + 1, t[dst_rows[other]], "collective")
    return 2 * a[ok] + 1, hub[ok], 2 * a, ptr
