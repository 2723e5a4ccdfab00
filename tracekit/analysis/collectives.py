"""Collectives across ranks (DESIGN.md "Collectives across ranks", FORMATS.md §5.4): which calls on
different ranks are the same collective, how the ranks' clocks relate, and — per instance — who arrived
last, how long everyone waited for it, and how long the transfer took.

**Matching.** A collective *instance* is the same call on every member of its process group. Calls are
keyed by ``(pg, seq)`` when the source has a sequence number (Kineto ``Seq`` since 2026, NCCL-log call
index per communicator), otherwise by ``(pg, op, bytes, ordinal)`` where the ordinal counts that
rank's earlier calls with equal ``(pg, op, bytes)`` in start order — in two stages (:func:`_keys`):
the k-th calls of each ``(pg, op)`` first, kept where the members agree on the size, then the rest by
size, so one call whose size the ranks disagree on does not shift every later call of that size. The
ordinal is per *rank*, not per
lane as DESIGN.md words it: gloo runs a process group's work on two worker threads that take turns
(whichever is free takes the next queued work), so the k-th bucket all-reduce sits on thread A on one
rank and on thread B on another, and per-lane ordinals pair the wrong calls. Work leaves gloo's queue in
issue order and NCCL kernels of one communicator run in issue order, so per-rank start order is issue
order. ``all_to_all`` keys on its element type instead of its bytes (per-rank sizes legitimately differ); send/recv are
matched as pairs ``src → dst`` by order when the peer is known, and stay unmatched otherwise. The
process group's members come from ``pg_config`` (``distributedInfo``) when known, else from the ranks
that have calls in that group; an instance seen on fewer ranks than its group has is *partial*.

**Clocks.** Ranks on the same (named) host share one clock. Between clock domains the offset is
estimated from collective *end* times — all members finish nearly together, whereas starts differ by
the very skew we want to measure: per pair of domains the median end-time difference over matched
instances (the largest messages first, at most :data:`CLOCK_INSTANCES` per domain), then a weighted
least-squares solve relative to rank 0's domain. An estimate is applied only when it is significant:
larger than 3 standard errors of a median of the pairwise differences (1.2533 σ/√n, σ from the MAD).
Otherwise same-clock ranks with no host name (e.g. two GPUs of one machine) would get noise as offsets.
The ``ranks`` table reports the estimate, what was applied, and the residual (median |end − instance
median end| after alignment).

**Consistency.** No member can finish an instance before the last member arrived. Instances that break
this after alignment (beyond the clock uncertainty) are not the same call — a sampled or cut trace
shifted the order — and are flagged, left out of the clock fit, and not split.

**Wait and transfer.** In the job clock, per member: ``wait = last start − own start``, ``transfer =
own end − last start``; the last arriver is the straggler. :func:`comm_split` turns this into the
WAIT/TRANSFER intervals :func:`tracekit.analysis.attribution.breakdown` sweeps (in each rank's own clock);
communication of unmatched, partial or inconsistent instances stays UNSPLIT.

Rows without times (NCCL-log calls: ``start_ns`` null) are not matched here; a later step gives the
Kineto rows their (commId, seq) from the log by per-rank call order, after which they match by
``(pg, seq)`` like any other.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from tracekit.analysis.attribution import TRANSFER, UNSPLIT, WAIT
from tracekit.analysis.links import bus_bytes_expr
from tracekit.model import schema
from tracekit.model.diagnostics import Diagnostic
from tracekit.model.units import count

#: ops whose per-rank sizes differ legitimately (splits), so bytes are not part of their key
VARIABLE_SIZE_OPS = ("all_to_all",)
P2P_OPS = ("send", "recv")
#: at most this many instances per clock domain (largest messages first) feed the offset fit
CLOCK_INSTANCES = 2000
#: timestamps of the int-µs era are truncated: an end can be off by up to 2 µs
TIMESTAMP_SLACK_NS = 2_000
#: an estimated offset is applied when it exceeds this many standard errors
SIGNIFICANCE = 3.0
#: clocks of one job are not this far apart (NTP keeps them within ms); a larger "offset" means traces
#: of different runs or times, and is not applied
MAX_OFFSET_NS = 60 * 10**9

_KEY = ["k_mode", "k_pg", "k_op", "k_bytes", "k_src", "k_dst", "k_seq"]


@dataclass
class Matching:
    """Result of :func:`match`: tables of the schemas ``COLLECTIVE_INSTANCES`` / ``COLLECTIVE_MEMBERS``, per
    rank clock figures (``rank, clock_offset_ns, clock_estimate_ns, clock_residual_ns, clock_method``) and
    warnings about the inputs."""

    instances: pa.Table
    members: pa.Table
    clocks: pl.DataFrame
    diagnostics: list[Diagnostic] = field(default_factory=list)

    @property
    def matched(self) -> bool:
        """Whether any instance has two or more members."""
        if self.instances.num_rows == 0:
            return False
        lens = pl.from_arrow(self.instances.select(["ranks"])).get_column("ranks").list.len()  # type: ignore[union-attr]
        return bool((lens >= 2).any())


def groups_from_meta(metas: Iterable[dict[str, Any]]) -> dict[str, list[int]]:
    """Process-group members from Kineto ``distributedInfo.pg_config`` entries: ``{pg_name: ranks}``; the
    default group is also filed under ``"default"`` (the key of calls that name no group)."""
    out: dict[str, list[int]] = {}
    for meta in metas:
        for entry in meta.get("pg_config") or []:
            if not isinstance(entry, dict):
                continue
            ranks = entry.get("ranks")
            if not isinstance(ranks, list) or not ranks or not all(
                    isinstance(r, int) and not isinstance(r, bool) and 0 <= r < 2**31 for r in ranks):
                continue
            name = entry.get("pg_name")
            if name is not None:
                out.setdefault(str(name), sorted(ranks))
            if entry.get("pg_desc") == "default_pg":
                out.setdefault("default", sorted(ranks))
    return out


def group_descs(metas: Iterable[dict[str, Any]]) -> dict[str, str]:
    """Process-group descriptions from ``pg_config``: ``{pg_name: pg_desc}`` (``default_pg``, ``mesh_dp``, a
    ``group_desc`` given to ``new_group``; ``undefined`` ones left out)."""
    out: dict[str, str] = {}
    for meta in metas:
        for entry in meta.get("pg_config") or []:
            if isinstance(entry, dict) and entry.get("pg_name") is not None and isinstance(entry.get("pg_desc"), str) \
                    and entry["pg_desc"] not in ("", "undefined"):
                out.setdefault(str(entry["pg_name"]), entry["pg_desc"])
    return out


def _empty_clocks() -> pl.DataFrame:
    return pl.DataFrame(schema={"rank": pl.Int32, "clock_offset_ns": pl.Int64, "clock_estimate_ns": pl.Int64,
                                "clock_residual_ns": pl.Int64, "clock_method": pl.String})


def _keys(c: pl.DataFrame) -> pl.DataFrame:
    """Add the matching key columns (see the module docstring) and the per-rank ordinal ``k_ord``.

    Calls matched by order go through two stages. First the k-th call of each (pg, op) on every rank
    forms an instance, kept when every rank that calls that (pg, op) is in it and the members agree on
    the size. The calls of the other instances (gloo
    took two buckets of different sizes in a different order on two ranks; a rank disagrees on a size;
    a call is missing) are then matched by the k-th call of each (pg, op, bytes) among themselves, and
    remember their first-stage instance in ``s1`` (how disagreeing sizes are found later). Matching by
    size alone from the start would let one disagreeing call shift every later call of that size.
    """
    # each rank's calls in time order: often so already (a dataset's are), then not copied; else sorted before the
    # keys are added (a sort copies every column)
    order = c.select(pl.arg_sort_by(["rank", "start_ns", "end_ns", "collective_id"], maintain_order=True)).to_series()
    if not (order.diff().drop_nulls() == 1).all():
        c = c[order]
    has_seq = pl.col("seq").is_not_null() & pl.col("pg").is_not_null()
    p2p = pl.col("op").is_in(P2P_OPS)
    known_peer = p2p & pl.col("peer").is_not_null()
    c = c.with_columns(
        pl.when(has_seq & ~p2p).then(0).when(known_peer).then(2).when(p2p).then(3).otherwise(1)
        .cast(pl.Int8).alias("k_mode"),
        pl.coalesce(pl.col("pg"), pl.lit("default")).alias("k_pg"),
    )
    mode = pl.col("k_mode")
    variable = pl.col("op").is_in(VARIABLE_SIZE_OPS)
    two_stage = (mode == 1) & ~variable
    c = c.with_columns(
        pl.when(mode == 0).then(pl.lit("")).when(mode == 2).then(pl.lit("sendrecv"))
        # variable-size ops: the element type still has to agree
        .when(variable).then(pl.col("op") + "/" + pl.col("dtype").fill_null("?"))
        .otherwise(pl.coalesce(pl.col("op"), pl.lit("?"))).alias("k_op"),
        # -4: first stage (size not in the key), -3: by seq, -2: variable size
        pl.when(mode == 0).then(-3).when(variable).then(-2).when(two_stage).then(-4)
        .otherwise(pl.col("bytes").fill_null(-1)).cast(pl.Int64).alias("k_bytes"),
        # p2p: the pair src -> dst; an unknown peer makes the call its own key (unmatched)
        pl.when(mode == 2).then(pl.when(pl.col("op") == "send").then(pl.col("rank")).otherwise(pl.col("peer")))
        .when(mode == 3).then(pl.col("rank")).otherwise(-1).cast(pl.Int64).alias("k_src"),
        pl.when(mode == 2).then(pl.when(pl.col("op") == "send").then(pl.col("peer")).otherwise(pl.col("rank")))
        .otherwise(-1).cast(pl.Int64).alias("k_dst"),
        pl.when(mode == 0).then(pl.col("seq")).when((mode == 2) & pl.col("seq").is_not_null()).then(pl.col("seq"))
        .otherwise(-1).cast(pl.Int64).alias("k_seq"),
    )
    c = c.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).over(["rank", *_KEY]).alias("k_ord"))
    # second stage for first-stage instances that miss a rank or whose members disagree on the size
    users = pl.col("rank").n_unique().over(["k_mode", "k_pg", "k_op"])
    # a rank that recorded no size (null) disagrees with nobody
    rejected = (pl.col("k_bytes") == -4) & ((pl.col("bytes").drop_nulls().n_unique().over([*_KEY, "k_ord"]) > 1)
                                            | (pl.len().over([*_KEY, "k_ord"]) < users))
    c = c.with_columns(rejected.alias("_rej"))
    c = c.with_columns(pl.when("_rej").then(pl.col("k_ord")).alias("s1"),
                       pl.when("_rej").then(pl.col("bytes").fill_null(-1)).otherwise(pl.col("k_bytes"))
                       .alias("k_bytes"))
    return c.with_columns(pl.when("_rej").then(pl.int_range(pl.len(), dtype=pl.Int64).over(["rank", *_KEY]))
                          .otherwise(pl.col("k_ord")).alias("k_ord")).drop("_rej")


#: how many calls a send/recv channel's two sides may be out of step (a window that cut a pipeline mid-step)
P2P_MAX_SHIFT = 3


def _align_p2p(c: pl.DataFrame, dom: pl.DataFrame) -> pl.DataFrame:
    """Send/recv matched by order (no sequence number) on a channel whose two ranks share a clock: when the
    profiled window starts or ends between a send and its receive (a pipeline cut mid-step), the k-th send is
    not the k-th receive. The receives' ordinals are shifted by the d in ±:data:`P2P_MAX_SHIFT` that makes the
    most pairs possible in time (the receive ends after the send began); d = 0 unless another is strictly
    better. Ranks on different hosts keep d = 0 (their clocks are aligned only after matching)."""
    p2p = (pl.col("k_mode") == 2) & (pl.col("k_seq") == -1)
    if not c.select(p2p.any()).item():
        return c
    host = dict(dom.select(["rank", "domain"]).iter_rows())
    chan = ["k_pg", "k_op", "k_bytes", "k_src", "k_dst"]
    shifts: list[tuple[Any, ...]] = []
    for key, g in c.filter(p2p).group_by(chan):
        src, dst = int(key[3]), int(key[4])
        if host.get(src) is None or host.get(src) != host.get(dst):
            continue
        s = g.filter(pl.col("op") == "send").sort("k_ord").get_column("start_ns").to_numpy()
        r = g.filter(pl.col("op") == "recv").sort("k_ord").get_column("end_ns").to_numpy()
        if s.size == 0 or r.size == 0:
            continue

        fits = {d: _possible_pairs(s, r, d) for d in range(-P2P_MAX_SHIFT, P2P_MAX_SHIFT + 1)}
        best = max(fits, key=lambda d: (fits[d], -abs(d)))
        if best != 0 and fits[best] > fits[0]:
            shifts.append((*key, best))
    if not shifts:
        return c
    sh = pl.DataFrame(shifts, schema={**{k: c.schema[k] for k in chan}, "_d": pl.Int64}, orient="row")
    return c.join(sh, on=chan, how="left", maintain_order="left").with_columns(
        pl.when(p2p & (pl.col("op") == "recv") & pl.col("_d").is_not_null())
        .then(pl.col("k_ord") + pl.col("_d")).otherwise(pl.col("k_ord")).alias("k_ord")).drop("_d")


def _possible_pairs(send_start: np.ndarray, recv_end: np.ndarray, d: int) -> int:
    """How many receives j, paired with sends j + d, end after their send began."""
    j = np.arange(max(0, -d), min(recv_end.size, send_start.size - d))
    return int((send_start[j + d] <= recv_end[j] + TIMESTAMP_SLACK_NS).sum())


def _infer_peers(c: pl.DataFrame, groups: dict[str, list[int]], ranks: pa.Table) -> pl.DataFrame:
    """Send/recv calls that name no peer (gloo writes none) in a group of two: the peer is the other member.
    The group is the call's process group from ``pg_config``, else the whole job; in larger groups the peer
    stays unknown and the call unmatched (a guess could pair the wrong stages)."""
    missing = pl.col("op").is_in(P2P_OPS) & pl.col("peer").is_null()
    if not c.select(missing.any()).item():
        return c
    world = sorted({int(r) for r in ranks.column("rank").to_pylist() if r is not None}
                   | set(c.get_column("rank").unique().to_list()))
    pairs = {name: members for name, members in groups.items() if len(members) == 2}
    if len(world) == 2:
        pairs.setdefault("default", world)
    if not pairs:
        return c
    rows = [(pg, a, b) for pg, (a, b) in pairs.items()] + [(pg, b, a) for pg, (a, b) in pairs.items()]
    other = pl.DataFrame(rows, schema={"_pg": pl.String, "rank": pl.Int32, "_other": pl.Int32}, orient="row")
    c = c.with_columns(pl.coalesce(pl.col("pg"), pl.lit("default")).alias("_pg")).join(
        other, on=["_pg", "rank"], how="left")
    return c.with_columns(pl.when(missing).then(pl.col("_other")).otherwise(pl.col("peer")).alias("peer")).drop(
        "_pg", "_other")


def fill_sizes(collectives: pa.Table, matching: Matching) -> pa.Table:
    """Calls of unknown size take the size the other members of their matched instance recorded (all members of
    an instance move the same buffer; ``size_source`` = ``peer``). All-to-all, whose per-rank sizes differ, and
    instances whose members disagree are left alone."""
    if collectives.num_rows == 0 or matching.members.num_rows == 0:
        return collectives
    c = pl.from_arrow(collectives)
    assert isinstance(c, pl.DataFrame)
    if c.get_column("bytes").null_count() == 0:
        return collectives
    mem = pl.from_arrow(matching.members.select(["instance", "rank", "collective_id"]))
    inst = pl.from_arrow(matching.instances.select(["instance", "op", "bytes", "sizes_agree", "consistent"]))
    assert isinstance(mem, pl.DataFrame) and isinstance(inst, pl.DataFrame)
    known = inst.filter(pl.col("bytes").is_not_null() & pl.col("sizes_agree") & pl.col("consistent")
                        & ~pl.col("op").is_in(VARIABLE_SIZE_OPS))
    fill = mem.join(known.select(["instance", pl.col("bytes").alias("_peer_bytes")]), on="instance").select(
        pl.col("rank").cast(pl.Int32), "collective_id", "_peer_bytes")
    c = c.join(fill, on=["rank", "collective_id"], how="left")
    take = pl.col("bytes").is_null() & pl.col("_peer_bytes").is_not_null()
    c = c.with_columns(pl.when(take).then(pl.lit("peer")).otherwise(pl.col("size_source")).alias("size_source"),
                       pl.coalesce("bytes", "_peer_bytes").alias("bytes")).drop("_peer_bytes")
    return schema.conform(c.to_arrow(), schema.COLLECTIVES)


def _domains(ranks: pa.Table, seen: Iterable[int]) -> pl.DataFrame:
    """Clock domain per rank: ranks on the same named host share one; a rank without a host is its own."""
    r = pl.from_arrow(ranks.select(["rank", "host"]))
    assert isinstance(r, pl.DataFrame)
    extra = sorted(set(seen) - set(r.get_column("rank").to_list()))
    if extra:
        r = pl.concat([r, pl.DataFrame({"rank": extra, "host": [None] * len(extra)},
                                       schema={"rank": pl.Int32, "host": pl.String})])
    r = r.unique("rank", keep="first").sort("rank")
    name = pl.when(pl.col("host").is_not_null() & (pl.col("host").str.len_chars() > 0)) \
        .then(pl.lit("host:") + pl.col("host")).otherwise(pl.lit("rank:") + pl.col("rank").cast(pl.String))
    r = r.with_columns(name.alias("dname"))
    # domain ids in order of their lowest rank, so rank 0's domain is 0
    first = r.group_by("dname").agg(pl.col("rank").min().alias("lo")).sort("lo") \
        .with_row_index("domain").with_columns(pl.col("domain").cast(pl.Int64))
    return r.join(first.select(["dname", "domain"]), on="dname").select(["rank", "host", "domain"]).sort("rank")


def _solve_offsets(pairs: pl.DataFrame, n_domains: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Offsets per domain from pairwise end differences (``a, b, diff = end_b - end_a``).

    Returns ``(offset, standard error, connected to domain 0)``; ``offset[a] - offset[b]`` fits the median
    ``diff`` of each pair by least squares weighted by √n, with ``offset[0] = 0`` (each other connected
    component anchored at its lowest domain).
    """
    est = np.zeros(n_domains)
    se = np.full(n_domains, np.inf)
    se[0] = 0.0
    linked = np.zeros(n_domains, dtype=bool)
    linked[0] = True
    if pairs.height == 0:
        return est, se, linked
    stat = pairs.group_by(["a", "b"]).agg(pl.col("diff").median().alias("med"), pl.len().alias("n"))
    a = stat.get_column("a").to_numpy()
    b = stat.get_column("b").to_numpy()
    med = stat.get_column("med").to_numpy().astype(np.float64)
    w = np.sqrt(stat.get_column("n").to_numpy().astype(np.float64))
    # connected components (few domains: a simple label propagation)
    comp = np.arange(n_domains)
    changed = True
    while changed:
        lo = np.minimum(comp[a], comp[b])
        before = comp.copy()
        np.minimum.at(comp, a, lo)
        np.minimum.at(comp, b, lo)
        comp = comp[comp]
        changed = not np.array_equal(before, comp)
    linked = comp == comp[0]
    anchors = {int(x) for x in np.unique(comp)}
    free = np.array([d for d in range(n_domains) if d not in anchors], dtype=np.int64)
    if free.size:
        col = np.full(n_domains, -1)
        col[free] = np.arange(free.size)
        rows = np.arange(len(a))
        mat = np.zeros((len(a), free.size))
        ia, ib = col[a], col[b]
        mat[rows[ia >= 0], ia[ia >= 0]] = 1.0
        mat[rows[ib >= 0], ib[ib >= 0]] = -1.0
        sol, *_ = np.linalg.lstsq(mat * w[:, None], med * w, rcond=None)
        est[free] = sol
    # standard error of each offset: robust sigma of the pairwise residuals involving the domain
    res = pairs.with_columns(
        (pl.col("diff") - (pl.col("a").replace_strict(list(range(n_domains)), est.tolist(), return_dtype=pl.Float64)
                           - pl.col("b").replace_strict(list(range(n_domains)), est.tolist(),
                                                        return_dtype=pl.Float64))).abs().alias("r"))
    both = pl.concat([res.select(pl.col("a").alias("d"), "r"), res.select(pl.col("b").alias("d"), "r")])
    spread = both.group_by("d").agg(pl.col("r").median().alias("mad"), pl.len().alias("n"))
    for d, mad, n in spread.iter_rows():
        if d in anchors:
            continue
        se[d] = 1.2533 * 1.4826 * float(mad) / np.sqrt(n)
    se[list(anchors)] = 0.0
    return est, se, linked


