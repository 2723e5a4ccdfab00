"""Streaming split of big JSON documents into batches of complete array elements.

Trace files are one huge array (Kineto's ``traceEvents``, a Horovod timeline) plus a few small
top-level members. This module finds element boundaries with a vectorised structural index (numpy:
unescaped quotes -> string mask -> bracket depth), never decoding anything itself, so the caller
can decode each batch with a typed msgspec decoder in bounded memory. A document cut anywhere
(killed job, ``.json.tmp``) yields every complete element and reports how many bytes were lost.

Hostile input is bounded too: the structural index is incremental (every byte is indexed once, never
re-scanned while a huge element accumulates), indexes at most :data:`SCAN_BYTES` at a time, and a
record larger than :data:`MAX_RECORD_BYTES` is skipped and counted instead of buffered.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import msgspec
import numpy as np

QUOTE, BSLASH = 0x22, 0x5C
LBRACE, RBRACE, LBRACK, RBRACK, COMMA = 0x7B, 0x7D, 0x5B, 0x5D, 0x2C
_WS = b" \t\r\n"
#: emit a batch once this many bytes of complete elements are buffered
BATCH_BYTES = 4 << 20
#: the structural index looks at no more than this many bytes at once, so its arrays stay small
SCAN_BYTES = 2 << 20
#: the first window an ordinary member's end is looked for in (:func:`_object`)
MEMBER_SCAN_BYTES = 4 << 10
#: an array element or top-level member larger than this is skipped (and counted), never buffered whole:
#: memory stays bounded whatever a file holds (no real trace record comes near it)
MAX_RECORD_BYTES = 64 << 20
_WS_RUN = re.compile(rb"[ \t\r\n]*")


@dataclass
class Batch:
    """Complete elements of the array, as ``data`` = ``[e0,e1,...]`` ready for a JSON decoder.

    ``bounds`` holds the positions in ``data`` of the ``[``, each separating comma and the closing
    ``]``, so element i is ``data[bounds[i] + 1 : bounds[i + 1]]`` (for per-element recovery).
    ``offset`` is the stream offset of ``data[1]``, the first element's first byte.
    """

    offset: int
    data: bytes
    _bounds: np.ndarray | None = None
    #: cut where elements most likely end but not checked yet (``stream_array(..., lazy=True)``): decoding the
    #: whole of ``data`` successfully proves the cut right; otherwise call :meth:`check` before using it
    lazy: bool = False
    _verdict: bool | None = None

    def check(self) -> bool:
        """Whether ``data`` is valid JSON (always, for a batch that is not :attr:`lazy`). A lazy batch that is not
        is dropped: the stream splits those bytes again exactly and yields what they hold instead, so the
        caller must not use it."""
        if self._verdict is None:
            self._verdict = not self.lazy or _valid(self.data)
        return self._verdict

    @property
    def bounds(self) -> np.ndarray:
        """Separator positions, found by the structural index on first use (only needed on damage)."""
        if self._bounds is None:
            st = _Scan(0, 0)
            found = []
            while st.pos < len(self.data):
                before = st.pos
                p, ch, dep = scan(self.data, st)
                keep = ((ch == COMMA) & (dep == 1)) | ((ch == LBRACK) & (dep == 1)) | ((ch == RBRACK) & (dep == 0))
                found.append(p[keep])
                if st.pos == before:
                    break
            b = np.concatenate(found) if found else np.zeros(0, np.int64)
            if not b.size or b[-1] != len(self.data) - 1:
                b = np.append(b, len(self.data) - 1)
            self._bounds = b
        return self._bounds

    def element(self, i: int) -> bytes:
        return self.data[int(self.bounds[i]) + 1 : int(self.bounds[i + 1])]

    def element_offset(self, i: int) -> int:
        """Stream offset where element i starts."""
        return self.offset + int(self.bounds[i])

    def __len__(self) -> int:
        return len(self.bounds) - 1


@dataclass
class Member:
    """A top-level member of the document other than the streamed array: key and raw JSON value."""

    key: str
    raw: bytes
    offset: int


@dataclass
class End:
    """The end of the stream: whether the document was complete and what was lost.

    ``skipped`` counts records (array elements or members) larger than :data:`MAX_RECORD_BYTES` that
    were skipped without being buffered; ``skipped_bytes`` their size, ``skipped_offset`` the first one.
    """

    complete: bool
    bytes_lost: int
    lost_offset: int | None
    array_closed: bool
    array_found: bool
    reason: str = ""
    skipped: int = 0
    skipped_bytes: int = 0
    skipped_offset: int | None = None


def _unescaped_quotes(view: np.ndarray) -> np.ndarray:
    """Positions of quotes not escaped by an odd run of backslashes (the view must not start inside
    an escape: its first byte is not escaped by what came before)."""
    q = np.flatnonzero(view == QUOTE)
    if not q.size:
        return q
    cand = q[q > 0]
    cand = cand[view[cand - 1] == BSLASH]
    if not cand.size:
        return q
    bs = np.flatnonzero(view == BSLASH)
    is_start = np.ones(bs.size, dtype=bool)
    is_start[1:] = np.diff(bs) != 1
    run_start = np.maximum.accumulate(np.where(is_start, np.arange(bs.size), 0))
    idx = np.searchsorted(bs, cand - 1)
    run_len = idx - run_start[idx] + 1
    escaped = cand[(run_len & 1) == 1]
    return np.setdiff1d(q, escaped, assume_unique=True)


def structure(view: np.ndarray, depth0: int, in_string: bool = False
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Structural characters of ``view`` outside strings.

    ``depth0`` and ``in_string`` are the state at the start of the view. Returns ``(positions, chars,
    depth_after, quotes)``: for each ``{ } [ ] ,`` outside a string, its position, byte and the nesting
    depth after it; and the unescaped quote positions.
    """
    quotes = _unescaped_quotes(view)
    mask = (view == LBRACE) | (view == RBRACE) | (view == LBRACK) | (view == RBRACK) | (view == COMMA)
    pos = np.flatnonzero(mask)
    if quotes.size and pos.size:
        pos = pos[(np.searchsorted(quotes, pos) & 1) == int(in_string)]
    elif in_string:
        pos = pos[:0]
    chars = view[pos]
    delta = np.zeros(pos.size, dtype=np.int64)
    delta[(chars == LBRACE) | (chars == LBRACK)] = 1
    delta[(chars == RBRACE) | (chars == RBRACK)] = -1
    depth = depth0 + np.cumsum(delta)
    return pos, chars, depth, quotes


