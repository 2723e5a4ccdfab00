"""Repairing the tensor names Horovod writes without JSON escaping (:class:`_NameRepair`, step 1 of
:mod:`tracekit.parsers.horovod`): a filter over the input blocks, with a map of offsets back to the input.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import numpy as np

from tracekit.model.diagnostics import TraceError

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
