"""Overview: the job at a glance — the verdict (with the what-if replay's answer once it is computed),
where each rank's time goes (stacked bars of the five attribution classes), iteration times, the most
exposed rank and the worst iteration. Beyond :data:`tracekit.views.many_ranks.MANY_RANKS` ranks, the ranks are
summarised instead of listed: how each class is distributed over them, the outliers (ranks or whole hosts) and the
stragglers the others waited for (:mod:`tracekit.views.many_ranks`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from rich import box
from rich.columns import Columns
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Static

from tracekit.model.schema import CLASSES
from tracekit.model.units import count
from tracekit.tui.data import JobData
from tracekit.tui.views import ShowInTimeline, View
from tracekit.views import many_ranks
from tracekit.views.many_ranks import MANY_RANKS
from tracekit.views.report import CLASS_STYLES, SHORT_LABELS, VERDICT_STYLES, fmt_bytes, fmt_ns, fmt_share

#: the input warnings the Inputs card lists (tracekit summary prints up to 20)
SHOWN_WARNINGS = 5


def _nb(text: str) -> str:
    """Keep a number and its unit on one line."""
    return text.replace(" ", "\u00a0")


def split_cells(shares: list[float], width: int) -> list[int]:
    """Cells per share so that they add up to ``width`` exactly (largest remainders get the rest)."""
    total = sum(shares)
    if width <= 0 or total <= 0:
        return [0] * len(shares)
    raw = [s / total * width for s in shares]
    cells = [int(r) for r in raw]
    rest = width - sum(cells)
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - cells[i], reverse=True)[:rest]:
        cells[i] += 1
    return cells


@dataclass
class StackedBars:
    """Rich renderable: one bar per rank, the five classes side by side, as wide as the space allows."""

    rows: list[tuple[str, list[float], str]]  # label, shares of CLASSES, text after the bar
    label_width: int
    note_width: int

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        bar = max(options.max_width - self.label_width - self.note_width - 3, 10)
        for label, shares, note in self.rows:
            line = Text(label.rjust(self.label_width) + " ", no_wrap=True, overflow="crop")  # narrow: crop
            for c, n in zip(CLASSES, split_cells(shares, bar), strict=True):
                line.append("█" * n, style=CLASS_STYLES[c])
            line.append(" " + note)
            yield line


@dataclass
class IterationBars:
    """Rich renderable: one horizontal bar per iteration (the slowest rank's window)."""

    rows: list[tuple[int, int, int]]  # iteration, ns, slowest rank
    worst: int | None

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if not self.rows:
            return
        longest = max(ns for _, ns, _ in self.rows) or 1
        label = max(len(f"#{it}") for it, _, _ in self.rows)
        bar = max(options.max_width - label - 27, 8)  # label, blanks, " 271 ms rank 0", " ◀ worst"
        for it, ns, rank in self.rows:
            eighths = round(ns / longest * bar * 8)
            full, part = divmod(eighths, 8)
            text = Text(f"#{it}".rjust(label) + " ", no_wrap=True, overflow="crop")
            style = "bold red" if it == self.worst else "bright_blue"
            text.append("█" * full + (" ▏▎▍▌▋▊▉"[part] if part else ""), style=style)
            text.append(" " * (bar - full - (1 if part else 0)))
            text.append(f" {fmt_ns(ns):>7} rank {rank}")
            if it == self.worst:
                text.append(" ◀ worst", style="bold red")
            yield text


class OverviewView(View):
    """The first tab."""

    VIEW_ID = "overview"
    TITLE = "Overview"
    KEY = "1"
    REQUIRES = ()  # always there: with no iteration found it says so
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("w", "show_worst", "Show worst iteration"),
        Binding("x", "show_exposed", "Show most exposed rank"),
    ]
    can_focus = True

    def __init__(self, data: JobData | None = None, **kwargs: Any) -> None:
        super().__init__(data, **kwargs)
        self._data: JobData | None = None

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(id="verdict", classes="card")
            with Horizontal(id="overview-row"):
                yield Static(id="ranks", classes="card")
                yield Static(id="iteration-times", classes="card")
            with Horizontal(id="overview-cards"):
                yield Static(id="exposed", classes="card small")
                yield Static(id="worst", classes="card small")
                yield Static(id="inputs", classes="card small")
            yield Static(id="per-rank", classes="card")

    def on_mount(self) -> None:  # View.on_mount then shows the data
        titles = {"verdict": "Verdict: what sets the pace?", "ranks": "Where each rank's time goes",
                  "iteration-times": "Iteration times (slowest rank)", "exposed": "Most exposed rank",
                  "worst": "Worst iteration", "inputs": "Inputs", "per-rank": "Per rank (as tracekit summary)"}
        for wid, title in titles.items():
            self.query_one(f"#{wid}", Static).border_title = title

    def show_data(self, data: JobData) -> None:
        self._data = data
        job = data.job
        per_rank = data.per_rank
        answer = Text()
        if data.verdict is not None:  # the replays' answer, once phase 5 has computed it
            answer.append(data.verdict.headline, style=VERDICT_STYLES.get(data.verdict.kind, "bold"))
        elif not job.get("ranks"):
            answer.append("No iterations found: nothing to attribute.", style="bold")
        else:  # until then, measurements only: a headline from them could contradict the replays
            wait = job.get("wait_share_of_exposed")
            answer.append(f"exposed communication {fmt_share(job.get('exposed_comm_share'))}"
                          + (f" ({fmt_share(wait)} of it waiting for other ranks)" if wait is not None else ""),
                          style="bold")
            answer.append(" · the verdict follows once the replays are done", style="dim")
        facts = [count(job.get("ranks", 0), "rank"), count(job.get("iterations", 0), "iteration")]
        if job.get("ranks"):
            facts.append(f"median iteration {fmt_ns(job['median_iteration_ns'])}")
            if job.get("comm_bytes_per_iteration") is not None:
                facts.append(f"{fmt_bytes(job['comm_bytes_per_iteration'])} communicated per iteration")
        facts += data.notes
        answer.append("\n" + " · ".join(facts))
        if data.verdict is not None:
            answer.append("\n" + " ".join([*data.verdict.support,
                                            *([data.verdict.caveat] if data.verdict.caveat else [])]))
        self.query_one("#verdict", Static).update(answer)
        many = len(per_rank) > MANY_RANKS
        self.query_one("#ranks", Static).border_title = (f"Where the time of {len(per_rank):,} ranks goes" if many
                                                         else "Where each rank's time goes")
        self.query_one("#per-rank", Static).border_title = ("Ranks that stand out" if many else
                                                            "Per rank (as tracekit summary)")
        self.query_one("#ranks", Static).update(self._distribution(job, per_rank) if many else
                                                self._rank_bars(job, per_rank))
        self.query_one("#iteration-times", Static).update(self._iteration_bars(job, data.per_iteration))
        self.query_one("#exposed", Static).update(self._exposed(job))
        self.query_one("#worst", Static).update(self._worst(job))
        self.query_one("#inputs", Static).update(self._inputs(data))
        self.query_one("#per-rank", Static).update(self._standing_out(data, per_rank) if many else
                                                   self._per_rank_table(per_rank))

    @staticmethod
    def _rank_bars(job: dict[str, Any], per_rank: list[dict[str, Any]]) -> Any:
        if not job.get("ranks"):
            return Text("no iterations found")
        exposed = job["most_exposed_rank"]["rank"]
        rows = []
        for r in per_rank:
            note = f"{_nb(fmt_ns(r['median_iteration_ns'])):>7}  exposed {_nb(fmt_share(r['exposed_comm_share'])):>7}"
            note += " ◀" if r["rank"] == exposed and len(per_rank) > 1 else "  "
            rows.append((f"rank {r['rank']}", [r[f"{c}_share"] for c in CLASSES], note))
        rows.append(("job", [job[f"{c}_share"] for c in CLASSES],
                     f"{_nb(fmt_ns(job['median_iteration_ns'])):>7}  exposed "
                     f"{_nb(fmt_share(job['exposed_comm_share'])):>7}  "))
        legend = Columns([Text.assemble(("■ ", CLASS_STYLES[c]), f"{SHORT_LABELS[c]} {fmt_share(job[f'{c}_share'])}")
                          for c in CLASSES], padding=(0, 2))  # items wrap whole, never inside
        label = max(len(r[0]) for r in rows)
        return Group(StackedBars(rows, label, max(len(r[2]) for r in rows)), Text(""), legend,
                     Text("share of each rank's time in its iteration windows; median iteration at the right",
                          style="dim"))

    @staticmethod
    def _distribution(job: dict[str, Any], per_rank: list[dict[str, Any]]) -> Any:
        """Per class, its share over the ranks (min, 10th percentile, median, 90th percentile, max; the ranks at the
        ends), with the job's own stacked bar."""
        if not job.get("ranks"):
            return Text("no iterations found")
        dist = many_ranks.distribution(per_rank)
        table = Table(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False, expand=False)
        for name, justify in (("", "left"), ("min", "right"), ("p10", "right"), ("median", "right"),
                              ("p90", "right"), ("max", "right"), ("lowest · highest", "left")):
            table.add_column(name, justify=justify)  # type: ignore[arg-type]
        for r in dist.iter_rows(named=True):
            fmt = fmt_share if r["share"] else (lambda v: fmt_ns(int(v)))
            label = "iteration" if r["figure"] == "iteration" else SHORT_LABELS[r["figure"]]
            style = CLASS_STYLES.get(r["figure"], "bold")
            table.add_row(Text(label, style=style), *[fmt(r[k]) for k in ("min", "p10", "median", "p90", "max")],
                          f"rank {r['min_rank']} · rank {r['max_rank']}")
        bars = StackedBars([("job", [job[f"{c}_share"] for c in CLASSES],
                             f"{_nb(fmt_ns(job['median_iteration_ns'])):>7}  exposed "
                             f"{_nb(fmt_share(job['exposed_comm_share'])):>7}")], 4, 25)
        return Group(table, bars, Text(f"over {len(per_rank):,} ranks: each figure's spread (the rank's share of its "
                                       "own time, or its median iteration); the ranks at either end", style="dim"))

    @staticmethod
    def _standing_out(data: JobData, per_rank: list[dict[str, Any]]) -> Any:
        """The outliers (ranks, or whole hosts) and the stragglers, never a row per rank."""
        ranks = data.analysis.ranks if data.analysis is not None else data.ranks
        hosts = dict(zip(ranks.column("rank").to_pylist(), ranks.column("host").to_pylist(), strict=True))
        out = Text()
        found = many_ranks.outliers(per_rank, hosts)
        out.append("Outliers", style="bold")
        out.append(f" (beyond {many_ranks.OUTLIER_MADS:g} robust deviations from the median rank)\n", style="dim")
        if not found:
            out.append("  none: every rank is close to the median rank on every figure\n")
        for o in found:
            fmt = fmt_share if o["share"] else (lambda v: fmt_ns(int(v)))
            label = "iteration" if o["figure"] == "iteration" else SHORT_LABELS[o["figure"]]
            out.append(f"  {o['who']}: ", style="bold")
            out.append(f"{label} {fmt(o['value'])} (median rank {fmt(o['median'])}, {o['deviations']:.0f}x)\n",
                       style=CLASS_STYLES.get(o["figure"], ""))
        out.append("\nStragglers", style="bold")
        out.append(" (who the others waited for in collectives)\n", style="dim")
        if data.analysis is None:
            out.append("  matching the collectives across ranks…", style="dim")
            return out
        strag = many_ranks.stragglers(data.analysis.instances)
        if strag.height == 0:
            out.append("  none judged (no complete collective matched across ranks)")
        for r in strag.iter_rows(named=True):
            share = f"{fmt_share(r['wait_share'])} of all waiting" if r["wait_share"] is not None else ""
            out.append(f"  rank {r['rank']}", style="bold")
            out.append(f" ({hosts.get(r['rank']) or '?'}): last to arrive {r['last_arrivals']:,} times, "
                       f"{fmt_ns(int(r['waited_ns']))} waited for it, {share}\n")
        out.append("\nx / w: show on the timeline · 3 then g: go to a rank · F: keep a host or group", style="dim")
        return out

    @staticmethod
    def _iteration_bars(job: dict[str, Any], per_iteration: list[dict[str, Any]]) -> Any:
        if not per_iteration:
            return Text("no iterations found")
        worst = job["worst_iteration"]["iteration"]
        rows = [(int(r["iteration"]), int(r["iteration_ns"]), int(r["slowest_rank"])) for r in per_iteration]
        if len(rows) > 40:  # too many for a bar each: the slowest ones, in iteration order
            keep = {it for it, _, _ in sorted(rows, key=lambda r: -r[1])[:40]}
            rows = [r for r in rows if r[0] in keep]
        return IterationBars(rows, worst)

    @staticmethod
    def _per_rank_table(per_rank: list[dict[str, Any]]) -> Any:
        if not per_rank:
            return Text("no iterations found")
        table = Table(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False, expand=False)
        table.add_column("rank", justify="right")
        table.add_column("iters", justify="right")
        table.add_column("median", justify="right")
        for c in CLASSES:
            table.add_column(SHORT_LABELS[c], justify="right", style=CLASS_STYLES[c])
        table.add_column("comm/it", justify="right")
        for row in per_rank:
            table.add_row(str(row["rank"]), str(row["iterations"]), fmt_ns(row["median_iteration_ns"]),
                          *[fmt_share(row[f"{c}_share"]) for c in CLASSES], fmt_bytes(row["comm_bytes_per_iteration"]))
        return table

    @staticmethod
    def _exposed(job: dict[str, Any]) -> Text:
        if not job.get("ranks"):
            return Text("–")
        e = job["most_exposed_rank"]
        t = Text(f"rank {e['rank']}", style="bold")
        t.append(f"\n{fmt_share(e['exposed_comm_share'])} of its time ({fmt_ns(e['exposed_comm_ns'])}) is "
                 "communication not hidden under compute")
        t.append("\nx: show it on the timeline", style="dim")
        return t

    @staticmethod
    def _worst(job: dict[str, Any]) -> Text:
        if not job.get("ranks"):
            return Text("–")
        w = job["worst_iteration"]
        t = Text(f"#{w['iteration']} took {fmt_ns(w['iteration_ns'])}", style="bold")
        t.append(f"\nslowest on rank {w['slowest_rank']}; median iteration {fmt_ns(job['median_iteration_ns'])}")
        t.append("\nw: show it on the timeline", style="dim")
        return t

    @staticmethod
    def _inputs(data: JobData) -> Text:
        t = Text(f"{count(len(data.files), 'file')} · {count(data.ranks.num_rows, 'rank')} · "
                 f"{count(data.events, 'event', grouped=True)}", style="bold")
        t.append("\nresults from the cache" if data.from_cache else "\nanalysed now")
        warnings = data.warnings
        if warnings:
            t.append(f"\n{count(len(warnings), 'warning')}:", style="yellow")
            for d in warnings[:SHOWN_WARNINGS]:  # the file's name, not its path: the card is narrow
                t.append(f"\n• {replace(d, path=os.path.basename(d.path))}", style="yellow")
            if len(warnings) > SHOWN_WARNINGS:
                t.append(f"\n… and {len(warnings) - SHOWN_WARNINGS} more (tracekit summary prints them all)",
                         style="yellow")
        else:
            t.append("\nno warnings about the inputs", style="dim")
        return t

    def action_show_worst(self) -> None:
        data = self._data
        if data is None or not data.job.get("ranks"):
            return
        w = data.job["worst_iteration"]
        self._post_window(data, int(w["slowest_rank"]), int(w["iteration"]))

    def action_show_exposed(self) -> None:
        """The most exposed rank's most exposed iteration."""
        data = self._data
        if data is None or not data.job.get("ranks"):
            return
        rank = int(data.job["most_exposed_rank"]["rank"])
        rows = [r for r in data.breakdown.to_pylist() if r["rank"] == rank]
        if rows:
            self._post_window(data, rank, int(max(rows, key=lambda r: r["exposed_comm_ns"])["iteration"]))

    def _post_window(self, data: JobData, rank: int, iteration: int) -> None:
        for row in data.breakdown.to_pylist():
            if row["rank"] == rank and row["iteration"] == iteration:
                self.post_message(ShowInTimeline(rank, int(row["start_ns"]), int(row["end_ns"])))
                return
