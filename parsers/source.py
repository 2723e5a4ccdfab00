"""Reading input files as decompressed byte blocks: plain or gzip (sniffed by magic, not by name),
through the ISA-L inflater, with a bound on how much a compressed file may expand."""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator

from isal import isal_zlib

from tracekit.model.diagnostics import TraceError

GZIP_MAGIC = b"\x1f\x8b"
BLOCK = 4 << 20
#: A compressed input may expand at most this much (a gzip bomb cannot exhaust memory or disk time).
MAX_RATIO = 200
#: ... unless it is small: traces of repeated events compress very well.
MIN_BOUND = 1 << 30


def is_gzip(path: str) -> bool:
    """True when the file starts with the gzip magic, whatever its name."""
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def _open_error(path: str, exc: OSError) -> TraceError:
    return TraceError(path, f"cannot read: {exc.strerror or exc}")


def iter_blocks(path: str, block_size: int = BLOCK) -> Iterator[tuple[int, bytes]]:
    """Yield ``(offset, data)`` blocks of the decompressed content of ``path``.

    ``offset`` is the position in the decompressed stream. A corrupt or truncated gzip stream yields
    everything that inflated cleanly and then raises :class:`TraceError` naming the compressed offset,
    so callers can keep what they got (they decide whether that is an error or a warning).
    """
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed in finally, generator
    except OSError as exc:
        raise _open_error(path, exc) from exc
    try:
        magic = f.read(2)
        f.seek(0)
        if magic != GZIP_MAGIC:
            offset = 0
            while chunk := f.read(block_size):
                yield offset, chunk
                offset += len(chunk)
            return
        size = os.fstat(f.fileno()).st_size
        bound = max(MIN_BOUND, size * MAX_RATIO)
        yield from _inflate(path, f, block_size, bound)
    finally:
        f.close()


def _inflate(path: str, f, block_size: int, bound: int) -> Iterator[tuple[int, bytes]]:
    """Inflate a (possibly multi-member) gzip stream in blocks of at most ``block_size`` bytes."""
    out_offset = 0
    in_offset = 0  # compressed bytes fully consumed so far
    pending = b""
    d = isal_zlib.decompressobj(isal_zlib.MAX_WBITS | 16)
    started = False
    while True:
        if not pending:
            pending = f.read(1 << 20)
            if not pending:
                break
        try:
            chunk = d.decompress(pending, block_size)
        except (isal_zlib.error, zlib.error) as exc:
            raise TraceError(path, f"corrupt gzip data ({exc})", offset=in_offset) from exc
        started = True
        if d.eof:
            rest = d.unused_data
            in_offset += len(pending) - len(rest)
            pending = rest.lstrip(b"\x00")
            if pending and not pending.startswith(GZIP_MAGIC):
                raise TraceError(path, "trailing garbage after the gzip stream", offset=in_offset)
            d = isal_zlib.decompressobj(isal_zlib.MAX_WBITS | 16)
            started = False
        else:
            tail = d.unconsumed_tail
            in_offset += len(pending) - len(tail)
            pending = tail
        if chunk:
            out_offset += len(chunk)
            if out_offset > bound:
                raise TraceError(path, f"gzip expands beyond {bound >> 20} MiB ({MAX_RATIO}x its size); "
                                 "refusing to inflate further", offset=in_offset)
            yield out_offset - len(chunk), chunk
    if started and not d.eof:
        rest = d.flush()
        if rest:
            yield out_offset, rest
        raise TraceError(path, "gzip stream is truncated (kept what inflated cleanly)", offset=in_offset)


class Blocks:
    """Decompressed blocks of a file that end quietly where the compressed stream breaks.

    Iterating yields what :func:`iter_blocks` yields; a corrupt or truncated gzip stream ends the
    iteration like end-of-file and leaves the error in :attr:`error`, so a parser can keep every
    complete record before the break and report the break as damage.
    """

    def __init__(self, path: str, block_size: int = BLOCK) -> None:
        self.path = path
        self.block_size = block_size
        self.error: TraceError | None = None
        self.consumed = 0

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        try:
            for offset, block in iter_blocks(self.path, self.block_size):
                self.consumed = offset + len(block)
                yield offset, block
        except TraceError as exc:
            if exc.message.startswith("cannot read"):
                raise
            self.error = exc
