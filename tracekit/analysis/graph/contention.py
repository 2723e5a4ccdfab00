"""Compute that slows down while communication is in flight, measured from the trace itself.

NCCL kernels take SMs and memory bandwidth from the compute kernels they overlap; gloo's reductions and the
network stack take CPU cores from a CPU job's compute. The what-if would get every prediction towards a faster
link wrong if it kept compute as measured on a slow one (where it overlapped communication for longer).

**Measure.** An operation is identified by its rank, its name and its ordinal among the operations of that
name in its iteration — the same work, repeated every iteration. Each sample has a duration ``d`` and the
share ``f`` of it during which communication of its rank was transferring. Like is compared with like: ``log d``
is fitted against ``f`` with one intercept per identity (its usual duration) and one per rank, iteration and name
(how fast that rank ran that operation in that iteration: a rank slow for a whole step arrives last at its
collectives, so its compute overlaps transfers more without being slowed by them — compared across iterations
alone, that reads as contention), by alternating projections; ``slowdown = exp(slope)`` is how much longer compute
takes when fully overlapped than when alone. Only the operations of ranks and names with an identity whose overlap
varies by at least :data:`MIN_SPREAD` take part. It is *measured* only when at least :data:`MIN_IDENTITIES` such
identities contribute and the fitted log-slowdown exceeds :data:`SIGNIFICANCE` standard errors; otherwise (every
iteration overlaps the same way, as a steady data-parallel job does, or the effect is not distinguishable from
zero) the trace cannot tell, and the slowdown is taken as 1 and reported as not measured.

**Re-cost.** In a replay, compute activity ``a`` with measured overlap ``f`` has base duration
``d / (1 + (s − 1) f)``; in the predicted schedule, where its overlap is ``f'``, it takes
``base · (1 + (s − 1) f')`` (:func:`recost`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import polars as pl

#: an identity takes part when its overlap share varies at least this much across its samples
MIN_SPREAD = 0.5
#: identities needed for a measurement
MIN_IDENTITIES = 3
#: activities shorter than this are noise (timer resolution, allocator calls)
MIN_DURATION_NS = 20_000
#: a measured slowdown is clamped to this range (a factor beyond it is a fit to noise)
SLOWDOWN_RANGE = (1.0, 3.0)
#: the fitted log-slowdown must exceed this many standard errors to count as measured
SIGNIFICANCE = 2.0


@dataclass(frozen=True)
class Contention:
    """How much slower compute ran while communication was in flight (``slowdown``; 1.0 when not measured)."""

    slowdown: float
    measured: bool
    identities: int  # operation identities whose overlap varied, that the fit used
    samples: int  # their activities
    standard_error: float | None  # of the fitted log-slowdown

    def as_dict(self) -> dict[str, object]:
        """JSON-able form (``summary --json``)."""
        return asdict(self)

    def sentence(self) -> str:
        """One sentence for the views."""
        if not self.measured:
            return ("Whether compute slowed while communication was in flight could not be measured (every "
                    "iteration overlapped the same way, or the effect is not distinguishable from zero); the what-if "
                    "keeps compute as measured.")
        pct = 100 * (self.slowdown - 1)
        return (f"Compute ran {pct:.0f} % slower while communication was in flight (each of {self.identities} "
                "operations compared with itself on the same rank, and with the rank's other runs of it in the same "
                "iteration); the what-if re-costs it by each predicted schedule's overlap.")


NONE = Contention(1.0, False, 0, 0, None)


def coverage(start: np.ndarray, end: np.ndarray, group: np.ndarray, c_start: np.ndarray, c_end: np.ndarray,
             c_group: np.ndarray) -> np.ndarray:
    """Per interval ``[start, end)`` of ``group``, the share of it covered by the union of the intervals
    ``[c_start, c_end)`` of the same group (vectorised: union per group, then prefix sums)."""
    out = np.zeros(start.size)
    if start.size == 0 or c_start.size == 0:
        return out
    t0 = int(min(start.min(), c_start.min()))
    span = int(max(end.max(), c_end.max())) - t0 + 2
    # one time axis: groups laid end to end, so one sorted union serves every group
    cs = c_group.astype(np.int64) * span + (c_start - t0)
    ce = c_group.astype(np.int64) * span + (c_end - t0)
    order = np.argsort(cs, kind="stable")
    cs, ce = cs[order], ce[order]
    reach = np.maximum.accumulate(ce)
    new = np.ones(cs.size, dtype=bool)
    new[1:] = cs[1:] > reach[:-1]
    first = np.flatnonzero(new)
    us = cs[first]
    ue = np.maximum.reduceat(ce, first)
    cum = np.concatenate([[0], np.cumsum(ue - us)])

    def covered(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(us, t, side="right") - 1
        j = np.maximum(i, 0)
        return np.where(i >= 0, cum[j] + np.clip(t - us[j], 0, ue[j] - us[j]), 0)

    a = group.astype(np.int64) * span + (start - t0)
    b = group.astype(np.int64) * span + (end - t0)
    return (covered(b) - covered(a)) / np.maximum(b - a, 1)


def measure(act: pl.DataFrame, overlap: np.ndarray, compute: np.ndarray) -> Contention:
    """Fit the slowdown from the activities ``act`` (``rank, iteration, name, start, end``) whose ``compute``
    mask is set, with ``overlap`` their share overlapped by their rank's transfers (module docstring)."""
    return fit(*samples(act, overlap, compute))


