"""The regression gate's answer on the terminal (``tracekit diff BASE NEW --fail-on-regression 5%``): the verdict,
the medians, their difference and spread, and which classes grew (:mod:`tracekit.analysis.regression` decides)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.text import Text

from tracekit.views.report import CLASS_STYLES

if TYPE_CHECKING:
    from tracekit.analysis.regression import Regression


def gate_renderables(g: Regression) -> list[Any]:
    """The gate's lines: its one-line answer, then a line per class that grew, then its notes."""
    head = Text()
    head.append("regression gate: ", style="bold")
    head.append("failed" if g.regressed else "passed", style="bold red" if g.regressed else "bold green")
    head.append(f" — {g.text}")
    out: list[Any] = [head]
    if g.reasons:
        out.append(Text("what grew (mean per rank-iteration):", style="bold"))
    for r in g.reasons:
        line = Text("  ")
        line.append(r.text, style=CLASS_STYLES.get(r.cls, ""))
        out.append(line)
    out += [Text(f"note: {n}", style="yellow") for n in g.notes]
    return out


def render_gate(console: Console, g: Regression) -> None:
    """Print the gate's answer (after the diff)."""
    for r in gate_renderables(g):
        console.print(r, soft_wrap=True)
