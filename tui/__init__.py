"""The Textual app of ``tracekit inspect``: it only displays analysis results.

Only :mod:`tracekit.cli` imports this package (lazily, inside the ``inspect`` command).
"""

from __future__ import annotations

from tracekit.tui.data import LoadOptions


def run(paths: list[str], options: LoadOptions | None = None) -> int:
    """Run the app on ``paths`` until the user quits; returns the exit status."""
    from tracekit.tui.app import InspectApp

    return InspectApp(paths, options).run() or 0