@dataclass
class _Scan:
    """Where an incremental structural scan of a buffer stands: bytes before ``pos`` are indexed, and
    ``depth``/``in_string`` hold at ``pos``; no escape is pending at ``pos``. ``last`` is the last
    structural character seen (0 if none)."""

    pos: int
    depth: int
    in_string: bool = False
    last: int = 0
    last_pos: int = -1


def scan(buf: bytes, st: _Scan, limit: int = SCAN_BYTES) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Index ``buf[st.pos : st.pos + limit]`` and advance ``st``; returns the structural characters
    found as ``(positions in buf, chars, depth after)``.

    The scan stops before a trailing odd run of backslashes (whether it escapes the next byte is not
    known yet), so a later call continues exactly where this one left off: every byte is indexed once.
    """
    end = min(len(buf), st.pos + limit)
    view = np.frombuffer(buf, dtype=np.uint8)[st.pos : end]
    p, ch, dep, q = structure(view, st.depth, st.in_string)
    run = 0
    if view.size and view[-1] == BSLASH:
        nb = np.flatnonzero(view != BSLASH)
        run = view.size - (int(nb[-1]) + 1 if nb.size else 0)
    resume = view.size - (run & 1)
    p = p + st.pos
    if dep.size:
        st.depth = int(dep[-1])
        st.last = int(ch[-1])
        st.last_pos = int(p[-1])
    st.in_string = st.in_string ^ bool(q.size & 1)
    st.pos += resume
    return p, ch, dep


def _skip_ws(buf: bytes, i: int) -> int:
    return _WS_RUN.match(buf, i).end()  # type: ignore[union-attr]


class _Stream:
    """Accumulates blocks; ``buf[0]`` sits at stream offset ``base``. A block read is kept apart from what was
    buffered before it until ``buf`` is needed whole: the array's fast path cuts a batch out of the two in one copy
    (:meth:`cut_batch`), where joining them first would copy every byte once more."""

    def __init__(self, blocks: Iterable[tuple[int, bytes]]) -> None:
        self._blocks = iter(blocks)
        self._buf = b""
        self._block = b""  # the last block read, after _buf
        self.base = 0
        self.eof = False

    @property
    def buf(self) -> bytes:
        """The buffered bytes, whole."""
        if self._block:
            self._buf, self._block = self._buf + self._block, b""
        return self._buf

    @buf.setter
    def buf(self, value: bytes) -> None:
        self._buf, self._block = value, b""

    @property
    def size(self) -> int:
        """``len(buf)``, without joining it."""
        return len(self._buf) + len(self._block)

    def more(self) -> bool:
        """Append the next block; False at end of input."""
        if self.eof:
            return False
        for _, block in self._blocks:
            if block:
                if self._block:
                    self._buf += self._block
                self._block = block
                return True
        self.eof = True
        return False

    def drop(self, n: int) -> None:
        """Forget the first ``n`` bytes of the buffer."""
        head = len(self._buf)
        if self._block and n >= head:
            self._buf, self._block = self._block[n - head :], b""
        else:
            self.buf = self.buf[n:]
        self.base += n

    def cut_batch(self) -> tuple[bytes, int] | None:
        """``[`` + the buffer up to the comma of its last ``}, {`` + ``]``, and that comma's position in ``buf``; None
        where there is no such comma. One copy when there is one in the last block read: the last in the whole
        buffer is then that block's last (any other starts before the block)."""
        block = self._block
        if block:
            cut = _fast_cut(block)
            if cut is not None:
                head = self._buf
                return b"".join((b"[", head, memoryview(block)[:cut], b"]")), len(head) + cut
        buf = self.buf
        cut = _fast_cut(buf)
        return None if cut is None else (_bracketed(buf, cut), cut)


