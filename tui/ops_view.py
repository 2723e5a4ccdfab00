"""Top ops: the kernels and CPU operators behind each attribution class (``top_ops``, the job's top ones per
class over every rank) and, per rank, why the device sat idle — host-bound, synchronisation or other
(``idle_breakdown``; not applicable on CPU-only ranks). Both are computed in :mod:`tracekit.analysis.top_ops` and
:mod:`tracekit.analysis.idle` while the job loads; this tab only lays them out."""

from __future__ import annotations

from typing import Any, ClassVar

from rich.console import Group
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widgets import Static

from tracekit.tui.data import JobData
from tracekit.tui.views import DeferredView

#: ops listed per class (``m`` shows more)
FEW, MANY = 5, 25


class OpsView(DeferredView):
    """The eighth tab."""

    VIEW_ID = "ops"
    TITLE = "Top ops"
    KEY = "8"
    REQUIRES = ("top_ops",)
    BINDINGS: ClassVar[list[BindingType]] = [Binding("m", "toggle_more", "More / fewer ops")]

    def __init__(self, data: JobData | None = None, **kwargs: Any) -> None:
        super().__init__(data, **kwargs)
        self.limit = FEW
        self._shown: tuple[int, int] | None = None

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="ops-scroll"):
            yield Static(id="ops-help", classes="hint")
            yield Static(id="ops-idle")
            yield Static(id="ops-top")

    def focus_main(self) -> None:
        self.query_one("#ops-scroll", VerticalScroll).focus()

    def _fill(self) -> None:
        from tracekit.analysis import idle, top_ops
        from tracekit.views.report import idle_table, top_ops_table

        data = self._pending
        if data is None or data.analysis is None:
            return
        key = (id(data.analysis), self.limit)
        if self._shown == key:
            return
        self._shown = key
        a = data.analysis
        table = a.idle_breakdown
        self.query_one("#ops-idle", Static).update(idle_table(idle.per_rank(table), idle.job(table)))
        top = top_ops.job_level(a.top_ops, a.breakdown, MANY)
        self.query_one("#ops-top", Static).update(top_ops_table(top, self.limit))
        self.query_one("#ops-help", Static).update(Group(Text(
            f"the {self.limit} ops with the most time in each class · m: {'fewer' if self.limit == MANY else 'more'} · "
            "per rank and op: tracekit export → top_ops.parquet, idle_breakdown.parquet\n"
            "idle: host-bound = the device's next work was launched after the gap began (it waited for the CPU); "
            "sync = a host thread sat in a synchronisation call; other = the rest", style="dim")))

    def action_toggle_more(self) -> None:
        self.limit = FEW if self.limit == MANY else MANY
        self._fill()