def _pairs(m: pl.DataFrame) -> pl.DataFrame:
    """End-time differences between each instance's members in different clock domains, paired with the
    instance's lowest domain (``a``): ``a, b, diff``. Largest messages first, :data:`CLOCK_INSTANCES` per
    domain."""
    # medians in float64: relative to the earliest end, or 1.7e18 ns epochs lose 256 ns
    base = m.get_column("end_ns").min()
    if m.select(pl.struct(["tmp", "domain"]).is_unique().all()).item():
        ie = m.select("tmp", "domain", (pl.col("end_ns") - base).cast(pl.Float64).alias("end"),
                      pl.col("bytes").fill_null(0).alias("bytes"))  # one rank per domain: nothing to reduce
    else:
        ie = m.group_by(["tmp", "domain"]).agg((pl.col("end_ns") - base).median().alias("end"),
                                             pl.col("bytes").max().fill_null(0).alias("bytes"))
    ie = ie.filter(pl.len().over("tmp") >= 2)
    if ie.height == 0:
        return pl.DataFrame(schema={"a": pl.Int64, "b": pl.Int64, "diff": pl.Float64})
    # largest messages first; ties in instance order, so the choice is deterministic
    ie = ie.sort(["domain", "bytes", "tmp"], descending=[False, True, False]) \
        .filter(pl.int_range(pl.len()).over("domain") < CLOCK_INSTANCES)
    anchor = ie.sort(["tmp", "domain"]).group_by("tmp").agg(pl.col("domain").first().alias("a"),
                                                            pl.col("end").first().alias("end_a"))
    return (ie.join(anchor, on="tmp").filter(pl.col("domain") != pl.col("a"))
            .select([pl.col("a"), pl.col("domain").alias("b"), (pl.col("end") - pl.col("end_a")).alias("diff")]))


