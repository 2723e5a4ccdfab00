"""The Kineto parser's record model: event categories, the msgspec structs one record decodes into, the
file's string table and the accumulator the batches of one file are collected in."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: bytes of records decoded at once: the typed structs of a batch this size stay in the CPU's caches while they
#: are moved into columns (4 MB batches parse ~20 % slower), and the per-batch work in Python (cutting, collecting
#: the scanner's columns) is paid half as often as with 512 KB (a 303 MB trace on 2 cores: 0.43 against 0.49 s
#: with the C scanner's thread, 0.53 against 0.59 s on one thread, 1.86 against 1.98 s without the scanner)
BATCH_BYTES = 1 << 20

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


#: the JSON names of the ``args`` members tracekit reads (both decoders: :class:`Args` and the typed path's)
ARG_NAMES = {
    "external_id": "External id", "external_id_legacy": "external id",
    "collective": "Collective name", "in_nelems": "In msg nelems", "out_nelems": "Out msg nelems",
    "in_size": "In msg size", "out_size": "Out msg size", "group_size": "Group size",
    "pg_name": "Process Group Name", "pg_desc": "Process Group Description", "pg_id": "Process Group ID",
    "pg_ranks": "Process Group Ranks", "seq": "Seq", "comms_id": "Comms Id", "comm_rank": "Rank",
    "src_rank": "Src Rank", "dst_rank": "Dst Rank", "input_dims": "Input Dims",
    "input_dims_legacy": "Input dims", "input_type": "Input type", "label_name": "name",
    "wait_stream": "wait_on_stream", "wait_correlation": "wait_on_cuda_event_record_corr_id",
}


class Args(msgspec.Struct, frozen=True, gc=False, rename=ARG_NAMES):
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
        idx = pc.fill_null(arr.indices, len(local)).to_numpy(zero_copy_only=False)
        return self.encode_local(local, idx)

    def encode_local(self, local: list[str], idx: np.ndarray) -> pa.Array:
        """Codes into a batch's own dictionary ``local`` (strings in order of first appearance; ``len(local)`` or
        -1 for null) as int32 codes into this dictionary, new strings added in that order (nulls stay null)."""
        mapping = np.empty(len(local) + 1, dtype=np.int32)
        for i, v in enumerate(local):
            c = self.code.get(v)
            if c is None:
                c = self.code[v] = len(self.values)
                self.values.append(v)
            mapping[i] = c
        mapping[-1] = -1
        codes = mapping[idx]
        return pa.array(codes, mask=codes < 0)

    def comm_flags_of(self, local: list[str]) -> np.ndarray:
        """Per string of ``local``, whether it may name an event carrying collective metadata, plus a last False
        (null); the dictionary itself is left as it is."""
        flags = self.comm_flags()
        out = np.zeros(len(local) + 1, dtype=bool)
        for i, v in enumerate(local):
            c = self.code.get(v)
            out[i] = flags[c] if c is not None else _may_carry_comm(v)
        return out

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
        #: the C batch scanner (``parsers/kineto/scan.c``), or None: not built, or ``TRACEKIT_NO_EXTENSION=1``
        self.scan: Callable[[bytes], Any] | None = native_scan()

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
            table = _combined(pa.Table.from_batches(self.batches, schema=RAW)) if self.batches else RAW.empty_table()
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


def _combined(table: pa.Table) -> pa.Table:
    """``table.combine_chunks()``, two columns at a time: first touches of the fresh memory are most of its cost, and
    two threads take them in parallel (a 303 MB trace's 645 k rows: 27-45 ms instead of 49-64 ms on 2 cores)."""
    with ThreadPoolExecutor(2, thread_name_prefix="tracekit-combine") as pool:
        columns = list(pool.map(lambda col: pa.concat_arrays(col.chunks), table.columns))
    return pa.Table.from_arrays(columns, schema=table.schema)


def native_scan() -> Callable[[bytes], Any] | None:
    """:func:`tracekit.parsers.kineto.scan.scan`, or None where the extension is not built or
    ``$TRACEKIT_NO_EXTENSION`` is set (to anything but ``0`` or nothing): then the batches go the msgspec way.
    Also None under a recursion limit so low that msgspec might refuse JSON nested less deeply than the scanner
    refuses it (64 levels)."""
    if os.environ.get("TRACEKIT_NO_EXTENSION", "0") not in ("", "0") or sys.getrecursionlimit() < 500:
        return None
    try:
        from . import scan
    except ImportError:
        return None
    return scan.scan


def _may_carry_comm(name: str) -> bool:
    return (name == "record_param_comms" or name.startswith(("nccl:", "gloo:", "c10d::", "ucc:", "mpi:"))
            or NCCL_KERNEL.match(name) is not None)

