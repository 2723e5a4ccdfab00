"""The output of the Horovod timeline parser (:mod:`tracekit.parsers.horovod`, step 6): the streamed
state turned into ``events``, ``collectives``, the ``horovod_*`` tables, diagnostics and ``meta``
(:func:`_finish`), mostly without copying: constant and all-null columns share one zero buffer, numeric
columns share numpy's buffers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from tracekit.model.diagnostics import Diagnostic
from tracekit.model.schema import COLLECTIVES, DICT_STR, EVENTS, ITERATIONS, ParsedFile
from tracekit.model.schema import table as schema_table

from ..json_stream import End
from .name_repair import _NameRepair
from .pairing import _MAX_I64, _cat, _Instances, _Parser
from .phases import _DTYPE_SIZE, _OPS, FORMAT, _shape_count, phase_kind
from .records import _NO_TS

#: transfer intervals closer than this belong to one fusion group
FUSION_TOL_NS = 2_000


# ---------------------------------------------------------------------------------------------------
# Arrow helpers


class _Zeros:
    """One zero-filled buffer shared by every constant column (rank 0, cat 0, the all-null columns), so
    that they cost nothing per row whatever the allocator does with small zeroed blocks."""

    def __init__(self, rows: int) -> None:
        self.buf = pa.py_buffer(np.zeros(8 * rows + 64, np.uint8))

    def values(self, type_: pa.DataType, n: int) -> pa.Array:
        """``n`` zeros of a fixed-width type."""
        return pa.Array.from_buffers(type_, n, [None, self.buf])

    def nulls(self, type_: pa.DataType, n: int) -> pa.Array:
        return pa.Array.from_buffers(type_, n, [self.buf, self.buf], null_count=n)


def _masked(values: np.ndarray, valid: np.ndarray, type_: pa.DataType) -> pa.Array:
    """``values`` as an Arrow array with nulls where not ``valid``, sharing the numpy buffer (no copy)
    when the dtypes agree: the result tables are most of the memory a big timeline needs."""
    if values.dtype != type_.to_pandas_dtype() or values.dtype == np.bool_:
        return pa.array(values, type=type_, mask=~valid)
    values = np.ascontiguousarray(values)
    n_null = int(values.size - np.count_nonzero(valid))
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little")) if n_null else None
    return pa.Array.from_buffers(type_, values.size, [bitmap, pa.py_buffer(values)], null_count=n_null)


def _dictionary(values: list[str | None] | list[str]) -> tuple[pa.Array, np.ndarray]:
    """A dictionary for :func:`_dict_indices`: the strings, and which entries stand for null."""
    none = np.array([v is None for v in values] or [False], bool)
    return pa.array([v if v is not None else "" for v in values] or [""], type=pa.string()), none


def _dict_indices(indices: np.ndarray, dictionary: tuple[pa.Array, np.ndarray]) -> pa.Array:
    """A dictionary<int32, string> array over ``dictionary``; negative indices and indices of a None
    entry become nulls. int32 indices without nulls are shared with numpy, not copied."""
    values, none = dictionary
    idx = indices.astype(np.int32, copy=False)
    mask = idx < 0
    if none.any() and idx.size:
        mask |= none[np.maximum(idx, 0)]
    if mask.any():
        return pa.DictionaryArray.from_arrays(pa.array(np.where(mask, 0, idx), mask=mask), values)
    return pa.DictionaryArray.from_arrays(pa.array(idx), values)


def _dict_array(indices: np.ndarray, dictionary: list[str | None] | list[str]) -> pa.Array:
    """A dictionary<int32, string> array; negative indices and indices of a None entry become nulls."""
    return _dict_indices(indices, _dictionary(dictionary))


_I64 = pa.int64()


def _group_cummax(gi: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Running maximum of ``values`` restarting at each group of the sorted group index ``gi``.

    Values are replaced by their rank, so ``gi * m + rank`` cannot overflow whatever the timestamps.
    """
    u = np.unique(values)
    m = np.int64(u.size)
    key = gi.astype(np.int64) * m + np.searchsorted(u, values)
    return u[np.maximum.accumulate(key) - gi.astype(np.int64) * m]


