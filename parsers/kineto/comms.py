"""Collective calls of one Kineto trace: one row per communication activity with its metadata.

Communication activity is an NCCL/RCCL kernel (GPU jobs) or ``gloo:*`` work on a gloo worker thread
(CPU jobs). Its metadata comes, in order of trust, from its own args (kernels since 2023-10), from
the CPU ops that launched it — found through the launch's correlation id and *containment* on the
launching thread (``record_param_comms`` ⊃ ``nccl:*`` ⊃ launch; FORMATS.md §1.6) — or from the op
whose ``External id`` it carries. Sizes follow FORMATS.md §4: ``bytes`` is S of the nccl-tests
convention (the full buffer), ``count`` the NCCL element count.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from tracekit.model import schema
from tracekit.model.schema import clean_text, normalise_op

from ..ints import int_in

#: element size in bytes of c10 ScalarType names (``dtype``), C++ type names (``Input type``) and
#: common spellings of other writers
DTYPE_BYTES: dict[str, int] = {
    name: size
    for size, names in {
        1: ("Bool", "Byte", "Char", "Float8_e4m3fn", "Float8_e5m2", "Float8_e4m3fnuz", "Float8_e5m2fnuz",
            "QInt8", "QUInt8", "bool", "unsigned char", "signed char", "char", "c10::Float8_e4m3fn",
            "c10::Float8_e5m2", "uint8", "int8"),
        2: ("Short", "Half", "BFloat16", "UInt16", "short", "short int", "unsigned short", "c10::Half",
            "c10::BFloat16", "int16", "uint16", "float16", "bfloat16"),
        4: ("Int", "Float", "UInt32", "QInt32", "int", "unsigned int", "float", "int32", "uint32",
            "float32"),
        8: ("Long", "Double", "ComplexFloat", "UInt64", "long", "long int", "long long", "long long int",
            "unsigned long", "double", "c10::complex<float>", "int64", "uint64", "float64"),
        16: ("ComplexDouble", "c10::complex<double>", "complex128"),
    }.items()
    for name in names
}

def _elements(dims: Any) -> list[int]:
    """Element counts of each tensor in an ``Input Dims`` value (nested for TensorLists)."""
    out: list[int] = []
    if not isinstance(dims, list):
        return out
    if dims and all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        out.append(_prod(dims))
        return out
    for d in dims:
        if isinstance(d, list):
            if d and all(isinstance(x, list) for x in d):
                out.append(min(sum(_elements(d)), _MAX_INT))
            elif d and all(isinstance(x, int) and not isinstance(x, bool) for x in d):
                out.append(_prod(d))
            else:
                out.append(0)
        else:
            out.append(0)
    return out


def _type_size(t: Any) -> int | None:
    return DTYPE_BYTES.get(t) if isinstance(t, str) else None


def _input_bytes(dims: Any, types: Any) -> tuple[int | None, str | None]:
    """Bytes of the first tensor input (or tensor list) of an op: ``Input Dims`` × ``Input type``."""
    if not isinstance(dims, list) or not isinstance(types, list):
        return None, None
    counts = _elements(dims)
    for i, c in enumerate(counts):
        t = types[i] if i < len(types) else None
        size = _type_size(t)
        if size and c:
            return _fits(c * size), t
        if t == "TensorList" and c:
            return None, None  # a list of tensors: sizes but no type, use the inner op instead
    return None, None


#: counts, sizes and ids beyond this are not real (and would overflow int64 columns)
_MAX_INT = 1 << 62


def _int(v: Any) -> int | None:
    """An int from an int or a string of digits, None for anything else or out of range."""
    if isinstance(v, bool):
        return None
    if isinstance(v, str) and len(v) < 24 and v.strip().lstrip("-").isdigit():
        v = int(v)
    if isinstance(v, int):
        return v if -_MAX_INT <= v <= _MAX_INT else None
    return None


def _fits(v: int | None) -> int | None:
    """``v`` if it is a sane int64 value, else None."""
    return v if v is not None and -_MAX_INT <= v <= _MAX_INT else None


def _int32(v: Any) -> int | None:
    """An int that fits the int32 columns (ranks, group sizes, peers), else None."""
    return int_in(_int(v))


def _positive32(v: Any) -> int | None:
    """A group size: an int in [1, 2^31), else None."""
    i = _int32(v)
    return i if i is not None and i > 0 else None


def _prod(dims: list) -> int:
    """Product of a shape's extents; 0 when it is out of range or negative (never an overflow)."""
    n = 1
    for d in dims:
        n *= d
        if n > _MAX_INT or n < 0:
            return 0
    return n


