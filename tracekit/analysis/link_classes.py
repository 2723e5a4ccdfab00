"""How busy each link class was: the per-rank union of the transfer time of the collectives whose traffic went
over that class (``inter``-node over NET/IB, ``intra``-node over P2P, ...), over the iteration time of those
ranks — the same figure as a window's ``link_active_ns / wall_ns`` (:mod:`tracekit.analysis.links`), split by
class, so that a verdict can say which class binds ("inter-node NET/IB is 81 % busy; intra-node P2P 9 %").

A call's class and transport are its process group's (:func:`tracekit.analysis.nccl.topology.group_links`, from
the job's NCCL logs), else its matched instance's hosts (every member on one named host: intra, else inter;
transport unknown). Its transfer time is ``[end - transfer_ns, end]`` where it was matched across ranks (the
waiting for the last member left out), the whole call otherwise, clipped to the rank's iteration windows.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import polars as pl
import pyarrow as pa

from tracekit.analysis.intervals import union_length
from tracekit.analysis.links import bus_bytes_expr
from tracekit.model import schema

#: words of the classes in sentences
CLASS_WORDS = {"inter": "inter-node", "intra": "intra-node"}


def instance_classes(members: pa.Table | None, ranks: pa.Table | None) -> pl.DataFrame:
    """``instance, link_class``: intra when every member of a matched instance is on one named host, inter when
    they span hosts (instances with a member of unknown host left out)."""
    if members is None or members.num_rows == 0 or ranks is None or ranks.num_rows == 0:
        return pl.DataFrame(schema={"instance": pl.Int64, "link_class": pl.String})
    hosts = pl.from_arrow(ranks.select(["rank", "host"]))
    m = pl.from_arrow(members.select(["instance", "rank"]))
    assert isinstance(hosts, pl.DataFrame) and isinstance(m, pl.DataFrame)
    per = m.join(hosts.with_columns(pl.col("rank").cast(pl.Int32)), on="rank", how="left").group_by("instance").agg(
        pl.col("host").null_count().alias("_nul"), pl.col("host").n_unique().alias("_nh"))
    return per.filter(pl.col("_nul") == 0).select(
        "instance", pl.when(pl.col("_nh") == 1).then(pl.lit("intra")).otherwise(pl.lit("inter")).alias("link_class"))


def busy(collectives: pa.Table, members: pa.Table | None, breakdown: pa.Table, group_links: pa.Table | None,
         ranks: pa.Table | None = None) -> pa.Table:
    """LINK_BUSY: one row per (link class, transport) with calls in the iteration windows, busiest first (module
    docstring); empty when no call's class is known."""
    b = pl.from_arrow(breakdown.select(["rank", "start_ns", "end_ns", "wall_ns"]))
    c = pl.from_arrow(collectives.select(["rank", "collective_id", "pg", "op", "bytes", "nranks", "start_ns",
                                          "end_ns"]))
    assert isinstance(b, pl.DataFrame) and isinstance(c, pl.DataFrame)
    c = c.filter(pl.col("start_ns").is_not_null() & pl.col("end_ns").is_not_null())
    if b.height == 0 or c.height == 0:
        return schema.empty(schema.LINK_BUSY)
    c = c.with_columns(pl.coalesce(pl.col("pg"), pl.lit("default")).alias("pg"))
    if group_links is not None and group_links.num_rows:
        g = pl.from_arrow(group_links.select(["pg", "link_class", "transport"]))
        assert isinstance(g, pl.DataFrame)
        c = c.join(g, on="pg", how="left")
    else:
        c = c.with_columns(pl.lit(None, pl.String).alias("link_class"), pl.lit(None, pl.String).alias("transport"))
    if members is not None and members.num_rows:
        m = pl.from_arrow(members.select(["instance", "rank", "collective_id", "transfer_ns"]))
        assert isinstance(m, pl.DataFrame)
        by_inst = instance_classes(members, ranks).rename({"link_class": "_host_class"})
        m = m.join(by_inst, on="instance", how="left").drop("instance")
        c = c.join(m.with_columns(pl.col("rank").cast(pl.Int32)), on=["rank", "collective_id"], how="left")
    else:
        c = c.with_columns(pl.lit(None, pl.Int64).alias("transfer_ns"), pl.lit(None, pl.String).alias("_host_class"))
    c = c.with_columns(pl.coalesce("link_class", "_host_class").alias("link_class")).filter(
        pl.col("link_class").is_not_null())
    if c.height == 0:
        return schema.empty(schema.LINK_BUSY)
    c = c.with_columns(
        pl.when(pl.col("transfer_ns").is_not_null()).then(pl.col("end_ns") - pl.col("transfer_ns"))
        .otherwise(pl.col("start_ns")).alias("_s"),
        bus_bytes_expr().alias("_bus"))
    # each rank's windows span [first start, last end]; each (rank, class) is one group of the union
    span = b.group_by("rank").agg(pl.col("start_ns").min().alias("_w0"), pl.col("end_ns").max().alias("_w1"),
                                  pl.col("wall_ns").sum().alias("_wall"))
    c = c.join(span.with_columns(pl.col("rank").cast(pl.Int32)), on="rank", how="inner")
    c = c.with_columns(pl.struct(["link_class", pl.col("transport").fill_null(""), "rank"]).rank("dense")
                       .cast(pl.Int64).alias("_grp"))
    grp = c.select("_grp", "rank", "link_class", "transport", "_w0", "_w1", "_wall").unique("_grp").sort("_grp")
    key = c.get_column("_grp").to_numpy()
    order = np.argsort(key, kind="stable")
    lengths = union_length(key[order], c.get_column("_s").to_numpy()[order], c.get_column("end_ns").to_numpy()[order],
                           grp.get_column("_grp").to_numpy(), grp.get_column("_w0").to_numpy(),
                           grp.get_column("_w1").to_numpy())
    grp = grp.with_columns(pl.Series("_busy", np.asarray(lengths, dtype=np.int64)))
    calls = c.group_by("_grp").agg(pl.len().alias("_n"), pl.col("_bus").sum().alias("_b"),
                                   pl.col("_bus").null_count().alias("_unk"))
    grp = grp.join(calls, on="_grp", how="left")
    out = grp.group_by(["link_class", "transport"]).agg(
        pl.col("rank").n_unique().cast(pl.Int32).alias("ranks"), pl.col("_n").sum().alias("calls"),
        pl.when(pl.col("_unk").sum() == 0).then(pl.col("_b").sum()).alias("bus_bytes"),
        pl.col("_busy").sum().alias("busy_ns"), pl.col("_wall").sum().alias("wall_ns"))
    out = out.with_columns(pl.when(pl.col("wall_ns") > 0).then(pl.col("busy_ns") / pl.col("wall_ns"))
                           .alias("busy_share")).sort(["busy_share", "link_class"], descending=[True, False],
                                                      nulls_last=True)
    return schema.conform(out.to_arrow(), schema.LINK_BUSY)


