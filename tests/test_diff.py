"""tracekit diff / tracekit.diff (tracekit/diff.py): two recorded runs with different DDP bucket sizes, a run
against itself, runs of different sizes, the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tests import kineto_traces as kt
from tracekit.cli import main
from tracekit.diff import BREAKDOWN_ROWS, Diff

ROOT = Path(__file__).resolve().parents[1]
JOBS = ROOT / "tests" / "data" / "jobs"
BASE, NEW = JOBS / "ddp-bucket1mb", JOBS / "ddp-bucket4mb"


def _buckets(run: Path) -> list[int]:
    return [int(x) for x in json.loads((run / "run.json").read_text())["ddp"]["rebuilt_bucket_sizes"].split(",")]


@pytest.fixture(scope="module")
def buckets() -> Diff:
    return tracekit.diff(BASE, NEW, cache=False)


def test_bucket_sizes_show_in_calls_and_bytes(buckets: Diff) -> None:
    """DDP all-reduces once per bucket: the calls per iteration and the bytes per call are the recorder's buckets."""
    b1, b4 = _buckets(BASE), _buckets(NEW)
    assert (len(b1), len(b4)) == (8, 2)
    comm = buckets.comm.filter(pl.col("op") == "allreduce")
    assert comm["rank"].to_list() == [None, 0, 1]  # the job, then each rank of both runs
    for row in comm.iter_rows(named=True):
        assert row["base_calls_per_iteration"] == len(b1) and row["new_calls_per_iteration"] == len(b4)
        assert row["delta_calls_per_iteration"] == len(b4) - len(b1)
        assert row["base_bytes_per_call"] == pytest.approx(sum(b1) / len(b1))
        assert row["new_bytes_per_call"] == pytest.approx(sum(b4) / len(b4))
        assert row["base_bytes_per_iteration"] == row["new_bytes_per_iteration"] == sum(b1) == sum(b4)
        assert row["base_busbw_gbps"] > 0 and row["new_busbw_gbps"] > 0
        assert row["base_wait_ns"] >= 0 and row["base_transfer_ns"] > 0
    # the gloo work itself, matched by name among the ops whose time changed
    ar = buckets.job("ops").filter(pl.col("name") == "gloo:all_reduce").row(0, named=True)
    assert (ar["kind"], ar["base_calls"], ar["new_calls"]) == ("comm", 8.0, 2.0)


def test_every_table(buckets: Diff) -> None:
    assert buckets.ranks == [0, 1] and (buckets.base_ranks, buckets.new_ranks) == (2, 2) and not buckets.notes
    it = buckets.iterations
    assert it["rank"].to_list() == [None, 0, 1] and it["base_windows"].to_list() == [10, 5, 5]
    assert (it["delta_median_ns"] == it["new_median_ns"] - it["base_median_ns"]).all()
    bd = buckets.job("breakdown")
    assert bd["class"].to_list() == list(BREAKDOWN_ROWS)
    v = {r["class"]: r for r in bd.iter_rows(named=True)}
    for side in ("base", "new"):
        parts = sum(v[c][f"{side}_ns"] for c in ("compute", "overlapped", "exposed_comm", "memory", "idle"))
        assert abs(parts - v["wall"][f"{side}_ns"]) <= 5  # per-iteration means, each rounded
        assert abs(v["wait"][f"{side}_ns"] + v["transfer"][f"{side}_ns"] - v["exposed_comm"][f"{side}_ns"]) <= 2
        assert v["host_bound"][f"{side}_ns"] is None  # CPU-only ranks: the idle split does not apply
    assert buckets.breakdown.filter(pl.col("rank") == 1).height == len(BREAKDOWN_ROWS)
    cp = buckets.critical_path
    assert cp["label"].to_list() == ["compute", "memory", "transfer", "CPU", "launch", "idle", "waiting"]
    assert cp["base_share"].sum() == pytest.approx(1.0) and cp["new_share"].sum() == pytest.approx(1.0)
    ops = buckets.job("ops")
    assert 5 < ops.height <= 20 and (ops["delta_ns"].abs().diff().drop_nulls() <= 0).all()  # largest change first
    assert buckets.base_verdict is not None and buckets.new_verdict is not None
    d = buckets.to_dict()
    assert json.loads(json.dumps(d, default=str))["comm"][0]["op"] == "allreduce"
    assert "ddp-bucket1mb" in repr(buckets)