def _union_len(group: np.ndarray, start: np.ndarray, end: np.ndarray, n_groups: int) -> np.ndarray:
    """Per group: the length of the union of its [start, end] intervals (vectorised).

    Intervals sorted by (group, start); each contributes what lies beyond the furthest end seen so far
    in its group. That running maximum is only needed where an interval overlaps its predecessor
    (rare: an instance's transfer phases are sequential), so it is computed for those groups only.
    """
    out = np.zeros(n_groups, np.int64)
    if not group.size:
        return out
    o = np.lexsort((start, group))
    g, s, e = group[o], start[o], end[o]
    first = np.r_[True, g[1:] != g[:-1]]
    prev_end = np.empty(g.size, np.int64)
    prev_end[1:] = e[:-1]
    prev_end[first] = np.iinfo(np.int64).min
    messy_groups = np.unique(g[(s < prev_end) & ~first])
    if messy_groups.size:
        sel = np.isin(g, messy_groups)
        gi = np.cumsum(first[sel]) - 1
        run = _group_cummax(gi, e[sel])
        pe = np.empty(run.size, np.int64)
        pe[1:] = run[:-1]
        pe[first[sel]] = np.iinfo(np.int64).min
        prev_end[sel] = pe
    contrib = np.clip(e - np.maximum(s, prev_end), 0, None)
    np.add.at(out, g, contrib)
    return out


