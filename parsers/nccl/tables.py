"""The output tables of the NCCL log parser, from the parse state once communicators are resolved: the raw
COLL rows (:func:`_prepare_raw`) resolved into ``collectives`` and ``nccl_calls`` (:func:`_collectives`),
``topology`` and ``nccl_connections``, ``nccl_graph``, ``nccl_comms``, the check that the members of a call
agree, and ``meta`` (:mod:`tracekit.parsers.nccl` documents every column).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from tracekit.model.diagnostics import Diagnostic
from tracekit.model.schema import COMMUNICATORS, NCCL_GRAPH, NCCL_NETWORK, TOPOLOGY, table

from .columnar import _DICT, _RAW_COLL
from .comms import _candidates, _graph_rank, _only_comm
from .grammar import DTYPES, FULL_BUFFER_OPS, REST, ROOTED_OPS, TIMESTAMP, _norm_op
from .lines import _Comm, _Parser, _version_tuple
from .network import network_table


def _plain(t: pa.Table) -> pa.Table:
    """A stable Arrow contract for the extra tables: ``string`` (not large/view) columns, and
    repetitive strings (hosts, comm pointers, prefixes) as ``dictionary<int32, string>``."""
    cols = []
    for f in t.schema:
        col = t.column(f.name)
        if pa.types.is_dictionary(f.type):
            col = col.cast(_DICT)
        elif pa.types.is_large_string(f.type) or pa.types.is_string_view(f.type):
            col = col.cast(pa.string())
        cols.append(col)
    return pa.Table.from_arrays(cols, names=t.column_names)


_WARN_SCHEMA = pa.schema([("line", pa.int64()), ("host", pa.string()), ("pid", pa.int64()),
                          ("tid", pa.int64()), ("device", pa.int32()), ("level", pa.string()),
                          ("loc", pa.string()), ("func", pa.string()), ("message", pa.string()),
                          ("log_time", pa.string())])
_WATCHDOG_SCHEMA = pa.schema([("line", pa.int64()), ("rank", pa.int32()), ("seq_num", pa.int64()),
                              ("op_type", pa.string()), ("numel_in", pa.int64()),
                              ("numel_out", pa.int64()), ("timeout_ms", pa.int64()), ("text", pa.string()),
                              ("kind", pa.string()), ("pg", pa.string()), ("last_enqueued", pa.int64()),
                              ("last_completed", pa.int64()), ("ran_ms", pa.int64()), ("dump_from", pa.int32()),
                              ("log_time", pa.string())])


def _rows_table(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    if not rows:
        return schema.empty_table()
    try:
        return pa.Table.from_pylist(rows, schema=schema)
    except (pa.ArrowInvalid, OverflowError):
        return pa.Table.from_pylist(_fit(rows, schema), schema=schema)


def _fit(rows: list[dict[str, Any]], schema: pa.Schema) -> list[dict[str, Any]]:
    """``rows`` with every integer outside its column's type made null: a damaged number ('nranks
    22222000000000000', a 70-digit src rank) is unknown, not the end of the parse."""
    bounds = {f.name: (-(1 << (f.type.bit_width - 1)), 1 << (f.type.bit_width - 1))
              for f in schema if pa.types.is_signed_integer(f.type)}
    return [{k: (None if k in bounds and isinstance(v, int) and not bounds[k][0] <= v < bounds[k][1] else v)
             for k, v in r.items()} for r in rows]


def _raw_coll(st: _Parser) -> pl.DataFrame:
    """All COLL rows, in line order."""
    parts = [pl.from_arrow(t) for t in st.coll_tables]
    st.coll_tables = []
    if st.slow_coll:
        parts.append(pl.from_arrow(pa.Table.from_pylist(st.slow_coll, schema=_RAW_COLL)))
    if not parts:
        return pl.from_arrow(_RAW_COLL.empty_table())
    df = pl.concat(parts, how="vertical_relaxed", rechunk=True)
    if st.slow_coll:  # the columnar rows are in line order already
        df = df.sort(["line", "sub"])
    return df