def _consistency(m: pl.DataFrame, off: pl.DataFrame, tol: float) -> pl.DataFrame:
    """Per instance (``tmp``): whether the last arrival precedes the first end in the job clock — for a
    send/recv pair, whether the receive ends after the send began (an eager send may finish before the
    receive is posted)."""
    j = m.join(off, on="domain").with_columns((pl.col("start_ns") + pl.col("off")).alias("s"),
                                              (pl.col("end_ns") + pl.col("off")).alias("e"))
    ready = _ready(j)
    j = j.join(ready, on="tmp", how="left")
    p2p = pl.col("k_mode").first() == 2
    return j.group_by("tmp").agg(pl.when(p2p).then(
        (pl.col("ready").first() - pl.col("e").filter(pl.col("op") == "recv").min()).fill_null(0) <= tol)
        .otherwise((pl.col("s").max() - pl.col("e").min()) <= tol).alias("consistent"))


def _ready(c: pl.DataFrame) -> pl.DataFrame:
    """Per instance (``tmp``): when its data could start moving (``ready``) — the last member's arrival for a
    collective; the send's start for a send/recv pair, whose receiver waits for the sender but not the other
    way round (``s``: start in the job clock)."""
    return c.group_by("tmp").agg(pl.when(pl.col("k_mode").first() == 2).then(
        pl.coalesce(pl.col("s").filter(pl.col("op") == "send").min(), pl.col("s").max()))
        .otherwise(pl.col("s").max()).alias("ready"))


