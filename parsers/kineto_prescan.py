"""A big plain Kineto trace read and scanned on the second core before the parser asks for it.

A command spends its first ~0.3-0.4 s importing pyarrow, polars and numpy on one core while the other waits. A
:class:`Prescan` reads the file and runs the C batch scanner over it meanwhile, on a thread that never takes the GIL
(``parsers/_kineto_prescan.c``, cutting the file as :mod:`json_stream` will); :func:`tracekit.parsers.kineto.parse`
then takes each batch's scan from it instead of scanning, where the prescan scanned those very bytes (same range,
same fingerprint), and scans the rest itself. The tables are the same with or without it.

This module imports only the standard library and the C extension, so that a command can start a prescan before
anything else; it holds what the parser and the prescan must agree on (the batch size, and when a file is read by
one process with scanner threads).
"""

from __future__ import annotations

import os
import stat
import sys
import threading
from collections.abc import Iterator
from types import ModuleType
from typing import Any

#: bytes of records decoded at once: the typed structs of a batch this size stay in the CPU's caches while they
#: are moved into columns (4 MB batches parse ~20 % slower), and the per-batch work in Python (cutting, collecting
#: the scanner's columns) is paid half as often as with 512 KB (a 303 MB trace on 2 cores: 0.43 against 0.49 s
#: with the C scanner's thread, 0.53 against 0.59 s on one thread, 1.86 against 1.98 s without the scanner). The
#: parser reads the file in blocks of this size too, and the prescan with it.
BATCH_BYTES = 1 << 20

#: a file read by this many ``workers`` or fewer is read by one process with ``workers - 1`` scanner threads where
#: the C scanner is built, not split across processes. On 2 cores a 303 MB trace parses in 0.57-0.62 s so, against
#: 0.80-0.84 s split across 2 processes (0.76 s on one thread; the thread reading the file and collecting results
#: is the limit, so more scanner threads do not help, while more processes do on more cores)
THREADED_WORKERS = 2

#: a smaller file is not prescanned: its scan takes a few ms where the parser needs it
PRESCAN_MIN_BYTES = 16 << 20
#: the prescan holds the scans of at most this much of the file that the parser has not asked for yet (~0.3 bytes of
#: columns per byte of JSON), and waits beyond: its memory stays bounded however big the file
PRESCAN_AHEAD_BYTES = 512 << 20
#: a directory of more files than this is a job of many ranks, read by worker processes: not looked through
PRESCAN_MAX_FILES = 64


def native_module() -> ModuleType | None:
    """The C extension (``tracekit.parsers._kineto_scan``), or None where it is not built or
    ``$TRACEKIT_NO_EXTENSION`` is set (to anything but ``0`` or nothing): then the batches go the msgspec way.
    Also None under a recursion limit so low that msgspec might refuse JSON nested less deeply than the scanner
    refuses it (64 levels)."""
    if os.environ.get("TRACEKIT_NO_EXTENSION", "0") not in ("", "0") or sys.getrecursionlimit() < 500:
        return None
    try:
        from . import _kineto_scan
    except ImportError:
        return None
    return _kineto_scan


def scanner_threads(workers: int) -> int:
    """The scanner threads :func:`tracekit.parsers.kineto.parse` reads a file with for ``workers`` by default (0: it
    splits the file across processes, or reads it on one thread)."""
    return workers - 1 if 1 < workers <= THREADED_WORKERS and native_module() is not None else 0


class Prescan:
    """One file's prescan, running from construction on a thread of its own until the file's end or :meth:`close`.
    :meth:`scan` answers the parser's batches (what the C scanner's ``scan(data)`` gives), from the prescan where it
    has them; it waits for the prescan only where the prescan has not reached the batch yet."""

    def __init__(self, path: str, native: ModuleType, *, block: int | None = None, ahead: int | None = None) -> None:
        self.path = path
        self.realpath = os.path.realpath(path)
        #: the parser's block and batch size it cuts the file by (:data:`BATCH_BYTES`)
        self.block = block or BATCH_BYTES
        self._c = native.Prescan(path, self.block, ahead or PRESCAN_AHEAD_BYTES)
        self._thread = threading.Thread(target=self._c.run, name="tracekit-prescan", daemon=True)
        self._thread.start()

    def scan(self, offset: int, data: bytes) -> Any:
        """The C scanner's result for the batch ``data`` whose first record starts at file ``offset``."""
        return self._c.scan(offset, data)

    def stats(self) -> dict[str, Any]:
        """Batches answered from the prescan (``hits``) and scanned on the spot (``misses``), batches still held,
        bytes read, and whether the prescan is over."""
        return self._c.stats()

    def close(self) -> None:
        """Stop the prescan (at its next block) and free what it holds; batches asked for after are scanned on the
        spot. Returns once its thread is gone."""
        self._c.cancel()
        self._thread.join()

    def is_for(self, path: str) -> bool:
        """Whether this prescan reads ``path`` (the same file by its real path)."""
        return os.path.realpath(path) == self.realpath


def start(paths: list[str], workers: int | None) -> Prescan | None:
    """A prescan of the one big file under ``paths`` (files or directories, searched recursively), where there is
    exactly one of at least :data:`PRESCAN_MIN_BYTES`, it is not gzip-compressed, and the parser would read it in one
    process with scanner threads for ``workers`` (None: one per core); else None. Cheap where it does not apply: a
    directory walk of at most :data:`PRESCAN_MAX_FILES` files and a stat per file, nothing read but two bytes."""
    native = native_module()
    if native is None or not hasattr(native, "Prescan") or scanner_threads(workers or os.cpu_count() or 1) == 0:
        return None
    big = None
    for i, (f, size) in enumerate(_files(paths)):
        if i >= PRESCAN_MAX_FILES:
            return None
        if size >= PRESCAN_MIN_BYTES:
            if big is not None:
                return None  # files of several ranks: read by worker processes
            big = f
    if big is None:
        return None
    try:
        with open(big, "rb") as fh:
            if fh.read(2) == b"\x1f\x8b":
                return None
    except OSError:
        return None
    return Prescan(big, native)


def _files(paths: list[str]) -> Iterator[tuple[str, int]]:
    """The regular files at or under ``paths``, with their sizes."""
    for path in paths:
        if os.path.isfile(path):
            yield path, os.path.getsize(path)
            continue
        for root, _dirs, names in os.walk(path):
            for name in names:
                f = os.path.join(root, name)
                try:
                    st = os.stat(f)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    yield f, st.st_size
