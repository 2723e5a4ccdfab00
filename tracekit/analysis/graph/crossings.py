"""What crosses ranks in a job's dependency graph: its collective edges, found from the members of its collectives
alone (:mod:`tracekit.analysis.graph.collective_edges`, as the combine step adds them,
:func:`tracekit.analysis.graph.compact.combine`), and each rank's graph on the job clock with them
(:func:`rank_graph`) — its own nodes and edges, the collective edges into it, and one *ghost* node per member of
another rank such an edge comes from, at that member's start. Each rank's graph then binds and follows its critical
path where the rank is (:mod:`tracekit.scale.rank_parts`); what a job's every rank shares is one row per member.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import polars as pl
import pyarrow as pa

from tracekit.analysis.graph import collective_edges
from tracekit.analysis.graph.compact import ACT_SCHEMA
from tracekit.analysis.graph.dag import EDGE_TYPES, Graph, bind
from tracekit.analysis.intervals import Grouped

_OWN = EDGE_TYPES.index("own")
_COLL = EDGE_TYPES.index("collective")


@dataclass(frozen=True)
class Crossings:
    """The collective edges of a job. ``members``: one row per communication activity with a collective id, in the
    job graph's activity order (``rank``, ``a`` its activity in its rank's graph, ``start``, ``end`` on the job clock);
    an edge from member ``src`` (its start) to member ``dst`` (its end) with ``lag`` (in the job graph's order, those
    the measured schedule violates dropped: ``violated``); ``own``: per member, the lag its own edge takes instead of
    the stored one (the transfer a receiving member waits for), or -1; ``hub``: per edge, its hub (-1: a pair edge),
    and each hub's members ``hub_member[hub_ptr[h]:hub_ptr[h + 1]]``."""

    members: pl.DataFrame
    src: np.ndarray
    dst: np.ndarray
    lag: np.ndarray
    own: np.ndarray
    hub: np.ndarray
    hub_member: np.ndarray
    hub_ptr: np.ndarray
    violated: int

    @cached_property
    def member_hub(self) -> np.ndarray:
        """Per member, the hub of its instance (-1: none; made once, where the ranks' graphs are held)."""
        out = np.full(self.members.height, -1, np.int64)
        out[self.hub_member] = np.repeat(np.arange(self.hub_ptr.size - 1), np.diff(self.hub_ptr))
        return out

    @cached_property
    def _by_rank(self) -> tuple[Grouped, Grouped]:
        """The members by rank and the edges by the rank they go into (made once, where the ranks' graphs are
        bound)."""
        rank = self.members.get_column("rank").to_numpy()
        return Grouped.by(rank), Grouped.by(rank[self.dst])

    def of_rank(self, rank: int) -> tuple[np.ndarray, np.ndarray]:
        """Rank ``rank``'s members, and the edges into them, each ascending: a look-up, not a scan of the job's."""
        members, edges = self._by_rank
        return members.of(rank), edges.of(rank)


#: the columns of a rank's stored activities :func:`member_rows` reads
MEMBER_COLUMNS = ("kind", "collective_id", "t_start", "t_end")
#: what :func:`member_rows` gives
MEMBER_SCHEMA = {"rank": pl.Int32, "a": pl.Int64, "collective_id": pl.Int64, "start": pl.Int64, "end": pl.Int64}


def member_rows(act_t: pa.Table, rank: int, offset: int) -> pl.DataFrame:
    """The members of collectives among one rank's stored graph activities (``act_t``): ``rank, a, collective_id,
    start, end`` (job clock: ``offset`` ns added), what :func:`crossings` reads of each rank."""
    t = pl.from_arrow(act_t.select(list(MEMBER_COLUMNS)))
    assert isinstance(t, pl.DataFrame)
    t = t.with_row_index("a").filter((pl.col("kind") == "comm") & pl.col("collective_id").is_not_null())
    return t.select(pl.lit(rank, pl.Int32).alias("rank"), pl.col("a").cast(pl.Int64),
                    pl.col("collective_id").cast(pl.Int64), (pl.col("t_start") + offset).cast(pl.Int64).alias("start"),
                    (pl.col("t_end") + offset).cast(pl.Int64).alias("end"))


def crossings(members: pl.DataFrame, instances: pl.DataFrame | None) -> Crossings:
    """The collective edges among ``members`` (``rank, a, collective_id, start, end``, in the job graph's activity
    order) of ``instances`` (``rank, collective_id, instance, send``:
    :func:`tracekit.analysis.graph.whatif.consistent_members`)."""
    m = members.height
    start = members.get_column("start").to_numpy().astype(np.int64)
    end = members.get_column("end").to_numpy().astype(np.int64)
    own = np.full(m, -1, np.int64)
    none = np.zeros(0, np.int64)
    edges: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def add(s: np.ndarray, d: np.ndarray, lag: np.ndarray | int, etype: str) -> None:
        s = np.asarray(s, dtype=np.int64)
        edges.append((s, np.asarray(d, np.int64), np.broadcast_to(np.asarray(lag, np.int64), s.shape).copy()))

    spec = None
    if instances is not None and instances.height and m:
        act = pl.DataFrame({"a": np.arange(m, dtype=np.int64), "rank": members.get_column("rank").cast(pl.Int32),
                            "collective_id": members.get_column("collective_id").cast(pl.Int64),
                            "kind": pl.Series(["comm"] * m, dtype=pl.String)})
        spec = collective_edges.collective_edges(add, act, instances, start, end, own)
    src = np.concatenate([e[0] for e in edges]) // 2 if edges else none
    dst = np.concatenate([e[1] for e in edges]) // 2 if edges else none
    lag = np.concatenate([e[2] for e in edges]) if edges else none
    bad = start[src] + lag > end[dst]
    src, dst, lag = src[~bad], dst[~bad], lag[~bad]
    hub = np.full(src.size, -1, np.int64)
    hub_member, hub_ptr = none, np.zeros(1, np.int64)
    if spec is not None:
        h = collective_edges.hubs_of(2 * dst + 1, np.full(dst.size, _COLL, np.int8), spec, _COLL)
        if h is not None:
            hub[h.edge] = h.hub
            hub_member, hub_ptr = h.member // 2, h.ptr
    return Crossings(members=members, src=src, dst=dst, lag=lag, own=own, hub=hub, hub_member=hub_member,
                     hub_ptr=hub_ptr, violated=int(bad.sum()))


