"""Critical path: per iteration, the path's length (= the iteration time) and what it was spent on; below,
the selected iteration's path as runs of consecutive segments with the same rank, label and activity
(as ``tracekit critical-path`` prints them), coloured by label, waiting on a rank in bold red. Enter on a
run shows it on the timeline.

The view only reads ``Analysis.critical_path`` / ``critical_path_summary``: the loading worker computed
them in phase 4 (``tui/data.py``), before the view could appear.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable, Static

from tracekit.tui.data import JobData
from tracekit.tui.iterations import Cell
from tracekit.tui.overview import split_cells
from tracekit.tui.views import DeferredView, ShowInTimeline, rank_clock
from tracekit.views.report import PATH_STYLES, fmt_ns, fmt_share

if TYPE_CHECKING:
    import polars as pl

#: runs listed at most (the longest, in time order); a big job's path has thousands per iteration
MAX_RUNS = 2000
#: with the short runs hidden (``m``), runs shorter than this share of the iteration are left out
MIN_SHARE = 0.01
#: the labels in the order of the summary's columns (tracekit.analysis.graph.critical_path.LABELS)
LABEL_TITLES = {"compute": "compute", "memory": "memory", "transfer": "transfer", "CPU": "CPU", "launch": "launch",
                "idle": "idle", "waiting": "waiting"}


def _style(what: str) -> str:
    return PATH_STYLES["waiting"] if what.startswith("waiting") else PATH_STYLES.get(what, "")


def share_bar(shares: dict[str, float], width: int = 24) -> Text:
    """The labels' shares of a path side by side, in their colours."""
    t = Text()
    labels = list(LABEL_TITLES)
    for lab, n in zip(labels, split_cells([shares.get(lab) or 0.0 for lab in labels], width), strict=True):
        t.append("█" * n, style=PATH_STYLES[lab].replace("bold ", ""))
    return t


class PathIterations(DataTable[Any]):
    """One row per iteration (the summary); moving the cursor selects the iteration whose path is shown."""


class PathRuns(DataTable[Any]):
    """The selected iteration's path as runs; Enter shows a run on the timeline."""


