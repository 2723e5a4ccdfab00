"""A tab that lists one result table: sorted (``s`` cycles the columns, ``S`` reverses, or a header
click) and filtered by a case-insensitive substring (``/``), the first :data:`MAX_ROWS` rows shown.

Subclasses say which sorts exist and how a row is drawn; the keys, the filter box and the sorting live here
once, so every table tab behaves the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from textual.binding import Binding, BindingType
from textual.widgets import DataTable, Input

from tracekit.tui.data import JobData
from tracekit.tui.views import DeferredView

if TYPE_CHECKING:
    import polars as pl

#: rows listed at most (the first of the sort order); the hint says how many matched
MAX_ROWS = 1000


class TableView(DeferredView):
    """Base of the sortable, filterable table tabs; the rows come from :meth:`refresh_rows`."""

    #: sort name → (column, largest first by default)
    SORTS: ClassVar[dict[str, tuple[str, bool]]] = {}
    #: sort names in the order ``s`` cycles through them
    SORT_ORDER: ClassVar[tuple[str, ...]] = ()
    #: table column key → sort name, for a click on a header
    COLUMN_SORTS: ClassVar[dict[str, str]] = {}
    #: id of the filter box (an :class:`~textual.widgets.Input` the subclass composes)
    FILTER_ID: ClassVar[str] = ""
    DEFAULT_SORT: ClassVar[str] = ""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "sort_next", "Sort by next column"),
        Binding("S", "sort_reverse", "Reverse sort"),
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("escape", "clear_filter", "Clear the filter", show=False),
    ]

    def __init__(self, data: JobData | None = None, **kwargs: Any) -> None:
        super().__init__(data, **kwargs)
        self._data: JobData | None = None
        self._shown: int | None = None
        self._rows: pl.DataFrame | None = None  # the listed rows, in table order
        self.sort = self.DEFAULT_SORT
        self.descending = self.SORTS[self.sort][1] if self.sort in self.SORTS else False
        self.filter_text = ""

    def on_mount(self) -> None:  # View.on_mount then shows the data
        # hidden, the filter box can take no keys meant for the app; / shows it
        self.query_one(f"#{self.FILTER_ID}", Input).display = False

    def focus_main(self) -> None:
        self.table.focus()

    @property
    def table(self) -> DataTable[Any]:
        return self.query_one(DataTable)

    def refresh_rows(self) -> None:
        """Filter, sort and list the rows (with :meth:`select_rows`)."""
        raise NotImplementedError

    def select_rows(self, frame: pl.DataFrame) -> tuple[pl.DataFrame, int]:
        """``frame`` filtered by its ``_text`` column and sorted as chosen: the first :data:`MAX_ROWS`
        rows, and how many matched."""
        import polars as pl

        rows = frame
        if self.filter_text.strip():
            rows = rows.filter(pl.col("_text").str.contains(self.filter_text.strip().lower(), literal=True))
        col, _ = self.SORTS[self.sort]
        rows = rows.sort(col, descending=self.descending, nulls_last=True, maintain_order=True)
        self._rows = rows.head(MAX_ROWS)
        return self._rows, rows.height

    def sort_by(self, name: str, descending: bool | None = None) -> None:
        """Sort by ``name`` (a key of :attr:`SORTS`), in its default direction unless ``descending`` says
        otherwise."""
        if name not in self.SORTS:
            return
        self.sort = name
        self.descending = self.SORTS[name][1] if descending is None else descending
        self.refresh_rows()

    def action_sort_next(self) -> None:
        order = self.SORT_ORDER
        self.sort_by(order[(order.index(self.sort) + 1) % len(order)])

    def action_sort_reverse(self) -> None:
        self.sort_by(self.sort, not self.descending)

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        event.stop()
        name = self.COLUMN_SORTS.get(str(event.column_key.value))
        if name is not None:
            self.sort_by(name, (not self.descending) if name == self.sort else None)

    def action_filter(self) -> None:
        box = self.query_one(f"#{self.FILTER_ID}", Input)
        box.display = True
        box.focus()

    def action_clear_filter(self) -> None:
        box = self.query_one(f"#{self.FILTER_ID}", Input)
        if box.value:
            box.value = ""  # Input.Changed refills the table
        box.display = False
        self.table.focus()

    def set_filter(self, text: str) -> None:
        """List only the rows whose text contains ``text`` (case-insensitive)."""
        self.filter_text = text
        self.refresh_rows()

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.set_filter(event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        event.input.display = bool(event.value.strip())  # a filter in force stays in sight
        self.table.focus()
