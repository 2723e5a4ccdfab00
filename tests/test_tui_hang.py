"""The Hang tab of ``tracekit inspect`` (key ``!``), driven by Textual's Pilot on the recorded gloo dumps of
``tests/data/flight_recorder``: shown for a job with Flight Recorder dumps, next to the overview; every rank's
position in each group with the cause first; an SVG snapshot of the subgroup hang (pytest-textual-snapshot:
``pytest tests/test_tui_hang.py --snapshot-update`` after an intended change)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Tab, TabbedContent

from tests import tui_scenarios as sc
from tests.test_tui import SIZE, loaded, text_of
from tracekit.tui.app import InspectApp
from tracekit.tui.data import JobData, LoadCallbacks, LoadOptions, load_job
from tracekit.tui.hang_view import HangView

DATA = Path(__file__).parent / "data" / "flight_recorder"
CASE = "tests/data/flight_recorder/subgroup-stuck"


def _data(path: Path | str) -> JobData:
    return load_job([str(path)], LoadOptions(use_cache=False), LoadCallbacks())


def _labels(app: InspectApp) -> list[str]:
    return [str(t.label) for t in app.query_one("#views", TabbedContent).query(Tab)]


async def test_the_hang_tab_shows_every_rank_with_the_cause_first() -> None:
    data = _data(DATA / "subgroup-stuck")
    assert data.analysis is not None and data.analysis.hang is not None
    app = InspectApp([CASE], data=data)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        assert _labels(app) == ["1 Overview", "! Hang"]
        await pilot.press("exclamation_mark")
        assert app.query_one("#views", TabbedContent).active == "hang"
        assert data.analysis.hang.headline in text_of(app, "#hang-headline").replace("\n", " ")
        groups = [line.strip() for line in text_of(app, "#hang-groups").splitlines()]
        first = groups.index("pg 1 · #1 … #4")
        assert groups[first + 1].startswith("rank 1  ███✗  never entered #4") and "← cause" in groups[first + 1]
        assert any(line.startswith("pg 0 (default_pg) · #1 … #9 · knock-on") for line in groups)
        why = text_of(app, "#hang-why")
        assert "rank 1's call stack" in why and "record.py:138" in why


async def test_dumps_beside_traces_keep_every_tab() -> None:
    data = _data(DATA / "hang-skip")
    app = InspectApp([str(DATA / "hang-skip")], data=data)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        labels = _labels(app)
        assert labels[:3] == ["1 Overview", "! Hang", "2 Iterations"] and "3 Timeline" in labels
        assert data.verdict is not None and data.verdict.kind == "hung"
        assert text_of(app, "#verdict").startswith("Hung: rank 1 never entered all_reduce #9")


def test_no_dump_no_tab() -> None:
    data = sc.sample_data()
    assert not HangView.available(data)


@pytest.fixture(scope="module")
def data() -> JobData:
    return _data(CASE)


def test_screen(data: JobData, snap_compare: Callable[..., Any]) -> None:
    app = InspectApp([CASE], data=data)
    assert snap_compare(app, terminal_size=sc.SIZE, run_before=sc.run_scenario(("exclamation_mark",)))