class CriticalPathView(DeferredView):
    """The fourth tab."""

    VIEW_ID = "critical_path"
    TITLE = "Critical path"
    KEY = "4"
    REQUIRES = ("critical_path", "critical_path_summary")
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "sort_runs", "Longest first / in order"),
        Binding("m", "short_runs", "All runs / 1 %+"),
    ]
    HELP_KEYS = (("enter", "Show the run on the timeline"), ("tab", "Iterations ↔ runs"))

    def __init__(self, data: JobData | None = None, **kwargs: Any) -> None:
        super().__init__(data, **kwargs)
        self._shown: int | None = None
        self._data: JobData | None = None
        self.iteration: int | None = None  # the iteration whose path is listed
        self.longest_first = False
        self.hide_short = True  # as tracekit critical-path: runs of at least 1 % (m: all)
        self._runs: pl.DataFrame | None = None  # the listed runs, in table order

    def compose(self) -> ComposeResult:
        yield Static(id="cp-help", classes="hint")
        # the cursor row keeps its cells' colours (the bars, the labels)
        yield PathIterations(id="cp-iterations", cursor_type="row", zebra_stripes=True,
                             cursor_foreground_priority="renderable")
        yield Static(id="cp-title", classes="hint")
        yield PathRuns(id="cp-runs", cursor_type="row", zebra_stripes=True, cursor_foreground_priority="renderable")

    def focus_main(self) -> None:
        self.query_one(PathRuns).focus()

    @property
    def iterations_table(self) -> PathIterations:
        return self.query_one(PathIterations)

    @property
    def runs_table(self) -> PathRuns:
        return self.query_one(PathRuns)

    def _fill(self) -> None:
        data = self._pending
        if data is None or data.analysis is None or not data.paths_ready:
            return
        summ = data.analysis.critical_path_summary
        if self._shown == id(summ):
            return
        self._shown = id(summ)
        self._data = data
        table = self.iterations_table
        table.clear(columns=True)
        table.add_column(Text("iter", justify="right"), key="iteration")
        table.add_column(Text("length", justify="right"), key="path_ns")
        table.add_column("what the path went through", key="bar")
        for lab, title in LABEL_TITLES.items():
            table.add_column(Text(title, style=f"bold {PATH_STYLES[lab]}".replace("bold bold", "bold"),
                                  justify="right"), key=lab)
        table.add_column("ranks on path", key="ranks")
        table.add_column("most waited on", key="most_waited_on")
        rows = summ.to_dicts()
        for row in rows:
            shares = {lab: row[f"{lab}_share"] for lab in LABEL_TITLES}
            waited = row["most_waited_on"]
            table.add_row(Cell(f"#{row['iteration']}", row["iteration"]), Cell(fmt_ns(row["path_ns"]), row["path_ns"]),
                          share_bar(shares),
                          *[Cell(fmt_share(shares[lab]), shares[lab], style=PATH_STYLES[lab] if shares[lab] else "dim")
                            for lab in LABEL_TITLES],
                          ",".join(str(r) for r in row["ranks"]),
                          Text("–", style="dim") if waited is None else
                          Text(f"rank {waited}", style=PATH_STYLES["waiting"]),
                          key=str(row["iteration"]))
        self._help()
        if rows:  # the slowest iteration first, as tracekit critical-path does
            slowest = max(range(len(rows)), key=lambda i: rows[i]["path_ns"])
            table.move_cursor(row=slowest)
            self.select(int(rows[slowest]["iteration"]))

    def _help(self) -> None:
        legend = Text()
        for lab in LABEL_TITLES:
            legend.append("■ ", style=PATH_STYLES[lab].replace("bold ", ""))
            legend.append(("waiting on a rank" if lab == "waiting" else lab) + "  ")
        legend.append("\n↑/↓ above: pick an iteration · tab: switch tables · enter on a run: show it on the "
                      "timeline · s: longest first · m: all runs / those of 1 % and more", style="dim")
        self.query_one("#cp-help", Static).update(legend)

    def select(self, iteration: int) -> None:
        """List the path of ``iteration`` as runs."""
        from tracekit.analysis.graph.critical_path import runs as path_runs

        data = self._data
        if data is None or data.analysis is None:
            return
        import polars as pl

        self.iteration = iteration
        segs = data.analysis.critical_path.filter(pl.col("iteration") == iteration)
        runs = path_runs(segs)
        total = int(runs.get_column("dur_ns").sum()) if runs.height else 0
        t0 = int(runs.get_column("start_ns").min()) if runs.height else 0  # type: ignore[arg-type]
        shown = runs
        if self.hide_short and total:
            shown = shown.filter(pl.col("dur_ns") >= MIN_SHARE * total)
        capped = shown.height > MAX_RUNS
        if capped:
            shown = shown.sort("dur_ns", descending=True).head(MAX_RUNS).sort("start_ns")
        if self.longest_first:
            shown = shown.sort("dur_ns", descending=True, maintain_order=True)
        self._runs = shown
        table = self.runs_table
        table.clear()
        if not table.columns:
            for key, label, right in (("at", "at", True), ("for", "for", True), ("share", "of path", True),
                                      ("rank", "rank", True), ("lane", "lane", False), ("what", "what", False),
                                      ("name", "activity", False)):
                table.add_column(Text(label, justify="right" if right else "left"), key=key)
        for i, row in enumerate(shown.iter_rows(named=True)):
            what = row["what"]
            table.add_row(Cell(fmt_ns(row["start_ns"] - t0), row["start_ns"]),
                          Cell(fmt_ns(row["dur_ns"]), row["dur_ns"]),
                          Cell(fmt_share(row["dur_ns"] / total) if total else "–", row["dur_ns"]),
                          Cell(str(row["rank"]), row["rank"]), row["lane"] or "",
                          Text(what, style=_style(what)), Text(row["name"] or "", overflow="ellipsis", no_wrap=True),
                          key=str(i))
        order = "longest first" if self.longest_first else "in time order"
        title = Text(f"iteration #{iteration}: the critical path, {fmt_ns(total)} — {runs.height} runs", style="bold")
        if self.hide_short:
            title.append(f", {shown.height} of at least {100 * MIN_SHARE:g} %")
        if capped:
            title.append(f", the {MAX_RUNS} longest")
        title.append(f", {order}", style="")
        self.query_one("#cp-title", Static).update(title)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table is self.iterations_table:
            event.stop()
            key = event.row_key.value
            if key is not None and int(key) != self.iteration:
                self.select(int(key))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.data_table is self.iterations_table:
            self.runs_table.focus()  # the iteration is selected already: go to its path
            return
        self.show_run(int(str(event.row_key.value)))

    def show_run(self, index: int) -> None:
        """Show run ``index`` of the listed runs on the timeline, on its lane (job clock → its rank's clock)."""
        if self._runs is None or self._data is None or not 0 <= index < self._runs.height:
            return
        row = self._runs.row(index, named=True)
        rank = int(row["rank"])
        self.post_message(ShowInTimeline(rank, rank_clock(self._data, rank, int(row["start_ns"])),
                                         rank_clock(self._data, rank, int(row["end_ns"])), row["lane"]))

    def action_sort_runs(self) -> None:
        self.longest_first = not self.longest_first
        if self.iteration is not None:
            self.select(self.iteration)

    def action_short_runs(self) -> None:
        self.hide_short = not self.hide_short
        if self.iteration is not None:
            self.select(self.iteration)
