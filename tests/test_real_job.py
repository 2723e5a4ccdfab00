"""A fresh real 2-rank gloo DDP job, recorded by the suite itself, read back by tracekit."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tracekit.cli import main

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
# a real 2-process job, recorded once for the module: ~20 s
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("job") / "rec"
    args = ["--out", str(out), "--hidden", "256", "--layers", "3", "--batch", "64", "--steps", "3", "--wait", "1",
            "--warmup", "1"]
    proc = subprocess.run([sys.executable, str(SAMPLES / "record_ddp.py"), *args], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out


def test_summary_of_a_fresh_job(recorded: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = json.loads((recorded / "run.json").read_text())
    assert main(["summary", str(recorded), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["job"]["ranks"] == 2
    steps = run["profiler"]["profiled_steps"]
    assert sorted({r["iteration"] for r in data["breakdown"]}) == steps
    for row in data["breakdown"]:
        classes = ("compute_ns", "overlapped_ns", "exposed_comm_ns", "memory_ns", "idle_ns")
        assert sum(row[c] for c in classes) == row["wall_ns"]
        # every step all-reduces every gradient byte
        assert row["comm_bytes"] == run["model"]["gradient_bytes"]
        # every step computes: alone, or hidden under communication (on a busy machine gloo's all-reduce can
        # stretch over all of a small model's backward)
        assert row["comm_ns"] > 0 and row["compute_ns"] + row["overlapped_ns"] > 0, row
    # tracekit's windows start where the job's own clock says its steps started (same machine clock)
    started = {(int(rank), s["step"]): s["start_unix_ns"] for rank, r in run["step_times"]["ranks"].items()
               for s in r["steps"]}
    for row in data["breakdown"]:
        step_start = started[(row["rank"], row["iteration"])]
        assert abs(row["start_ns"] - step_start) < 5_000_000, (row["rank"], row["iteration"])


def test_export_of_a_fresh_job(recorded: Path, tmp_path: Path) -> None:
    import polars as pl

    assert main(["export", str(recorded), "-o", str(tmp_path / "out")]) == 0
    coll = pl.read_parquet(tmp_path / "out" / "collectives.parquet")
    assert set(coll["op"].to_list()) == {"allreduce"}
    assert coll["bytes"].null_count() == 0
    assert set(coll["rank"].to_list()) == {0, 1}
