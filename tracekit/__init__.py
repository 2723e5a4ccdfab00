"""tracekit: where does each iteration's time go in a distributed training job, and is the network the
bottleneck? Parsers turn traces into Arrow tables; analysis modules are pure functions over them.

The Python API (:mod:`tracekit.api`, :mod:`tracekit.diff`)::

    import tracekit

    job = tracekit.load("runs/ddp", link_bw="100gbit")   # -> tracekit.Job
    job.breakdown, job.whatif(bandwidth=["400gbit"]), job.verdict
    d = tracekit.diff("runs/before", "runs/after")       # -> tracekit.Diff

``import tracekit`` stays light (no polars or pyarrow until a name below is used).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from tracekit.api import Job, Verdict, load
    from tracekit.diff import Diff, diff

__all__ = ["Diff", "Job", "Verdict", "__version__", "diff", "load"]

_LAZY = {"load": "tracekit.api", "Job": "tracekit.api", "Verdict": "tracekit.api", "diff": "tracekit.diff",
         "Diff": "tracekit.diff"}


def __getattr__(name: str) -> Any:
    """The API's names, imported on first use (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tracekit' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
