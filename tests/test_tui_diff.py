"""The Top ops and Diff tabs of ``tracekit inspect`` (driven with Pilot), and the diff loading phase without
Textual: everything shown is computed by tracekit.analysis.top_ops, tracekit.analysis.idle and tracekit.diff."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import TabbedContent

from tests.test_tui import SIZE, app_on, loaded, text_of
from tracekit.cli import main
from tracekit.tui.app import DIFF_PHASE, InspectApp
from tracekit.tui.data import JobData, LoadCallbacks, LoadOptions, load_job
from tracekit.tui.diff_view import DiffView
from tracekit.tui.ops_view import FEW, MANY, OpsView

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = str(ROOT / "samples" / "ddp-gloo")
BASE = str(ROOT / "tests" / "data" / "jobs" / "ddp-bucket1mb")
NEW = str(ROOT / "tests" / "data" / "jobs" / "ddp-bucket4mb")


@pytest.fixture(scope="module")
def sample() -> JobData:
    return load_job([SAMPLE], LoadOptions(use_cache=False), LoadCallbacks())


def test_diff_phase_without_textual() -> None:
    seen: list[str] = []
    data = load_job([BASE], LoadOptions(use_cache=False, diff_paths=(NEW,)),
                    LoadCallbacks(whatif=lambda d: seen.append("whatif"), diff=lambda d: seen.append("diff")))
    assert seen == ["whatif", "diff"] and data.diff_ready and data.diff is not None
    comm = data.diff.job("comm").row(0, named=True)
    assert (comm["base_calls_per_iteration"], comm["new_calls_per_iteration"]) == (8, 2)
    assert data.diff.base == BASE and data.diff.new == NEW
    assert data.diff.base_verdict is not None and data.diff.new_verdict is not None
    # without --diff there is no sixth phase
    plain = load_job([BASE], LoadOptions(use_cache=False), LoadCallbacks(diff=lambda d: seen.append("again")))
    assert plain.diff is None and "again" not in seen


async def test_top_ops_tab(sample: JobData) -> None:
    app = app_on(sample)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        tabs = app.query_one("#views", TabbedContent)
        assert "diff" not in app.views  # only with --diff
        await pilot.press("8")
        assert tabs.active == "ops"
        view = app.query_one(OpsView)
        idle = text_of(app, "#ops-idle")
        assert "why the device waited" in idle and "n/a" in idle  # CPU-only ranks
        top = text_of(app, "#ops-top")
        assert "gloo:all_reduce" in top and "exposed comm" in top and "aten::linear" in top
        assert view.limit == FEW
        await pilot.press("m")
        assert view.limit == MANY and "the 25 ops" in text_of(app, "#ops-help")


async def test_diff_tab() -> None:
    app = InspectApp([BASE], LoadOptions(use_cache=False, diff_paths=(NEW,)))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, DIFF_PHASE, timeout=60)
        assert app.last_phase == DIFF_PHASE and not app.query_one("#statusbar").display
        await pilot.press("9")
        tabs = app.query_one("#views", TabbedContent)
        assert tabs.active == "diff"
        body = text_of(app, "#diff-body")
        assert "8 → 2" in body and "1.05 MB → 4.21 MB" in body
        assert "ops whose time changed most" in body and "critical path" in body
        assert "(base)" in body and "(new)" in body
        view = app.query_one(DiffView)
        await pilot.press("m")
        assert view.limit == 40


def test_inspect_diff_path_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", BASE, "--diff", str(tmp_path / "nope")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope: no such file or directory" in err[0]
