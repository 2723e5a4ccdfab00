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

from tracekit.analysis.graph.dag import EDGE_TYPES, Graph, own_edges
from tracekit.analysis.intervals import runs

_PROGRAM = EDGE_TYPES.index("program")
#: what an operation without a name is called where names travel as text
NO_NAME = "\x00"
#: activity kinds that are a rank's device work, and its host work
DEVICE_KINDS = ("compute", "memory")
HOST_KINDS = ("cpu_op", "runtime")


@dataclass(frozen=True)
class Work:
    """Each rank's work on a graph (the job's, or one rank's held apart: :meth:`concat` joins those), what balancing
    compares across ranks. ``signature`` (``rank, name, len``) is what a rank runs, which finds its peers; ``named``
    (``rank, name, own``) its time per operation of its work; ``kinds`` (``rank, name, label, own``) the same over the
    activities of the four work kinds, device or not, with each operation's name as text (the verdict's top
    excess). ``name`` is any key of an operation's name that is the same for the same name across the tables joined."""

    ranks: np.ndarray
    device_ns: np.ndarray
    host_ns: np.ndarray
    gap_ns: np.ndarray
    signature: pl.DataFrame
    named: pl.DataFrame
    kinds: pl.DataFrame

    @staticmethod
    def concat(parts: list[Work]) -> Work:
        """The work of the ranks of ``parts`` (each a rank's or a few ranks', in rank order)."""
        cat = np.concatenate
        return Work(ranks=cat([p.ranks for p in parts]), device_ns=cat([p.device_ns for p in parts]),
                    host_ns=cat([p.host_ns for p in parts]), gap_ns=cat([p.gap_ns for p in parts]),
                    signature=pl.concat([p.signature for p in parts]), named=pl.concat([p.named for p in parts]),
                    kinds=pl.concat([p.kinds for p in parts]))


@dataclass(frozen=True)
class Balance:
    """Per rank (``ranks``): its device and host work over the whole trace (ns), the median rank's, and the factor
    that brings each down to it (1 where it is not above). ``factors`` (``rank, name, own, median, f``): per rank and
    operation its time, its median peer's and the factor that scales it down; ``tops`` the same over the four work
    kinds with the operations' text (``label``); per rank its threads' unexplained gaps and their factor."""

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
    factors: pl.DataFrame
    tops: pl.DataFrame
    #: per rank: its threads' unexplained gaps (ns, the slack of program edges into host activities), its median
    #: peer's, and the factor that brings them down to it
    gap_ns: np.ndarray
    median_gap_ns: np.ndarray
    gap_factor: np.ndarray
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


@dataclass(frozen=True)
class Scaling:
    """What removing the excess does to one graph's edges (:func:`scaling`): per activity its factor (1 for
    communication) and own edge (-1 where none), the program edges into host activities whose slack is a thread's
    unexplained gap, and their factor."""

    act_factor: np.ndarray
    own_edge: np.ndarray
    gap_edges: np.ndarray
    gap_factor: np.ndarray


