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
