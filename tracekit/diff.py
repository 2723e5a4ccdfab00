"""Two runs of the same job side by side, from Python: ``tracekit.diff(base, new)`` (``tracekit diff BASE NEW`` on
the command line, the Diff tab of ``tracekit inspect BASE --diff NEW``).

The comparison itself is computed in the analysis layer (:mod:`tracekit.analysis.compare`, which defines the tables
of a :class:`Diff`); this module loads the runs and adds each one's verdict (:func:`tracekit.api.compare`).

``tracekit.diff`` is both this module and its :func:`diff` function: the module is callable.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterable
from typing import Any

from tracekit.analysis.compare import BREAKDOWN_ROWS, TOP, Diff
from tracekit.api import Job, PathArg, compare, load

__all__ = ["BREAKDOWN_ROWS", "Diff", "compare", "diff"]


def diff(base: Job | PathArg | Iterable[PathArg], new: Job | PathArg | Iterable[PathArg], *, top: int = TOP,
         verdicts: bool = True, **load_options: Any) -> Diff:
    """Compare two runs. ``base`` and ``new`` are [Job][tracekit.api.Job] objects, or paths to load with
    ``load_options`` ([load][tracekit.api.load]'s: ``link_bw``, ``step_marker``, ``cache``, …)."""
    a = base if isinstance(base, Job) else load(base, **load_options)
    b = new if isinstance(new, Job) else load(new, **load_options)
    return compare(a, b, top=top, verdicts=verdicts)


class _CallableModule(types.ModuleType):
    """``tracekit.diff`` names this module once it is imported, and the function before: both can be called."""

    def __call__(self, *args: Any, **kwargs: Any) -> Diff:
        return diff(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
