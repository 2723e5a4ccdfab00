"""What a newcomer tripped over (issue 39): counts printed as "1 ranks", diff's "ranks 1" header, and in
``tracekit inspect`` the key list without Enter, a cell outside every iteration window with class shares, the Top
ops' overlapped shares adding up to twice the class, and an Inputs card that counted the warnings short and showed
one. The app is driven by Textual's Pilot on the bundled sample (tests/test_tui.py)."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest
from rich.console import Console

import tracekit
from tests import kineto_traces as kt
from tests.test_tui import SAMPLE, SIZE, app_on, loaded, text_of
from tracekit.analysis import top_ops
from tracekit.cli import main
from tracekit.model.diagnostics import Diagnostic
from tracekit.model.units import count
from tracekit.tui.data import JobData, LoadCallbacks, LoadOptions, load_job
from tracekit.tui.dialogs import HelpScreen
from tracekit.tui.overview import SHOWN_WARNINGS, OverviewView
from tracekit.tui.timeline_canvas import ZOOM_KEY_STEPS, TimelineCanvas
from tracekit.views.report import top_ops_table
from tracekit.views.timeline import cell_ns


@pytest.fixture(scope="module")
def sample() -> JobData:
    return load_job([SAMPLE], LoadOptions(use_cache=False), LoadCallbacks())


def test_count() -> None:
    assert [count(n, "rank") for n in (0, 1, 2)] == ["0 ranks", "1 rank", "2 ranks"]
    assert count(1024, "event", grouped=True) == "1,024 events" and count(3, "process", "processes") == "3 processes"


def test_one_rank_is_one_rank(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A job of one rank says "1 rank" (summary, the Job's repr), and diff's header counts each run's ranks."""
    one = kt.write_gpu_job(tmp_path / "one", [0])
    three = kt.write_gpu_job(tmp_path / "three", [0, 0, 0])
    assert main(["summary", str(one), "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert "1 rank ·" in out and "1 ranks" not in out
    job = tracekit.load(one, cache=False)
    assert ": 1 rank · 3 iterations" in repr(job)
    assert main(["diff", str(three), str(one), "--no-cache", "--no-verdict"]) == 0
    head = " ".join(capsys.readouterr().out.split("\n\n")[0].split())  # the header, however it wrapped
    assert head.endswith("(new) · 3 ranks → 1 rank"), head
    assert main(["diff", str(one), str(one), "--no-cache", "--no-verdict"]) == 0
    assert " ".join(capsys.readouterr().out.split("\n\n")[0].split()).endswith("(new) · 1 rank each")


async def test_the_key_list_has_enter_where_a_table_takes_it(sample: JobData) -> None:
    app = app_on(sample)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("question_mark")
        screen = app.screen
        assert isinstance(screen, HelpScreen)
        keys = {title: {(b.key, b.description) for b in items} for title, items in screen.sections}
        assert ("enter", "Show the window on the timeline") in keys["Iterations"]
        assert ("enter", "Show the run on the timeline") in keys["Critical path"]
        assert ("enter", "Show the instance on the timeline") in keys["Collectives"]


async def test_a_zoom_key_doubles(sample: JobData) -> None:
    """One + halves the time per cell (it took two: a press was half of a doubling)."""
    app = app_on(sample)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("3")
        c = app.query_one(TimelineCanvas)
        fit = c.zoom
        await pilot.press("plus")
        assert cell_ns(c.zoom) * 2 == cell_ns(fit) and ZOOM_KEY_STEPS == 4
        await pilot.press("plus")
        assert cell_ns(c.zoom) * 4 == cell_ns(fit)
        await pilot.press("minus", "minus")
        assert c.zoom == fit


async def test_a_cell_outside_every_window_has_no_class_shares(sample: JobData) -> None:
    """The first cell of the fitted timeline begins before rank 0's first window and ends inside it: it belongs to
    that iteration, and its shares are of the part inside; finer, a cell before the window has no shares at all."""
    app = app_on(sample)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("3")
        c = app.query_one(TimelineCanvas)
        model = c.model
        assert model is not None
        first = int(model.iterations[0][1][0])  # rank 0's first window, job clock
        assert model.t0 < first < model.t0 + c.cell  # the fitted view's first cell straddles it
        c.cursor_lane = 0
        c._set_cursor_cell(0)
        c._changed()
        await pilot.pause()
        text = text_of(app, "#timeline-details")
        assert "outside the iteration windows" not in text and "iteration #2" in text
        assert re.search(r"\d+ % of it in iteration windows", text) and "compute " in text
        while model.t0 + c.cell > first:  # zoom in until the first cell ends before the window
            await pilot.press("plus")
        c._set_cursor_cell(0)
        c._changed()
        await pilot.pause()
        text = text_of(app, "#timeline-details")
        assert "outside the iteration windows" in text and "%" not in text, text


def test_overlapped_ops_are_listed_by_side(sample: JobData) -> None:
    """In the overlapped class compute and communication each cover the whole class (the class's shares add up to
    twice it); listed side by side, each side adds up to the class at most."""
    a = sample.analysis
    assert a is not None
    top = top_ops.job_level(a.top_ops, a.breakdown, None)
    over = top.filter(pl.col("class") == "overlapped")
    assert over.get_column("class_share").sum() > 1.5  # both sides
    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(top_ops_table(top, limit=100))
    text = console.export_text()
    sections: dict[str, float] = {}
    current = ""
    for line in text.splitlines():
        m = re.match(r" ?(\S.*?)?\s+(\d+)\s{2,}(cpu_op|comm|compute|memory)\s.*?([\d.]+) %\s*$", line)
        if not m:
            continue
        current = m.group(1).strip() if m.group(1) else current
        sections[current] = sections.get(current, 0.0) + float(m.group(4))
    assert {"overlapped (compute)", "overlapped (communication)"} <= set(sections), sections
    assert all(v <= 100.5 for v in sections.values()), sections


def test_the_inputs_card_lists_every_warning(sample: JobData) -> None:
    """It counts what the command line prints (the inputs' and the analysis' warnings) and lists them, the file by
    its name, up to SHOWN_WARNINGS."""
    a = sample.analysis
    assert a is not None
    mine = [Diagnostic(f"/some/dir/rank{r}.json", f"damage {r}") for r in range(SHOWN_WARNINGS + 2)]
    a.diagnostics.extend(mine)
    try:
        data = JobData.from_analysis(a)
        assert data.warnings[-len(mine):] == mine  # the analysis' warnings, not only the traces'
        text = OverviewView._inputs(data).plain
    finally:
        del a.diagnostics[-len(mine):]
    n = len(data.warnings)
    assert f"{n} warnings:" in text
    assert "• rank0.json: damage 0" in text and "/some/dir" not in text
    assert text.count("\n• ") == SHOWN_WARNINGS and f"… and {n - SHOWN_WARNINGS} more" in text
    one = JobData.from_analysis(a)
    one.diagnostics = [Diagnostic("x.json", "cut")]
    assert "1 warning:\n• x.json: cut" in OverviewView._inputs(one).plain


async def test_the_inputs_card_counts_as_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Traces without the profiler's end marker (nor its traceName): one warning per file, in the card as on the
    command line."""
    job = kt.write_gpu_job(tmp_path / "job", [0, 0])
    for f in job.glob("*.json"):
        f.write_text(f.read_text().replace("Record Window End", "Record Window Cut").replace('"traceName"', '"x"'))
    assert main(["summary", str(job), "--no-cache"]) == 0
    cli = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert cli
    data = load_job([str(job)], LoadOptions(use_cache=False), LoadCallbacks())
    app = app_on(data)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        text = text_of(app, "#inputs")
    assert f"{count(len(cli), 'warning')}:" in text and text.count("• ") == len(cli)
