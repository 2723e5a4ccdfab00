"""PyTorch profiler (Kineto) Chrome-trace JSON → tracekit tables, every era of FORMATS.md §1.

The file streams through :mod:`json_stream` in batches; each batch is decoded by msgspec into typed
structs (no per-event dicts), turned into Arrow columns, and classified per *unique* (category, name)
pair rather than per event. Timestamps go from the decimal text to int64 ns without a float
round-trip (:mod:`timestamps`); ``baseTimeNanoseconds`` is applied at the end because writers before
2025-03 put it after ``traceEvents``. Collective metadata is collected for the few events that carry
it and linked to communication activity in :mod:`comms`.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tempfile
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.model.diagnostics import TraceError
from tracekit.model.schema import ParsedFile

from ..json_stream import Batch, End, Member, stream_array
from ..source import Blocks, is_gzip
from .columns import _SEPARATOR, _consume, arrow_decides, arrow_takes
from .records import (
    BATCH_BYTES,
    DECODE_ERRORS,
    MAX_NS,  # noqa: F401 (re-exported)
    RAW,
    _Accumulator,
    native_scan,
)
from .tables import _append_begin_end, _finish

PARSER_VERSION = "kineto-4"


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


def parse(path: str, *, spill_dir: str | None = None, workers: int = 1, threads: int | None = None) -> ParsedFile:
    """Parse one Kineto trace (``.json``, ``.json.gz``, truncated or damaged) into a ParsedFile.

    With ``spill_dir`` (an existing, empty directory the caller owns and removes) the file is parsed in
    bounded memory whatever its size: batches are spilled to an Arrow IPC file as they come, the events
    table is built from it batch by batch into ``spill_dir/events.arrow``, and the returned ParsedFile's
    ``events`` is that file, memory-mapped (``events_file`` names it; read it in batches to stay
    bounded). The tables are the same as without spilling.

    ``workers`` > 1 splits a big uncompressed file at record boundaries across that many processes (this
    one and ``workers - 1`` others): same tables, in about 1/workers of the time on as many cores.

    ``threads``: how many threads run the C batch scanner (``parsers/kineto/scan.c``, where it is built) while
    this one reads the file and collects what they found, in order; 0 scans on this thread. Same tables. By
    default, where the scanner is built and ``workers`` is at most :data:`THREADED_WORKERS`, the file is read by
    this process with ``workers - 1`` scanner threads instead of being split across processes (faster, measured);
    with ``threads`` given, ``workers`` > 1 splits the file as without the scanner.
    """
    with _no_gc():
        if threads is None and scanner_threads(workers):
            return _parse(path, spill_dir, scanner_threads(workers))
        if workers > 1 and spill_dir is None:
            parsed = _parse_split(path, workers)
            if parsed is not None:
                return parsed
        return _parse(path, spill_dir, threads or 0)


#: a file read by this many ``workers`` or fewer is read by one process with ``workers - 1`` scanner threads where
#: the C scanner is built, not split across processes. On 2 cores a 303 MB trace parses in 0.57-0.62 s so, against
#: 0.80-0.84 s split across 2 processes (0.76 s on one thread; the thread reading the file and collecting results
#: is the limit, so more scanner threads do not help, while more processes do on more cores)
THREADED_WORKERS = 2


def scanner_threads(workers: int) -> int:
    """The scanner threads :func:`parse` reads a file with for ``workers`` by default (0: it splits the file across
    processes, or reads it on one thread)."""
    return workers - 1 if 1 < workers <= THREADED_WORKERS and native_scan() is not None else 0


class _Misread(Exception):
    """A batch the stream cut where records most likely end, read ahead of as if the cut were right, was cut
    inside a record: the stream would have split those bytes again (:attr:`Batch.lazy`)."""


def _parse(path: str, spill_dir: str | None = None, threads: int = 0) -> ParsedFile:
    if threads:
        try:
            return _parse_once(path, spill_dir, threads)
        except _Misread:
            pass  # read ahead of a batch that was cut wrong: read the file again without reading ahead
    return _parse_once(path, spill_dir, 0)


def _parse_once(path: str, spill_dir: str | None, threads: int) -> ParsedFile:
    acc = _Accumulator(path, spill_dir)
    blocks = Blocks(path)
    blocks.block_size = min(blocks.block_size, BATCH_BYTES)  # a batch is at least one block
    try:
        members, members_after, end = _stream(acc, blocks, threads=threads)
    except _Misread:
        acc.close_spill()
        raise
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


#: batches read and handed to the scanner threads ahead of the one whose results are being collected ...
LOOKAHEAD = 8
#: ... and as many as this while the oldest one's scan is not done and this thread has none left to take over (a
#: scanner thread asking Arrow's reader about a batch: ~40 ms a MB-sized batch, which this thread reads and scans on
#: through)
MAX_AHEAD = 32


def _scan(acc: _Accumulator, batch: Batch) -> tuple[Any, bool | None]:
    """A scanner thread's work on a batch: the C scanner's result, and whether Arrow's path takes the batch where its
    answer may decide what the batch reads as (:func:`arrow_decides` for a file with no fraction yet: negative pids or
    tids, or timestamps the two old paths would read differently as having fractions), else None. Both are functions
    of the batch alone; where the file had a fraction before, the consumption does not use the answer."""
    scanned = acc.scan(batch.data)  # type: ignore[misc]  # there is a pool only with the scanner
    flags = scanned[-1] if scanned is not None and scanned[0] else 0
    if not arrow_decides(flags, False):
        return scanned, None
    try:
        return scanned, arrow_takes(acc.path, batch)
    except Exception:  # asked where the consumption might not ask (a record it refuses first): it asks, if it does
        return scanned, None


def _stream(acc: _Accumulator, blocks: Iterable[tuple[int, bytes]], first_batch: Callable[[], None] | None = None,
            threads: int = 0) -> tuple[dict[str, Any], set[str], End]:
    """Read a document's blocks into ``acc``; returns its other top-level members (decoded), the names of
    those after ``traceEvents``, and how the stream ended. ``first_batch`` is called once the first batch of
    the array has been read.

    ``threads`` > 0 (with the C scanner): up to :data:`LOOKAHEAD` batches are scanned on that many threads while
    this one reads on and collects their results in order. Where it would wait for a scan, it scans the newest batch
    still queued itself, or with none left, reads on up to :data:`MAX_AHEAD` (a 303 MB trace on 2 cores: the stream
    took 0.29-0.38 s instead of 0.37-0.47 s, where this thread had waited 0.07-0.12 s). The stream reads on as if
    every batch it cut where records most likely end were cut right (what a batch the scanner takes proves); one
    that was not raises :class:`_Misread`, and the caller reads the file again with ``threads=0``."""
    members: dict[str, Any] = {}
    members_after: set[str] = set()
    end: End | None = None
    array_seen = False
    ahead: deque[tuple[Batch, Future | None]] = deque()
    pool = ThreadPoolExecutor(threads, thread_name_prefix="tracekit-scan") if threads and acc.scan else None

    def steal() -> bool:
        """Scan on this thread the newest batch still waiting for a scanner thread, rather than wait idle for the
        oldest (both cores scan where this thread would wait); False when every batch is taken already."""
        for i in range(len(ahead) - 1, 0, -1):
            batch, future = ahead[i]
            if future is not None and future.cancel():
                mine: Future = Future()
                mine.set_result(_scan(acc, batch))
                ahead[i] = (batch, mine)
                return True
        return False

    def collect(keep: int, room: int = 0) -> None:
        """Consume the oldest batches read until ``keep`` are left (those read ahead, with their scan's future); with
        fewer than ``room`` read ahead, return to read on rather than wait for the oldest one's scan."""
        nonlocal first_batch
        while len(ahead) > keep:
            batch, future = ahead[0]
            while future is not None and not future.done() and steal():
                pass
            if future is not None and not future.done() and len(ahead) < room:
                return
            ahead.popleft()
            if future is None:
                _consume(acc, batch)
            else:
                scanned, asked = future.result()
                if scanned is None and not batch.check():
                    raise _Misread  # the stream went on after this batch as if it were cut right
                _consume(acc, batch, scanned, asked)
            if first_batch is not None:
                first_batch()
                first_batch = None

    try:
        for item in stream_array(blocks, batch_bytes=BATCH_BYTES, lazy=True):
            if isinstance(item, Batch):
                ahead.append((item, pool.submit(_scan, acc, item) if pool is not None else None))
                array_seen = True
                collect(LOOKAHEAD - 1, MAX_AHEAD) if pool is not None else collect(0)
                continue
            collect(0)
            if isinstance(item, Member):
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
        collect(0)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
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
    one. Workers are fresh interpreters running this package (``__main__.py``: never the caller's ``__main__``)."""
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
                cmd = [sys.executable, "-m", __package__, "--part", path, str(bounds[k] + 1), str(bounds[k + 1]), out,
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