def stream_array(
    blocks: Iterable[tuple[int, bytes]], array_key: str = "traceEvents", batch_bytes: int = BATCH_BYTES,
    *, lazy: bool = False,
) -> Iterator[Batch | Member | End]:
    """Split a JSON document into top-level :class:`Member` s and :class:`Batch` es of the array.

    The document is either an object whose member ``array_key`` is the big array, or a bare array
    (legacy Kineto, Horovod). The last item is always an :class:`End`. A bare array that is never
    closed (Horovod <= 0.20.0) ends with ``array_closed=False``.

    ``lazy``: batches cut at a likely boundary are yielded without validating them first (see
    :attr:`Batch.lazy`): a caller that decodes every batch whole anyway saves a pass over the bytes.
    """
    s = _Stream(blocks)
    while True:
        i = _skip_ws(s.buf, 0)
        if i < len(s.buf):
            break
        s.drop(i)  # leading whitespace is forgotten as it comes (a file of blanks is not buffered)
        if not s.more():
            yield End(False, 0, None, False, False, "no JSON value")
            return
    s.drop(i)
    first = s.buf[0]
    if first == LBRACK:
        yield from _array(s, 1, batch_bytes, lazy)
        return
    if first != LBRACE:
        yield End(False, 0, s.base, False, False, "not a JSON object or array")
        return
    yield from _object(s, array_key.encode(), batch_bytes, lazy)


class _Skips:
    """Records too large to buffer, skipped."""

    def __init__(self) -> None:
        self.n = 0
        self.bytes = 0
        self.offset: int | None = None

    def add(self, offset: int, size: int) -> None:
        self.n += 1
        self.bytes += size
        if self.offset is None:
            self.offset = offset

    def end(self, end: End) -> End:
        end.skipped, end.skipped_bytes, end.skipped_offset = self.n, self.bytes, self.offset
        return end


