"""The job's topology as its NCCL debug logs tell it: which communicator member sits on which host, whether each
peer connection stays inside a host or crosses hosts and over what, each communicator's link class and the
transport that binds it, each process group of the traces joined to its communicator, and the short overview
``tracekit summary`` prints ("2 nodes × 8 GPUs; intra-node P2P/IPC, inter-node NET/Socket").

Link classes: ``intra`` (inside one host: NVLink or PCIe through P2P, SHM, NVLS) and ``inter`` (across hosts:
NCCL's network, ``NET/IB`` for InfiniBand and RoCE, ``NET/Socket`` for TCP, a plugin's ``NET/<name>``, and
CollNet/SHARP). A connection's class comes from the hosts of its two ends where the logs name both, else from
its transport. A communicator is ``inter`` when it spans nodes (its nNodes line, its members' hosts, a
connection that crosses hosts); ``intra`` when the log shows all of it on one node; unknown otherwise — never
guessed from the part of it one excerpt shows. Its binding transport is the network for ``inter`` (the NIC is
the slowest hop of a ring that crosses hosts), its intra-node transport for ``intra``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import polars as pl
import pyarrow as pa

from tracekit.model import schema
from tracekit.model.units import count

#: transport families that stay inside a host, and those that cross hosts
INTRA_FAMILIES = ("P2P", "SHM", "NVLS")
INTER_PREFIXES = ("NET/", "COLLNET")

_COMM_SCHEMA = {name: pl.String for name in ("comm_id", "host", "network", "nccl_version")}


def family(detail: str | None) -> str | None:
    """The transport family of a ``via`` text: ``P2P``, ``SHM``, ``NET/IB``, ``NET/Socket``, ``COLLNET``, ..."""
    if not detail:
        return None
    if detail.startswith("direct shared memory"):  # SHM up to 2.13
        return "SHM"
    parts = detail.split("/")
    head = parts[0].strip().upper()
    if head == "NET" and len(parts) > 1:
        return "NET/" + parts[1].strip().split("(")[0]
    return head


def transport_name(detail: str | None) -> str | None:
    """A transport as the overview names it: ``P2P/IPC``, ``P2P/CUMEM``, ``SHM``, ``NET/IB``, ``COLLNET/SHARP``."""
    fam = family(detail)
    if fam is None or detail is None:
        return None
    parts = [p.strip() for p in detail.split("/")]
    if fam in ("P2P", "COLLNET") and len(parts) > 1 and parts[1] and not parts[1][:1].isdigit():
        return f"{fam}/{parts[1].split(' ')[0]}" if fam == "P2P" else f"{fam}/{parts[1]}"
    return fam


def class_of_family(fam: str | None) -> str | None:
    """``intra`` or ``inter`` as the transport says (null for a transport of no known class)."""
    if fam is None:
        return None
    if fam in INTRA_FAMILIES:
        return "intra"
    if fam.startswith(INTER_PREFIXES):
        return "inter"
    return None


def communicators(tables: Iterable[pa.Table]) -> pa.Table:
    """The ``communicators`` tables of every log, one row per member process of each communicator (a process seen
    in two logs once)."""
    parts = [schema.conform(t, schema.COMMUNICATORS) for t in tables if t is not None and t.num_rows]
    if not parts:
        return schema.empty(schema.COMMUNICATORS)
    df = pl.from_arrow(pa.concat_tables(parts))
    assert isinstance(df, pl.DataFrame)
    df = df.unique(subset=["comm_id", "rank", "host", "pid", "init_line"], keep="first", maintain_order=True)
    return schema.conform(df.to_arrow(), schema.COMMUNICATORS)


def _members(comms: pa.Table) -> pl.DataFrame:
    """One row per (comm_id, rank): its host (null where unknown), global rank, nnodes, network."""
    c = pl.from_arrow(comms.select(["comm_id", "rank", "nranks", "nnodes", "local_ranks", "host", "global_rank",
                                    "network"]))
    assert isinstance(c, pl.DataFrame)
    return (c.filter(pl.col("comm_id").is_not_null() & pl.col("rank").is_not_null())
            .with_columns(pl.when(pl.col("host") == "").then(None).otherwise(pl.col("host")).alias("host"))
            .group_by(["comm_id", "rank"], maintain_order=True).agg(
                pl.col("nranks").max(), pl.col("nnodes").max(), pl.col("local_ranks").max(),
                pl.col("host").drop_nulls().first(), pl.col("global_rank").drop_nulls().first(),
                pl.col("network").drop_nulls().first()))


def connections(topology: pa.Table, comms: pa.Table) -> pl.DataFrame:
    """The ``topology`` rows with ``family``, ``name`` (:func:`transport_name`), ``peer_host`` (from the peer's
    member row) and ``link_class``: by the two ends' hosts where both are known, else by the transport."""
    t = pl.from_arrow(topology)
    assert isinstance(t, pl.DataFrame)
    if t.height == 0:
        return t.with_columns(*(pl.lit(None, pl.String).alias(c) for c in ("family", "name", "peer_host",
                                                                            "link_class")))
    details = t.get_column("detail").unique().drop_nulls().to_list()
    fam = {d: family(d) for d in details}
    name = {d: transport_name(d) for d in details}
    cls = {d: class_of_family(fam[d]) for d in details}
    t = t.with_columns(
        pl.col("detail").replace_strict(fam, default=None, return_dtype=pl.String).alias("family"),
        pl.col("detail").replace_strict(name, default=None, return_dtype=pl.String).alias("name"),
        pl.col("detail").replace_strict(cls, default=None, return_dtype=pl.String).alias("_by_transport"),
        pl.when(pl.col("host") == "").then(None).otherwise(pl.col("host")).alias("host"),
    )
    m = _members(comms).select("comm_id", pl.col("rank").alias("peer"), pl.col("host").alias("peer_host"))
    t = t.join(m, on=["comm_id", "peer"], how="left", maintain_order="left")
    by_hosts = pl.when(pl.col("host").is_not_null() & pl.col("peer_host").is_not_null()).then(
        pl.when(pl.col("host") == pl.col("peer_host")).then(pl.lit("intra")).otherwise(pl.lit("inter")))
    return t.with_columns(pl.coalesce(by_hosts, pl.col("_by_transport")).alias("link_class")).drop("_by_transport")


