"""The critical-path, collectives and what-if views of ``tracekit inspect`` and the critical path on the
timeline, driven by Textual's Pilot on the bundled sample (recorded on a 500 Mbit/s link): keys move
through each view, sort, filter, Enter lands on the timeline at the right place, the what-if numbers follow
the inputs (and equal :func:`tracekit.analysis.graph.whatif.predict`'s), a bad line rate is an inline error."""

from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from textual.pilot import Pilot
from textual.widgets import Input, TabbedContent

from tests import tui_scenarios as sc
from tests.test_tui import SIZE, canvas, loaded, text_of
from tracekit.analysis.graph import whatif
from tracekit.analysis.graph.critical_path import runs as path_runs
from tracekit.tui.app import InspectApp
from tracekit.tui.collectives_view import MAX_ROWS, CollectivesView
from tracekit.tui.critical_path_view import CriticalPathView
from tracekit.tui.data import PATH_MARKS, JobData, LoadCallbacks, LoadOptions, load_job
from tracekit.tui.timeline_view import MARK_GLYPHS
from tracekit.tui.views import rank_clock
from tracekit.tui.whatif_view import Inputs, WhatIfView, scenario
from tracekit.views.report import fmt_ns


@pytest.fixture(scope="module")
def data() -> JobData:
    """The sample with ``--link-bw 500mbit`` (the rate it was recorded at)."""
    return sc.sample_data()


@pytest.fixture(scope="module")
def no_rate() -> JobData:
    """The sample without a line rate."""
    return load_job([str(sc.SAMPLE)], LoadOptions(use_cache=False), LoadCallbacks())


def on(app: InspectApp) -> str | None:
    return app.query_one("#views", TabbedContent).active


# ----------------------------------------------------------------------------- critical path


async def test_critical_path_view_lists_the_slowest_iteration_and_enter_shows_a_run(data: JobData) -> None:
    assert data.analysis is not None
    segs = data.analysis.critical_path
    app = sc.app(data)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("4")
        assert on(app) == "critical_path"
        view = app.query_one(CriticalPathView)
        assert app.focused is view.runs_table
        assert view.iterations_table.row_count == 5
        assert view.iteration == 6  # the slowest, as tracekit critical-path shows
        runs6 = path_runs(segs.filter(pl.col("iteration") == 6))
        assert runs6.height == 314  # as tracekit critical-path says
        assert view.runs_table.row_count == 18  # runs of at least 1 %, as the CLI
        assert "314 runs, 18 of at least 1 %" in text_of(app, "#cp-title")
        await pilot.press("m")  # every run
        assert view.runs_table.row_count == 314
        await pilot.press("m", "s")  # 1 % and more, longest first
        assert view._runs is not None
        durs = view._runs.get_column("dur_ns").to_list()
        assert durs == sorted(durs, reverse=True) and len(durs) == 18
        await pilot.press("s")  # back to time order
        # pick another iteration in the upper table
        await pilot.press("shift+tab")
        assert app.focused is view.iterations_table
        await pilot.press("up")
        assert view.iteration == 5
        await pilot.press("enter")  # the iteration's path
        assert app.focused is view.runs_table
        # Enter on the longest run of iteration 5: the timeline, on its rank and lane, at its start
        assert view._runs is not None
        i = int(np.argmax(view._runs.get_column("dur_ns").to_numpy()))
        run = view._runs.row(i, named=True)
        view.runs_table.move_cursor(row=i)
        await pilot.press("enter")
        await pilot.pause()
        assert on(app) == "timeline"
        c = canvas(app)
        assert c.model is not None
        lane = c.model.lanes[c.cursor_lane]
        assert (lane.rank, lane.name) == (run["rank"], run["lane"])
        assert c.cursor_t == run["start_ns"]  # job clock (the sample's offsets are 0; see test_rank_clock)
        assert c.first_cell * c.cell <= run["start_ns"] - c.model.t0
        assert (c.first_cell + c.track_width) * c.cell >= run["end_ns"] - c.model.t0  # the whole run in view


