"""Collectives: every collective instance matched across ranks (``collective_instances``, as ``tracekit
collectives`` prints it): op, bytes, ranks seen / group size, arrival skew, wait, transfer, bus bandwidth,
link utilisation, straggler and flags; sortable (``s``/``S``, or a header), filterable by op or process
group (``/``); Enter shows the instance on the timeline, on its straggler's communication lane.

Instance times are on the job clock; the jump converts them to the rank's own clock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import DataTable, Input, Static

from tracekit.model.units import count
from tracekit.tui.data import JobData
from tracekit.tui.iterations import Cell
from tracekit.tui.table_view import MAX_ROWS, TableView
from tracekit.tui.views import ShowInTimeline, rank_clock
from tracekit.views.report import SORTS, fmt_bytes, fmt_gbps, fmt_ns, fmt_share

if TYPE_CHECKING:
    import polars as pl


class CollectivesTable(DataTable[Any]):
    """The instances; Enter shows the highlighted one on the timeline."""


class CollectivesView(TableView):
    """The fifth tab."""

    VIEW_ID = "collectives"
    TITLE = "Collectives"
    KEY = "5"
    REQUIRES = ("collective_instances",)
    SORTS = SORTS
    SORT_ORDER = ("time", "skew", "wait", "transfer", "bytes", "busbw", "utilisation")
    COLUMN_SORTS: ClassVar[dict[str, str]] = {
        "at": "time", "skew": "skew", "wait": "wait", "transfer": "transfer", "bytes": "bytes", "busbw": "busbw",
        "util": "utilisation"}
    FILTER_ID = "coll-filter"
    DEFAULT_SORT = "time"
    HELP_KEYS = (("enter", "Show the instance on the timeline"),)

    def __init__(self, data: JobData | None = None, **kwargs: Any) -> None:
        super().__init__(data, **kwargs)
        self._inst: pl.DataFrame | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="coll-help", classes="hint")
        yield CollectivesTable(id="coll-table", cursor_type="row", zebra_stripes=True,
                               cursor_foreground_priority="renderable")
        # shown by /, and while a filter is set; hidden, it can take no keys meant for the app
        yield Input(placeholder="filter by op or process group (enter: back to the table, escape: clear)",
                    id="coll-filter")

    def _fill(self) -> None:
        import polars as pl

        data = self._pending
        if data is None or data.analysis is None or self._shown == id(data.analysis.instances):
            return
        self._shown = id(data.analysis.instances)
        self._data = data
        inst = pl.from_arrow(data.analysis.instances)
        assert isinstance(inst, pl.DataFrame)
        self._inst = inst.with_columns(
            pl.concat_str(pl.col("op").fill_null(""), pl.lit(" "), pl.col("pg").fill_null(""))
            .str.to_lowercase().alias("_text"))
        self.refresh_rows()

    def refresh_rows(self) -> None:
        """Filter, sort and list the instances (the first :data:`MAX_ROWS`)."""
        inst, data = self._inst, self._data
        if inst is None or data is None or data.analysis is None:
            return
        rate = data.analysis.line_rate_bps
        t0 = int(inst.get_column("first_start_ns").min() or 0)  # type: ignore[arg-type]
        rows, matched = self.select_rows(inst)
        table = self.table
        table.clear(columns=True)
        columns = [("instance", "#"), ("at", "at"), ("iteration", "iter"), ("op", "op"), ("pg", "group"),
                   ("bytes", "bytes"), ("ranks", "ranks"), ("skew", "skew"), ("wait", "wait"),
                   ("transfer", "transfer"), ("busbw", "busbw")]
        if rate:
            columns.append(("util", "util"))
        columns += [("straggler", "straggler"), ("flags", "")]
        for key, label in columns:
            sorted_here = self.COLUMN_SORTS.get(key) == self.sort
            title = label + ((" ↓" if self.descending else " ↑") if sorted_here else "")
            table.add_column(Text(title, style="bold" if sorted_here else "",
                                  justify="left" if key in ("op", "pg", "flags") else "right"), key=key)
        for i, r in enumerate(rows.iter_rows(named=True)):
            flags = [f for f, bad in (("partial", r["partial"]), ("inconsistent", not r["consistent"]),
                                      ("sizes differ", not r["sizes_agree"])) if bad]
            seen = len(r["ranks"] or [])
            cells: list[Any] = [
                Cell(str(r["instance"]), r["instance"]), Cell(fmt_ns(r["first_start_ns"] - t0), r["first_start_ns"]),
                Cell("–" if r["iteration"] is None else str(r["iteration"]), r["iteration"]),
                Text(r["op"] or "?"), Text(r["pg"] or ""), Cell(fmt_bytes(r["bytes"]), r["bytes"]),
                Cell(f"{seen}/{r['nranks'] or '?'}", seen, style="yellow" if r["partial"] else ""),
                Cell(fmt_ns(r["skew_ns"]), r["skew_ns"]), Cell(fmt_ns(r["wait_ns"]), r["wait_ns"]),
                Cell(fmt_ns(r["transfer_ns"]), r["transfer_ns"]), Cell(fmt_gbps(r["busbw_gbps"]), r["busbw_gbps"])]
            if rate:
                cells.append(Cell(fmt_share(r["link_utilisation"]), r["link_utilisation"]))
            cells += [Cell("–" if r["straggler_rank"] is None else str(r["straggler_rank"]), r["straggler_rank"],
                           style="red" if r["straggler_rank"] is not None else ""),
                      Text(", ".join(flags), style="yellow")]
            table.add_row(*cells, key=str(i))
        self._help(matched)

    def _help(self, matched: int) -> None:
        from tracekit.model.units import format_rate
        from tracekit.views import summary

        data = self._data
        assert data is not None and data.analysis is not None
        ov = summary.collectives_overview(data.analysis.instances)
        t = Text()
        t.append(f"{count(ov['instances'], 'collective')} · {ov['matched']} matched across ranks · "
                 f"{ov['partial']} partial · {ov['inconsistent']} inconsistent", style="bold")
        rate = data.analysis.line_rate_bps
        t.append(f" · line rate {format_rate(rate)}" if rate else " · no line rate (--link-bw) for utilisation")
        t.append(f" · sorted by {self.sort} {'↓' if self.descending else '↑'}")
        if self.filter_text.strip():
            t.append(f" · filter {self.filter_text.strip()!r}: {matched} match", style="black on bright_white")
        if matched > MAX_ROWS:
            t.append(f" · the first {MAX_ROWS} of {matched} listed")
        t.append("\ns: sort by the next column (time, skew, wait, transfer, bytes, busbw, util) · S: reverse · click a "
                 "header · /: filter · enter: show it on the timeline\nskew = last arrival − first; wait = summed over "
                 "members; transfer = median over members of end − last arrival; busbw = bus bytes / transfer",
                 style="dim")
        self.query_one("#coll-help", Static).update(t)

    # ----------------------------------------------------------------- the jump

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.show_instance(int(str(event.row_key.value)))

    def show_instance(self, index: int) -> None:
        """Show listed instance ``index`` on the timeline: first arrival → last end, on the straggler's
        rank (else rank 0, else its first member) and on that member's communication lane, the cursor
        at the member's own arrival."""
        rows, data = self._rows, self._data
        if rows is None or data is None or data.analysis is None or not 0 <= index < rows.height:
            return
        r = rows.row(index, named=True)
        ranks = list(r["ranks"] or [])
        rank = r["straggler_rank"] if r["straggler_rank"] is not None else (0 if 0 in ranks or not ranks else ranks[0])
        lane, cursor = self._member_event(data, int(r["instance"]), int(rank))
        self.post_message(ShowInTimeline(int(rank), rank_clock(data, rank, int(r["first_start_ns"])),
                                         rank_clock(data, rank, int(r["last_end_ns"])), lane, cursor))

    @staticmethod
    def _member_event(data: JobData, instance: int, rank: int) -> tuple[str | None, int | None]:
        """Lane and start (rank clock) of ``rank``'s event of the instance: its communication event
        when there is one, else any event of the call; (None, None) if the rank has none."""
        analysis = data.analysis
        assert analysis is not None
        members = analysis.members
        hit = np.flatnonzero((np.asarray(members.column("instance").to_numpy(zero_copy_only=False)) == instance)
                             & (np.asarray(members.column("rank").to_numpy(zero_copy_only=False)) == rank))
        if not hit.size:
            return None, None
        cid = members.column("collective_id")[int(hit[0])].as_py()
        ev = analysis.events
        sel = ev.filter(pc.and_(pc.equal(ev.column("rank"), pa.scalar(rank, ev.schema.field("rank").type)),
                                pc.equal(ev.column("collective_id"), pa.scalar(cid, pa.int64()))))
        if sel.num_rows == 0:
            return None, None
        kinds = [str(k) for k in sel.column("kind").to_pylist()]
        i = kinds.index("comm") if "comm" in kinds else 0
        lane = sel.column("lane")[i].as_py()
        return (None if lane is None else str(lane)), int(sel.column("start_ns")[i].as_py())
