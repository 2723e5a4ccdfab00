"""The Textual app of ``tracekit inspect``: it only displays analysis results.

Only :mod:`tracekit.cli` imports this package (lazily, inside the ``inspect`` command).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracekit.tui.data import LoadOptions

if TYPE_CHECKING:
    from tracekit.parsers.kineto_prescan import Prescan


def run(paths: list[str], options: LoadOptions | None = None, prescan: Prescan | None = None) -> int:
    """Run the app on ``paths`` until the user quits; returns the exit status. ``prescan``: one of the files read
    and scanned ahead (:func:`tracekit.parsers.kineto_prescan.start`), for the parse where it is needed."""
    from tracekit.tui.app import InspectApp

    return InspectApp(paths, options, prescan=prescan).run() or 0
