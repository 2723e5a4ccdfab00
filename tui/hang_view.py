"""Hang: where every rank stands in each process group when the job's Flight Recorder dumps were taken, as a picture
per group with the ranks that hold the job up first, then who the job waits for and why — what ``tracekit summary``
prints first for a hung job (:mod:`tracekit.views.hang_report`, :mod:`tracekit.analysis.hang.stuck`), with each cause's
whole call stack.

Shown only when the job has Flight Recorder dumps. Computes nothing: every figure comes from the analysis.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from tracekit.tui.data import JobData
from tracekit.tui.views import View


class HangView(View):
    """The hang tab (jobs with Flight Recorder dumps), key ``!``: next to the overview, as a hang comes first."""

    VIEW_ID = "hang"
    TITLE = "Hang"
    KEY = "!"
    REQUIRES = ("hang_positions",)
    can_focus = True

    def __init__(self, data: JobData | None = None, **kwargs: Any) -> None:
        super().__init__(data, **kwargs)
        self._shown: int | None = None

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="hang-scroll"):
            yield Static(id="hang-headline", classes="card")
            yield Static(id="hang-groups", classes="card")
            yield Static(id="hang-why", classes="card")

    def on_mount(self) -> None:  # View.on_mount then shows the data
        self.query_one("#hang-groups", Static).border_title = "Where each rank stands, per process group"
        self.query_one("#hang-why", Static).border_title = "Why"

    def focus_main(self) -> None:
        self.query_one("#hang-scroll", VerticalScroll).focus()

    def show_data(self, data: JobData) -> None:
        from tracekit.views import hang_report

        a = data.analysis
        hang = a.hang if a is not None else None
        if hang is None or self._shown == id(hang):
            return
        self._shown = id(hang)
        head = Text(hang.headline, style=hang_report.KIND_STYLES.get(hang.kind, "bold"))
        head.append("\n")
        head.append_text(hang_report.header(hang))
        self.query_one("#hang-headline", Static).update(head)
        self.query_one("#hang-groups", Static).update(Group(*hang_report.tables(hang)))
        why: list[Any] = list(hang_report.footer(hang))
        for c in hang.causes:
            if c.stack:
                why.append(Text(f"\nrank {c.rank}'s call stack ({c.last}):", style="bold"))
                why.append(Text(c.stack))
            for line in c.trace:
                why.append(Text(f"rank {c.rank}'s profiler trace ends with: {line}"))
        self.query_one("#hang-why", Static).update(Group(*why))
