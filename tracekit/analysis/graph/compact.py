"""Compact dependency graphs of single ranks, and the job's graph combined from them (DESIGN.md "At scale").

A job too big for one machine's memory is analysed rank by rank (:mod:`tracekit.scale.dataset`): each rank's unit
builds that rank's dependency graph (:func:`tracekit.analysis.graph.dag.build` without the collective edges, which need
every rank) and compacts it (:func:`compact`); the combine step joins the compact graphs of every rank, puts them on
the job clock and adds the collective edges (:func:`combine`). The result is an ordinary
:class:`~tracekit.analysis.graph.dag.Graph`, so the critical path
(:mod:`tracekit.analysis.graph.critical_path`), the what-if model and its replays
(:mod:`tracekit.analysis.graph.whatif`, :mod:`tracekit.analysis.graph.replay`) and what builds on them run on it
unchanged.

**The rule.** Consecutive activities on one lane (CPU thread or device stream) of one rank merge into one activity
when every node between them has no edge but its lane's own chain (the previous activity's end → program order →
the next one's start): no launch, sync, stream wait, hand-off, enqueue or consume edge leaves or enters there. They
must also be of one kind and one iteration, and neither communication (every communication activity stays alone:
its transfer is re-costed and the collective edges attach to it) nor compute in the sense of
:func:`tracekit.analysis.graph.whatif.compute_mask` (device kernels on GPU ranks, operators on CPU-only ranks: the
contention model re-costs each by its own overlap with transfers). On a device stream, two activities merge only
back to back (no gap between them); on a CPU thread the gaps between them (untraced host work: the slack on program
order) become part of the merged activity's own work, and the edge records how much of it was such a gap
(``Graph.gap``) so that the critical path still labels it idle and unexplained.

**Why it is exact.** Every node of a merged run except its first and last has one incoming edge and one outgoing
edge, both on the chain; in any replay its time is its predecessor's plus a fixed weight, so the run's end is its
start plus the sum of those weights, whatever else is re-costed. Transfers (own and collective edges), the queueing
of transfers on a link, compute slowed by contention (compute never merges) and the per-rank scaling of
"stragglers removed" (:mod:`tracekit.analysis.balance`: a run is of one kind, so one factor scales its sum) therefore
replay the same on the compact graph as on the full one; the only differences are rounding (a scaled run is rounded
once, not per member: under a nanosecond per member) and, on the critical path, where an iteration's start cuts
through a merged run (its parts are split in proportion, not at the member where the cut falls). The iteration
windows are kept: a run never spans two iterations, so the first and last activity of every lane in every iteration
(what iteration times and the critical path's ends are read from) are kept.

**Where it does not compact.** Every kernel has a launch edge from the CPU thread that launched it, and every
launching operator an edge out of it, so on a GPU rank the kernels and the operators that launch them stay one node
each; what merges there is host work that neither launches nor waits (Python-level operators, the optimizer's
bookkeeping, the data loader) and back-to-back copies. Nested calls are already folded into their top-level
operator by the graph itself, so a trace's size is mostly not in its graph.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import polars as pl
import pyarrow as pa

from tracekit.analysis.graph import collective_edges, replay
from tracekit.analysis.graph.collective_edges import Hubs
from tracekit.analysis.graph.dag import EDGE_TYPES, Graph, bind

_OWN = EDGE_TYPES.index("own")
_PROGRAM = EDGE_TYPES.index("program")
_ET = {name: i for i, name in enumerate(EDGE_TYPES)}
#: format of the stored compact graphs (bump when the tables change)
FORMAT = 1
#: the activity columns a compact graph keeps (the full graph's, where it has them)
ACT_COLUMNS = ("rank", "lane", "kind", "name", "start", "end", "start_ns", "dur", "device", "stream", "correlation",
               "iteration", "collective_id", "event_row")


def _compute_mask(graph: Graph) -> np.ndarray:
    """Activities the contention model re-costs one by one (as :func:`tracekit.analysis.graph.whatif.compute_mask`)."""
    act = graph.act
    kind = act.get_column("kind").cast(pl.String)
    rank = act.get_column("rank").to_numpy()
    gpu = np.isin(rank, np.array(sorted(graph.gpu_ranks), dtype=rank.dtype))
    compute = (kind == "compute").fill_null(False).to_numpy()
    return np.where(gpu, compute, (kind == "cpu_op").fill_null(False).to_numpy())


def mergeable(graph: Graph) -> np.ndarray:
    """Per activity ``i``: whether it merges with activity ``i - 1`` (the rule of the module docstring)."""
    n = graph.act.height
    out = np.zeros(n, dtype=bool)
    if n < 2:
        return out
    ch = replay.chains(graph)
    cross = np.ones(graph.src.size, dtype=bool)
    cross[ch.chain_edge[ch.chain_edge >= 0]] = False
    touched = np.zeros(graph.n_nodes, dtype=bool)
    touched[graph.src[cross]] = True
    touched[graph.dst[cross]] = True
    act = graph.act
    i = np.arange(1, n)
    kind = act.get_column("kind").cast(pl.String).fill_null("")
    it = act.get_column("iteration").fill_null(-(1 << 62)).to_numpy()
    on_device = act.get_column("device").is_not_null().to_numpy()
    lane = act.get_column("lane").cast(pl.String)
    # each activity's kind and lane against the one before it, compared as text where the text is (not as objects)
    same_kind = (kind.slice(1) == kind.slice(0, n - 1)).to_numpy()
    same_lane = lane.slice(1).eq_missing(lane.slice(0, n - 1)).to_numpy()
    solo = (kind == "comm").to_numpy() | _compute_mask(graph)
    # the chain runs through: i-1's own edge, the program edge into i, i's own edge
    chained = (ch.chain_edge[2 * i - 1] >= 0) & (ch.chain_edge[2 * i] >= 0) & (ch.chain_edge[2 * i + 1] >= 0)
    prog = ch.chain_edge[2 * i]
    gap = np.where(prog >= 0, graph.lag[np.maximum(prog, 0)] + graph.slack[np.maximum(prog, 0)], 0)
    ok = (chained & ~touched[2 * i - 1] & ~touched[2 * i] & same_kind & (it[i] == it[i - 1])
          & same_lane & ~solo[i] & ~solo[i - 1] & (~on_device[i] | (gap == 0)))
    out[1:] = ok
    return out


def compact(graph: Graph) -> Graph:
    """The compact graph of ``graph`` (one rank's, or any): runs merged by :func:`mergeable`, every other activity and
    edge as it was, edges in their order (the binding edge of a node is the last one attaining its time, so the order
    decides ties). Its ``act`` keeps :data:`ACT_COLUMNS` plus ``members`` (activities merged into each) and ``name`` is
    that of the member with the most own work; ``gap`` says how much of each edge's lag is untraced gaps."""
    act = graph.act
    n = act.height
    merge = mergeable(graph)
    run = np.cumsum(~merge) - 1 if n else np.zeros(0, np.int64)
    m = int(run[-1]) + 1 if n else 0
    first = np.flatnonzero(~merge)
    last = np.append(first[1:] - 1, n - 1) if n else first
    # per old node: the new node it maps to (interior nodes of a run map to -1)
    node_map = np.full(graph.n_nodes, -1, dtype=np.int64)
    node_map[2 * first] = 2 * np.arange(m)
    node_map[2 * last + 1] = 2 * np.arange(m) + 1
    src_act, dst_act = graph.src // 2, graph.dst // 2
    multi = (last - first) > 0
    own_mask = graph.etype == _OWN
    # own and program edges inside a run of several members make up its chain: they become the run's own edge, which
    # stands where its last member's own edge stood (the order of edges decides ties between binding edges)
    same = run[src_act] == run[dst_act] if n else np.zeros(0, dtype=bool)
    chain = same & multi[run[src_act]] & (own_mask | (graph.etype == _PROGRAM)) if n else same
    run_own = chain & own_mask & (dst_act == last[run[dst_act]]) if n else chain
    w = graph.lag + graph.slack
    lag_sum = np.zeros(m, dtype=np.int64)
    gap_sum = np.zeros(m, dtype=np.int64)
    np.add.at(lag_sum, run[src_act[chain]], w[chain])
    prog = chain & (graph.etype == _PROGRAM)
    np.add.at(gap_sum, run[src_act[prog]], w[prog])
    e = np.flatnonzero(~chain | run_own)
    src = node_map[graph.src[e]]
    dst = node_map[graph.dst[e]]
    lag = graph.lag[e].copy()
    gap = np.zeros(e.size, dtype=np.int64)
    ro = run_own[e]
    r = run[dst_act[e[ro]]]
    # a merged run's lag: everything on its chain but its last member's own slack (which binding finds again)
    lag[ro] = lag_sum[r] - graph.slack[e[ro]]
    gap[ro] = gap_sum[r]
    src[ro] = 2 * r
    assert (src >= 0).all() and (dst >= 0).all(), "an edge touches the inside of a merged run"
    node_time = np.empty(2 * m, dtype=np.int64)
    node_time[0::2] = graph.node_time[2 * first]
    node_time[1::2] = graph.node_time[2 * last + 1]
    new_act = _run_activities(graph, run, first, last, m)
    binding, new_slack = bind(src, dst, lag, node_time)
    hubs = None
    if graph.hubs is not None:  # communication never merges: its edges and members keep, renumbered
        h = graph.hubs
        new_edge = np.full(graph.src.size, -1, np.int64)
        new_edge[e] = np.arange(e.size)
        hubs = Hubs(edge=new_edge[h.edge], hub=h.hub, member=node_map[h.member], ptr=h.ptr)
        assert (hubs.edge >= 0).all() and (hubs.member >= 0).all(), "a collective edge was merged away"
    return Graph(act=new_act, src=src, dst=dst, lag=lag, etype=graph.etype[e], node_time=node_time, binding=binding,
                 slack=new_slack, violated=dict(graph.violated), gap=gap if gap.any() else None, hubs=hubs)


def _run_activities(graph: Graph, run: np.ndarray, first: np.ndarray, last: np.ndarray, m: int) -> pl.DataFrame:
    """One row per run: the first member's columns, the last member's end, the name of the member with the most own
    work, and the number of members."""
    act = graph.act
    cols = [c for c in ACT_COLUMNS if c in act.columns]
    out = act[first].select(cols)
    if m == act.height:
        return out.with_columns(pl.int_range(m, dtype=pl.Int64).alias("a"), pl.lit(1, dtype=pl.Int32).alias("members"))
    own_mask = graph.etype == _OWN
    own = np.zeros(act.height, dtype=np.int64)
    own[graph.dst[own_mask] // 2] = graph.lag[own_mask]
    # the member with the most own work names the run (the first on a tie): looked for among the members of runs of
    # several only (a run of one is named by its one member, which the first member's columns already are)
    top = first.copy()
    multi = np.flatnonzero(last > first)
    if multi.size:
        rows = np.flatnonzero(np.repeat(last > first, last - first + 1))
        order = rows[np.lexsort((rows, -own[rows], run[rows]))]
        top[multi] = order[np.flatnonzero(np.concatenate(([True], run[order][1:] != run[order][:-1])))]
    end = act.get_column("end").to_numpy()[last]
    dur = end - act.get_column("start").to_numpy()[first]
    return out.with_columns(act.get_column("name")[top].alias("name"), pl.Series("end", end), pl.Series("dur", dur),
                            pl.int_range(m, dtype=pl.Int64).alias("a"),
                            pl.Series("members", np.diff(np.append(first, act.height)).astype(np.int32)))


# --- storing a compact graph, and the job's graph from every rank's -------------------------------------------------

ACT_SCHEMA = pa.schema([("rank", pa.int32()), ("lane", pa.string()), ("kind", pa.string()), ("name", pa.string()),
                        ("start", pa.int64()), ("end", pa.int64()), ("start_ns", pa.int64()), ("dur", pa.int64()),
                        ("device", pa.int32()), ("stream", pa.int64()), ("correlation", pa.int64()),
                        ("iteration", pa.int64()), ("collective_id", pa.int64()), ("event_row", pa.int64()),
                        ("members", pa.int32()), ("t_start", pa.int64()), ("t_end", pa.int64())])
EDGE_SCHEMA = pa.schema([("src", pa.int64()), ("dst", pa.int64()), ("lag", pa.int64()), ("etype", pa.int8()),
                         ("gap", pa.int64())])


def to_tables(graph: Graph) -> tuple[pa.Table, pa.Table]:
    """``(activities, edges)`` of a compact graph, as stored with its rank (node times as ``t_start``/``t_end``;
    binding and slack are not stored: the combine step binds the job's graph anew)."""
    act = graph.act.with_columns(pl.Series("t_start", graph.node_time[0::2]), pl.Series("t_end", graph.node_time[1::2]))
    if "members" not in act.columns:
        act = act.with_columns(pl.lit(1, dtype=pl.Int32).alias("members"))
    cols = {}
    for f in ACT_SCHEMA:
        cols[f.name] = (act.get_column(f.name).cast(pl.String) if f.name in ("lane", "kind", "name") else
                        act.get_column(f.name)) if f.name in act.columns else pl.Series(f.name, [None] * act.height)
    table = pl.DataFrame(cols).to_arrow().cast(ACT_SCHEMA)
    gap = graph.gap if graph.gap is not None else np.zeros(graph.src.size, np.int64)
    edges = pa.table({"src": graph.src, "dst": graph.dst, "lag": graph.lag, "etype": graph.etype,
                      "gap": gap}, schema=EDGE_SCHEMA)
    return table, edges


def combine(parts: Iterable[tuple[pa.Table, pa.Table]], offsets: dict[int, int],
            instances: pl.DataFrame | None = None) -> Graph:
    """The job's graph from the stored compact graphs of its ranks (:func:`to_tables`): node times on the job clock
    (``offsets``: ns added to each rank's times), the collective edges of ``instances`` (``rank, collective_id,
    instance, send``, as :func:`tracekit.analysis.graph.whatif.consistent_members` gives them) added exactly as
    :func:`tracekit.analysis.graph.dag.build` adds them, edges the measured schedule violates dropped, and every node
    bound anew. Edge order: every rank's edges but the own edges, the collective edges, then the own edges (as the full
    graph orders them). ``parts`` may be an iterator: each rank's tables are let go once copied, and every list of
    parts once joined (the combine's peak is the job's graph plus one copy of its edges, not the ranks' tables too)."""
    from tracekit.analysis.graph.dag import _take_all

    acts: list[pa.Table] = []
    srcs, dsts, lags, types, gaps = [], [], [], [], []
    own_parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    base = 0
    for act_t, edge_t in parts:  # Arrow and numpy only here: a job has thousands of ranks
        k = act_t.num_rows
        if k == 0:
            continue
        acts.append(act_t.cast(ACT_SCHEMA) if act_t.schema != ACT_SCHEMA else act_t)
        s = edge_t.column("src").to_numpy() + 2 * base
        d = edge_t.column("dst").to_numpy() + 2 * base
        lg = edge_t.column("lag").to_numpy()
        et = edge_t.column("etype").to_numpy()
        gp = edge_t.column("gap").to_numpy()
        own = et == _OWN
        srcs.append(s[~own])
        dsts.append(d[~own])
        lags.append(lg[~own])
        types.append(et[~own])
        gaps.append(gp[~own])
        own_parts.append((s[own], d[own], lg[own], gp[own]))
        base += k
    if not acts:
        none = np.zeros(0, np.int64)
        return Graph(act=pl.DataFrame(), src=none, dst=none, lag=none, etype=np.zeros(0, np.int8), node_time=none,
                     binding=none, slack=none, violated={})
    joined = pl.from_arrow(pa.concat_tables(acts))
    acts.clear()
    assert isinstance(joined, pl.DataFrame)
    ranks = joined.get_column("rank").to_numpy()
    known = list(offsets)
    off = pl.Series(ranks).replace_strict(known, [int(offsets[r] or 0) for r in known], default=0,
                                          return_dtype=pl.Int64).to_numpy() if known else np.zeros(base, np.int64)
    times = np.empty(2 * base, dtype=np.int64)
    times[0::2] = joined.get_column("t_start").to_numpy() + off
    times[1::2] = joined.get_column("t_end").to_numpy() + off
    act = joined.with_columns(pl.col("start") + pl.Series(off), pl.col("end") + pl.Series(off)).drop(
        "t_start", "t_end").with_columns(pl.int_range(base, dtype=pl.Int64).alias("a"),
                                         pl.col("name").cast(pl.Categorical))
    del joined
    node_time = times
    start, end = node_time[0::2].copy(), node_time[1::2].copy()
    o_src = np.concatenate([p[0] for p in own_parts])
    o_dst = np.concatenate([p[1] for p in own_parts])
    o_lag = np.concatenate([p[2] for p in own_parts])
    o_gap = np.concatenate([p[3] for p in own_parts])
    own_parts.clear()
    own = np.zeros(base, dtype=np.int64)
    own[o_dst // 2] = o_lag
    coll: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def add(s: np.ndarray, d: np.ndarray, lag: np.ndarray | int, etype: str) -> None:
        s = np.asarray(s, dtype=np.int64)
        coll.append((s, np.asarray(d, dtype=np.int64), np.broadcast_to(np.asarray(lag, np.int64), s.shape).copy()))

    hub_spec = None
    if instances is not None and instances.height:
        hub_spec = collective_edges.collective_edges(add, act, instances, start, end, own)
    o_lag = own[o_dst // 2]
    c_src = np.concatenate([c[0] for c in coll]) if coll else np.zeros(0, np.int64)
    c_dst = np.concatenate([c[1] for c in coll]) if coll else np.zeros(0, np.int64)
    c_lag = np.concatenate([c[2] for c in coll]) if coll else np.zeros(0, np.int64)
    bad = node_time[c_src] + c_lag > node_time[c_dst]
    violated: dict[str, int] = {}
    if bad.any():
        violated["collective"] = int(bad.sum())
        c_src, c_dst, c_lag = c_src[~bad], c_dst[~bad], c_lag[~bad]
    n_coll, n_own = c_src.size, o_src.size
    # each list joined, then let go: one copy of the edges at a time
    src = _take_all([*_drain(srcs), c_src, o_src])
    dst = _take_all([*_drain(dsts), c_dst, o_dst])
    lag = _take_all([*_drain(lags), c_lag, o_lag])
    del c_src, c_dst, c_lag, o_src, o_dst, o_lag
    etype = _take_all([*_drain(types), np.full(n_coll, _ET["collective"], np.int8), np.full(n_own, _OWN, np.int8)])
    gap = _take_all([*_drain(gaps), np.zeros(n_coll, np.int64), o_gap])
    binding, slack = bind(src, dst, lag, node_time)
    hubs = collective_edges.hubs_of(dst, etype, hub_spec, _ET["collective"])
    return Graph(act=act, src=src, dst=dst, lag=lag, etype=etype, node_time=node_time, binding=binding, slack=slack,
                 violated=violated, gap=gap if gap.any() else None, hubs=hubs)


def _drain(parts: list[np.ndarray]) -> list[np.ndarray]:
    """The parts, the list emptied (so that joining them is the parts' last reference)."""
    out = parts[:]
    parts.clear()
    return out


def leaves_table(leaves: pl.DataFrame) -> pa.Table:
    """The innermost compute operations of one rank (:func:`tracekit.analysis.graph.compute_leaves.compute_leaves` on
    its graph, rank clock) as stored beside its compact graph."""
    return leaves.select(pl.col("rank").cast(pl.Int32), pl.col("iteration").cast(pl.Int64),
                         pl.col("name").cast(pl.String), pl.col("start").cast(pl.Int64),
                         pl.col("end").cast(pl.Int64)).to_arrow()
