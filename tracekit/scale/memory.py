"""How much memory a job needs and how much the machine has: what decides between analysing a job in memory and
rank by rank (:mod:`tracekit.scale.dataset`)."""

from __future__ import annotations

import os
import resource


def json_bytes(path: str) -> int:
    """The (decompressed) size of an input: gzip's ISIZE trailer when it is plausible, else 10x."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        if f.read(2) != b"\x1f\x8b":
            return size
        f.seek(max(0, size - 4))
        isize = int.from_bytes(f.read(4), "little")
    return isize if isize >= size else size * 10  # ISIZE is mod 2^32: wrapped for big files


#: peak memory of the whole-job (in-memory) analysis per byte of JSON input (measured 1.9x by
#: benchmarks/ingest.py, with room for the cross-rank tables) and its fixed cost
IN_MEMORY_FACTOR = 2.5
IN_MEMORY_BASE = 256 << 20


def in_memory_need(files: list[str]) -> int:
    """About how much memory analysing ``files`` as one job in memory would take (bytes)."""
    return IN_MEMORY_BASE + int(IN_MEMORY_FACTOR * sum(json_bytes(f) for f in files))


def available_memory() -> int:
    """Memory this process can still use: ``MemAvailable`` (Linux), else free physical pages, else unbounded."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def peak_rss_mb() -> float:
    """This process's peak resident memory in MB: ``VmHWM`` (ru_maxrss of a process started by vfork +
    exec also counts its parent's), else ``ru_maxrss``."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
