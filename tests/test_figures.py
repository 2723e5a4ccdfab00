"""The figure data of ``tracekit report`` and the what-if plots (:mod:`tracekit.views.figures`), without any plotting
library: every table adds up to the analysis it comes from, and every what-if point is the replay's answer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from tracekit.analysis.graph import whatif
from tracekit.analysis.graph.critical_path import LABELS
from tracekit.analysis.pipeline import Analysis, analyse
from tracekit.loading import traceset
from tracekit.model.schema import CLASSES
from tracekit.views import figures, summary

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "ddp-gloo"


@pytest.fixture(scope="module")
def job() -> Analysis:
    """The bundled sample with the line rate it was recorded at."""
    return analyse(traceset.load([str(SAMPLE)]), link_bw_bps=500e6)


@pytest.fixture(scope="module")
def no_rate() -> Analysis:
    return analyse(traceset.load([str(SAMPLE)]))


def test_colours_are_tracekits() -> None:
    assert figures.hex_colour("green") == "#008000"  # rich's default theme
    assert figures.hex_colour("bold red1") == "#ff0000"
    assert len(set(figures.CLASS_COLOURS.values())) == len(CLASSES)
    assert set(figures.PATH_COLOURS) == set(LABELS)


def test_rank_breakdown_adds_up_to_each_rank(job: Analysis) -> None:
    rb = figures.rank_breakdown(job.breakdown)
    assert rb.height == 2 * len(CLASSES)
    assert rb.filter(pl.col("rank") == 0).get_column("cls").to_list() == list(CLASSES)
    per = summary.per_rank(job.breakdown)
    for row in per.iter_rows(named=True):
        mine = rb.filter(pl.col("rank") == row["rank"])
        assert mine.get_column("ns").sum() == row["wall_ns"]  # the five add up to the rank's time
        assert mine.get_column("share").sum() == pytest.approx(1.0)
        for c in CLASSES:
            assert mine.filter(pl.col("cls") == c).get_column("share").item() == pytest.approx(row[f"{c}_share"])


def test_iteration_times_are_the_windows(job: Analysis) -> None:
    it = figures.iteration_times(job.breakdown)
    assert it.height == job.breakdown.num_rows == 10
    assert it.get_column("wall_ns").sum() == pa.compute.sum(job.breakdown.column("wall_ns")).as_py()
    assert it.get_column("iteration").unique().sort().to_list() == [2, 3, 4, 5, 6]


def test_link_activity_bins_the_link_active_time(job: Analysis) -> None:
    la = figures.link_activity(job.events, job.iterations, job.ranks, job.instances, job.members, bins=100)
    assert la.height == 2 * 100
    assert la.get_column("start_ns").min() == 0
    assert (la.get_column("busy_ns") <= la.get_column("end_ns") - la.get_column("start_ns")).all()
    assert la.get_column("busy_share").is_between(0, 1).all()
    # inside the iteration windows the bins hold the breakdown's link_active_ns (the same union)
    busy = la.group_by("rank").agg(pl.col("busy_ns").sum()).sort("rank").get_column("busy_ns").to_list()
    active = pl.from_arrow(job.breakdown).group_by("rank").agg(pl.col("link_active_ns").sum()).sort("rank")
    for b, a in zip(busy, active.get_column("link_active_ns").to_list(), strict=True):
        assert b >= a and b == pytest.approx(a, rel=0.02)


def test_link_activity_of_hand_made_intervals() -> None:
    """Two ranks, one 100 ns window each, rank 1 on a clock 10 ns behind; rank 0's link busy 20..70 (two
    overlapping transfers count once), rank 1's 0..10 on its own clock (10..20 on the job's)."""
    events = pa.table({"rank": pa.array([0, 0, 1], pa.int32()), "kind": ["comm", "comm", "comm"],
                       "start_ns": [20, 40, 0], "dur_ns": [30, 30, 10]})
    iters = pa.table({"rank": pa.array([0, 1], pa.int32()), "iteration": [1, 1], "start_ns": [0, -10],
                      "end_ns": [100, 90]})
    ranks = pa.table({"rank": pa.array([0, 1], pa.int32()), "clock_offset_ns": [0, 10]})
    la = figures.link_activity(events, iters, ranks, bins=4)
    assert la.get_column("start_ns").to_list()[:4] == [0, 25, 50, 75]
    assert la.filter(pl.col("rank") == 0).get_column("busy_ns").to_list() == [5, 25, 20, 0]
    assert la.filter(pl.col("rank") == 1).get_column("busy_ns").to_list() == [10, 0, 0, 0]
    assert la.filter(pl.col("rank") == 0).get_column("busy_share").to_list() == [0.2, 1.0, 0.8, 0.0]


def test_path_composition_is_the_critical_path(job: Analysis) -> None:
    s = job.critical_path_summary
    pc = figures.path_composition(s)
    assert pc.height == s.height * len(LABELS)
    for row in s.iter_rows(named=True):
        mine = pc.filter(pl.col("iteration") == row["iteration"])
        assert mine.get_column("label").to_list() == list(LABELS)
        assert abs(mine.get_column("ns").sum() - row["path_ns"]) <= len(LABELS)  # rounding only
        assert row["path_ns"] == row["iteration_ns"]
    assert figures.path_composition(pl.DataFrame()).height == 0


def test_collective_points(job: Analysis) -> None:
    c = figures.collective_points(job.instances, figures.origin_ns(job.iterations, job.ranks))
    matched = pl.from_arrow(job.instances).filter(pl.col("ranks").list.len() >= 2)
    assert c.height == matched.height == 40
    assert c.get_column("t_ns").is_sorted() and c.get_column("t_ns").min() >= 0
    assert c.get_column("skew_ns").min() >= 0
    assert c.get_column("op").unique().to_list() == ["allreduce"]
    mbit = c.get_column("busbw_gbps").median() * 1000
    assert 100 < mbit < 500  # a 500 Mbit/s link, shared by calls running at once


def test_whatif_curves_are_the_replays_answers(job: Analysis) -> None:
    b = job.bottleneck
    assert b is not None
    cv = figures.whatif_curves(job.whatif, b)
    assert cv.line_rate_bps == 500e6 and not cv.empty
    assert cv.measured_scaling == pytest.approx(b.scaling_measured)
    rate, comp = cv.by_rate, cv.by_compression
    assert rate.height == 2 * len(figures.RATE_MULTIPLES)
    assert comp.height == 2 * len(figures.COMPRESSIONS)
    # the measured point lies on the measured-efficiency curves
    at_job = rate.filter((pl.col("efficiency") == "measured") & (pl.col("scale") == 1.0)).row(0, named=True)
    assert at_job["bandwidth_bps"] == 500e6 and at_job["scaling_factor"] == pytest.approx(b.scaling_measured)
    assert comp.filter((pl.col("efficiency") == "measured") & (pl.col("compression") == 1.0)) \
        .get_column("iteration_ns").item() == b.measured_ns
    # full utilisation of the job's own link: the verdict's figure
    full = rate.filter((pl.col("efficiency") == "full") & (pl.col("scale") == 1.0)).row(0, named=True)
    assert full["scaling_factor"] == pytest.approx(b.scaling_full)
    # every point is tracekit whatif's prediction for that scenario
    m = job.whatif
    assert rate.filter((pl.col("efficiency") == "measured") & (pl.col("scale") == 4.0)).get_column(
        "iteration_ns").item() == whatif.predict(m, whatif.Scenario(bandwidth_bps=2e9))
    assert comp.filter((pl.col("efficiency") == "full") & (pl.col("compression") == 4.0)).get_column(
        "iteration_ns").item() == whatif.predict(m, whatif.Scenario(compression=4, efficiency="full"))
    # faster links and more compression never make it worse; the link is the bottleneck: both curves rise
    for eff in ("measured", "full"):
        sf = rate.filter(pl.col("efficiency") == eff).get_column("scaling_factor").to_numpy()
        assert np.all(np.diff(sf) >= -0.01) and sf[-1] > sf[0] + 0.2
        sf = comp.filter(pl.col("efficiency") == eff).get_column("scaling_factor").to_numpy()
        assert sf[-1] > sf[0] and (sf <= 1.0 + 1e-9).all()


def test_whatif_curves_without_a_line_rate(no_rate: Analysis) -> None:
    cv = figures.whatif_curves(no_rate.whatif, no_rate.bottleneck)
    assert cv.line_rate_bps is None
    assert cv.by_rate.get_column("efficiency").unique().to_list() == ["full"]
    assert cv.by_rate.get_column("bandwidth_bps").to_list() == list(figures.RATE_GRID_BPS)
    assert cv.by_compression.get_column("efficiency").unique().to_list() == ["measured"]
    assert any("--link-bw" in n for n in cv.notes)


def test_whatif_curves_stop_when_cancelled(job: Analysis) -> None:
    calls = []

    def cancelled() -> bool:
        calls.append(1)
        return len(calls) > 3

    with pytest.raises(figures.Cancelled):
        figures.whatif_curves(job.whatif, job.bottleneck, cancelled=cancelled)


def test_collect_has_every_figure(job: Analysis) -> None:
    data = figures.collect(job, bins=50)
    assert data.link_activity.height == 100
    assert data.curves is not None and data.path_composition.height
    assert data.verdicts["bottleneck"] == job.bottleneck.text  # type: ignore[union-attr]
    assert data.verdicts["kind"] == "link-bound" == job.verdict.kind
    assert data.verdicts["headline"] == job.verdict.headline and data.verdicts["headline"].startswith("Link-bound")
    assert "Links were busy" in (data.verdicts["paragraph"] or "")
    assert ("line rate", "500 Mbit/s") in data.facts
