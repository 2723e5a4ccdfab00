"""TUNING lines of an NCCL log: normalised across eras (:func:`_tuning_frame`), matched to the call each
describes (:func:`_attach_tuning`), and their algorithm and protocol copied to every member's row of that
call (:func:`_apply_tuning`).
"""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from tracekit.model.diagnostics import Diagnostic

from .columnar import _TEXT_TUNING, _typed_tuning
from .grammar import _ALGO_NAMES, _PROTO_NAMES, ALGOS, DTYPE_SIZES, OPS, PROTOS
from .lines import _Parser

_TUNING_SCHEMA = {"line": pl.Int64, "host": pl.String, "pid": pl.Int64, "op": pl.String, "bytes": pl.Int64,
                  "algorithm": pl.String, "protocol": pl.String, "channel_lo": pl.Int32,
                  "channel_hi": pl.Int32, "time_us": pl.Float64, "kernel": pl.String, "size_kind": pl.String,
                  "comm_id": pl.String, "seq": pl.Int64, "collective_id": pl.Int64, "matched_by": pl.String}


def _tuning_frame(st: _Parser) -> pl.DataFrame:
    """All TUNING lines, normalised: op (tracekit name or null before 2.23), bytes, algorithm,
    protocol (NCCL names, ids mapped), channel range, predicted time (2.20-2.23), symmetric kernel
    (2.27+), and ``size_kind``: ``S`` when the line prints the full buffer (2.20-2.23, numeric ids),
    ``cs`` when it prints count * element size (2.24+)."""
    parts = [pl.from_arrow(t) for t in st.tuning_tables]
    if st.slow_tuning:
        parts.append(pl.from_arrow(_typed_tuning(pa.Table.from_pylist(st.slow_tuning, schema=_TEXT_TUNING))))
    if not parts:
        return pl.DataFrame(schema=_RAW_TUNING_PL)
    raw = pl.concat(parts, how="vertical_relaxed").sort("line").with_columns(
        pl.col(c).cast(pl.String) for c in ("host", "op", "algo", "proto", "kernel"))
    algo_map = {**{str(i): a for i, a in enumerate(ALGOS)}, **_ALGO_NAMES}
    proto_map = {**{str(i): p for i, p in enumerate(PROTOS)}, **_PROTO_NAMES}
    op_map = pl.DataFrame({"op": list(OPS), "_op": list(OPS.values())})
    df = raw.join(op_map, on="op", how="left", maintain_order="left").with_columns(
        pl.coalesce("_op", pl.col("op").str.to_lowercase()).alias("op"),
        pl.col("bytes").cast(pl.Int64),
        pl.when(pl.col("kernel").is_not_null()).then(pl.lit("SYMMETRIC")).otherwise(
            pl.col("algo").str.to_lowercase().str.replace_all("_", "").replace_strict(
                algo_map, default=pl.col("algo").str.to_uppercase())).alias("algorithm"),
        pl.col("proto").str.to_lowercase().replace_strict(
            proto_map, default=pl.col("proto").str.to_uppercase()).alias("protocol"),
        pl.col("lo").alias("channel_lo"), pl.col("hi").alias("channel_hi"), pl.col("time").alias("time_us"),
        pl.when(pl.col("algo").str.contains(r"^\d+$")).then(pl.lit("S")).otherwise(pl.lit("cs"))
        .alias("size_kind"),
    ).drop("_op")
    if df["kernel"].is_not_null().any():
        st.era(lo=(2, 27, 0))
    if (df["size_kind"] == "S").any():
        st.era(lo=(2, 20, 0), hi=(2, 23, 99))
        if df.filter(pl.col("size_kind") == "S")["op"].is_not_null().any():
            st.era(lo=(2, 23, 0))
    elif df["algo"].is_not_null().any():
        st.era(lo=(2, 24, 0))
    return df.select(list(_RAW_TUNING_PL))


_RAW_TUNING_PL = {"line": pl.Int64, "host": pl.String, "pid": pl.Int64, "op": pl.String, "bytes": pl.Int64,
                  "algorithm": pl.String, "protocol": pl.String, "channel_lo": pl.Int32,
                  "channel_hi": pl.Int32, "time_us": pl.Float64, "kernel": pl.String, "size_kind": pl.String}


def _ordinal(df: pl.DataFrame, order: str) -> pl.DataFrame:
    """Add ``_k``: the 0-based rank of each row among the rows with the same ``_h``, by ``order``.
    A sort and a running index, not a window: windows over very many tiny groups are slow."""
    df = df.sort(["_h", order])
    i = pl.int_range(pl.len(), dtype=pl.Int64)
    start = pl.when(pl.col("_h") != pl.col("_h").shift(1)).then(i).otherwise(None).fill_null(0)
    return df.with_columns((i - pl.when(i == 0).then(0).otherwise(start).cum_max()).alias("_k"))


