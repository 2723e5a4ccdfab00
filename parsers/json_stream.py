"""Streaming split of big JSON documents into batches of complete array elements.

Trace files are one huge array (Kineto's ``traceEvents``, a Horovod timeline) plus a few small
top-level members. This module finds element boundaries with a vectorised structural index (numpy:
unescaped quotes -> string mask -> bracket depth), never decoding anything itself, so the caller
can decode each batch with a typed msgspec decoder in bounded memory. A document cut anywhere
(killed job, ``.json.tmp``) yields every complete element and reports how many bytes were lost.
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

    @property
    def bounds(self) -> np.ndarray:
        """Separator positions, found by the structural index on first use (only needed on damage)."""
        if self._bounds is None:
            view = np.frombuffer(self.data, dtype=np.uint8)
            p, ch, dep, _ = structure(view, 0)
            keep = ((ch == COMMA) & (dep == 1)) | ((ch == LBRACK) & (dep == 1)) | ((ch == RBRACK) & (dep == 0))
            self._bounds = p[keep]
            if not self._bounds.size or self._bounds[-1] != len(self.data) - 1:
                self._bounds = np.append(self._bounds, len(self.data) - 1)
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
    """The end of the stream: whether the document was complete and what was lost."""

    complete: bool
    bytes_lost: int
    lost_offset: int | None
    array_closed: bool
    array_found: bool
    reason: str = ""


def _unescaped_quotes(view: np.ndarray) -> np.ndarray:
    """Positions of quotes not escaped by an odd run of backslashes."""
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


def structure(view: np.ndarray, depth0: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Structural characters of ``view`` outside strings, assuming it starts outside a string.

    Returns ``(positions, chars, depth_after, quotes)``: for each ``{ } [ ] ,`` outside a string, its
    position, byte and the nesting depth after it; and the unescaped quote positions.
    """
    quotes = _unescaped_quotes(view)
    mask = (view == LBRACE) | (view == RBRACE) | (view == LBRACK) | (view == RBRACK) | (view == COMMA)
    pos = np.flatnonzero(mask)
    if quotes.size and pos.size:
        pos = pos[(np.searchsorted(quotes, pos) & 1) == 0]
    chars = view[pos]
    delta = np.zeros(pos.size, dtype=np.int64)
    delta[(chars == LBRACE) | (chars == LBRACK)] = 1
    delta[(chars == RBRACE) | (chars == RBRACK)] = -1
    depth = depth0 + np.cumsum(delta)
    return pos, chars, depth, quotes


def _skip_ws(buf: bytes, i: int) -> int:
    n = len(buf)
    while i < n and buf[i] in _WS:
        i += 1
    return i


class _Stream:
    """Accumulates blocks; ``buf[0]`` sits at stream offset ``base``."""

    def __init__(self, blocks: Iterable[tuple[int, bytes]]) -> None:
        self._blocks = iter(blocks)
        self.buf = b""
        self.base = 0
        self.eof = False

    def more(self) -> bool:
        """Append the next block; False at end of input."""
        if self.eof:
            return False
        for _, block in self._blocks:
            if block:
                self.buf += block
                return True
        self.eof = True
        return False

    def drop(self, n: int) -> None:
        """Forget the first ``n`` bytes of the buffer."""
        self.buf = self.buf[n:]
        self.base += n


def stream_array(
    blocks: Iterable[tuple[int, bytes]], array_key: str = "traceEvents", batch_bytes: int = BATCH_BYTES
) -> Iterator[Batch | Member | End]:
    """Split a JSON document into top-level :class:`Member` s and :class:`Batch` es of the array.

    The document is either an object whose member ``array_key`` is the big array, or a bare array
    (legacy Kineto, Horovod). The last item is always an :class:`End`. A bare array that is never
    closed (Horovod <= 0.20.0) ends with ``array_closed=False``.
    """
    s = _Stream(blocks)
    while True:
        i = _skip_ws(s.buf, 0)
        if i < len(s.buf):
            break
        if not s.more():
            yield End(False, 0, None, False, False, "no JSON value")
            return
    s.drop(i)
    first = s.buf[0]
    if first == LBRACK:
        yield from _array(s, 1, batch_bytes)
        return
    if first != LBRACE:
        yield End(False, 0, s.base, False, False, "not a JSON object or array")
        return
    yield from _object(s, array_key.encode(), batch_bytes)


