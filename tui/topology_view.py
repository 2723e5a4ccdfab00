"""Topology: what the job's NCCL debug logs say about it, as ``tracekit summary`` prints it — nodes × GPUs and the
transports inside and across nodes (:func:`tracekit.analysis.nccl.topology.overview`), NCCL versions, networks
and devices, each communicator's link class and the transport that binds it, each peer connection once per
transport (rank → peer, hosts, channels), how busy each link class was (with the job's traces), and the problems
of the logs with their file and line.

Shown only when the job has an NCCL debug log. Computes nothing: every figure comes from the analysis.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static

from tracekit.tui.data import JobData
from tracekit.tui.views import View

#: connections listed (a big job has ranks × peers × transports of them; export has all)
MAX_CONNECTIONS = 500


class TopologyView(View):
    """The tenth tab (jobs with an NCCL debug log)."""

    VIEW_ID = "topology"
    TITLE = "Topology"
    KEY = "0"
    REQUIRES = ()  # any NCCL log: see available()
    can_focus = True

    def __init__(self, data: JobData | None = None, **kwargs: Any) -> None:
        super().__init__(data, **kwargs)
        self._shown: int | None = None

    @classmethod
    def available(cls, data: JobData) -> bool:
        """An NCCL debug log is among the inputs (its communicators, connections or problems have rows)."""
        tables = data.tables()
        return any(name in tables and tables[name].num_rows > 0
                   for name in ("communicators", "topology", "nccl_problems"))

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(id="topo-summary", classes="card")
            yield DataTable(id="topo-comms", cursor_type="row", zebra_stripes=True)
            yield DataTable(id="topo-conns", cursor_type="row", zebra_stripes=True)
            yield Static(id="topo-problems", classes="card")

    def on_mount(self) -> None:  # View.on_mount then shows the data
        self.query_one("#topo-summary", Static).border_title = "NCCL topology (from the debug logs)"
        self.query_one("#topo-problems", Static).border_title = "Problems in the NCCL logs"

    @property
    def comms_table(self) -> DataTable[Any]:
        return self.query_one("#topo-comms", DataTable)

    @property
    def conns_table(self) -> DataTable[Any]:
        return self.query_one("#topo-conns", DataTable)

    def focus_main(self) -> None:
        self.comms_table.focus()

    def show_data(self, data: JobData) -> None:
        from tracekit.analysis.link_classes import sentence
        from tracekit.analysis.nccl.topology import connection_summary

        a = data.analysis
        if a is None or self._shown == id(a):
            return
        self._shown = id(a)
        o = a.topology_overview
        head = Text()
        head.append(o.get("text") or "no communicator or connection in the logs", style="bold")
        facts = []
        if o.get("nccl_versions"):
            facts.append("NCCL " + ", ".join(o["nccl_versions"]))
        if o.get("networks"):
            facts.append("network " + ", ".join(o["networks"]) + (f" ({', '.join(o['devices'])})"
                                                                  if o.get("devices") else ""))
        if o.get("plugins"):
            facts.append("net plugin " + ", ".join(o["plugins"]))
        if o.get("hosts"):
            facts.append(f"hosts {', '.join(o['hosts'][:8])}" + (" …" if len(o["hosts"]) > 8 else ""))
        if facts:
            head.append("\n" + " · ".join(facts))
        busy = sentence(a.link_busy.to_pylist()) if a.breakdown.num_rows else None
        if busy:
            head.append(f"\n{busy} (transfer time over their ranks' iteration time)")
        self.query_one("#topo-summary", Static).update(head)

        comms = self.comms_table
        comms.clear(columns=True)
        for label in ("commId", "ranks", "logged", "nodes", "link", "binds on", "transports"):
            comms.add_column(label, key=label)
        for r in o.get("per_communicator") or []:
            comms.add_row(r["comm_id"], _n(r["nranks"]), _n(r["members"]), _n(r["nnodes"]), r["link_class"] or "–",
                          r["transport"] or "–", r["transports"] or "–")
        comms.border_title = f"{comms.row_count} communicators (link: inter = crosses hosts, intra = inside one)"

        conns = self.conns_table
        conns.clear(columns=True)
        for label in ("commId", "rank", "peer", "host", "peer host", "link", "transport", "channels"):
            conns.add_column(label, key=label)
        summary = connection_summary(a.connections)
        for r in summary.head(MAX_CONNECTIONS).iter_rows(named=True):
            conns.add_row(r["comm_id"] or "?", _n(r["rank"]), _n(r["peer"]), r["host"] or "–", r["peer_host"] or "–",
                          r["link_class"] or "–", r["detail"] or "–", _n(r["channels"]))
        more = f" (the first {MAX_CONNECTIONS}; export has all)" if summary.height > MAX_CONNECTIONS else ""
        conns.border_title = f"{summary.height} peer connections{more}"

        problems = a.nccl_problems.to_pylist()
        text = Text()
        for p in problems:
            where = p["path"] + (f":{p['line']}" if p["line"] is not None else "")
            text.append(f"{p['kind']} ", style="yellow")
            text.append(f"{where}: {p['message']}\n")
        if not problems:
            text.append("none: no WARN line, socket fallback, GPU Direct RDMA off, NCCL version mismatch or watchdog "
                        "timeout")
        self.query_one("#topo-problems", Static).update(text)


def _n(value: Any) -> str:
    return "–" if value is None else str(value)