def sentence(rows: list[dict]) -> str | None:
    """"Inter-node NET/IB is 81 % busy; intra-node P2P 9 %" from :func:`busy` rows (as dicts), busiest first;
    None when it would say nothing the links' figure does not (one class with no transport known)."""
    rows = [r for r in rows if r.get("busy_share") is not None]
    if not rows or (len(rows) == 1 and not rows[0].get("transport")):
        return None

    def name(r: dict) -> str:
        return CLASS_WORDS.get(r["link_class"], r["link_class"]) + (f" {r['transport']}" if r.get("transport") else "")

    def pct(x: float) -> str:
        return f"{100 * x:.0f} %" if x >= 0.01 or x == 0 else f"{100 * x:.1f} %"

    first, *rest = rows
    text = f"{name(first)} is {pct(first['busy_share'])} busy"
    if rest:
        text += "; " + "; ".join(f"{name(r)} {pct(r['busy_share'])}" for r in rest)
    return text[0].upper() + text[1:]


#: selectors that name a transport (from the job's NCCL logs), and the transport families each matches; a whole
#: family name (``net/ib``, ``net/socket``) selects itself. NCCL's P2P runs over NVLink where the GPUs have it,
#: else over PCIe, and its lines do not say which: ``nvlink`` selects P2P and NVLS links alike.
TRANSPORT_SELECTORS = {"net": ("NET/",), "ib": ("NET/IB",), "socket": ("NET/Socket",), "p2p": ("P2P",),
                       "nvlink": ("P2P", "NVLS"), "shm": ("SHM",), "nvls": ("NVLS",), "collnet": ("COLLNET",)}