def _object(s: _Stream, key: bytes, batch_bytes: int) -> Iterator[Batch | Member | End]:
    """Walk the members of the top-level object at ``s.buf[0] == '{'``."""
    pos = 1  # just after '{' or after a member's comma
    found = False
    closed = False
    while True:
        start = _skip_ws(s.buf, pos)
        while start >= len(s.buf):
            if not s.more():
                yield End(False, len(s.buf[pos:].strip()), s.base + pos, closed, found, "document cut")
                return
            start = _skip_ws(s.buf, pos)
        c = s.buf[start]
        if c == RBRACE:
            yield End(True, 0, None, closed or not found, found)
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
            yield End(False, len(s.buf) - start, s.base + start, closed, found, "malformed member")
            return
        name = s.buf[start + int(quotes[0]) + 1 : start + int(quotes[1])]
        colon = _skip_ws(s.buf, start + int(quotes[1]) + 1)
        vstart = _skip_ws(s.buf, colon + 1)
        if vstart >= len(s.buf):
            if s.more():
                continue
            yield End(False, len(s.buf) - start, s.base + start, closed, found, "document cut")
            return
        if name == key and s.buf[vstart] == LBRACK:
            found = True
            s.drop(vstart)
            end: End | None = None
            for item in _array(s, 2, batch_bytes):
                if isinstance(item, End):
                    end = item
                else:
                    yield item
            assert end is not None
            if not end.array_closed:
                yield end
                return
            closed = True
            pos = 0  # _array left s.buf just after the ']'
            continue
        # an ordinary member: find its end (a comma at depth 1 or the closing brace) in a growing window
        window = 1 << 16
        while True:
            view = np.frombuffer(s.buf, dtype=np.uint8)[vstart : vstart + window]
            p, ch, depth, _ = structure(view, 1)
            stop = np.flatnonzero(((ch == COMMA) & (depth == 1)) | ((ch == RBRACE) & (depth == 0)))
            if stop.size:
                vend = vstart + int(p[stop[0]])
                yield Member(name.decode("utf-8", "replace"), s.buf[vstart:vend].strip(), s.base + vstart)
                pos = vend
                break
            if vstart + window < len(s.buf):
                window *= 4
                continue
            if not s.more():
                yield End(False, len(s.buf) - start, s.base + start, closed, found, "document cut")
                return


_CANDIDATE = re.compile(rb"\}\s*,\s*\{")
_VALIDATE = msgspec.json.Decoder(msgspec.Raw)


def _fast_cut(buf: bytes) -> int | None:
    """Position of the comma of the last ``}, {`` in ``buf``: a likely element boundary."""
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


def _valid(data: bytes) -> bool:
    try:
        _VALIDATE.decode(data)
    except msgspec.DecodeError:
        return False
    return True


def _array(s: _Stream, depth: int, batch_bytes: int) -> Iterator[Batch | End]:
    """Stream the elements of the array whose ``[`` is ``s.buf[0]``; elements sit at ``depth``.

    Fast path: cut the buffer at the last ``}, {`` and check the batch is valid JSON (a cut inside an
    element never is). Otherwise, and near the end of the array, use the exact structural index.
    On return (after the End) ``s.buf`` starts just after the closing ``]`` if the array closed.
    """
    assert s.buf[0] == LBRACK
    s.drop(1)
    while True:
        while len(s.buf) < batch_bytes and s.more():
            pass
        cut = _fast_cut(s.buf)
        if cut is not None:
            data = b"[" + s.buf[:cut] + b"]"
            if _valid(data):
                yield Batch(s.base, data)
                s.drop(cut + 1)
                continue
        # exact path over the whole buffer
        view = np.frombuffer(s.buf, dtype=np.uint8)
        p, ch, dep, _q = structure(view, depth)
        close = np.flatnonzero((ch == RBRACK) & (dep == depth - 1))
        broken = np.flatnonzero(dep < depth - 1)
        stop = int(p[close[0]]) if close.size else None
        if broken.size and (stop is None or int(p[broken[0]]) < stop):
            bad_at = int(p[broken[0]])
            seps = p[(ch == COMMA) & (dep == depth) & (p < bad_at)]
            if seps.size:
                yield _batch(s, seps)
            yield End(False, len(s.buf.strip()), s.base, False, True, "unbalanced brackets")
            return
        if stop is not None:
            seps = p[(ch == COMMA) & (dep == depth) & (p < stop)]
            after = s.base + stop + 1
            body = s.buf[:stop].strip()
            if body and not body.endswith(b","):
                yield _batch(s, np.append(seps, stop))
            elif seps.size:  # a trailing comma before ']' is tolerated
                yield _batch(s, seps)
            s.drop(after - s.base)
            yield End(True, 0, None, True, True)
            return
        seps = p[(ch == COMMA) & (dep == depth)]
        if seps.size and not s.eof:
            yield _batch(s, seps)
            continue
        if s.more():
            continue
        # end of input inside the array
        if seps.size:
            yield _batch(s, seps)
        lost = len(s.buf.strip())
        if s.buf.strip().startswith((b"{", b"[")):
            # the last element may be complete but unterminated (no ',' and no ']')
            v = np.frombuffer(s.buf, dtype=np.uint8)
            p2, ch2, dep2, _ = structure(v, depth)
            if p2.size and dep2[-1] == depth and ch2[-1] in (RBRACE, RBRACK):
                yield _batch(s, np.array([int(p2[-1]) + 1], dtype=np.int64))
                lost = len(s.buf.strip())
        # the offset of the cut record itself, not of the whitespace before it
        lost_at = s.base + len(s.buf) - len(s.buf.lstrip()) if lost else None
        yield End(False, lost, lost_at, False, True, "last record cut" if lost else "array not closed")
        return


def _batch(s: _Stream, seps: np.ndarray) -> Batch:
    """Cut ``s.buf`` at the last separator in ``seps`` into a Batch; keep the rest buffered."""
    last = int(seps[-1])
    bounds = np.empty(seps.size + 1, dtype=np.int64)
    bounds[0] = 0
    bounds[1:] = seps + 1
    batch = Batch(s.base, b"[" + s.buf[:last] + b"]", bounds)
    s.drop(last + 1)
    return batch