def _row_fields(row: dict[str, Any]) -> dict[str, Any]:
    """Normalise one metadata-carrying op/kernel's args into collective fields."""
    op = normalise_op(row.get("collective"))
    dtype = row.get("dtype") if isinstance(row.get("dtype"), str) else None
    size = _type_size(dtype)
    n_in = _int(row.get("in_nelems"))
    n_out = _int(row.get("out_nelems"))
    if n_in is None:
        n_in = _int(row.get("in_size"))
    if n_out is None:
        n_out = _int(row.get("out_size"))
    nbytes = None
    if size and (n_in is not None or n_out is not None):
        nbytes = _fits(max(n_in or 0, n_out or 0) * size)
    dims = row.get("input_dims") if row.get("input_dims") is not None else row.get("input_dims_legacy")
    dims_bytes, dims_type = _input_bytes(dims, row.get("input_type"))
    pg = row.get("pg_name")
    if pg is None and row.get("pg_id") is not None:
        pg = str(row.get("pg_id"))
    peer = _int32(row.get("dst_rank"))
    if peer is None:
        peer = _int32(row.get("src_rank"))
    return {  # strings made encodable: a JSON "\ud800" would stop polars and Arrow
        "op": clean_text(op), "dtype": clean_text(dtype or dims_type), "bytes": nbytes, "dims_bytes": dims_bytes,
        "elem": size or _type_size(dims_type), "nranks": _positive32(row.get("group_size")),
        "pg": None if pg is None else clean_text(str(pg)), "seq": _int(row.get("seq")), "peer": peer,
    }


#: the args :func:`_row_fields` reads, besides ``seq``
_FIELD_ARGS = ("collective", "dtype", "in_nelems", "out_nelems", "in_size", "out_size", "input_dims",
               "input_dims_legacy", "input_type", "pg_name", "pg_id", "dst_rank", "src_rank", "group_size")


