"""Human-readable rendering of analysis results for the terminal (rich), shared by the CLI and TUI."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich import box
from rich.console import Console
from rich.table import Table

from tracekit import summary
from tracekit.schema import CLASSES

if TYPE_CHECKING:
    from tracekit.analysis import Result

CLASS_LABELS = {"compute": "compute", "overlapped": "overlapped", "exposed_comm": "exposed comm",
                "memory": "memory", "idle": "idle"}
SHORT_LABELS = {"compute": "compute", "overlapped": "overlap", "exposed_comm": "exposed", "memory": "memory",
                "idle": "idle"}
CLASS_STYLES = {"compute": "green", "overlapped": "cyan", "exposed_comm": "red", "memory": "yellow",
                "idle": "grey50"}


def fmt_ns(ns: float | int | None) -> str:
    """``1234567`` → ``1.23 ms``."""
    if ns is None:
        return "–"
    ns = float(ns)
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(ns) >= scale:
            v = ns / scale
            return f"{v:.3g} {unit}" if abs(v) < 100 else f"{v:.0f} {unit}"
    return f"{ns:.0f} ns"


def fmt_bytes(n: float | int | None) -> str:
    """``3145728`` → ``3.15 MB`` (decimal units, as link rates are)."""
    if n is None:
        return "–"
    n = float(n)
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def fmt_share(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


def render_summary(console: Console, result: Result) -> None:
    """The ``tracekit summary`` screen: ranks × classes, then the job's headline numbers."""
    pr = summary.per_rank(result.breakdown)
    job = summary.job(result.breakdown)
    title = f"{job['ranks']} ranks · {job['iterations']} iterations"
    if result.notes:
        title += " · " + "; ".join(result.notes)
    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False,
                  caption="share of each rank's iteration time; overlap = communication hidden under compute, "
                          "exposed = communication with no compute", caption_justify="left")
    table.add_column("rank", justify="right", no_wrap=True)
    table.add_column("iters", justify="right", no_wrap=True)
    table.add_column("median", justify="right", no_wrap=True)
    for c in CLASSES:
        table.add_column(SHORT_LABELS[c], justify="right", style=CLASS_STYLES[c], no_wrap=True)
    table.add_column("comm/it", justify="right", no_wrap=True)
    for row in pr.iter_rows(named=True):
        table.add_row(str(row["rank"]), str(row["iterations"]), fmt_ns(row["median_iteration_ns"]),
                      *[fmt_share(row[f"{c}_share"]) for c in CLASSES], fmt_bytes(row["comm_bytes_per_iteration"]))
    console.print(table)
    if not job.get("ranks"):
        console.print("no iterations found")
        return
    shares = " · ".join(f"[{CLASS_STYLES[c]}]{CLASS_LABELS[c]} {fmt_share(job[f'{c}_share'])}[/]"
                        for c in CLASSES)
    console.print(f"[bold]job[/]: {shares}")
    w = job["worst_iteration"]
    console.print(f"[bold]worst iteration[/]: #{w['iteration']} took {fmt_ns(w['iteration_ns'])} "
                  f"(slowest: rank {w['slowest_rank']}; median iteration {fmt_ns(job['median_iteration_ns'])})")
    e = job["most_exposed_rank"]
    console.print(f"[bold]most exposed rank[/]: {e['rank']} — {fmt_share(e['exposed_comm_share'])} of its time "
                  "is communication not hidden under compute")