def selects(selector: str, pg: str | None, desc: str | None, link_class: str | None,
            transport: str | None = None) -> bool:
    """Whether ``selector`` names this link: its process group's name or description (``dp`` also matches
    DeviceMesh's ``mesh_dp``), its class (``intra``/``inter``), or its transport (:data:`TRANSPORT_SELECTORS`,
    or a family such as ``net/ib``)."""
    s = selector.strip().lower()
    if link_class is not None and s == link_class:
        return True
    if transport is not None and (s == transport.lower() or any(
            transport.lower().startswith(p.lower()) for p in TRANSPORT_SELECTORS.get(s, ()))):
        return True
    if pg is not None and s == pg.lower():
        return True
    d = (desc or "").lower()
    return bool(d) and (s == d or d.endswith("_" + s))


def selected(rows: pl.DataFrame, selector: str, descs: Mapping[str, str]) -> np.ndarray:
    """Which of ``rows`` (a call each: ``link`` its process group, ``link_class``, ``transport``) ``selector`` names
    (:func:`selects`, ``descs`` the groups' descriptions), asked once per distinct link, not once per call."""
    keys = rows.select(["link", "link_class", "transport"])
    links = keys.unique(maintain_order=True)
    hit = pl.Series("_hit", [selects(selector, pg, descs.get(pg), cls, tr) for pg, cls, tr in links.iter_rows()],
                    dtype=pl.Boolean)
    got = keys.join(links.with_columns(hit), on=["link", "link_class", "transport"], how="left",
                    maintain_order="left", nulls_equal=True)
    return got.get_column("_hit").to_numpy().astype(bool)


def call_link_class(comm: pl.DataFrame, members: pa.Table | None, ranks: pa.Table | None) -> pl.Expr:
    """``intra`` when every member of the call's instance is on one named host, ``inter`` when they span
    hosts, null when unknown (unmatched, or hosts not named)."""
    if members is None or members.num_rows == 0 or ranks is None or ranks.num_rows == 0:
        return pl.lit(None, dtype=pl.String).alias("link_class")
    hosts = pl.from_arrow(ranks.select(["rank", "host"]))
    m = pl.from_arrow(members.select(["instance", "rank"]))
    assert isinstance(hosts, pl.DataFrame) and isinstance(m, pl.DataFrame)
    per = m.join(hosts, on="rank", how="left").group_by("instance").agg(
        pl.col("host").null_count().alias("_nul"), pl.col("host").n_unique().alias("_nh"))
    cls = dict(per.select(["instance", pl.when(pl.col("_nul") > 0).then(None).when(pl.col("_nh") == 1)
                           .then(pl.lit("intra")).otherwise(pl.lit("inter"))]).iter_rows())
    return pl.col("instance").replace_strict(cls, default=None, return_dtype=pl.String).alias("link_class")


def with_group_links(comm: pl.DataFrame, group_links: pa.Table | None) -> pl.DataFrame:
    """``link_class`` from the NCCL logs where they say it (else the hosts' as before) and ``transport`` (null
    where unknown), by the call's process group (GROUP_LINKS)."""
    if group_links is None or group_links.num_rows == 0:
        return comm.with_columns(pl.lit(None, dtype=pl.String).alias("transport"))
    g = pl.from_arrow(group_links.select(["pg", "link_class", "transport"]))
    assert isinstance(g, pl.DataFrame)
    g = g.rename({"pg": "link", "link_class": "_cls"})
    return comm.join(g, on="link", how="left").with_columns(
        pl.coalesce("_cls", "link_class").alias("link_class")).drop("_cls")
