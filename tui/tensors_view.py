"""Tensors: one row per tensor of the Horovod timelines (``horovod_tensors``, as ``tracekit tensors`` prints
it): op, dtype, shape, bytes, instances, negotiation wait and transfer (total and median), bus bandwidth,
link utilisation, fusion and which rank asked last; sortable (``s``/``S``, or a header) and filterable by
tensor name or op (``/``), with the job's totals (unions: a fused response's transfer counts once).

Shown only when the job has a Horovod timeline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import DataTable, Input, Static

from tracekit.model.units import count
from tracekit.tui.data import JobData
from tracekit.tui.iterations import Cell
from tracekit.tui.table_view import MAX_ROWS, TableView
from tracekit.views.report import TENSOR_SORTS, fmt_bytes, fmt_gbps, fmt_ns, fmt_share, rank_count

if TYPE_CHECKING:
    import polars as pl

class TensorsTable(DataTable[Any]):
    """The tensors."""


class TensorsView(TableView):
    """The seventh tab (Horovod jobs only)."""

    VIEW_ID = "tensors"
    TITLE = "Tensors"
    KEY = "7"
    REQUIRES = ("horovod_tensors",)
    SORTS = TENSOR_SORTS
    SORT_ORDER = ("transfer", "negotiation", "bytes", "busbw", "instances", "name")
    COLUMN_SORTS: ClassVar[dict[str, str]] = {
        "tensor": "name", "bytes": "bytes", "instances": "instances", "negotiation": "negotiation",
        "transfer": "transfer", "busbw": "busbw"}
    FILTER_ID = "tensors-filter"
    DEFAULT_SORT = "transfer"

    def __init__(self, data: JobData | None = None, **kwargs: Any) -> None:
        super().__init__(data, **kwargs)
        self._tensors: pl.DataFrame | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="tensors-help", classes="hint")
        yield TensorsTable(id="tensors-table", cursor_type="row", zebra_stripes=True)
        yield Input(placeholder="filter by tensor name or op (enter: back to the table, escape: clear)",
                    id="tensors-filter")
        yield Static(id="tensors-totals", classes="hint")

    def _fill(self) -> None:
        import polars as pl

        data = self._pending
        if data is None or data.analysis is None or data.analysis.horovod is None:
            return
        res = data.analysis.horovod
        if self._shown == id(res.tensors):
            return
        self._shown = id(res.tensors)
        self._data = data
        t = pl.from_arrow(res.tensors)
        assert isinstance(t, pl.DataFrame)
        self._tensors = t.with_columns(
            pl.concat_str(pl.col("tensor").fill_null(""), pl.lit(" "), pl.col("op").fill_null(""))
            .str.to_lowercase().alias("_text"))
        self.query_one("#tensors-totals", Static).update(self._totals())
        self.refresh_rows()

    def _totals(self) -> Text:
        data = self._data
        assert data is not None and data.analysis is not None and data.analysis.horovod is not None
        tot = data.analysis.horovod.totals
        t = Text()
        t.append("all: ", style="bold")
        t.append(f"{fmt_bytes(tot['bytes_total'])} in {count(tot['instances'], 'instance')}; over "
                 f"{fmt_ns(tot['span_ns'])} of timeline, transfer {fmt_ns(tot['transfer_ns'])} and negotiation "
                 f"{fmt_ns(tot['negotiation_ns'])} "
                 "(unions: fused tensors and concurrent negotiations once)")
        if tot.get("busbw_gbps") is not None:
            t.append(f"; busbw {fmt_gbps(tot['busbw_gbps'])}")
            if tot.get("link_utilisation") is not None:
                t.append(f" ({fmt_share(tot['link_utilisation'])} of the line rate)")
        last = tot.get("last_ticks") or {}
        t.append("\nlast to ask: ", style="bold")
        t.append(", ".join(f"rank {r} {n}" for r, n in sorted(last.items())) + f" (of {tot['judged']} judged "
                 "negotiations)" if last else "no negotiation logged every rank")
        return t

    def refresh_rows(self) -> None:
        """Filter, sort and list the tensors (the first :data:`MAX_ROWS`)."""
        tensors, data = self._tensors, self._data
        if tensors is None or data is None or data.analysis is None or data.analysis.horovod is None:
            return
        rate = data.analysis.line_rate_bps
        rows, matched = self.select_rows(tensors)
        table = self.table
        table.clear(columns=True)
        columns = [("tensor", "tensor"), ("op", "op"), ("dtype", "dtype"), ("shape", "shape"), ("bytes", "bytes"),
                   ("instances", "inst"), ("negotiation", "negotiation"), ("negotiation_median", "median"),
                   ("transfer", "transfer"), ("transfer_median", "median"), ("busbw", "busbw")]
        if rate:
            columns.append(("util", "util"))
        columns += [("fused", "fused"), ("last", "last")]
        for key, label in columns:
            here = self.COLUMN_SORTS.get(key) == self.sort
            table.add_column(Text(label + ((" ↓" if self.descending else " ↑") if here else ""),
                                  style="bold" if here else "",
                                  justify="left" if key in ("tensor", "op", "dtype", "shape", "last") else "right"),
                             key=key)
        for i, r in enumerate(rows.iter_rows(named=True)):
            shape = r["shape"] or "–"
            last = " ".join(f"r{k}:{n}" for k, n in enumerate(r["last_ticks"] or []) if n) or "–"
            fused = r["fusion_size_median"]
            cells: list[Any] = [
                Text(r["tensor"] or "?", overflow="ellipsis", no_wrap=True), Text(r["op"] or "?"),
                Text(r["dtype"] or "–"), Text(shape if len(shape) <= 24 else shape[:23] + "…"),
                Cell(fmt_bytes(r["bytes"]), r["bytes"]), Cell(str(r["instances"]), r["instances"]),
                Cell(fmt_ns(r["negotiate_ns"]), r["negotiate_ns"]),
                Cell(fmt_ns(r["negotiate_median_ns"]), r["negotiate_median_ns"]),
                Cell(fmt_ns(r["transfer_ns"]), r["transfer_ns"]),
                Cell(fmt_ns(r["transfer_median_ns"]), r["transfer_median_ns"]),
                Cell(fmt_gbps(r["busbw_gbps"]), r["busbw_gbps"])]
            if rate:
                cells.append(Cell(fmt_share(r["link_utilisation"]), r["link_utilisation"]))
            cells += [Cell("–" if fused is None else f"{fused:g}", fused), Text(last)]
            table.add_row(*cells, key=str(i))
        self._help(matched)

    def _help(self, matched: int) -> None:
        from tracekit.model.units import format_rate

        data = self._data
        assert data is not None and data.analysis is not None and data.analysis.horovod is not None
        res = data.analysis.horovod
        tot = res.totals
        t = Text()
        t.append(f"{count(tot['tensors'], 'tensor')} · {count(tot['instances'], 'op instance')} in "
                 f"{count(tot['responses'], 'response')} · {rank_count(res.world_size)}", style="bold")
        rate = data.analysis.line_rate_bps
        if rate:
            t.append(f" · line rate {format_rate(rate)}")
        t.append(f" · sorted by {self.sort} {'↓' if self.descending else '↑'}")
        if self.filter_text.strip():
            t.append(f" · filter {self.filter_text.strip()!r}: {matched} match", style="black on bright_white")
        if matched > MAX_ROWS:
            t.append(f" · the first {MAX_ROWS} of {matched} listed")
        t.append("\ns: sort by the next column (transfer, negotiation, bytes, busbw, instances, name) · S: reverse · "
                 "click a header · /: filter\nbytes = dtype × shape of one instance; negotiation = waiting for the "
                 "other ranks; transfer = the whole transfer of the fused responses it travelled in (shared: never "
                 "add the rows up); last = how often each rank asked last", style="dim")
        self.query_one("#tensors-help", Static).update(t)