def _most(values: Iterable[str | None]) -> str | None:
    """The most frequent value (ties by name), None for none."""
    counts = Counter(v for v in values if v)
    if not counts:
        return None
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]


def comm_links(conns: pl.DataFrame, comms: pa.Table) -> pl.DataFrame:
    """Per communicator: ``comm_id nranks members nnodes hosts link_class transport transports`` (module
    docstring). ``members``: how many of its ranks the logs show; ``hosts``: their distinct named hosts."""
    members = _members(comms)
    out_schema = {"comm_id": pl.String, "nranks": pl.Int32, "members": pl.Int32, "nnodes": pl.Int32,
                  "hosts": pl.Int32, "link_class": pl.String, "transport": pl.String, "transports": pl.String}
    if members.height == 0:
        return pl.DataFrame(schema=out_schema)
    by_comm: dict[str, list[tuple[str | None, str | None]]] = {}
    if conns.height:
        for cid, fam, cls in conns.filter(pl.col("comm_id").is_not_null()).select(
                "comm_id", "family", "link_class").iter_rows():
            by_comm.setdefault(cid, []).append((fam, cls))
    rows = []
    for cid, g in members.group_by("comm_id", maintain_order=True):
        comm_id = cid[0]
        nranks = g.get_column("nranks").max()
        nnodes = g.get_column("nnodes").max()
        hosts = g.get_column("host").drop_nulls()
        n_hosts = hosts.n_unique()
        all_named = hosts.len() == g.height
        seen = by_comm.get(comm_id, [])
        inter_fams = [f for f, c in seen if c == "inter"]
        intra_fams = [f for f, c in seen if c == "intra"]
        complete = nranks is not None and g.height >= nranks  # type: ignore[operator]
        if (nnodes is not None and nnodes > 1) or inter_fams or n_hosts > 1:  # type: ignore[operator]
            cls = "inter"
            transport = _most(f for f in inter_fams if f and f.startswith("NET/")) or _most(inter_fams)
            if transport is None:
                net = g.get_column("network").drop_nulls()
                transport = f"NET/{_most(net.to_list())}" if net.len() else None
        elif nnodes == 1 or (complete and all_named and n_hosts == 1):
            cls, transport = "intra", _most(intra_fams)
        else:
            cls, transport = None, _most(intra_fams)
        if nnodes is None and complete and all_named:
            nnodes = n_hosts
        rows.append({"comm_id": comm_id, "nranks": nranks, "members": g.height, "nnodes": nnodes,
                     "hosts": n_hosts, "link_class": cls, "transport": transport,
                     "transports": ", ".join(sorted({f for f, _ in seen if f})) or None})
    return pl.DataFrame(rows, schema=out_schema)


