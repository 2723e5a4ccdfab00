"""Hugging Face, the real libraries: ``transformers.Trainer`` with tracekit's callback on a 2-process job (torchrun,
CPU, gloo, a 1-layer GPT-2 from a config, no downloads) — every rank's trace in ``<output_dir>/tracekit-traces``, the
verdict printed on rank 0, W&B logged offline — and Accelerate's ``ProfileKwargs`` folder read with every rank
right."""

from __future__ import annotations

from pathlib import Path

import pytest

import tracekit
from tests import wandb_records
from tests.integration_runs import needs, steps, torchrun, trace_json, without_distributed_info

# a real 2-process job: ~50 CPU-s (~75 s on a busy 2-core machine)
pytestmark = [pytest.mark.slow, needs("torch", "transformers", "accelerate", "wandb")]


def _run(d: Path) -> tuple[Path, str]:
    d.mkdir()
    done = torchrun("huggingface_train.py", ["--output-dir", "hf", "--accelerate-profile", "acc", "--tracker",
                                             "wandb", "--tracker-dir", "wb"], cwd=d)
    return d, done.stdout


def _check_traces_and_verdict(run: tuple[Path, str], job: tracekit.Job) -> None:
    d, stdout = run
    out = d / "hf" / "tracekit-traces"  # the default: under the Trainer's output_dir
    for r in (0, 1):
        trace = trace_json(out / f"rank{r}.pt.trace.json.gz")
        assert (trace["distributedInfo"]["rank"], trace["distributedInfo"]["backend"]) == (r, "gloo")
        assert len(steps(trace)) == 3
    assert job.ranks.sort("rank")["rank"].to_list() == [0, 1]
    assert job.collective_instances.height > 0  # DDP's gradient all-reduces, matched across the ranks
    lines = stdout.splitlines()
    assert f"verdict: {job.verdict.text}" in lines
    assert f"look closer: tracekit inspect {Path('hf') / 'tracekit-traces'}" in lines
    assert sum(line.startswith("verdict: ") for line in lines) == 1


def _check_wandb(run: tuple[Path, str], job: tracekit.Job) -> None:
    d, stdout = run
    [run_file] = (d / "wb").glob("wandb/offline-run-*/run-*.wandb")
    assert any(line.startswith("tracekit: logged to wandb: run tracekit-hf") for line in
               stdout.splitlines())
    summary, history = wandb_records.summary_and_history(run_file)
    assert summary["tracekit/verdict"] == job.verdict.kind and summary["tracekit/ranks"] == 2
    times = {r["iteration"]: r["iteration_ns"] / 1e6 for r in job.summary()["iterations"]}
    got = {h["tracekit/iteration"]: h["tracekit/iteration_ms"] for h in history if "tracekit/iteration_ms" in h}
    assert got == pytest.approx(times)


def _check_accelerate_folder(run: tuple[Path, str], tmp_path: Path) -> None:
    d, _ = run
    acc = d / "acc"
    assert sorted(p.name for p in acc.iterdir()) == ["profile_0.json", "profile_1.json"]  # as Accelerate names them
    job = tracekit.load(acc)
    rows = job.ranks.sort("rank").select("rank", "rank_source", "source_files").rows()
    assert [(r, s, Path(f[0]).name) for r, s, f in rows] == [
        (r, "distributedInfo", f"profile_{r}.json") for r in (0, 1)]
    assert job.n_iterations == 3  # ProfileKwargs' schedule: skip 1, warm up 1, record 3
    # given in the other order and without distributedInfo, the process index in the name gives the rank
    bare = [without_distributed_info(acc / f"profile_{r}.json", tmp_path / "bare" / f"profile_{r}.json")
            for r in (1, 0)]
    job = tracekit.load(bare)
    rows = job.ranks.sort("rank").select("rank", "rank_source", "source_files").rows()
    assert [(r, s, Path(f[0]).name) for r, s, f in rows] == [(r, "file name", f"profile_{r}.json") for r in (0, 1)]


def test_huggingface_job(tmp_path: Path) -> None:
    """One real job (xdist would run a module-scoped fixture once per worker), every check on it."""
    run = _run(tmp_path / "job")
    job = tracekit.load(run[0] / "hf" / "tracekit-traces")
    _check_traces_and_verdict(run, job)
    _check_wandb(run, job)
    _check_accelerate_folder(run, tmp_path)
