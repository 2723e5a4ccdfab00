"""Traces that are not one job (DESIGN.md "Verdict"): files of different runs in one folder are told apart from the
ranks of one job — different world sizes or process groups, no common collective, disjoint times — said so, every
file kept visible, and no cross-rank verdict given."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from benchmarks import jobgen
from tracekit.api import load
from tracekit.cli import main

DAY_NS = 86_400 * 10**9


def _mixed(tmp_path: Path, *specs_ranks: tuple[jobgen.JobSpec, int]) -> Path:
    """A folder with rank ``r`` of each generated job ``spec``."""
    out = tmp_path / "mixed"
    out.mkdir()
    for i, (spec, r) in enumerate(specs_ranks):
        jobgen.write_job(tmp_path / f"job{i}", spec)
        shutil.copy(tmp_path / f"job{i}" / jobgen.file_name(spec, r), out / f"job{i}-rank{r}.json")
    return out


def test_ranks_of_jobs_of_different_sizes_are_not_one_job(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    small = jobgen.JobSpec(ranks=2, gpus_per_host=2, steps=2, layers=4)
    big = jobgen.JobSpec(ranks=4, gpus_per_host=2, steps=2, layers=4, seed=3, stragglers=((3, 1.5),))
    d = _mixed(tmp_path, (small, 0), (big, 1), (big, 3))
    job = load([str(d)], cache=False)
    assert not job.one_job.one
    assert any("world sizes 2, 4" in r for r in job.one_job.reasons)
    v = job.verdict
    assert v.kind == "none" and v.headline.startswith("These traces are not one job") and not v.answer.stragglers
    assert main(["summary", str(d), "--json", "--no-cache"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["one_job"]["one"] is False and s["answer"]["kind"] == "none" and s["stragglers"] == []


def test_traces_of_disjoint_times_are_not_one_job_and_every_file_stays_visible(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two single-GPU jobs a day apart: "2 ranks" and a verdict across them before; now not one job."""
    a = jobgen.JobSpec(ranks=1, gpus_per_host=1, steps=2, layers=4)
    b = jobgen.JobSpec(ranks=1, gpus_per_host=1, steps=3, layers=6, host_offsets_ns=(DAY_NS,))
    d = _mixed(tmp_path, (a, 0), (b, 0))
    job = load([str(d)], cache=False)
    assert not job.one_job.one and "do not overlap" in job.one_job.reasons[0]
    assert [f[1] for f in job.one_job.files] == [("job0-rank0.json",), ("job1-rank0.json",)]
    assert main(["summary", str(d), "--no-cache"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith("verdict: These traces are not one job")
    assert "job0-rank0.json (2 iterations)" in out and "job1-rank0.json (3 iterations)" in out


def test_one_job_is_one_job(tmp_path: Path) -> None:
    spec = jobgen.JobSpec(ranks=4, gpus_per_host=2, steps=2, layers=4, clock_skew_ns=2_000_000)
    jobgen.write_job(tmp_path / "job", spec)
    job = load([str(tmp_path / "job")], cache=False)
    assert job.one_job.one and job.one_job.reasons == () and job.verdict.kind != "none"
    sample = load([str(Path(__file__).resolve().parents[1] / "samples" / "ddp-gloo")], cache=False)
    assert sample.one_job.one


def test_legacy_single_gpu_traces_of_different_jobs(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """../shared/data/kineto-legacy: four single-GPU traces of different jobs. summary printed "3 ranks" and
    "Straggler-bound: the job waits on rank 3" without a warning; the file with no iterations dropped out."""
    d = shared_data / "kineto-legacy"
    assert main(["summary", str(d), "--no-cache"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "These traces are not one job" in out and "Straggler-bound" not in out
    assert "4 ranks" in out and "1 rank without iterations" in out
    assert "hta_trace_file_list__inference_rank_1.json.gz (0 iterations)" in out
    assert main(["summary", str(d), "--json", "--no-cache"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["one_job"]["one"] is False and s["ranks_without_iterations"] == [1] and s["answer"]["kind"] == "none"