@dataclass
class _Fit:
    applied: np.ndarray  # offset to add per domain (ns)
    estimate: np.ndarray  # raw least-squares estimate per domain
    se: np.ndarray  # its standard error (inf: no data)
    linked: np.ndarray  # connected to domain 0 through matched instances
    tol: float  # tolerance of the consistency check (ns)


def _clock_fit(m: pl.DataFrame, n_domains: int) -> _Fit:
    """Offsets to apply per domain (significant estimates only), the raw estimates, their standard errors
    and the tolerance of the consistency check."""
    est, se, linked = _solve_offsets(_pairs(m), n_domains)
    applied = np.where(linked & (np.abs(est) > SIGNIFICANCE * se) & (np.abs(est) <= MAX_OFFSET_NS), np.round(est),
                       0.0)
    finite = se[np.isfinite(se) & linked]
    tol = TIMESTAMP_SLACK_NS + (SIGNIFICANCE * float(finite.max()) if finite.size else 0.0)
    return _Fit(applied, est, se, linked, tol)


def match(collectives: pa.Table, ranks: pa.Table, *, groups: dict[str, list[int]] | None = None,
          events: pa.Table | None = None, align: bool = True) -> Matching:
    """Match the collective calls of all ranks into instances, estimate clock offsets, and measure skew,
    wait and transfer (module docstring). ``groups`` maps process-group names to their ranks
    (:func:`groups_from_meta`); ``events`` (with iterations assigned) gives each instance its
    iteration; ``align=False`` keeps every rank on its own clock."""
    groups = groups or {}
    diags: list[Diagnostic] = []
    cols = ["rank", "collective_id", "pg", "seq", "op", "dtype", "bytes", "nranks", "peer", "start_ns", "end_ns"]
    c = pl.from_arrow(collectives.select(cols)) if collectives.num_rows else None
    assert c is None or isinstance(c, pl.DataFrame)
    if c is not None:
        c = c.filter(pl.col("rank").is_not_null() & pl.col("start_ns").is_not_null()
                     & pl.col("end_ns").is_not_null())
    if c is None or c.height == 0:
        return Matching(schema.empty(schema.COLLECTIVE_INSTANCES), schema.empty(schema.COLLECTIVE_MEMBERS),
                        _empty_clocks(), diags)
    c = _infer_peers(c.with_columns(pl.col("rank").cast(pl.Int32)), groups, ranks)
    c = _keys(c).drop("pg", "dtype", "peer")  # (in the keys now; every join below copies the columns kept)
    dom = _domains(ranks, c.get_column("rank").unique().to_list())
    c = _align_p2p(c, dom)
    # instances: temporary ids in order of first appearance (deterministic: c is sorted)
    inst = c.group_by([*_KEY, "k_ord"], maintain_order=True).agg(pl.len().alias("n")).with_row_index("tmp") \
        .with_columns(pl.col("tmp").cast(pl.Int64))
    c = c.join(inst.select([*_KEY, "k_ord", "tmp"]), on=[*_KEY, "k_ord"], how="left").drop(
        [k for k in _KEY if k not in ("k_mode", "k_pg")])  # (the instance says what they did)
    c = c.join(dom.select(["rank", "domain"]), on="rank", how="left")
    n_domains = int(dom.get_column("domain").max()) + 1  # type: ignore[arg-type]

    # clocks: fit, flag impossible instances, fit again without them
    if align and n_domains > 1:
        fit = _clock_fit(c, n_domains)
        off = pl.DataFrame({"domain": np.arange(n_domains, dtype=np.int64), "off": fit.applied.astype(np.int64)})
        ok = _consistency(c, off, fit.tol)
        bad = ok.filter(~pl.col("consistent")).get_column("tmp")
        if bad.len():
            fit = _clock_fit(c.filter(~pl.col("tmp").is_in(bad.implode())), n_domains)
    else:
        fit = _Fit(np.zeros(n_domains), np.full(n_domains, np.nan), np.zeros(n_domains),
                   np.ones(n_domains, dtype=bool), float(TIMESTAMP_SLACK_NS))
    off = pl.DataFrame({"domain": np.arange(n_domains, dtype=np.int64), "off": fit.applied.astype(np.int64)})
    ok = _consistency(c, off, fit.tol)
    c = c.join(off, on="domain").join(ok, on="tmp").with_columns(
        (pl.col("start_ns") + pl.col("off")).alias("s"), (pl.col("end_ns") + pl.col("off")).alias("e"))

    # group sizes: the call's own group size, else pg_config, else the ranks that use the group
    group_len = pl.DataFrame({"k_pg": list(groups), "g_len": [len(v) for v in groups.values()]},
                             schema={"k_pg": pl.String, "g_len": pl.Int64})
    users = c.group_by("k_pg").agg(pl.col("rank").n_unique().cast(pl.Int64).alias("u_len"))
    c = c.join(group_len, on="k_pg", how="left").join(users, on="k_pg", how="left")
    c = c.with_columns(pl.when(pl.col("k_mode") >= 2).then(2)
                       .otherwise(pl.coalesce(pl.col("nranks").cast(pl.Int64), "g_len", "u_len")).alias("gsize"))

    agg = c.group_by("tmp").agg(
        pl.col("k_pg").first().alias("pg"),
        pl.when(pl.col("k_mode").first() == 0).then(pl.col("seq").first()).alias("seq"),
        pl.when(pl.col("k_mode").first() != 0).then(pl.col("k_ord").first()).alias("ordinal"),
        pl.col("k_mode").first().alias("mode"),
        pl.when(pl.col("k_mode").first() == 2).then(pl.lit("sendrecv")).otherwise(pl.col("op").drop_nulls().first())
        .alias("op"),
        pl.col("op").drop_nulls().n_unique().alias("n_ops"),
        pl.col("bytes").max().alias("bytes"),
        pl.col("bytes").drop_nulls().n_unique().alias("n_sizes"),
        pl.col("gsize").max().alias("nranks"),
        pl.col("u_len").max().alias("u_len"),
        pl.col("rank").sort().alias("ranks"),
        pl.col("consistent").first(),
        pl.col("s").min().alias("first_start_ns"), pl.col("s").max().alias("last_start_ns"),
        pl.col("e").min().alias("first_end_ns"), pl.col("e").max().alias("last_end_ns"),
        pl.col("rank").sort_by(["s", "rank"]).last().alias("last_rank"),
    )
    n_seen = pl.col("ranks").list.len()
    agg = agg.with_columns(
        (n_seen < pl.col("nranks")).fill_null(False).alias("partial"),
        (((pl.col("n_sizes") <= 1) | pl.col("op").is_in(VARIABLE_SIZE_OPS))
         & ((pl.col("n_ops") <= 1) | (pl.col("mode") == 2))).alias("sizes_agree"),
    )
    agg = _size_disagreements(c, agg, fit.tol, diags)
    usable = (n_seen >= 2) & ~pl.col("partial") & pl.col("consistent") & pl.col("sizes_agree")
    # a straggler is named only when the skew exceeds what the clocks can tell apart
    late = (pl.col("last_start_ns") - pl.col("first_start_ns")) > fit.tol
    agg = agg.with_columns(usable.alias("usable"),
                           pl.when(usable & late).then(pl.col("last_rank")).alias("straggler_rank"),
                           pl.when(pl.col("mode") == 0).then(pl.lit("pg+seq")).when(pl.col("mode") == 1)
                           .then(pl.lit("order")).when(pl.col("mode") == 2).then(pl.lit("p2p order"))
                           .otherwise(pl.lit("unmatched")).alias("matched_by"))
    # members: wait and transfer in the job clock, from the time the data could start moving (``ready``)
    c = c.join(agg.select(["tmp", "last_start_ns", "consistent", "straggler_rank"]).rename(
        {"consistent": "i_ok"}), on="tmp")
    c = c.join(_ready(c), on="tmp", how="left").with_columns(
        pl.max_horizontal("ready", "s").clip(upper_bound=pl.col("e")).alias("_from"))
    c = c.with_columns(
        pl.when(pl.col("i_ok")).then(pl.col("_from") - pl.col("s")).alias("wait_ns"),
        pl.when(pl.col("i_ok")).then(pl.col("e") - pl.col("_from")).alias("transfer_ns"),
        (pl.col("rank") == pl.col("straggler_rank")).fill_null(False).alias("straggler"),
    )
    per = c.group_by("tmp").agg(pl.col("wait_ns").sum().alias("wait_ns"),
                                pl.col("transfer_ns").median().round().cast(pl.Int64).alias("transfer_ns"),
                                pl.col("wait_ns").is_null().any().alias("_nowait"))
    agg = agg.join(per, on="tmp").with_columns(
        pl.when(pl.col("_nowait")).then(None).otherwise(pl.col("wait_ns")).alias("wait_ns"),
        pl.when(pl.col("consistent")).then(pl.col("last_start_ns") - pl.col("first_start_ns")).alias("skew_ns"),
    )
    agg = agg.with_columns(bus_bytes_expr("op", "bytes", "nranks").alias("bus_bytes"))
    if events is not None and events.num_rows:
        ev = pl.from_arrow(events.select(["rank", "collective_id", "iteration"]))
        assert isinstance(ev, pl.DataFrame)
        ev = ev.filter(pl.col("collective_id").is_not_null()).unique(["rank", "collective_id"], keep="first")
        it = c.select(["tmp", "rank", "collective_id", "s"]).join(ev, on=["rank", "collective_id"], how="left") \
            .group_by("tmp").agg(pl.col("iteration").sort_by("s").drop_nulls().first().alias("iteration"))
        agg = agg.join(it, on="tmp", how="left")
    else:
        agg = agg.with_columns(pl.lit(None, dtype=pl.Int64).alias("iteration"))
    agg = agg.with_columns(
        (pl.col("bus_bytes") * 8 / pl.col("transfer_ns")).alias("busbw_gbps"),
    ).with_columns(pl.when(pl.col("transfer_ns") > 0).then(pl.col("busbw_gbps")).alias("busbw_gbps"))
    agg = agg.sort(["first_start_ns", "tmp"]).with_row_index("instance").with_columns(pl.col("instance")
                                                                                       .cast(pl.Int64))
    ids = agg.select(["tmp", "instance"])
    c = c.join(ids, on="tmp")
    instances = schema.table(schema.COLLECTIVE_INSTANCES, {
        name: agg.get_column(name).to_arrow() for name in schema.COLLECTIVE_INSTANCES.names
        if name in agg.columns and name != "link_utilisation"})
    c = c.sort(["instance", "rank"])
    members = schema.table(schema.COLLECTIVE_MEMBERS, {
        "instance": c.get_column("instance").to_arrow(), "rank": c.get_column("rank").to_arrow(),
        "collective_id": c.get_column("collective_id").to_arrow(), "bytes": c.get_column("bytes").to_arrow(),
        "start_ns": c.get_column("s").to_arrow(), "end_ns": c.get_column("e").to_arrow(),
        "wait_ns": c.get_column("wait_ns").to_arrow(), "transfer_ns": c.get_column("transfer_ns").to_arrow(),
        "straggler": c.get_column("straggler").to_arrow()})
    clocks = _clock_table(c, dom, fit, align)
    for rank, est_ns in clocks.filter(pl.col("clock_method") == "implausible").select(
            ["rank", "clock_estimate_ns"]).iter_rows():
        diags.append(Diagnostic("", f"rank {rank}'s collectives line up with the others' only if its clock were "
                                    f"{abs(est_ns) / 1e9:.0f} s off; not applied: are the traces from the same "
                                    "run?"))
    diags.extend(_diagnose(agg, c, dom))
    return Matching(instances, members, clocks, diags)


