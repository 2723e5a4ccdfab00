"""``--iterations`` / ``tracekit.load(..., iterations=...)``: a job analysed on some of its iterations alone (what
the interleaved testbed needs to predict one block of a recording from another, benchmarks/whatif_accuracy.py)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tracekit.analysis.iterations import parse_selection
from tracekit.cli import main
from tracekit.model.diagnostics import TraceError

JOB = Path(__file__).resolve().parent / "data" / "jobs" / "ddp-bucket1mb"  # profiled steps 2..6, 8 buckets each


@pytest.mark.parametrize(("text", "want"), [("3-5", {3, 4, 5}), ("7", {7}), (" 2, 4,6-7 ", {2, 4, 6, 7}),
                                            ("4-4", {4})])
def test_parse_selection(text: str, want: set[int]) -> None:
    assert parse_selection(text) == want


@pytest.mark.parametrize("text", ["", "a", "3-", "5-3", "1-2-3", "-1", "0-99999999999"])
def test_parse_selection_rejects(text: str) -> None:
    with pytest.raises(TraceError, match="iterations="):
        parse_selection(text)


@pytest.fixture(scope="module")
def whole() -> tracekit.Job:
    return tracekit.load(str(JOB), link_bw="1gbit", cache=False)


@pytest.fixture(scope="module")
def part() -> tracekit.Job:
    return tracekit.load(str(JOB), link_bw="1gbit", cache=False, iterations="3-4")


def test_only_the_selected_iterations_are_analysed(whole: tracekit.Job, part: tracekit.Job) -> None:
    b = part.breakdown
    assert sorted(b.get_column("iteration").unique().to_list()) == [3, 4] and b.height == 2 * 2
    assert set(part.events.get_column("iteration").unique().to_list()) == {3, 4}
    # every call the two iterations made, on both ranks, and no other; matched into instances as in the whole job
    buckets = len(json.loads((JOB / "run.json").read_text())["ddp"]["rebuilt_bucket_sizes"].split(","))
    assert part.collectives.height == 2 * 2 * buckets
    inst = part.collective_instances
    assert inst.height == 2 * buckets and set(inst.get_column("iteration").to_list()) == {3, 4}
    assert (inst.get_column("ranks").list.len() == 2).all()
    # the windows are those of the whole job (each rank's own clock), their classes add up as before
    cols = ["rank", "iteration", "start_ns", "end_ns", "wall_ns"]
    same = whole.breakdown.filter(pl.col("iteration").is_in([3, 4])).select(cols).sort(["rank", "iteration"])
    assert same.equals(b.select(cols).sort(["rank", "iteration"]))
    # the dependency graph and its replays hold only those iterations
    model = part.analysis.whatif
    assert model.comm.height == part.collectives.height
    it = model.iteration_of
    assert set(it[it > -(1 << 61)].tolist()) == {3, 4}
    assert model.measured_iteration_ns > 0


def test_selection_by_numbers_and_all_of_them(whole: tracekit.Job, part: tracekit.Job) -> None:
    again = tracekit.load(str(JOB), link_bw="1gbit", cache=False, iterations=range(3, 5))
    assert again.breakdown.equals(part.breakdown)
    every = tracekit.load(str(JOB), link_bw="1gbit", cache=False, iterations=[2, 3, 4, 5, 6, 99])
    assert every.breakdown.equals(whole.breakdown)
    assert every.analysis.whatif.measured_iteration_ns == whole.analysis.whatif.measured_iteration_ns


def test_selection_errors() -> None:
    with pytest.raises(TraceError, match=r"matches no iteration of the job \(its iterations: 2\.\.6\)"):
        tracekit.load(str(JOB), cache=False, iterations="10-12")
    with pytest.raises(TraceError, match="not an iteration number"):
        tracekit.load(str(JOB), cache=False, iterations=[3, "4"])
    with pytest.raises(TraceError, match="in memory"):
        tracekit.load(str(JOB), cache=False, iterations="3", by_rank=True)


def test_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["whatif", str(JOB), "--link-bw", "1gbit", "--bandwidth", "100mbit", "--iterations", "3-4",
                 "--json", "--no-cache"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["rows"][0]["iteration_ns"] > data["measured_iteration_ns"] > 0
    assert main(["summary", str(JOB), "--iterations", "5", "--json", "--no-cache"]) == 0
    assert [r["iteration"] for r in json.loads(capsys.readouterr().out)["breakdown"]] == [5, 5]
    assert main(["critical-path", str(JOB), "--iterations", "9-10", "--no-cache"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--iterations" in err and "2..6" in err
