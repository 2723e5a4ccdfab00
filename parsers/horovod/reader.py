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

1. Bytes come from :func:`tracekit.parsers.source.iter_blocks` (gzip sniffed by magic). A block filter repairs
   tensor names that Horovod wrote without JSON escaping (a ``"`` or ``\\`` in a user-given name would
   otherwise derail every later record). Only ``process_name`` records hold names; they are found by a
   substring search for ``{"name"``, and a name runs from ``"args": {"name": "`` to the last ``"}}`` on
   its line (Horovod ends every metadata record with a newline; FORMATS.md 5.3). In Horovod's own layout
   (``{"ph": ...`` first) names are raw and are escaped verbatim; in a rewrite with reordered keys a name
   is only touched when it is not valid JSON string content.
2. :func:`tracekit.parsers.json_stream.stream_array` splits the array into ~4 MB batches of complete records
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

``events`` (tracekit.model.schema.EVENTS), one row per B/E pair. Rows come in chunks, one per input batch,
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

``collectives`` (tracekit.model.schema.COLLECTIVES), one row per tensor per top-level op instance (not for
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

``tables["horovod_iterations"]`` (tracekit.model.schema.ITERATIONS): iterations from **tensor repetition**:
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

Modules: this one (the entry points and the pipeline), :mod:`.phases` (what phases and ops are),
:mod:`.name_repair` (step 1), :mod:`.records` (decoding records, step 3),
:mod:`.pairing` (the streaming state, steps 3-6) and :mod:`.tables` (the output).
"""

from __future__ import annotations

from tracekit.model.diagnostics import TraceError
from tracekit.model.schema import ParsedFile

from ..json_stream import Batch, End, stream_array
from ..source import iter_blocks
from .name_repair import _NameRepair
from .pairing import _Parser
from .phases import FORMAT, phase_kind
from .tables import FUSION_TOL_NS, _finish

PARSER_VERSION = "3"
#: input block and record batch sizes (module attributes so tests can make them tiny)
_BLOCK_BYTES = 4 << 20
_BATCH_BYTES = 4 << 20


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
    return _finish(p, repair, end, PARSER_VERSION)


__all__ = ["FORMAT", "FUSION_TOL_NS", "PARSER_VERSION", "parse", "phase_kind", "sniff"]