def test_rank_clock_takes_off_the_rank_offset(data: JobData) -> None:
    assert data.analysis is not None
    ranks = data.analysis.ranks
    i = ranks.schema.get_field_index("clock_offset_ns")
    shifted = ranks.set_column(i, ranks.schema.field(i), pa.array([0, 7_000], pa.int64()))
    moved = dataclasses.replace(data, analysis=dataclasses.replace(data.analysis, ranks=shifted))
    assert rank_clock(moved, 1, 10_000) == 3_000 and rank_clock(moved, 0, 10_000) == 10_000


# ----------------------------------------------------------------------------- timeline overlay


async def test_critical_path_on_the_timeline_jumps_and_details(data: JobData) -> None:
    assert data.analysis is not None and data.path_marks is not None
    segs = data.analysis.critical_path.sort("start_ns")
    app = sc.app(data)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("3")
        c = canvas(app)
        assert c.model is not None
        marks = c.marks[PATH_MARKS]
        assert len(marks) == segs.height
        assert "critical path (p/P" in text_of(app, "#timeline-status")
        # p: the first segment that starts after the cursor's cell (at the job's start), on its lane; zoomed
        # in to single nanoseconds, the cursor's cell holds that one segment
        c.set_zoom(0)
        first = segs.filter(pl.col("start_ns") > c.cursor_t + c.cell - 1).row(0, named=True)
        await pilot.press("p")
        lane = c.model.lanes[c.cursor_lane]
        assert c.cursor_t == first["start_ns"] and (lane.rank, lane.name) == (first["rank"], first["lane"])
        details = text_of(app, "#timeline-details")
        assert f"on the critical path of iteration #{first['iteration']}: {first['label']}" in details
        # p walks the path segment by segment, P walks back
        await pilot.press("p", "p")
        second = segs.filter(pl.col("start_ns") > first["start_ns"]).row(1, named=True)
        assert c.cursor_t == second["start_ns"]
        await pilot.press("P")
        assert c.cursor_t < second["start_ns"]
        # the path is drawn over the lane it runs on; u hides it, and jumps still work
        row = c.cursor_lane - c.top_lane + c.HEADER_ROWS
        assert MARK_GLYPHS[PATH_MARKS] in c.render_line(row).text
        await pilot.press("u")
        assert MARK_GLYPHS[PATH_MARKS] not in c.render_line(row).text
        assert "hidden" in text_of(app, "#timeline-status")
        await pilot.press("p")
        assert c.cursor_t >= second["start_ns"]


async def test_details_show_the_instance_on_every_rank(data: JobData) -> None:
    app = sc.app(data)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("3", "c")  # the first communication of rank 0: instance 0 (matched by call order)
        details = text_of(app, "#timeline-details")
        assert "matched instance #0 (order) on 2/2 ranks · skew 3.22 ms" in details
        assert "straggler rank 0" in details
        assert "rank 1 +0 ns→+47.2 ms waited 3.22 ms · rank 0 (here) +3.22 ms→+47.1 ms last" in details


# ----------------------------------------------------------------------------- collectives


