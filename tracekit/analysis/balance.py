"""Each rank's work and its excess over the median rank's: what "stragglers removed" replays (DESIGN.md "Verdict").

A rank's work is counted in two parts, on the dependency graph (:mod:`tracekit.analysis.graph.dag`):

``device``  the own time of its device kernels and copies (GPU ranks)
``host``    the own time of its CPU operators and runtime calls (blocking waits already cut out by the graph), plus
            the gaps on its CPU threads that nothing traced explains (slack on program order: a ``sleep``, work the
            profiler does not see) — on CPU-only ranks this is their compute too

Communication is never work here: waiting for others and moving data are what the other replays change. A rank is
compared with its *peers*: the ranks that run the same operations the same number of times (on GPU ranks their
device kernels, on CPU-only ranks their operators) — the replicas of one pipeline stage or tensor-parallel role,
every rank of a plain data-parallel job. A rank with no such peer is compared with every rank. The *median rank* is
an actual peer's value (the lower middle one for an even count), so that with two ranks the faster one's work is the
reference. Removing the excess scales every operation of a rank down to the median peer's time in that operation
(by name: a slow data loader shrinks to the median loader, the rest of its rank stays), and the gaps of its threads
down to the median peer's gaps. Without peers, a pipeline's heavier stage would be "excess" and a slow rank of its
lighter stage would hide under the heavier stage's median.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from tracekit.analysis.graph.dag import EDGE_TYPES, Graph
from tracekit.analysis.intervals import runs

_OWN = EDGE_TYPES.index("own")
_PROGRAM = EDGE_TYPES.index("program")
#: activity kinds that are a rank's device work, and its host work
DEVICE_KINDS = ("compute", "memory")
HOST_KINDS = ("cpu_op", "runtime")


@dataclass(frozen=True)
class Balance:
    """Per rank (``ranks``): its device and host work over the whole trace (ns), the median rank's, and the factor
    that brings each down to it (1 where it is not above). ``act_factor`` is that factor per graph activity (1 for
    communication); ``own_edge`` each activity's own edge (-1 where none); ``gap_edges`` the program edges into host
    activities, whose slack is the threads' unexplained gaps."""

    ranks: np.ndarray
    device_ns: np.ndarray
    host_ns: np.ndarray
    #: per rank: its median peer's device and host work
    median_device_ns: np.ndarray
    median_host_ns: np.ndarray
    #: per rank: its group of peers (ranks with one signature share a group; -1: no peer, compared with every rank)
    peers: np.ndarray
    device_factor: np.ndarray
    host_factor: np.ndarray
    act_factor: np.ndarray
    own_edge: np.ndarray
    gap_edges: np.ndarray
    gap_factor: np.ndarray
    #: per rank: its threads' unexplained gaps (ns, the slack of ``gap_edges``) and its median peer's
    gap_ns: np.ndarray
    median_gap_ns: np.ndarray
    iterations: int

    def has_peers(self, rank: int) -> bool:
        """Whether ``rank`` was measured against peers (ranks running the same operations), not every rank."""
        i = np.searchsorted(self.ranks, rank)
        return bool(i < self.ranks.size and self.ranks[i] == rank and self.peers[i] >= 0)

    def excess(self) -> pl.DataFrame:
        """``rank, device_excess_ns, host_excess_ns, excess_ns`` per iteration, ranks above the median rank only,
        largest first."""
        n = max(self.iterations, 1)
        dev = np.maximum(self.device_ns - self.median_device_ns, 0) // n
        host = np.maximum(self.host_ns - self.median_host_ns, 0) // n
        df = pl.DataFrame({"rank": self.ranks.astype(np.int64), "device_excess_ns": dev.astype(np.int64),
                           "host_excess_ns": host.astype(np.int64)})
        return (df.with_columns((pl.col("device_excess_ns") + pl.col("host_excess_ns")).alias("excess_ns"))
                .filter(pl.col("excess_ns") > 0).sort(["excess_ns", "rank"], descending=[True, False]))


