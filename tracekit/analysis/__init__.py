"""The analysis: pure functions over the loaded tables, run in order by ``pipeline.analyse`` into an
``Analysis`` — iterations, attribution, collectives across ranks, links, the verdict and its ranges (one module
each, here); the dependency graph, its replays, the critical path and the what-if model in ``graph/``; what NCCL
logs, Horovod timelines and Flight Recorder dumps add in ``nccl/``, ``horovod/`` and ``hang/``.

``Analysis`` and ``analyse`` are importable from here too (``from tracekit.analysis.pipeline import analyse``)."""

from __future__ import annotations

from typing import Any

__all__ = ["Analysis", "analyse"]


def __getattr__(name: str) -> Any:
    """``Analysis`` and ``analyse`` on first use (importing a submodule does not load the whole pipeline)."""
    if name in __all__:
        from tracekit.analysis import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module 'tracekit.analysis.pipeline' has no attribute {name!r}")
