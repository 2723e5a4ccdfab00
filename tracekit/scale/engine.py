"""Where per-file work runs: local processes (the default) or a Dask distributed cluster.

An engine maps a picklable function over picklable tasks and yields ``(task index, result)`` as each
finishes; the first exception raised by a task (a :class:`~tracekit.model.diagnostics.TraceError` naming
its file, usually) is raised by the iteration. The function must be pure — its effects are the files it
writes — so that where it runs never changes what it produces:

- :class:`LocalEngine` — in this process for one task or a small input, else a pool of ``jobs`` spawned
  processes (started again for the tasks not done when one of them is killed).
- :class:`DaskEngine` — ``client.map`` on a cluster: an existing scheduler (``tcp://HOST:PORT``, e.g.
  started by ``dask scheduler`` + ``srun dask worker`` on SLURM, or by dask-kubernetes) or a
  ``LocalCluster`` started for the run. Workers must see the input files and the output directory at
  the same paths (a shared filesystem). A worker lost mid-run costs time: the scheduler runs its tasks again
  elsewhere, and as the units write the same bytes however often they run, the answer is the same.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from typing import Any

from tracekit.model.diagnostics import TraceError

#: below this much input, worker processes cost more than they save
PARALLEL_MIN_BYTES = 64 << 20
#: how many times a pool whose worker process died is started again for the tasks not done yet
POOL_RETRIES = 2
#: how long to wait for a Dask scheduler to answer
CONNECT_TIMEOUT = "20s"


def threads_per_worker(workers: int) -> int:
    """The threads each of ``workers`` processes on this machine may use: its share of the cores, at least one."""
    return max(1, (os.cpu_count() or 1) // max(1, workers))


def limit_threads(threads: int) -> None:
    """A worker process's first step, before it imports polars: polars' pool of ``threads`` threads (unless the user
    chose one with ``POLARS_MAX_THREADS``). polars sizes its pool from the cores at import; processes that together
    fill the cores then spend CPU in pools that wake for every small step (a 10 MB rank's unit: ~290 polars steps of
    a few hundred rows; 0.40-0.46 s of CPU with a pool of 2 threads, 0.31-0.40 s with 1)."""
    os.environ.setdefault("POLARS_MAX_THREADS", str(threads))


@contextlib.contextmanager
def main_not_run_again() -> Iterator[None]:
    """While spawned worker processes start: a program whose main module is no file (``python -`` reading stdin)
    hides that name, which each worker would otherwise try to run again and die at once (they need nothing of it)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or path is None or os.path.exists(path):
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


def run_with_threads(threads: int, target: str, *args: Any) -> Any:
    """A spawned process's entry: :func:`limit_threads`, then ``target`` (``"module:function"``, imported only now:
    a function passed as itself is imported with the process's arguments, before anything runs) called with
    ``args``."""
    limit_threads(threads)
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)(*args)


class LocalEngine:
    """Tasks in this process, or in ``jobs`` spawned worker processes."""

    name = "local"

    def __init__(self, jobs: int | None = None, total_bytes: int | None = None) -> None:
        self.jobs = max(1, jobs or os.cpu_count() or 1)
        self.total_bytes = total_bytes

    def map(self, fn: Callable[[Any], Any], tasks: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        small = self.total_bytes is not None and self.total_bytes < PARALLEL_MIN_BYTES
        if self.jobs == 1 or len(tasks) <= 1 or small:
            for i, t in enumerate(tasks):
                yield i, fn(t)
            return
        left = dict(enumerate(tasks))
        for attempt in range(POOL_RETRIES + 1):
            try:
                yield from self._pool(fn, left)
                return
            except BrokenProcessPool:  # a worker process killed (by a user, the OOM killer): the rest run again
                if attempt == POOL_RETRIES:
                    raise TraceError(None, f"worker processes died {POOL_RETRIES + 1} times (killed, or out of memory? "
                                     "lower --jobs or --memory-budget)") from None

    def _pool(self, fn: Callable[[Any], Any], left: dict[int, Any]) -> Iterator[tuple[int, Any]]:
        """The tasks of ``left`` on a fresh pool; each one done is taken out of ``left``."""
        workers = min(self.jobs, len(left))
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"), initializer=limit_threads,
                                 initargs=(threads_per_worker(workers),)) as pool:
            with main_not_run_again():  # the workers start as the tasks are submitted
                futures = {pool.submit(fn, t): i for i, t in left.items()}
            try:
                for fut in as_completed(futures):
                    i = futures[fut]
                    result = fut.result()
                    del left[i]
                    yield i, result
            except BaseException:
                for fut in futures:
                    fut.cancel()
                raise

    def __enter__(self) -> LocalEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class DaskEngine:
    """Tasks on a Dask distributed cluster: the one at ``scheduler``, or a LocalCluster of ``jobs``
    single-threaded worker processes (``processes=False``: threads of this process, for tests)."""

    name = "dask"

    def __init__(self, scheduler: str | None = None, jobs: int | None = None, processes: bool = True) -> None:
        self.scheduler = scheduler
        self.jobs = max(1, jobs or os.cpu_count() or 1)
        self.processes = processes
        self.client: Any = None
        self._cluster: Any = None

    def __enter__(self) -> DaskEngine:
        try:
            from dask.distributed import Client, LocalCluster
        except ImportError as exc:
            raise TraceError(None, "the Dask engine needs dask[distributed]: pip install 'tracekit[dask]'") from exc
        try:
            if self.scheduler:
                self.client = Client(self.scheduler, timeout=CONNECT_TIMEOUT)
            else:
                self._cluster = LocalCluster(n_workers=self.jobs, threads_per_worker=1, processes=self.processes,
                                             dashboard_address=None, silence_logs=40)
                self.client = Client(self._cluster)
        except (OSError, TimeoutError) as exc:
            self.__exit__()
            raise TraceError(self.scheduler, f"cannot reach the Dask scheduler: {exc}") from exc
        return self

    def __exit__(self, *exc: object) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None

    def map(self, fn: Callable[[Any], Any], tasks: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        from dask.distributed import as_completed as dask_completed

        assert self.client is not None, "use the engine as a context manager"
        futures = self.client.map(fn, list(tasks), pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        try:
            for fut in dask_completed(futures):
                result = fut.result()
                # forgotten by the scheduler once here: a worker lost later that held it does not make it run again
                # (a task lost while running does run again elsewhere: units are pure and give the same bytes)
                fut.release()
                yield index[fut.key], result
        except BaseException:
            self.client.cancel(futures)
            raise


Engine = LocalEngine | DaskEngine


def make(engine: str = "local", *, scheduler: str | None = None, jobs: int | None = None,
         total_bytes: int | None = None) -> Engine:
    """The engine the command line asked for: ``--engine local|dask``; ``--scheduler`` implies dask."""
    if scheduler or engine == "dask":
        return DaskEngine(scheduler, jobs)
    if engine != "local":
        raise TraceError(None, f"unknown engine {engine!r} (local or dask)")
    return LocalEngine(jobs, total_bytes)