def _prepare_raw(st: _Parser, comms: list[_Comm]) -> pl.DataFrame:
    """All COLL rows in line order, orphans resolved, the RCCL/Ray tail and the prefix split; registers
    every process seen (devices, launcher prefixes, RCCL globalrank) on the parser state."""
    raw = _raw_coll(st)
    if raw.height == 0:
        return raw.with_columns(pl.lit(None, pl.Int64).alias("task"), pl.lit(None, pl.Int32).alias(
            "rccl_globalrank"), pl.lit(None, pl.Int64).alias("repeated"), pl.lit(None, pl.String).alias(
            "log_time"))
    if raw["orphan"].any():
        raw = _resolve_orphans(raw, comms)
    # rest: RCCL task/globalrank, Ray repeats
    if raw["rest"].is_not_null().any():
        ext = raw.select(pl.col("rest").str.extract_groups(REST.pattern).alias("r")).unnest("r")
        raw = raw.with_columns(ext["task"].cast(pl.Int64, strict=False).alias("task"),  # too big: null
                               ext["grank"].cast(pl.Int32, strict=False).alias("rccl_globalrank"),
                               ext["rep"].cast(pl.Int64, strict=False).alias("repeated"))
    else:
        raw = raw.with_columns(pl.lit(None, pl.Int64).alias("task"),
                               pl.lit(None, pl.Int32).alias("rccl_globalrank"),
                               pl.lit(None, pl.Int64).alias("repeated"))
    gr = raw.filter(pl.col("rccl_globalrank").is_not_null() & pl.col("host").is_not_null())
    for host, pid, g in gr.group_by(["host", "pid"]).agg(pl.col("rccl_globalrank").first()).iter_rows():
        st.proc(host, pid).rccl_globalrank = g
    st.counts["ray_repeats"] += int(raw["repeated"].fill_null(0).sum())
    # prefix: launcher part and 2.26+ timestamp, worked out once per distinct prefix
    if raw["prefix"].is_not_null().any():
        uniq = raw.select(pl.col("prefix").unique().cast(pl.String))["prefix"].drop_nulls().to_list()
        launcher, stamp = {}, {}
        for text in uniq:
            m = TIMESTAMP.search(text)
            launcher[text] = (text[:m.start()] if m else text) or None
            stamp[text] = m["ts"] if m else None
        pmap = pl.DataFrame({"prefix": uniq, "_l": [launcher[u] for u in uniq],
                             "_t": [stamp[u] for u in uniq]},
                            schema={"prefix": pl.String, "_l": pl.String, "_t": pl.String}).with_columns(
            pl.col("prefix").cast(pl.Categorical), pl.col("_l").cast(pl.Categorical))
        mapped = raw.select("prefix").join(pmap, on="prefix", how="left", maintain_order="left")
        raw = raw.with_columns(mapped["_l"].alias("prefix"), mapped["_t"].alias("log_time"))
        if any(stamp.values()):
            st.era(lo=(2, 26, 0))
    else:
        raw = raw.with_columns(pl.lit(None, pl.String).alias("log_time"))
    named = raw.select("host", "pid", "prefix", "device").filter(pl.col("host").is_not_null())
    for host, pid in named.select("host", "pid").unique().iter_rows():
        st.proc(host, pid)
    for host, pid, pres in named.filter(pl.col("prefix").is_not_null()).group_by(["host", "pid"]).agg(
            pl.col("prefix").unique().head(4)).iter_rows():
        proc = st.proc(host, pid)
        for x in sorted(pres):
            if x not in proc.prefixes and len(proc.prefixes) < 4:
                proc.prefixes.append(x)
    for host, pid, devs in named.filter(pl.col("device").is_not_null()).group_by(["host", "pid"]).agg(
            pl.col("device").unique()).iter_rows():
        st.proc(host, pid).devices.update(devs)
    return raw


