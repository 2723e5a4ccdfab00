"""Shared fixtures: the real traces in ../shared/data (skipped when absent) and an isolated cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path:
    """``$TRACEKIT_SHARED_DATA``, else ``../shared/data`` beside the project root."""
    env = os.environ.get("TRACEKIT_SHARED_DATA")
    return Path(env) if env else ROOT.parent / "shared" / "data"


@pytest.fixture
def shared_data() -> Path:
    """The folder of real traces from other projects; the test is skipped when it is absent."""
    d = shared_data_dir()
    if not d.is_dir():
        pytest.skip(f"real traces not available ({d} is absent)")
    return d


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own parse cache, never the user's."""
    d = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(d))
    return d


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules holding a real multi-process job (a ``slow`` test) run first: under pytest-xdist their jobs of up to
    a minute start while the many quick tests keep the other workers busy, rather than one running alone at the end
    of the suite. Each module's tests stay together and in their order (a module-scoped fixture is set up once)."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)  # stable: the order is otherwise the collection's