def _size_disagreements(c: pl.DataFrame, agg: pl.DataFrame, tol: float, diags: list[Diagnostic]) -> pl.DataFrame:
    """Ranks that disagree on a call's size: calls that were the k-th of their (pg, op) on their ranks
    (first stage of :func:`_keys`), had different sizes, overlap in time (job clock), and found no
    partner of their own size (their instances miss some traced member). They are flagged, not merged.
    Gloo taking two buckets in a different order also fails the first stage, but each finds its partner
    in the second; a call missing from a sampled or cut trace shifts the order too, but the calls then
    do not overlap in time."""
    short = agg.filter(pl.col("ranks").list.len() < pl.min_horizontal("nranks", "u_len")).get_column("tmp")
    if short.len() == 0:
        return agg
    cand = c.filter(pl.col("s1").is_not_null() & pl.col("tmp").is_in(short.implode())).select(
        ["tmp", "rank", "k_pg", "op", "s1", "bytes", "s", "e"])
    pairs = cand.join(cand, on=["k_pg", "op", "s1"], suffix="_b").filter(
        (pl.col("rank") < pl.col("rank_b")) & (pl.col("bytes") != pl.col("bytes_b"))
        & (pl.max_horizontal("s", "s_b") <= pl.min_horizontal("e", "e_b") + tol))
    if pairs.height == 0:
        return agg
    first = pairs.sort("s").row(0, named=True)
    n_calls = pl.concat([pairs.get_column("tmp"), pairs.get_column("tmp_b")]).n_unique()
    diags.append(Diagnostic("", f"ranks disagree on the size of {n_calls} collective calls (first: "
                                f"{first['op']} #{first['s1']} of process group {first['k_pg']}: "
                                f"{first['bytes']} B on rank {first['rank']}, {first['bytes_b']} B on rank "
                                f"{first['rank_b']}, at the same time); they are not merged: each stays a "
                                "partial instance with sizes_agree = false, without wait/transfer"))
    bad = pl.concat([pairs.get_column("tmp"), pairs.get_column("tmp_b")]).unique()
    return agg.with_columns(pl.when(pl.col("tmp").is_in(bad.implode())).then(False)
                            .otherwise(pl.col("sizes_agree")).alias("sizes_agree"))


