"""PyTorch profiler (Kineto) Chrome-trace JSON → tracekit tables, every era of FORMATS.md §1.

The file streams through :mod:`json_stream` in batches; each batch is decoded by msgspec into typed
structs (no per-event dicts), turned into Arrow columns, and classified per *unique* (category, name)
pair rather than per event. Timestamps go from the decimal text to int64 ns without a float
round-trip (:mod:`timestamps`); ``baseTimeNanoseconds`` is applied at the end because writers before
2025-03 put it after ``traceEvents``. Collective metadata is collected for the few events that carry
it and linked to communication activity in :mod:`kineto_comms`.
"""

from __future__ import annotations

import gc
import io
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from itertools import compress, repeat
from operator import attrgetter, is_
from typing import Any, Union

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
from msgspec.structs import astuple

from tracekit.model import schema
from tracekit.model.diagnostics import Diagnostic, TraceError
from tracekit.model.schema import ParsedFile, clean_text

from . import json_stream, kineto_comms
from .json_stream import Batch, End, Member, stream_array
from .source import Blocks, is_gzip
from .timestamps import us_text_to_ns

PARSER_VERSION = "kineto-3"
#: bytes of records decoded at once: the typed structs of a batch this size stay in the CPU's caches while they
#: are moved into columns (4 MB batches parse ~20 % slower)
BATCH_BYTES = 512 << 10

#: categories of activity recorded on a device (classify by category, never by pid: pids collide)
DEVICE_CATS = frozenset({"kernel", "Kernel", "gpu_memcpy", "gpu_memset", "Memcpy", "Memset",
                         "gpu_user_annotation", "cuda_sync", "mtia_ccp_events"})
KERNEL_CATS = frozenset({"kernel", "Kernel"})
MEMORY_CATS = frozenset({"gpu_memcpy", "gpu_memset", "Memcpy", "Memset"})
RUNTIME_CATS = frozenset({"cuda_runtime", "Runtime", "cuda_driver", "cuda_sync", "xpu_runtime",
                          "mtia_runtime", "privateuse1_runtime"})
CPU_OP_CATS = frozenset({"cpu_op", "Operator"})
ANNOTATION_CATS = frozenset({"user_annotation", "User", "gpu_user_annotation", "python_function",
                             "Trace", "cpu_instant_event", "ac2g", "fwdbwd", "async", "async_gpu",
                             "async_cpu_to_gpu", "overhead", "Overhead", "python_function_call"})
KNOWN_CATS = DEVICE_CATS | RUNTIME_CATS | CPU_OP_CATS | ANNOTATION_CATS

#: NCCL/RCCL kernels of every naming era (FORMATS.md §1.7)
NCCL_KERNEL = re.compile(
    r"^(?:void\s+)?(?:(?:ncclDevKernel|ncclSymkDevKernel|ncclKernel)_(?P<func>AllReduce|AllGather|"
    r"ReduceScatter|Broadcast|Reduce|SendRecv|AllGatherV|Generic|AlltoAll|Gather|Scatter)(?P<rest>\w*)"
    r"|nccl(?P<oldfunc>AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|SendRecv)"
    r"(?:Ring|Tree|CollNet)?(?:LL128|LL)?Kernel_(?P<oldrest>\w+))\(?")
STEP = re.compile(r"ProfilerStep\s*#\s*(\d+)")
_NONFINITE = re.compile(rb"(?<=[:\[,])(\s*)-?(?:inf|Infinity|nan|NaN)(?=\s*[,}\]])")
_UNESCAPED_NAME = re.compile(
    rb'("name"\s*:\s*")(.*?)("\s*,\s*"(?:ph|cat|pid|tid|ts|dur|args|id|s|bp|name)"\s*:)', re.S)


class Args(msgspec.Struct, frozen=True, gc=False, rename={
    "external_id": "External id", "external_id_legacy": "external id",
    "collective": "Collective name", "in_nelems": "In msg nelems", "out_nelems": "Out msg nelems",
    "in_size": "In msg size", "out_size": "Out msg size", "group_size": "Group size",
    "pg_name": "Process Group Name", "pg_desc": "Process Group Description", "pg_id": "Process Group ID",
    "pg_ranks": "Process Group Ranks", "seq": "Seq", "comms_id": "Comms Id", "comm_rank": "Rank",
    "src_rank": "Src Rank", "dst_rank": "Dst Rank", "input_dims": "Input Dims",
    "input_dims_legacy": "Input dims", "input_type": "Input type", "label_name": "name",
    "wait_stream": "wait_on_stream", "wait_correlation": "wait_on_cuda_event_record_corr_id",
}):
    """The ``args`` members tracekit uses; unknown members are skipped by the decoder."""

    external_id: Any = None
    external_id_legacy: Any = None
    correlation: Any = None
    device: Any = None
    stream: Any = None
    bytes: Any = None
    collective: Any = None
    dtype: Any = None
    in_nelems: Any = None
    out_nelems: Any = None
    in_size: Any = None
    out_size: Any = None
    group_size: Any = None
    pg_name: Any = None
    pg_desc: Any = None
    pg_id: Any = None
    pg_ranks: Any = None
    seq: Any = None
    comms_id: Any = None
    comm_rank: Any = None
    src_rank: Any = None
    dst_rank: Any = None
    input_dims: Any = None
    input_dims_legacy: Any = None
    input_type: Any = None
    label_name: Any = None
    labels: Any = None
    wait_stream: Any = None
    wait_correlation: Any = None


NO_ARGS = Args()
_LEGACY_PID_CATS = {"CPU functions": "cpu_op", "CUDA functions": "kernel"}
EMPTY_RAW = msgspec.Raw(b"")


class Event(msgspec.Struct, gc=False):
    """One trace event; ``ts`` is kept as raw text for an exact conversion."""

    ph: Any = ""
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: msgspec.Raw = EMPTY_RAW
    dur: Any = None
    args: Args = NO_ARGS


_DECODE = msgspec.json.Decoder(list[Event])
_DECODE_ONE = msgspec.json.Decoder(Event)
#: what decoding hostile input can raise: bad JSON, wrong types, invalid UTF-8, nesting too deep
DECODE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError, ValueError,
                 TypeError)
#: timestamps and durations beyond ±2^62 ns (146 years) are not times: they are dropped as unreadable,
#: which also keeps every ``start + dur`` inside int64
MAX_NS = 1 << 62
MAX_DUR_NS = 1 << 61
#: args copied for events that may carry collective metadata
COMM_ARG_FIELDS = ("collective", "dtype", "in_nelems", "out_nelems", "in_size", "out_size", "group_size",
                   "pg_name", "pg_desc", "pg_id", "pg_ranks", "seq", "comms_id", "comm_rank", "src_rank",
                   "dst_rank", "input_dims", "input_dims_legacy", "input_type")


def sniff(head: bytes) -> bool:
    """A Kineto trace: a JSON object with ``traceEvents``, or a legacy event array with categories."""
    text = head.lstrip()
    if text.startswith(b"{"):
        # the header may outgrow the sniffed head (pg_config of thousands of ranks): its keys are enough
        return any(k in head for k in (b'"traceEvents"', b'"schemaVersion"', b'"distributedInfo"',
                                       b'"deviceProperties"'))
    if text.startswith(b"["):
        return (b'"cat"' in head and b'"ph"' in head) or b'CPU functions' in head or \
            b'CUDA functions' in head
    return False