def _collectives(raw: pl.DataFrame, idx: pl.Series, comms: list[_Comm], procs: pl.DataFrame,
                 world: dict[tuple[str | None, int | None], _Comm]) -> pl.DataFrame:
    """The COLL rows with everything resolved: communicator instance (``idx``, from :func:`_comm_index`),
    pg, seq, global rank, op/dtype names, bytes, peer. Joins run on narrow integer keys and add columns to
    the wide frame, which is never copied; per-value mappings are computed once per distinct value (ops,
    datatypes, communicators) in Python."""
    if raw.height == 0:
        return pl.DataFrame(schema=_COLL_FRAME)
    by_idx = {c.idx: c for c in comms}
    pg_ids = sorted({c.comm_id for c in comms if c.comm_id})
    pgi_of = {cid: i for i, cid in enumerate(pg_ids)}
    world_idx = {c.idx for c in world.values()}
    world_ids = {(h, p): c.comm_id for (h, p), c in world.items()}
    ci = pl.col("comm_idx")
    pr = procs.with_columns(pl.col("host").cast(pl.Categorical))
    grank = raw.select("host", "pid").join(pr.select("host", "pid", "global_rank"), on=["host", "pid"],
                                           how="left", maintain_order="left")["global_rank"]
    df = raw.with_columns(idx, grank)
    ops = {o: _norm_op(o) for o in df.select(pl.col("op_raw").unique().cast(pl.String))["op_raw"]
           .to_list() if o is not None}
    dts = df["dtype_id"].unique().drop_nulls().to_list()
    dt_name = {d: DTYPES[d][0] if d in DTYPES else f"unknown({d})" for d in dts}
    dt_size = {d: DTYPES[d][1] for d in dts if d in DTYPES}
    # is the call on its process's world comm (the one its global rank comes from)?
    in_world = {c.idx: c.idx in world_idx or (c.comm_id is not None and world_ids.get((c.host, c.pid))
                                                == c.comm_id) for c in comms}
    df = df.with_columns(
        ci.replace_strict({i: c.comm_id for i, c in by_idx.items()}, default=None, return_dtype=pl.String)
        .alias("pg"),
        ci.replace_strict({i: pgi_of.get(c.comm_id) for i, c in by_idx.items()}, default=None,
                          return_dtype=pl.Int32).alias("pgi"),
        ci.replace_strict({i: c.rank for i, c in by_idx.items()}, default=None, return_dtype=pl.Int32)
        .alias("comm_rank"),
        ci.replace_strict(in_world, default=False, return_dtype=pl.Boolean).alias("_world"),
        pl.col("op_raw").cast(pl.String).replace_strict(ops, default=None, return_dtype=pl.String)
        .alias("op"),
        pl.col("dtype_id").replace_strict(dt_name, default=None, return_dtype=pl.String).alias("dtype"),
        pl.col("dtype_id").replace_strict(dt_size, default=None, return_dtype=pl.Int64).alias("_size"),
    )
    df = df.with_columns(
        # per (process, communicator instance); calls whose comm never had an Init line: per pointer
        pl.when(pl.col("host").is_not_null()).then(
            pl.int_range(pl.len(), dtype=pl.Int64).over(
                ["host", "pid", "comm", pl.col("pgi").fill_null(-1)])).alias("seq"),
        (pl.col("count") * pl.col("_size") * pl.when(pl.col("op").is_in(FULL_BUFFER_OPS))
         .then(pl.col("nranks").cast(pl.Int64)).otherwise(1)).alias("bytes"),
        pl.when(pl.col("op").is_in(ROOTED_OPS)).then(pl.col("root")).otherwise(None).alias("peer_comm_rank"),
    ).drop("_size")
    # peer -> global rank: identity in the process's world comm, else the member's Init line in this file
    members = _members(comms, procs)
    if members.height:
        mem = members.with_columns(
            pl.col("comm_id").replace_strict(pgi_of, default=None, return_dtype=pl.Int32).alias("pgi"),
        ).select("pgi", "comm_rank", "_member_grank")
        mg = df.select("pgi", "peer_comm_rank").join(mem, left_on=["pgi", "peer_comm_rank"],
                                                     right_on=["pgi", "comm_rank"], how="left",
                                                     maintain_order="left")["_member_grank"]
    else:
        mg = pl.Series("_member_grank", [None] * df.height, pl.Int32)
    df = df.with_columns(mg.alias("_mg")).with_columns(
        pl.when(pl.col("_world")).then(pl.col("peer_comm_rank")).otherwise(pl.col("_mg")).cast(pl.Int32)
        .alias("_pglob"))
    df = df.with_columns(
        pl.col("_pglob").is_not_null().alias("peer_is_global"),
        pl.coalesce("_pglob", "peer_comm_rank").cast(pl.Int32).alias("peer"),
        pl.coalesce(pl.col("rccl_globalrank"), pl.col("global_rank")).cast(pl.Int32).alias("global_rank"),
    )
    df = df.with_columns(
        pl.col("global_rank").is_not_null().alias("rank_is_global"),
        pl.coalesce(pl.col("global_rank"), pl.col("comm_rank")).cast(pl.Int32).alias("rank"),
        pl.int_range(pl.len(), dtype=pl.Int64).alias("collective_id"),
        pl.lit(None, pl.String).alias("algorithm"), pl.lit(None, pl.String).alias("protocol"),
    )
    return df.select(list(_COLL_FRAME))


