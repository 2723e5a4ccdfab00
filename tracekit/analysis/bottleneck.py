"""Is the link the bottleneck? Zhang et al.'s answer from the what-if replays (DESIGN.md "What-if"): the job as
measured, at full utilisation of its line rate and with free communication, and what compression or bandwidth would
reach a target scaling factor. The job's one verdict (:mod:`tracekit.analysis.verdict`) builds on it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import polars as pl

from tracekit.analysis.graph.whatif import (
    RECORD_SHAPES_HINT,
    SIZE_ESTIMATED,
    SIZE_UNKNOWN,
    Model,
    Scenario,
    predict_many,
    transfers,
)
from tracekit.model.units import format_rate


@dataclass(frozen=True)
class Bottleneck:
    """The answer to "is the network the bottleneck?", in Zhang et al.'s terms. ``sizes`` says what the transfer
    sizes rest on (:attr:`Model.sizes`); ``assumption`` is the sentence a verdict built on estimated sizes must
    carry; ``scaling_full`` is None when it could not be computed (no line rate, or sizes unknown)."""

    measured_ns: int
    free_ns: int
    scaling_measured: float
    scaling_full: float | None  # at full utilisation of the job's line rate
    line_rate_bps: float | None
    compression_needed: float | None  # for the target scaling at full utilisation of the same link
    bandwidth_needed_bps: float | None
    target: float
    text: str
    sizes: dict[str, Any] = field(default_factory=dict)
    assumption: str | None = None
    bandwidth_needed_factor: float | None = None  # every link's rate times this (per-link rates)
    #: why the replay without communication gains far less than the exposed communication suggests
    #: (:func:`with_small_gain_note`); part of ``text`` too
    note: str | None = None


#: :func:`with_small_gain_note` speaks where exposed communication not spent waiting for other ranks is at least
#: this share of the ranks' time ...
NOTE_MIN_SHARE = 0.05
#: ... and the replay without any communication gains less than this fraction of that share
NOTE_SMALL_GAIN = 0.5


def with_small_gain_note(b: Bottleneck, exposed_share: float) -> Bottleneck:
    """``b`` with a note where the replay without communication gains far less than the breakdown's exposed
    communication (``exposed_share``: not spent waiting for other ranks, of the ranks' time) suggests — what follows
    it waited on other work too, or on gaps no recorded dependency explains, which the replay keeps as measured (a
    wait the profiler did not record among them would make a faster link worth more); the critical path shows
    which. Otherwise ``b`` unchanged."""
    if b.free_ns <= 0 or exposed_share < NOTE_MIN_SHARE:
        return b
    speedup = b.measured_ns / b.free_ns
    if speedup - 1 >= NOTE_SMALL_GAIN * exposed_share:
        return b
    note = (f"Exposed communication not spent waiting for other ranks is {100 * exposed_share:.0f} % of the "
            f"iteration time, yet without any communication the replay is only {speedup:.2f}x "
            "faster: what follows it waited on other work too, or on gaps no recorded dependency explains, which "
            "the replay keeps as measured (tracekit critical-path shows the chain that sets the pace).")
    return replace(b, text=f"{b.text} {note}", note=note)


def _bisect_tree(lo: int, hi: int, depth: int) -> list[int]:
    """The indices bisection of ``[lo, hi)`` asks in its next ``depth`` steps, whichever way each answer goes."""
    if lo >= hi or depth == 0:
        return []
    mid = (lo + hi) // 2
    return [mid, *_bisect_tree(lo, mid, depth - 1), *_bisect_tree(mid + 1, hi, depth - 1)]


def _first_reaching(searches: list[list[float]], target: float,
                    scaling: Callable[[list[tuple[int, float]]], list[float]], depth: int = 1,
                    first: list[list[int]] | None = None) -> list[float | None]:
    """Per list of ``searches``, the smallest step whose scaling factor reaches ``target`` (None if none does), by
    bisection: the scaling factor only grows with compression and bandwidth, so a few replays answer instead of one
    per step. ``scaling`` gives the factors of (search, step) pairs in one call: the searches ask together, each
    the steps of its next ``depth`` bisection steps whichever way they go — the same answers as one bisection after
    the other, in fewer calls (where every call costs a round trip per collective: a job held rank by rank).
    ``first``: per search, the step indices to ask before bisecting (where the answer likely is, :func:`_guesses`):
    the lowest of them that reaches and the highest below it that does not bound the bisection, which ends at once
    where they are neighbours — on monotone factors the same answer, in one call."""
    lo = [0] * len(searches)
    hi = [len(s) for s in searches]  # steps[hi] reaches (hi = len: none known to), steps[< lo] do not
    if first:
        asks = [(k, i) for k, idx in enumerate(first) for i in sorted(set(idx)) if 0 <= i < len(searches[k])]
        got = dict(zip(asks, scaling([(k, searches[k][i]) for k, i in asks]), strict=True))
        for k in range(len(searches)):
            mine = sorted(i for kk, i in got if kk == k)
            hi[k] = next((i for i in mine if got[k, i] >= target), hi[k])
            lo[k] = max((i + 1 for i in mine if i < hi[k] and got[k, i] < target), default=lo[k])
    while True:
        asks = [(k, i) for k in range(len(searches)) for i in _bisect_tree(lo[k], hi[k], depth)]
        if not asks:
            break
        got = dict(zip(asks, scaling([(k, searches[k][i]) for k, i in asks]), strict=True))
        for k in range(len(searches)):
            while lo[k] < hi[k] and (k, mid := (lo[k] + hi[k]) // 2) in got:
                if got[k, mid] >= target:
                    hi[k] = mid
                else:
                    lo[k] = mid + 1
    return [float(s[i]) if i < len(s) else None for s, i in zip(searches, lo, strict=True)]


#: steps each search asks first (:func:`_guesses`): around the step the replays so far point to
GUESSES = 4


def _guesses(steps: list[float], free: float, full: float, comm: float, target: float) -> list[int]:
    """The :data:`GUESSES` step indices around where ``target`` is likely reached. Two bounds on that step from the
    free-communication and full-utilisation replays' iteration times: were the exposed communication (``full -
    free``) to shrink in proportion to the step, the scaling factor would reach ``target`` at ``(full - free) / (free
    (1/target - 1))``; were all of it (``comm`` per iteration, ``full - free`` of it exposed) to shrink so, with the
    compute it overlaps staying, at ``comm / (comm - (full - free) + free (1/target - 1))``. On the recorded jobs the
    answer lies between the two far more often than near either: the guesses are centred between them."""
    slack = max(free * (1.0 / target - 1.0), 1e-12)
    exposed = max(full - free, 0.0)
    comm = max(comm, exposed)
    at = [next((i for i, x in enumerate(steps) if x >= need), len(steps))
          for need in (exposed / slack, comm / max(comm - exposed + slack, 1e-12))]
    mid = sum(at) // 2
    return list(range(mid - GUESSES // 2, mid + GUESSES - GUESSES // 2))


def _comm_per_iteration(model: Model) -> float:
    """The communication time of an iteration at full utilisation (ns): per rank the median over its iterations of
    its transfers' sum, on the rank with the most."""
    t = transfers(model, Scenario(efficiency="full"))
    per = (model.comm.select("rank", "iteration").with_columns(pl.Series("t", np.asarray(t, np.float64)))
           .filter(pl.col("iteration").is_not_null()).group_by("rank", "iteration").agg(pl.col("t").sum())
           .group_by("rank").agg(pl.col("t").median()))
    return float(per.get_column("t").max() or 0.0) if per.height else 0.0


