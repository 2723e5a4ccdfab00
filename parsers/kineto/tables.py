"""The Kineto parser's last step: the accumulated columns → the events, collectives and metadata tables
(kinds, lanes, iterations, the clock base, the writer's era)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.model import schema
from tracekit.model.diagnostics import Diagnostic
from tracekit.model.schema import ParsedFile

from .. import json_stream
from ..ints import int_in, within
from ..json_stream import End
from ..timestamps import us_text_to_ns
from . import comms
from .columns import _columns
from .records import (
    CPU_OP_CATS,
    DEVICE_CATS,
    KERNEL_CATS,
    KNOWN_CATS,
    MAX_NS,
    MEMORY_CATS,
    NCCL_KERNEL,
    RUNTIME_CATS,
    STEP,
    Event,
    _Accumulator,
)


def _classify(cat: str | None, name: str | None) -> str:
    """Event kind of DESIGN.md from the category and name."""
    name = name or ""
    if cat in KERNEL_CATS:
        if name.startswith(("Memcpy", "Memset")):  # legacy lists put copies among "CUDA functions"
            return "memory"
        return "comm" if NCCL_KERNEL.match(name) else "compute"
    if cat in MEMORY_CATS:
        return "memory"
    if cat in RUNTIME_CATS:
        return "runtime"
    if cat in CPU_OP_CATS:
        return "annotation" if STEP.match(name) else "cpu_op"
    if cat in ("user_annotation", "User"):
        # gloo work on its worker threads is the communication of CPU-only jobs
        return "comm" if name.startswith("gloo:") else "annotation"
    return "annotation"


def _lane_keys(device: np.ndarray, stream: np.ndarray, tid: np.ndarray, on_device: np.ndarray,
               pid_valid: np.ndarray) -> np.ndarray:
    """One int64 key per lane: ``gpu{device}/stream{stream}`` for device activity, ``cpu/tid {tid}`` on a
    CPU thread, ``trace`` for the profiler's own spans (string pids)."""
    code = np.where(on_device, 1, np.where(pid_valid, 0, 2)).astype(np.int64)
    value = np.where(on_device, stream, np.where(pid_valid, tid, 0)) & ((1 << 46) - 1)
    return (code << 62) | ((np.where(on_device, device, 0) & 0xFFFF) << 46) | value


def _lane_label(k: int) -> str:
    c, d, v = k >> 62, (k >> 46) & 0xFFFF, k & ((1 << 46) - 1)
    v = v - (1 << 46) if v >= 1 << 45 else v  # negative ids (stream -1 of device-wide syncs)
    return f"gpu{d}/stream{v}" if c == 1 else f"cpu/tid {v}" if c == 0 else "trace"


_COMM = schema.KINDS.index("comm")
_RUNTIME = schema.KINDS.index("runtime")
_KIND_DICT = pa.array(schema.KINDS, pa.string())


class _Chunk:
    """One raw chunk, classified: the rows kept, their absolute start, kind and lane codes."""

    def __init__(self, raw: pa.Table, start: np.ndarray, kind: np.ndarray, lane: np.ndarray,
                 on_device: np.ndarray, device: np.ndarray, stream: np.ndarray, cat_idx: np.ndarray) -> None:
        self.raw, self.start, self.kind, self.lane = raw, start, kind, lane
        self.on_device, self.device, self.stream, self.cat_idx = on_device, device, stream, cat_idx


