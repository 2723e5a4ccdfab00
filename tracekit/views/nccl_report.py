"""The NCCL side of ``tracekit summary``: the communicators of NCCL debug logs, the job's topology and the problems the
logs show (a view of :mod:`tracekit.analysis.nccl.topology` and :mod:`tracekit.analysis.nccl.problems`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich import box
from rich.console import Console
from rich.table import Table

from tracekit.views.formats import fmt_bytes, text

if TYPE_CHECKING:
    from tracekit.analysis.pipeline import Analysis


def render_nccl(console: Console, collectives: object, topology: object) -> None:
    """The communicators of NCCL debug logs: size, calls and volume by op, algorithms, transports."""
    from tracekit.views import summary

    ov = summary.nccl_overview(collectives, topology)  # type: ignore[arg-type]
    if ov.height == 0:
        return
    table = Table(title="NCCL communicators (from the debug logs)", title_justify="left", header_style="bold",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    for col, just in (("commId", "left"), ("ranks", "right"), ("ranks logged", "left"), ("calls per rank", "left"),
                      ("bytes/rank", "right"), ("algorithm", "left"), ("protocol", "left"), ("transports", "left")):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for row in ov.iter_rows(named=True):
        logged = row["ranks_logged"]
        shown = ",".join(map(str, logged[:8])) + ("…" if len(logged) > 8 else "")
        table.add_row(text(row["comm_id"] or "–"), str(row["nranks"] or "–"), shown,
                      text(", ".join((row["ops"] or [])[:4])), fmt_bytes(row["bytes_per_rank"]),
                      text(", ".join(row["algorithms"] or []) or "–"), text(", ".join(row["protocols"] or []) or "–"),
                      text(", ".join(row["transports"] or []) or "–"))
    console.print(table)


#: problems of one kind listed in the summary (the rest are counted; --json and export have them all)
MAX_PROBLEMS_SHOWN = 8


def render_topology(console: Console, result: Analysis) -> None:
    """The NCCL topology section: the overview line, versions, network and devices, the communicators with their
    link class and transports, then the problems of the logs with their file and line."""
    o = result.topology_overview
    if o:
        console.print()
        console.print("[bold]NCCL topology[/] (from the debug logs): " + text(o["text"]), soft_wrap=True)
        facts = []
        if o.get("nccl_versions"):
            facts.append("NCCL " + ", ".join(o["nccl_versions"]))
        if o.get("networks"):
            net = "network " + ", ".join(o["networks"])
            if o.get("devices"):
                net += " (" + ", ".join(o["devices"][:6]) + (", …" if len(o["devices"]) > 6 else "") + ")"
            facts.append(net)
        if o.get("plugins"):
            facts.append("net plugin " + ", ".join(o["plugins"]))
        if facts:
            console.print("  " + text(" · ".join(facts)), highlight=False)
        per = o.get("per_communicator") or []
        if per:
            table = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False, caption_justify="left",
                          caption="link: inter = its traffic crosses hosts (the NIC binds), intra = inside one host; "
                                  "– = the logs do not show")
            for col, just in (("commId", "left"), ("ranks", "right"), ("logged", "right"), ("nodes", "right"),
                              ("link", "left"), ("binds on", "left"), ("transports", "left")):
                table.add_column(col, justify=just)  # type: ignore[arg-type]
            for r in per[:16]:
                table.add_row(text(r["comm_id"]), str(r["nranks"] if r["nranks"] is not None else "–"),
                              str(r["members"]), str(r["nnodes"] if r["nnodes"] is not None else "–"),
                              r["link_class"] or "–", text(r["transport"] or "–"), text(r["transports"] or "–"))
            console.print(table)
            if len(per) > 16:
                console.print(f"… and {len(per) - 16} more communicators (export the communicators table)")
    render_problems(console, result.nccl_problems)


def render_problems(console: Console, problems: object) -> None:
    """The NCCL logs' problems (NCCL_PROBLEMS), each as ``file:line: message``, a few per kind."""
    rows = problems.to_pylist() if problems is not None else []  # type: ignore[attr-defined]
    if not rows:
        return
    console.print()
    console.print(f"[bold]problems in the NCCL logs[/] ({len(rows)})")
    shown: dict[str, int] = {}
    for r in rows:
        shown[r["kind"]] = shown.get(r["kind"], 0) + 1
        if shown[r["kind"]] > MAX_PROBLEMS_SHOWN:
            continue
        where = r["path"] + (f":{r['line']}" if r["line"] is not None else "")
        console.print(f"  [yellow]{text(r['kind'])}[/] {text(where)}: {text(r['message'])}", soft_wrap=True,
                      highlight=False)
    for kind, n in shown.items():
        if n > MAX_PROBLEMS_SHOWN:
            console.print(f"  … and {n - MAX_PROBLEMS_SHOWN} more {text(kind)} (--json or export for all)")


# ---------------------------------------------------------------------------------------------------
# Horovod timelines
