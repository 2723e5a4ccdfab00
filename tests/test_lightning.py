"""PyTorch Lightning, the real library: a 2-process DDP job (torchrun, CPU, gloo) profiled by tracekit's callback —
every rank's trace written where ``tracekit inspect`` finds it, the verdict printed on rank 0, TensorBoard logged —
and the same job's own ``PyTorchProfiler`` folder read with every rank right."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

import tracekit
from tests.integration_runs import needs, steps, torchrun, trace_json, without_distributed_info
from tracekit.loading.traceset import discover

# a real 2-process job: ~40 CPU-s (~60 s on a busy 2-core machine)
pytestmark = [pytest.mark.slow, needs("torch", "lightning", "tensorboard")]


def _run(d: Path) -> tuple[Path, str]:
    d.mkdir()
    done = torchrun("lightning_train.py", ["--out", "out", "--pytorch-profiler", "plprof", "--tracker", "tensorboard",
                                           "--tracker-dir", "tb"], cwd=d)
    return d, done.stdout


def _check_traces_and_verdict(run: tuple[Path, str], job: tracekit.Job) -> None:
    d, stdout = run
    out = d / "out"
    files = sorted(discover([str(out)])[0])
    assert files == [str(out / f"rank{r}.pt.trace.json.gz") for r in (0, 1)]  # what `tracekit inspect out` reads
    for r in (0, 1):
        trace = trace_json(out / f"rank{r}.pt.trace.json.gz")
        assert (trace["distributedInfo"]["rank"], trace["distributedInfo"]["world_size"]) == (r, 2)
        assert trace["distributedInfo"]["backend"] == "gloo"
        assert len(steps(trace)) == 3  # the tracekit.torch schedule: skip 1, warm up 1, record 3
    assert job.ranks.sort("rank").select("rank", "rank_source").rows() == [(0, "distributedInfo"),
                                                                            (1, "distributedInfo")]
    lines = stdout.splitlines()
    assert f"tracekit: 2 ranks · {job.n_iterations} iterations profiled in out" in lines
    assert f"verdict: {job.verdict.text}" in lines  # rank 0 alone prints it, once
    assert "look closer: tracekit inspect out" in lines
    assert sum(line.startswith("verdict: ") for line in lines) == 1


def _check_tensorboard(run: tuple[Path, str], job: tracekit.Job) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    d, stdout = run
    folder = d / "tb" / "runs" / "tracekit-out"
    assert f"tracekit: logged to tensorboard: {Path('tb') / 'runs' / 'tracekit-out'}" in stdout.splitlines()
    ea = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()
    times = {r["iteration"]: r["iteration_ns"] / 1e6 for r in job.summary()["iterations"]}
    assert {e.step: e.value for e in ea.Scalars("tracekit/iteration_ms")} == pytest.approx(times, rel=1e-6)
    assert job.verdict.text in ea.Tensors("tracekit/verdict")[0].tensor_proto.string_val[0].decode()


def _check_pytorch_profiler_folder(run: tuple[Path, str], tmp_path: Path) -> None:
    d, _ = run
    prof = d / "plprof"
    names = sorted(p.name for p in prof.glob("*.pt.trace.json"))
    # as Lightning names them: stage, filename, local rank, action, time; a training and a validation trace per rank
    assert [re.sub(r"\.\d+\.pt", ".NS.pt", n) for n in names] == [
        f"fit-prof-{r}-[Strategy]DDPStrategy.{step}.NS.pt.trace.json" for r in (0, 1)
        for step in ("training_step", "validation_step")]
    job = tracekit.load(prof)
    rows = job.ranks.sort("rank").select("rank", "source_files").rows()
    assert [(r, Path(f[0]).name.split(".")[0]) for r, f in rows] == [
        (r, f"fit-prof-{r}-[Strategy]DDPStrategy") for r in (0, 1)]
    assert all("training_step" in f[0] for _, f in rows)
    assert any("lightning: one profiling window per rank read" in str(n) for n in job.diagnostics)
    # without distributedInfo (a trace recorded outside torch.distributed), the names say the ranks
    bare = tmp_path / "bare"
    for f in prof.glob("*training_step*.json"):
        without_distributed_info(f, bare / f.name)
    shutil.copy(prof / "fit-prof-0.txt", bare)
    job = tracekit.load(bare)
    rows = job.ranks.sort("rank").select("rank", "rank_source", "source_files").rows()
    assert [(r, s, f"fit-prof-{r}-" in f[0]) for r, s, f in rows] == [(0, "file name", True), (1, "file name", True)]


def test_lightning_job(tmp_path: Path) -> None:
    """One real job (xdist would run a module-scoped fixture once per worker), every check on it."""
    run = _run(tmp_path / "job")
    job = tracekit.load(run[0] / "out")
    _check_traces_and_verdict(run, job)
    _check_tensorboard(run, job)
    _check_pytorch_profiler_folder(run, tmp_path)