class _Strings:
    """A dictionary of strings shared by every batch of a file: codes are assigned in order of first
    appearance and never change, so per-batch dictionaries are unified as batches come, without ever
    holding all batches."""

    def __init__(self) -> None:
        self.code: dict[str, int] = {}
        self.values: list[str] = []
        self._hot: list[bool] = []
        self._hot_arr = np.zeros(1, dtype=bool)

    def encode(self, col: pa.Array) -> pa.Array:
        """A string or dictionary column as int32 codes into this dictionary (nulls stay null)."""
        arr = col if pa.types.is_dictionary(col.type) else col.dictionary_encode()
        local = arr.dictionary.to_pylist()
        mapping = np.empty(len(local) + 1, dtype=np.int32)
        for i, v in enumerate(local):
            c = self.code.get(v)
            if c is None:
                c = self.code[v] = len(self.values)
                self.values.append(v)
            mapping[i] = c
        mapping[-1] = -1
        idx = pc.fill_null(arr.indices, len(local)).to_numpy(zero_copy_only=False)
        codes = mapping[idx]
        return pa.array(codes, mask=codes < 0)

    def codes_of(self, values: list[str]) -> np.ndarray:
        """This dictionary's code of each of ``values`` (a part's dictionary), new strings added in order."""
        out = np.empty(len(values), dtype=np.int32)
        for i, v in enumerate(values):
            c = self.code.get(v)
            if c is None:
                c = self.code[v] = len(self.values)
                self.values.append(v)
            out[i] = c
        return out

    def comm_flags(self) -> np.ndarray:
        """Per code, whether the string may name an event carrying collective metadata (:func:`_may_carry_comm`),
        plus a last False for null."""
        if len(self._hot) < len(self.values):
            self._hot.extend(_may_carry_comm(v) for v in self.values[len(self._hot):])
            self._hot_arr = np.array([*self._hot, False], dtype=bool)
        return self._hot_arr

    def arrow(self) -> pa.Array:
        return pa.array(self.values, pa.string())


#: the raw columns of one batch, as spilled: strings are codes into the file's :class:`_Strings`
RAW = pa.schema([("cat", pa.int32()), ("name", pa.int32()), ("start_ns", pa.int64()), ("dur_ns", pa.int64()),
                 ("pid", pa.int64()), ("tid", pa.int64()), ("arg_device", pa.int64()), ("arg_stream", pa.int64()),
                 ("correlation", pa.int64()), ("external_id", pa.int64()), ("bytes", pa.int64()),
                 ("sync_stream", pa.int64()), ("sync_correlation", pa.int64()), ("_index", pa.int64())])


class _Accumulator:
    """Collects per-batch columns and the few facts the whole file contributes.

    Raw batches go to memory, or — when parsing with a spill directory — to an Arrow IPC file on disk
    as they come, so that a file of any size is parsed in bounded memory (:func:`parse`)."""

    def __init__(self, path: str, spill_dir: str | None = None) -> None:
        self.path = path
        self.batches: list[pa.RecordBatch] = []
        self.cats = _Strings()
        self.names = _Strings()
        self.spill_path = os.path.join(spill_dir, "raw.arrow") if spill_dir else None
        self._spill: Any = None
        self.n_spilled_batches = 0
        self.comm_rows: list[dict[str, Any]] = []
        self.n = 0  # events kept so far
        self.dropped = 0
        self.bad_records: list[tuple[int, str]] = []  # the first few, with where they were
        self.n_bad = 0
        self.repaired_nonfinite = 0
        self.repaired_utf8 = 0
        self.repaired_names = 0
        self.meta_records: list[tuple[str, Any, Any, Any]] = []  # (name, pid, tid, args.name/labels)
        self.window_end = False
        self.has_fraction = False
        self.unknown_cats: dict[str, int] = {}
        self.be_events: list[Event] = []
        self.notes: list[str] = []  # warnings found while reading the file's own metadata
        #: per batch, when reading a part of a split file: (stream offset, size, whether the typed path took it
        #: without consulting another path); only such batches read the same whatever batches the file is cut into
        self.log: list[tuple[int, int, bool]] | None = None
        self.consulted = False  # the last batch's typed read asked Arrow's path whether it takes the batch

    def bad(self, offset: int, what: str) -> None:
        """Count an unreadable record; remember where only the first few were (memory stays bounded
        on a file of nothing but garbage)."""
        self.n_bad += 1
        if len(self.bad_records) < 10:
            self.bad_records.append((offset, what))

    def add(self, rb: pa.RecordBatch) -> None:
        """Keep one batch of raw columns: strings as codes into the file's dictionaries."""
        cols = {f.name: rb.column(f.name) if f.name in ("cat", "name") else rb.column(f.name).cast(f.type)
                for f in RAW}
        cols["cat"] = self.cats.encode(cols["cat"])
        cols["name"] = self.names.encode(cols["name"])
        self.add_raw(pa.record_batch([cols[f.name] for f in RAW], schema=RAW))

    def add_raw(self, out: pa.RecordBatch) -> None:
        """Keep one batch already in the :data:`RAW` schema (strings as this file's codes)."""
        if self.spill_path is None:
            self.batches.append(out)
            return
        if self._spill is None:
            self._sink = pa.OSFile(self.spill_path, "wb")
            self._spill = pa.ipc.new_file(self._sink, RAW)
        self._spill.write_batch(out)
        self.n_spilled_batches += 1

    def chunks(self) -> Iterator[pa.RecordBatch | pa.Table]:
        """The raw batches, in order: one table in memory, or batch by batch from the spill file
        (read, not memory-mapped, so that only one batch is resident at a time)."""
        if self.spill_path is None:
            table = pa.Table.from_batches(self.batches, schema=RAW).combine_chunks() if self.batches \
                else RAW.empty_table()
            self.batches = []  # the combined table holds them now
            yield table
            return
        if self._spill is None:
            return
        with pa.OSFile(self.spill_path, "rb") as f:
            reader = pa.ipc.open_file(f)
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)

    def close_spill(self) -> None:
        if self._spill is not None:
            self._spill.close()
            self._sink.close()


