"""The critical-path and what-if commands as a user meets them."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from tracekit.cli import main

SAMPLE = str(Path(__file__).resolve().parents[1] / "samples" / "ddp-gloo")


def test_critical_path_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["critical-path", SAMPLE]) == 0
    out = capsys.readouterr().out
    assert "critical path per iteration" in out and "transfer" in out and "gloo:all_reduce" in out


def test_critical_path_json_adds_up(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["critical-path", SAMPLE, "--iteration", "3", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["iteration"] == 3
    for row in data["summary"]:
        assert row["path_ns"] == row["iteration_ns"]
    assert sum(s["dur_ns"] for s in data["segments"]) == next(
        r["path_ns"] for r in data["summary"] if r["iteration"] == 3)


def test_critical_path_unknown_iteration(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["critical-path", SAMPLE, "--iteration", "99"]) == 1
    assert "no iteration 99" in capsys.readouterr().err


def test_whatif_sweep_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["whatif", SAMPLE, "--link-bw", "500mbit", "--bandwidth", "100mbit,1gbit", "--compression", "1,4",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = data["rows"]
    assert len(rows) == 5 and [r["stragglers_removed"] for r in rows] == [False] * 4 + [True]
    rows = rows[:4]
    assert {"bandwidth_bps", "compression", "workers", "iteration_ns", "speedup", "scaling_factor"} <= set(rows[0])
    by = {(r["bandwidth_bps"], r["compression"]): r["iteration_ns"] for r in rows}
    assert by[(1e8, 1.0)] > by[(1e9, 1.0)] > by[(1e9, 4.0)]
    assert data["verdict"].startswith("Link-bound") and data["answer"]["kind"] == "link-bound"
    assert data["verdict"] == data["answer"]["text"] and "bottleneck" in data["bottleneck"]


@pytest.mark.parametrize("args,message", [
    (["--bandwidth", "1gbit", "--efficiency", "measured"], "--link-bw"),
    (["--bandwidth", "fast"], "--bandwidth"),
    (["--link-bw", "1gbit", "--compression", "0"], "positive"),
    (["--link-bw", "1gbit", "--efficiency", "2"], "at most 1"),
    (["--link-bw", "1gbit", "--latency", "20"], "duration"),
    ([], "--bandwidth"),
])
def test_whatif_errors_are_one_line(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    assert main(["whatif", SAMPLE, *args]) in (1, 2)
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_summary_answers_the_question(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", SAMPLE, "--link-bw", "500mbit", "--json"]) == 0
    b = json.loads(capsys.readouterr().out)["bottleneck"]
    assert 0 < b["scaling_factor_measured"] < b["scaling_factor_full_utilisation"] <= 1
    assert "bottleneck" in b["text"]


def test_export_has_the_critical_path(tmp_path: Path) -> None:
    assert main(["export", SAMPLE, "-o", str(tmp_path / "out")]) == 0
    cp = pl.read_parquet(tmp_path / "out" / "critical_path.parquet")
    summ = pl.read_parquet(tmp_path / "out" / "critical_path_summary.parquet")
    assert cp.group_by("iteration").agg(pl.col("dur_ns").sum()).sort("iteration")["dur_ns"].to_list() == \
        summ["path_ns"].to_list()
