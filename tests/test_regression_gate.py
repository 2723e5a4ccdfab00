"""The CI gate ``tracekit diff BASE NEW --fail-on-regression 5%`` (tracekit/analysis/regression.py, Diff.regression):
both exits on recorded runs, runs that differ a lot (recorded, and generated with a known truth), the noise of two
runs of the same job, the rule itself and the command line's usage errors."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import tracekit
from benchmarks import jobgen
from tracekit.analysis import regression
from tracekit.cli import EXIT_REGRESSION, main
from tracekit.model.diagnostics import TraceError

ROOT = Path(__file__).resolve().parents[1]
JOBS = ROOT / "tests" / "data" / "jobs"
B1, B4 = JOBS / "ddp-bucket1mb", JOBS / "ddp-bucket4mb"
#: interleaved-ddp changes its link's rate every 3 profiled steps; its blocks at 1 Gbit/s are iterations 2-4 and 11-13
INTERLEAVED = JOBS / "interleaved-ddp"


def test_a_slower_recording_fails_and_the_faster_passes(capsys: pytest.CaptureFixture[str]) -> None:
    """The 4 MB-bucket run was recorded while the VM was busier: every iteration but its first is slower than the
    1 MB run's slowest, so it fails at 5 %; the other way round it is faster and passes."""
    assert main(["diff", str(B1), str(B4), "--no-verdict", "--fail-on-regression", "5%"]) == EXIT_REGRESSION == 3
    out = capsys.readouterr().out
    gate = out[out.index("regression gate"):]
    assert "failed" in gate and "compute +" in gate, gate
    assert main(["diff", str(B4), str(B1), "--no-verdict", "--fail-on-regression", "5%"]) == 0
    assert "regression gate: passed" in capsys.readouterr().out
    # without the option diff is not a gate
    assert main(["diff", str(B1), str(B4), "--no-verdict"]) == 0
    assert "regression gate" not in capsys.readouterr().out


def test_json_gate_object(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(B1), str(B4), "--no-verdict", "--json", "--fail-on-regression", "0.05"]) == 3
    data = json.loads(capsys.readouterr().out)
    g = data["gate"]
    d = tracekit.diff(B1, B4, verdicts=False)
    assert g["base_median_ns"] == round(float(np.median(d.base_iteration_ns)))
    assert g["new_median_ns"] == round(float(np.median(d.new_iteration_ns))) and g == d.regression(0.05).to_dict()
    assert g["difference_ns"] == g["new_median_ns"] - g["base_median_ns"] > g["threshold_ns"]
    assert g["threshold"] == 0.05 and g["threshold_ns"] == round(0.05 * g["base_median_ns"])
    low, high = g["interval_ns"]
    assert 0 < low < g["difference_ns"] < high and g["spread_ns"] == g["difference_ns"] - low
    assert g["verdict"] == "regression" and g["regressed"] is True and g["confidence"] == 0.9
    assert (g["base_iterations"], g["new_iterations"]) == (5, 5) and "bootstrap" in g["spread_rule"]
    assert g["reasons"][0]["class"] == "compute" and g["reasons"][0]["delta_ns"] > 0
    # the diff's own medians are the gate's
    job = next(r for r in data["iterations"] if r["rank"] is None)
    assert abs(job["base_median_ns"] - g["base_median_ns"]) <= 1 and abs(job["new_median_ns"] - g["new_median_ns"]) <= 1


def test_a_much_slower_link_fails_on_transfer() -> None:
    """The same DDP job recorded at 1 Gbit/s and at 100 Gbit/s: the transfer is what grew."""
    g = tracekit.diff(JOBS / "ddp-noshapes-1gbit", JOBS / "ddp-noshapes-100mbit", cache=False,
                      verdicts=False).regression(0.05)
    assert g.regressed and g.change > 1
    top = g.reasons[0]
    assert top.cls == "exposed_comm" and "transfer +" in top.text and "waiting" not in top.text


def test_a_straggler_fails_on_waiting_for_it() -> None:
    """The sample's job at 1 Gbit/s (interleaved-ddp's first block) against the same job with rank 1 sleeping 400 ms
    a step: exposed communication grew as waiting, on rank 1, and idle time grew on the sleeping rank."""
    base = tracekit.load(INTERLEAVED, cache=False, iterations="2-4")
    new = tracekit.load(JOBS / "class-straggler-bound", cache=False)
    d = tracekit.diff(base, new, verdicts=False)
    g = d.regression("5%")
    assert g.regressed
    comm = next(r for r in g.reasons if r.cls == "exposed_comm")
    assert "waiting +" in comm.text and "on rank 1" in comm.text
    waited = d.waited_on.row(by_predicate=pl.col("straggler_rank") == 1, named=True)
    assert waited["delta_ns"] > 300_000_000  # ~400 ms of sleep a step, before every first all-reduce
    assert {r.cls for r in g.reasons} >= {"exposed_comm", "idle"}


