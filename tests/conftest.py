"""Shared fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real traces in ``../shared/data`` beside the repository (``$TRACEKIT_SHARED_DATA`` wins).

    They belong to other projects and are never copied into this repository, so tests using them skip
    when the folder is absent (a user's clone has no ``../shared``).
    """
    env = os.environ.get("TRACEKIT_SHARED_DATA")
    root = Path(env) if env else Path(__file__).resolve().parents[1].parent / "shared" / "data"
    if not root.is_dir():
        pytest.skip(f"shared data not found at {root} (set TRACEKIT_SHARED_DATA)")
    return root