class _Finisher:
    """Turns raw chunks into events tables that share one set of dictionaries (name, cat, kind, lane),
    so chunks can be written one by one (bounded memory) or as one table, with the same result."""

    def __init__(self, acc: _Accumulator, base_ns: int | None) -> None:
        self.acc = acc
        self.base_ns = base_ns
        cats = acc.cats.values
        self.cat_vals = [*cats, None]
        self.name_vals = [*acc.names.values, None]
        self.on_device_cat = np.array([c in DEVICE_CATS for c in self.cat_vals], dtype=bool)
        self.span_cat = np.array([c == "Trace" for c in self.cat_vals], dtype=bool)
        self.unknown_cat = np.array([c not in KNOWN_CATS for c in cats] + [False], dtype=bool)
        self._kind_of: dict[int, int] = {}
        self.lane_code: dict[int, int] = {}
        self.lane_labels: list[str] = []
        self.name_dict = acc.names.arrow()
        self.cat_dict = acc.cats.arrow()
        self._lane_dict: pa.Array | None = None

    def _kinds(self, pair: np.ndarray) -> np.ndarray:
        """Kind codes, classified once per unique (cat, name) pair of the whole file (pairs found by hashing,
        in one pass)."""
        width = len(self.name_vals)
        enc = pa.array(pair).dictionary_encode()
        uniq = enc.dictionary.to_numpy()
        codes = np.empty(uniq.size, dtype=np.int32)
        for i, p in enumerate(uniq.tolist()):
            k = self._kind_of.get(p)
            if k is None:
                k = self._kind_of[p] = schema.KINDS.index(_classify(self.cat_vals[p // width],
                                                                    self.name_vals[p % width]))
            codes[i] = k
        return codes[enc.indices.to_numpy()]

    def chunk(self, raw: pa.Table | pa.RecordBatch) -> tuple[_Chunk, int]:
        """Classify one raw chunk; returns it and how many rows fell outside the time range."""
        dropped = 0
        start = raw.column("start_ns").to_numpy()
        if self.base_ns is not None:
            ok = _in_range(start, self.base_ns)
            if not ok.all():
                dropped = int((~ok).sum())
                raw = raw.filter(pa.array(ok))
                start = raw.column("start_ns").to_numpy()
            start = start + np.int64(self.base_ns)
        n_cat, n_name = len(self.cat_vals) - 1, len(self.name_vals) - 1
        cat_idx = pc.fill_null(raw.column("cat"), n_cat).to_numpy(zero_copy_only=False).astype(np.int64)
        name_idx = pc.fill_null(raw.column("name"), n_name).to_numpy(zero_copy_only=False).astype(np.int64)
        kind = self._kinds(cat_idx * (n_name + 1) + name_idx) if len(raw) else np.zeros(0, np.int32)
        on_device = self.on_device_cat[cat_idx]
        pid = raw.column("pid")
        tid = raw.column("tid")
        tid_np = pc.fill_null(tid, -1).to_numpy(zero_copy_only=False)
        dev = pc.fill_null(pc.coalesce(raw.column("arg_device"), pid), -1).to_numpy(zero_copy_only=False)
        stream = pc.fill_null(pc.coalesce(raw.column("arg_stream"), tid), -1).to_numpy(zero_copy_only=False)
        dev = np.where(on_device & (dev < 0), 0, dev)  # legacy lists name no device
        # cuda_sync rows sit at tid = stream + 1e6 in 2026 writers; the stream arg is authoritative.
        # The profiler's own spans (string pids like "Spans"/"Traces") get a lane of their own.
        on_thread = ~self.span_cat[cat_idx] & (pc.is_valid(pid).to_numpy(zero_copy_only=False) |
                                               pc.is_valid(tid).to_numpy(zero_copy_only=False))
        keys = _lane_keys(dev, stream, tid_np, on_device, on_thread)
        # new codes in order of first appearance: a dictionary encoding of the keys (by hashing) gives that order
        enc = pa.array(keys).dictionary_encode()
        uniq = enc.dictionary.to_pylist()
        mapping = np.empty(len(uniq), dtype=np.int32)
        for j, k in enumerate(uniq):
            c = self.lane_code.get(k)
            if c is None:
                c = self.lane_code[k] = len(self.lane_labels)
                self.lane_labels.append(_lane_label(k))
                self._lane_dict = None
            mapping[j] = c
        lane = mapping[enc.indices.to_numpy()] if uniq else np.zeros(0, np.int32)
        return _Chunk(raw, start, kind, lane, on_device, dev, stream, cat_idx), dropped

    def events(self, ch: _Chunk, collective_id: pa.Array | None = None) -> pa.Table:
        """The EVENTS table of a classified chunk (rank and iteration null)."""
        if self._lane_dict is None:
            self._lane_dict = pa.array(self.lane_labels, pa.string())
        raw = ch.raw
        n = len(raw)
        dev_ok = ch.on_device & within(ch.device)

        def dictionary(codes: pa.Array | np.ndarray, values: pa.Array) -> pa.DictionaryArray:
            idx = codes if isinstance(codes, pa.Array) else pa.array(codes, pa.int32())
            return pa.DictionaryArray.from_arrays(idx, values)

        cols = {
            "rank": pa.nulls(n, pa.int32()),
            "lane": dictionary(ch.lane, self._lane_dict),
            "kind": dictionary(ch.kind, _KIND_DICT),
            "name": dictionary(_chunk_array(raw.column("name")), self.name_dict),
            "cat": dictionary(_chunk_array(raw.column("cat")), self.cat_dict),
            "start_ns": pa.array(ch.start, pa.int64()),
            "dur_ns": _chunk_array(raw.column("dur_ns")),
            "pid": _chunk_array(raw.column("pid")),
            "tid": _chunk_array(raw.column("tid")),
            "device": pa.array(np.where(dev_ok, ch.device, 0).astype(np.int32), mask=~dev_ok),
            "stream": pa.array(ch.stream, pa.int64(), mask=~ch.on_device),
            "correlation": _chunk_array(raw.column("correlation")),
            "external_id": _chunk_array(raw.column("external_id")),
            "bytes": _chunk_array(raw.column("bytes")),
            "sync_stream": _chunk_array(raw.column("sync_stream")),
            "sync_correlation": _chunk_array(raw.column("sync_correlation")),
            "iteration": pa.nulls(n, pa.int64()),
            "collective_id": collective_id if collective_id is not None else pa.nulls(n, pa.int64()),
        }
        return pa.Table.from_arrays([cols[f.name] for f in schema.EVENTS], schema=schema.EVENTS)


def _collective_ids(idx: np.ndarray, coll_index: np.ndarray, coll_ids: np.ndarray) -> pa.Array:
    """The ``collective_id`` column of rows at file positions ``idx``: ``coll_ids[i]`` where ``coll_index[i]``
    (ascending) is the row's position, null elsewhere. The few collectives are looked up among the rows when those
    are in file order (as parsed: one search per collective, not one per row), else each row among the collectives."""
    n = idx.size
    if n < 2 or bool(np.all(idx[1:] > idx[:-1])):
        pos = np.minimum(np.searchsorted(idx, coll_index), max(n - 1, 0))
        found = idx[pos] == coll_index if n else np.zeros(coll_index.size, bool)
        rows = pos[found][::-1]  # reversed: of a position named twice, the first id is written last and kept
        values = np.zeros(n, np.int64)
        values[rows] = coll_ids[found][::-1]
        valid = np.zeros(n, bool)
        valid[rows] = True
        bitmap = np.packbits(valid, bitorder="little")
        return pa.Array.from_buffers(pa.int64(), n, [pa.py_buffer(bitmap), pa.py_buffer(values)],
                                     null_count=n - int(np.count_nonzero(valid)))
    pos = np.minimum(np.searchsorted(coll_index, idx), coll_index.size - 1)
    hit = coll_index[pos] == idx
    return pa.array(np.where(hit, coll_ids[pos], 0), pa.int64(), mask=~hit)


def _chunk_array(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    return col


def _finish(acc: _Accumulator, members: dict[str, Any], members_after: set[str], end: End,
            spill_dir: str | None = None) -> ParsedFile:
    path = acc.path
    diags: list[Diagnostic] = []
    base_ns = _base_ns(members, diags, path)
    fin = _Finisher(acc, base_ns)
    # pass 1: lanes and kinds of every row, the rows the collectives table needs (communication
    # activity and the ops whose args describe it), and the correlation ids of communication
    meta_index = np.unique(np.array([r["_index"] for r in acc.comm_rows], dtype=np.int64))
    parts: list[pa.Table] = []
    comm_corr: list[np.ndarray] = []
    unknown = np.zeros(len(fin.cat_vals), dtype=np.int64)
    # in memory, the classified chunks of pass 1 serve passes 2 and 3 too; spilled, each pass re-reads them
    kept: list[_Chunk] | None = [] if acc.spill_path is None else None

    def classified() -> Iterator[_Chunk]:
        if kept is not None:
            yield from kept
            return
        for raw in acc.chunks():
            yield fin.chunk(raw)[0]

    for raw in acc.chunks():
        ch, dropped = fin.chunk(raw)
        if kept is not None:
            kept.append(ch)
        acc.dropped += dropped
        unknown += np.bincount(ch.cat_idx[fin.unknown_cat[ch.cat_idx]], minlength=len(fin.cat_vals))
        is_comm = ch.kind == _COMM
        keep = is_comm | np.isin(ch.raw.column("_index").to_numpy(), meta_index)
        if keep.any():
            parts.append(pa.table(ch.raw).filter(pa.array(keep)))
        corr = pc.drop_null(_chunk_array(ch.raw.column("correlation")).filter(pa.array(is_comm)))
        comm_corr.append(corr.to_numpy(zero_copy_only=False))
    for i in np.flatnonzero(unknown):
        acc.unknown_cats[fin.cat_vals[i]] = int(unknown[i])  # type: ignore[index]
    # pass 2 (only with communication): the launches of communication kernels
    corr_set = np.unique(np.concatenate(comm_corr)) if comm_corr else np.zeros(0, np.int64)
    if corr_set.size:
        for ch in classified():
            corr = pc.fill_null(ch.raw.column("correlation"), -1).to_numpy(zero_copy_only=False)
            idx = ch.raw.column("_index").to_numpy()
            launch = (ch.kind == _RUNTIME) & pc.is_in(corr, value_set=pa.array(corr_set)).to_numpy(
                zero_copy_only=False) & ~np.isin(idx, meta_index)
            if launch.any():
                parts.append(pa.table(ch.raw).filter(pa.array(launch)))
    # the collectives table, from those few rows in file order
    collectives = schema.empty(schema.COLLECTIVES)
    coll_index = coll_ids = np.zeros(0, np.int64)
    if parts:
        reduced = pa.concat_tables(parts)
        reduced = reduced.take(pa.array(np.argsort(reduced.column("_index").to_numpy(), kind="stable")))
        rch, _ = fin.chunk(reduced)
        r_index = rch.raw.column("_index").to_numpy()
        collectives, ids = comms.collectives(fin.events(rch), r_index, acc.comm_rows, members)
        if ids is not None:
            valid = pc.is_valid(ids).to_numpy(zero_copy_only=False)
            coll_index = r_index[valid]
            coll_ids = pc.fill_null(ids, -1).to_numpy(zero_copy_only=False)[valid]
    # pass 3: the events themselves, with their collective ids
    events_file = os.path.join(spill_dir, "events.arrow") if spill_dir else None
    tables: list[pa.Table] = []
    writer = sink = None
    n_events = 0
    try:
        for ch in classified():
            cid = _collective_ids(ch.raw.column("_index").to_numpy(), coll_index, coll_ids) if coll_index.size \
                else None
            ev = fin.events(ch, cid)
            n_events += ev.num_rows
            if events_file is None:
                tables.append(ev)
                continue
            if writer is None:
                sink = pa.OSFile(events_file, "wb")
                writer = pa.ipc.new_file(sink, schema.EVENTS)
            writer.write_table(ev, max_chunksize=1 << 20)
    finally:
        if writer is not None:
            writer.close()
        if sink is not None:
            sink.close()
        if acc.spill_path and os.path.exists(acc.spill_path):
            os.unlink(acc.spill_path)
    if events_file is None:
        events = pa.concat_tables(tables) if len(tables) > 1 else tables[0] if tables else schema.empty(schema.EVENTS)
        events = events.combine_chunks() if events.num_rows else events
    elif writer is None:
        events = schema.empty(schema.EVENTS)
        events_file = None
    else:
        events = pa.ipc.open_file(pa.memory_map(events_file, "r")).read_all()
    meta = _meta(acc, members, members_after, base_ns)
    diags.extend(Diagnostic(path, note) for note in acc.notes)
    complete = end.complete and (acc.window_end or "traceName" in members)
    if acc.dropped:
        diags.append(Diagnostic(path, f"{acc.dropped} events without a readable timestamp skipped"))
    if acc.n_bad:
        first = acc.bad_records[0]
        diags.append(Diagnostic(path, f"{acc.n_bad} unreadable records skipped "
                                f"(first: {first[1]})", offset=first[0]))
    if acc.repaired_utf8:
        diags.append(Diagnostic(path, f"{acc.repaired_utf8} invalid UTF-8 bytes replaced by U+FFFD"))
    if acc.repaired_nonfinite:
        diags.append(Diagnostic(path, f"{acc.repaired_nonfinite} non-finite numbers (inf/nan) read as null"))
    if acc.repaired_names:
        diags.append(Diagnostic(path, f"{acc.repaired_names} names with unescaped quotes repaired"))
    if acc.unknown_cats:
        shown = ", ".join(f"{k!r} ({v})" for k, v in sorted(acc.unknown_cats.items())[:5])
        diags.append(Diagnostic(path, f"unknown categories kept as annotations: {shown}"))
    if end.skipped:
        diags.append(Diagnostic(path, f"{end.skipped} records larger than {json_stream.MAX_RECORD_BYTES >> 20} MiB "
                                      f"skipped ({end.skipped_bytes} bytes)", offset=end.skipped_offset))
    if not end.complete:
        what = end.reason or "document cut"
        diags.append(Diagnostic(path, f"truncated ({what}): kept {n_events} complete events; the file ends "
                                f"{end.bytes_lost} bytes into the next one (what followed is missing)",
                                offset=end.lost_offset))
    elif not complete:
        diags.append(Diagnostic(path, "no 'Record Window End' marker: the capture may be incomplete"))
    return ParsedFile(path=path, format="kineto", events=events, collectives=collectives,
                      meta=meta, diagnostics=diags, bytes_lost=end.bytes_lost, complete=complete,
                      events_file=events_file)


def _base_ns(members: dict[str, Any], diags: list[Diagnostic], path: str) -> int | None:
    """``baseTimeNanoseconds`` when it is an integer within ±:data:`MAX_NS` (else ignored, with a warning)."""
    base = members.get("baseTimeNanoseconds")
    if base is None:
        return None
    if isinstance(base, int) and not isinstance(base, bool) and -MAX_NS <= base <= MAX_NS:
        return base
    diags.append(Diagnostic(path, f"baseTimeNanoseconds {str(base)[:40]!r} is not a time; timestamps kept "
                                  "as they are"))
    return None


def _in_range(start: np.ndarray, base_ns: int) -> np.ndarray:
    """Rows whose ``start + base_ns`` stays within ±:data:`MAX_NS` (computed without overflowing)."""
    lo = max(-MAX_NS - base_ns, -(2**63))
    hi = min(MAX_NS - base_ns, 2**63 - 1)
    return (start >= lo) & (start <= hi)


def _append_begin_end(acc: _Accumulator) -> None:
    """Pair B/E events (not Kineto's own, but accepted) per (pid, tid) into complete events, added
    after every other batch."""
    stacks: dict[tuple[Any, Any], list[Event]] = {}
    rows: list[Event] = []
    ends: list[Any] = []
    for e in acc.be_events:
        try:
            key = (e.pid, e.tid)
            hash(key)
        except TypeError:  # lists or objects as pid/tid
            key = (repr(e.pid), repr(e.tid))
        if e.ph == "B":
            stacks.setdefault(key, []).append(e)
        elif stacks.get(key):
            b = stacks[key].pop()
            rows.append(b)
            ends.append(e.ts)
    if not rows:
        return
    s, _ = us_text_to_ns([r.ts for r in rows])
    t, _ = us_text_to_ns(ends)
    xs = [Event(ph="X", cat=r.cat or "user_annotation", name=r.name, pid=r.pid, tid=r.tid, ts=r.ts,
                dur=float(max(0, int(b - a))) / 1000.0, args=r.args) for r, a, b in zip(rows, s, t, strict=True)]
    _columns(acc, xs)


def _meta(acc: _Accumulator, members: dict[str, Any], members_after: set[str], base_ns: int | None
          ) -> dict[str, Any]:
    """What the file says about itself: rank, job, host, era."""
    info = members.get("distributedInfo") if isinstance(members.get("distributedInfo"), dict) else {}
    meta: dict[str, Any] = {}
    # only values of the right type and range: they become int32/string columns of the ranks table
    meta["rank"] = int_in(info.get("rank"), 0)
    if info.get("rank") is not None and meta["rank"] is None:
        acc.notes.append(f"distributedInfo.rank {str(info.get('rank'))[:40]!r} is not a rank; ignored")
    for key in ("world_size", "pg_count"):
        if int_in(info.get(key), 1) is not None:
            meta[key] = info[key]
    for key in ("backend", "nccl_version"):
        if isinstance(info.get(key), str):
            meta[key] = info[key]
    if isinstance(info.get("pg_config"), list):
        meta["pg_config"] = info["pg_config"]
    meta["host"] = members.get("host_name") if isinstance(members.get("host_name"), str) else None
    meta["base_time_ns"] = base_ns
    meta["trace_name"] = members.get("traceName") if isinstance(members.get("traceName"), str) else None
    devices = members.get("deviceProperties")
    if isinstance(devices, list):
        meta["devices"] = [d.get("name") for d in devices if isinstance(d, dict)]
    process_names = {}
    thread_names = {}
    for name, pid, tid, label in acc.meta_records:
        if name == "process_name" and isinstance(label, str):
            process_names[str(pid)] = label
        elif name == "thread_name" and isinstance(label, str):
            thread_names[f"{pid}/{tid}"] = label
    meta["thread_names"] = thread_names
    meta["process_names"] = process_names
    meta["format_version"] = _era(acc, members, members_after, base_ns)
    return meta


def _era(acc: _Accumulator, members: dict[str, Any], members_after: set[str], base_ns: int | None) -> str:
    """A human description of the writer era (FORMATS.md §1.10)."""
    if not members and not acc.meta_records and acc.n:
        return "legacy event list (PyTorch <= 1.7)"
    if base_ns is not None:
        if "baseTimeNanoseconds" in members_after:
            return "relative µs + baseTimeNanoseconds after traceEvents (Kineto 2024-05..2025-02, PyTorch 2.4-2.6)"
        return "relative µs + baseTimeNanoseconds before traceEvents (Kineto 2025-03+, PyTorch >= 2.7)"
    if acc.has_fraction:
        return "absolute fractional µs (Kineto 2024-03/04, PyTorch 2.3)"
    return "absolute integer µs (Kineto <= 2024-02, PyTorch <= 2.2)"