#: the resolved COLL frame (the ``collectives`` columns, the ``nccl_calls`` columns and join keys)
_COLL_FRAME = {
    "rank": pl.Int32, "collective_id": pl.Int64, "pg": pl.String, "seq": pl.Int64, "op": pl.String,
    "dtype": pl.String, "count": pl.Int64, "bytes": pl.Int64, "nranks": pl.Int32, "peer": pl.Int32,
    "algorithm": pl.String, "protocol": pl.String, "stream": pl.Categorical, "line": pl.Int64,
    "pgi": pl.Int32, "dtype_id": pl.Int32,
    "host": pl.Categorical, "pid": pl.Int64, "tid": pl.Int64, "device": pl.Int32, "comm": pl.Categorical,
    "comm_idx": pl.Int64, "comm_rank": pl.Int32, "global_rank": pl.Int32, "rank_is_global": pl.Boolean,
    "peer_comm_rank": pl.Int32, "peer_is_global": pl.Boolean, "opcount": pl.Int64, "redop": pl.Int32,
    "in_place": pl.Boolean, "prefix": pl.Categorical, "log_time": pl.String, "orphan": pl.Boolean,
    "task": pl.Int64, "repeated": pl.Int64,
}
#: columns of ``nccl_calls`` (aligned with ``collectives``)
_CALLS_SCHEMA = ("collective_id", "line", "host", "pid", "tid", "device", "comm", "comm_rank",
                 "global_rank", "rank_is_global", "peer_comm_rank", "peer_is_global", "opcount", "redop",
                 "in_place", "prefix", "log_time", "orphan", "task", "repeated")


def _members(comms: list[_Comm], procs: pl.DataFrame) -> pl.DataFrame:
    """(comm_id, rank in comm) -> global rank of the member process, from the Init lines in the file
    (dropped when two processes claim the same slot: colliding synthetic ids)."""
    rows = [{"comm_id": c.comm_id, "comm_rank": c.rank, "host": c.host, "pid": c.pid}
            for c in comms if c.comm_id and c.rank is not None and c.host is not None]
    df = pl.DataFrame(rows, schema={"comm_id": pl.String, "comm_rank": pl.Int32, "host": pl.String,
                                    "pid": pl.Int64})
    df = df.join(procs.select("host", "pid", "global_rank"), on=["host", "pid"], how="left")
    df = df.filter(pl.col("global_rank").is_not_null()).group_by(["comm_id", "comm_rank"]).agg(
        pl.col("global_rank").first().alias("_member_grank"), pl.col("global_rank").n_unique().alias("_n"))
    return df.filter(pl.col("_n") == 1).drop("_n")