def test_a_run_against_itself_changes_nothing() -> None:
    job = tracekit.load(BASE, cache=False)
    d = job.diff(job)
    assert d.job("iterations")["delta_median_ns"].to_list() == [0]
    assert d.breakdown["delta_ns"].drop_nulls().abs().max() == 0
    assert d.ops["delta_ns"].abs().max() == 0 and d.critical_path["delta_ns"].abs().max() == 0


def test_different_ranks_and_gpu_jobs(tmp_path: Path) -> None:
    """Two GPU runs, the second with a third rank and a bigger all-reduce: per-rank rows for the two shared
    ranks, a note, and the idle split compared."""
    a = kt.write_gpu_job(tmp_path / "a", [0, 0])
    b = kt.write_gpu_job(tmp_path / "b", [0, 0, 0], sizes={r: {i: kt.BIG * 2 for i in range(0, 6, 2)}
                                                           for r in range(3)})
    d = tracekit.diff(a, b, cache=False, verdicts=False)
    assert d.ranks == [0, 1] and (d.base_ranks, d.new_ranks) == (2, 3)
    assert "different ranks" in d.notes[0]
    assert set(d.comm["rank"].to_list()) == {None, 0, 1}
    assert d.base_verdict is None
    idle = {r["class"]: r for r in d.job("breakdown").iter_rows(named=True)}
    assert idle["host_bound"]["base_ns"] is not None and idle["host_bound"]["new_ns"] is not None
    row = d.job("comm").row(0, named=True)
    assert row["new_bytes_per_call"] > row["base_bytes_per_call"]


def test_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(BASE), str(NEW), "--no-cache", "--no-verdict", "--limit", "5"]) == 0
    out = capsys.readouterr().out
    assert "communication per op" in out and "8 → 2" in out and "1.05 MB → 4.21 MB" in out
    assert "ops whose time changed most" in out and "critical path" in out and "per rank" in out
    assert main(["diff", str(BASE), str(NEW), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"iterations", "breakdown", "comm", "ops", "critical_path", "base_verdict", "new_verdict"} <= set(data)
    assert data["comm"][0]["base_calls_per_iteration"] == 8
    new = data["new_verdict"]
    assert new["kind"] in ("link-bound", "straggler-bound", "host-bound", "compute-bound", "mixed")
    assert new["text"].startswith(new["headline"]) and new["answer"]["kind"] == new["kind"]


def test_command_errors_are_one_line(tmp_path: Path) -> None:
    for args, says in ((["diff", str(BASE), str(tmp_path / "nope")], "nope: no such file or directory"),
                       (["diff", str(BASE), str(NEW), "--link-bw", "fast"], "--link-bw"),
                       (["diff", str(BASE), str(NEW), "--limit", "-1"], "--limit must be at least 0")):
        r = subprocess.run([sys.executable, "-m", "tracekit.cli", *args], capture_output=True, text=True)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert len(lines) == 1 and says in lines[0], r.stderr
    r = subprocess.run([sys.executable, "-m", "tracekit.cli", "diff", str(BASE)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.splitlines()[-1].endswith("the following arguments are required: NEW")
    with pytest.raises(SystemExit) as info:
        main(["diff", "--help"])
    assert info.value.code == 0


def test_tracekit_diff_is_callable_as_module_and_function() -> None:
    import tracekit.diff as module

    assert callable(module) and callable(tracekit.diff)
    d = tracekit.diff(BASE, BASE, verdicts=False)
    assert isinstance(d, Diff)


def test_hta_ab_pair(shared_data: Path) -> None:
    """HTA's own A/B pair (trace_diff/control, trace_diff/test: GPU traces of two different jobs, ranks 3 and 1):
    the job-level comparison, with the idle split of both GPU runs."""
    control, test = shared_data / "hta" / "trace_diff" / "control", shared_data / "hta" / "trace_diff" / "test"
    if not (control.exists() and test.exists()):
        pytest.skip("hta/trace_diff is absent")
    d = tracekit.diff(control, test, verdicts=False)
    assert d.ranks == [] and "share no rank" in d.notes[0]
    assert d.iterations["rank"].to_list() == [None]
    bd = {r["class"]: r for r in d.job("breakdown").iter_rows(named=True)}
    for side in ("base", "new"):
        parts = bd["host_bound"][f"{side}_ns"] + bd["sync"][f"{side}_ns"] + bd["other_idle"][f"{side}_ns"]
        assert abs(parts - bd["idle"][f"{side}_ns"]) <= 3
    assert set(d.comm["op"]) >= {"allreduce"} and d.critical_path.height == 7
    assert d.job("ops")["kind"].is_in(["compute", "comm", "memory"]).all()
