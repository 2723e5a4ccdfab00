"""SVG snapshots of every screen of ``tracekit inspect`` on the bundled sample at a fixed terminal size
(pytest-textual-snapshot). Update after an intended change with ``pytest --snapshot-update`` and look
at the new SVGs before committing them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests import tui_scenarios as sc
from tracekit.tui.data import JobData


@pytest.fixture(scope="module")
def data() -> JobData:
    return sc.sample_data()


@pytest.mark.parametrize("name", list(sc.SCENARIOS))
def test_screen(name: str, data: JobData, snap_compare: Callable[..., Any]) -> None:
    keys, _ = sc.SCENARIOS[name]
    assert snap_compare(sc.app(data), terminal_size=sc.SIZE, run_before=sc.run_scenario(keys))