async def test_collectives_sort_filter_and_enter(data: JobData) -> None:
    assert data.analysis is not None
    inst = pl.from_arrow(data.analysis.instances)
    assert isinstance(inst, pl.DataFrame)
    app = sc.app(data)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("5")
        assert on(app) == "collectives"
        view = app.query_one(CollectivesView)
        assert app.focused is view.table and view.table.row_count == 40 < MAX_ROWS
        assert "40 collectives · 40 matched across ranks" in text_of(app, "#coll-help")

        def listed(col: str) -> list:
            assert view._rows is not None
            return view._rows.get_column(col).to_list()

        assert listed("first_start_ns") == sorted(listed("first_start_ns"))
        await pilot.press("s")
        assert view.sort == "skew" and listed("skew_ns") == sorted(listed("skew_ns"), reverse=True)
        await pilot.press("s")
        longest_wait = inst.sort("wait_ns", descending=True).get_column("instance")[0]
        assert view.sort == "wait" and listed("instance")[0] == longest_wait
        await pilot.press("S")
        assert listed("wait_ns") == sorted(listed("wait_ns"))
        for name, col in (("transfer", "transfer_ns"), ("bytes", "bytes"), ("busbw", "busbw_gbps"),
                          ("utilisation", "link_utilisation")):
            view.sort_by(name)
            assert listed(col) == sorted(listed(col), reverse=True)
        # filter: / shows and focuses the box, typing filters as it goes, escape clears and hides it
        box = app.query_one("#coll-filter", Input)
        assert not box.display  # hidden, it takes no keys meant for the app
        await pilot.press("slash")
        assert app.focused is box and box.display
        await pilot.press(*"ALLRED")
        assert view.table.row_count == 40
        await pilot.press(*"x")
        assert view.table.row_count == 0 and "filter 'ALLREDx': 0 match" in text_of(app, "#coll-help")
        await pilot.press("backspace", "enter")
        assert view.table.row_count == 40 and app.focused is view.table and box.display  # the filter in sight
        await pilot.press("slash", *"broadcast", "escape")
        assert box.value == "" and view.table.row_count == 40 and app.focused is view.table and not box.display
        # enter: the instance on the timeline, on its straggler's communication lane, cursor at its arrival
        view.sort_by("wait")
        await pilot.pause()
        view.table.move_cursor(row=0)
        r = view._rows.row(0, named=True)  # type: ignore[union-attr]
        await pilot.press("enter")
        await pilot.pause()
        assert on(app) == "timeline"
        c = canvas(app)
        assert c.model is not None
        lane = c.model.lanes[c.cursor_lane]
        member = pl.from_arrow(data.analysis.members).filter(  # type: ignore[union-attr]
            (pl.col("instance") == r["instance"]) & (pl.col("rank") == r["straggler_rank"])).row(0, named=True)
        assert lane.rank == r["straggler_rank"] and lane.kinds == ("comm",)
        assert c.cursor_t == member["start_ns"] == r["last_start_ns"]  # the straggler arrives last
        assert f"matched instance #{r['instance']}" in text_of(app, "#timeline-details")
        assert c.first_cell * c.cell <= r["first_start_ns"] - c.model.t0


# ----------------------------------------------------------------------------- what-if


def test_scenario_from_the_inputs() -> None:
    assert scenario(Inputs(), None) == whatif.Scenario()
    sc_ = scenario(Inputs(rate="10gbit", compression="4", workers="8", efficiency="full"), None)
    assert (sc_.bandwidth_bps, sc_.compression, sc_.workers, sc_.efficiency) == (10e9, 4.0, 8, "full")
    for bad, words in ((Inputs(rate="fast"), "expected a number and a unit"),
                       (Inputs(rate="10gbps"), "ambiguous"),
                       (Inputs(compression="0.5"), "at least 1"),
                       (Inputs(compression="."), "a ratio"),
                       (Inputs(workers="1"), "at least 2"),
                       (Inputs(rate="1gbit"), "--link-bw"),  # measured efficiency, no line rate of the job
                       (Inputs(efficiency="full"), "type a line rate")):
        with pytest.raises(ValueError, match=words):
            scenario(bad, None)
    assert scenario(Inputs(rate="1gbit"), 5e8).bandwidth_bps == 1e9


async def quiet(pilot: Pilot) -> None:
    await sc.quiet(pilot)