@dataclass(frozen=True)
class RankGraph:
    """One rank's graph on the job clock with the collective edges into it (:func:`rank_graph`): its activities are
    ``graph``'s first nodes, its ghosts after them (``ghost``: the member each stands for); ``member_of``: per
    activity, its member number (-1: none). Its edges are its own but the own edges, the collective edges into it,
    then its own edges: the order of the job's graph (:func:`tracekit.analysis.graph.compact.combine`)."""

    graph: Graph
    ghost: np.ndarray
    member_of: np.ndarray
    #: the collective edges into the rank: where they start among its edges, and each one's edge of :class:`Crossings`
    coll_first: int
    coll_edge: np.ndarray

    @property
    def activities(self) -> int:
        return self.graph.act.height


def rank_graph(act_t: pa.Table, edge_t: pa.Table, rank: int, offset: int, cross: Crossings) -> RankGraph:
    """Rank ``rank``'s stored compact graph (``act_t``, ``edge_t``: :func:`tracekit.analysis.graph.compact.to_tables`)
    on the job clock (``offset`` ns added), with the collective edges of ``cross`` into it: its nodes, edges,
    binding and slack as the job's graph (:func:`tracekit.analysis.graph.compact.combine`) has them."""
    k = act_t.num_rows
    act_t = act_t.cast(ACT_SCHEMA) if act_t.schema != ACT_SCHEMA else act_t
    act_t = act_t.set_column(act_t.schema.get_field_index("rank"), "rank", pa.array(np.full(k, rank, np.int32)))
    joined = pl.from_arrow(act_t)
    assert isinstance(joined, pl.DataFrame)
    times = np.empty(2 * k, np.int64)
    times[0::2] = joined.get_column("t_start").to_numpy() + offset
    times[1::2] = joined.get_column("t_end").to_numpy() + offset
    act = joined.with_columns(pl.col("start") + offset, pl.col("end") + offset).drop("t_start", "t_end").with_columns(
        pl.int_range(k, dtype=pl.Int64).alias("a"), pl.col("name").cast(pl.Categorical))
    mem = cross.members
    m_rank = mem.get_column("rank").to_numpy()
    m_a = mem.get_column("a").to_numpy()
    mine, into = cross.of_rank(rank)
    member_of = np.full(k, -1, np.int64)
    member_of[m_a[mine]] = mine
    s = edge_t.column("src").to_numpy()
    d = edge_t.column("dst").to_numpy()
    lg = edge_t.column("lag").to_numpy()
    et = edge_t.column("etype").to_numpy()
    gp = edge_t.column("gap").to_numpy()
    is_own = et == _OWN
    own = np.zeros(k, np.int64)
    own[d[is_own] // 2] = lg[is_own]
    over = cross.own[mine] >= 0
    own[m_a[mine[over]]] = cross.own[mine[over]]
    # the collective edges into this rank's members, in the job's order; a source on another rank is a ghost node
    c_src_m = cross.src[into]
    foreign = m_rank[c_src_m] != rank
    ghost = np.unique(c_src_m[foreign])
    c_src = np.where(foreign, 2 * k + np.searchsorted(ghost, c_src_m), 2 * m_a[c_src_m])
    c_dst = 2 * m_a[cross.dst[into]] + 1
    node_time = np.concatenate([times, mem.get_column("start").to_numpy()[ghost].astype(np.int64)])
    o_dst = d[is_own]
    src = np.concatenate([s[~is_own], c_src, s[is_own]])
    dst = np.concatenate([d[~is_own], c_dst, o_dst])
    lag = np.concatenate([lg[~is_own], cross.lag[into], own[o_dst // 2]])
    etype = np.concatenate([et[~is_own], np.full(into.size, _COLL, np.int8), et[is_own]]).astype(np.int8)
    gap = np.concatenate([gp[~is_own], np.zeros(into.size, np.int64), gp[is_own]])
    binding, slack = bind(src, dst, lag, node_time)
    g = Graph(act=act, src=src, dst=dst, lag=lag, etype=etype, node_time=node_time, binding=binding, slack=slack,
              violated={}, gap=gap if gap.any() else None)
    return RankGraph(graph=g, ghost=ghost, member_of=member_of, coll_first=int((~is_own).sum()), coll_edge=into)