def test_two_runs_of_the_same_job_within_their_spread_pass() -> None:
    """interleaved-ddp ran 3 steps at 1 Gbit/s twice (its 1st and 4th blocks): the second block's median is
    9 % below the first's, so block 4 → block 1 is 9 % slower — above a 5 % threshold, yet within the two blocks'
    own spread (their iterations overlap), so the gate passes; the threshold alone would have failed it."""
    first = tracekit.load(INTERLEAVED, cache=False, iterations="2-4")
    fourth = tracekit.load(INTERLEAVED, cache=False, iterations="11-13")
    g = fourth.diff(first).regression(0.05)
    assert g.change > 0.05 and g.difference_ns > g.threshold * g.base_median_ns  # over the threshold …
    assert g.interval_ns[0] < 0 < g.interval_ns[1] and g.difference_ns <= g.spread_ns  # … within the spread
    assert not g.regressed and "within the runs' own spread" in g.text
    assert not first.diff(fourth).regression(0.05).regressed  # the other way round it is faster


def test_halves_of_one_run_pass() -> None:
    """One recording's iterations split in two (ddp-bucket1mb: 2-3 against 4-6, either way) are not a regression."""
    early = tracekit.load(B1, cache=False, iterations="2-3")
    late = tracekit.load(B1, cache=False, iterations="4-6")
    for a, b in ((early, late), (late, early)):
        g = a.diff(b).regression(0.05)
        assert not g.regressed, g.text
    g = early.diff(early).regression(0)
    assert g.difference_ns == 0 and not g.regressed and g.reasons == []


def test_generated_jobs_of_known_truth(tmp_path: Path) -> None:
    """Generated GPU jobs (benchmarks/jobgen.py): a 4 % slower link costs the link-bound job ~3.4 % per iteration
    (the generator's truth), which fails a 1 % gate and passes a 5 % one; another seed of the same job passes
    either; the medians are the generator's iteration times."""
    spec = jobgen.JobSpec(ranks=4, gpus_per_host=2, steps=8, layers=6, param_bytes=8 << 20, bucket_bytes=16 << 20,
                          inter_bps=10e9, jitter=0.1)
    runs = {"base": spec, "again": replace(spec, seed=1), "slower": replace(spec, seed=2, inter_bps=9.6e9)}
    for name, s in runs.items():
        jobgen.write_job(tmp_path / name, s)
    base = tracekit.load(tmp_path / "base", cache=False)
    slower = base.diff(tracekit.load(tmp_path / "slower", cache=False))
    truth = jobgen.iteration_ns(runs["slower"]) / jobgen.iteration_ns(spec) - 1
    g = slower.regression(0.01)
    assert g.change == pytest.approx(truth, abs=0.01) and 0.02 < truth < 0.05
    assert g.regressed and g.reasons[0].cls == "exposed_comm" and "transfer" in g.reasons[0].text
    assert not slower.regression(0.05).regressed and "within the 5 % threshold" in slower.regression("5%").text
    assert g.base_median_ns == pytest.approx(jobgen.iteration_ns(spec), rel=0.01)
    again = base.diff(tracekit.load(tmp_path / "again", cache=False))
    assert not again.regression(0.01).regressed


def test_the_rule() -> None:
    """The spread is the bootstrap's: a difference beyond the threshold fails only when the runs' own variation
    cannot explain it; the answer is the same every time (a fixed seed)."""
    steady, noisy = [100] * 9, [60, 140, 80, 120, 100, 70, 130, 90, 110]
    g = regression.gate(steady, [110] * 9, 0.05)
    assert g.regressed and g.spread_ns == 0 and g.interval_ns == (10, 10)
    g = regression.gate(noisy, [x + 10 for x in noisy], 0.05)
    assert g.difference_ns == 10 and g.spread_ns > 10 and not g.regressed
    again = regression.gate(noisy, [x + 10 for x in noisy], 0.05)
    assert again == g
    assert regression.gate(steady, [104] * 9, 0.05).regressed is False  # within the threshold
    one = regression.gate([100], [120], 0.05)
    assert one.regressed and any("one traced iteration" in n for n in one.notes)
    with pytest.raises(TraceError, match="no iteration"):
        regression.gate([], [1], 0.05)


@pytest.mark.parametrize(("text", "share"), [("5%", 0.05), ("5 %", 0.05), ("0.05", 0.05), (".5", 0.5),
                                             ("150%", 1.5), ("0", 0.0)])
def test_thresholds(text: str, share: float) -> None:
    assert regression.parse_threshold(text) == pytest.approx(share)


@pytest.mark.parametrize("text", ["5", "abc", "-5%", "5%%"])
def test_bad_thresholds_are_usage_errors(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(TraceError):
        regression.parse_threshold(text)
    with pytest.raises(SystemExit) as info:
        main(["diff", str(B1), str(B4), "--fail-on-regression", text])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith("tracekit diff: error: argument --fail-on-regression"), err


def test_usage_error_is_one_line_without_traceback() -> None:
    r = subprocess.run([sys.executable, "-m", "tracekit.cli", "diff", str(B1), str(B4), "--fail-on-regression", "5"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "write 5% for a percentage" in r.stderr