@contextmanager
def _no_gc() -> Iterator[None]:
    """Pause the cyclic GC while millions of short-lived, acyclic objects are made (2x faster)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def parse(path: str, *, spill_dir: str | None = None, workers: int = 1) -> ParsedFile:
    """Parse one Kineto trace (``.json``, ``.json.gz``, truncated or damaged) into a ParsedFile.

    With ``spill_dir`` (an existing, empty directory the caller owns and removes) the file is parsed in
    bounded memory whatever its size: batches are spilled to an Arrow IPC file as they come, the events
    table is built from it batch by batch into ``spill_dir/events.arrow``, and the returned ParsedFile's
    ``events`` is that file, memory-mapped (``events_file`` names it; read it in batches to stay
    bounded). The tables are the same as without spilling.

    ``workers`` > 1 splits a big uncompressed file at record boundaries across that many processes (this
    one and ``workers - 1`` others): same tables, in about 1/workers of the time on as many cores.
    """
    with _no_gc():
        if workers > 1 and spill_dir is None:
            parsed = _parse_split(path, workers)
            if parsed is not None:
                return parsed
        return _parse(path, spill_dir)


def _parse(path: str, spill_dir: str | None = None) -> ParsedFile:
    acc = _Accumulator(path, spill_dir)
    blocks = Blocks(path)
    blocks.block_size = min(blocks.block_size, BATCH_BYTES)  # a batch is at least one block
    members, members_after, end = _stream(acc, blocks)
    if blocks.error is not None:
        if acc.n == 0:
            raise blocks.error
        end = End(False, end.bytes_lost, end.lost_offset, end.array_closed, True,
                  f"{blocks.error.message} at compressed byte {blocks.error.offset}", end.skipped,
                  end.skipped_bytes, end.skipped_offset)
    if not end.array_found:
        if end.reason == "no JSON value":
            raise TraceError(path, "empty file (no JSON value)")
        raise TraceError(path, "not a PyTorch-profiler trace: no traceEvents array", offset=end.lost_offset)
    if acc.be_events:
        _append_begin_end(acc)
    acc.close_spill()
    return _finish(acc, members, members_after, end, spill_dir)


def _stream(acc: _Accumulator, blocks: Iterable[tuple[int, bytes]], first_batch: Callable[[], None] | None = None
            ) -> tuple[dict[str, Any], set[str], End]:
    """Read a document's blocks into ``acc``; returns its other top-level members (decoded), the names of
    those after ``traceEvents``, and how the stream ended. ``first_batch`` is called once the first batch of
    the array has been read."""
    members: dict[str, Any] = {}
    members_after: set[str] = set()
    end: End | None = None
    array_seen = False
    for item in stream_array(blocks, batch_bytes=BATCH_BYTES, lazy=True):
        if isinstance(item, Batch):
            array_seen = True
            _consume(acc, item)
            if first_batch is not None:
                first_batch()
                first_batch = None
        elif isinstance(item, Member):
            try:
                members[item.key] = msgspec.json.decode(item.raw)
            except DECODE_ERRORS:
                try:  # invalid UTF-8 in a string: keep the member with U+FFFD for the bad bytes
                    members[item.key] = msgspec.json.decode(item.raw.decode("utf-8", "replace").encode())
                    acc.repaired_utf8 += 1
                except DECODE_ERRORS:
                    acc.bad(item.offset, f"member {item.key!r} is not valid JSON")
            if array_seen:
                members_after.add(item.key)
        else:
            end = item
    assert end is not None
    return members, members_after, end


# --- one big file across processes ----------------------------------------------------------------------------

#: below this size a file is not worth splitting (starting a process costs ~0.3 s)
SPLIT_MIN_BYTES = 64 << 20
#: what this process parses while a worker starts (~0.3 s): it takes that much more than its share
SPLIT_START_BYTES = 48 << 20
#: a record boundary is looked for this far after each place a file is split
_CUT_WINDOW = 4 << 20
_OPEN = b'{"traceEvents":['
_CLOSE = b"]}"


class _Range:
    """The bytes ``path[start:stop]`` of a plain file as blocks, after ``prefix`` and before ``suffix``: one
    part of a split file made a document of its own."""

    def __init__(self, path: str, start: int, stop: int, prefix: bytes = b"", suffix: bytes = b"") -> None:
        self.path, self.start, self.stop, self.prefix, self.suffix = path, start, stop, prefix, suffix
        self.error: TraceError | None = None

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        if self.prefix:
            yield 0, self.prefix
        pos = self.start
        with open(self.path, "rb") as f:
            f.seek(pos)
            while pos < self.stop:
                chunk = f.read(min(BATCH_BYTES, self.stop - pos))
                if not chunk:
                    break
                yield pos, chunk
                pos += len(chunk)
        if self.suffix:
            yield pos, self.suffix


def _cuts(path: str, size: int, parts: int) -> list[int] | None:
    """Positions of the separating commas of likely record boundaries after the first part (this process's:
    :data:`SPLIT_START_BYTES` more than an equal share) and between equal shares of the rest, or None. A
    wrong guess (a ``}, {`` inside a string) is caught later: the part before it does not end as a complete
    document."""
    cuts = []
    first = min((size + (parts - 1) * SPLIT_START_BYTES) // parts, size // 2 + size // (2 * parts))
    with open(path, "rb") as f:
        for k in range(1, parts):
            at = first + (size - first) * (k - 1) // (parts - 1)
            f.seek(at)
            window = f.read(_CUT_WINDOW)
            m = _SEPARATOR.search(window)
            if m is None:
                return None
            cut = at + window.index(b",", m.start())
            if cuts and cut <= cuts[-1]:
                return None
            cuts.append(cut)
    return cuts


def _clean(acc: _Accumulator, end: End, error: TraceError | None, after: int = -1) -> bool:
    """A part of a split file that read like an undamaged document (nothing repaired, skipped or lost, no B/E
    pairs to match across parts) and whose batches from stream offset ``after`` on were all taken by the typed
    path on their own: each of those records then reads the same in whatever batch it lands, so the parts
    give what one pass over the whole file gives."""
    assert acc.log is not None
    return (end.complete and end.array_closed and not end.skipped and error is None and not acc.n_bad
            and not acc.repaired_utf8 and not acc.repaired_nonfinite and not acc.repaired_names
            and not acc.be_events and all(ok for offset, size, ok in acc.log if offset + size > after))


def _parse_part(path: str, start: int, stop: int, out_dir: str, has_fraction: bool) -> None:
    """Worker process: the records of ``path[start:stop]`` (and, when ``stop`` is the end of the file, the
    members after the array), their raw batches spilled to ``out_dir/raw.arrow`` and the accumulator's state
    written to ``out_dir/state.json``, or nothing when the part was not clean (the caller then parses the
    whole file itself). ``has_fraction``: whether a timestamp before the part had a fraction, as the first
    batch of the file says (the caller checks that it stayed so)."""
    with _no_gc():
        size = os.path.getsize(path)
        acc = _Accumulator(path, out_dir)
        acc.log = []
        acc.has_fraction = has_fraction
        blocks = _Range(path, start, stop, _OPEN, _CLOSE if stop < size else b"")
        members, _, end = _stream(acc, blocks)
        acc.close_spill()
        if not _clean(acc, end, blocks.error) or (stop < size and members):
            return
        state = {"n": acc.n, "cats": acc.cats.values, "names": acc.names.values, "comm_rows": acc.comm_rows,
                 "dropped": acc.dropped, "meta_records": acc.meta_records, "window_end": acc.window_end,
                 "has_fraction": acc.has_fraction, "assumed_fraction": has_fraction, "members": members,
                 "end": end, "raw": acc.n_spilled_batches > 0}
        tmp = os.path.join(out_dir, "state.json.tmp")
        with open(tmp, "wb") as f:
            f.write(msgspec.json.encode(state))
        os.replace(tmp, os.path.join(out_dir, "state.json"))


def _part_state(out_dir: str) -> dict[str, Any] | None:
    """What :func:`_parse_part` left in ``out_dir``, or None."""
    try:
        with open(os.path.join(out_dir, "state.json"), "rb") as f:
            st = msgspec.json.decode(f.read())
        st["end"] = msgspec.convert(st["end"], End)
        st["meta_records"] = [tuple(r) for r in st["meta_records"]]
        st["raw"] = os.path.join(out_dir, "raw.arrow") if st["raw"] else None
        return st
    except (OSError, *DECODE_ERRORS, KeyError):
        return None


def _parse_split(path: str, workers: int) -> ParsedFile | None:
    """:func:`parse` of a big plain file in ``workers`` processes, or None where that does not apply (small or
    compressed files, a part that was not clean, a worker that could not run): then the caller parses it in
    one. Workers are fresh interpreters running this module (never the caller's ``__main__``)."""
    size = os.path.getsize(path)
    parts = min(workers, size // SPLIT_MIN_BYTES)
    if parts < 2 or is_gzip(path):
        return None
    with open(path, "rb") as f:
        if not f.read(1 << 16).lstrip().startswith(b"{"):
            return None  # a legacy event list: small by nature
    cuts = _cuts(path, size, parts)
    if cuts is None:
        return None
    bounds = [*cuts, size]
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="tracekit-split-") as tmp:
        acc = _Accumulator(path)
        acc.log = []

        def start_parts() -> None:  # once the first batch says whether timestamps have fractions
            for k in range(parts - 1):
                out = os.path.join(tmp, str(k))
                os.mkdir(out)
                cmd = [sys.executable, "-m", __name__, "--part", path, str(bounds[k] + 1), str(bounds[k + 1]), out,
                       str(int(acc.has_fraction))]
                try:
                    procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                                  stderr=subprocess.DEVNULL))
                except OSError:
                    return

        try:
            blocks = _Range(path, 0, cuts[0], suffix=_CLOSE)
            members, members_after, end = _stream(acc, blocks, start_parts)
            for proc in procs:
                proc.wait()
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        states = [_part_state(os.path.join(tmp, str(k))) for k in range(parts - 1)]
        # this part's batches are those of one pass over the file until its last blocks (read with the cut)
        if len(procs) < parts - 1 or not _clean(acc, end, blocks.error, cuts[0] - 3 * BATCH_BYTES) \
                or members_after or any(st is None or (st["assumed_fraction"] and not acc.has_fraction)
                                        for st in states):
            return None
        for st in states:
            assert st is not None
            _merge_part(acc, st)
            members.update(st["members"])
            members_after |= set(st["members"])
            end = st["end"]
        return _finish(acc, members, members_after, end)