def _object(s: _Stream, key: bytes, batch_bytes: int, lazy: bool = False) -> Iterator[Batch | Member | End]:
    """Walk the members of the top-level object at ``s.buf[0] == '{'``."""
    pos = 1  # just after '{' or after a member's comma
    found = False
    closed = False
    skips = _Skips()
    while True:
        start = _skip_ws(s.buf, pos)
        while start >= len(s.buf):
            s.drop(start)  # whitespace between members is not kept
            pos = 0
            if not s.more():
                yield skips.end(End(False, 0, s.base, closed, found, "document cut"))
                return
            start = _skip_ws(s.buf, 0)
        c = s.buf[start]
        if c == RBRACE:
            yield skips.end(End(True, 0, None, closed or not found, found))
            return
        if c == COMMA:
            pos = start + 1
            continue
        # a member: "key" : value
        view = np.frombuffer(s.buf, dtype=np.uint8)[start:]
        quotes = _unescaped_quotes(view[: 4096]) if c == QUOTE else np.empty(0, np.int64)
        if quotes.size < 2:
            if len(s.buf) - start < 4096 and s.more():
                continue
            yield skips.end(End(False, len(s.buf) - start, s.base + start, closed, found, "malformed member"))
            return
        name = s.buf[start + int(quotes[0]) + 1 : start + int(quotes[1])]
        colon = _skip_ws(s.buf, start + int(quotes[1]) + 1)
        vstart = _skip_ws(s.buf, colon + 1)
        if vstart >= len(s.buf):
            if s.more():
                continue
            yield skips.end(End(False, len(s.buf) - start, s.base + start, closed, found, "document cut"))
            return
        if name == key and s.buf[vstart] == LBRACK:
            found = True
            s.drop(vstart)
            end: End | None = None
            for item in _array(s, 2, batch_bytes, lazy):
                if isinstance(item, End):
                    end = item
                else:
                    yield item
            assert end is not None
            skips.n += end.skipped
            skips.bytes += end.skipped_bytes
            skips.offset = end.skipped_offset if skips.offset is None else skips.offset
            if not end.array_closed:
                yield skips.end(end)
                return
            closed = True
            pos = 0  # _array left s.buf just after the ']'
            continue
        # an ordinary member: find its end (a comma at depth 1 or the closing brace) incrementally
        st = _Scan(vstart, 1)
        vend = None
        skipping = False
        offset0 = s.base + vstart
        # most members are a few bytes ("schemaVersion": 1): index from a small window, growing fourfold, rather than
        # SCAN_BYTES of the buffer after each (six 2 MB passes a file, ~60 ms on a 10 MB trace)
        limit = MEMBER_SCAN_BYTES
        while True:
            while st.pos < len(s.buf):
                before = st.pos
                p, ch, depth = scan(s.buf, st, limit)
                limit = min(limit * 4, SCAN_BYTES)
                stop = np.flatnonzero(((ch == COMMA) & (depth == 1)) | ((ch == RBRACE) & (depth == 0)))
                if stop.size:
                    vend = int(p[stop[0]])
                    break
                if st.pos == before:
                    break
            if vend is not None:
                break
            if not skipping and len(s.buf) - vstart > MAX_RECORD_BYTES:
                skipping = True
            if skipping:  # too large to keep: forget what is indexed, keep the scan state
                s.drop(st.pos)
                st.pos = vstart = 0
            if not s.more():
                yield skips.end(End(False, s.base + len(s.buf) - offset0, offset0, closed, found, "document cut"))
                return
        if skipping:
            skips.add(offset0, s.base + vend - offset0)
        else:
            yield Member(name.decode("utf-8", "replace"), s.buf[vstart:vend].strip(), s.base + vstart)
        pos = vend