def _attach_tuning(st: _Parser, coll: pl.DataFrame) -> pl.DataFrame:
    """Match each TUNING line to the call it describes, columnar.

    Rank 0 of a communicator prints TUNING lines after the COLL lines of the group (one
    ncclGroupEnd), in the group's order. So, per process, its COLL lines on comms where it is rank 0
    (send/recv excluded) and its TUNING lines are cut into groups (a COLL line after a TUNING line
    starts a new group), and inside a group the k-th TUNING line of an (op, size) is the k-th call of
    that (op, size). Passes, each on what is still unmatched: op + the size the era prints (S up to
    2.23, count*size from 2.24), op + the other size, size only (2.20-2.22 lines name no op), op only.
    ``matched_by`` records the pass."""
    tun = _tuning_frame(st)
    if tun.height == 0:
        return pl.DataFrame(schema=_TUNING_SCHEMA)
    tun = tun.with_columns(pl.col("host").cast(pl.Categorical))
    sizes = pl.DataFrame({"dtype": list(DTYPE_SIZES), "_s": list(DTYPE_SIZES.values())},
                         schema={"dtype": pl.String, "_s": pl.Int64})
    calls = (coll.join(tun.select("host", "pid").unique(), on=["host", "pid"], how="semi")
             .filter(~pl.col("op").is_in(["send", "recv"])
                     & (pl.col("comm_rank").is_null() | (pl.col("comm_rank") == 0)))
             .join(sizes, on="dtype", how="left")
             .select("host", "pid", "line", "op", pl.col("bytes").alias("S"),
                     (pl.col("count") * pl.col("_s")).alias("cs"), "pg", "seq", "collective_id"))
    key = ["host", "pid"]
    tun = tun.with_row_index("_tid").with_columns(pl.col("_tid").cast(pl.Int64))
    ev = pl.concat([
        calls.select(*key, "line", pl.col("collective_id").alias("_id"), pl.lit(False).alias("_t")),
        tun.select(*key, "line", pl.col("_tid").alias("_id"), pl.lit(True).alias("_t")),
    ]).sort([*key, "line", "_t"], maintain_order=True)
    ev = ev.with_columns(
        ((~pl.col("_t")) & pl.col("_t").shift(1).over(key).fill_null(False)).cast(pl.Int64)
        .cum_sum().over(key).alias("_g"))
    calls = calls.join(ev.filter(~pl.col("_t")).select(pl.col("_id").alias("collective_id"), "_g"),
                       on="collective_id", how="left")
    tun = tun.join(ev.filter(pl.col("_t")).select(pl.col("_id").alias("_tid"), "_g"), on="_tid", how="left")
    matched: list[pl.DataFrame] = []
    left_t, left_c = tun, calls  # what is still unmatched

    def run(which: pl.Expr, tkeys: list[str], ckeys: list[str], how: str) -> None:
        nonlocal left_t, left_c
        tsub = left_t.filter(which)
        if tsub.height == 0 or left_c.height == 0:
            return
        # the k-th line of a key meets the k-th call of the same key; one hashed key column keeps the
        # windows cheap (groups are tiny: a few calls per ncclGroup)
        th = pl.struct([pl.col(c).cast(pl.String) if c == "host" else pl.col(c) for c in tkeys]).hash()
        ch = pl.struct([pl.col(c).cast(pl.String) if c == "host" else pl.col(c) for c in ckeys]).hash()
        tsub = _ordinal(tsub.with_columns(th.alias("_h")), "_tid")
        csub = _ordinal(left_c.with_columns(ch.alias("_h")), "collective_id")
        m = tsub.join(csub.select("_h", "_k", "pg", "seq", "collective_id"), on=["_h", "_k"], how="inner")
        if m.height:
            matched.append(m.select("_tid", pl.col("pg").alias("comm_id"), "seq", "collective_id",
                                    pl.lit(how).alias("matched_by")))
            left_t = left_t.join(m.select("_tid"), on="_tid", how="anti")
            left_c = left_c.join(m.select("collective_id"), on="collective_id", how="anti")

    named, kind_is = pl.col("op").is_not_null(), pl.col("size_kind")
    for kind, other in (("S", "cs"), ("cs", "S")):
        for size in (kind, other):
            run(named & (kind_is == kind), [*key, "_g", "op", "bytes"], [*key, "_g", "op", size], "op+bytes")
            run(~named & (kind_is == kind), [*key, "_g", "bytes"], [*key, "_g", size], "bytes")
    run(named, [*key, "_g", "op"], [*key, "_g", "op"], "op")
    links = pl.concat(matched) if matched else pl.DataFrame(
        schema={"_tid": pl.Int64, "comm_id": pl.String, "seq": pl.Int64, "collective_id": pl.Int64,
                "matched_by": pl.String})
    df = tun.join(links, on="_tid", how="left").sort("line").with_columns(
        pl.col("host").cast(pl.String)).select(list(_TUNING_SCHEMA))
    unmatched = df.filter(pl.col("collective_id").is_null()).height
    if unmatched:
        st.diagnostics.append(Diagnostic(st.path, f"{unmatched} of {df.height} TUNING lines match no "
                                         "preceding COLL line of their process (algorithm/protocol "
                                         "left unknown for those calls)"))
    return df


def _apply_tuning(coll: pl.DataFrame, tuning: pl.DataFrame) -> pl.DataFrame:
    """Copy algorithm/protocol to every member's row of the same (pg, seq) (and to the matched row)."""
    m = tuning.filter(pl.col("collective_id").is_not_null())
    if m.height == 0:
        return coll
    hit = coll.select("collective_id", "pgi", "seq").join(
        m.select("collective_id", "algorithm", "protocol"), on="collective_id", how="inner")
    by_id = hit.select("collective_id", pl.col("algorithm").alias("_a1"), pl.col("protocol").alias("_p1"))
    by_seq = hit.filter(pl.col("pgi").is_not_null()).group_by(["pgi", "seq"]).agg(
        pl.col("algorithm").first().alias("_a2"), pl.col("protocol").first().alias("_p2"))
    k = coll.select("collective_id", "pgi", "seq").join(by_id, on="collective_id", how="left",
                                                        maintain_order="left").join(
        by_seq, on=["pgi", "seq"], how="left", maintain_order="left")
    return coll.with_columns(k.select(pl.coalesce("_a1", "_a2").alias("algorithm"),
                                      pl.coalesce("_p1", "_p2").alias("protocol")))