def _merge_part(acc: _Accumulator, st: dict[str, Any]) -> None:
    """Append a later part's state to ``acc`` as if its records had been read right after ``acc``'s: string
    codes into ``acc``'s dictionaries (new strings in their order of first appearance), record numbers after
    ``acc``'s."""
    cat_map = acc.cats.codes_of(st["cats"])
    name_map = acc.names.codes_of(st["names"])
    base = acc.n
    if st["raw"] is not None:
        with pa.memory_map(st["raw"], "r") as source:
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                rb = reader.get_batch(i)
                cols = rb.columns
                cols[0] = _remap(cols[0], cat_map)
                cols[1] = _remap(cols[1], name_map)
                cols[-1] = pa.array(cols[-1].to_numpy() + base)
                acc.add_raw(pa.record_batch(cols, schema=RAW))
    for row in st["comm_rows"]:
        row["_index"] += base
    acc.comm_rows.extend(st["comm_rows"])
    acc.meta_records.extend(st["meta_records"])
    acc.window_end = acc.window_end or st["window_end"]
    acc.has_fraction = acc.has_fraction or st["has_fraction"]
    acc.dropped += st["dropped"]
    acc.n += st["n"]


def _remap(codes: pa.Array, mapping: np.ndarray) -> pa.Array:
    """int32 codes of a part's dictionary as codes of the whole file's (nulls stay null)."""
    idx = pc.fill_null(codes, 0).to_numpy(zero_copy_only=False)
    out = mapping[idx] if mapping.size else np.zeros(len(idx), np.int32)
    return pa.array(out, pa.int32(), mask=pc.is_null(codes).to_numpy(zero_copy_only=False)) if codes.null_count \
        else pa.array(out, pa.int32())


def _decode_batch(acc: _Accumulator, batch: Batch) -> list[Event]:
    """Decode a batch; on damage, repair what can be repaired and skip (and count) the rest."""
    try:
        return _DECODE.decode(batch.data)
    except UnicodeDecodeError:
        # invalid UTF-8: U+FFFD for every bad byte (never a structural character, so the element
        # boundaries stay where they were)
        fixed = batch.data.decode("utf-8", "replace")
        acc.repaired_utf8 += fixed.count("\ufffd") - batch.data.count("\ufffd".encode())
        batch = Batch(batch.offset, fixed.encode())
        try:
            return _DECODE.decode(batch.data)
        except DECODE_ERRORS:
            pass
    except DECODE_ERRORS:
        pass
    data = batch.data
    if _NONFINITE.search(data):
        data, k = _NONFINITE.subn(rb"\1null", data)
        try:
            events = _DECODE.decode(data)
            acc.repaired_nonfinite += k
            return events
        except DECODE_ERRORS:
            pass
    # element by element; elements that are not even objects are counted in bulk, not one by one
    events: list[Event] = []
    bounds = batch.bounds
    view = np.frombuffer(batch.data, dtype=np.uint8)
    solid = np.flatnonzero((view != 0x20) & (view != 0x0A) & (view != 0x0D) & (view != 0x09))
    at = np.searchsorted(solid, bounds[:-1] + 1)
    first = solid[np.minimum(at, solid.size - 1)]
    present = (at < solid.size) & (first < bounds[1:])
    is_obj = present & (view[first] == 0x7B)
    junk = np.flatnonzero(present & ~is_obj)
    if junk.size:
        acc.bad(batch.element_offset(int(junk[0])), "unreadable event skipped")
        acc.n_bad += junk.size - 1
    for i in np.flatnonzero(is_obj).tolist():
        ev = _decode_one(acc, batch.element(i))
        if ev is None:
            acc.bad(batch.element_offset(i), "unreadable event skipped")
        else:
            events.append(ev)
    return events


def _decode_one(acc: _Accumulator, raw: bytes) -> Event | None:
    """Decode one event, trying the repairs real files need (non-finite numbers, unescaped names,
    control characters, invalid UTF-8, wrong types)."""
    try:
        return _DECODE_ONE.decode(raw)
    except DECODE_ERRORS:
        pass
    fixed = raw
    k = 0
    if _NONFINITE.search(fixed):
        fixed, k = _NONFINITE.subn(rb"\1null", fixed)
    m = _UNESCAPED_NAME.search(fixed)
    if m and re.search(rb'(?<!\\)"', m.group(2)):
        inner = re.sub(rb'(?<!\\)"', rb'\\"', m.group(2))
        fixed = fixed[: m.start(2)] + inner + fixed[m.end(2):]
        acc.repaired_names += 1
    try:
        ev = _DECODE_ONE.decode(fixed)
        acc.repaired_nonfinite += k
        return ev
    except DECODE_ERRORS:
        pass
    import json

    try:
        obj = json.loads(fixed.decode("utf-8", "replace"), strict=False)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    ts = obj.get("ts")
    args = obj.get("args") if isinstance(obj.get("args"), dict) else {}
    try:
        return Event(ph=obj.get("ph", ""), cat=obj.get("cat"), name=obj.get("name"), pid=obj.get("pid"),
                     tid=obj.get("tid"), ts=msgspec.Raw(msgspec.json.encode(ts)) if ts is not None
                     else EMPTY_RAW, dur=obj.get("dur"), args=msgspec.convert(args, Args, strict=False))
    except DECODE_ERRORS:
        return None