def _rows_fields(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """:func:`_row_fields` of each row, normalised once per distinct set of args (with their types: ``True`` is not
    ``1`` here) and once per row where a shape makes them unhashable: a job repeats a few collectives thousands of
    times, each with its own ``seq``."""
    done: dict[tuple, dict[str, Any]] = {}
    out = []
    for row in rows:
        values = tuple(map(row.get, _FIELD_ARGS))
        key = (values, tuple(map(type, values)))
        try:
            fields = done.get(key)
        except TypeError:  # a list (shapes): not hashable
            out.append(_row_fields(row))
            continue
        if fields is None:
            fields = done[key] = _row_fields(row)
        out.append({**fields, "seq": _int(row.get("seq"))})
    return out


def _bus_buffer_bytes(op: str | None, input_bytes: int, nranks: int | None) -> int:
    """S (the full buffer) from the bytes of an op's *input* tensor (FORMATS.md §4)."""
    if op == "allgather" and nranks:
        return _fits(input_bytes * nranks)
    return input_bytes


def _nccl_count(op: str | None, s_bytes: int | None, elem: int | None, nranks: int | None) -> int | None:
    """NCCL's ``count`` for a collective of S bytes (elements; per-rank for gather/scatter kinds)."""
    if s_bytes is None or not elem:
        return None
    total = s_bytes // elem
    if op in ("allgather", "reduce_scatter", "all_to_all", "gather", "scatter") and nranks:
        return total // nranks
    return total


def collectives(events: pa.Table, index_col: np.ndarray, comm_rows: list[dict[str, Any]],
                members: dict[str, Any]) -> tuple[pa.Table, pa.Array | None]:
    """Build the collectives table of one trace and the ``collective_id`` column of its events."""
    kinds = events.column("kind")
    is_comm = (kinds.combine_chunks().indices.to_numpy(zero_copy_only=False) ==
               schema.KINDS.index("comm")) if events.num_rows else np.zeros(0, bool)
    if not is_comm.any():
        return schema.empty(schema.COLLECTIVES), None
    # row of each metadata record among the events (-1: none), by its position in the file
    order = np.argsort(index_col, kind="stable")
    sorted_index = index_col[order]
    wanted = np.fromiter((r["_index"] for r in comm_rows), np.int64, len(comm_rows))
    at = np.minimum(np.searchsorted(sorted_index, wanted), max(sorted_index.size - 1, 0))
    found = sorted_index[at] == wanted if sorted_index.size else np.zeros(wanted.size, bool)
    rows = np.where(found, order[at] if sorted_index.size else -1, -1).tolist()

    import polars as pl  # here: a split parse's worker processes never need it (~0.1 s of their start)

    # one lazy query, collected once: its ~60 steps on a few hundred rows cost their hand-offs to polars' pool
    # (~0.3 ms each here) more than their work, once per trace
    frame = pl.from_arrow(events.select(["lane", "kind", "name", "start_ns", "dur_ns", "pid", "tid",
                                         "correlation", "external_id"]))
    assert isinstance(frame, pl.DataFrame)
    ev = frame.lazy().with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias("row"),
                                   pl.col("lane").cast(pl.String), pl.col("kind").cast(pl.String),
                                   pl.col("name").cast(pl.String))
    comm = ev.filter(pl.lit(pl.Series(is_comm))).with_columns(
        (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"))
    # metadata rows (args of ops/kernels that carry collective information)
    fields = [{**f, "row": row} for f, row in zip(_rows_fields(comm_rows), rows, strict=True) if row >= 0]
    meta = pl.DataFrame(fields, schema={"op": pl.String, "dtype": pl.String, "bytes": pl.Int64,
                                        "dims_bytes": pl.Int64, "elem": pl.Int64, "nranks": pl.Int64,
                                        "pg": pl.String, "seq": pl.Int64, "peer": pl.Int64, "row": pl.Int64}).lazy()
    meta = meta.join(ev.select(["row", "name", "start_ns", "dur_ns", "pid", "tid", "external_id", "kind"]),
                     on="row", how="left")
    own = meta.join(comm.select("row"), on="row", how="semi")
    # launches of device comm activity: correlation -> runtime event on a CPU thread
    launches = (ev.filter((pl.col("kind") == "runtime") & pl.col("correlation").is_not_null())
                .select(["correlation", pl.col("start_ns").alias("t"), pl.col("pid").alias("lpid"),
                         pl.col("tid").alias("ltid")]).unique("correlation", keep="first"))
    comm = comm.join(launches, on="correlation", how="left")
    # CPU-side anchor: the launch for kernels; the work itself for gloo:* events on CPU threads
    comm = comm.with_columns(
        pl.coalesce("t", pl.when(pl.col("lane").str.starts_with("cpu")).then("start_ns")).alias("t"),
        pl.coalesce("lpid", pl.when(pl.col("lane").str.starts_with("cpu")).then("pid")).alias("lpid"),
        pl.coalesce("ltid", pl.when(pl.col("lane").str.starts_with("cpu")).then("tid")).alias("ltid"))
    cpu_meta = meta.filter(pl.col("kind") != "comm").with_columns(
        (pl.col("start_ns") + pl.col("dur_ns")).alias("m_end"))
    groups = {
        "rpc": cpu_meta.filter(pl.col("name") == "record_param_comms"),
        "ann": cpu_meta.filter(pl.col("name").str.starts_with("nccl:") | pl.col("name").str.starts_with(
            "ucc:") | pl.col("name").str.starts_with("mpi:")),
        "c10d": cpu_meta.filter(pl.col("name").str.starts_with("c10d::")),
    }
    out = comm.select(["row", "lane", "name", "start_ns", "end_ns", "t", "lpid", "ltid", "external_id"])
    out = out.join(own.select(["row", "op", "dtype", "bytes", "dims_bytes", "elem", "nranks", "pg", "seq",
                               "peer"]), on="row", how="left")
    linked = out.filter(pl.col("t").is_not_null()).sort("t")
    for tag, g in groups.items():
        cols = ["op", "dtype", "bytes", "dims_bytes", "elem", "nranks", "pg", "seq", "peer", "name"]
        # ties broken by file order, so the result never depends on how polars ordered a join; a group without rows
        # matches nothing (its columns null)
        right = (g.select([pl.col("pid").alias("lpid"), pl.col("tid").alias("ltid"),
                           pl.col("start_ns").alias("m_start"), "m_end", "row", *cols])
                 .rename({c: f"{c}_{tag}" for c in cols}).sort(["m_start", "row"]).drop("row"))
        j = linked.select(["row", "t", "lpid", "ltid"]).join_asof(
            right, left_on="t", right_on="m_start", by=["lpid", "ltid"], strategy="backward", check_sortedness=False)
        j = j.filter(pl.col("m_end") >= pl.col("t")).select(["row", *[f"{c}_{tag}" for c in cols]])
        out = out.join(j, on="row", how="left")
    # kernels without a launch: their External id names the op that holds the metadata (2024+)
    by_ext = (cpu_meta.filter(pl.col("external_id").is_not_null() & (pl.col("name") == "record_param_comms"))
              .select([pl.col("external_id"), *[pl.col(c).alias(f"{c}_ext") for c in
                                                ("op", "dtype", "bytes", "elem", "nranks", "pg", "seq",
                                                 "peer")], "row"]).sort("row")
              .unique("external_id", keep="first", maintain_order=True).drop("row"))
    out = out.join(by_ext, on="external_id", how="left")
    names = out.collect_schema().names()

    def pick(col: str, order: tuple[str, ...] = ("", "_rpc", "_ext", "_ann", "_c10d")) -> pl.Expr:
        return pl.coalesce([pl.col(f"{col}{suffix}") for suffix in order if f"{col}{suffix}" in names])

    out = out.with_columns(
        pick("op", ("", "_rpc", "_ext", "_c10d", "_ann")).alias("op_meta"),
        pick("dtype").alias("dtype_f"),
        pick("elem").alias("elem_f"),
        pick("nranks").alias("nranks_f"),
        pick("pg").alias("pg_f"),
        pick("seq").alias("seq_f"),
        pick("peer").alias("peer_f"),
        pick("bytes", ("", "_rpc", "_ext")).alias("bytes_f"),
        pick("dims_bytes", ("", "_ann", "_rpc", "_c10d")).alias("dims_bytes_f"),
    )
    pdf = out.sort(["start_ns", "row"]).select(["row", "lane", "name", "name_c10d", "name_ann", "start_ns", "end_ns",
                                       "op_meta", "dtype_f",
                                       "elem_f", "nranks_f", "pg_f", "seq_f", "peer_f", "bytes_f",
                                       "dims_bytes_f"]).collect(engine="in-memory").to_dict(as_series=False)
    world = _world_size(members)
    ops, nbytes, counts, nranks, size_src = [], [], [], [], []
    for i in range(len(pdf["row"])):
        # the launching op names the collective better than the kernel (NCCL runs all-to-all,
        # gathers and p2p as SendRecv kernels)
        op = (pdf["op_meta"][i] or normalise_op(pdf["name_c10d"][i]) or normalise_op(pdf["name_ann"][i])
              or normalise_op(pdf["name"][i]))
        n = pdf["nranks_f"][i] or world
        b = pdf["bytes_f"][i]
        src = None if b is None else "args"
        if b is None and pdf["dims_bytes_f"][i] is not None:
            b = _bus_buffer_bytes(op, pdf["dims_bytes_f"][i], n)
            src = "shapes"
        size_src.append(src)
        ops.append(op)
        nbytes.append(b)
        nranks.append(n)
        counts.append(_nccl_count(op, b, pdf["elem_f"][i], n))
    n_coll = len(pdf["row"])
    table = schema.table(schema.COLLECTIVES, {
        "rank": pa.nulls(n_coll, pa.int32()),
        "collective_id": pa.array(np.arange(n_coll, dtype=np.int64)),
        "pg": pdf["pg_f"], "seq": pdf["seq_f"], "op": ops, "dtype": pdf["dtype_f"], "count": counts,
        "bytes": nbytes, "nranks": nranks, "peer": pdf["peer_f"],
        "start_ns": pdf["start_ns"], "end_ns": pdf["end_ns"], "lane": pdf["lane"],
        "source": ["gloo" if (nm or "").startswith("gloo:") else "kineto-kernel" for nm in pdf["name"]],
        "size_source": size_src,
    })
    table = _gloo_groups(table, members)
    ids = np.full(events.num_rows, -1, dtype=np.int64)
    ids[np.asarray(pdf["row"], dtype=np.int64)] = np.arange(n_coll)
    coll_ids = pa.array(ids, mask=ids < 0)
    return table, coll_ids


#: worker threads of a ProcessGroupGloo (``ProcessGroupGloo.Options._threads``, 2 by default)
GLOO_THREADS_PER_GROUP = 2


def _gloo_groups(table: pa.Table, members: dict[str, Any]) -> pa.Table:
    """Give gloo work its process group when the rank is in several: gloo writes no group, but every
    ``ProcessGroupGloo`` runs its work on its own :data:`GLOO_THREADS_PER_GROUP` worker threads, created with
    the group, and ``pg_config`` lists the rank's groups in creation order. The worker threads sorted by id are
    taken two by two as the groups in order; groups with no work in the profiled window are the earliest (the
    default group, used for start-up). Left alone when the threads do not split evenly or outnumber the groups.
    Point-to-point work runs on the caller's thread and is not assigned."""
    info = members.get("distributedInfo")
    info = info if isinstance(info, dict) else {}
    rank = info.get("rank")
    config = info.get("pg_config")  # of any type in a damaged file: only a list of groups is read
    pgs = [e for e in (config if isinstance(config, list) else []) if isinstance(e, dict)
           and isinstance(e.get("ranks"), list) and (rank is None or rank in e["ranks"])
           and e.get("pg_name") is not None]
    if len(pgs) < 2 or table.num_rows == 0:
        return table
    import polars as pl

    c = pl.from_arrow(table.select(["source", "op", "pg", "lane"]))
    assert isinstance(c, pl.DataFrame)
    work = (pl.col("source") == "gloo") & ~pl.col("op").is_in(["send", "recv"]) & pl.col("pg").is_null()
    lanes = c.filter(work).get_column("lane").unique().to_list()
    tids = sorted((int(t), lane) for lane in lanes if (t := lane.rsplit(" ", 1)[-1]).lstrip("-").isdigit())
    k = GLOO_THREADS_PER_GROUP
    if not tids or len(tids) != len(lanes) or len(tids) % k or len(tids) // k > len(pgs):
        return table
    used = pgs[len(pgs) - len(tids) // k:]
    lane_pg = {lane: used[i // k] for i, (_, lane) in enumerate(tids)}
    names = pl.DataFrame({"lane": list(lane_pg), "_pg": [str(e["pg_name"]) for e in lane_pg.values()],
                          "_n": [len(e["ranks"]) for e in lane_pg.values()]},
                         schema={"lane": pl.String, "_pg": pl.String, "_n": pl.Int32})
    full = pl.from_arrow(table)
    assert isinstance(full, pl.DataFrame)
    full = full.with_row_index("_i").join(names, on="lane", how="left").sort("_i").with_columns(
        pl.when(work).then(pl.col("_pg")).otherwise(pl.col("pg")).alias("pg"),
        pl.when(work & pl.col("_n").is_not_null()).then(pl.col("_n")).otherwise(pl.col("nranks")).alias("nranks"),
    ).drop("_i", "_pg", "_n")
    return schema.conform(full.to_arrow(), schema.COLLECTIVES)


def _world_size(members: dict[str, Any]) -> int | None:
    info = members.get("distributedInfo")
    if isinstance(info, dict):
        return int_in(info.get("world_size"), 1)
    return None