async def test_whatif_numbers_follow_the_inputs(data: JobData) -> None:
    assert data.analysis is not None and data.bottleneck is not None
    model = data.analysis.whatif
    app = sc.app(data)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("6")
        assert on(app) == "whatif"
        view = app.query_one(WhatIfView)
        assert app.focused is view
        await quiet(pilot)
        p = view.prediction
        assert p is not None and p.iteration_ns == whatif.predict(model, whatif.Scenario(bandwidth_bps=5e8))
        # about as the job ran (transfers re-costed from bytes over the link's measured speed)
        assert p.iteration_ns == pytest.approx(model.measured_iteration_ns, rel=0.03)
        assert app.query_one("#wi-rate", Input).value == "500Mbit/s"
        assert [r for r, _ in p.sweep] == [2.5e8, 5e8, 1e9, 2e9, 5e9]
        shown = text_of(app, "#wi-prediction")
        assert fmt_ns(p.iteration_ns) in shown and f"{data.bottleneck.free_ns / p.iteration_ns:.2f}" in shown
        assert " ".join(data.verdict.text.split()) in " ".join(text_of(app, "#wi-verdict").split())
        # 4x compression (c focuses the box with its text selected: typing replaces it), as the CLI predicts
        await pilot.press("c", "4", "enter")
        assert app.focused is view
        await quiet(pilot)
        p = view.prediction
        assert p is not None and p.scenario.compression == 4.0
        assert p.iteration_ns == whatif.predict(model, whatif.Scenario(bandwidth_bps=5e8, compression=4))
        assert fmt_ns(p.iteration_ns) in text_of(app, "#wi-prediction")  # as tracekit whatif … --compression 4
        # full utilisation of 1 Gbit/s with 8 workers
        await pilot.press("f", "r", *"1gbit", "tab", "tab", *"8", "enter")
        await quiet(pilot)
        p = view.prediction
        want = whatif.Scenario(bandwidth_bps=1e9, compression=4, workers=8, efficiency="full")
        assert p is not None and p.scenario == want and p.iteration_ns == whatif.predict(model, want)
        assert p.scaling(p.iteration_ns) == pytest.approx(data.bottleneck.free_ns / p.iteration_ns)
        # a line rate it cannot read: said right under the inputs, no prediction
        await pilot.press("r", *"10 gbps")
        await quiet(pilot)
        assert view.error is not None and "ambiguous" in view.error and view.prediction is None
        assert "ambiguous" in text_of(app, "#wi-error")
        await pilot.press("escape", "r", *"10gbit", "escape")  # r selects the text: typing replaces it
        await quiet(pilot)
        assert view.error is None and view.prediction is not None
        assert not app.query_one("#wi-error").display
        assert view.prediction.scenario.bandwidth_bps == 10e9


async def test_whatif_curves_are_the_reports(data: JobData, monkeypatch: pytest.MonkeyPatch) -> None:
    """The what-if tab plots the curves of ``tracekit report`` (:func:`tracekit.views.figures.whatif_curves`), computed
    in a thread worker, never on the UI thread; the plots show their axes and the key names the measured point."""
    import threading

    from textual_plotext import PlotextPlot

    from tracekit.views import figures

    assert data.analysis is not None and data.bottleneck is not None
    real = figures.whatif_curves
    threads: list[bool] = []

    def recorded(*args: object, **kwargs: object) -> figures.Curves:
        threads.append(threading.current_thread() is threading.main_thread())
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(figures, "whatif_curves", recorded)
    app = sc.app(data)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("6")
        view = app.query_one(WhatIfView)
        await quiet(pilot)
        assert threads == [False]  # once, off the UI thread
        want = real(data.analysis.whatif, data.bottleneck)
        assert view.curves is not None
        assert view.curves.by_rate.equals(want.by_rate) and view.curves.by_compression.equals(want.by_compression)
        assert view.curves.measured_scaling == pytest.approx(data.bottleneck.scaling_measured)
        rate = app.query_one("#wi-curve-rate", PlotextPlot).render().plain  # type: ignore[union-attr]
        assert "62.5M" in rate and "1G" in rate and "64G" in rate  # the line-rate axis, log scale
        comp = app.query_one("#wi-curve-compression", PlotextPlot).render().plain  # type: ignore[union-attr]
        assert "1x" in comp and "32x" in comp
        key = str(app.query_one("#wi-curve-rate-box").border_subtitle)
        assert "link as measured" in key and "at full rate" in key
        assert f"now {data.bottleneck.scaling_measured:.2f}" in key
        # the inputs change the prediction, not the curves (they are the job's): nothing is computed again
        await pilot.press("c", "4", "enter")
        await quiet(pilot)
        assert threads == [False]