def invalid_utf8(exc: BaseException) -> bool:
    """Whether a decoding error is invalid UTF-8 in a string (repairable: the bad bytes read as U+FFFD): msgspec before
    0.23 raises ``UnicodeDecodeError`` for it, 0.23 a ``DecodeError`` that says so."""
    return isinstance(exc, UnicodeDecodeError) or (isinstance(exc, msgspec.DecodeError) and "UTF-8" in str(exc))


_CANDIDATE = re.compile(rb"\}\s*,\s*\{")
_VALIDATE = msgspec.json.Decoder(msgspec.Raw)


#: whitespace as the candidate pattern's ``\s`` reads it in bytes
_SPACE = frozenset(b" \t\n\r\x0b\x0c")
#: ``{`` tried from the end of a buffer before the last ``}, {`` is looked for by the pattern instead
_BACK_TRIES = 16


def _fast_cut(buf: bytes) -> int | None:
    """Position of the comma of the last ``}, {`` in ``buf``: a likely element boundary. Read backwards from the
    last ``{`` (the record a batch ends in has a few: its own and its ``args``'); where that takes many steps, by
    the pattern over growing windows from the end. Both give the comma of the last match in the buffer."""
    end = len(buf)
    for _ in range(_BACK_TRIES):
        brace = buf.rfind(b"{", 0, end)
        if brace < 0:
            return None
        k = brace - 1
        while k >= 0 and buf[k] in _SPACE:
            k -= 1
        if k > 0 and buf[k] == 0x2C:  # ','
            comma = k
            k -= 1
            while k >= 0 and buf[k] in _SPACE:
                k -= 1
            if k >= 0 and buf[k] == 0x7D:  # '}'
                return comma
        end = brace
    return _last_cut(buf)


def _last_cut(buf: bytes) -> int | None:
    """:func:`_fast_cut` by the pattern, over windows from the end growing fourfold."""
    window = 1 << 16
    while True:
        lo = max(0, len(buf) - window)
        last = None
        for m in _CANDIDATE.finditer(buf, lo):
            last = m
        if last is not None:
            return buf.index(b",", last.start())
        if lo == 0:
            return None
        window *= 4


def _bracketed(buf: bytes, end: int) -> bytes:
    """``[`` + ``buf[:end]`` + ``]`` in one copy (chained ``+`` makes two multi-MB temporaries, and their
    fresh pages cost more than the copying itself)."""
    return b"".join((b"[", memoryview(buf)[:end], b"]"))


def _valid(data: bytes) -> bool:
    try:
        _VALIDATE.decode(data)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError, ValueError):
        return False
    return True


def _index(s: _Stream, st: _Scan, seps: list[np.ndarray], depth: int) -> tuple[int | None, int | None]:
    """Index the bytes of ``s.buf`` not indexed yet; collect element separators into ``seps``.

    Returns ``(close, broken)``: the position of the array's closing ``]`` or of the first bracket
    that closes more than was opened, whichever comes first (the other is None); separators after it
    are not collected."""
    while st.pos < len(s.buf):
        before = st.pos
        p, ch, dep = scan(s.buf, st)
        c = np.flatnonzero((ch == RBRACK) & (dep == depth - 1))
        b = np.flatnonzero(dep < depth - 1)
        close = int(p[c[0]]) if c.size else None
        broken = int(p[b[0]]) if b.size else None
        if close is not None or broken is not None:
            if broken is not None and (close is None or broken < close):
                close = None
            else:
                broken = None
            stop = close if close is not None else broken
            seps.append(p[(ch == COMMA) & (dep == depth) & (p < stop)])
            return close, broken
        seps.append(p[(ch == COMMA) & (dep == depth)])
        if st.pos == before:
            break
    return None, None