def _median_rank(values: np.ndarray) -> int:
    """The median rank's value: the lower middle one of the sorted values (an actual rank's)."""
    if values.size == 0:
        return 0
    return int(np.sort(values)[(values.size - 1) // 2])


def peer_groups(signature: pl.DataFrame, ranks: np.ndarray) -> np.ndarray:
    """Per rank of ``ranks``: its group of peers — ranks whose work (``signature``: ``rank, name, len``) has the same
    names the same number of times — or -1 where no other rank has its signature."""
    if signature.height == 0:
        return np.full(ranks.size, -1, dtype=np.int64)
    per = (signature.sort(["rank", "name"]).group_by("rank", maintain_order=True)
           .agg(pl.concat_str([pl.col("name").cast(pl.String), pl.col("len")], separator=":").str.join(",")
                .alias("sig")))
    sig = per.with_columns(pl.col("sig").hash().alias("h"))
    sig = sig.with_columns(pl.len().over("h").alias("n"), pl.col("h").rank("dense").alias("g"))
    out = np.full(ranks.size, -1, dtype=np.int64)
    shared = sig.filter(pl.col("n") > 1)
    out[np.searchsorted(ranks, shared.get_column("rank").to_numpy())] = shared.get_column("g").to_numpy().astype(
        np.int64)
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


@dataclass(frozen=True)
class _Keys:
    """Per activity of a graph what the balance groups and masks by (:func:`_keys`): its name's code (-1 for none:
    the same for the same name within the graph), whether it is device work, host work, or of either's kinds."""

    name: np.ndarray
    device: np.ndarray
    host: np.ndarray
    work_kind: np.ndarray


def _keys(graph: Graph) -> _Keys:
    """:class:`_Keys` of ``graph``, kept on it (its work and its scaling both read them)."""
    kept = graph.__dict__.get("_balance_keys")
    if kept is None:
        act = graph.act
        on_device = act.get_column("device").is_not_null().to_numpy()
        dev, host = _kinds(act, DEVICE_KINDS), _kinds(act, HOST_KINDS)
        kept = graph.__dict__["_balance_keys"] = _Keys(
            name=act.get_column("name").to_physical().fill_null(-1).to_numpy(), device=on_device & dev,
            host=~on_device & host, work_kind=dev | host)
    return kept


def _text(act: pl.DataFrame, rows: np.ndarray) -> pl.Series:
    """The names of activities ``rows`` as text (:data:`NO_NAME` for none): a key the same in every graph."""
    return act.get_column("name").gather(rows).cast(pl.String).fill_null(NO_NAME)


def _own_edges(graph: Graph) -> np.ndarray:
    """Per activity of ``graph``: its own edge, or -1."""
    return own_edges(graph)[1:2 * graph.act.height:2]


def _kinds(act: pl.DataFrame, kinds: tuple[str, ...]) -> np.ndarray:
    """Per activity: whether its kind is one of ``kinds`` (compared one by one: cheaper than a set test this small)."""
    kind = act.get_column("kind").cast(pl.String)
    hit = kind == kinds[0]
    for k in kinds[1:]:
        hit = hit | (kind == k)
    return hit.fill_null(False).to_numpy()


def _gap_edges(graph: Graph, host: np.ndarray) -> np.ndarray:
    """The program edges into host activities with slack: a thread's gaps nothing traced explains."""
    prog = np.flatnonzero(graph.etype == _PROGRAM)
    return prog[host[graph.dst[prog] // 2] & (graph.slack[prog] > 0)]


def work(graph: Graph, text: bool = False) -> Work:
    """Every rank's work on ``graph`` (its activities come rank by rank), its operations keyed by the names'
    categorical codes, which only one graph shares — by their text (:data:`NO_NAME` for none) with ``text``, where
    ranks' graphs are measured apart."""
    act = graph.act
    own_edge = _own_edges(graph)
    keys = _keys(graph)
    device, host = keys.device, keys.host
    rank = act.get_column("rank").fill_null(-1).to_numpy()
    by_run = runs(rank)  # a job's activities come rank by rank: their ranks and codes without a sort
    ranks, code = np.unique(rank, return_inverse=True) if by_run is None else \
        (by_run[0], np.repeat(np.arange(by_run[0].size), np.diff(by_run[1])))
    own = np.where(own_edge >= 0, graph.lag[np.maximum(own_edge, 0)], 0)
    dev_ns = np.bincount(code[device], weights=own[device], minlength=ranks.size).astype(np.int64)
    gap_edges = _gap_edges(graph, host)
    gap_ns = np.bincount(code[graph.dst[gap_edges] // 2], weights=graph.slack[gap_edges],
                         minlength=ranks.size).astype(np.int64)
    host_ns = np.bincount(code[host], weights=own[host], minlength=ranks.size).astype(np.int64) + gap_ns
    has_dev = dev_ns > 0
    # the (rank, name) groups by the names' codes, then the tables of the groups (a rank's work is too small for many
    # frames' calls to pay)
    codes = keys.name
    pair = code.astype(np.int64) * (int(codes.max(initial=-1)) + 2) + (codes + 1)
    _, first, group = np.unique(pair, return_index=True, return_inverse=True)
    size = first.size
    key = _text(act, first) if text else codes[first]

    def table(rows: np.ndarray, **cols: np.ndarray) -> pl.DataFrame:
        return pl.DataFrame({"rank": ranks[code[first[rows]]].astype(np.int64), "name": key[rows],
                             **{k: v[rows] for k, v in cols.items()}})

    # peers by their device kernels (GPU ranks) or their operators (CPU-only ranks)
    sig = np.where(has_dev[code], device, host)
    count = np.bincount(group[sig], minlength=size)
    signature = table(np.flatnonzero(count), len=count.astype(np.uint32))
    either = device | host
    named = table(np.flatnonzero(np.bincount(group[either], minlength=size)),
                  own=np.bincount(group[either], weights=own[either], minlength=size).astype(np.int64))
    four = np.flatnonzero(keys.work_kind)
    kinded, at = np.unique(group[four], return_index=True)  # each group's first activity of the four kinds
    label = act.get_column("name").gather(four[at]).cast(pl.String)
    kinds = table(kinded, own=np.bincount(group[four], weights=own[four], minlength=size).astype(np.int64)
                  ).with_columns(label.alias("label"))
    return Work(ranks=ranks, device_ns=dev_ns, host_ns=host_ns, gap_ns=gap_ns, signature=signature, named=named,
                kinds=kinds)


def measure(graph: Graph, iterations: int) -> Balance:
    """Every rank's device and host work on ``graph`` (over ``iterations`` iterations) and the factors that remove
    its excess over the median rank's."""
    return balance(work(graph), iterations)


def balance(w: Work, iterations: int) -> Balance:
    """The ranks' excess over their median peer's work (``w``: every rank's, :func:`work`) and the factors that remove
    it."""
    ranks, dev_ns, host_ns, gap_ns = w.ranks, w.device_ns, w.host_ns, w.gap_ns
    has_dev = dev_ns > 0
    peers = peer_groups(w.signature, ranks)
    m_dev = peer_medians(dev_ns, peers, among=has_dev)
    m_host = peer_medians(host_ns, peers)
    dev_f = np.where(has_dev & (dev_ns > m_dev), m_dev / np.maximum(dev_ns, 1), 1.0)
    host_f = np.where(host_ns > m_host, m_host / np.maximum(host_ns, 1), 1.0)
    # the replay scales each operation down to the median peer's time in it (a slow data loader shrinks to the median
    # loader, not every operation of its rank by the same share), and the threads' gaps by the rank's gap excess
    m_gap = peer_medians(gap_ns, peers)
    gap_f = np.where(gap_ns > m_gap, m_gap / np.maximum(gap_ns, 1), 1.0)
    return Balance(ranks=ranks, device_ns=dev_ns, host_ns=host_ns, median_device_ns=m_dev, median_host_ns=m_host,
                   peers=peers, device_factor=dev_f, host_factor=host_f,
                   factors=name_medians(w.named, ranks, peers), tops=name_medians(w.kinds, ranks, peers),
                   gap_ns=gap_ns, median_gap_ns=m_gap, gap_factor=gap_f, iterations=iterations)


def name_medians(per: pl.DataFrame, ranks: np.ndarray, peers: np.ndarray) -> pl.DataFrame:
    """``per`` (``rank, name, own``: each rank's total time in an operation; ``ranks`` and their ``peers``) with the
    median peer's (by name, among the peers that run it; among every rank that runs it where the rank has no peer) as
    ``median``, and ``f``, the latter over the former at most 1."""
    per = per.with_columns(pl.Series("peers", peers[np.searchsorted(ranks, per.get_column("rank").to_numpy())]))

    def lower_middle(by: list[str]) -> pl.DataFrame:
        return per.group_by(by).agg(pl.col("own").sort().alias("v")).with_columns(
            pl.col("v").list.get((pl.col("v").list.len() - 1) // 2).alias("median")).drop("v")

    per = (per.join(lower_middle(["peers", "name"]).rename({"median": "peer_median"}), on=["peers", "name"],
                    nulls_equal=True)
           .join(lower_middle(["name"]), on="name", nulls_equal=True)
           .with_columns(pl.when(pl.col("peers") >= 0).then(pl.col("peer_median")).otherwise(pl.col("median"))
                         .alias("median")).drop("peer_median", "peers"))
    return per.with_columns(pl.when(pl.col("own") > pl.col("median")).then(pl.col("median") / pl.col("own"))
                            .otherwise(1.0).alias("f"))


def scaling(graph: Graph, b: Balance, text: bool = False) -> Scaling:
    """What removing the excess of ``b`` does to ``graph``'s edges (``text`` as :func:`work` was given it)."""
    act = graph.act
    keys = _keys(graph)
    device, host = keys.device, keys.host
    rank = act.get_column("rank").fill_null(-1).to_numpy().astype(np.int64)
    codes = keys.name  # each (rank, name) looked up once, not each activity
    _, first, group = np.unique((rank + 1) * (int(codes.max(initial=-1)) + 2) + (codes + 1), return_index=True,
                                return_inverse=True)
    key = _text(act, first) if text else codes[first]
    f = pl.DataFrame({"rank": rank[first], "name": key}).join(
        b.factors.select(["rank", "name", "f"]), on=["rank", "name"], how="left", maintain_order="left",
        nulls_equal=True).get_column("f").fill_null(1.0).to_numpy()[group]
    act_factor = np.where(device | host, f, 1.0)
    gap_edges = _gap_edges(graph, host)
    at = np.searchsorted(b.ranks, rank[graph.dst[gap_edges] // 2])
    return Scaling(act_factor=act_factor, own_edge=_own_edges(graph), gap_edges=gap_edges,
                   gap_factor=b.gap_factor[np.minimum(at, max(b.ranks.size - 1, 0))])


def apply(graph: Graph, s: Scaling, weight: np.ndarray) -> None:
    """``weight`` (one per edge of ``graph``) with every rank's excess removed (:func:`scaling`): own times and
    unexplained gaps scaled by their rank's factor, in place."""
    scaled = np.flatnonzero((s.act_factor < 1.0) & (s.own_edge >= 0))
    e = s.own_edge[scaled]
    weight[e] = np.rint(graph.lag[e] * s.act_factor[scaled]).astype(np.int64) + graph.slack[e]
    g = s.gap_factor < 1.0
    e = s.gap_edges[g]
    weight[e] = graph.lag[e] + np.rint(graph.slack[e] * s.gap_factor[g]).astype(np.int64)