def _resolve_orphans(raw: pl.DataFrame, comms: list[_Comm]) -> pl.DataFrame:
    """An orphan COLL body names its comm pointer: when exactly one process in the file has a
    communicator at that pointer, the line is that process's. A widowed prefix paired with it (kept in
    host/pid) is accepted only if that process has the pointer."""
    owners: dict[str, set[tuple[str | None, int | None]]] = defaultdict(set)
    for c in comms:
        if c.host is not None:
            owners[c.comm].add((c.host, c.pid))
    hosts, pids = raw["host"].cast(pl.String).to_list(), raw["pid"].to_list()
    orphan, comm = raw["orphan"].to_list(), raw["comm"].cast(pl.String).to_list()
    for i in np.flatnonzero(np.asarray(orphan, bool)).tolist():
        cands = owners.get(comm[i], set())
        if (hosts[i], pids[i]) in cands:
            continue
        if len(cands) == 1:
            hosts[i], pids[i] = next(iter(cands))
        else:
            hosts[i], pids[i] = None, None
    return raw.with_columns(pl.Series("host", hosts, pl.String).cast(pl.Categorical),
                            pl.Series("pid", pids, pl.Int64))


def _dev_kind(st: _Parser) -> str | None:
    v = _file_version(st)
    lo, hi = (_version_tuple(v),) * 2 if v else (st.era_lo, st.era_hi)
    if hi <= (2, 4, 99):
        return "cudaDev"
    if lo >= (2, 18, 3):
        return "nvmlDev"
    if lo >= (2, 5, 0) and hi <= (2, 18, 2):
        return "busId"
    return None


def _family(via: str) -> str:
    """The transport family of a ``via`` text: ``P2P``, ``SHM`` (``direct shared memory`` up to 2.13),
    ``NET/IB``, ``NET/Socket``, ``NET/<plugin>``, ``COLLNET``, ..."""
    if via.startswith("direct shared memory"):
        return "SHM"
    parts = via.split("/")
    head = parts[0].strip().upper()
    if head == "NET" and len(parts) > 1:
        return "NET/" + parts[1].strip().split("(")[0]
    return head


def _topology(st: _Parser, chosen_comms: list[_Comm | None], procs: pl.DataFrame) -> tuple[pa.Table, pa.Table]:
    """TOPOLOGY rows and the aligned ``nccl_connections`` rows, one per transport line (its communicator
    from :func:`_attribute`; a line of no known communicator is kept with ``comm_id`` null)."""
    granks = {(h, p): g for h, p, g in procs.select("host", "pid", "global_rank").iter_rows()}
    dev_kind = _dev_kind(st)
    rows, extra = [], []
    unattributed = 0
    for r, chosen in zip(st.conns, chosen_comms, strict=True):
        logger = r["dst"] if r["direction"] == "receive" and r["dst"] is not None else r["src"]
        peer = r["src"] if logger == r["dst"] and r["direction"] == "receive" else r["dst"]
        if chosen is None:
            unattributed += 1
        rows.append({"comm_id": chosen.comm_id if chosen else None, "rank": logger,
                     "nranks": chosen.nranks if chosen else None, "channel": r["channel"], "peer": peer,
                     "direction": r["direction"], "transport": _family(r["detail"]),
                     "detail": r["detail"], "host": r["host"]})
        extra.append({"line": r["line"], "host": r["host"], "pid": r["pid"],
                      "comm": chosen.comm if chosen else None, "channel": r["channel"], "conn": r["conn"],
                      "src": r["src"], "dst": r["dst"], "src_dev": r["src_dev"], "dst_dev": r["dst_dev"],
                      "dev_kind": dev_kind, "global_rank": granks.get((r["host"], r["pid"])),
                      "orphan": r["orphan"]})
    if unattributed:
        st.diagnostics.append(Diagnostic(st.path, f"{unattributed} transport lines could not be "
                                         "attributed to a communicator (kept as topology rows with comm_id "
                                         "null)"))
    rows = _fit(rows, TOPOLOGY)
    topo = table(TOPOLOGY, {k: [r[k] for r in rows] for k in TOPOLOGY.names}) if rows else \
        TOPOLOGY.empty_table()
    schema = pa.schema([("line", pa.int64()), ("host", pa.string()), ("pid", pa.int64()),
                        ("comm", pa.string()), ("channel", pa.int32()), ("conn", pa.int32()),
                        ("src", pa.int32()), ("dst", pa.int32()), ("src_dev", pa.string()),
                        ("dst_dev", pa.string()), ("dev_kind", pa.string()), ("global_rank", pa.int32()),
                        ("orphan", pa.bool_())])
    return topo, _rows_table(extra, schema)