def _array(s: _Stream, depth: int, batch_bytes: int, lazy: bool = False) -> Iterator[Batch | End]:
    """Stream the elements of the array whose ``[`` is ``s.buf[0]``; elements sit at ``depth``.

    Fast path: cut the buffer at the last ``}, {`` and check the batch is valid JSON (a cut inside an
    element never is). Otherwise, and near the end of the array, use the exact structural index,
    incrementally: bytes already indexed are not indexed again when more arrive, so an element far
    larger than a block costs linear time; one larger than :data:`MAX_RECORD_BYTES` is skipped.
    On return (after the End) ``s.buf`` starts just after the closing ``]`` if the array closed.
    """
    assert s.buf[0] == LBRACK
    s.drop(1)
    skips = _Skips()
    st = _Scan(0, depth)
    seps: list[np.ndarray] = []
    skipping = False  # inside an element too large to buffer, which started at stream offset skip_from
    skip_from = 0
    while True:
        if st.pos == 0 and not skipping:
            while s.size < batch_bytes and s.more():
                pass
            found_cut = s.cut_batch()
            if found_cut is not None:
                data, cut = found_cut
                if lazy:
                    batch = Batch(s.base, data, lazy=True)
                    yield batch
                    if batch._verdict is not False:  # decoded whole, or checked: the cut was right
                        s.drop(cut + 1)
                        continue
                elif _valid(data):
                    yield Batch(s.base, data)
                    s.drop(cut + 1)
                    continue
        close, broken = _index(s, st, seps, depth)
        found = np.concatenate(seps) if seps else np.zeros(0, np.int64)
        if skipping:
            if found.size or close is not None or broken is not None:
                # the oversized element ends at the first separator, or where the array ends
                stop = int(found[0]) if found.size else close if close is not None else broken
                assert stop is not None
                skips.add(skip_from, s.base + stop - skip_from)
                skipping = False
                s.drop(stop + 1 if found.size else stop)
            else:  # still inside it: forget what is indexed, keep the scan state
                s.drop(st.pos)
                st.pos = 0
                seps = []
                if not s.more():
                    yield skips.end(End(False, s.base + len(s.buf) - skip_from, skip_from, False, True,
                                        "last record cut"))
                    return
                continue
            st, seps = _Scan(0, depth), []
            continue
        if broken is not None:
            if found.size:
                yield _batch(s, found)
            yield skips.end(End(False, len(s.buf.strip()), s.base, False, True, "unbalanced brackets"))
            return
        if close is not None:
            after = s.base + close + 1
            body = s.buf[:close].strip()
            if body and not body.endswith(b","):
                yield _batch(s, np.append(found, close))
            elif found.size:  # a trailing comma before ']' is tolerated
                yield _batch(s, found)
            s.drop(after - s.base)
            yield skips.end(End(True, 0, None, True, True))
            return
        if found.size and not s.eof:
            yield _batch(s, found)
            st, seps = _Scan(0, depth), []
            continue
        if not found.size and len(s.buf) > MAX_RECORD_BYTES:
            skipping, skip_from = True, s.base
            continue
        if s.more():
            continue
        # end of input inside the array
        if found.size:
            yield _batch(s, found)
        lost = len(s.buf.strip())
        if s.buf.strip().startswith((b"{", b"[")):
            # the last element may be complete but unterminated (no ',' and no ']')
            tail = _Scan(0, depth)
            while tail.pos < len(s.buf):
                before = tail.pos
                scan(s.buf, tail)
                if tail.pos == before:
                    break
            if tail.last in (RBRACE, RBRACK) and tail.depth == depth:
                yield _batch(s, np.array([tail.last_pos + 1], dtype=np.int64))
                lost = len(s.buf.strip())
        # the offset of the cut record itself, not of the whitespace before it
        lost_at = s.base + len(s.buf) - len(s.buf.lstrip()) if lost else None
        yield skips.end(End(False, lost, lost_at, False, True, "last record cut" if lost else "array not closed"))
        return


def _batch(s: _Stream, seps: np.ndarray) -> Batch:
    """Cut ``s.buf`` at the last separator in ``seps`` into a Batch; keep the rest buffered."""
    last = int(seps[-1])
    bounds = np.empty(seps.size + 1, dtype=np.int64)
    bounds[0] = 0
    bounds[1:] = seps + 1
    batch = Batch(s.base, _bracketed(s.buf, last), bounds)
    s.drop(last + 1)
    return batch
