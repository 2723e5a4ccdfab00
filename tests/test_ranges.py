"""Every prediction a point and a range (DESIGN.md "Ranges", tracekit/analysis/ranges.py): the sources, their sizes,
and ranges that hold a new run's truth on generated jobs without being wider than they must be."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from benchmarks import jobgen
from tracekit.analysis import ranges, verdict
from tracekit.analysis.graph.whatif import Scenario, predict_many
from tracekit.api import load
from tracekit.cli import main

ROOT = Path(__file__).resolve().parents[1]
JOBS = ROOT / "tests" / "data" / "jobs"
#: 2 hosts x 2 GPUs, 6 steps, link-bound at 10 Gbit/s, 2 % jitter per kernel
SMALL = jobgen.JobSpec(ranks=4, gpus_per_host=2, steps=6, layers=8, param_bytes=8 << 20, bucket_bytes=16 << 20,
                       clock_skew_ns=500_000, jitter=0.02)


def test_variation_is_a_t_interval_of_a_new_runs_median() -> None:
    x = np.array([100.0, 104.0, 96.0, 100.0])
    s = x.std(ddof=1) / 100.0
    assert ranges.variation(x) == pytest.approx(2.353 * s * math.sqrt(2 / 4) * math.sqrt(math.pi / 2))
    assert ranges.variation(np.array([100.0])) is None  # one iteration says nothing about the next run
    # from eight iterations on, one odd iteration does not widen it (the median absolute deviation's spread)
    steady = np.array([100.0, 101, 99, 100, 101, 99, 100, 100])
    assert ranges.variation(np.append(steady, 300.0)) < 2 * ranges.variation(steady)


def test_sources_combine_in_quadrature_on_each_side() -> None:
    r = ranges.combine(1000, {"variation": (-0.03, 0.03), "sizes": (-0.04, 0.0), "link": (0.0, 0.0)})
    assert (r.low, r.high) == (950, 1030)
    assert "link" not in r.sources  # nothing to show
    assert r.text() == "1 µs (950 ns–1.03 µs)" or "(" in r.text()
    assert ranges.ranged_text(140_000_000, 132_000_000, 151_000_000) == "140 ms (132–151)"
    assert ranges.ranged_text(140_000_000, 140_000_000, 140_000_000) == "140 ms"


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("ranges") / "job"
    jobgen.write_job(d, SMALL)
    return load([str(d)], link_bw="10Gbit", cache=False)


def test_ranges_hold_a_new_runs_truth_on_a_generated_job_and_stay_narrow(generated) -> None:
    job = generated
    unc = job.analysis.uncertainty
    assert unc.iterations == SMALL.steps - 1 and unc.variation is not None and unc.size_models is None  # sizes recorded
    scen = [Scenario(), Scenario(free=True), Scenario(bandwidth_bps=40e9), Scenario(bandwidth_bps=5e9)]
    new = replace(SMALL, seed=SMALL.seed + 1)  # another run of the same job: other jitter draws
    truth = [jobgen.iteration_ns(new), jobgen.iteration_ns(replace(new, comm_free=True)),
             jobgen.iteration_ns(replace(new, inter_bps=40e9)), jobgen.iteration_ns(replace(new, inter_bps=5e9))]
    got = ranges.predict(unc, scen)
    assert [r.point for r in got] == predict_many(job.analysis.whatif, scen)  # the point is the replay's
    for r, t in zip(got, truth, strict=True):
        assert r.low <= r.point <= r.high
        assert r.contains(t), (r, t)
        assert r.half_width <= 0.03  # sizes known, iterations steady: narrow


def test_a_wider_spread_of_iterations_widens_the_range(tmp_path: Path) -> None:
    half = []
    for jitter in (0.01, 0.3):
        d = tmp_path / f"j{jitter}"
        jobgen.write_job(d, replace(SMALL, jitter=jitter))
        job = load([str(d)], link_bw="10Gbit", cache=False)
        (r,) = ranges.predict(job.analysis.uncertainty, [Scenario(bandwidth_bps=40e9)])
        half.append(r.sources["variation"][1])
    assert half[1] > 3 * half[0]


def test_estimated_sizes_are_bounded_where_a_rate_changes_them() -> None:
    job = load(str(JOBS / "ddp-noshapes-1gbit"), link_bw="1gbit", cache=False)
    unc = job.analysis.uncertainty
    assert unc.size_models is not None  # no shapes: sizes from transfer times
    free, faster, slower = ranges.predict(unc, [Scenario(free=True), Scenario(bandwidth_bps=3e9),
                                                Scenario(bandwidth_bps=100e6)])
    assert "sizes" not in free.sources  # free communication needs no size
    for r in (faster, slower):
        lo, hi = r.sources["sizes"]
        assert lo < 0 < hi or (lo < 0 or hi > 0)
    # all of a transfer's time on the wire moves more bytes: slower links take longer, faster ones less
    all_wire, most_host = unc.size_models
    (w_slow, h_slow) = (predict_many(m, [Scenario(bandwidth_bps=100e6)])[0] for m in (all_wire, most_host))
    assert w_slow > h_slow
    assert slower.low <= min(w_slow, h_slow) and max(w_slow, h_slow) <= slower.high


def test_one_traced_iteration_says_what_it_cannot_tell(tmp_path: Path) -> None:
    d = tmp_path / "one"
    jobgen.write_job(d, replace(SMALL, steps=1))
    job = load([str(d)], link_bw="10Gbit", cache=False)
    unc = job.analysis.uncertainty
    assert unc.variation is None
    assert any("one traced iteration" in n for n in unc.notes)


def test_open_kinds_finds_the_classes_a_straddling_range_leaves_open() -> None:
    path = {"compute": 0.8, "host": 0.2}
    assert verdict.kind_of(0.12, 0.0, path) == "compute-bound"
    assert verdict.open_kinds("compute-bound", (0.10, 0.20), (0.0, 0.01), path) == ("link-bound",)
    assert verdict.open_kinds("compute-bound", (0.0, 0.05), (0.0, 0.01), path) == ()
    assert set(verdict.open_kinds("link-bound", (0.12, 0.4), (0.08, 0.3), path)) >= {"mixed", "straggler-bound"}


def test_the_verdict_names_both_classes_where_its_ranges_straddle_the_line(generated) -> None:
    a = generated.verdict.answer
    assert set(a.ranges) >= {"as_measured", "free_communication", "stragglers_removed", "full_utilisation"}
    for r in a.ranges.values():
        assert r.low <= r.point <= r.high
    lo, hi = a.share_ranges["link"]
    assert lo <= a.shares["link"] <= hi
    expected = verdict.open_kinds(a.kind, a.share_ranges["link"], a.share_ranges["stragglers"],
                                  {k: a.shares[k] for k in ("compute", "host")}, False, a.shares.get("input", 0.0))
    assert a.alternatives == expected
    if a.alternatives:
        assert a.headline.lower().startswith(" or ".join(a.kinds))
        assert a.decide
    # the scaling factor never above 1
    assert all(v[2] <= 1.0 for v in a.scaling.values())
    d = a.as_dict()
    assert d["replay_ranges"]["free_communication"]["iteration_ns_low"] <= d["replays"]["free_communication"]


def test_whatif_json_rows_carry_their_ranges(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["whatif", str(JOBS / "ddp-noshapes-1gbit"), "--link-bw", "1gbit", "--bandwidth", "100mbit,3gbit",
                 "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["uncertainty"]["iterations"] >= 2
    for row in out["rows"]:
        assert row["iteration_ns_low"] <= row["iteration_ns"] <= row["iteration_ns_high"]
        assert row["speedup_low"] <= row["speedup"] <= row["speedup_high"]
        assert row["scaling_factor_low"] <= row["scaling_factor"] <= row["scaling_factor_high"] <= 1.0
        assert {s["source"] for s in row["range_sources"]} >= {"variation"}
    assert out["answer"]["replay_ranges"]["as_measured"]["iteration_ns_high"] >= out["answer"]["replays"]["as_measured"]


def test_whatif_prints_point_and_range(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["whatif", str(ROOT / "samples" / "ddp-gloo"), "--bandwidth", "1gbit"]) == 0
    out = capsys.readouterr().out
    assert "ranges: where the truth should fall 9 times in 10" in out
    assert "–" in out and "ms (" in out


def test_the_python_api_gives_the_same_ranges() -> None:
    job = load(str(ROOT / "samples" / "ddp-gloo"), cache=False)
    rows = job.whatif(bandwidth=["1gbit"], compression=[1, 4])
    assert {"iteration_ns_low", "iteration_ns_high", "scaling_factor_low", "scaling_factor_high",
            "range_sources"} <= set(rows.columns)
    assert (rows["iteration_ns_low"] <= rows["iteration_ns"]).all()
    assert (rows["iteration_ns"] <= rows["iteration_ns_high"]).all()