async def test_whatif_without_a_line_rate(no_rate: JobData) -> None:
    """Without --link-bw the job can be replayed as it ran or at full utilisation of a rate typed in; measured
    efficiency at another rate needs the rate it ran at, which the error says."""
    app = InspectApp([str(sc.SAMPLE)], data=no_rate)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("6")
        view = app.query_one(WhatIfView)
        await quiet(pilot)
        assert view.prediction is not None and not view.prediction.sweep
        assert "needs one" in text_of(app, "#wi-sweep")
        await pilot.press("r", *"1gbit", "enter")
        await quiet(pilot)
        assert view.error is not None and "--link-bw" in view.error
        await pilot.press("f")
        await quiet(pilot)
        assert view.error is None and view.prediction is not None and len(view.prediction.sweep) == 5


async def test_overview_shows_the_whatif_verdict(data: JobData) -> None:
    assert data.bottleneck is not None and data.verdict is not None
    app = sc.app(data)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        verdict = " ".join(text_of(app, "#verdict").split())
        assert data.verdict is not None and verdict.startswith(" ".join(data.verdict.headline.split()))
        for line in data.verdict.support:  # the replays behind it, as the CLI prints them
            assert " ".join(line.split()) in verdict


async def test_overview_names_no_class_before_the_replays(data: JobData) -> None:
    """Until phase 5 the overview shows measurements only (a class from them could contradict the replays), then
    the verdict: the same headline the CLI prints."""
    import dataclasses

    from tracekit.analysis.verdict import KINDS
    from tracekit.tui.overview import OverviewView

    early = dataclasses.replace(data, verdict=None)
    app = sc.app(data)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        view = app.query_one(OverviewView)
        view.show_data(early)
        await pilot.pause()
        text = " ".join(text_of(app, "#verdict").split())
        assert "exposed communication 41.9 %" in text and "the verdict follows" in text
        assert not any(k.capitalize() in text for k in KINDS if k != "none")
        view.show_data(data)
        await pilot.pause()
        assert " ".join(text_of(app, "#verdict").split()).startswith(data.verdict.headline.split(":")[0])


# ----------------------------------------------------------------------------- Horovod tensors


async def test_tensors_view_of_a_horovod_timeline() -> None:
    """A Horovod timeline alone: a Tensors tab (7) as ``tracekit tensors`` lists them, sortable and
    filterable; no critical path or what-if tab (a timeline has no graph to follow)."""
    from textual.widgets import Tab

    from tracekit.tui.tensors_view import TensorsView

    path = str(sc.ROOT / "tests" / "data" / "horovod" / "timeline_gloo_2rank.json.gz")
    data = load_job([path], LoadOptions(use_cache=False), LoadCallbacks())
    assert data.analysis is not None and data.analysis.horovod is not None
    tensors = pl.from_arrow(data.analysis.horovod.tensors)
    assert isinstance(tensors, pl.DataFrame)
    app = InspectApp([path], data=data)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        labels = [str(t.label) for t in app.query_one("#views", TabbedContent).query(Tab)]
        assert labels == ["1 Overview", "3 Timeline", "5 Collectives", "7 Tensors"]
        await pilot.press("7")
        assert on(app) == "tensors"
        view = app.query_one(TensorsView)
        assert app.focused is view.table and view.table.row_count == tensors.height == 27
        assert "27 tensors" in text_of(app, "#tensors-help") and "last to ask" in text_of(app, "#tensors-totals")

        def listed(col: str) -> list:
            assert view._rows is not None
            return view._rows.get_column(col).to_list()

        assert listed("transfer_ns") == sorted(listed("transfer_ns"), reverse=True)  # as tracekit tensors
        await pilot.press("s")
        assert view.sort == "negotiation" and listed("negotiate_ns") == sorted(listed("negotiate_ns"), reverse=True)
        view.sort_by("name")
        assert listed("tensor") == sorted(listed("tensor"))
        await pilot.press("slash", *"fc1")
        want = tensors.filter(pl.col("tensor").str.contains("fc1")).height
        assert 0 < want < 27 and view.table.row_count == want
        await pilot.press("escape")
        assert view.table.row_count == 27 and app.focused is view.table
