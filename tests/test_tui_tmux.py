"""Smoke test of the real thing: ``tracekit inspect samples/ddp-gloo`` in a tmux terminal, read back
from the screen, driven by keys, and quit (skipped where tmux is not installed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TMUX = shutil.which("tmux")
#: a tmux server of our own (its own socket, no user configuration): other sessions cannot resize ours
SOCKET = f"tracekit-test-{uuid.uuid4().hex[:8]}"

def _tmux(*args: str) -> str:
    assert TMUX is not None
    return subprocess.run([TMUX, "-L", SOCKET, "-f", os.devnull, *args], capture_output=True, text=True,
                          check=True).stdout


def _screen(session: str) -> str:
    return _tmux("capture-pane", "-p", "-t", session)


def _wait_for(session: str, text: str, timeout: float = 45.0) -> str:
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        screen = _screen(session)
        if text in screen:
            return screen
        time.sleep(0.2)
    raise AssertionError(f"{text!r} never appeared; the screen was:\n{screen}")


@pytest.fixture
def session(tmp_path: Path) -> Iterator[str]:
    name = f"tracekit-{uuid.uuid4().hex[:8]}"
    tracekit = Path(sys.executable).with_name("tracekit")
    # a moment for tmux to give the pane its size before the app asks for it
    command = f"sleep 0.5; {tracekit} inspect samples/ddp-gloo; echo EXIT=$?; sleep 30"
    env = {"TRACEKIT_CACHE_DIR": str(tmp_path / "cache"), "TERM": "xterm-256color"}
    exports = " ".join(f"{k}={v}" for k, v in env.items())
    _tmux("new-session", "-d", "-s", name, "-x", "160", "-y", "50", "-c", str(ROOT), f"export {exports}; {command}")
    try:
        yield name
    finally:
        subprocess.run([TMUX or "tmux", "-L", SOCKET, "kill-server"], capture_output=True)


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed")
def test_inspect_in_a_real_terminal(session: str) -> None:
    for text in ("Verdict: what sets the pace?", "tracekit inspect", "1 Overview", "Where each rank's time goes",
                 "rank 0", "rank 1", "#6 took 271 ms", "? Keys"):
        _wait_for(session, text)  # the terminal is read while the app may still be drawing
    _wait_for(session, "3 Timeline")  # the timeline tab appears once its analysis is loaded
    _tmux("send-keys", "-t", session, "3")
    screen = _wait_for(session, "cpu/tid 9658")
    assert "/cell" in screen and "Details" in screen
    _tmux("send-keys", "-t", session, "c")
    _wait_for(session, "gloo:all_reduce")
    _wait_for(session, "6 What-if")  # the critical path and the what-if model are computed after the timeline
    _tmux("send-keys", "-t", session, "p")
    _wait_for(session, "on the critical path")
    _tmux("send-keys", "-t", session, "4")
    _wait_for(session, "the critical path, 271 ms")
    _tmux("send-keys", "-t", session, "5")
    _wait_for(session, "40 collectives")
    _tmux("send-keys", "-t", session, "6")
    _wait_for(session, "scaling factor")
    _wait_for(session, "Link-bound")  # the job's verdict, under the what-if
    _tmux("send-keys", "-t", session, "q")
    screen = _wait_for(session, "EXIT=0")
    assert "Traceback" not in screen


def test_inspect_refuses_a_missing_path_before_taking_the_screen() -> None:
    out = subprocess.run([Path(sys.executable).with_name("tracekit"), "inspect", "no/such/dir"],
                         capture_output=True, text=True, cwd=ROOT, env={**os.environ, "TERM": "dumb"})
    assert out.returncode == 1
    assert out.stderr.strip() == "tracekit: no/such/dir: no such file or directory"


def test_inspect_without_a_terminal_says_so() -> None:
    out = subprocess.run([Path(sys.executable).with_name("tracekit"), "inspect", "samples/ddp-gloo"],
                         capture_output=True, text=True, cwd=ROOT, stdin=subprocess.DEVNULL)
    assert out.returncode == 1
    assert "inspect needs a terminal" in out.stderr and "Traceback" not in out.stderr
