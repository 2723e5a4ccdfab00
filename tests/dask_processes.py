"""A real Dask cluster for tests: a ``dask scheduler`` process and ``dask worker`` processes on localhost, started as a
user starts them by hand (not a LocalCluster inside the test), each stopped by its process id. Workers run without a
nanny, so each worker is the process started here (a test may kill one by its pid)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: how long the cluster may take to come up on a busy 2-core machine
START_S = 60


class Cluster:
    """A scheduler and its workers, started in ``root`` (logs in ``root/cluster.log``)."""

    def __init__(self, root: Path, env: dict[str, str] | None = None, preload: str | None = None) -> None:
        self.root = root
        self.env = {**os.environ, **(env or {}),
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        self.preload = preload
        self.log: IO[bytes] = open(root / "cluster.log", "wb")  # noqa: SIM115 (closed by stop)
        self.scheduler: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []
        self.address = ""

    def start(self, workers: int) -> Cluster:
        sched_file = self.root / "scheduler.json"
        self.scheduler = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host",
                                           "127.0.0.1", "--port", "0", "--no-dashboard", "--scheduler-file",
                                           str(sched_file)], stdout=self.log, stderr=subprocess.STDOUT, env=self.env,
                                          cwd=self.root)
        deadline = time.monotonic() + START_S
        while not sched_file.exists():
            if time.monotonic() > deadline or self.scheduler.poll() is not None:
                pytest.fail(f"the dask scheduler did not start: {self.log_text()}")
            time.sleep(0.2)
        self.address = json.loads(sched_file.read_text())["address"]
        for _ in range(workers):
            self.add_worker()
        self.wait_for(workers)
        return self

    def add_worker(self) -> subprocess.Popen:
        """One more single-threaded worker process (not waited for: :meth:`wait_for`)."""
        name = f"w{len(self.workers)}"
        extra = ["--preload", self.preload] if self.preload else []
        p = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", self.address, "--nthreads", "1",
                              "--no-nanny", "--no-dashboard", "--name", name, "--local-directory",
                              str(self.root / name), *extra], stdout=self.log, stderr=subprocess.STDOUT, env=self.env,
                             cwd=self.root)
        self.workers.append(p)
        return p

    def top_up(self, n: int) -> dict[str, int]:
        """Start workers until ``n`` of ours are alive (replacing killed ones), wait for them; their pids by address."""
        for _ in range(n - sum(p.poll() is None for p in self.workers)):
            self.add_worker()
        return self.wait_for(n)

    def wait_for(self, n: int) -> dict[str, int]:
        """Wait until ``n`` workers are connected; their pids by address (each one a process started here)."""
        from dask.distributed import Client

        deadline = time.monotonic() + START_S
        with Client(self.address, timeout="30s") as client:
            while True:  # a worker just killed may still be listed for a moment: only those that answer count
                client.wait_for_workers(n, timeout=START_S)
                pids = {a: p for a, p in client.run(os.getpid, on_error="return").items() if isinstance(p, int)}
                if len(pids) >= n or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        assert len(pids) >= n, f"only {len(pids)} of {n} workers answer: {self.log_text()}"
        assert set(pids.values()) <= {p.pid for p in self.workers}, "a worker that is not ours"
        return pids

    def log_text(self) -> str:
        self.log.flush()
        return (self.root / "cluster.log").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        """Each process by its id: SIGTERM, then SIGKILL for one that does not go."""
        procs = [*self.workers[::-1], *([self.scheduler] if self.scheduler else [])]
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
        self.log.close()
        assert all(p.poll() is not None for p in procs)


@contextlib.contextmanager
def running_cluster(root: Path, workers: int = 2, env: dict[str, str] | None = None,
                    preload: str | None = None) -> Iterator[Cluster]:
    """A :class:`Cluster` in ``root`` with ``workers`` workers, up for the length of the block (a module-scoped
    fixture's: one cluster per test module), then stopped process by process however the block ends."""
    c = Cluster(root, env, preload)
    try:
        c.start(workers)
        yield c
    finally:
        c.stop()