def _clock_table(c: pl.DataFrame, dom: pl.DataFrame, fit: _Fit, align: bool) -> pl.DataFrame:
    """Per rank: applied offset, raw estimate, residual and how the offset was decided."""
    multi = c.filter(pl.col("i_ok") & (pl.len().over("tmp") >= 2))
    base = multi.get_column("e").min() if multi.height else 0
    res = multi.with_columns((pl.col("e") - base).alias("e")) \
        .with_columns((pl.col("e") - pl.col("e").median().over("tmp")).abs().alias("r")) \
        .group_by("rank").agg(pl.col("r").median().round().cast(pl.Int64).alias("clock_residual_ns"))
    matched_ranks = set(multi.get_column("rank").unique().to_list())
    rows = []
    ref_domain_ranks = set(dom.filter(pl.col("domain") == 0).get_column("rank").to_list())
    lowest = min(ref_domain_ranks) if ref_domain_ranks else 0
    for rank, _host, d in dom.iter_rows():
        if d == 0:
            method = "reference" if rank == lowest else "same host"
            estimate: int | None = 0
        elif not align:
            method, estimate = "not aligned", None
        elif not fit.linked[d] or not np.isfinite(fit.se[d]) or rank not in matched_ranks:
            method, estimate = "unmatched", None
        else:
            estimate = round(float(fit.estimate[d]))
            if abs(estimate) > MAX_OFFSET_NS:
                method = "implausible"
            else:
                method = "estimated" if fit.applied[d] != 0 or estimate == 0 else "below noise"
        rows.append((rank, int(fit.applied[d]), estimate, method))
    out = pl.DataFrame(rows, schema={"rank": pl.Int32, "clock_offset_ns": pl.Int64, "clock_estimate_ns": pl.Int64,
                                     "clock_method": pl.String}, orient="row")
    return out.join(res.with_columns(pl.col("rank").cast(pl.Int32)), on="rank", how="left").select(
        ["rank", "clock_offset_ns", "clock_estimate_ns", "clock_residual_ns", "clock_method"])