_ARGS_TYPE = pa.struct([("External id", pa.int64()), ("external id", pa.int64()), ("correlation", pa.int64()),
                        ("device", pa.int64()), ("stream", pa.int64()), ("bytes", pa.int64()),
                        ("name", pa.string()), ("labels", pa.string()), ("wait_on_stream", pa.int64()),
                        ("wait_on_cuda_event_record_corr_id", pa.int64())])
_ARROW_SCHEMA = pa.schema([("ph", pa.string()), ("cat", pa.string()), ("name", pa.string()), ("pid", pa.int64()),
                          ("tid", pa.int64()), ("ts", pa.decimal128(24, 3)), ("dur", pa.decimal128(24, 3)),
                          ("args", _ARGS_TYPE)])
_ARROW_PARSE = pj.ParseOptions(explicit_schema=_ARROW_SCHEMA, unexpected_field_behavior="ignore")
_ARROW_PARSE_NL = pj.ParseOptions(explicit_schema=_ARROW_SCHEMA, unexpected_field_behavior="ignore",
                                  newlines_in_values=True)
_ARROW_READ = pj.ReadOptions(use_threads=False, block_size=16 << 20)
_SEPARATOR = re.compile(rb"\}\s*,\s*\{")


def _decimal_ns(col: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """µs as decimal128(·, 3) → int64 ns, exactly: the decimal's storage *is* the value × 1000.

    Returns ``(ns, ok)``; ``ok`` is False for nulls and for values beyond ±:data:`MAX_NS` (the low
    64-bit word alone would silently wrap them)."""
    words = np.frombuffer(col.buffers()[1], dtype=np.int64)[2 * col.offset : 2 * (col.offset + len(col))]
    low, high = words[0::2], words[1::2]
    ok = (high == (low >> 63)) & (low <= MAX_NS) & (low >= -MAX_NS)
    if col.null_count:
        ok &= pc.is_valid(col).to_numpy(zero_copy_only=False)
    return np.where(ok, low, 0), ok


def _records(lines: bytes, n: int, batch: Batch):
    """``k -> bytes of record k`` for records joined by ``}\\n{`` (the separators this parser wrote);
    falls back to the batch's structural index if a record happens to contain that sequence itself."""
    arr = np.frombuffer(lines, dtype=np.uint8)
    cut = np.flatnonzero(arr[1:-1] == 0x0A) + 1  # newlines first: one pass, then look around the few found
    cut = cut[(arr[cut - 1] == 0x7D) & (arr[cut + 1] == 0x7B)]
    if cut.size != n - 1:
        return batch.element
    starts = np.concatenate(([0], cut + 1))
    ends = np.append(cut, len(lines))
    return lambda k: lines[starts[k] : ends[k]]


def _consume_arrow(acc: _Accumulator, batch: Batch) -> bool:
    """Fast path: decode a batch with Arrow's C++ JSON reader into typed columns (no Python objects
    per event). Returns False, having done nothing, for anything unusual (string tids, non-finite
    numbers, more than ns precision, B/E pairs, damaged records): the msgspec path handles those."""
    tbl = None
    body = batch.data[1:-1]
    # writers use one separator between records: replace it exactly (memchr-fast); objects may still span
    # lines (pretty-printed), which the reader is told about
    m = _SEPARATOR.search(body, 0, 1 << 16)
    if m is not None:
        sep = m.group()
        lines = body.replace(sep, b"}\n{")
        # a separator with spacing is longer than its replacement, so the shrinkage counts them for free
        n_sep = (len(body) - len(lines)) // (len(sep) - 3) if len(sep) > 3 else lines.count(b"}\n{")
        if n_sep * 32 > len(lines):
            return False  # millions of tiny records (no real event is this small): Arrow's per-row cost is high
        try:
            tbl = pj.read_json(io.BytesIO(lines), read_options=_ARROW_READ, parse_options=_ARROW_PARSE_NL)
            tbl.validate(full=True)  # the reader does not check UTF-8; invalid text goes the repairing way
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            tbl = None
        # two records with no comma between them read as two rows without a separator: rows and records
        # would fall out of step, so that batch goes the exact way (as does a record holding the separator)
        if tbl is not None and tbl.num_rows != n_sep + 1:
            tbl = None
    if tbl is None:  # mixed separators: normalise every one
        lines = _SEPARATOR.sub(b"}\n{", body.replace(b"\n", b" "))
        if lines.count(b"\n") * 32 > len(lines):
            return False
        try:
            tbl = pj.read_json(io.BytesIO(lines), read_options=_ARROW_READ, parse_options=_ARROW_PARSE)
            tbl.validate(full=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return False
        if tbl.num_rows != lines.count(b"\n") + 1:
            return False
    if tbl.num_rows == 0:
        return True
    tbl = tbl.combine_chunks()
    ph = tbl.column("ph").chunk(0)
    is_x = pc.equal(ph, "X")
    n_x = pc.sum(is_x).as_py() or 0
    if n_x != tbl.num_rows:
        if pc.any(pc.is_in(ph, pa.array(["B", "E"]))).as_py():
            return False
        # only metadata rows and the window-end marker matter among the others (flows, instants, ...)
        wanted = pc.or_(pc.equal(ph, "M"), pc.and_(pc.equal(ph, "i"),
                                                    pc.equal(tbl.column("name").chunk(0), "Record Window End")))
        other = tbl.filter(pc.fill_null(wanted, False))
        for row in other.select(["ph", "name", "pid", "tid", "args"]).to_pylist():
            if row["ph"] == "M":
                a = row["args"] or {}
                acc.meta_records.append((str(row["name"]), row["pid"], row["tid"],
                                         a.get("name") if a.get("name") is not None else a.get("labels")))
            elif row["ph"] == "i" and row["name"] == "Record Window End":
                acc.window_end = True
    line_index = np.flatnonzero(pc.fill_null(is_x, False).to_numpy(zero_copy_only=False))
    x = tbl.take(pa.array(line_index)) if n_x != tbl.num_rows else tbl
    start, ts_ok = _decimal_ns(x.column("ts").chunk(0))
    if not acc.has_fraction:
        acc.has_fraction = bool((start[ts_ok] % 1000 != 0).any())
    dur, dur_ok = _decimal_ns(x.column("dur").chunk(0))
    dur = np.where(dur_ok & (dur <= MAX_DUR_NS), dur, 0)
    args = x.column("args").chunk(0)
    field = {f: pc.struct_field(args, f) for f in ("External id", "external id", "correlation", "device",
                                                   "stream", "bytes", "wait_on_stream",
                                                   "wait_on_cuda_event_record_corr_id")}
    n = len(x)
    rb = pa.record_batch({
        "cat": x.column("cat").chunk(0).dictionary_encode(),
        "name": x.column("name").chunk(0).dictionary_encode(),
        "start_ns": pa.array(start),
        "dur_ns": pa.array(np.maximum(dur, 0)),
        "pid": pc.abs(x.column("pid").chunk(0)),
        "tid": pc.abs(x.column("tid").chunk(0)),
        "arg_device": field["device"],
        "arg_stream": field["stream"],
        "correlation": field["correlation"],
        "external_id": pc.coalesce(field["External id"], field["external id"]),
        "bytes": field["bytes"],
        "sync_stream": field["wait_on_stream"],
        "sync_correlation": field["wait_on_cuda_event_record_corr_id"],
        "_index": pa.array(np.arange(acc.n, acc.n + n, dtype=np.int64)),
    })
    if not ts_ok.all():
        acc.dropped += int((~ts_ok).sum())
        keep = pa.array(ts_ok)
        rb = rb.filter(keep)
        line_index = line_index[ts_ok]
    # collective metadata: decode only the few records that may carry it, with msgspec
    names = rb.column("name")
    hot = [i for i, nm in enumerate(names.dictionary.to_pylist()) if nm and _may_carry_comm(nm)]
    if hot:
        sel = np.flatnonzero(np.isin(pc.fill_null(names.indices, -1).to_numpy(zero_copy_only=False), hot))
        record = _records(lines, tbl.num_rows, batch)
        index = rb.column("_index").to_numpy()
        for j in sel:
            ev = _decode_one(acc, record(int(line_index[j])))
            if ev is None:
                continue
            a = ev.args
            row = {f: getattr(a, f) for f in COMM_ARG_FIELDS}
            row["_index"] = int(index[j])
            acc.comm_rows.append(row)
    acc.add(rb)
    acc.n += n
    return True


# --- the typed fast path --------------------------------------------------------------------------------------

class _TArgs(msgspec.Struct, frozen=True, gc=False, rename={
    "external_id": "External id", "external_id_legacy": "external id",
    "wait_stream": "wait_on_stream", "wait_correlation": "wait_on_cuda_event_record_corr_id", "label_name": "name",
    "collective": "Collective name", "in_nelems": "In msg nelems", "out_nelems": "Out msg nelems",
    "in_size": "In msg size", "out_size": "Out msg size", "group_size": "Group size",
    "pg_name": "Process Group Name", "pg_desc": "Process Group Description", "pg_id": "Process Group ID",
    "pg_ranks": "Process Group Ranks", "seq": "Seq", "comms_id": "Comms Id", "comm_rank": "Rank",
    "src_rank": "Src Rank", "dst_rank": "Dst Rank", "input_dims": "Input Dims",
    "input_dims_legacy": "Input dims", "input_type": "Input type",
}):
    """The args of an X event as the fast path reads them: the ids of every event typed exactly as
    :data:`_ARROW_SCHEMA` types them (a value of another type sends the batch the old ways), and the
    collective metadata as :class:`Args` reads it, the tensor shapes left as raw JSON until an event turns
    out to be one that may carry a collective's size."""

    external_id: int | None = None
    external_id_legacy: int | None = None
    correlation: int | None = None
    device: int | None = None
    stream: int | None = None
    bytes: int | None = None
    wait_stream: int | None = None
    wait_correlation: int | None = None
    label_name: str | None = None
    labels: str | None = None
    collective: Any = None
    dtype: Any = None
    in_nelems: Any = None
    out_nelems: Any = None
    in_size: Any = None
    out_size: Any = None
    group_size: Any = None
    pg_name: Any = None
    pg_desc: Any = None
    pg_id: Any = None
    pg_ranks: Any = None
    seq: Any = None
    comms_id: Any = None
    comm_rank: Any = None
    src_rank: Any = None
    dst_rank: Any = None
    input_dims: msgspec.Raw = EMPTY_RAW
    input_dims_legacy: msgspec.Raw = EMPTY_RAW
    input_type: msgspec.Raw = EMPTY_RAW


_NO_TARGS = _TArgs()
_IDS = attrgetter("external_id", "external_id_legacy", "correlation", "device", "stream", "bytes", "wait_stream",
                  "wait_correlation")
_RAW_COMM_FIELDS = frozenset({"input_dims", "input_dims_legacy", "input_type"})


class _TX(msgspec.Struct, gc=False, tag="X", tag_field="ph"):
    """A complete event (``ph`` X); ``ts`` as its text, for an exact decimal conversion (``dur`` below 2^33 µs
    converts exactly from a float)."""

    cat: str | None = None
    name: str | None = None
    pid: int | None = None
    tid: int | None = None
    ts: msgspec.Raw = EMPTY_RAW
    dur: float | None = None
    args: _TArgs = _NO_TARGS


class _TMetaArgs(msgspec.Struct, frozen=True, gc=False, rename={"label_name": "name"}):
    label_name: str | None = None
    labels: str | None = None


class _TM(msgspec.Struct, gc=False, tag="M", tag_field="ph"):
    """Track metadata (``process_name``, ``thread_name``, ...)."""

    name: str | None = None
    pid: int | None = None
    tid: int | None = None
    args: _TMetaArgs = _TMetaArgs()


class _TI(msgspec.Struct, gc=False, tag="i", tag_field="ph"):
    """An instant: only ``Record Window End`` matters (its pid and tid are ``""``)."""

    name: str | None = None


def _other(ph: str) -> type:
    """A record whose content the analysis does not use (flows, counters, ...): an empty struct. (Arrow's path
    also checks the types of their fields, so it may refuse a batch this path takes; where that changes a
    result, :func:`_consume_typed` asks it.)"""
    return msgspec.defstruct(f"_T_{ord(ph[0])}", [], tag=ph, tag_field="ph", gc=False)


#: every phase of the Chrome trace event format; B/E pairs go the exact way (a batch holding one is left to it)
_TB, _TE = _other("B"), _other("E")
_T_OTHERS = [_other(ph) for ph in ("s", "f", "t", "I", "C", "b", "n", "e", "P", "O", "N", "D", "V", "v", "R", "c",
                                   "(", ")")]
_TYPED = msgspec.json.Decoder(list[Union[_TX, _TM, _TI, _TB, _TE, *_T_OTHERS]])
_DECIMAL = pa.decimal128(24, 3)
_NULL_FIRST = ord("n")


def _raw_decimal_ns(raws: tuple[msgspec.Raw, ...]) -> tuple[np.ndarray, np.ndarray] | None:
    """The raw texts of JSON numbers (µs) as exact int64 ns, with :func:`_decimal_ns`'s validity; absent
    values and ``null`` are invalid. None when a text is not a number Arrow's JSON reader would read the same
    way (quoted numbers, more than 3 decimals, beyond decimal128(24, 3)): the batch then goes the old ways."""
    n = len(raws)
    lengths = np.fromiter(map(len, raws), dtype=np.int64, count=n)
    joined = b"".join(raws)
    if len(joined) >= 2**31:
        return None
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    buf = np.frombuffer(joined, dtype=np.uint8)
    null = lengths == 0
    if buf.size:
        null |= buf[np.minimum(offsets[:-1], buf.size - 1)] == _NULL_FIRST  # the JSON is valid: n is null
    n_null = int(null.sum())
    validity = pa.py_buffer(np.packbits(~null, bitorder="little")) if n_null else None
    strings = pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(joined), validity, n_null)
    try:
        dec = pc.cast(strings, _DECIMAL)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return _decimal_ns(dec)


def _float_us_ns(values: tuple) -> tuple[np.ndarray, np.ndarray]:
    """Durations in µs decoded as floats → int64 ns: exactly what the decimal text gives for values below 2^33 µs
    with at most 3 decimals (and what the exact path gives for more decimals); absent and null values are 0, as
    there. Returns ``(ns, exact)``: ``exact`` is False for values of 2^33 µs or more (their text is needed)."""
    f = pa.array(values, pa.float64()).to_numpy(zero_copy_only=False)  # nulls become NaN
    nan = np.isnan(f)
    exact = nan | (np.abs(f) < float(1 << 33))
    ns = np.rint(np.where(exact & ~nan, f, 0.0) * 1000.0).astype(np.int64)
    return ns, exact


def _consume_typed(acc: _Accumulator, batch: Batch) -> bool:
    """Fastest path: one msgspec decode of the whole batch into typed structs (records the analysis does
    not use become empty structs), moved into columns with C-level transposes. Gives exactly what
    :func:`_consume_arrow` gives; returns False, having changed nothing, for every batch that path would not
    take (and a few more), which then goes the old ways."""
    data = batch.data
    try:
        evs = _TYPED.decode(data)
    except DECODE_ERRORS:
        return False
    n_rec = len(evs)
    kinds = list(map(type, evs))
    if kinds.count(_TB) or kinds.count(_TE):
        return False
    n_x = kinds.count(_TX)
    xs = evs if n_x == n_rec else list(compress(evs, map(is_, kinds, repeat(_TX))))
    meta: list[tuple[str, Any, Any, Any]] = []
    window_end = False
    if kinds.count(_TM) or kinds.count(_TI):
        for e in evs:
            if e.__class__ is _TM:
                a = e.args
                meta.append((str(e.name), e.pid, e.tid, a.label_name if a.label_name is not None else a.labels))
            elif e.__class__ is _TI and e.name == "Record Window End":
                window_end = True
    del evs, kinds
    rb = None
    args: tuple[_TArgs, ...] = ()
    if n_x:
        cat, name, pid, tid, ts, dur, args = zip(*map(astuple, xs), strict=True)
        del xs
        converted = _raw_decimal_ns(ts)
        if converted is None:
            return False
        start, ts_ok = converted
        dur_ns, dur_exact = _float_us_ns(dur)
        if not dur_exact.all():
            return False  # durations of 2^33 µs (2.4 hours) or more: only their text gives them exactly
        try:
            ids = [pa.array(c, pa.int64()) for c in (pid, tid, *zip(*map(_IDS, args), strict=True))]
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            return False
        pid_a, tid_a, ext, ext_l, corr, dev, stream, nbytes, wstream, wcorr = ids
        try:
            cat_a, name_a = pa.array(cat, pa.string()), pa.array(name, pa.string())
        except (pa.ArrowInvalid, UnicodeEncodeError):  # lone surrogates (escaped in the JSON) are not UTF-8
            return False
        has_fraction = acc.has_fraction or bool((start[ts_ok] % 1000 != 0).any())
        # Where the two old paths differ (negative pids and tids, whether timestamps have fractions; durations of
        # 2^33 µs or more went back above), give what they gave: Arrow's result if it takes this batch (which it
        # decides on types of records this path does not look at), else the exact path's.
        acc.consulted = ((pc.min(pid_a).as_py() or 0) < 0 or (pc.min(tid_a).as_py() or 0) < 0
                         or (not acc.has_fraction and (has_fraction or b"." in b"".join(ts))))
        if acc.consulted and not _consume_arrow(_Accumulator(acc.path), batch):
            return False
        # every check passed: from here on the accumulator changes
        acc.has_fraction = has_fraction
        dur_ns = np.maximum(dur_ns, 0)
        name_codes = acc.names.encode(name_a)
        rb = pa.record_batch([
            acc.cats.encode(cat_a), name_codes, pa.array(start),
            pa.array(dur_ns), pc.abs(pid_a), pc.abs(tid_a), dev, stream, corr, pc.coalesce(ext, ext_l), nbytes,
            wstream, wcorr, pa.array(np.arange(acc.n, acc.n + n_x, dtype=np.int64))], schema=RAW)
        rows = np.arange(n_x)
        if not ts_ok.all():
            acc.dropped += int((~ts_ok).sum())
            rb = rb.filter(pa.array(ts_ok))
            rows = rows[ts_ok]
            name_codes = name_codes.filter(pa.array(ts_ok))
        # collective metadata: only from events whose name says they may carry it
        hot = acc.names.comm_flags()
        if hot.any():
            codes = pc.fill_null(name_codes, len(hot) - 1).to_numpy(zero_copy_only=False)
            for j in np.flatnonzero(hot[codes]).tolist():
                acc.comm_rows.append(_comm_row(args[int(rows[j])], acc.n + int(rows[j])))
    acc.meta_records.extend(meta)
    acc.window_end = acc.window_end or window_end
    if rb is not None:
        acc.add_raw(rb)
        acc.n += n_x
    return True


def _comm_row(a: _TArgs, index: int) -> dict[str, Any]:
    """The collective metadata of one event, as :class:`Args` would have read it."""
    row = {f: getattr(a, f) for f in COMM_ARG_FIELDS}
    for f in _RAW_COMM_FIELDS:
        raw = row[f]
        row[f] = msgspec.json.decode(raw) if len(raw) else None
    row["_index"] = index
    return row


def _consume(acc: _Accumulator, batch: Batch) -> None:
    """Turn one batch into Arrow columns (X events) and side records (metadata, markers)."""
    acc.consulted = False
    if _consume_typed(acc, batch):
        if acc.log is not None:
            acc.log.append((batch.offset, len(batch.data), not acc.consulted))
        return
    if acc.log is not None:
        acc.log.append((batch.offset, len(batch.data), False))
    if not batch.check():
        return  # cut inside a record: the stream splits these bytes again exactly
    if _consume_arrow(acc, batch):
        return
    events = _decode_batch(acc, batch)
    if not events:
        return
    phs = [e.ph for e in events]
    xs = [e for e, ph in zip(events, phs, strict=True) if ph == "X"]
    if len(xs) != len(events):
        for e, ph in zip(events, phs, strict=True):
            if ph == "M":
                a = e.args
                acc.meta_records.append((str(e.name), e.pid, e.tid, a.label_name if a.label_name is not None
                                         else a.labels))
            elif ph == "i":
                if e.name == "Record Window End":
                    acc.window_end = True
            elif ph in ("B", "E"):
                acc.be_events.append(e)
    if xs:
        _columns(acc, xs)


def _int_column(values: list, name: str) -> pa.Array:
    """int64 column from JSON values that should be ints (strings of digits and floats tolerated)."""
    try:
        return pa.array(values, type=pa.int64())
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        return pa.array([_as_int(v) for v in values], type=pa.int64())


def _as_int(v: Any) -> int | None:
    """Lenient int: ``7``, ``"7"``, ``"stream 7"``, ``7.0``; None for anything else."""
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int):
        return abs(v) if abs(v) < 2**63 else None
    if isinstance(v, float):
        return int(v) if v == v and abs(v) < 2**63 else None
    if isinstance(v, str):
        m = re.search(r"-?\d+", v)
        if m and len(m.group()) < 19:
            return abs(int(m.group()))
    return None


