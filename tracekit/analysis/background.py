"""Work begun on a thread of its own while the caller goes on (numpy, polars and Arrow release the GIL in their
loops, so two such passes share two cores)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def start(fn: Callable[..., T], *args: object, name: str = "tracekit-analysis") -> Future[T]:
    """``fn(*args)`` begun on a thread named ``name``; the future holds its result, or the exception it raised.
    The thread ends with the call: nothing waits for it but the caller, through the future."""
    pool = ThreadPoolExecutor(1, thread_name_prefix=name)
    try:
        return pool.submit(fn, *args)
    finally:
        pool.shutdown(wait=False)