def _diagnose(agg: pl.DataFrame, c: pl.DataFrame, dom: pl.DataFrame) -> list[Diagnostic]:
    """Warnings a user must see: impossible instances, merged groups, ranks that match nobody."""
    out: list[Diagnostic] = []
    n_seen = agg.get_column("ranks").list.len()
    multi = agg.filter(n_seen >= 2)
    bad = multi.filter(~pl.col("consistent"))
    if bad.height:
        out.append(Diagnostic("", f"{bad.height} of {multi.height} matched collectives are impossible in time "
                                  "(a member finished before another arrived, even after clock alignment): the "
                                  "traces may be sampled, cut, or from different jobs; those are not split into "
                                  "wait and transfer"))
    keyed = agg.filter((pl.col("mode") == 0) & ~pl.col("sizes_agree"))
    if keyed.height:
        ex = keyed.row(0, named=True)
        out.append(Diagnostic("", f"{keyed.height} collectives share a (process group, sequence number) but their "
                                  f"members disagree on the op or the size (first: pg {ex['pg']} seq {ex['seq']}); "
                                  "they are flagged (sizes_agree = false) and not split into wait and transfer"))
    over = agg.filter(n_seen > pl.col("nranks"))
    if over.height:
        out.append(Diagnostic("", f"{over.height} collectives were seen on more ranks than their group has: the "
                                  "traces do not name process groups, and calls of different groups may have "
                                  "been merged"))
    partial = agg.filter(pl.col("partial"))
    if partial.height:
        traced = dom.height
        expected = int(partial.get_column("nranks").max())  # type: ignore[arg-type]
        level = "info" if traced < expected else "warning"
        out.append(Diagnostic("", f"{partial.height} of {count(agg.height, 'collective')} were seen on fewer "
                                  f"ranks than their group has ({count(traced, 'rank')} traced, groups of up to "
                                  f"{expected}); they are kept, flagged partial, and not split into wait and transfer",
                              level=level))
    shared = c.with_columns(pl.len().over("tmp").alias("_n")).group_by("rank").agg(
        ((pl.col("_n") >= 2) & pl.col("i_ok")).any().alias("any"))
    if shared.height >= 2 and shared.get_column("any").any():
        for (r,) in shared.filter(~pl.col("any")).sort("rank").select("rank").iter_rows():
            out.append(Diagnostic("", f"rank {r}: none of its collectives matches a collective of another rank in "
                                      "time; is its trace from another job or another time?"))
    elif shared.height >= 2:
        out.append(Diagnostic("", "no collective matches across ranks in time: are these traces from the same job "
                                  "and the same time?"))
    return out


