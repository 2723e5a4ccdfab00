"""Units that say when they start, for tests that kill the process running one (tests/test_faults.py).

Loaded into a test's Dask workers with ``dask worker --preload tests.unit_hooks``: every dataset unit and graph unit
the worker runs first leaves a file ``KIND-TASK-PID-NS`` in ``$TRACEKIT_TEST_MARKS`` and lingers
``$TRACEKIT_TEST_LINGER`` seconds, so that the test sees which process holds a task and can kill it mid-task.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

MARKS = "TRACEKIT_TEST_MARKS"
LINGER = "TRACEKIT_TEST_LINGER"


def announce(kind: str, task: Any) -> None:
    """Leave the mark of ``task`` starting in this process, then linger (where ``$TRACEKIT_TEST_MARKS`` is set)."""
    d = os.environ.get(MARKS)
    if d:
        Path(d, f"{kind}-{task}-{os.getpid()}-{time.monotonic_ns()}").touch()
        time.sleep(float(os.environ.get(LINGER, "0.5")))


def announced(kind: str, fn: Callable[[Any], Any], name: Callable[[Any], Any]) -> Callable[[Any], Any]:
    @functools.wraps(fn)
    def run(u: Any) -> Any:
        announce(kind, name(u))
        return fn(u)

    return run


def slow_square(x: int) -> int:
    """A task for an engine's own test: announced, then its answer."""
    announce("square", x)
    return x * x


def _install() -> None:
    from tracekit.scale import graphs, unit

    # the client pickles the functions by name: on this worker the name resolves to the announced one
    unit.run_unit = announced("unit", unit.run_unit, lambda u: u.index)
    graphs.run_graph_unit = announced("graph", graphs.run_graph_unit, lambda u: u.part)


if os.environ.get(MARKS) and os.environ.get("TRACEKIT_TEST_PRELOAD") == "1":
    _install()


def polars_threads(_: Any) -> int:
    """A task that says how many threads this process's polars pool has."""
    import polars as pl

    return pl.thread_pool_size()


def send_polars_threads(conn: Any) -> None:
    """A process's entry that sends how many threads its polars pool has."""
    conn.send(polars_threads(None))
    conn.close()
