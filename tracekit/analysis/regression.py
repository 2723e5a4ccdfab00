"""Is the new run slower than the base, beyond a threshold and beyond the two runs' own spread? The CI gate of
``tracekit diff BASE NEW --fail-on-regression 5%`` (``Diff.regression``).

The rule. A run's iteration times are the job's, one per traced iteration (the slowest rank's window, as ``summary``
and the diff's ``iterations`` table report them); ``d`` = median(NEW) − median(BASE). Its spread comes from the runs'
own variation from iteration to iteration: each run's iterations are resampled with replacement (a bootstrap of
:data:`RESAMPLES` draws with a fixed seed, so the same two runs always get the same answer), and the 5th and 95th
percentiles of the resampled differences of medians are the 90 % interval ``[low, high]`` of ``d``. The spread is
``d − low``: how much of ``d`` the runs' own variation could account for. NEW has regressed when ``d`` is more than
``threshold × median(BASE)`` *and* more than the spread (the interval lies wholly above zero). A run with a single
traced iteration has no measurable spread: the gate then rests on the threshold alone and says so.

Why it grew comes from the diff's per-class figures (the breakdown's means per rank-iteration: compute, exposed
communication split into waiting — on which ranks — and transfer, memory, idle split into host-bound, sync and other).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from tracekit.model.diagnostics import TraceError
from tracekit.model.units import format_duration

__all__ = ["CONFIDENCE", "RESAMPLES", "Reason", "Regression", "gate", "parse_threshold"]

#: bootstrap draws of each run's iterations, and the seed that makes the interval reproducible
RESAMPLES = 2000
SEED = 0
#: the interval of the difference of medians the spread is read from
CONFIDENCE = 0.9
#: a class is named as a reason when it grew by at least this share of all the classes' growth
REASON_SHARE = 0.1

_CLASS_WORDS = {"compute": "compute", "overlapped": "overlapped compute and communication",
                "exposed_comm": "exposed communication", "memory": "memory copies", "idle": "idle time"}
_PARTS = {"exposed_comm": (("wait", "waiting"), ("transfer", "transfer")),
          "idle": (("host_bound", "host-bound"), ("sync", "synchronisation"), ("other_idle", "other"))}


def parse_threshold(value: str | float) -> float:
    """``"5%"`` or ``0.05`` (a share of BASE's median iteration) → 0.05. A bare number of 1 or more is refused:
    ``5`` could mean 5 % or 500 %."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        share = float(value)
    else:
        text = str(value).strip()
        m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*(%?)", text)
        if not m:
            raise TraceError(None, f"regression threshold {text!r}: write a percentage such as 5% (or 0.05)")
        share = float(m.group(1)) / (100.0 if m.group(2) else 1.0)
        if not m.group(2) and share >= 1:
            raise TraceError(None, f"regression threshold {text!r}: write {text}% for a percentage, or a share "
                                   "below 1 (0.05 = 5 %)")
    if not np.isfinite(share) or share < 0:
        raise TraceError(None, f"regression threshold {value!r}: must be 0 or more")
    return share


@dataclass(frozen=True)
class Reason:
    """A class of the breakdown that grew (per rank-iteration), with the parts that grew inside it."""

    cls: str
    base_ns: int
    new_ns: int
    delta_ns: int
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"class": self.cls, "base_ns": self.base_ns, "new_ns": self.new_ns, "delta_ns": self.delta_ns,
                "text": self.text}


@dataclass(frozen=True)
class Regression:
    """The gate's answer: the medians, their difference and its spread, the verdict and why."""

    threshold: float
    base_median_ns: int
    new_median_ns: int
    difference_ns: int
    #: the 90 % interval of the difference of medians (bootstrap over each run's iterations)
    interval_ns: tuple[int, int]
    #: difference − the interval's lower end: how much of the difference the runs' own variation could explain
    spread_ns: int
    base_iterations: int
    new_iterations: int
    regressed: bool
    text: str
    reasons: list[Reason] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def change(self) -> float:
        """The difference as a share of BASE's median iteration."""
        return self.difference_ns / self.base_median_ns

    @property
    def verdict(self) -> str:
        return "regression" if self.regressed else "pass"

    def to_dict(self) -> dict[str, Any]:
        """What ``tracekit diff --fail-on-regression … --json`` prints as ``gate``."""
        return {"threshold": self.threshold, "threshold_ns": round(self.threshold * self.base_median_ns),
                "base_median_ns": self.base_median_ns, "new_median_ns": self.new_median_ns,
                "difference_ns": self.difference_ns, "change": self.change, "spread_ns": self.spread_ns,
                "interval_ns": list(self.interval_ns), "confidence": CONFIDENCE,
                "spread_rule": f"bootstrap over each run's iterations ({RESAMPLES} resamples, seed {SEED}): "
                               "the difference of medians' 90 % interval; spread = difference - its lower end",
                "base_iterations": self.base_iterations, "new_iterations": self.new_iterations,
                "verdict": self.verdict, "regressed": self.regressed, "text": self.text,
                "reasons": [r.to_dict() for r in self.reasons], "notes": self.notes}


def interval(base_ns: np.ndarray, new_ns: np.ndarray) -> tuple[float, float]:
    """The :data:`CONFIDENCE` interval of median(new) − median(base), from a seeded bootstrap of each run."""
    rng = np.random.default_rng(SEED)
    mb = np.median(base_ns[rng.integers(0, base_ns.size, (RESAMPLES, base_ns.size))], axis=1)
    mn = np.median(new_ns[rng.integers(0, new_ns.size, (RESAMPLES, new_ns.size))], axis=1)
    tail = (1.0 - CONFIDENCE) / 2
    low, high = np.quantile(mn - mb, [tail, 1.0 - tail])
    return float(low), float(high)


