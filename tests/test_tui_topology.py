"""The Topology tab of ``tracekit inspect`` (key 0), driven by Textual's Pilot: shown for a job with an NCCL debug
log (an INFO log alone too), absent without one; it displays what the analysis computed — the overview line,
each communicator's link class, the peer connections, the busiest link class and the logs' problems."""

from __future__ import annotations

from pathlib import Path

from textual.widgets import Tab, TabbedContent

from tests import tui_scenarios as sc
from tests.test_nccl_topology import _job
from tests.test_tui import SIZE, loaded, text_of
from tracekit.analysis.nccl.topology import connection_summary
from tracekit.tui.app import InspectApp
from tracekit.tui.data import LoadCallbacks, LoadOptions, load_job
from tracekit.tui.topology_view import TopologyView

DATA = Path(__file__).parent / "data" / "nccl"


def _labels(app: InspectApp) -> list[str]:
    return [str(t.label) for t in app.query_one("#views", TabbedContent).query(Tab)]


async def test_an_info_log_alone_has_a_topology_tab() -> None:
    path = str(DATA / "2.7_info_only_socket_2nodes.log")
    data = load_job([path], LoadOptions(use_cache=False), LoadCallbacks())
    assert data.analysis is not None
    app = InspectApp([path], data=data)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        assert _labels(app) == ["1 Overview", "0 Topology"]
        await pilot.press("0")
        assert app.query_one("#views", TabbedContent).active == "topology"
        view = app.query_one(TopologyView)
        assert app.focused is view.comms_table
        summary = text_of(app, "#topo-summary")
        assert data.analysis.topology_overview["text"] in summary.replace("\n", " ")
        assert "NCCL 2.7.8 · network Socket (eth0)" in summary
        assert view.comms_table.row_count == 1
        assert view.conns_table.row_count == connection_summary(data.analysis.connections).height == 10
        problems = text_of(app, "#topo-problems")
        assert "socket-fallback" in problems and "2.7_info_only_socket_2nodes.log:3" in problems


async def test_a_job_with_its_log_shows_the_busiest_link_class(tmp_path: Path) -> None:
    d = _job(tmp_path / "job")
    data = load_job([str(d)], LoadOptions(use_cache=False), LoadCallbacks())
    assert data.analysis is not None
    app = InspectApp([str(d)], data=data)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        assert _labels(app)[-1] == "0 Topology"
        await pilot.press("0")
        view = app.query_one(TopologyView)
        assert view.comms_table.row_count == 3
        assert "Inter-node NET/IB is" in text_of(app, "#topo-summary")
        assert "none: no WARN line" in text_of(app, "#topo-problems")


async def test_no_topology_tab_without_an_nccl_log() -> None:
    data = sc.sample_data()
    app = sc.app(data)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        assert "0 Topology" not in _labels(app) and not TopologyView.available(data)