def group_links(collectives: pa.Table, links: pl.DataFrame, comms: pa.Table, groups: dict[str, list[int]],
                ranks: pa.Table | None = None) -> pa.Table:
    """GROUP_LINKS: each process group of the collectives (``default`` for calls that name none) with the link
    class and transport of its NCCL communicator: the communicator itself where the calls carry its commId
    (joined from the log's COLL lines), else the one of the same size whose members are the group's
    (``groups``: pg_config's ranks; without them, the traced ranks calling it must be among the members). Several
    fitting communicators that all say the same give that without naming one (``nccl-log by size``). A group
    the logs say nothing of gets its class from the traces' host names where every member's is known
    (``hosts``: no transport)."""
    c = pl.from_arrow(collectives.select(["rank", "pg", "nranks"]))
    assert isinstance(c, pl.DataFrame)
    if c.height == 0:
        return schema.empty(schema.GROUP_LINKS)
    pgs = c.with_columns(pl.coalesce(pl.col("pg"), pl.lit("default")).alias("pg")).group_by("pg").agg(
        pl.col("nranks").max(), pl.col("rank").drop_nulls().unique().sort().alias("ranks")).sort("pg")
    info = {r["comm_id"]: r for r in links.iter_rows(named=True)} if links.height else {}
    mem = _members(comms)
    member_sets: dict[str, set[int]] = {}
    for cid, g in mem.group_by("comm_id"):
        member_sets[cid[0]] = set(g.get_column("global_rank").drop_nulls().to_list())
    hosts = {}
    if ranks is not None and ranks.num_rows:
        hosts = {r: h for r, h in zip(ranks.column("rank").to_pylist(), ranks.column("host").to_pylist(),
                                      strict=True) if h}
    rows = []
    for pg, nranks, traced in pgs.iter_rows():
        members = groups.get(pg)
        size = len(members) if members else nranks
        row = {"pg": pg, "comm_id": None, "link_class": None, "transport": None, "transports": None, "nnodes": None,
               "source": None}
        if pg in info:
            cand = [info[pg]]
        else:
            cand = []
            for cid, r in info.items():
                if size is None or r["nranks"] != size:
                    continue
                known = member_sets.get(cid, set())
                full = r["members"] is not None and r["nranks"] is not None and r["members"] >= r["nranks"]
                if members is not None and not known <= set(members):
                    continue
                if members is None and full and not set(traced) <= known:
                    continue
                cand.append(r)
        said = {(r["link_class"], r["transport"]) for r in cand if r["link_class"] is not None}
        if len(cand) == 1 and cand[0]["link_class"] is not None:
            r = cand[0]
            row.update(comm_id=r["comm_id"], link_class=r["link_class"], transport=r["transport"],
                       transports=r["transports"], nnodes=r["nnodes"], source="nccl-log")
        elif len(said) == 1 and all(r["link_class"] is not None for r in cand):
            (cls, transport), = said
            row.update(link_class=cls, transport=transport, source="nccl-log by size",
                       transports=", ".join(sorted({t for r in cand for t in (r["transports"] or "").split(", ")
                                                    if t})) or None)
        else:
            who = members or traced
            named = [hosts.get(r) for r in who]
            if who and members is not None and all(named):
                row.update(link_class="intra" if len(set(named)) == 1 else "inter", source="hosts",
                           nnodes=len(set(named)))
        if row["link_class"] is not None:
            rows.append(row)
    if not rows:
        return schema.empty(schema.GROUP_LINKS)
    return schema.table(schema.GROUP_LINKS, {k: [r[k] for r in rows] for k in schema.GROUP_LINKS.names})