def _graph(st: _Parser, chosen_comms: list[_Comm | None], ctx: dict[tuple[str, int], Any]) -> pa.Table:
    """Ring orders, ring neighbours and trees per channel (communicators from :func:`_attribute`), plus
    channel counts folded into the communicators."""
    comms = st.comms
    rows = []
    for r, chosen in zip(st.graph, chosen_comms, strict=True):
        rows.append({"line": r["line"], "host": r["host"], "pid": r["pid"],
                     "comm": chosen.comm if chosen else None, "comm_id": chosen.comm_id if chosen else None,
                     "rank": chosen.rank if chosen else _graph_rank(r), "kind": r["kind"],
                     "channel": r["channel"], "nchannels": r["nchannels"], "value": r["value"], "cut": r["cut"]})
    for _, line, r in st.pending_ctx:
        chosen = None
        if r["comm"] is not None:
            chosen = next((c for c in reversed(comms) if c.comm == r["comm"] and c.host == r["host"]
                           and c.pid == r["pid"] and c.first_line <= line), None)
        if chosen is None:
            cands = _candidates(ctx.get((r["host"], r["pid"])), line)
            chosen = cands[0] if cands else _only_comm(ctx.get((r["host"], r["pid"])), line, lambda c: True)
        if chosen is not None:
            v = r["vals"]
            chosen.coll_channels = v.get("coll", chosen.coll_channels)
            chosen.collnet_channels = v.get("collnet", chosen.collnet_channels)
            chosen.nvls_channels = v.get("nvls", chosen.nvls_channels)
            chosen.p2p_channels = v.get("p2p", chosen.p2p_channels)
            chosen.p2p_channels_per_peer = v.get("p2p_per_peer", chosen.p2p_channels_per_peer)
    return _rows_table(rows, NCCL_GRAPH)


def _check_sizes(st: _Parser, coll: pl.DataFrame) -> None:
    """Members of one call must agree on op, count, datatype and size of the comm (send/recv pairs
    legitimately differ and are not checked)."""
    if coll.height == 0:
        return
    sig = pl.struct(pl.col("op"), pl.col("count"), pl.col("dtype_id"), pl.col("nranks")).hash()
    g = coll.filter(pl.col("pgi").is_not_null() & ~pl.col("op").is_in(["send", "recv"])).select(
        "pgi", "seq", "line", sig.alias("_h")).group_by(["pgi", "seq"]).agg(
        (pl.col("_h").min() != pl.col("_h").max()).alias("_bad"), pl.col("line").min().alias("_line"))
    bad = g.filter(pl.col("_bad")).sort("_line")
    if bad.height:
        first = bad.row(0, named=True)
        pg = coll.filter(pl.col("pgi") == first["pgi"])["pg"][0]
        st.diagnostics.append(Diagnostic(
            st.path, f"{bad.height} calls disagree between ranks on op/count/datatype/nranks for the "
            f"same (commId, seq) -- first: pg {pg} seq {first['seq']}; the log is missing or "
            "reordering COLL lines (or ids collide), so cross-rank matching of these calls is unreliable",
            line=first["_line"]))


