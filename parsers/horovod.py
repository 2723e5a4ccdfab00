"""Horovod timeline parser (FORMATS.md section 3, damage in 5.3).

A Horovod timeline is one JSON array written by the coordinator (rank 0) only. Its "processes" are
*tensors*: ``pid`` N is the N-th tensor name seen, named by a ``process_name`` metadata record. Per
tensor the writer emits ``B NEGOTIATE_<OP>`` -> rank ticks (``X`` named by the rank) -> ``E`` ->
``B <OP>`` -> (``B`` activity -> ``E``)* -> ``E`` carrying ``dtype``/``shape``. ``E`` records have no
name; records are not in time order across tensors. Both writer eras are read:

* Horovod <= 0.20.0: ``[`` then one record per line ending ``},``, never closed; ``ts`` is relative to
  an unknown origin (timeline init or boot)  ->  ``meta["clock"] = "relative_unknown"``.
* Horovod >= 0.20.1: a header record ``{"name": "process_name", "ph": "M", "pid": 0, "args":
  {"start_time_since_epoch_in_micros": T0}}``; events concatenated on one line; valid JSON after every
  record  ->  absolute time = T0 + ``ts``, ``meta["clock"] = "epoch"``.

How it works, and why (a timeline can be several GB):

1. Bytes come from :func:`parsers.source.iter_blocks` (gzip sniffed by magic). A block filter repairs
   tensor names that Horovod wrote without JSON escaping (a ``"`` or ``\\`` in a user-given name would
   otherwise derail every later record). Only ``process_name`` records hold names; they are found by a
   substring search for ``{"name"``, and a name runs from ``"args": {"name": "`` to the last ``"}}`` on
   its line (Horovod ends every metadata record with a newline; FORMATS.md 5.3). In Horovod's own layout
   (``{"ph": ...`` first) names are raw and are escaped verbatim; in a rewrite with reordered keys a name
   is only touched when it is not valid JSON string content.
2. :func:`parsers.json_stream.stream_array` splits the array into ~4 MB batches of complete records
   (tolerating a missing ``]``, a trailing ``,`` and a record cut anywhere).
3. Each batch is decoded by a typed msgspec decoder into structs, and the columns (phase code, name
   code, ``ts`` in ns, pid) are pulled out with ``map``/``attrgetter`` into ``np.fromiter`` (C-level
   iteration, no Python frame per record). A batch that does not fit the fast types (float ``ts``,
   string pid, ``null`` name: third-party rewrites) goes through a lenient decoder; an element that is
   not JSON at all is skipped and reported with its byte offset.
4. B/E pairing is vectorised per batch: records (plus the still-open ``B`` s carried from earlier
   batches) are stably sorted by pid, keeping file order; the stack depth is a per-pid cumulative sum
   of +1 (B) / -1 (E) reflected at 0 (an ``E`` at depth 0 has no ``B``: counted, dropped); a matched
   ``E`` pairs with the previous ``B`` at the same (pid, depth). ``B`` s left open are the only record
   state carried to the next batch (per pid, a stack of at most a few records). ``B`` s still open at
   the end are closed at the last event ``ts`` of the file and flagged ``truncated``.
5. Op instances: a level-0 ``NEGOTIATE_*`` starts a new instance of its tensor; the top-level op that
   follows it joins that instance; a top-level op not preceded by a negotiation (a rewrite that lost
   it) starts its own. Ticks belong to the instance whose ``NEGOTIATE_*`` encloses them.
6. Each batch's paired events become an output chunk right away, and their negotiation, op and
   transfer extents and tick statistics are folded into per-instance arrays by vectorised scatters.
   At the end, bytes, collectives, fusion groups and iterations are computed over the instance arrays,
   and the chunks become Arrow chunks mostly without copying (constant and all-null columns share one
   zero buffer). So memory is the result tables plus a working set of about one batch, whatever the
   file size (benchmarks/horovod_parse.py measures it).

Output (``ParsedFile``, format ``"horovod"``)
---------------------------------------------

Times are int64 ns: ``(T0 + ts) * 1000`` with the >= 0.20.1 header, else ``ts * 1000`` on an unknown
origin (``meta["clock"]``). Ranks: only rank 0 writes, so every row has ``rank`` 0, and rows are
(job, tensor) rather than (rank, stream).

``events`` (tracekit.schema.EVENTS), one row per B/E pair. Rows come in chunks, one per input batch,
each sorted by ``start_ns`` (the table as a whole is not: sort it when you need global time order; it is
nearly sorted, so that is cheap). Phases still open at the end are the last chunk. Columns:

* ``rank`` 0; ``lane`` ``horovod/<tensor name>`` (``horovod/pid <N>`` when the name record is
  missing); ``name`` the phase name verbatim; ``cat`` ``horovod``; ``pid`` Horovod's pid (= tensor
  index, restarting at 1 in each file); ``start_ns``/``dur_ns`` from the B and E ``ts``.
* ``kind``: ``comm`` for transfer phases ``NCCL_*``, ``MPI_*``, ``GLOO_*``, ``CCL_*``; ``wait`` for
  ``NEGOTIATE_*`` (rank 0 waiting for *other ranks* to submit the tensor: straggler skew, not network
  time) **and** for ``WAIT_FOR_DATA``/``WAIT_FOR_OTHER_TENSOR_DATA`` (waiting for the *framework's
  producer* on this rank, i.e. unfinished compute; tell them apart by ``name``); ``queue`` for
  ``QUEUE`` (behind earlier work on the communication stream); ``memory`` for ``MEMCPY_*`` and
  ``COPY_ALLGATHER_OUTPUT``; ``annotation`` for the top-level op (``ALLREDUCE`` ...), ``INIT_*``,
  ``ALLOCATE_*`` and any phase this parser does not know.
* ``bytes`` on the top-level op and on ``comm`` rows: product(shape) x size(dtype) from the top-level
  ``E`` args of that instance (the tensor Horovod logs is the op's *output*: for allgather the gathered
  result, for reduce-scatter this rank's shard). Null when dtype is ``<unknown>`` (e.g. bfloat16),
  missing (the op failed) or the instance never ended.
* ``iteration`` from ``horovod_iterations`` (null before the first iteration); ``collective_id`` the
  ``collectives`` row of the event's op instance (null for a negotiation that never got an op, and for
  ``ERROR`` responses). ``tid``, ``device``, ``stream``, ``correlation``, ``external_id``: null.

**Fused tensors:** every tensor of a fused response repeats the same activities, a few µs apart. Their
intervals describe *one* transfer: downstream must **union** them (e.g. per ``fusion_group``), never sum.

``collectives`` (tracekit.schema.COLLECTIVES), one row per tensor per top-level op instance (not for
``ERROR`` responses): ``rank`` 0; ``pg`` ``horovod``; ``seq`` the tensor's repetition index (0, 1, ...;
so the key is (``lane``, ``seq``), not ``seq`` alone); ``op`` one of allreduce, allgather, broadcast,
reduce_scatter, all_to_all, adasum, join, barrier; ``dtype`` Horovod's name; ``count`` product(shape)
of the logged output; ``bytes`` S of the nccl-tests convention: the output bytes, except reduce_scatter
= ``nranks`` x output bytes (approximate when the split is uneven; null without ``nranks``);
``nranks`` the world size seen in negotiation ticks (``meta["world_size"]``, null without ticks);
``start_ns``/``end_ns`` the union extent of the instance's transfer (``comm``) phases, null when it has
none (join, barrier, a cut file); ``lane``; ``source`` ``horovod``.

``tables["horovod_ticks"]``, one row per rank tick: ``instance`` (row of ``horovod_instances``, null
for a tick outside any ``NEGOTIATE_*``, e.g. its ``B`` was cut away; join it for ``seq``), ``tensor``,
``rank``, ``ts_ns``, ``dur_ignored`` (the record carried a non-zero ``dur``; Horovod writes 0, some
rewrites put bogus values there; it is never used).

``tables["horovod_instances"]``, one row per op instance of a tensor (the per-instance negotiation
summary): ``instance``, ``pid``, ``tensor``, ``lane``, ``seq``, ``phase`` (raw top-level name) and ``op``
(normalised; null if the instance never got past negotiation), ``collective_id``,
``negotiate_start_ns``/``negotiate_end_ns``, ``ticks``, ``first_tick_ns``/``last_tick_ns``,
``straggler_rank`` (the rank that ticked last = the rank everybody waited for on this tensor; null with
fewer than two ticks), ``negotiation_wait_ns`` = last tick - first tick (how long the earliest rank
waited for the straggler, as rank 0 saw it), ``op_start_ns``/``op_end_ns``,
``transfer_start_ns``/``transfer_end_ns`` (extent of the comm phases), ``transfer_ns`` (their union),
``dtype``, ``shape``, ``count``, ``bytes`` (output bytes), ``fusion_group``/``fusion_size`` (see
below), ``iteration``, ``truncated`` (an event of the instance was closed by the parser).

``fusion_group``: instances whose transfer intervals overlap or lie within ``FUSION_TOL_NS`` (2 µs) of
each other are grouped (connected components in time order). Normally that is exactly one fused
response; back-to-back responses may chain into one group, which is harmless for a union.

``tables["horovod_iterations"]`` (tracekit.schema.ITERATIONS): iterations from **tensor repetition**:
the tensors seen most often (N instances) are the every-iteration gradients; iteration k starts at the
earliest start of their k-th instance and ends where k+1 starts (the last one at the last event end).
With no repeated tensor the whole trace is one iteration (``method`` ``whole-trace``).
``CYCLE_START`` markers are *not* used for iterations: they mark Horovod's background-loop cycles
(every ``HOROVOD_CYCLE_TIME`` ms, many per training step); they are kept in
``tables["horovod_cycles"]`` (``cycle``, ``start_ns``, ``end_ns`` = next cycle or the last event).
``meta["iteration_method"]`` says which method made the table; ``meta["cycles"]`` counts the markers.

``tables["horovod_flags"]``: ``row`` (row of ``events``) and ``flag``; ``truncated`` = a ``B`` never
closed, ended by the parser at the last event ``ts`` of the file.

``meta``: ``format_version`` (``>=0.20.1`` with the epoch header, else ``<=0.20.0``), ``clock``,
``start_time_since_epoch_us``, ``array_closed``, ``records``, ``tensors``, ``instances``,
``world_size``, ``iteration_method``, ``cycles``, ``dangling``, ``repaired_names``, ``errors`` and the
damage counters (``e_without_b``, ``x_without_b``, ``bogus_dur``, ``no_pid``, ``no_ts``, ``unknown_ph``,
``unknown_instants``, ``skipped_records``, ``pair_anomalies``, ``name_conflicts``,
``header_conflicts``). String columns of the extra tables are dictionary-encoded.

Seen in real Horovod 0.28.1 timelines (tests/data/horovod): ``BROADCAST`` ends carry no dtype/shape, so
broadcasts have null bytes; with the response cache (the default) only a tensor's first negotiation has
rank ticks, so later instances have no straggler; ``CYCLE_START`` comes about every millisecond; a
clean shutdown can still leave a ``NEGOTIATE_*`` open (the writer drops its queue), and a SIGKILLed
writer leaves valid JSON with open phases rather than a cut record.

Damage: a cut file keeps every complete record and reports the bytes lost (``bytes_lost`` and a
Diagnostic with the offset); ``E``/``X`` without ``B``, unknown phases, bogus tick durations, unparsable
records and repaired names are counted in ``meta`` and reported as Diagnostics. An empty file, a file
holding only ``[`` (a <= 0.20.0 timeline that never got a record) and input that is not a JSON array
raise :class:`TraceError` naming the file: there is nothing to analyse, and silence would hide it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, ClassVar

import msgspec
import numpy as np
import pyarrow as pa

from tracekit.diagnostics import Diagnostic, TraceError
from tracekit.schema import COLLECTIVES, DICT_STR, EVENTS, ITERATIONS, ParsedFile
from tracekit.schema import table as schema_table

from .json_stream import Batch, End, stream_array
from .source import iter_blocks

PARSER_VERSION = "3"
FORMAT = "horovod"
#: transfer intervals closer than this belong to one fusion group
FUSION_TOL_NS = 2_000
#: input block and record batch sizes (module attributes so tests can make them tiny)
_BLOCK_BYTES = 4 << 20
_BATCH_BYTES = 4 << 20

# ---------------------------------------------------------------------------------------------------
# Phase vocabulary

_OPS = {
    "ALLREDUCE": "allreduce",
    "ALLGATHER": "allgather",
    "BROADCAST": "broadcast",
    "REDUCESCATTER": "reduce_scatter",
    "ALLTOALL": "all_to_all",
    "ADASUM": "adasum",
    "JOIN": "join",
    "BARRIER": "barrier",
}
_TRANSFER_PREFIXES = ("NCCL_", "MPI_", "GLOO_", "CCL_")
_DTYPE_SIZE = {
    "uint8": 1, "int8": 1, "bool": 1, "uint16": 2, "int16": 2, "float16": 2, "bfloat16": 2,
    "int32": 4, "float32": 4, "int64": 8, "float64": 8,
}


def phase_kind(name: str) -> str:
    """The event kind (tracekit.schema.KINDS) of a Horovod phase name."""
    if name.startswith(_TRANSFER_PREFIXES):
        return "comm"
    if name.startswith("NEGOTIATE_") or name.startswith("WAIT_FOR_"):
        return "wait"
    if name == "QUEUE":
        return "queue"
    if name.startswith("MEMCPY_") or name == "COPY_ALLGATHER_OUTPUT":
        return "memory"
    return "annotation"


def _shape_count(shape: str | None) -> int | None:
    """Elements of a Horovod ``TensorShape::DebugString`` (``"[1024, 4096]"``; ``"[]"`` is a scalar)."""
    if shape is None:
        return None
    s = shape.strip()
    if not (s.startswith("[") and s.endswith("]")):
        return None
    body = s[1:-1].strip()
    n = 1
    if not body:
        return n
    for part in body.split(","):
        part = part.strip()
        if not part.lstrip("-").isdigit():
            return None
        n *= int(part)
    return n if n >= 0 else None


def sniff(head: bytes) -> bool:
    """True when ``head`` (the first 64 KiB, decompressed) looks like a Horovod timeline.

    A JSON array without Kineto's markers (``traceEvents``, ``"cat"``, ``"tid"``: Horovod writes
    neither) holding Horovod records: ``NEGOTIATE_*`` phases, ``CYCLE_START``, the >= 0.20.1 epoch
    header, or tensor ``process_name`` rows. A head that is only ``[`` is claimed as well: that is
    what Horovod <= 0.20.0 leaves when no record was written, and :func:`parse` then says so.
    """
    s = head.lstrip()
    if not s.startswith(b"["):
        return False
    if not s[1:].strip():
        return True
    if b'"traceEvents"' in head or b'"cat"' in head or b'"tid"' in head:
        return False
    if b'"ph"' not in head:
        return False
    if b'"NEGOTIATE_' in head or b'"CYCLE_START"' in head or b'"start_time_since_epoch_in_micros"' in head:
        return True
    return b'"process_name"' in head and b'"process_sort_index"' in head


# ---------------------------------------------------------------------------------------------------
# Name repair (unescaped tensor names)

_ARGS_BEFORE = re.compile(rb'"args"\s*:\s*\Z')
_NAME_KEY_END = re.compile(rb'\s*:\s*"')


def _name_openers(buf: bytes) -> Iterator[tuple[int, int]]:
    """(start of ``"args"``, start of the name) of every ``"args": {"name": "`` in ``buf``.

    Found by a plain substring search for ``{"name"`` (in Horovod's layout only the two metadata
    records of each tensor contain it, so this is a handful of hits per MB) and a check of the bytes
    around each hit.
    """
    i = buf.find(b'{"name"')
    while i >= 0:
        before = _ARGS_BEFORE.search(buf, max(0, i - 32), i)
        if before is not None:
            after = _NAME_KEY_END.match(buf, i + 7)
            if after is not None:
                yield before.start(), after.end()
        i = buf.find(b'{"name"', i + 7)
_NAME_CLOSE = re.compile(rb'"\s*\}\s*\}')
#: a name without anything to escape, closed by '"}}' as Horovod closes it
_CLEAN_NAME = re.compile(rb'[^"\\\x00-\x1f]*"\s*\}\s*\}')
#: a properly escaped JSON string body, closed by '"' + '}'
_JSON_NAME = re.compile(rb'(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"\s*\}')
#: the phase of an event record (B/E/X/i): Horovod's writer puts it first, right after the "{"
_EVENT_PH = re.compile(rb'"ph"\s*:\s*"[BEXi]"')
_HOLD = 256  # bytes held back at a block end (an opener may straddle blocks)
_MAX_NAME = 1 << 20


def _escape_raw(name: bytes) -> bytes:
    """JSON-escape raw name bytes (quotes, backslashes, control bytes); UTF-8 passes through."""
    out = name.replace(b"\\", b"\\\\").replace(b'"', b'\\"')
    return re.sub(rb"[\x00-\x1f]", lambda m: b"\\u%04x" % m.group()[0], out)


class _NameRepair:
    """A block filter re-escaping tensor names Horovod wrote raw, with an offset map back to the input.

    Horovod writes ``"args": {"name": "<tensor>"}}`` without escaping. The name runs to the next
    ``"}}``. Whether names are raw is decided once, from the first event record: Horovod's writer puts
    ``"ph"`` first (``{"ph": "B", ...``), so then every name is taken verbatim and a quote, backslash or
    control byte in it is escaped (``a\\b`` stays two characters, not a backspace). Third-party
    rewrites (keys reordered by a JSON library) escape properly, so there a name is only repaired when
    it is not valid JSON string content. Only ``process_name`` records match the opener, so the cost is
    one regex scan per block plus one check per tensor.
    """

    def __init__(self, blocks: Iterable[tuple[int, bytes]]) -> None:
        self._blocks = blocks
        self.repaired = 0
        self.raw_names: bool | None = None  # None until the first event record is seen
        self.total_in = 0  # input bytes consumed so far
        self.stream_error: TraceError | None = None
        self._shift_at: list[int] = []  # output offsets where a repair ended
        self._shift: list[int] = []  # cumulative bytes added up to there

    def to_input(self, out_offset: int) -> int:
        """Map an offset in the repaired stream back to the input stream."""
        if not self._shift_at:
            return out_offset
        i = int(np.searchsorted(np.asarray(self._shift_at), out_offset, side="right")) - 1
        return out_offset - (self._shift[i] if i >= 0 else 0)

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        carry = b""
        out_off = 0
        added = 0
        try:
            for _, block in self._blocks:
                self.total_in += len(block)
                buf = carry + block if carry else block
                done, carry, added = self._fix(buf, False, out_off, added)
                if done:
                    yield out_off, done
                    out_off += len(done)
        except TraceError as exc:  # corrupt/truncated gzip: keep what inflated
            self.stream_error = exc
        if carry:
            done, _, added = self._fix(carry, True, out_off, added)
            if done:
                yield out_off, done

    def _fix(self, buf: bytes, final: bool, out_off: int, added: int) -> tuple[bytes, bytes, int]:
        """Repair names in ``buf``; return (bytes to emit, bytes to hold back, added so far)."""
        if self.raw_names is None:
            m = _EVENT_PH.search(buf)
            if m is not None:
                self.raw_names = not buf[buf.rfind(b"{", 0, m.start()) + 1 : m.start()].strip()
            elif final or len(buf) > _MAX_NAME:
                self.raw_names = True
        limit = len(buf) if final else max(0, len(buf) - _HOLD)
        parts: list[bytes] = []
        pos = 0
        raw = self.raw_names if self.raw_names is not None else True
        for opener, start in _name_openers(buf):
            if start > limit and not final:
                break
            clean = _CLEAN_NAME.match(buf, start)
            if clean is not None:
                continue  # the usual case: no quote, backslash or control byte before '"}}'
            if not raw:
                esc = _JSON_NAME.match(buf, start)
                if esc is not None:
                    continue  # properly escaped by a rewriter
            # Horovod's M records end their line: the name runs to the last '"}}' before the newline
            eol = buf.find(b"\n", start, start + _MAX_NAME)
            if eol < 0:
                if not final and len(buf) - start < _MAX_NAME:
                    limit = min(limit, opener)  # wait for the rest of this line
                    break
                eol = min(len(buf), start + _MAX_NAME)
            closes = list(_NAME_CLOSE.finditer(buf, start, eol))
            close = closes[-1] if closes else None
            if close is None:
                continue  # a cut record or no terminator: left to the JSON splitter
            body = buf[start : close.start()]
            fixed = _escape_raw(body)
            parts.append(buf[pos:start])
            parts.append(fixed)
            pos = close.start()
            added += len(fixed) - len(body)
            self.repaired += 1
            emitted = sum(len(p) for p in parts)
            self._shift_at.append(out_off + emitted)
            self._shift.append(added)
        limit = max(limit, pos)
        parts.append(buf[pos:limit])
        return b"".join(parts), buf[limit:], added


# ---------------------------------------------------------------------------------------------------
# Record decoding

_NO_TS = -(1 << 63)
_NO_PID = -(1 << 63)
_MAX_TS_US = (1 << 63) // 1000 - 1
_PID_TABLE_MAX = 1 << 22

PH_B, PH_E, PH_X, PH_I, PH_M, PH_OTHER = 0, 1, 2, 3, 4, 5
_PH_CODES = {"B": PH_B, "E": PH_E, "X": PH_X, "i": PH_I, "I": PH_I, "M": PH_M}


class _Args(msgspec.Struct, gc=False):
    name: str | None = None
    dtype: str | None = None
    shape: str | None = None
    start_time_since_epoch_in_micros: int | None = None


class _Rec(msgspec.Struct, gc=False):
    """The fields of a Horovod record this parser uses (unknown keys are ignored)."""

    ph: str = ""
    name: str = ""
    ts: int = _NO_TS
    pid: int = _NO_PID
    dur: int = 0
    args: _Args | None = None


class _LooseRec(msgspec.Struct, gc=False):
    ph: Any = None
    name: Any = None
    ts: Any = None
    pid: Any = None
    dur: Any = None
    args: Any = None


_FAST = msgspec.json.Decoder(list[_Rec])
_GET_PH, _GET_NAME, _GET_TS, _GET_PID, _GET_DUR, _GET_ARGS = (
    attrgetter(f) for f in ("ph", "name", "ts", "pid", "dur", "args"))
_GET_DTYPE, _GET_SHAPE = attrgetter("dtype"), attrgetter("shape")


class _Codes(dict):
    """str -> dense int code; a missing key gets the next code (so lookups can run in ``map``)."""

    def __missing__(self, key: str | None) -> int:
        code = self[key] = len(self)
        return code


class _PhCodes(dict):
    def __missing__(self, key: str) -> int:
        return PH_OTHER


_PH_LOOKUP = _PhCodes(_PH_CODES)
_LOOSE = msgspec.json.Decoder(list[_LooseRec])
_LOOSE_ONE = msgspec.json.Decoder(_LooseRec)
#: what a damaged batch or record raises in the decoders
_DAMAGE = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError)


def _loose_int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and np.isfinite(v):
        return round(v)
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            try:
                f = float(v)
            except ValueError:
                return None
            return round(f) if np.isfinite(f) else None
    return None


def _loose_ts_ns(v: Any) -> int:
    """``ts`` in µs (int, float or numeric string) to ns; ``_NO_TS`` when unusable."""
    if isinstance(v, bool) or v is None:
        return _NO_TS
    if isinstance(v, int):
        return v * 1000 if abs(v) <= _MAX_TS_US else _NO_TS
    if isinstance(v, str):
        try:
            v = float(v) if any(c in v for c in ".eE") else int(v)
        except ValueError:
            return _NO_TS
        return _loose_ts_ns(v)
    if isinstance(v, float) and np.isfinite(v) and abs(v) <= _MAX_TS_US:
        return round(v * 1000)
    return _NO_TS


def _loose_args(v: Any) -> _Args | None:
    if not isinstance(v, dict):
        return None

    def s(key: str) -> str | None:
        x = v.get(key)
        return None if x is None else str(x)

    start = _loose_int(v.get("start_time_since_epoch_in_micros"))
    return _Args(name=s("name"), dtype=s("dtype"), shape=s("shape"), start_time_since_epoch_in_micros=start)


@dataclass
class _Columns:
    """One batch of records as columns (``ts`` already in ns; ``_NO_TS``/``_NO_PID`` when absent)."""

    ph: np.ndarray
    name: np.ndarray
    ts: np.ndarray
    pid: np.ndarray
    dur_nonzero: np.ndarray
    meta: dict[int, _Args]  # position -> args of the M records (one or two per tensor)
    end_idx: np.ndarray  # positions of the E records carrying args (the top-level ends) ...
    end_dtype: np.ndarray  # ... their dtype and shape as codes of _Parser.dtypes / .shapes
    end_shape: np.ndarray


# ---------------------------------------------------------------------------------------------------
# Parser state


_MAX_I64 = np.iinfo(np.int64).max


class _Instances:
    """Per op instance, filled while streaming by vectorised scatters (grown by doubling)."""

    FIELDS: ClassVar[dict[str, tuple[Any, Any]]] = {
        "pid": (np.int32, -1),  # pid code
        "seq": (np.int64, -1),
        "neg_start": (np.int64, _NO_TS),
        "neg_end": (np.int64, _NO_TS),
        "op_name": (np.int32, -1),
        "op_start": (np.int64, _NO_TS),
        "op_end": (np.int64, _NO_TS),
        "op_argref": (np.int64, -1),
        "trunc": (np.bool_, False),
        "tr_start": (np.int64, _MAX_I64),
        "tr_end": (np.int64, _NO_TS),
        "n_ticks": (np.int64, 0),
        "first_tick": (np.int64, _MAX_I64),
        "last_tick": (np.int64, _NO_TS),
        "straggler": (np.int32, -1),
    }

    def __init__(self) -> None:
        self.n = 0
        self.a: dict[str, np.ndarray] = {k: np.full(1024, fill, dt) for k, (dt, fill) in self.FIELDS.items()}

    def grow(self, n: int) -> None:
        self.n = n
        cap = next(iter(self.a.values())).size
        if n <= cap:
            return
        cap = max(n, cap + cap // 2)  # x1.5: less slack than doubling, still amortised O(1)
        for k, (dt, fill) in self.FIELDS.items():
            new = np.full(cap, fill, dt)
            new[: self.a[k].size] = self.a[k]
            self.a[k] = new

    def __getitem__(self, key: str) -> np.ndarray:
        return self.a[key]

    def final(self, key: str) -> np.ndarray:
        """The filled part of a field as its own array; the field's capacity is freed right away."""
        return self.a.pop(key)[: self.n].copy()


def _cat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.empty(0, dtype)


def _grow(a: np.ndarray, n: int, fill: Any) -> np.ndarray:
    if a.size >= n:
        return a
    out = np.full(max(n, 2 * a.size), fill, dtype=a.dtype)
    out[: a.size] = a
    return out


def _group_starts(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For sorted ``keys``: the index of each row's group start, and the starts themselves."""
    n = keys.size
    is_start = np.ones(n, dtype=bool)
    if n:
        is_start[1:] = keys[1:] != keys[:-1]
    starts = np.flatnonzero(is_start)
    gidx = np.cumsum(is_start) - 1
    return starts[gidx] if n else np.empty(0, np.int64), starts


def _ffill_index(valid: np.ndarray, group_start: np.ndarray) -> np.ndarray:
    """Index of the last ``valid`` row at or before each row within its group, or -1."""
    idx = np.where(valid, np.arange(valid.size), -1)
    idx = np.maximum.accumulate(idx) if idx.size else idx
    return np.where(idx >= group_start, idx, -1)


class _Parser:
    """Streaming state: dictionaries, per-pid state, open ``B`` stacks and the accumulated output."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.names: dict[str, int] = _Codes()
        self.pids: dict[int, int] = {}  # Horovod pid -> dense code
        self.tensor: dict[int, str] = {}  # Horovod pid -> tensor name
        self.dtypes: dict[str | None, int] = _Codes()
        self.shapes: dict[str | None, int] = _Codes()
        self.arg_dtype: list[np.ndarray] = []
        self.arg_shape: list[np.ndarray] = []
        self.n_args = 0
        self.epoch_us: int | None = None
        self.order_base = 0
        self.records = 0
        self.cycles: list[np.ndarray] = []
        self.max_ts = _NO_TS
        self.diagnostics: list[Diagnostic] = []
        self.counts: dict[str, int] = {
            "e_without_b": 0, "x_without_b": 0, "no_pid": 0, "no_ts": 0, "unknown_ph": 0,
            "unknown_instants": 0, "skipped_records": 0, "bogus_dur": 0, "pair_anomalies": 0,
            "name_conflicts": 0, "header_conflicts": 0, "bad_rank": 0, "repaired_utf8": 0,
        }
        self.pid_table = np.full(1024, -1, np.int64)  # Horovod pid -> code, for small pids
        # per-pid state (indexed by pid code)
        self.last0_neg = np.zeros(16, dtype=bool)
        self.cur_inst = np.full(16, -1, dtype=np.int64)
        self.seq_next = np.zeros(16, dtype=np.int64)
        # instances, and the output as chunks (one per batch) of nearly final columns
        self.inst = _Instances()
        self.n_inst = 0
        self.chunks: list[dict[str, Any]] = []
        self.tick_chunks: list[dict[str, np.ndarray]] = []
        self.comm_parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.first_start = _MAX_I64
        self.last_end = _NO_TS
        self.max_rank = -1
        self._lookups: tuple[int, np.ndarray, np.ndarray, np.ndarray] | None = None
        self._scratch = np.full(1024, -1, np.int64)
        # open B records carried between batches, in (pid, file order) order
        self.carry = {
            "pid": np.empty(0, np.int64), "order": np.empty(0, np.int64), "ts": np.empty(0, np.int64),
            "name": np.empty(0, np.int32), "inst": np.empty(0, np.int64),
        }

    # -- names ----------------------------------------------------------------------------------------

    def name_code(self, s: str) -> int:
        return self.names.setdefault(s, len(self.names))

    def _name_table(self) -> list[str]:
        out = [""] * len(self.names)
        for k, v in self.names.items():
            out[v] = k
        return out

    def lookups(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per name code: is NEGOTIATE_*, is a transfer (comm) phase, the rank of a tick (-1: none)."""
        if self._lookups is None or self._lookups[0] != len(self.names):
            table = self._name_table()
            neg = np.fromiter((t.startswith("NEGOTIATE_") for t in table), bool, len(table))
            comm = np.fromiter((t.startswith(_TRANSFER_PREFIXES) for t in table), bool, len(table))
            rank = np.fromiter((int(t) if t.strip().isdigit() and len(t) < 10 else -1 for t in table),
                               np.int32, len(table))
            self._lookups = (len(table), neg, comm, rank)
        return self._lookups[1], self._lookups[2], self._lookups[3]

    # -- decoding -------------------------------------------------------------------------------------

    def decode(self, batch: Batch, to_input: Any) -> _Columns:
        """Columns of one batch: the typed decoder, else the lenient one, else record by record."""
        try:
            return self._columns_fast(_FAST.decode(batch.data))
        # damage (bad JSON, wrong types, invalid UTF-8, nesting deeper than the decoder's stack, integers
        # beyond int64) sends the batch the lenient way
        except (*_DAMAGE, OverflowError):
            pass
        try:
            loose = _LOOSE.decode(batch.data)
        except _DAMAGE:
            loose = []
            for i in range(len(batch)):  # only for a damaged batch: record by record
                raw = batch.element(i)
                try:
                    try:
                        loose.append(_LOOSE_ONE.decode(raw))
                    except UnicodeDecodeError:
                        fixed = raw.decode("utf-8", "replace").encode()
                        loose.append(_LOOSE_ONE.decode(fixed))
                        self.counts["repaired_utf8"] += 1
                except _DAMAGE:
                    text = raw.strip()
                    if not text:
                        continue
                    self.counts["skipped_records"] += 1
                    if self.counts["skipped_records"] <= 5:
                        at = batch.element_offset(i) + len(raw) - len(raw.lstrip())
                        self.diagnostics.append(Diagnostic(
                            self.path, f"skipped a record that is not a JSON object: {text[:80]!r}",
                            offset=to_input(at)))
        return self._columns_loose(loose)

    def _columns_fast(self, recs: list[_Rec]) -> _Columns:
        n = len(recs)
        # C-level iteration (map, attrgetter, dict lookups that rarely miss): no Python frame per record
        ph = np.fromiter(map(_PH_LOOKUP.__getitem__, map(_GET_PH, recs)), dtype=np.int8, count=n)
        name = np.fromiter(map(self.names.__getitem__, map(_GET_NAME, recs)), dtype=np.int32, count=n)
        ts = np.fromiter(map(_GET_TS, recs), dtype=np.int64, count=n)
        pid = np.fromiter(map(_GET_PID, recs), dtype=np.int64, count=n)
        dur = np.fromiter(map(bool, map(_GET_DUR, recs)), dtype=bool, count=n)
        has_args = np.fromiter(map(bool, map(_GET_ARGS, recs)), dtype=bool, count=n)
        ai = np.flatnonzero(has_args)
        meta = {i: recs[i].args for i in ai[ph[ai] == PH_M].tolist()}
        end_idx = ai[ph[ai] == PH_E]
        ends = list(map(_GET_ARGS, map(recs.__getitem__, end_idx.tolist())))
        end_dtype = np.fromiter(map(self.dtypes.__getitem__, map(_GET_DTYPE, ends)), np.int64, len(ends))
        end_shape = np.fromiter(map(self.shapes.__getitem__, map(_GET_SHAPE, ends)), np.int64, len(ends))
        ok = ts != _NO_TS
        big = ok & (np.abs(np.where(ok, ts, 0)) > _MAX_TS_US)
        ts = np.where(ok & ~big, ts * 1000, _NO_TS)
        return _Columns(ph, name, ts, pid, dur, meta, end_idx, end_dtype, end_shape)  # type: ignore[arg-type]

    def _columns_loose(self, recs: list[_LooseRec]) -> _Columns:
        n = len(recs)
        ph = np.empty(n, np.int8)
        name = np.empty(n, np.int32)
        ts = np.empty(n, np.int64)
        pid = np.empty(n, np.int64)
        dur = np.zeros(n, bool)
        meta: dict[int, _Args] = {}
        end_idx: list[int] = []
        end_dtype: list[int] = []
        end_shape: list[int] = []
        for i, r in enumerate(recs):
            ph[i] = _PH_CODES.get(r.ph, PH_OTHER) if isinstance(r.ph, str) else PH_OTHER
            name[i] = self.name_code("" if r.name is None else str(r.name))
            ts[i] = _loose_ts_ns(r.ts)
            p = _loose_int(r.pid)
            pid[i] = _NO_PID if p is None or not -(1 << 62) < p < (1 << 62) else p
            d = r.dur
            dur[i] = d is not None and d != 0 and d != 0.0
            a = _loose_args(r.args)
            if a is None:
                continue
            if ph[i] == PH_M:
                meta[i] = a
            elif ph[i] == PH_E:
                end_idx.append(i)
                end_dtype.append(self.dtypes.setdefault(a.dtype, len(self.dtypes)))
                end_shape.append(self.shapes.setdefault(a.shape, len(self.shapes)))
        return _Columns(ph, name, ts, pid, dur, meta, np.asarray(end_idx, np.int64),
                        np.asarray(end_dtype, np.int64), np.asarray(end_shape, np.int64))

    # -- one batch ------------------------------------------------------------------------------------

    def feed(self, c: _Columns) -> None:
        n = c.ph.size
        order = self.order_base + np.arange(n, dtype=np.int64)
        self.order_base += n
        self.records += n
        self._metadata(c)
        argref = self._end_args(c)

        ph = c.ph
        cyc_code = self.names.get("CYCLE_START")
        inst_mask = ph == PH_I
        if inst_mask.any():
            is_cycle = inst_mask & (c.name == cyc_code) & (c.ts != _NO_TS)
            self.cycles.append(c.ts[is_cycle])
            self.counts["unknown_instants"] += int((inst_mask & ~is_cycle).sum())
        self.counts["unknown_ph"] += int((ph == PH_OTHER).sum())

        bex = ph <= PH_X
        no_ts = bex & (c.ts == _NO_TS)
        no_pid = bex & ~no_ts & (c.pid == _NO_PID)
        self.counts["no_ts"] += int(no_ts.sum())
        self.counts["no_pid"] += int(no_pid.sum())
        keep = np.flatnonzero(bex & ~no_ts & ~no_pid)
        if keep.size:
            ts = c.ts[keep]
            self.max_ts = max(self.max_ts, int(ts.max()))
            self._pair(self._pid_codes(c.pid[keep]), order[keep], ts, ph[keep], c.name[keep],
                       argref[keep], c.dur_nonzero[keep])

    def _metadata(self, c: _Columns) -> None:
        """Tensor names and the epoch header from ``M`` records (one per tensor: a Python loop is fine)."""
        for i, a in c.meta.items():
            if a.start_time_since_epoch_in_micros is not None:
                if self.epoch_us is None:
                    self.epoch_us = a.start_time_since_epoch_in_micros
                elif self.epoch_us != a.start_time_since_epoch_in_micros:
                    self.counts["header_conflicts"] += 1
                continue
            pid = int(c.pid[i])
            if a.name is None or pid == _NO_PID:
                continue
            old = self.tensor.get(pid)
            if old is None:
                self.tensor[pid] = a.name
            elif old != a.name:
                self.counts["name_conflicts"] += 1

    def _end_args(self, c: _Columns) -> np.ndarray:
        """Per record: index into (arg_dtype, arg_shape) for an ``E`` carrying dtype/shape, else -1."""
        ref = np.full(c.ph.size, -1, dtype=np.int64)
        ref[c.end_idx] = self.n_args + np.arange(c.end_idx.size)
        self.n_args += c.end_idx.size
        self.arg_dtype.append(c.end_dtype)
        self.arg_shape.append(c.end_shape)
        return ref

    def _pid_codes(self, pids: np.ndarray) -> np.ndarray:
        """Dense codes of Horovod pids (small integers: a lookup array; anything else: np.unique)."""
        lo, hi = (int(pids.min()), int(pids.max())) if pids.size else (0, 0)
        if lo >= 0 and hi < _PID_TABLE_MAX:
            if hi >= self.pid_table.size:
                self.pid_table = _grow(self.pid_table, hi + 1, -1)
            codes = self.pid_table[pids]
            missing = codes < 0
            if missing.any():
                for q in np.unique(pids[missing]).tolist():
                    self.pid_table[q] = self.pids.setdefault(q, len(self.pids))
                codes = self.pid_table[pids]
        else:
            uniq, inv = np.unique(pids, return_inverse=True)
            codes = np.fromiter((self.pids.setdefault(int(q), len(self.pids)) for q in uniq), dtype=np.int64,
                                count=uniq.size)[inv]
        p = len(self.pids)
        self.last0_neg = _grow(self.last0_neg, p, False)
        self.cur_inst = _grow(self.cur_inst, p, -1)
        self.seq_next = _grow(self.seq_next, p, 0)
        return codes

    def _pair(self, pidc: np.ndarray, order: np.ndarray, ts: np.ndarray, ph: np.ndarray, name: np.ndarray,
              argref: np.ndarray, dur: np.ndarray) -> None:
        """Pair B/E per pid (vectorised), assign op instances, collect ticks; carry open Bs."""
        cr = self.carry
        k = cr["pid"].size
        pidc = np.concatenate([cr["pid"], pidc])
        order = np.concatenate([cr["order"], order])
        ts = np.concatenate([cr["ts"], ts])
        ph = np.concatenate([np.full(k, PH_B, np.int8), ph])
        name = np.concatenate([cr["name"], name])
        argref = np.concatenate([np.full(k, -1, np.int64), argref])
        dur = np.concatenate([np.zeros(k, bool), dur])
        carried_inst = np.concatenate([cr["inst"], np.full(pidc.size - k, -1, np.int64)])

        # group by pid, keeping file order (carried Bs come first in each pid: they are older)
        perm = np.argsort(pidc, kind="stable")
        pidc, order, ts, ph, name = pidc[perm], order[perm], ts[perm], ph[perm], name[perm]
        argref, dur, carried_inst = argref[perm], dur[perm], carried_inst[perm]
        carried = carried_inst >= 0
        n = pidc.size
        gstart, starts = _group_starts(pidc)
        gidx = np.cumsum(np.r_[True, pidc[1:] != pidc[:-1]]) - 1 if n else np.empty(0, np.int64)

        is_b, is_e, is_x = ph == PH_B, ph == PH_E, ph == PH_X
        step = is_b.astype(np.int64) - is_e.astype(np.int64)
        s = np.cumsum(step)
        s_g = s - (s[gstart] - step[gstart])  # depth walk per pid, from 0
        big = 2 * n + 2
        runmin = np.minimum.accumulate(s_g - gidx * big) + gidx * big
        depth = s_g - np.minimum(runmin, 0)  # reflected at 0: E without B leaves depth at 0
        before = np.empty(n, np.int64)
        if n:
            before[1:] = depth[:-1]
            before[starts] = 0
        e_ok = is_e & (before > 0)
        self.counts["e_without_b"] += int((is_e & ~e_ok).sum())
        level = np.where(is_e, before - 1, before)

        # match each E with the previous B at the same (pid, level)
        cand = np.flatnonzero(is_b | e_ok)
        lev = level[cand]
        k2 = gidx[cand] * (int(lev.max()) + 1 if lev.size else 1) + lev
        cperm = cand[np.argsort(k2, kind="stable")]
        k2s = np.sort(k2, kind="stable")
        pos_e = np.flatnonzero(e_ok[cperm])
        good = pos_e > 0
        good[good] = (k2s[pos_e[good] - 1] == k2s[pos_e[good]]) & is_b[cperm[pos_e[good] - 1]]
        self.counts["pair_anomalies"] += int((~good).sum())
        e_rows = cperm[pos_e[good]]
        b_rows = cperm[pos_e[good] - 1]
        closed = np.zeros(n, bool)
        closed[b_rows] = True
        open_b = is_b & ~closed

        # op instances: walk the level-0 Bs of each pid (new ones only; state covers carried ones)
        neg_mask, _, _ = self.lookups()
        l0_all = is_b & (level == 0)
        l0 = np.flatnonzero(l0_all & ~carried)
        inst = carried_inst.copy()
        if l0.size:
            p0 = pidc[l0]
            first = np.r_[True, p0[1:] != p0[:-1]]
            is_neg = neg_mask[name[l0]]
            prev_neg = np.empty(l0.size, bool)
            prev_neg[1:] = is_neg[:-1]
            prev_neg[first] = self.last0_neg[p0[first]]
            new = is_neg | ~prev_neg
            # instance ids in file order of their first record
            new_rows = l0[new]
            ranks = np.empty(new_rows.size, np.int64)
            ranks[np.argsort(order[new_rows], kind="stable")] = np.arange(new_rows.size)
            vals = np.full(l0.size, -1, np.int64)
            vals[new] = self.n_inst + ranks
            seed = first & ~new
            vals[seed] = self.cur_inst[p0[seed]]
            fi = np.maximum.accumulate(np.where(vals >= 0, np.arange(l0.size), 0))
            inst[l0] = vals[fi]
            # per-pid repetition index of each new instance
            cnew = np.cumsum(new)
            gfirst = np.flatnonzero(first)
            before_group = np.repeat(cnew[gfirst] - new[gfirst], np.diff(np.r_[gfirst, l0.size]))
            seq = self.seq_next[p0] + (cnew - before_group) - 1
            gids = self.n_inst + ranks
            self.n_inst += new_rows.size
            self.inst.grow(self.n_inst)
            self.inst["pid"][gids] = p0[new]
            self.inst["seq"][gids] = seq[new]
            last = np.r_[gfirst[1:] - 1, l0.size - 1]
            lp = p0[last]
            self.last0_neg[lp] = is_neg[last]
            self.cur_inst[lp] = inst[l0[last]]
            self.seq_next[lp] += cnew[last] - before_group[last]
        # every other row takes the instance of its enclosing level-0 B
        enc = _ffill_index(l0_all, gstart)
        enc_inst = np.where(enc >= 0, inst[np.maximum(enc, 0)], -1)
        enc_neg = np.where(enc >= 0, neg_mask[name[np.maximum(enc, 0)]], False)
        b_inst = np.where(l0_all, inst, enc_inst)

        self._emit(pidc[b_rows], name[b_rows], level[b_rows] == 0, ts[b_rows], ts[e_rows], b_inst[b_rows],
                   argref[e_rows], truncated=False)
        x = np.flatnonzero(is_x)
        if x.size:
            inside = (before[x] >= 1) & enc_neg[x]
            self.counts["x_without_b"] += int((~inside).sum())
            self.counts["bogus_dur"] += int(dur[x].sum())
            self._emit_ticks(pidc[x], np.where(inside, enc_inst[x], -1), name[x], ts[x], dur[x])

        ob = np.flatnonzero(open_b)
        self.carry = {"pid": pidc[ob], "order": order[ob], "ts": ts[ob], "name": name[ob],
                      "inst": b_inst[ob]}

    def close_dangling(self) -> int:
        """Close the Bs still open at the end at the last event ts, flagged truncated."""
        cr = self.carry
        n = cr["pid"].size
        if not n:
            return 0
        _, starts = _group_starts(cr["pid"])
        level = np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n]))
        self._emit(cr["pid"], cr["name"], level == 0, cr["ts"], np.full(n, self.max_ts, np.int64),
                   cr["inst"], np.full(n, -1, np.int64), truncated=True)
        return n

    def _emit(self, pidc: np.ndarray, name: np.ndarray, level0: np.ndarray, start: np.ndarray,
              end: np.ndarray, inst: np.ndarray, argref: np.ndarray, *, truncated: bool) -> None:
        """Keep a batch of paired events as an output chunk and fold them into their instances."""
        if not pidc.size:
            return
        neg_mask, comm_mask, _ = self.lookups()
        st = self.inst
        ok = inst >= 0
        is_neg = neg_mask[name]
        neg0 = level0 & is_neg & ok
        top = level0 & ~is_neg
        topi = top & ok
        st["neg_start"][inst[neg0]] = start[neg0]
        st["neg_end"][inst[neg0]] = end[neg0]
        st["op_name"][inst[topi]] = name[topi]
        st["op_start"][inst[topi]] = start[topi]
        st["op_end"][inst[topi]] = end[topi]
        st["op_argref"][inst[topi]] = argref[topi]
        comm = comm_mask[name] & ok
        if comm.any():
            np.minimum.at(st["tr_start"], inst[comm], start[comm])
            np.maximum.at(st["tr_end"], inst[comm], end[comm])
            self.comm_parts.append((inst[comm].astype(np.int64), start[comm], end[comm]))
        if truncated:
            st["trunc"][inst[ok]] = True
        self.first_start = min(self.first_start, int(start.min()))
        self.last_end = max(self.last_end, int(end.max()))
        o = np.argsort(start, kind="stable")  # each chunk in time order
        self.chunks.append({"pid": pidc[o].astype(np.int32), "name": name[o], "start": start[o],
                            "dur": (end - start)[o], "inst": inst[o].astype(np.int32), "top": top[o],
                            "truncated": truncated})

    def _emit_ticks(self, pidc: np.ndarray, inst: np.ndarray, name: np.ndarray, ts: np.ndarray,
                    dur: np.ndarray) -> None:
        """Keep a batch of rank ticks (those named by a rank) and fold them into their instances."""
        _, _, rank_tab = self.lookups()
        rank = rank_tab[name]
        valid = rank >= 0
        self.counts["bad_rank"] += int(valid.size - np.count_nonzero(valid))
        if not valid.all():
            pidc, inst, rank, ts, dur = pidc[valid], inst[valid], rank[valid], ts[valid], dur[valid]
        if not rank.size:
            return
        self.max_rank = max(self.max_rank, int(rank.max()))
        self.tick_chunks.append({"pid": pidc.astype(np.int32), "inst": inst.astype(np.int64), "rank": rank,
                                 "ts": ts, "dur": dur})
        inside = inst >= 0
        if not inside.any():
            return
        st = self.inst
        gi, t, r = inst[inside], ts[inside], rank[inside]
        np.add.at(st["n_ticks"], gi, 1)
        np.minimum.at(st["first_tick"], gi, t)
        np.maximum.at(st["last_tick"], gi, t)
        # the straggler ticked last; on equal ts the later record wins (ticks of one pid are in file order
        # here, and this batch comes after the earlier ones, so the largest index among the ties)
        cand = np.flatnonzero(t == st["last_tick"][gi])
        best = self.scratch(st.n)
        best[gi[cand]] = -1
        np.maximum.at(best, gi[cand], cand)
        win = cand[best[gi[cand]] == cand]
        st["straggler"][gi[win]] = r[win]

    def scratch(self, n: int) -> np.ndarray:
        """A reusable int64 array of at least ``n`` entries (callers reset what they use)."""
        if self._scratch.size < n:
            self._scratch = np.full(max(n, 2 * self._scratch.size), -1, np.int64)
        return self._scratch


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


# ---------------------------------------------------------------------------------------------------
# Entry point


def parse(path: str) -> ParsedFile:
    """Parse one Horovod timeline into a :class:`ParsedFile` (see the module docstring for the tables).

    Raises :class:`TraceError` when the file cannot be read, is empty, is not a JSON array or holds
    no Horovod record; damage that still parses becomes ``diagnostics``.
    """
    p = _Parser(path)
    repair = _NameRepair(iter_blocks(path, block_size=_BLOCK_BYTES))
    end: End | None = None
    for item in stream_array(repair, array_key="", batch_bytes=_BATCH_BYTES):
        if isinstance(item, Batch):
            cols = p.decode(item, repair.to_input)
            if cols.ph.size:
                p.feed(cols)
        elif isinstance(item, End):
            end = item
        # a Member means the document is an object, not an array: the End says so (array_found)
    assert end is not None
    if not end.array_found:
        if repair.total_in == 0 or end.reason == "no JSON value":
            if repair.stream_error is not None:
                raise repair.stream_error
            raise TraceError(path, "empty file: no Horovod timeline records")
        raise TraceError(path, "not a Horovod timeline (expected a JSON array of trace records)",
                         offset=repair.to_input(end.lost_offset or 0))
    if p.records == 0:
        if end.bytes_lost:
            raise TraceError(path, f"no complete Horovod record (the first record is cut after "
                             f"{end.bytes_lost} bytes)", offset=repair.to_input(end.lost_offset or 0))
        raise TraceError(path, "Horovod timeline holds no records (only '['): the job wrote none")
    return _finish(p, repair, end)


def _finish(p: _Parser, repair: _NameRepair, end: End) -> ParsedFile:
    """Close what is open and turn the streamed state into the output tables and diagnostics."""
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
        "parser_version": PARSER_VERSION,
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


__all__ = ["FORMAT", "FUSION_TOL_NS", "PARSER_VERSION", "parse", "phase_kind", "sniff"]

