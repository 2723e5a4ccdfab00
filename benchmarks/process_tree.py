"""Run one command as a child process and measure what its user waits for and holds: wall time, the CPU time of its
process tree, and the tree's peak resident memory. Shared by the benchmarks that time whole commands.

The peak is the larger of the command's own high-water mark (``wait4``'s ``ru_maxrss``: exact, however short the
peak) and the most its process tree (the command and the workers it starts) held at once, sampled every 10 ms from
``/proc``. A child started by vfork + exec inherits its parent's high-water mark: at or below the driver's own, it is
not read.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Measured:
    """One run of a command: seconds of wall and of CPU (the tree's, user + system), peak resident bytes."""

    wall: float
    cpu: float
    peak_bytes: int
    returncode: int
    stdout: str
    stderr: str
    #: killed by :func:`run` for passing ``cap_bytes``
    capped: bool = False
    #: the command's own process: its high-water mark (VmHWM, read while it runs), and the most its descendants (worker
    #: processes) held at once, sampled
    client_peak_bytes: int = 0
    workers_peak_bytes: int = 0


def tree_pids(pid: int) -> list[int]:
    """``pid`` and its descendants, from each thread's ``/proc/PID/task/TID/children`` (a few small reads; scanning
    every process of the machine for parents, as psutil does, took ~15 % of a core at 100 samples a second)."""
    pids, i = [pid], 0
    while i < len(pids):
        p, i = pids[i], i + 1
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    pids.extend(int(x) for x in f.read().split())
            except OSError:
                continue
    return pids


def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and its descendants now."""
    return sum(_rss(p) for p in tree_pids(pid))


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def high_water(pid: int) -> int:
    """``pid``'s own peak resident bytes so far (VmHWM), 0 where it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return 0


def run(cmd: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None,
        cap_bytes: int | None = None, interval: float = 0.01) -> Measured:
    """Run ``cmd`` to its end and measure it; with ``cap_bytes``, its whole tree is killed once it holds more."""
    driver = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, env=env)
    peak = client = workers = 0
    capped = False
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak, capped, client, workers
        while not stop.is_set():
            pids = tree_pids(child.pid)
            own = _rss(child.pid)
            rss = own + sum(_rss(p) for p in pids[1:])
            peak = max(peak, rss)
            client = max(client, high_water(child.pid))
            workers = max(workers, rss - own)
            if cap_bytes is not None and rss > cap_bytes and not capped:
                capped = True
                for p in reversed(tree_pids(child.pid)):  # the workers first, then the command
                    try:
                        os.kill(p, signal.SIGKILL)
                    except OSError:
                        continue
            time.sleep(interval)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    chunks: dict[str, bytes] = {}
    readers = [threading.Thread(target=lambda k=k, s=s: chunks.__setitem__(k, s.read()), daemon=True)
               for k, s in (("out", child.stdout), ("err", child.stderr))]
    for r in readers:
        r.start()
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - t
    child.returncode = os.waitstatus_to_exitcode(status)
    stop.set()
    sampler.join()
    for r in readers:
        r.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if usage.ru_maxrss > driver:
        peak = max(peak, usage.ru_maxrss * 1024)
    return Measured(wall, cpu, peak, child.returncode, chunks["out"].decode(errors="replace"),
                    chunks["err"].decode(errors="replace"), capped, client, workers)


def compile_bytecode(*dirs: Path) -> None:
    """Byte-compile the Python files under ``dirs``, as an install does: every command then starts from the bytecode
    cache, as a user's does. Where ``PYTHONDONTWRITEBYTECODE`` is set (this project's machines set it), an editable
    checkout never gets one, and each command would compile tracekit's ~26 000 lines again (~0.1 s)."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", *map(str, dirs)], check=True, capture_output=True)