def _comms_table(comms: list[_Comm], coll: pl.DataFrame) -> pa.Table:
    calls: dict[int, int] = {}
    if coll.height:
        for idx, n in coll.filter(pl.col("comm_idx").is_not_null()).group_by("comm_idx").len().iter_rows():
            calls[idx] = n
    rows = [{"host": c.host, "pid": c.pid, "comm": c.comm, "comm_id": c.comm_id,
             "comm_id_source": c.comm_id_source, "rank": c.rank, "nranks": c.nranks, "cuda_dev": c.cuda_dev,
             "nvml_dev": c.nvml_dev, "bus_id": c.bus_id, "api": c.api, "parent": c.parent,
             "parent_comm_id": c.parent_comm_id, "split_count": c.split_count, "color": c.color,
             "key": c.key, "start_line": c.start_line, "init_line": c.init_line, "end_line": c.end_line,
             "end": c.end, "nnodes": c.nnodes, "local_ranks": c.local_ranks, "local_rank": c.local_rank,
             "coll_channels": c.coll_channels, "collnet_channels": c.collnet_channels,
             "nvls_channels": c.nvls_channels, "p2p_channels": c.p2p_channels,
             "p2p_channels_per_peer": c.p2p_channels_per_peer, "calls": calls.get(c.idx, 0)}
            for c in comms]
    i32, i64, s = pa.int32(), pa.int64(), pa.string()
    schema = pa.schema([("host", s), ("pid", i64), ("comm", s), ("comm_id", s), ("comm_id_source", s),
                        ("rank", i32), ("nranks", i32), ("cuda_dev", i32), ("nvml_dev", i32),
                        ("bus_id", s), ("api", s), ("parent", s), ("parent_comm_id", s),
                        ("split_count", i32), ("color", i32), ("key", i32), ("start_line", i64),
                        ("init_line", i64), ("end_line", i64), ("end", s), ("nnodes", i32),
                        ("local_ranks", i32), ("local_rank", i32), ("coll_channels", i32),
                        ("collnet_channels", i32), ("nvls_channels", i32), ("p2p_channels", i32),
                        ("p2p_channels_per_peer", i32), ("calls", i64)])
    return _rows_table(rows, schema)


def _communicators(st: _Parser, comms: list[_Comm], procs: pl.DataFrame, coll: pl.DataFrame) -> pa.Table:
    """``communicators`` (COMMUNICATORS): one row per member each communicator instance of a process is, with the
    process's host (null for lines without a host prefix), global rank, NCCL version and network."""
    calls: dict[int, int] = {}
    if coll.height:
        for idx, n in coll.filter(pl.col("comm_idx").is_not_null()).group_by("comm_idx").len().iter_rows():
            calls[idx] = n
    granks = {(h, p): g for h, p, g in procs.select("host", "pid", "global_rank").iter_rows()}
    version = _file_version(st)
    rows = []
    for c in comms:
        proc = st.procs.get((c.host, c.pid)) if c.host is not None and c.pid is not None else None
        rows.append({
            "comm_id": c.comm_id, "comm_id_source": c.comm_id_source, "rank": c.rank, "nranks": c.nranks,
            "nnodes": c.nnodes, "local_ranks": c.local_ranks, "local_rank": c.local_rank,
            "host": c.host or None, "pid": c.pid, "global_rank": granks.get((c.host, c.pid)),
            "cuda_dev": c.cuda_dev, "nvml_dev": c.nvml_dev, "bus_id": c.bus_id,
            "nccl_version": (proc.version if proc else None) or version,
            "network": (proc.net_used or (proc.network[0] if proc.network else None) if proc else None)
            or (st.networks[0] if len(st.networks) == 1 else None),
            "parent_comm_id": c.parent_comm_id, "color": c.color, "key": c.key, "coll_channels": c.coll_channels,
            "nvls_channels": c.nvls_channels, "p2p_channels": c.p2p_channels, "calls": calls.get(c.idx, 0),
            "init_line": c.init_line or c.start_line or c.nnodes_line or c.end_line or c.first_line, "end": c.end})
    return _rows_table(_fit(rows, COMMUNICATORS), COMMUNICATORS)


