"""What both callbacks do, on one process and a plain loop: the window profiled with tracekit.torch's schedule, the
report at the end (or why there is none), a folder reused by an earlier run, a job without communication logged."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration_runs import needs
from tracekit.integrations.profiled_run import ProfiledRun

pytestmark = needs("torch", "tensorboard")


def _train(run: ProfiledRun, steps: int) -> None:
    import torch

    w = torch.randn(64, 64, requires_grad=True)
    for _ in range(steps):
        (torch.randn(32, 64) @ w).square().sum().backward()
        run.step()


@pytest.mark.parametrize(("steps", "what"), [(1, "no trace of rank 0 in"), (2, "no profiled step in the traces in")])
def test_a_run_too_short_says_so(tmp_path: Path, steps: int, what: str) -> None:
    """Stopped while waiting: no trace; while warming up: a trace without a step (in the active steps, torch writes
    the steps recorded so far, and they are analysed)."""
    lines: list[str] = []
    run = ProfiledRun(tmp_path / "t", echo=lines.append)
    run.start(tmp_path)
    _train(run, steps)
    assert run.finish(rank=0, world_size=1) is None
    assert lines == [f"tracekit: {what} {tmp_path / 't'}: profiling needs 5 training steps (wait 1, warmup 1, "
                     f"active 3); this rank made {steps}"]


def test_the_window_is_read_back_printed_and_logged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRACEKIT_RUN_DIR", raising=False)
    lines: list[str] = []
    run = ProfiledRun(echo=lines.append, warmup=0, active=2, log="tensorboard", log_dir=tmp_path / "tb")
    run.start(tmp_path / "output")
    _train(run, 8)
    assert not run.running and run.steps == 3  # stopped once the window was written
    out = tmp_path / "output" / "tracekit-traces"
    (out / "rank1.pt.trace.json.gz").write_bytes((out / "rank0.pt.trace.json.gz").read_bytes())  # an earlier job's
    job = run.finish(rank=0, world_size=1)
    assert job is not None and job.n_ranks == 1 and job.n_iterations == 2
    assert lines[:3] == [f"tracekit: 1 rank · 2 iterations profiled in {out}", f"verdict: {job.verdict.text}",
                         f"look closer: tracekit inspect {out / 'rank0.pt.trace.json.gz'}"]  # not the other trace
    # no communication to re-cost: the trackers get the verdict and the breakdown, and no what-if table
    assert lines[3] == f"tracekit: logged to tensorboard: {tmp_path / 'tb' / 'runs' / 'tracekit-output'}"
    assert list((tmp_path / "tb" / "runs" / "tracekit-output").glob("events.out.tfevents.*"))


def test_a_rank_but_0_reports_nothing(tmp_path: Path) -> None:
    lines: list[str] = []
    waited: list[bool] = []
    run = ProfiledRun(tmp_path, echo=lines.append)
    run.start(tmp_path)
    _train(run, 6)
    assert run.finish(rank=1, world_size=2, barrier=lambda: waited.append(True)) is None
    assert waited == [True] and lines == []
