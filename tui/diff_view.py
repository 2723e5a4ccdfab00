"""Diff: the job against another run of it (``tracekit inspect BASE --diff NEW``), as ``tracekit diff BASE NEW``
prints it — iteration time, the breakdown per iteration, per rank, communication per op, the ops whose time
changed most, the critical path and both verdicts. :func:`tracekit.diff.compare` computes it in the loading
worker (phase 6); the tab only shows it."""

from __future__ import annotations

from typing import Any, ClassVar

from rich.console import Group
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widgets import Static

from tracekit.tui.data import JobData
from tracekit.tui.views import View

FEW, MANY = 10, 40


class DiffView(View):
    """The ninth tab (only with ``--diff``)."""

    VIEW_ID = "diff"
    TITLE = "Diff"
    KEY = "9"
    BINDINGS: ClassVar[list[BindingType]] = [Binding("m", "toggle_more", "More / fewer ops")]

    def __init__(self, data: JobData | None = None, **kwargs: Any) -> None:
        super().__init__(data, **kwargs)
        self.limit = FEW
        self._shown: tuple[int, int] | None = None

    @classmethod
    def available(cls, data: JobData) -> bool:
        return data.diff is not None

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="diff-scroll"):
            yield Static(id="diff-body")

    def focus_main(self) -> None:
        self.query_one("#diff-scroll", VerticalScroll).focus()

    def show_data(self, data: JobData) -> None:
        from tracekit.views.report import diff_renderables

        if data.diff is None:
            return
        key = (id(data.diff), self.limit)
        if self._shown == key:
            return
        self._shown = key
        parts: list[Any] = []
        for r in diff_renderables(data.diff, self.limit):
            parts += [r, Text("")]
        self.query_one("#diff-body", Static).update(Group(*parts))

    def action_toggle_more(self) -> None:
        self.limit = FEW if self.limit == MANY else MANY
        if self._latest is not None:
            self.show_data(self._latest)