def _network(st: _Parser) -> pa.Table:
    """``nccl_network`` (NCCL_NETWORK): the network devices of every process, GPU Direct RDMA folded in."""
    return _rows_table(_fit(network_table(st), NCCL_NETWORK), NCCL_NETWORK)


def _file_version(st: _Parser) -> str | None:
    if not st.versions:
        vs = {p.version for p in st.procs.values() if p.version}
        return sorted(vs)[-1] if vs else None
    return max(st.versions, key=lambda v: st.versions[v])


def _era_text(st: _Parser) -> str | None:
    lo, hi = st.era_lo, st.era_hi
    if (lo == (2, 0, 0) and hi == (99, 0, 0)) or lo > hi:  # nothing, or forms of eras that contradict each other
        return None
    f = lambda v: ".".join(map(str, v))  # noqa: E731
    if hi == (99, 0, 0):
        return f">={f(lo)}"
    if lo == (2, 0, 0):
        return f"<={f(hi)}".replace(".99", ".x")
    return f"{f(lo)}-{f(hi)}".replace(".99", ".x")


def _meta(st: _Parser, comms: list[_Comm], procs: pl.DataFrame,
          world: dict[tuple[str | None, int | None], _Comm]) -> dict[str, Any]:
    version = _file_version(st)
    ranks = {(h, p): (g, s) for h, p, g, s in procs.select("host", "pid", "global_rank",
                                                             "rank_source").iter_rows()}
    plist = []
    for (host, pid), p in sorted(st.procs.items(), key=lambda kv: (
            ranks.get(kv[0], (None,))[0] if ranks.get(kv[0], (None,))[0] is not None else 1 << 30, kv[0])):
        g, src = ranks.get((host, pid), (None, None))
        w = world.get((host, pid))
        plist.append({
            "host": host, "pid": pid, "rank": g, "rank_source": src, "nranks": w.nranks if w else None,
            "devices": sorted(p.devices), "version": p.version or version, "network": p.network,
            "prefixes": p.prefixes, "version_line": p.version_line, "plugin": p.plugin,
            "env": {k: {"value": v, "line": line} for k, (v, line) in sorted(p.env.items())},
            "net_issues": [{"kind": k, "line": line, "text": text} for k, line, text in p.net_issues],
            "comms": [{"comm": c.comm, "comm_id": c.comm_id, "rank": c.rank, "nranks": c.nranks,
                       "cuda_dev": c.cuda_dev, "bus_id": c.bus_id, "parent": c.parent, "color": c.color,
                       "key": c.key} for c in comms if c.host == host and c.pid == pid],
        })
    world_size = max((c.nranks for c in comms if c.nranks), default=None)
    meta: dict[str, Any] = {
        "format_version": version, "nccl_version": version, "era": _era_text(st), "backend": "nccl",
        "world_size": world_size, "network": st.networks, "processes": plist,
        "versions": {v: {"count": n, "line": st.version_lines.get(v)} for v, n in sorted(st.versions.items())},
    }
    if len(plist) == 1:
        p0 = plist[0]
        meta.update(rank=p0["rank"], host=p0["host"], pid=p0["pid"],
                    device=p0["devices"][0] if len(p0["devices"]) == 1 else None)
    for k in ("lines", "blank_lines", "nccl_lines", "ignored_lines", "unparsed_lines", "warn_lines",
              "cut_lines", "orphan_lines", "widowed_prefixes", "ray_repeats", "continuation_lines",
              "unwind_lines", "bare_lines", "damaged_lines", "unrecognised_lines"):
        meta[k] = int(st.counts.get(k, 0))
    meta["unrecognised"] = [{"level": level, "kind": kind, "count": n, "first_line": first, "example": text,
                             "damaged": dmg}
                            for (level, kind), (n, first, text, dmg) in sorted(
                                st.unknown.items(), key=lambda kv: (-kv[1][0], kv[1][1]))]
    return meta