def _finish(p: _Parser, repair: _NameRepair, end: End, parser_version: str) -> ParsedFile:
    """Close what is open and turn the streamed state into the output tables and diagnostics (``meta`` says
    ``parser_version``: the entry point's ``PARSER_VERSION``)."""
    path = p.path
    dangling = p.close_dangling()
    diags = p.diagnostics
    names = p._name_table()
    epoch_ns = (p.epoch_us or 0) * 1000
    n_ev = sum(c["start"].size for c in p.chunks)

    def shift(a: np.ndarray, sentinel: int = _NO_TS) -> np.ndarray:
        """Add the epoch to the times that are set (in place)."""
        if epoch_ns:
            a[a != sentinel] += epoch_ns
        return a

    kinds = ["compute", "comm", "memory", "cpu_op", "runtime", "annotation", "wait", "queue"]
    kind_of_name = np.array([kinds.index(phase_kind(s)) for s in names] or [0], dtype=np.int32)
    comm_k = kinds.index("comm")

    # ---- instances ----
    st = p.inst
    n_inst = p.n_inst
    i_pid = st.final("pid").astype(np.int64)
    i_seq = st.final("seq")
    neg_start = shift(st.final("neg_start"))
    neg_end = shift(st.final("neg_end"))
    op_name = st.final("op_name").astype(np.int64)
    op_start = shift(st.final("op_start"))
    op_end = shift(st.final("op_end"))
    op_argref = st.final("op_argref")
    i_trunc = st.final("trunc")
    tr_end = shift(st.final("tr_end"))
    has_tr = tr_end != _NO_TS
    tr_start = shift(st.final("tr_start"), _MAX_I64)
    tr_start[~has_tr] = _NO_TS
    if p.comm_parts:
        cg = np.concatenate([c[0] for c in p.comm_parts])
        tr_union = _union_len(cg, np.concatenate([c[1] for c in p.comm_parts]),
                              np.concatenate([c[2] for c in p.comm_parts]), n_inst)
        del cg
    else:
        tr_union = np.zeros(n_inst, np.int64)
    p.comm_parts = []
    n_ticks = st.final("n_ticks")
    first_tick = shift(st.final("first_tick"), _MAX_I64)
    first_tick[n_ticks == 0] = _NO_TS
    last_tick = shift(st.final("last_tick"))
    straggler = st.final("straggler").astype(np.int64)
    straggler[n_ticks < 2] = -1
    p.inst = _Instances()  # the per-instance state is copied out: free its capacity
    del st
    big = _MAX_I64

    # dtype / shape / bytes (parsed once per distinct string)
    dtype_tab: list[str | None] = [None] * len(p.dtypes)
    for k, v in p.dtypes.items():
        dtype_tab[v] = k
    shape_tab: list[str | None] = [None] * len(p.shapes)
    for k, v in p.shapes.items():
        shape_tab[v] = k
    size_tab = np.array([_DTYPE_SIZE.get(d or "", -1) for d in dtype_tab] or [-1], np.int64)
    count_tab = np.array([(c if (c := _shape_count(s)) is not None else -1) for s in shape_tab] or [-1],
                         np.int64)
    arg_dtype = _cat(p.arg_dtype, np.int64)
    arg_shape = _cat(p.arg_shape, np.int64)
    has_args = op_argref >= 0
    i_dtype = np.where(has_args, arg_dtype[np.maximum(op_argref, 0)] if arg_dtype.size else -1, -1)
    i_shape = np.where(has_args, arg_shape[np.maximum(op_argref, 0)] if arg_shape.size else -1, -1)
    i_count = np.where(i_shape >= 0, count_tab[np.maximum(i_shape, 0)], -1)
    i_size = np.where(i_dtype >= 0, size_tab[np.maximum(i_dtype, 0)], -1)
    i_bytes = np.where((i_count >= 0) & (i_size > 0), i_count * np.maximum(i_size, 0), -1)

    # ---- pid dictionaries ----
    pid_of_code = np.empty(len(p.pids), np.int64)
    for pid, code in p.pids.items():
        pid_of_code[code] = pid
    tensor_of_code: list[str | None] = [p.tensor.get(int(pid)) for pid in pid_of_code.tolist()]
    lane_of_code = [f"horovod/{t}" if t is not None else f"horovod/pid {pid}"
                    for t, pid in zip(tensor_of_code, pid_of_code.tolist(), strict=True)]
    tensor_dict = _dictionary(tensor_of_code)
    lane_dict = _dictionary(lane_of_code)

    # ---- ticks (chunks to Arrow, freed as they go) ----
    world = p.max_rank + 1 if p.max_rank >= 0 else None
    n_bad_rank = p.counts.pop("bad_rank")
    tick_cols: dict[str, list[pa.Array]] = {
        k: [] for k in ("instance", "tensor", "rank", "ts_ns", "dur_ignored")}
    while p.tick_chunks:
        t = p.tick_chunks.pop(0)
        tick_cols["instance"].append(_masked(t["inst"], t["inst"] >= 0, pa.int64()))
        tick_cols["tensor"].append(_dict_indices(t["pid"], tensor_dict))
        tick_cols["rank"].append(pa.array(t["rank"]))
        tick_cols["ts_ns"].append(pa.array(shift(t["ts"])))
        tick_cols["dur_ignored"].append(pa.array(t["dur"]))
    tick_types = {"instance": pa.int64(), "tensor": DICT_STR, "rank": pa.int32(), "ts_ns": pa.int64(),
                  "dur_ignored": pa.bool_()}
    ticks = pa.table({k: pa.chunked_array(v, type=tick_types[k]) for k, v in tick_cols.items()})
    del tick_cols

    # ---- collectives ----
    # normalised op per name code (-1: not a collective op, e.g. ERROR or an unknown top level)
    op_tab = list(dict.fromkeys(_OPS.values()))
    op_of_name = np.array([op_tab.index(_OPS[n]) if n in _OPS else -1 for n in names] or [-1], np.int64)
    i_op = np.where(op_name >= 0, op_of_name[np.maximum(op_name, 0)], -1) if n_inst else \
        np.empty(0, np.int64)
    is_coll = i_op >= 0
    coll_id = np.full(n_inst, -1, np.int64)
    coll_id[is_coll] = np.arange(int(is_coll.sum()))
    err = names.index("ERROR") if "ERROR" in p.names else -2
    n_errors = int((op_name == err).sum())

    # ---- fusion groups ----
    fusion = np.full(n_inst, -1, np.int64)
    fusion_size = np.zeros(n_inst, np.int64)
    tr_idx = np.flatnonzero(has_tr)
    if tr_idx.size:
        o = tr_idx[np.lexsort((tr_end[tr_idx], tr_start[tr_idx]))]
        runmax = np.maximum.accumulate(tr_end[o])
        newg = np.r_[True, tr_start[o][1:] > runmax[:-1] + FUSION_TOL_NS]
        gid = np.cumsum(newg) - 1
        fusion[o] = gid
        fusion_size[o] = np.bincount(gid)[gid]

    # ---- iterations (tensor repetition) ----
    inst_start = np.where(neg_start != _NO_TS, neg_start, op_start)
    counts = np.bincount(i_pid, minlength=len(p.pids)) if n_inst else np.zeros(0, np.int64)
    n_max = int(counts.max()) if counts.size else 0
    iter_starts = np.empty(0, np.int64)
    last_end = p.last_end + epoch_ns if n_ev else None
    if n_max >= 2:
        anchor = counts[i_pid] == n_max
        a = np.flatnonzero(anchor & (inst_start != _NO_TS))
        iter_starts = np.full(n_max, big, np.int64)
        np.minimum.at(iter_starts, i_seq[a], inst_start[a])
        iter_starts = np.sort(iter_starts[iter_starts != big])
        method = "tensor-repetition"
    elif n_ev:
        iter_starts = np.array([p.first_start + epoch_ns], np.int64)
        method = "whole-trace"
    else:
        method = "none"
    i_iter = np.full(n_inst, -1, np.int64)
    if iter_starts.size:
        ok = inst_start != _NO_TS
        i_iter[ok] = np.searchsorted(iter_starts, inst_start[ok], side="right") - 1
    iter_end = np.r_[iter_starts[1:], [max(last_end or 0, int(iter_starts[-1]))]] if iter_starts.size \
        else np.empty(0, np.int64)

    # ---- instance-level tables ----
    def ns(a: np.ndarray) -> pa.Array:
        return _masked(a, a != _NO_TS, pa.int64())

    def opt(a: np.ndarray, type_: pa.DataType = _I64) -> pa.Array:
        return _masked(a, a >= 0, type_)

    i_pid_raw = pid_of_code[i_pid] if n_inst else np.empty(0, np.int64)
    neg_wait = np.where((first_tick != _NO_TS), last_tick - first_tick, _NO_TS)
    neg_dur = np.where((neg_start != _NO_TS) & (neg_end != _NO_TS), neg_end - neg_start, _NO_TS)
    instances = pa.table({
        "instance": pa.array(np.arange(n_inst, dtype=np.int64)),
        "pid": pa.array(i_pid_raw),
        "tensor": _dict_array(i_pid, tensor_of_code),
        "lane": _dict_array(i_pid, lane_of_code),
        "seq": pa.array(i_seq),
        "phase": _dict_array(op_name, names),
        "op": _dict_array(i_op, op_tab),
        "collective_id": opt(coll_id),
        "negotiate_start_ns": ns(neg_start),
        "negotiate_end_ns": ns(neg_end),
        "negotiate_ns": ns(neg_dur),
        "ticks": pa.array(n_ticks),
        "first_tick_ns": ns(first_tick),
        "last_tick_ns": ns(last_tick),
        "straggler_rank": opt(straggler, pa.int32()),
        "negotiation_wait_ns": ns(neg_wait),
        "op_start_ns": ns(op_start),
        "op_end_ns": ns(op_end),
        "transfer_start_ns": _masked(tr_start, has_tr, pa.int64()),
        "transfer_end_ns": _masked(tr_end, has_tr, pa.int64()),
        "transfer_ns": _masked(tr_union, has_tr, pa.int64()),
        "dtype": _dict_array(i_dtype, dtype_tab),
        "shape": _dict_array(i_shape, shape_tab),
        "count": opt(i_count),
        "bytes": opt(i_bytes),
        "fusion_group": opt(fusion),
        "fusion_size": _masked(fusion_size, fusion >= 0, pa.int64()),
        "iteration": opt(i_iter),
        "truncated": pa.array(i_trunc),
    })

    ci = np.flatnonzero(is_coll)
    c_bytes = i_bytes[ci].copy()
    rs = i_op[ci] == op_tab.index("reduce_scatter")
    if rs.any():
        c_bytes[rs] = np.where(c_bytes[rs] >= 0, c_bytes[rs] * world, -1) if world else -1
    # by column name (schema.table fills any other column with nulls)
    collectives = schema_table(COLLECTIVES, {
        "rank": pa.array(np.zeros(ci.size, np.int32)),
        "collective_id": pa.array(np.arange(ci.size, dtype=np.int64)),
        "pg": _dict_array(np.zeros(ci.size, np.int32), [FORMAT]).cast(pa.string()),
        "seq": pa.array(i_seq[ci]),
        "op": _dict_array(i_op[ci], op_tab).cast(pa.string()),
        "dtype": _dict_array(i_dtype[ci], dtype_tab).cast(pa.string()),
        "count": opt(i_count[ci]),
        "bytes": opt(c_bytes),
        "nranks": pa.array(np.full(ci.size, world if world is not None else 0, np.int32),
                           mask=np.full(ci.size, world is None)),
        "start_ns": _masked(tr_start[ci], has_tr[ci], pa.int64()),
        "end_ns": _masked(tr_end[ci], has_tr[ci], pa.int64()),
        "lane": _dict_array(i_pid[ci], lane_of_code).cast(pa.string()),
        "source": _dict_array(np.zeros(ci.size, np.int32), [FORMAT]).cast(pa.string()),
        "size_source": pa.array(np.full(ci.size, FORMAT, dtype=object), pa.string(), mask=c_bytes < 0),
    })
    iterations = schema_table(ITERATIONS, {
        "rank": pa.array(np.zeros(iter_starts.size, np.int32)),
        "iteration": pa.array(np.arange(iter_starts.size, dtype=np.int64)),
        "start_ns": pa.array(iter_starts),
        "end_ns": pa.array(iter_end.astype(np.int64)),
        "method": pa.array([method] * iter_starts.size, type=pa.string()),
    })

    cyc = np.sort(_cat(p.cycles, np.int64)) + epoch_ns
    cyc_end = np.r_[cyc[1:], [max(last_end or 0, int(cyc[-1]))]] if cyc.size else np.empty(0, np.int64)
    cycles = pa.table({
        "cycle": pa.array(np.arange(cyc.size, dtype=np.int64)),
        "start_ns": pa.array(cyc),
        "end_ns": pa.array(cyc_end.astype(np.int64)),
    })

    # only what the event rows need from here on
    del neg_start, neg_end, op_start, op_end, op_argref, tr_start, tr_end, tr_union, first_tick, last_tick
    del straggler, n_ticks, i_dtype, i_shape, i_count, i_size, fusion, fusion_size, i_trunc, i_seq, i_pid

    # ---- events table: the batch chunks become Arrow chunks (most columns without a copy) ----
    name_dict = _dictionary(names)
    kind_dict = _dictionary(kinds)
    cat_dict = _dictionary([FORMAT])
    cols: list[list[pa.Array]] = [[] for _ in EVENTS]
    zeros = _Zeros(max((c["start"].size for c in p.chunks), default=0))
    cat_values, _ = cat_dict
    trunc_rows: list[np.ndarray] = []
    row0 = 0
    while p.chunks:
        c = p.chunks.pop(0)
        n = c["start"].size
        inst, top = c.pop("inst"), c.pop("top")
        ok = inst >= 0
        safe = np.maximum(inst, 0)
        kind = kind_of_name[c["name"]]
        bts = np.where(ok & (top | (kind == comm_k)), i_bytes[safe], -1) if n_inst else np.full(n, -1)
        itr = np.where(ok, i_iter[safe], -1) if n_inst else np.full(n, -1)
        cid = np.where(ok, coll_id[safe], -1) if n_inst else np.full(n, -1)
        del inst, top, ok, safe
        if c["truncated"]:
            trunc_rows.append(row0 + np.arange(n, dtype=np.int64))
        row0 += n
        produced = {
            "rank": zeros.values(pa.int32(), n),
            "lane": _dict_indices(c["pid"], lane_dict),
            "kind": _dict_indices(kind, kind_dict),
            "name": _dict_indices(c["name"], name_dict),
            "cat": pa.DictionaryArray.from_arrays(zeros.values(pa.int32(), n), cat_values),
            "start_ns": pa.array(shift(c["start"])),
            "dur_ns": pa.array(c["dur"]),
            "pid": pa.array(pid_of_code[c["pid"]]),
            "bytes": _masked(bts, bts >= 0, pa.int64()),
            "iteration": _masked(itr, itr >= 0, pa.int64()),
            "collective_id": _masked(cid, cid >= 0, pa.int64()),
        }
        for i, f in enumerate(EVENTS):  # by name: any other column of the schema is all null
            cols[i].append(produced[f.name] if f.name in produced else zeros.nulls(f.type, n))
        del c, kind, bts, itr, cid, produced
    events = pa.Table.from_arrays(
        [pa.chunked_array(v, type=f.type) for v, f in zip(cols, EVENTS, strict=True)], schema=EVENTS)
    del cols
    rows = _cat(trunc_rows, np.int64)
    flags = pa.table({
        "row": pa.array(rows),
        "flag": _dict_indices(np.zeros(rows.size, np.int32), _dictionary(["truncated"])),
    })

    # ---- diagnostics ----
    c = p.counts
    lost = end.bytes_lost
    lost_at = repair.to_input(end.lost_offset) if end.lost_offset is not None else None
    if repair.stream_error is not None:
        diags.append(Diagnostic(path, f"{repair.stream_error.message}; parsed what inflated",
                                offset=repair.stream_error.offset))
    if lost:
        diags.append(Diagnostic(path, f"timeline cut mid-record: {lost} bytes after the last complete "
                                "record were dropped", offset=lost_at))
    msgs = [
        ("e_without_b", "E record(s) without a matching B (dropped)"),
        ("x_without_b", "rank tick(s) outside a NEGOTIATE phase (kept, without instance)"),
        ("bogus_dur", "rank tick(s) with a non-zero dur (Horovod writes 0; ignored)"),
        ("no_pid", "B/E/X record(s) without a pid (dropped)"),
        ("no_ts", "B/E/X record(s) without a usable ts (dropped)"),
        ("unknown_ph", "record(s) with an unknown ph (ignored)"),
        ("unknown_instants", "instant record(s) other than CYCLE_START (ignored)"),
        ("pair_anomalies", "E record(s) that could not be paired (dropped)"),
        ("name_conflicts", "pid(s) named twice with different tensor names (first kept)"),
        ("header_conflicts", "extra epoch header(s) with another start time (first kept)"),
        ("bad_epoch", "epoch header(s) with a start time beyond the year 2116 (ignored: the clock stays relative)"),
        ("repaired_utf8", "record(s) with invalid UTF-8 (the bad bytes read as U+FFFD)"),
    ]
    for key, text in msgs:
        if c[key]:
            diags.append(Diagnostic(path, f"{c[key]} {text}"))
    if c["skipped_records"] > 5:
        diags.append(Diagnostic(path, f"{c['skipped_records']} records were not valid JSON (skipped)"))
    if dangling:
        diags.append(Diagnostic(path, f"{dangling} phase(s) never ended; closed at the last event "
                                "timestamp and flagged truncated"))
    if n_bad_rank:
        diags.append(Diagnostic(path, f"{n_bad_rank} X record(s) not named by a rank (ignored)"))
    if repair.repaired:
        diags.append(Diagnostic(path, f"{repair.repaired} tensor name(s) written without JSON escaping "
                                "(read up to the closing '\"}}')", level="info"))
    if n_errors:
        diags.append(Diagnostic(path, f"{n_errors} ERROR response(s) (no collective row)"))

    era = ">=0.20.1" if p.epoch_us is not None else "<=0.20.0"
    complete = lost == 0 and repair.stream_error is None and (end.array_closed or era == "<=0.20.0")
    if not end.array_closed and era == ">=0.20.1" and not lost:
        diags.append(Diagnostic(path, "the array is not closed (the writer stopped before its ']')"))
    meta: dict[str, Any] = {
        "format": FORMAT,
        "format_version": era,
        "parser_version": parser_version,
        "rank": 0,
        "clock": "epoch" if p.epoch_us is not None else "relative_unknown",
        "start_time_since_epoch_us": p.epoch_us,
        "array_closed": end.array_closed,
        "records": p.records,
        "tensors": len(p.pids),
        "instances": n_inst,
        "world_size": world,
        "iteration_method": method,
        "cycles": int(cyc.size),
        "dangling": dangling,
        "repaired_names": repair.repaired,
        "errors": n_errors,
        **{k: v for k, v in c.items()},
    }
    return ParsedFile(
        path=path,
        format=FORMAT,
        events=events,
        collectives=collectives,
        tables={
            "horovod_ticks": ticks,
            "horovod_instances": instances,
            "horovod_iterations": iterations,
            "horovod_cycles": cycles,
            "horovod_flags": flags,
        },
        meta=meta,
        diagnostics=diags,
        bytes_lost=lost,
        complete=complete,
    )
