"""How a tracekit command uses the process's allocators: set once at start, and freed memory given back at chosen
points. A 300 MB trace's summary allocates ~1.3 GB over its life for a ~600 MB peak; on a VM a fresh page costs
its fault and zeroing (~0.5 ms per MB), a reused one almost nothing, and memory kept for reuse counts at the peak.
"""

from __future__ import annotations

import ctypes
import os
import sys

#: polars' allocator (jemalloc) hands memory it freed back to the system after this long, not the default 10 s: a
#: command's peak memory is then what it holds, not every frame it has dropped (-110 MB at the peak of a 300 MB
#: trace's summary; decaying at once costs ~10 % more time in page faults)
POLARS_ALLOCATOR = "dirty_decay_ms:100,muzzy_decay_ms:0"
#: Arrow's allocator (mimalloc) without transparent huge pages: with them, a page first touched costs its whole 2 MB
#: zeroed, and on a VM that cost varies run to run (the parse's final tables took 0.10-0.14 s in some runs and
#: 0.28-0.36 s in others; 0.16-0.18 s every time without). Read when Arrow's allocator starts
MIMALLOC_THP = ("MIMALLOC_ALLOW_THP", "0")
#: glibc's ``mallopt`` parameters (malloc.h) and the values a command sets: numpy's arrays up to 32 MB come from the
#: heap, not a fresh ``mmap`` each, and the heap is not trimmed on every free but where :func:`release_memory` is
#: called (reused pages instead of faulting new ones: ~0.1 s of a 300 MB trace's summary); one arena for every thread,
#: so that the what-if replays' threads reuse the main heap instead of each keeping its own (the thresholds alone
#: made that summary's peak 30-40 MB bigger; with one arena it stays within 20 MB of glibc's defaults, either way)
GLIBC_HEAP = {-3: 32 << 20, -1: 256 << 20, -8: 1}  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, M_ARENA_MAX
#: environment variables by which a user sets glibc's heap themselves (then :func:`configure` leaves it alone)
_GLIBC_ENV = ("GLIBC_TUNABLES", "MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
              "MALLOC_TOP_PAD_")


def _libc() -> ctypes.CDLL | None:
    """glibc, or None where the C library is another (musl, macOS)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def configure() -> None:
    """Set the allocators for a command, before polars, pyarrow and numpy allocate anything; a user's own settings
    win. The command line calls it first thing; a program that imports tracekit keeps its process's settings unless
    it calls this before importing those libraries."""
    if "polars" not in sys.modules:  # read once, when polars loads
        os.environ.setdefault("_RJEM_MALLOC_CONF", POLARS_ALLOCATOR)
    if "pyarrow" not in sys.modules:
        os.environ.setdefault(*MIMALLOC_THP)
    if any(name in os.environ for name in _GLIBC_ENV):
        return
    libc = _libc()
    if libc is not None:
        for param, value in GLIBC_HEAP.items():
            libc.mallopt(param, value)


def release_memory() -> None:
    """Give memory that the work before freed back to the system: Arrow's allocator keeps freed pages for reuse, and
    glibc's heap keeps what numpy and Python freed below its top (~150 MB after a 300 MB trace), which would
    otherwise stay in the process's resident set through the analysis."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