def _median_rank(values: np.ndarray) -> int:
    """The median rank's value: the lower middle one of the sorted values (an actual rank's)."""
    if values.size == 0:
        return 0
    return int(np.sort(values)[(values.size - 1) // 2])


def peer_groups(rank_code: np.ndarray, name: np.ndarray, n_ranks: int) -> np.ndarray:
    """Per rank (0..n_ranks-1): its group of peers — ranks whose work (``name`` per activity of ``rank_code``) has
    the same names the same number of times — or -1 where no other rank has its signature."""
    if rank_code.size == 0:
        return np.full(n_ranks, -1, dtype=np.int64)
    per = (pl.DataFrame({"rank": rank_code.astype(np.int64), "name": name.astype(np.int64)})
           .group_by(["rank", "name"]).len().sort(["rank", "name"])
           .group_by("rank", maintain_order=True)
           .agg(pl.concat_str([pl.col("name"), pl.col("len")], separator=":").str.join(",").alias("sig")))
    sig = per.with_columns(pl.col("sig").hash().alias("h"))
    sig = sig.with_columns(pl.len().over("h").alias("n"), pl.col("h").rank("dense").alias("g"))
    out = np.full(n_ranks, -1, dtype=np.int64)
    shared = sig.filter(pl.col("n") > 1)
    out[shared.get_column("rank").to_numpy()] = shared.get_column("g").to_numpy().astype(np.int64)
    return out


def peer_medians(values: np.ndarray, peers: np.ndarray, among: np.ndarray | None = None) -> np.ndarray:
    """Per rank: the median (lower middle) of ``values`` over its peers (over every rank of ``among`` — all by
    default — where it has none)."""
    among = np.ones(values.size, dtype=bool) if among is None else among
    out = np.full(values.size, _median_rank(values[among]), dtype=np.int64)
    for g in np.unique(peers[peers >= 0]):
        members = (peers == g) & among
        out[peers == g] = _median_rank(values[members]) if members.any() else out[peers == g]
    return out


def measure(graph: Graph, iterations: int) -> Balance:
    """Every rank's device and host work on ``graph`` (over ``iterations`` iterations) and the factors that remove
    its excess over the median rank's."""
    act = graph.act
    n = act.height
    own_mask = graph.etype == _OWN
    own_edge = np.full(n, -1, dtype=np.int64)
    own_edge[graph.dst[own_mask] // 2] = np.flatnonzero(own_mask)
    kind = act.get_column("kind").cast(pl.String)
    on_device = act.get_column("device").is_not_null().to_numpy()
    device = on_device & kind.is_in(DEVICE_KINDS).fill_null(False).to_numpy()
    host = ~on_device & kind.is_in(HOST_KINDS).fill_null(False).to_numpy()
    rank = act.get_column("rank").fill_null(-1).to_numpy()
    by_run = runs(rank)  # a job's activities come rank by rank: their ranks and codes without a sort
    ranks, code = np.unique(rank, return_inverse=True) if by_run is None else \
        (by_run[0], np.repeat(np.arange(by_run[0].size), np.diff(by_run[1])))
    own = np.where(own_edge >= 0, graph.lag[np.maximum(own_edge, 0)], 0)
    dev_ns = np.bincount(code[device], weights=own[device], minlength=ranks.size).astype(np.int64)
    prog = np.flatnonzero(graph.etype == _PROGRAM)
    gap_edges = prog[host[graph.dst[prog] // 2] & (graph.slack[prog] > 0)]
    gap_rank = code[graph.dst[gap_edges] // 2]
    gap_ns = np.bincount(gap_rank, weights=graph.slack[gap_edges], minlength=ranks.size).astype(np.int64)
    host_ns = np.bincount(code[host], weights=own[host], minlength=ranks.size).astype(np.int64) + gap_ns
    has_dev = dev_ns > 0
    names = act.get_column("name").to_physical().fill_null(-1).to_numpy()
    # peers by their device kernels (GPU ranks) or their operators (CPU-only ranks)
    sig_mask = np.where(has_dev[code], device, host)
    peers = peer_groups(code[sig_mask], names[sig_mask], ranks.size)
    m_dev = peer_medians(dev_ns, peers, among=has_dev)
    m_host = peer_medians(host_ns, peers)
    dev_f = np.where(has_dev & (dev_ns > m_dev), m_dev / np.maximum(dev_ns, 1), 1.0)
    host_f = np.where(host_ns > m_host, m_host / np.maximum(host_ns, 1), 1.0)
    # the replay scales each operation down to the median peer's time in it (a slow data loader shrinks to the median
    # loader, not every operation of its rank by the same share), and the threads' gaps by the rank's gap excess
    work = device | host
    act_factor = np.ones(n)
    act_factor[work] = name_medians(code[work], names[work], own[work], peers).get_column("f").to_numpy()
    m_gap = peer_medians(gap_ns, peers)
    gap_f = np.where(gap_ns > m_gap, m_gap / np.maximum(gap_ns, 1), 1.0)
    return Balance(ranks=ranks, device_ns=dev_ns, host_ns=host_ns, median_device_ns=m_dev, median_host_ns=m_host,
                   peers=peers, device_factor=dev_f, host_factor=host_f, act_factor=act_factor, own_edge=own_edge,
                   gap_edges=gap_edges, gap_factor=gap_f[gap_rank], gap_ns=gap_ns, median_gap_ns=m_gap,
                   iterations=iterations)


def name_medians(rank: np.ndarray, name: np.ndarray, own: np.ndarray, peers: np.ndarray) -> pl.DataFrame:
    """Per activity (``rank`` an index into ``peers``): its rank's total time in its operation (``own``), the median
    peer's (by name, among the peers that run it; among every rank that runs it where the rank has no peer), and
    ``f``, the latter over the former at most 1."""
    df = pl.DataFrame({"rank": rank.astype(np.int64), "name": name.astype(np.int64), "own": own,
                       "peers": peers[rank]})
    per = df.group_by(["rank", "name", "peers"]).agg(pl.col("own").sum())

    def lower_middle(by: list[str]) -> pl.DataFrame:
        return per.group_by(by).agg(pl.col("own").sort().alias("v")).with_columns(
            pl.col("v").list.get((pl.col("v").list.len() - 1) // 2).alias("median")).drop("v")

    per = (per.join(lower_middle(["peers", "name"]).rename({"median": "peer_median"}), on=["peers", "name"])
           .join(lower_middle(["name"]), on="name")
           .with_columns(pl.when(pl.col("peers") >= 0).then(pl.col("peer_median")).otherwise(pl.col("median"))
                         .alias("median")).drop("peer_median"))
    per = per.with_columns(pl.when(pl.col("own") > pl.col("median")).then(pl.col("median") / pl.col("own"))
                           .otherwise(1.0).alias("f"))
    return df.select(["rank", "name"]).join(per.select(["rank", "name", "own", "median", "f"]), on=["rank", "name"],
                                            how="left", maintain_order="left").with_columns(
        pl.col("f").fill_null(1.0))


def apply(graph: Graph, b: Balance, weight: np.ndarray) -> None:
    """``weight`` (one per edge of ``graph``) with every rank's excess removed: own times and unexplained gaps
    scaled by their rank's factor, in place."""
    scaled = np.flatnonzero((b.act_factor < 1.0) & (b.own_edge >= 0))
    e = b.own_edge[scaled]
    weight[e] = np.rint(graph.lag[e] * b.act_factor[scaled]).astype(np.int64) + graph.slack[e]
    g = b.gap_factor < 1.0
    e = b.gap_edges[g]
    weight[e] = graph.lag[e] + np.rint(graph.slack[e] * b.gap_factor[g]).astype(np.int64)