def samples(act: pl.DataFrame, overlap: np.ndarray, compute: np.ndarray) -> tuple[pl.DataFrame, int]:
    """What :func:`fit` reads of ``act`` (as :func:`measure` takes it): the samples of the ranks and names with an
    identity whose overlap varied (``rank, iteration, name, f, y, k``), and how many such identities there are. Every
    step is within a rank: the samples of several ranks' activities, each taken apart, joined in the same order and
    their identities summed, fit as the ranks' together."""
    empty = pl.DataFrame(schema={"rank": pl.Int64, "iteration": pl.Int64, "name": pl.String, "f": pl.Float64,
                                 "y": pl.Float64, "k": pl.Int64})
    dur = (act.get_column("end") - act.get_column("start")).to_numpy()
    keep = compute & (dur >= MIN_DURATION_NS) & act.get_column("iteration").is_not_null().to_numpy()
    if not keep.any():
        return empty, 0
    # an operation's name as its categorical code where it has one (the same groups as its text, cheaper to hash)
    name = pl.col("name").to_physical() if act.schema["name"] == pl.Categorical else pl.col("name")
    df = act.filter(pl.Series(keep)).select(["rank", "iteration", name]).with_columns(
        pl.Series("f", overlap[keep]), pl.Series("y", np.log(dur[keep].astype(np.float64))))
    batch = ["rank", "iteration", "name"]
    df = df.with_columns(pl.int_range(pl.len()).over(batch).alias("k"))
    ident = ["rank", "name", "k"]
    df = df.with_columns((pl.col("f").max() - pl.col("f").min()).over(ident).alias("spread"),
                         pl.len().over(ident).alias("n")).filter(pl.col("n") >= 2)
    varied = (pl.col("spread") >= MIN_SPREAD)
    groups = df.filter(varied).select(pl.struct(ident).n_unique()).item() if df.height else 0
    # the operations of the ranks and names whose overlap varied: their batches set each one's speed per iteration
    return df.filter(varied.any().over(["rank", "name"])).drop("spread", "n"), int(groups)


def fit(df: pl.DataFrame, groups: int) -> Contention:
    """The slowdown fitted on :func:`samples` (module docstring)."""
    if groups < MIN_IDENTITIES:
        return NONE
    ident, batch = ["rank", "name", "k"], ["rank", "iteration", "name"]
    codes = df.select(pl.struct(ident).rank("dense").alias("i"), pl.struct(batch).rank("dense").alias("b"))
    i = codes.get_column("i").to_numpy().astype(np.int64) - 1
    b = codes.get_column("b").to_numpy().astype(np.int64) - 1
    x, y = _within(df.get_column("f").to_numpy(), df.get_column("y").to_numpy(), i, b)
    sxx = float((x * x).sum())
    if sxx <= 1e-12 * df.height:
        return Contention(1.0, False, int(groups), df.height, None)
    slope = float((x * y).sum()) / sxx
    resid = y - slope * x
    dof = max(df.height - int(i.max()) - int(b.max()) - 1, 1)
    se = math.sqrt(float((resid * resid).sum()) / dof / sxx)
    if slope < SIGNIFICANCE * se:  # no slowdown the data can tell from noise
        return Contention(1.0, False, int(groups), df.height, se)
    lo, hi = SLOWDOWN_RANGE
    return Contention(min(max(math.exp(slope), lo), hi), True, int(groups), df.height, se)


#: alternating projections stop once a round moves no value by more than this (relative to the values' spread) ...
WITHIN_TOLERANCE = 1e-9
#: ... or after this many rounds
WITHIN_ROUNDS = 200


def _within(x: np.ndarray, y: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``x`` and ``y`` less their means over the groups ``a`` and ``b`` together (two-way fixed effects, by
    alternating projections: demeaned by ``a``, then by ``b``, until nothing moves)."""
    x = x.astype(np.float64, copy=True)
    y = y.astype(np.float64, copy=True)
    na, nb = np.bincount(a), np.bincount(b)
    scale = max(float(np.ptp(x)), float(np.ptp(y)), 1e-300)
    for _ in range(WITHIN_ROUNDS):
        moved = 0.0
        for g, n in ((a, na), (b, nb)):
            mx, my = (np.bincount(g, x) / n)[g], (np.bincount(g, y) / n)[g]
            x -= mx
            y -= my
            moved = max(moved, float(np.abs(mx).max()), float(np.abs(my).max()))
        if moved <= WITHIN_TOLERANCE * scale:
            break
    return x, y


def recost(base: np.ndarray, overlap: np.ndarray, slowdown: float) -> np.ndarray:
    """Durations of compute with ``base`` duration when ``overlap`` of it runs beside transfers."""
    return base * (1.0 + (slowdown - 1.0) * overlap)


def base(measured: np.ndarray, overlap: np.ndarray, slowdown: float) -> np.ndarray:
    """Durations compute would have taken alone, from the ``measured`` ones and their overlap."""
    return measured / (1.0 + (slowdown - 1.0) * overlap)
