"""Iterations: the ``breakdown`` table, one row per rank × iteration, sortable by any column; Enter
shows the row's window on the timeline."""

from __future__ import annotations

from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable, Static

from tracekit.model.schema import CLASSES
from tracekit.model.units import count
from tracekit.tui.data import JobData
from tracekit.tui.overview import split_cells
from tracekit.tui.views import DeferredView, ShowInTimeline
from tracekit.views.report import CLASS_STYLES, SHORT_LABELS, fmt_bytes, fmt_ns


class Cell(Text):
    """A table cell that sorts by its number, not its text (None sorts first)."""

    def __init__(self, text: str, value: float | None, style: str = "", justify: str = "right") -> None:
        super().__init__(text, style=style, justify=justify)  # type: ignore[arg-type]
        self.value = value

    @property
    def sort_key(self) -> tuple[bool, float]:
        return (self.value is not None, self.value if self.value is not None else 0.0)


def _bar(row: dict[str, Any], width: int = 20) -> Text:
    t = Text()
    wall = row["wall_ns"] or 1
    for c, n in zip(CLASSES, split_cells([row[f"{c}_ns"] / wall for c in CLASSES], width), strict=True):
        t.append("█" * n, style=CLASS_STYLES[c])
    return t


class IterationsTable(DataTable[Any]):
    """The table itself (Enter selects a row: the view shows it on the timeline)."""


class IterationsView(DeferredView):
    """The second tab."""

    VIEW_ID = "iterations"
    TITLE = "Iterations"
    KEY = "2"
    REQUIRES = ("breakdown",)
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "sort_next", "Sort by next column"),
        Binding("S", "sort_reverse", "Reverse sort"),
    ]
    HELP_KEYS = (("enter", "Show the window on the timeline"),)

    def __init__(self, data: JobData | None = None, **kwargs: Any) -> None:
        super().__init__(data, **kwargs)
        self._shown: int | None = None
        self._sorted: tuple[str, bool] | None = None
        self._t0 = 0
        self._columns: list[str] = []

    def compose(self) -> ComposeResult:
        yield Static(id="iterations-help", classes="hint")
        yield IterationsTable(id="iterations-table", cursor_type="row", zebra_stripes=True)

    def focus_main(self) -> None:
        self.query_one(IterationsTable).focus()

    @property
    def table(self) -> IterationsTable:
        return self.query_one(IterationsTable)

    def _fill(self) -> None:
        data = self._pending
        if data is None or self._shown == id(data.breakdown):
            return
        self._shown = id(data.breakdown)
        rows = data.breakdown.sort_by([("rank", "ascending"), ("iteration", "ascending")]).to_pylist()
        self._t0 = min((r["start_ns"] for r in rows), default=0)
        split = any(r["wait_ns"] is not None for r in rows)
        table = self.table
        table.clear(columns=True)
        cols = [("rank", "rank"), ("iteration", "iter"), ("start_ns", "start"), ("wall_ns", "wall")]
        cols += [(f"{c}_ns", SHORT_LABELS[c]) for c in CLASSES]
        if split:
            cols += [("wait_ns", "wait"), ("transfer_ns", "transfer")]
        cols += [("comm_bytes", "comm bytes"), ("bar", "breakdown")]
        self._columns = [k for k, _ in cols]
        for key, label in cols:
            style = CLASS_STYLES.get(key.removesuffix("_ns"), "")
            table.add_column(Text(label, style=f"bold {style}".strip(), justify="right"), key=key)
        for row in rows:
            cells: list[Any] = [Cell(str(row["rank"]), row["rank"]), Cell(f"#{row['iteration']}", row["iteration"]),
                                Cell("+" + fmt_ns(row["start_ns"] - self._t0), row["start_ns"]),
                                Cell(fmt_ns(row["wall_ns"]), row["wall_ns"], style="bold")]
            for c in CLASSES:
                v = row[f"{c}_ns"]
                share = f" {100 * v / row['wall_ns']:3.0f}%" if row["wall_ns"] else ""
                cells.append(Cell(fmt_ns(v) + share, v, style=CLASS_STYLES[c]))
            if split:
                cells += [Cell(fmt_ns(row["wait_ns"]), row["wait_ns"]),
                          Cell(fmt_ns(row["transfer_ns"]), row["transfer_ns"])]
            cells += [Cell(fmt_bytes(row["comm_bytes"]), row["comm_bytes"]), _bar(row)]
            table.add_row(*cells, key=f"{row['rank']}:{row['iteration']}")
        self._sorted = None
        self._hint()

    def _hint(self) -> None:
        by = ""
        if self._sorted:
            key, reverse = self._sorted
            by = f" · sorted by {key.removesuffix('_ns')} {'↓' if reverse else '↑'}"
        self.query_one("#iterations-help", Static).update(
            Text(f"{count(self.table.row_count, 'window')} (rank × iteration){by} · s: sort by the next column · "
                 "S: reverse · click a header to sort by it · enter: show the window on the timeline", style="dim"))

    def sort_by(self, key: str, reverse: bool | None = None) -> None:
        """Sort by column ``key`` (a breakdown column name). Durations and bytes sort biggest first,
        rank, iteration and start in order; ``reverse`` overrides that."""
        if key == "bar":
            key = "wall_ns"
        if key not in self._columns:
            return
        if reverse is None:
            reverse = key not in ("rank", "iteration", "start_ns")
        self.table.sort(key, key=lambda cell: cell.sort_key, reverse=reverse)
        self._sorted = (key, reverse)
        self._hint()

    def action_sort_next(self) -> None:
        """Sort by the next column (rank → iteration → start → wall → compute → ...)."""
        keys = [k for k in self._columns if k != "bar"]
        current = self._sorted[0] if self._sorted else "iteration"
        self.sort_by(keys[(keys.index(current) + 1) % len(keys)] if current in keys else keys[0])

    def action_sort_reverse(self) -> None:
        key, reverse = self._sorted or ("rank", False)
        self.sort_by(key, not reverse)

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        event.stop()
        key = str(event.column_key.value)
        if self._sorted and self._sorted[0] == key:
            self.sort_by(key, not self._sorted[1])
        else:
            self.sort_by(key)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        key = str(event.row_key.value)
        rank_s, _ = key.split(":")
        cells = self.table.get_row(key)
        start = cells[2].value
        wall = cells[3].value
        self.post_message(ShowInTimeline(int(rank_s), int(start), int(start) + int(wall)))