def comm_split(events: pa.Table, matching: Matching) -> pl.DataFrame:
    """WAIT / TRANSFER / UNSPLIT intervals replacing every communication event, in each rank's own clock
    (``rank, start_ns, end_ns, cls``) — the ``comm_split`` input of :func:`tracekit.analysis.attribution.breakdown`.

    A member of a complete, consistent instance waits from its start until its data could move — the last
    member's arrival; for a receive, the send's start — and transfers from then to its end (its
    ``collective_members.wait_ns``); concurrent communication (two
    gloo threads) is split interval by interval and the sweep unions the pieces. Everything else —
    events of unmatched, partial or inconsistent calls, communication without a collective row — is
    UNSPLIT, which keeps that window's wait/transfer unknown rather than guessed.
    """
    ev = pl.from_arrow(events.select(["rank", "kind", "start_ns", "dur_ns", "collective_id"]))
    assert isinstance(ev, pl.DataFrame)
    ev = ev.filter(pl.col("kind").cast(pl.String) == "comm").select(
        pl.col("rank").cast(pl.Int32), "start_ns", (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"),
        "collective_id")
    mem = pl.from_arrow(matching.members.select(["instance", "rank", "collective_id", "wait_ns"]))
    inst = pl.from_arrow(matching.instances.select(["instance", "ranks", "partial", "consistent", "sizes_agree"]))
    assert isinstance(mem, pl.DataFrame) and isinstance(inst, pl.DataFrame)
    inst = inst.filter((pl.col("ranks").list.len() >= 2) & ~pl.col("partial") & pl.col("consistent")
                       & pl.col("sizes_agree")).select(["instance"])
    j = ev.join(mem, on=["rank", "collective_id"], how="left").join(inst.with_columns(pl.lit(True).alias("_ok")),
                                                                     on="instance", how="left")
    # a member waits from its start for ``wait_ns`` (until the data could move), then transfers
    split_at = pl.when(pl.col("_ok")).then((pl.col("start_ns") + pl.col("wait_ns")).clip(pl.col("start_ns"),
                                                                                          pl.col("end_ns")))
    j = j.with_columns(split_at.alias("p"))
    known = j.filter(pl.col("p").is_not_null())
    unknown = j.filter(pl.col("p").is_null())
    parts = [
        known.select("rank", "start_ns", pl.col("p").alias("end_ns"), pl.lit(WAIT).alias("cls")),
        known.select("rank", pl.col("p").alias("start_ns"), "end_ns", pl.lit(TRANSFER).alias("cls")),
        unknown.select("rank", "start_ns", "end_ns", pl.lit(UNSPLIT).alias("cls")),
    ]
    out = pl.concat([p.with_columns(pl.col("cls").cast(pl.Int64)) for p in parts])
    return out.filter(pl.col("end_ns") > pl.col("start_ns"))


def apply_clocks(ranks: pa.Table, clocks: pl.DataFrame) -> pa.Table:
    """The ``ranks`` table with the clock columns of :func:`match` filled in (offset 0 where unknown)."""
    if ranks.num_rows == 0:
        return ranks
    r = pl.from_arrow(ranks)
    assert isinstance(r, pl.DataFrame)
    r = r.drop(["clock_offset_ns", "clock_estimate_ns", "clock_residual_ns", "clock_method"])
    r = r.join(clocks, on="rank", how="left").with_columns(pl.col("clock_offset_ns").fill_null(0))
    return schema.conform(r.to_arrow(), schema.RANKS)


def transfer_sizes(collectives: pa.Table) -> dict[str, Any]:
    """Where the sizes of the traced communication calls came from: ``calls`` (with times; barriers, which move
    no data, left out), ``known``, ``unknown``, ``by_source`` (counts per ``collectives.size_source``) and, when
    some are unknown, ``note`` — the sentence every view shows instead of figures built on them."""
    c = pl.from_arrow(collectives.select(["op", "start_ns", "bytes", "size_source"]))
    assert isinstance(c, pl.DataFrame)
    c = c.filter(pl.col("start_ns").is_not_null() & (pl.col("op").fill_null("") != "barrier"))
    known = c.filter(pl.col("bytes").is_not_null())
    by_source = {str(k or "unnamed"): int(v) for k, v in
                 known.group_by("size_source").len().sort("len", descending=True).iter_rows()}
    unknown = c.height - known.height
    note = None
    if unknown:
        note = (f"transfer sizes unknown for {unknown} of {c.height} communication calls (profiled without "
                "record_shapes?): bus bytes, bus bandwidth and link utilisation leave them out, and the what-if "
                "needs --link-bw to estimate them from transfer times")
    return {"calls": c.height, "known": known.height, "unknown": unknown, "by_source": by_source, "note": note}


def stragglers(instances: pa.Table) -> pl.DataFrame:
    """Who everyone waited for: per rank, how often it arrived last (``last_arrivals``, its share of the
    instances that could be judged), how long the other members waited for it in all (``waited_ns``, its
    share of all waiting) and its median lateness (``median_skew_ns``). Only complete, consistent
    instances count (those with a ``straggler_rank``). Sorted by ``waited_ns``, largest first."""
    i = pl.from_arrow(instances.select(["straggler_rank", "wait_ns", "skew_ns"]))
    assert isinstance(i, pl.DataFrame)
    i = i.filter(pl.col("straggler_rank").is_not_null())
    if i.height == 0:
        return pl.DataFrame(schema={"rank": pl.Int32, "last_arrivals": pl.UInt32, "last_arrival_share": pl.Float64,
                                    "waited_ns": pl.Int64, "wait_share": pl.Float64, "median_skew_ns": pl.Int64})
    total_wait = int(i.get_column("wait_ns").sum())
    n = i.height
    return (i.group_by("straggler_rank").agg(pl.len().alias("last_arrivals"),
                                             pl.col("wait_ns").sum().alias("waited_ns"),
                                             pl.col("skew_ns").median().round().cast(pl.Int64).alias("median_skew_ns"))
            .rename({"straggler_rank": "rank"})
            .with_columns((pl.col("last_arrivals") / n).alias("last_arrival_share"),
                          (pl.col("waited_ns") / total_wait if total_wait else pl.lit(None, dtype=pl.Float64))
                          .alias("wait_share"))
            .select(["rank", "last_arrivals", "last_arrival_share", "waited_ns", "wait_share", "median_skew_ns"])
            .sort(["waited_ns", "rank"], descending=[True, False]))
