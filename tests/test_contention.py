"""Compute slowed by communication in flight: overlap shares, the fit, and the re-costing identity."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from tracekit.analysis import contention


def test_coverage_is_the_share_under_the_union_of_the_same_group() -> None:
    start = np.array([0, 0, 50, 0])
    end = np.array([100, 100, 150, 100])
    group = np.array([0, 1, 0, 2])
    # group 0: two overlapping transfers [20, 60) and [40, 80) -> union [20, 80); group 1: [90, 200)
    cs, ce, cg = np.array([20, 40, 90]), np.array([60, 80, 200]), np.array([0, 0, 1])
    got = contention.coverage(start, end, group, cs, ce, cg)
    assert got == pytest.approx([0.6, 0.1, 0.3, 0.0])


def _samples(slowdown: float, identities: int = 6, iterations: int = 8, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    t = 0
    for it in range(iterations):
        for k in range(identities):
            f = rng.uniform(0, 1)
            base = 1_000_000 * (k + 1)
            d = int(base * (1 + (slowdown - 1) * f) * rng.lognormal(0, 0.01))
            rows.append({"rank": 0, "iteration": it, "name": f"op{k}", "start": t, "end": t + d, "f": f})
            t += d
    return pl.DataFrame(rows)


@pytest.mark.parametrize("slowdown", [1.2, 1.6])
def test_the_fit_finds_a_known_slowdown(slowdown: float) -> None:
    df = _samples(slowdown)
    c = contention.measure(df.drop("f"), df.get_column("f").to_numpy(), np.ones(df.height, dtype=bool))
    assert c.measured and c.identities == 6
    assert c.slowdown == pytest.approx(slowdown, rel=0.03)


def test_no_slowdown_is_not_reported_as_one() -> None:
    """Durations that do not depend on the overlap: the fit is not significant, nothing is re-costed."""
    df = _samples(1.0)
    c = contention.measure(df.drop("f"), df.get_column("f").to_numpy(), np.ones(df.height, dtype=bool))
    assert not c.measured and c.slowdown == 1.0 and c.identities == 6


def test_not_measurable_when_every_iteration_overlaps_alike() -> None:
    df = _samples(1.5).with_columns(pl.lit(0.9).alias("f"))
    c = contention.measure(df.drop("f"), df.get_column("f").to_numpy(), np.ones(df.height, dtype=bool))
    assert not c.measured and c.slowdown == 1.0
    assert "could not be measured" in c.sentence()


def test_base_and_recost_round_trip() -> None:
    d = np.array([100.0, 150.0, 200.0])
    f = np.array([0.0, 0.5, 1.0])
    b = contention.base(d, f, 2.0)
    assert b == pytest.approx([100, 100, 100])
    assert contention.recost(b, f, 2.0) == pytest.approx(d)