def distinct(*values: float, digits: int = 2, most: int = 4) -> tuple[str, ...]:
    """``values`` with ``digits`` decimals, or more (up to ``most``) where two that differ would print alike: a
    verdict never reads "0.90 instead of 0.90" for 0.900 against 0.897."""
    for d in range(digits, most + 1):
        out = tuple(f"{v:.{d}f}" for v in values)
        if all(out[i] != out[j] for i in range(len(values)) for j in range(i) if values[i] != values[j]):
            break
    return out


#: the compressions and the multiples of the line rate a "needs" answer is chosen from (the smallest that reaches)
COMPRESSION_STEPS = (1.5, 2, 3, 4, 5, 8, 10, 16, 32, 64, 100)
BANDWIDTH_STEPS = (1.5, 2, 2.5, 4, 5, 8, 10, 16, 25, 40, 64, 100, 250, 1000)


def bottleneck(model: Model, target: float = 0.9) -> Bottleneck | None:
    """Measured vs full-utilisation vs infinite-bandwidth predictions, and what would reach ``target``; None
    when the replay predicts no iteration time to compare. No verdict rests on a size nobody knows: without
    sizes and without a line rate it says what to pass instead; with sizes estimated from transfer times the
    verdict names that assumption."""
    # (the replay at full utilisation, asked below wherever a line rate is known, goes with the first two: one
    # round trip per collective fewer where the ranks' graphs are held apart)
    free, measured, *full = predict_many(model, [Scenario(free=True), Scenario(),
                                                 *([Scenario(efficiency="full")] if model.line_rate_known else [])])
    if free <= 0 or measured <= 0:
        return None
    sf_measured = free / measured if measured else 1.0
    sizes = model.sizes
    rate = model.line_rate_bps
    base = (f"Communication free, this job would run {measured / free:.2f}x faster (scaling factor "
            f"{sf_measured:.2f} now).")
    if model.contention.measured and model.contention.slowdown > 1.0:
        base += " " + model.contention.sentence()
    if not model.line_rate_known:
        if sizes[SIZE_UNKNOWN]:
            text = (f"{base} Whether the link or its use is the bottleneck cannot be told: the transfer sizes are "
                    "not in the traces (profiled without record_shapes?) and no line rate was given. Pass --link-bw "
                    "(the line rate the job ran on) for an estimate from transfer times, or " + RECORD_SHAPES_HINT
                    + " for a measured answer.")
        else:
            text = f"{base} Pass --link-bw (the line rate the job ran on) to learn whether the link or its use is " \
                   "the bottleneck."
        return Bottleneck(measured, free, sf_measured, None, rate, None, None, target, text, sizes)
    assumption = None
    if sizes[SIZE_ESTIMATED]:
        assumption = (f"This rests on an assumption: {sizes['note']}. For measured sizes, "
                      + RECORD_SHAPES_HINT + ".")
    sf_full = free / full[0] if full[0] else 1.0
    r = format_rate(rate) if rate else "each link's"
    link = f"the {r} link" if rate else "each link's line rate"
    tail = f" {assumption}" if assumption else ""
    if model.contention.measured and model.contention.slowdown > 1.0:
        tail += " " + model.contention.sentence()
    if sf_measured >= target:
        text = (f"The network is not the bottleneck: the job scales at {sf_measured:.2f} on {link} "
                f"(communication costs {100 * (1 - sf_measured):.0f} % of an iteration).{tail}")
        return Bottleneck(measured, free, sf_measured, sf_full, rate, None, None, target, text, sizes, assumption)
    if sf_full >= target:
        full_s, measured_s = distinct(sf_full, sf_measured)
        text = (f"At full utilisation of {link} this job would scale at {full_s} instead of "
                f"{measured_s}: the link is not the bottleneck, its use is.{tail}")
        return Bottleneck(measured, free, sf_measured, sf_full, rate, None, None, target, text, sizes, assumption)
    def scaling(asks: list[tuple[int, float]]) -> list[float]:
        scenarios = [Scenario(efficiency="full", compression=x) if k == 0 else
                     Scenario(efficiency="full", bandwidth_scale=x) for k, x in asks]
        return [free / p for p in predict_many(model, scenarios)]

    searches = [list(COMPRESSION_STEPS), list(BANDWIDTH_STEPS)]
    comm = _comm_per_iteration(model)
    need_c, need_mult = _first_reaching(searches, target, scaling, depth=1 if model.remote is None else 2,
                                        first=[_guesses(s, free, full[0], comm, target) for s in searches])
    need_r = rate * need_mult if rate and need_mult else None
    wants = []
    if need_c:
        wants.append(f"≥ {need_c:g}x compression")
    if need_mult:
        wants.append(f"≥ {format_rate(need_r)}" if need_r else f"≥ {need_mult:g}x the bandwidth")
    want = " or ".join(wants) if wants else "more than 100x compression or 1000x the bandwidth"
    full_s, measured_s, target_s = distinct(sf_full, sf_measured, target)
    target_s = f"{target:.1f}" if target_s == f"{target:.2f}" else target_s  # "to reach 0.9" where that is clear
    text = (f"The link is the bottleneck: even at full utilisation of {link} this job would scale at "
            f"{full_s} (now {measured_s}); it needs {want} to reach {target_s}.{tail}")
    return Bottleneck(measured, free, sf_measured, sf_full, rate, need_c, need_r, target, text, sizes, assumption,
                      need_mult)