# ---------------------------------------------------------------------------------------------------
# the overview


def _gpus_per_node(world: pl.DataFrame) -> tuple[int | None, int | None, str | None]:
    """(nodes, GPUs per node, how it is known) of the world communicator's members."""
    nranks = world.get_column("nranks").max()
    nnodes = world.get_column("nnodes").max()
    local = world.get_column("local_ranks").drop_nulls().unique()
    hosts = world.get_column("host").drop_nulls()
    complete = nranks is not None and world.height >= nranks  # type: ignore[operator]
    if nnodes is not None:
        per = int(local[0]) if local.len() == 1 else (int(nranks) // int(nnodes) if nranks and int(nranks) %
                                                      int(nnodes) == 0 else None)  # type: ignore[arg-type]
        return int(nnodes), per, "nNodes line"  # type: ignore[arg-type]
    if complete and hosts.len() == world.height:
        counts = hosts.value_counts().get_column("count").unique()
        return hosts.n_unique(), int(counts[0]) if counts.len() == 1 else None, "host names"
    return None, None, None


def overview(comms: pa.Table, conns: pl.DataFrame, links: pl.DataFrame, networks: pa.Table | None = None,
             processes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The topology section of ``summary``: nodes × GPUs of the largest communicator, the intra- and inter-node
    transports, NCCL versions, networks and devices, GPU Direct RDMA, and ``text``, its one line. Empty when the
    logs show no communicator and no connection."""
    c = pl.from_arrow(comms)
    assert isinstance(c, pl.DataFrame)
    procs = processes or []
    if c.height == 0 and conns.height == 0 and not procs:
        return {}
    out: dict[str, Any] = {"communicators": links.height, "world_size": None, "nodes": None, "gpus_per_node": None,
                           "nodes_from": None}
    members = _members(comms)
    if members.height:
        top = members.get_column("nranks").max()
        world_id = members.filter(pl.col("nranks") == top).get_column("comm_id")[0]
        world = members.filter(pl.col("comm_id") == world_id)
        nodes, per, how = _gpus_per_node(world)
        out.update(world_size=int(top) if top is not None else None, nodes=nodes,  # type: ignore[arg-type]
                   gpus_per_node=per, nodes_from=how)
    hosts = sorted({h for h in c.get_column("host").drop_nulls().to_list() if h}) if c.height else []
    out["hosts"] = hosts
    names = conns.filter(pl.col("name").is_not_null()) if conns.height else conns
    for cls in ("intra", "inter"):
        sub = names.filter(pl.col("link_class") == cls) if names.height else names
        counted = Counter(sub.get_column("name").to_list()) if sub.height else Counter()
        out[cls] = [n for n, _ in sorted(counted.items(), key=lambda kv: (-kv[1], kv[0]))]
    net_rows = pl.from_arrow(networks) if networks is not None and networks.num_rows else None
    versions = sorted({v for v in c.get_column("nccl_version").drop_nulls().to_list()}) if c.height else []
    versions = sorted(set(versions) | {p["version"] for p in procs if p.get("version")})
    out["nccl_versions"] = versions
    out["networks"] = sorted({n for p in procs for n in p.get("network") or []})
    out["plugins"] = sorted({p["plugin"] for p in procs if p.get("plugin")})
    devices = []
    if isinstance(net_rows, pl.DataFrame):
        for _net, dev, port, link in net_rows.select("net", "device", "port", "link").unique(
                maintain_order=True).iter_rows():
            if dev:
                devices.append(f"{dev}:{port}/{link}" if port is not None and link else dev)
    out["devices"] = sorted(set(devices))
    ib = conns.filter(pl.col("family").str.starts_with("NET/IB")) if conns.height else conns  # IB and its plugins
    out["gdr"] = None
    if ib.height:
        gdr = ib.get_column("detail").str.contains("GDRDMA")
        out["gdr"] = bool(gdr.all()) if gdr.all() or not gdr.any() else None
        out["gdr_connections"] = {"with": int(gdr.sum()), "without": int((~gdr).sum())}
    elif isinstance(net_rows, pl.DataFrame) and net_rows.get_column("gdr").drop_nulls().len():
        g = net_rows.get_column("gdr").drop_nulls()
        out["gdr"] = bool(g.all()) if g.all() or not g.any() else None
    out["per_communicator"] = links.to_dicts()
    out["text"] = _text(out, procs)
    return out


def _text(o: dict[str, Any], procs: list[dict[str, Any]]) -> str:
    """The overview's line: "2 nodes × 8 GPUs; intra-node P2P/IPC, inter-node NET/Socket — no InfiniBand found:
    check NCCL_IB_*"."""
    parts = []
    if o.get("nodes") and o.get("gpus_per_node"):
        gpus = o["gpus_per_node"]
        parts.append(f"{count(o['nodes'], 'node')} × {count(gpus, 'GPU')}")
    elif o.get("nodes"):
        parts.append(f"{count(o['nodes'], 'node')}, {count(o['world_size'] or 0, 'rank')}")
    elif o.get("world_size"):
        parts.append(f"{count(o['world_size'], 'rank')} (nodes not known: the log names no host of some ranks and "
                     "has no nNodes line)")
    links = []
    if o.get("intra"):
        links.append("intra-node " + ", ".join(o["intra"]))
    if o.get("inter"):
        s = "inter-node " + ", ".join(o["inter"])
        if any(n.startswith("NET/IB") for n in o["inter"]) and o.get("gdr") is not None:
            s += " (GPU Direct RDMA)" if o["gdr"] else " (no GPU Direct RDMA)"
        links.append(s)
    if not links and o.get("world_size") == 1:
        links.append("one rank: no peer, so no transport")
    elif not links:
        links.append("no transport lines (they are INIT lines of NCCL_DEBUG=INFO; an excerpt may have cut them)")
    text = "; ".join([", ".join(parts)] if parts else []) + ("; " if parts else "") + ", ".join(links)
    inter = o.get("inter") or []
    if inter and all(n == "NET/Socket" for n in inter):
        env = {k: v["value"] for p in procs for k, v in (p.get("env") or {}).items()}
        if env.get("NCCL_IB_DISABLE", "0").strip() not in ("", "0"):
            text += f" — InfiniBand switched off (NCCL_IB_DISABLE={env['NCCL_IB_DISABLE']})"
        elif any(i["kind"] == "ib-missing" for p in procs for i in p.get("net_issues") or []):
            text += " — NCCL found no InfiniBand/RoCE device (NET/IB : No device found, or no libibverbs): check " \
                    "the drivers and NCCL_IB_HCA"
        else:
            text += " — no InfiniBand found: check NCCL_IB_*"
    return text


def connection_summary(conns: pl.DataFrame) -> pl.DataFrame:
    """The peer connections once per (communicator, rank, peer, transport): ``comm_id rank peer host peer_host
    link_class name detail channels`` (how many channels use it), by communicator and rank."""
    cols = ["comm_id", "rank", "peer", "host", "peer_host", "link_class", "name", "detail"]
    if conns.height == 0:
        return pl.DataFrame(schema={**{c: pl.String for c in cols}, "rank": pl.Int32, "peer": pl.Int32,
                                    "channels": pl.UInt32})
    return conns.group_by(cols, maintain_order=True).agg(pl.col("channel").n_unique().alias("channels")).sort(
        ["comm_id", "rank", "peer"], nulls_last=True, maintain_order=True)