def _str_column(values: list) -> pa.Array:
    """A string column; other JSON values become their text, lone surrogates become ``?``."""
    try:
        return pa.array(values, type=pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, UnicodeEncodeError):
        return pa.array([None if v is None else clean_text(v if isinstance(v, str) else str(v))
                         for v in values], type=pa.string())


def _dur_ns(values: list) -> tuple[np.ndarray, np.ndarray]:
    """``dur`` in µs (int or float) → ns. Floats below 2^33 µs round-trip exactly to the ns; anything
    that is not a finite number within ±:data:`MAX_NS` ns is invalid."""
    try:
        arr = pa.array(values, type=pa.float64())
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        arr = pa.array([float(v) if isinstance(v, int | float) and not isinstance(v, bool) and abs(v) < 1e300
                        else None for v in values], type=pa.float64())
    f = arr.to_numpy(zero_copy_only=False)
    valid = np.isfinite(f) & (np.abs(f) <= MAX_DUR_NS / 1000.0)
    ns = np.zeros(len(f), dtype=np.int64)
    ns[valid] = np.rint(f[valid] * 1000.0).astype(np.int64)
    return ns, valid


def _columns(acc: _Accumulator, xs: list[Event]) -> None:
    # one comprehension per field is about twice as fast as transposing per-event tuples
    cat = [e.cat for e in xs]
    name = [e.name for e in xs]
    pid = [e.pid for e in xs]
    tid = [e.tid for e in xs]
    ts = [e.ts for e in xs]
    dur = [e.dur for e in xs]
    args = [e.args for e in xs]
    ext = [a.external_id for a in args]
    ext_legacy = [a.external_id_legacy for a in args]
    corr = [a.correlation for a in args]
    device = [a.device for a in args]
    stream = [a.stream for a in args]
    nbytes = [a.bytes for a in args]
    wait_stream = [a.wait_stream for a in args]
    wait_corr = [a.wait_correlation for a in args]
    if None in cat:
        # legacy autograd-profiler lists (PyTorch <= 1.7) have no categories, only these pids
        cat = [c if c is not None else _LEGACY_PID_CATS.get(p) if isinstance(p, str) else None
               for c, p in zip(cat, pid, strict=True)]
    start, ts_ok = us_text_to_ns(ts)
    ts_ok &= (start <= MAX_NS) & (start >= -MAX_NS)
    if not acc.has_fraction:
        acc.has_fraction = any(b"." in bytes(t) for t in ts[:64])
    dur_ns, dur_ok = _dur_ns(dur)
    keep = ts_ok
    dropped = int((~keep).sum())
    cat_arr = _str_column(cat)
    name_arr = _str_column(name)
    pid_arr = _int_column(pid, "pid")
    tid_arr = _int_column(tid, "tid")
    ext_arr = _int_column(ext, "External id")
    if pc.any(pc.is_valid(_int_column(ext_legacy, "external id"))).as_py():
        ext_arr = pc.coalesce(ext_arr, _int_column(ext_legacy, "external id"))
    dur_ns = np.where(dur_ok & (dur_ns > 0), dur_ns, 0)
    rb = pa.record_batch({
        "cat": cat_arr.dictionary_encode(),
        "name": name_arr.dictionary_encode(),
        "start_ns": pa.array(start),
        "dur_ns": pa.array(dur_ns),
        "pid": pid_arr,
        "tid": tid_arr,
        "arg_device": _int_column(device, "device"),
        "arg_stream": _int_column(stream, "stream"),
        "correlation": _int_column(corr, "correlation"),
        "external_id": ext_arr,
        "bytes": _int_column(nbytes, "bytes"),
        "sync_stream": _int_column(wait_stream, "wait_on_stream"),
        "sync_correlation": _int_column(wait_corr, "wait_on_cuda_event_record_corr_id"),
        "_index": pa.array(np.arange(acc.n, acc.n + len(xs), dtype=np.int64)),
    })
    if dropped:
        rb = rb.filter(pa.array(keep))
        acc.dropped += dropped
    # collective metadata: only from events whose name says they may carry it
    names = rb.column("name")
    dict_names = names.dictionary.to_pylist()
    hot = [i for i, n in enumerate(dict_names) if n and _may_carry_comm(n)]
    if hot:
        sel = np.flatnonzero(np.isin(names.indices.to_numpy(zero_copy_only=False), hot))
        index = rb.column("_index").to_numpy()
        base = acc.n
        for j in sel:
            a = args[int(index[j]) - base]
            row = {f: getattr(a, f) for f in COMM_ARG_FIELDS}
            row["_index"] = int(index[j])
            acc.comm_rows.append(row)
    acc.add(rb)
    acc.n += len(xs)