def gate(base_ns: list[int] | np.ndarray, new_ns: list[int] | np.ndarray, threshold: float,
         breakdown: pl.DataFrame | None = None, waited_on: pl.DataFrame | None = None, *,
         base_name: str = "BASE", new_name: str = "NEW") -> Regression:
    """The :class:`Regression` of NEW's iteration times against BASE's (see the module docstring for the rule).
    ``breakdown`` (the diff's job rows: ``class, base_ns, new_ns, delta_ns``) and ``waited_on``
    (``straggler_rank, base_ns, new_ns, delta_ns``) say which classes grew."""
    a = np.asarray(base_ns, dtype=np.float64)
    b = np.asarray(new_ns, dtype=np.float64)
    for run, name in ((a, base_name), (b, new_name)):
        if run.size == 0:
            raise TraceError(None, f"{name} has no iteration to compare: the regression gate needs the iteration "
                                   "times of both runs")
    base_med, new_med = float(np.median(a)), float(np.median(b))
    if base_med <= 0:
        raise TraceError(None, f"{base_name}'s median iteration is 0 ns: nothing to compare with")
    d = new_med - base_med
    low, high = interval(a, b)
    spread = max(d - low, 0.0)
    notes = [f"{name} has one traced iteration: its run-to-run variation is unknown (profile more steps)"
             for run, name in ((a, base_name), (b, new_name)) if run.size == 1]
    limit = threshold * base_med
    regressed = bool(d > limit and d > spread)
    pct = f"{threshold * 100:.3g} %"
    change = f"{format_duration(base_med)} → {format_duration(new_med)} ({_signed(d)}, {_signed_share(d / base_med)})"
    bounds = f"90 % interval of the difference {_signed(low)} … {_signed(high)}"
    if regressed:
        text = (f"the median iteration went {change}, more than the {pct} threshold "
                f"({format_duration(limit)}) and than the runs' own spread ({format_duration(spread)}; {bounds})")
    elif d <= 0:
        text = f"the median iteration went {change}: not slower"
    elif d <= limit:
        text = f"the median iteration went {change}, within the {pct} threshold " \
               f"({format_duration(limit)})"
    else:
        text = (f"the median iteration went {change}, more than the {pct} threshold but within the "
                f"runs' own spread ({format_duration(spread)}; {bounds}): not told apart from noise")
    reasons = _reasons(breakdown, waited_on) if d > 0 and breakdown is not None else []
    return Regression(threshold=threshold, base_median_ns=round(base_med), new_median_ns=round(new_med),
                      difference_ns=round(d), interval_ns=(round(low), round(high)), spread_ns=round(spread),
                      base_iterations=int(a.size), new_iterations=int(b.size), regressed=regressed, text=text,
                      reasons=reasons, notes=notes)


def _signed_share(x: float) -> str:
    return ("+" if x >= 0 else "−") + f"{100 * abs(x):.1f} %"


def _signed(ns: float) -> str:
    return ("+" if ns >= 0 else "−") + format_duration(abs(ns))


def _reasons(breakdown: pl.DataFrame, waited_on: pl.DataFrame | None) -> list[Reason]:
    """The classes whose time per rank-iteration grew, largest first (those with at least :data:`REASON_SHARE` of
    the growth), each with the parts inside it that grew and, for waiting, the ranks waited on."""
    rows = {r["class"]: r for r in breakdown.iter_rows(named=True)}
    grew = [(c, rows[c]) for c in _CLASS_WORDS if c in rows and (rows[c]["delta_ns"] or 0) > 0]
    total = sum(r["delta_ns"] for _, r in grew)
    out = []
    for cls, r in sorted(grew, key=lambda x: -x[1]["delta_ns"]):
        if r["delta_ns"] < REASON_SHARE * total and out:
            continue
        parts = []
        for part, word in _PARTS.get(cls, ()):
            p = rows.get(part)
            if p is None or p["delta_ns"] is None or p["delta_ns"] <= 0:
                continue
            who = _waited_on(waited_on) if part == "wait" else ""
            parts.append(f"{word} {_signed(p['delta_ns'])}{who}")
        text = f"{_CLASS_WORDS[cls]} {_signed(r['delta_ns'])} per iteration ({format_duration(r['base_ns'])} → " \
               f"{format_duration(r['new_ns'])})"
        if parts:
            text += ": " + ", ".join(parts)
        out.append(Reason(cls=cls, base_ns=int(r["base_ns"]), new_ns=int(r["new_ns"]), delta_ns=int(r["delta_ns"]),
                          text=text))
    return out


def _waited_on(waited_on: pl.DataFrame | None) -> str:
    """``, on rank 1`` (``, on ranks 1 (70 %), 3 (30 %)``): the ranks whose lateness others waited for grew most,
    with their shares of that growth."""
    if waited_on is None or waited_on.height == 0:
        return ""
    grew = waited_on.filter(pl.col("delta_ns") > 0).sort("delta_ns", descending=True)
    if grew.height == 0:
        return ""
    total = grew.get_column("delta_ns").sum()
    top = [r for r in grew.iter_rows(named=True) if r["delta_ns"] >= REASON_SHARE * total][:3]
    if len(top) == 1:
        return f", on rank {top[0]['straggler_rank']}"
    return ", on ranks " + ", ".join(f"{r['straggler_rank']} ({100 * r['delta_ns'] / total:.0f} %)" for r in top)
