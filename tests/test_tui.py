"""``tracekit inspect`` driven by Textual's Pilot on the bundled sample: every view, zoom, pan, jumps,
search, sorting, Enter from the iterations table to the timeline, export, the key map, the command
palette, errors, and the results cache."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from textual import events
from textual.pilot import Pilot
from textual.widgets import DataTable, Static, Tab, TabbedContent

from tracekit.tui.app import LAST_PHASE, InspectApp
from tracekit.tui.data import JobData, LoadCallbacks, LoadOptions, load_job
from tracekit.tui.dialogs import ExportScreen, HelpScreen
from tracekit.tui.iterations import IterationsView
from tracekit.tui.timeline_view import TimelineCanvas, TimelineView, matched_instance
from tracekit.tui.views import View
from tracekit.views.timeline import CLASSES_LANE, cell_ns

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = str(ROOT / "samples" / "ddp-gloo")
SIZE = (160, 50)


@pytest.fixture(scope="module")
def sample() -> JobData:
    """The bundled sample, loaded once (tests of the loading itself load it again)."""
    return load_job([SAMPLE], LoadOptions(use_cache=False), LoadCallbacks())


def app_on(data: JobData) -> InspectApp:
    return InspectApp([SAMPLE], data=data)


async def loaded(pilot: Pilot, phase: str = LAST_PHASE, timeout: float = 30.0) -> None:
    """Wait until the app has displayed ``phase`` (or failed)."""
    app = pilot.app
    assert isinstance(app, InspectApp)
    for _ in range(int(timeout / 0.05)):
        if phase in app.phases or "failed" in app.phases:
            break
        await pilot.pause(0.05)
    await pilot.pause()
    assert phase in app.phases, f"not loaded: {app.phases} {app.error}"


def text_of(app: InspectApp, selector: str) -> str:
    return _plain(app.query_one(selector, Static))


def _plain(widget: Static) -> str:
    """The text a Static shows (rendered, so Rich tables become their cells)."""
    from rich.console import Console

    console = Console(width=200, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(widget.content)
    return console.export_text()


def canvas(app: InspectApp) -> TimelineCanvas:
    return app.query_one(TimelineCanvas)


async def test_every_view(tmp_path: Path) -> None:
    app = InspectApp([SAMPLE])
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        tabs = app.query_one("#views", TabbedContent)
        assert tabs.active == "overview"
        assert "Link-bound: communication costs" in text_of(app, "#verdict")
        assert "rank 1" in text_of(app, "#exposed")  # the most exposed rank
        assert "#6 took 271 ms" in text_of(app, "#worst")
        await pilot.press("2")
        assert tabs.active == "iterations"
        table = app.query_one("#iterations-table", DataTable)
        assert table.row_count == 10 and app.focused is table
        await pilot.press("3")
        assert tabs.active == "timeline"
        c = canvas(app)
        assert app.focused is c and c.model is not None
        assert [ln.label for ln in c.model.lanes][:2] == ["rank 0", "cpu/tid 9658"]
        assert len(c.model.lanes) == 8
        await pilot.press("1")
        assert tabs.active == "overview"
        # every view is a registered View, in key order; the what-if view needs --link-bw for nothing but its
        # measured-efficiency sweeps, so it is there too
        labels = [str(tab.label) for tab in tabs.query(Tab)]
        assert labels == ["1 Overview", "2 Iterations", "3 Timeline", "4 Critical path", "5 Collectives", "6 What-if",
                          "8 Top ops"]
        for key, view in zip("4568", ["critical_path", "collectives", "whatif", "ops"], strict=True):
            await pilot.press(key)
            assert tabs.active == view


async def test_timeline_zoom_pan_and_mouse(sample: JobData) -> None:
    app = app_on(sample)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("3")
        c = canvas(app)
        assert c.model is not None
        fit = c.zoom
        assert cell_ns(fit) * c.track_width >= c.model.span
        await pilot.press("plus")  # a press zooms in ×2: half the time per cell
        assert c.zoom == fit - 4 and cell_ns(c.zoom) * 2 == cell_ns(fit)
        await pilot.press("plus", "i")  # two more: ×4
        assert c.zoom == fit - 12 and cell_ns(c.zoom) * 8 == cell_ns(fit)
        first = c.first_cell
        await pilot.press("right_square_bracket")
        assert c.first_cell == first + c.track_width // 2
        await pilot.press("left_square_bracket")
        assert c.first_cell == first
        assert 0 <= c.cursor_cell - c.first_cell < c.track_width  # the cursor stays in view
        before = c.cursor_cell
        await pilot.press("right", "right", "right")
        assert c.cursor_cell == before + 3
        await pilot.press("down", "down")
        assert c.cursor_lane == 2
        await pilot.press("minus")
        assert c.zoom == fit - 8
        await pilot.press("f")
        assert c.zoom == fit and c.first_cell == 0
        # mouse: wheel zooms around the pointer, click moves the cursor
        x = c.LABEL_WIDTH + 40
        await pilot._post_mouse_events([events.MouseScrollUp], TimelineCanvas, offset=(x, 5))
        assert c.zoom == fit - 1
        await pilot.click(TimelineCanvas, offset=(x, c.HEADER_ROWS + 1))
        assert c.cursor_lane == c.top_lane + 1 and c.cursor_cell == c.first_cell + 40
        # never more cells than the screen has, whatever the zoom
        for _ in range(12):
            await pilot.press("plus")
        assert c.zoom >= 0
        line = c.render_line(c.HEADER_ROWS)
        assert line.cell_length == c.size.width


async def test_jump_to_next_communication_and_details(sample: JobData) -> None:
    app = app_on(sample)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("3")
        c = canvas(app)
        assert c.model is not None
        await pilot.press("c")
        lane = c.model.lanes[c.cursor_lane]
        assert lane.rank == 0 and lane.kinds == ("comm",)
        details = text_of(app, "#timeline-details")
        assert "gloo:all_reduce" in details and "comm" in details
        assert "collective: allreduce" in details
        first = c.cursor_t
        await pilot.press("c")
        assert c.cursor_t > first
        await pilot.press("C")
        assert c.cursor_t == first
        # the main thread: an aten op under the cursor
        await pilot.press("f", "home")
        c.cursor_lane = 1
        await pilot.press("w")  # fit the iteration under the cursor
        await pilot.press("right")
        assert "aten::" in text_of(app, "#timeline-details") or "idle" in text_of(app, "#timeline-details")


async def test_search_and_hits(sample: JobData) -> None:
    app = app_on(sample)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("3", "slash")
        await pilot.press(*"all_reduce", "enter")
        c = canvas(app)
        marks = c.marks["search"]
        assert len(marks) == 80
        assert "80 hits" in text_of(app, "#timeline-status")
        assert app.focused is c
        t = c.cursor_t
        await pilot.press("n")
        assert c.cursor_t >= t
        assert "gloo:all_reduce" in text_of(app, "#timeline-details")
        before = c.cursor_t
        await pilot.press("n", "N")
        assert c.cursor_t == before
        await pilot.press("escape")
        assert "search" not in c.marks


async def test_a_view_key_pressed_while_the_last_view_takes_focus_is_not_undone(sample: JobData) -> None:
    """``4`` then ``5`` typed quickly: the critical path's table takes focus (as ``4`` asks) and Textual
    learns of it only later, when ``5`` has shown the collectives; the app must stay on the collectives."""
    app = app_on(sample)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        tabs = app.query_one("#views", TabbedContent)
        def in_second() -> bool:
            return app.focused is not None and second in {w.id for w in app.focused.ancestors_with_self}  # its pane

        for first, second in [("critical_path", "collectives"), ("iterations", "timeline"), ("whatif", "overview")]:
            app.action_show_view(first)
            app.views[first].focus_main()  # what ``first``'s key does once its tab is painted
            app.action_show_view(second)  # the next key, before the focus has been told about
            for _ in range(60):  # the focus settles when Textual gets to it (a loaded machine: later than 0.1 s)
                await pilot.pause(0.05)
                if in_second():
                    break
            await pilot.pause(0.2)  # and stays: the late focus event of ``first`` must not take it back
            assert tabs.active == second
            assert in_second()


async def test_sort_iterations_and_enter_opens_timeline(sample: JobData) -> None:
    app = app_on(sample)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("2")
        view = app.query_one(IterationsView)
        table = view.table

        def column(key: str) -> list[float]:
            return [table.get_cell_at((i, table.get_column_index(key))).value for i in range(table.row_count)]

        await pilot.press("s", "s")  # iteration → start → wall
        assert view._sorted == ("wall_ns", True)
        walls = column("wall_ns")
        assert walls == sorted(walls, reverse=True) and walls[0] == 271_090_408
        await pilot.press("S")
        assert column("wall_ns") == sorted(walls)
        view.sort_by("exposed_comm_ns")
        exposed = column("exposed_comm_ns")
        assert exposed == sorted(exposed, reverse=True)
        # Enter on the slowest window opens the timeline on its rank, zoomed to it
        view.sort_by("wall_ns")
        await pilot.pause()
        table.move_cursor(row=0)
        rank = table.get_cell_at((0, 0)).value
        start = table.get_cell_at((0, table.get_column_index("start_ns"))).value
        await pilot.press("enter")
        await pilot.pause()
        assert app.query_one("#views", TabbedContent).active == "timeline"
        c = canvas(app)
        assert c.model is not None
        assert c.model.lanes[c.cursor_lane].name == CLASSES_LANE and c.model.lanes[c.cursor_lane].rank == rank
        assert c.cursor_t == start
        assert cell_ns(c.zoom) * c.track_width < c.model.span  # zoomed in on one iteration


async def test_overview_jumps_to_worst_iteration(sample: JobData) -> None:
    app = app_on(sample)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("w")
        await pilot.pause()
        c = canvas(app)
        assert app.query_one("#views", TabbedContent).active == "timeline"
        assert c.model is not None
        assert c.model.iteration_at(0, c.cursor_t) == 6 and c.model.lanes[c.cursor_lane].rank == 0


async def test_export_action_writes_parquet(sample: JobData, tmp_path: Path) -> None:
    out = tmp_path / "out"
    app = app_on(sample)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("e")
        assert isinstance(app.screen, ExportScreen)
        box = app.screen.query_one("#export-path")
        box.value = str(out)  # type: ignore[attr-defined]
        await pilot.press("enter")
        await app.workers.wait_for_complete()
        await pilot.pause()
        names = sorted(p.name for p in out.iterdir())
        assert names == ["breakdown.parquet", "collective_instances.parquet", "collective_members.parquet",
                         "collectives.parquet", "critical_path.parquet", "critical_path_summary.parquet",
                         "events.parquet", "idle_breakdown.parquet", "iterations.parquet", "ranks.parquet",
                         "top_ops.parquet"]
        assert pq.read_table(out / "breakdown.parquet").num_rows == 10
        # again without "overwrite": refused, nothing changed
        before = (out / "events.parquet").stat().st_mtime_ns
        await pilot.press("e")
        app.screen.query_one("#export-path").value = str(out)  # type: ignore[attr-defined]
        await pilot.press("enter")
        await app.workers.wait_for_complete()
        assert (out / "events.parquet").stat().st_mtime_ns == before


async def test_chrome_export_from_the_palette_command(sample: JobData, tmp_path: Path) -> None:
    app = app_on(sample)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert {"Show Overview", "Show Iterations", "Show Timeline", "Export tables to Parquet",
                "Export a Chrome trace", "Search the timeline", "Keys"} <= set(titles)
        command = next(c for c in app.get_system_commands(app.screen) if c.title == "Export a Chrome trace")
        command.callback()
        await pilot.pause()
        app.screen.query_one("#export-path").value = str(tmp_path / "merged.json")  # type: ignore[attr-defined]
        await pilot.press("enter")
        await app.workers.wait_for_complete()
        assert (tmp_path / "merged.json").stat().st_size > 0


async def test_key_map_and_command_palette(sample: JobData) -> None:
    app = app_on(sample)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        shown = "".join(_plain(w) for w in app.screen.query(".help-column").results(Static))
        for words in ("Zoom in", "Next comm", "Search", "Sort by next column", "Export", "drag"):
            assert words in shown
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("ctrl+p")
        await pilot.pause()
        assert app.screen.__class__.__name__ == "CommandPalette"
        await pilot.press("escape")


async def test_bad_input_is_one_clear_message(tmp_path: Path) -> None:
    bad = tmp_path / "rank0.pt.trace.json"
    bad.write_text('{"traceEvents": [')  # a trace cut before its first event
    app = InspectApp([str(bad)])
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, phase="failed")
        assert app.error is not None and "rank0.pt.trace.json" in app.error
        assert "Traceback" not in app.error
        assert "tracekit:" in str(app.query_one("#loading-what").render())
        await pilot.press("q")
    assert app.return_code == 1


async def test_a_step_of_unknown_progress_shows_its_seconds_not_an_animation(tmp_path: Path) -> None:
    """Loading steps whose progress is not known say how long they have taken (once a second), with no animated bar
    drawing frames beside the analysis; a step with a fraction shows its bar."""
    bad = tmp_path / "rank0.pt.trace.json"
    bad.write_text('{"traceEvents": [')
    app = InspectApp([str(bad)])
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, phase="failed")
        assert app._busy is None  # the failure's message stays
        app.query_one("#loading").display = True
        app._progress("following the critical path", None)
        bar = app.query_one("#loading-bar")
        assert not bar.display
        label, what, since = app._busy
        app._busy = (label, what, since - 3.2)  # 3 s later
        app._tick()
        assert str(label.render()) == "following the critical path · 3 s"
        app._progress("following the critical path", None)  # the same step again: its clock goes on
        assert app._busy[2] == since - 3.2
        app._progress("reading", 0.5)
        assert bar.display and app._busy is None
        await pilot.press("q")


async def test_app_on_preloaded_data() -> None:
    data = load_job([SAMPLE], LoadOptions(), LoadCallbacks())
    data.timeline = None  # the app builds it in the background
    app = InspectApp(data=data)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        assert canvas(app).model is not None


def test_phases_and_results_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    cb = LoadCallbacks(progress=lambda what, frac: seen.append("progress"),
                       summary=lambda d: seen.append("summary"), analysis=lambda d: seen.append("analysis"),
                       timeline=lambda d: seen.append("timeline"), critical_path=lambda d: seen.append("critical_path"),
                       whatif=lambda d: seen.append("whatif"))
    opts = LoadOptions(cache_dir=str(tmp_path / "cache"))
    cold = load_job([SAMPLE], opts, cb)
    phases = [s for s in seen if s != "progress"]
    assert phases == ["summary", "analysis", "timeline", "critical_path", "whatif"] and "progress" in seen
    assert not cold.from_cache
    from tracekit.analysis.graph import dag

    builds: list[int] = []
    build = dag.build
    monkeypatch.setattr(dag, "build", lambda *a, **k: builds.append(1) or build(*a, **k))
    warm = load_job([SAMPLE], opts, LoadCallbacks())
    assert warm.from_cache
    # the critical path and the graph the cold load computed are reused: nothing is built again
    assert builds == []
    assert warm.analysis is not None and cold.analysis is not None
    assert warm.analysis.critical_path.equals(cold.analysis.critical_path)
    assert warm.path_marks is not None and cold.path_marks is not None
    # the what-if verdict is not cached: the warm load computes it too, after the first screen
    assert warm.bottleneck is not None and cold.bottleneck is not None and warm.bottleneck.text == cold.bottleneck.text
    assert warm.breakdown.equals(cold.breakdown) and warm.iterations.equals(cold.iterations)
    assert warm.analysis is not None and cold.analysis is not None
    assert warm.analysis.events.column("iteration").equals(cold.analysis.events.column("iteration"))
    assert warm.timeline is not None and cold.timeline is not None
    assert all(np.array_equal(a.levels[0], b.levels[0])
               for a, b in zip(warm.timeline.lanes, cold.timeline.lanes, strict=True))
    no_cache = load_job([SAMPLE], LoadOptions(use_cache=False), LoadCallbacks())
    assert not no_cache.from_cache


def test_views_appear_only_with_their_tables() -> None:
    data = load_job([SAMPLE], LoadOptions(use_cache=False), LoadCallbacks())

    class NeedsSomething(View):
        REQUIRES = ("something_not_computed",)

    assert not NeedsSomething.available(data)
    assert data.analysis is not None
    tables = data.analysis.tables()
    data.analysis.tables = lambda **_: {**tables, "something_not_computed": pa.table({"pg": ["0"]})}  # type: ignore[method-assign]
    data = JobData.from_analysis(data.analysis)
    assert NeedsSomething.available(data)
    assert TimelineView.available(data)


def test_the_graph_is_built_in_the_loading_worker_not_when_views_ask(monkeypatch: pytest.MonkeyPatch) -> None:
    """Until phase 4 has computed the critical path, asking which views can show (the UI thread does, at
    every phase) never builds the job's dependency graph; from phase 4 on the tables are listed. (The
    background thread that computes phases 4 and 5 from the overview on is left out here: it builds the graph
    early on purpose, see the next test.)"""
    from tracekit.analysis.pipeline import Analysis
    from tracekit.tui.critical_path_view import CriticalPathView
    from tracekit.tui.whatif_view import WhatIfView

    monkeypatch.setattr(Analysis, "start", lambda self, *names: None)
    seen: dict[str, tuple[bool, bool, bool, bool]] = {}

    def look(phase: str) -> Callable[[JobData], None]:
        def at(data: JobData) -> None:
            assert data.analysis is not None
            views = (CriticalPathView.available(data), WhatIfView.available(data))
            seen[phase] = (*views, "graph" in vars(data.analysis), data.bottleneck is not None)
        return at

    load_job([SAMPLE], LoadOptions(use_cache=False), LoadCallbacks(
        analysis=look("analysis"), timeline=look("timeline"), critical_path=look("critical_path"),
        whatif=look("whatif")))
    assert seen == {"analysis": (False, False, False, False), "timeline": (False, False, False, False),
                    "critical_path": (True, False, True, False), "whatif": (True, True, True, True)}


def test_the_first_paint_never_computes_the_top_ops() -> None:
    """At the overview (the first paint), listing the tables — which the UI thread does to pick the views — does
    not compute the top ops and idle split (seconds on a big job, on the UI thread); the loading worker computes
    them next and the analysis phase lists them."""
    seen: dict[str, tuple[bool, bool]] = {}

    def look(phase: str) -> Callable[[JobData], None]:
        def at(data: JobData) -> None:
            assert data.analysis is not None
            seen[phase] = ("top_ops" in data.tables(), "top_ops" in vars(data.analysis))
        return at

    load_job([SAMPLE], LoadOptions(use_cache=False), LoadCallbacks(summary=look("summary"),
                                                                   analysis=look("analysis")))
    assert seen == {"summary": (False, False), "analysis": (True, True)}


def test_critical_path_and_whatif_are_computed_beside_the_top_ops_and_timeline() -> None:
    """From the overview on, a thread of its own computes the critical path and the what-if while the loading
    worker computes the top ops and the timeline; phases 4 and 5 wait for it and show the same results as a
    load without it."""
    import threading

    from tracekit.analysis.graph import critical_path

    threads: set[str] = set()
    paths = critical_path.paths

    def spy(*args: object, **kw: object) -> object:
        threads.add(threading.current_thread().name)
        return paths(*args, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(critical_path, "paths", spy)
        data = load_job([SAMPLE], LoadOptions(use_cache=False), LoadCallbacks())
    assert threads and all(t.startswith("tracekit-analysis") for t in threads)
    assert data.paths_ready and data.whatif_ready and data.background is not None
    with pytest.MonkeyPatch.context() as mp:
        from tracekit.analysis.pipeline import Analysis

        mp.setattr(Analysis, "start", lambda self, *names: None)
        alone = load_job([SAMPLE], LoadOptions(use_cache=False), LoadCallbacks())
    assert data.analysis is not None and alone.analysis is not None
    assert data.analysis.critical_path.equals(alone.analysis.critical_path)
    assert data.bottleneck == alone.bottleneck


def test_matched_instance_details() -> None:
    """The details panel finds an event's instance through ``collective_members`` (rank, collective_id),
    whatever the matching went by, and lists the members relative to the first arrival."""
    instances = pa.table({"instance": [0, 1], "pg": ["0", "0"], "seq": [None, None], "matched_by": ["order"] * 2,
                          "op": ["allreduce"] * 2, "bytes": [8, 8], "nranks": [2, 2], "ranks": [[0, 1], [0, 1]],
                          "partial": [False, False], "consistent": [True, True], "sizes_agree": [True, False],
                          "skew_ns": [1_500, 2_000_000], "transfer_ns": [10, 20], "straggler_rank": [1, 0]})
    members = pa.table({"instance": [0, 0, 1, 1], "rank": pa.array([0, 1, 0, 1], pa.int32()),
                        "collective_id": [0, 0, 1, 1], "start_ns": [100, 1_600, 7_000_000, 5_000_000],
                        "end_ns": [1_610, 1_610, 7_000_020, 7_000_020], "wait_ns": [1_500, 0, 0, 2_000_000],
                        "straggler": [False, True, True, False]})
    text = str(matched_instance(members, instances, 1, 1))
    assert "matched instance #1 (order) on 2/2 ranks" in text and "skew 2 ms" in text
    assert "straggler rank 0" in text and "sizes differ" in text
    # rank 1 arrived first and waited for rank 0
    assert "rank 1 (here) +0 ns→+2 ms waited 2 ms · rank 0 +2 ms→+2 ms last" in text
    assert str(matched_instance(members, instances, 1, 9)) == ""


def test_no_textual_import_outside_the_tui() -> None:
    import subprocess
    import sys

    code = ("import sys, tracekit.cli, tracekit.views.timeline, tracekit.views.chrome, tracekit.results_cache; "
            "print('textual' in sys.modules or 'tracekit.tui' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"



def test_key_map_columns_are_as_even_as_the_sections_allow() -> None:
    from tracekit.tui.dialogs import split_columns

    assert split_columns([6, 3, 4, 4, 29, 4, 6, 7, 6, 7], 3) == [4, 1, 5]  # the long timeline alone in the middle
    assert split_columns([5, 5], 3) == [1, 1]
    assert split_columns([1, 1, 1, 1], 2) == [2, 2]