def _may_carry_comm(name: str) -> bool:
    return (name == "record_param_comms" or name.startswith(("nccl:", "gloo:", "c10d::", "ucc:", "mpi:"))
            or NCCL_KERNEL.match(name) is not None)


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
        dev_ok = ch.on_device & (ch.device >= -(2**31)) & (ch.device < 2**31)

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
        collectives, ids = kineto_comms.collectives(fin.events(rch), r_index, acc.comm_rows, members)
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
            idx = ch.raw.column("_index").to_numpy()
            cid = None
            if coll_index.size:
                pos = np.minimum(np.searchsorted(coll_index, idx), coll_index.size - 1)
                hit = coll_index[pos] == idx
                cid = pa.array(np.where(hit, coll_ids[pos], 0), pa.int64(), mask=~hit)
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
        diags.append(Diagnostic(path, f"truncated ({what}): kept {n_events} complete events, "
                                f"lost {end.bytes_lost} bytes", offset=end.lost_offset))
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
    meta["rank"] = _small_int(info.get("rank"), 0)
    if info.get("rank") is not None and meta["rank"] is None:
        acc.notes.append(f"distributedInfo.rank {str(info.get('rank'))[:40]!r} is not a rank; ignored")
    for key in ("world_size", "pg_count"):
        if _small_int(info.get(key), 1) is not None:
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


def _small_int(v: Any, lowest: int) -> int | None:
    """``v`` if it is an int in ``[lowest, 2^31)`` (ranks, world sizes), else None."""
    if isinstance(v, int) and not isinstance(v, bool) and lowest <= v < 2**31:
        return v
    return None


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


if __name__ == "__main__" and sys.argv[1:2] == ["--part"]:  # a worker of _parse_split
    _parse_part(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6] == "1")
