"""How sure a prediction is (DESIGN.md "Ranges"): every replay's iteration time as a point and a range meant to hold
the truth 9 times in 10, built from what is uncertain in this very trace.

Sources, each a relative deviation below and above the point, combined in quadrature (they are independent):

``variation``    run-to-run variation: a new run's median iteration differs from this one's by its iterations'
                 spread — a 90 % prediction interval of a median of as many iterations as were traced (Student's
                 t on the traced iterations' times; none from a single iteration, which says so)
``model``        the model's self-check: how far the replay of the job as it ran lands from the measured iteration
                 (what the dependency graph does not capture; it moves every prediction alike)
``sizes``        transfer sizes estimated from time: replayed again with every estimated size at its two bounds —
                 all of a transfer's time on the wire, or as much of it host work as the backend's hosts plausibly
                 spend (:data:`tracekit.analysis.graph.whatif.HOST_NS_PER_BYTE_MAX`)
``unexplained``  time no dependency explains, kept as measured by the replay: were it waiting on the link, it would
                 shrink with a faster one (one-sided, towards faster links and free communication)
``replay``       the replay's own error where a scenario changes the job: what the model leaves out shows only off
                 the measured point (on generated GPU jobs of known truth, ``benchmarks/gpu_truth.py``, it reached
                 0.8 %: :data:`REPLAY_ERROR`); no trace narrows it
``contention``   the contention fit's uncertainty: replayed with the fitted slowdown at the ends of its 90 %
                 interval (from its standard error), where the fit measured one (a slowdown the fit cannot tell from
                 none is none)

A ratio of two replays of the same trace (the scaling factor) keeps the sources that do not cancel between them.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from tracekit.analysis.graph import contention
from tracekit.analysis.graph.critical_path import UNEXPLAINED_EDGES, schedule_spans
from tracekit.analysis.graph.whatif import (
    HOST_NS_PER_BYTE_MAX,
    PARALLEL_REPLAYS,
    SIZE_ESTIMATED,
    Model,
    Scenario,
    iteration_time,
    recost_compute,
    schedule,
    sweep_rows,
    transfers,
    with_host_share,
)
from tracekit.model.units import format_duration

#: the share of the time a range is meant to hold the truth
COVERAGE = 0.90
#: two-sided 90 % quantiles of Student's t by degrees of freedom (beyond the table: the normal's 1.645)
T90 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771, 1.761, 1.753,
       1.746, 1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714, 1.711, 1.708, 1.706, 1.703, 1.701, 1.699, 1.697)
#: the normal's two-sided 90 % quantile
Z90 = 1.645
#: a median of n samples varies about this much more than their mean (its asymptotic relative efficiency, sqrt(pi/2))
MEDIAN_SPREAD = math.sqrt(math.pi / 2)
#: the replay's own error on a scenario that changes the job (relative, each side): on the generated GPU jobs of
#: known truth of ``benchmarks/gpu_truth.py`` (16-64 ranks, DDP and FSDP, four line rates, stragglers removed) the
#: replay's prediction is off the new run's truth by up to 0.8 % where the trace carries everything it needs
REPLAY_ERROR = 0.01
#: the sources, in the order they are shown
SOURCES = ("variation", "model", "replay", "sizes", "link", "unexplained", "contention")
#: what would narrow each source, for a verdict whose class the range leaves open
NARROWS: dict[str, str | None] = {"variation": "trace more steps", "model": "trace more steps", "replay": None,
           "sizes": "record shapes (tracekit.torch.profile sets record_shapes=True) or give the NCCL log",
           "link": "trace the job at a second line rate",
           "unexplained": "trace with stacks or give the NCCL log, so that the gaps' causes show",
           "contention": "trace more steps"}


def t90(dof: int) -> float:
    """Two-sided 90 % quantile of Student's t with ``dof`` degrees of freedom."""
    return T90[dof - 1] if 1 <= dof <= len(T90) else Z90


@dataclass(frozen=True)
class Range:
    """A prediction (ns) and its range; ``sources`` each source's relative deviation ``(below, above)`` (below ≤ 0 ≤
    above) — what the range is made of."""

    point: int
    low: int
    high: int
    sources: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def half_width(self) -> float:
        """Half the range's width relative to the point."""
        return (self.high - self.low) / 2 / self.point if self.point else 0.0

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def text(self) -> str:
        """``140 ms (132–151)``: the point, then the range in the point's unit."""
        return ranged_text(self.point, self.low, self.high)

    def as_dict(self) -> dict[str, Any]:
        return {"point_ns": self.point, "low_ns": self.low, "high_ns": self.high,
                "sources": {k: list(v) for k, v in self.sources.items()}}


def ranged_text(point: float, low: float, high: float) -> str:
    """``140 ms (132–151)``; the point alone where the range rounds to it."""
    p = format_duration(int(point))
    unit = p.split()[-1] if " " in p else ""
    lo, hi = format_duration(int(low)), format_duration(int(high))
    if lo == p == hi:
        return p
    if unit and lo.endswith(" " + unit) and hi.endswith(" " + unit):
        return f"{p} ({lo.removesuffix(' ' + unit)}–{hi.removesuffix(' ' + unit)})"
    return f"{p} ({lo}–{hi})"


def ratio_text(point: float, low: float, high: float, digits: int = 2) -> str:
    """``0.84 (0.79–0.88)``; the point alone where the range rounds to it."""
    p, lo, hi = (f"{v:.{digits}f}" for v in (point, low, high))
    return p if lo == p == hi else f"{p} ({lo}–{hi})"


@dataclass
class Uncertainty:
    """What is uncertain in one job's trace, found once (:func:`measure`) and applied to every scenario
    (:func:`predict`). ``notes`` say what the trace cannot tell."""

    model: Model
    iterations: int
    variation: float | None  # relative half-width of a new run's median iteration (None: one iteration)
    self_check: float  # the replay of the job as it ran against the measured iteration, relative
    replay_ns: int  # that replay's iteration time
    unexplained_ns: float  # per iteration, on the measured critical path
    size_models: tuple[Model, Model] | None = None
    link_models: tuple[Model, Model] | None = None
    contention_models: tuple[Model, Model] | None = None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"iterations": self.iterations, "variation": self.variation, "self_check": self.self_check,
                "replay_ns": self.replay_ns, "unexplained_ns": self.unexplained_ns,
                "sizes_bounded": self.size_models is not None,
                "contention_bounded": self.contention_models is not None, "notes": list(self.notes)}


#: a trace of at most this many iterations is short: every window counts for its spread, and a replay's iterations
#: (a period fewer) are too few to say more than the measured ones
SHORT = 4


def iteration_sample(breakdown: pa.Table) -> np.ndarray:
    """The traced iterations' times: per iteration the slowest rank's window (every rank waits for it), iterations
    seen on every rank only; the last one left out where more than :data:`SHORT` were traced (its window runs to its
    own last end, not to the next iteration's start: not quite a period like the others, but in a short trace one
    sample more is worth more than that bias)."""
    if breakdown.num_rows == 0:
        return np.zeros(0, np.int64)
    bd = pl.from_arrow(breakdown.select(["rank", "iteration", "wall_ns"]))
    assert isinstance(bd, pl.DataFrame)
    n = bd.get_column("rank").n_unique()
    per = (bd.group_by("iteration").agg(pl.col("wall_ns").max(), pl.col("rank").n_unique().alias("_n"))
           .filter(pl.col("_n") == n).sort("iteration"))
    out = per.get_column("wall_ns").to_numpy()
    return out[:-1] if out.size > SHORT else out


def variation(sample: np.ndarray, robust: bool = False) -> float | None:
    """Relative half-width of a 90 % prediction interval for a new run's median iteration, from ``sample`` (this
    run's iteration times): t · s · sqrt(2/n), s the relative spread (the standard deviation; from eight
    iterations on, the median absolute deviation's, which one odd iteration does not inflate), times the median's
    extra spread over a mean's. None for fewer than two iterations."""
    x = np.asarray(sample, dtype=np.float64)
    n = x.size
    if n < 2:
        return None
    centre = float(np.median(x))
    if centre <= 0:
        return None
    s = 1.4826 * float(np.median(np.abs(x - centre))) if n >= 8 or robust else float(x.std(ddof=1))
    return t90(n - 1) * s / centre * math.sqrt(2.0 / n) * MEDIAN_SPREAD


#: a gap no dependency explains that ends this close after its rank's communication ended may be an unrecorded
#: wait on it (a thread woken by the transfer's completion; more than the launch latency of the next call is not)
WAKE_NS = 100_000


def unexplained_after_comm(model: Model, segments: pl.DataFrame | None) -> float:
    """Per iteration (ns), the measured critical path's time no dependency explains that could be an unrecorded wait
    on communication: gaps that end within :data:`WAKE_NS` of the end of a transfer of their rank. A gap that ends
    anywhere else (a rank asleep, a data loader's untraced work, Python between calls) waits on nothing a link
    changes, and is kept as measured by every bound."""
    if segments is None or segments.height == 0 or model.comm.height == 0:
        return 0.0
    gaps = segments.filter((pl.col("label") == "idle") & pl.col("edge").is_in(UNEXPLAINED_EDGES))
    n = segments.get_column("iteration").n_unique()
    if gaps.height == 0 or n == 0:
        return 0.0
    ends = model.comm.get_column("node_end").to_numpy()
    crank = model.comm.get_column("rank").to_numpy().astype(np.int64)
    # one axis for every rank: rank-major, so that a search finds the same rank's latest end before a gap's end
    span = int(max(ends.max(), gaps.get_column("end_ns").max()) - min(ends.min(), gaps.get_column("end_ns").min())) + 2
    t0 = int(min(ends.min(), gaps.get_column("end_ns").min()))
    key = np.sort(crank * span + (ends - t0))
    g_end = gaps.get_column("end_ns").to_numpy()
    g_key = gaps.get_column("rank").to_numpy().astype(np.int64) * span + (g_end - t0)
    i = np.searchsorted(key, g_key, side="right") - 1
    prev = np.where(i >= 0, key[np.maximum(i, 0)], np.iinfo(np.int64).min)
    same_rank = (i >= 0) & (prev // span == g_key // span)
    woke = same_rank & (g_key - prev <= WAKE_NS)
    return float(gaps.get_column("dur_ns").to_numpy()[woke].sum()) / n


def measure(model: Model, breakdown: pa.Table, segments: pl.DataFrame | None = None,
            measured_ns: int | None = None, replay_ns: int | None = None) -> Uncertainty:
    """What is uncertain in the job's trace. ``segments`` are the measured critical path's (of some iterations);
    ``measured_ns`` is the measured iteration (the model's own figure unless given); ``replay_ns`` the replay of the
    job as it ran (replayed here unless given)."""
    sample = iteration_sample(breakdown)
    var = variation(sample)
    notes = []
    if var is None:
        notes.append("one traced iteration: how much iterations vary from run to run cannot be told (trace more "
                     "steps)")
    measured = measured_ns if measured_ns is not None else model.measured_iteration_ns
    replay_ns = replay_ns if replay_ns is not None else predict(model, Scenario())
    check = replay_ns / measured - 1 if measured > 0 else 0.0
    size_models = None
    if model.comm.height and (model.comm.get_column("size") == SIZE_ESTIMATED).any() \
            and HOST_NS_PER_BYTE_MAX.get(model.backend, 0.0) > 0:
        size_models = (with_host_share(model, 0.0), with_host_share(model, HOST_NS_PER_BYTE_MAX[model.backend]))
    link_models = None
    if model.comm.height and HOST_NS_PER_BYTE_MAX.get(model.backend, 0.0) > 0 and model.line_rate_known:
        link_models = (replace(model, host_share_max=0.0), replace(model, host_share_max=math.inf))
    con = model.contention
    contention_models = None
    if con.measured and con.standard_error is not None and con.standard_error > 0 and model.comm.height:
        centre = math.log(con.slowdown)
        lo = max(math.exp(centre - Z90 * con.standard_error), 1.0)
        hi = min(math.exp(centre + Z90 * con.standard_error), contention.SLOWDOWN_RANGE[1])
        if hi > lo:
            contention_models = (recost_compute(model, lo), recost_compute(model, hi))
    return Uncertainty(model=model, iterations=int(sample.size), variation=var, self_check=check,
                       replay_ns=int(replay_ns), unexplained_ns=unexplained_after_comm(model, segments),
                       size_models=size_models, link_models=link_models, contention_models=contention_models,
                       notes=notes)


def _changes_transfers(a: Model, b: Model, sc: Scenario) -> bool:
    """Whether ``sc`` re-costs some transfer differently under models ``a`` and ``b``."""
    if sc.free:
        return False
    try:
        return not np.array_equal(np.rint(transfers(a, sc)), np.rint(transfers(b, sc)))
    except ValueError:
        return False


def _bounds(point: float, values: list[float]) -> tuple[float, float]:
    """Relative deviation (below, above) of ``values`` around ``point``."""
    if point <= 0 or not values:
        return (0.0, 0.0)
    return (min(0.0, min(values) / point - 1), max(0.0, max(values) / point - 1))


def _comm_ratio(model: Model, sc: Scenario) -> float:
    """The scenario's transfer time over the job's as it ran (re-costed alike), all transfers together (0 with free
    communication)."""
    if sc.free:
        return 0.0
    try:
        base = float(transfers(model, Scenario()).sum())
        return float(transfers(model, sc).sum()) / base if base > 0 else 1.0
    except ValueError:
        return 1.0


@dataclass(frozen=True)
class Replays:
    """Every scenario's point, its iterations' times (``per_iteration``, in iteration order) and the alternative
    replays behind its range (``alternatives[source]``: the iteration times under that source's two bounds)."""

    scenarios: list[Scenario]
    points: list[int]
    per_iteration: list[np.ndarray]
    alternatives: list[dict[str, tuple[int, int]]]


def replay_all(unc: Uncertainty, scenarios: list[Scenario]) -> Replays:
    """The point replays of ``scenarios`` and the replays at the bounds of the sizes, the link's split and the
    contention fit, where a scenario depends on them (one batch of replays, run in parallel)."""
    model = unc.model
    jobs: list[tuple[Model, Scenario]] = [(model, sc) for sc in scenarios]
    where: list[dict[str, tuple[int, int]]] = [{} for _ in scenarios]
    for name, alts in (("sizes", unc.size_models), ("link", unc.link_models), ("contention", unc.contention_models)):
        if alts is None:
            continue
        for i, sc in enumerate(scenarios):
            if sc == Scenario():
                continue  # the job as it ran: the same under either bound
            if name in ("sizes", "link") and not (_changes_transfers(alts[0], model, sc) or
                                                  _changes_transfers(alts[1], model, sc)):
                continue
            where[i][name] = (len(jobs), len(jobs) + 1)
            jobs += [(alts[0], sc), (alts[1], sc)]
    done = _replay_jobs(jobs)
    times = [t for t, _ in done]
    alternatives = [{k: (times[a], times[b]) for k, (a, b) in w.items()} for w in where]
    return Replays(list(scenarios), times[:len(scenarios)], [p for _, p in done[:len(scenarios)]], alternatives)


def _replay_jobs(jobs: list[tuple[Model, Scenario]]) -> list[tuple[int, np.ndarray]]:
    """Each (model, scenario) replayed: its iteration time (:func:`tracekit.analysis.graph.whatif.predict`) and its
    iterations' times; on threads, as :func:`tracekit.analysis.graph.whatif.predict_many` runs them."""
    if jobs and jobs[0][0].remote is not None:  # the ranks' graphs held apart: their hosts replay every job
        return [(b.period(), _periods(b.spans())) for b in jobs[0][0].remote.replay(jobs)]

    def one(job: tuple[Model, Scenario]) -> tuple[int, np.ndarray]:
        m, sc = job
        times = schedule(m, sc).times
        return iteration_time(m, times), _periods(schedule_spans(m.iteration_of, times))

    workers = min(len(jobs), os.cpu_count() or 1, PARALLEL_REPLAYS)
    if workers < 2:
        return [one(j) for j in jobs]
    with ThreadPoolExecutor(workers, thread_name_prefix="tracekit-replay") as pool:
        return list(pool.map(one, jobs))


def _periods(spans: pl.DataFrame) -> np.ndarray:
    """From one iteration's start to the next's (the last iteration, to its own end, is not a period)."""
    return (spans.get_column("end_ns") - spans.get_column("start_ns")).to_numpy()[:-1]


def combine(point: int, sources: dict[str, tuple[float, float]]) -> Range:
    """A range from each source's relative deviation, in quadrature."""
    below = math.sqrt(sum(lo * lo for lo, _ in sources.values()))
    above = math.sqrt(sum(hi * hi for _, hi in sources.values()))
    return Range(point, round(point * max(1.0 - below, 0.0)), round(point * (1.0 + above)),
                 {k: v for k, v in sources.items() if v != (0.0, 0.0)})


def iteration_sources(unc: Uncertainty, sc: Scenario, point: int, alts: dict[str, tuple[int, int]],
                      per_iteration: np.ndarray | None = None) -> dict[str, tuple[float, float]]:
    """Each source's relative deviation of one scenario's predicted iteration. Run-to-run variation is the larger of
    the measured iterations' and the scenario's replayed iterations' (``per_iteration``): a scenario that takes the
    link off the critical path leaves the compute's own noise, which a link-bound job's measured iterations hide."""
    out: dict[str, tuple[float, float]] = {}
    replayed = variation(per_iteration, robust=True) if per_iteration is not None and \
        per_iteration.size >= SHORT else None
    v = max(unc.variation or 0.0, replayed or 0.0)
    if v:
        out["variation"] = (-v, v)
    if unc.self_check:
        out["model"] = (-abs(unc.self_check), abs(unc.self_check))
    if sc != Scenario():
        out["replay"] = (-REPLAY_ERROR, REPLAY_ERROR)
    for name in ("sizes", "link", "contention"):
        if name in alts:
            out[name] = _bounds(point, list(alts[name]))
    rho = _comm_ratio(unc.model, sc)
    if unc.unexplained_ns > 0 and rho < 1 and point > 0:
        out["unexplained"] = (-min(unc.unexplained_ns * (1 - rho) / point, 1.0), 0.0)
    return out


def predict(unc: Uncertainty, scenarios: list[Scenario]) -> list[Range]:
    """Each scenario's predicted iteration time and its range."""
    r = replay_all(unc, scenarios)
    return [combine(p, iteration_sources(unc, sc, p, alts, it))
            for sc, p, alts, it in zip(r.scenarios, r.points, r.alternatives, r.per_iteration, strict=True)]


def ratio_variation(num: np.ndarray, den: np.ndarray) -> float | None:
    """Relative half-width of a 90 % prediction interval for a ratio of two replays of the same trace, from its
    per-iteration values (the iterations' noise the two share cancels in it). Its spread is the median absolute
    deviation's at any count: a replay's first iteration starts from the trace's own state rather than from the
    replayed one before it, a transient of the replay, not of the job."""
    n = min(num.size, den.size)
    ok = den[:n] > 0
    if ok.sum() < 2:
        return None
    if ok.sum() < SHORT:  # too few periods for a robust spread of the ratio (the noise the two share cancels)
        return None
    return variation(num[:n][ok] / den[:n][ok], robust=True)


def ratio_range(unc: Uncertainty, num: tuple[Scenario, int, dict[str, tuple[int, int]], np.ndarray],
                den: tuple[Scenario, int, dict[str, tuple[int, int]], np.ndarray]) -> tuple[float, float, float]:
    """``num / den`` of two replays of the same trace (the scaling factor: free over predicted) and its range
    ``(point, low, high)``: the model's self-check cancels between them; run-to-run variation is the ratio's own
    across iterations; the bounds of sizes, the link's split and contention go together (the same bound in both);
    time no dependency explains shrinks in both at once."""
    (sn, pn, an, it_n), (sd, pd, ad, it_d) = num, den
    if pd <= 0:
        return (1.0, 1.0, 1.0)
    point = pn / pd
    sources: dict[str, tuple[float, float]] = {}
    v = ratio_variation(it_n, it_d)
    if v:
        sources["variation"] = (-v, v)
    if sn != Scenario() or sd != Scenario():  # the two replays' own errors need not cancel
        sources["replay"] = (-REPLAY_ERROR, REPLAY_ERROR)
    for name in ("sizes", "link", "contention"):
        if name in an or name in ad:
            a_n, b_n = an.get(name, (pn, pn))
            a_d, b_d = ad.get(name, (pd, pd))
            sources[name] = _bounds(point, [a_n / max(a_d, 1), b_n / max(b_d, 1)])
    if unc.unexplained_ns > 0:
        rn, rd = _comm_ratio(unc.model, sn), _comm_ratio(unc.model, sd)
        n2 = pn - unc.unexplained_ns * max(1 - rn, 0.0)
        d2 = pd - unc.unexplained_ns * max(1 - rd, 0.0)
        if n2 > 0 and d2 > 0:
            sources["unexplained"] = _bounds(point, [n2 / d2])
    rg = combine(1_000_000, sources)  # relative, on a fixed scale
    return (point, point * rg.low / 1_000_000, point * rg.high / 1_000_000)


def replace_model(unc: Uncertainty, model: Model) -> Uncertainty:
    """``unc`` for another model of the same trace (another per-call latency)."""
    return replace(unc, model=model)


#: the type of the ``range_sources`` column: each source's relative deviation below and above the point
SOURCES_DTYPE = pl.List(pl.Struct({"source": pl.String, "low": pl.Float64, "high": pl.Float64}))


def sweep(unc: Uncertainty, scenarios: list[Scenario]) -> pl.DataFrame:
    """:func:`tracekit.analysis.graph.whatif.sweep`'s rows with each prediction's range: ``iteration_ns_low/high``,
    ``speedup_low/high``, ``scaling_factor_low/high``, and ``range_sources`` (what the iteration's range is made of:
    each source's relative deviation, largest first)."""
    free_sc = Scenario(free=True)
    r = replay_all(unc, [free_sc, *scenarios])
    free, points, alts = r.points[0], r.points[1:], r.alternatives[1:]
    rows = sweep_rows(unc.model, scenarios, free, points)
    replayed = unc.model.replayed_iteration_ns
    lo, hi, s_lo, s_hi, f_lo, f_hi, sources = [], [], [], [], [], [], []
    for sc, p, a, it in zip(scenarios, points, alts, r.per_iteration[1:], strict=True):
        src = iteration_sources(unc, sc, p, a, it)
        rg = combine(p, src)
        _, flo, fhi = ratio_range(unc, (free_sc, free, r.alternatives[0], r.per_iteration[0]),
                                  (sc, p, a, it))
        lo.append(rg.low)
        hi.append(rg.high)
        # a speed-up is against the job replayed as measured: the model's self-check cancels in it
        up = combine(p, {k: v for k, v in src.items() if k != "model"})
        s_lo.append(replayed / up.high if up.high else math.inf)
        s_hi.append(replayed / up.low if up.low else math.inf)
        f_lo.append(min(flo, 1.0))
        f_hi.append(min(fhi, 1.0))
        sources.append(rg.sources)
    rows = rows.with_columns(pl.Series("iteration_ns_low", lo, dtype=pl.Int64),
                             pl.Series("iteration_ns_high", hi, dtype=pl.Int64),
                             pl.Series("speedup_low", s_lo, dtype=pl.Float64),
                             pl.Series("speedup_high", s_hi, dtype=pl.Float64),
                             pl.Series("scaling_factor_low", f_lo, dtype=pl.Float64),
                             pl.Series("scaling_factor_high", f_hi, dtype=pl.Float64),
                             pl.Series("range_sources", [_source_rows(x) for x in sources], dtype=SOURCES_DTYPE))
    order = ["bandwidth_bps", "compression", "workers", "efficiency", "links", "stragglers_removed", "iteration_ns",
             "iteration_ns_low", "iteration_ns_high", "speedup", "speedup_low", "speedup_high", "scaling_factor",
             "scaling_factor_low", "scaling_factor_high", "range_sources"]
    return rows.select(order)


def _source_rows(sources: dict[str, tuple[float, float]]) -> list[dict[str, Any]]:
    """``range_sources`` of one row: the sources, largest first."""
    return [{"source": k, "low": lo, "high": hi}
            for k, (lo, hi) in sorted(sources.items(), key=lambda kv: -max(-kv[1][0], kv[1][1]))]


def sources_of(rows: list[dict[str, Any]] | None) -> dict[str, tuple[float, float]]:
    """A ``range_sources`` value back as ``{source: (low, high)}``."""
    return {r["source"]: (r["low"], r["high"]) for r in rows or []}


def sources_text(sources: dict[str, tuple[float, float]]) -> str:
    """``variation ±12 %, sizes −3/+8 %``: what a range is made of, largest first."""
    def pct(x: float) -> str:
        return f"{100 * abs(x):.0f}" if abs(x) >= 0.01 else f"{100 * abs(x):.1f}"

    parts = []
    for name, (lo, hi) in sorted(sources.items(), key=lambda kv: -max(-kv[1][0], kv[1][1])):
        if max(-lo, hi) < 0.0005:  # rounds to nothing
            continue
        if math.isclose(-lo, hi, rel_tol=0.05):
            parts.append(f"{name} ±{pct(hi)} %")
        elif hi == 0:
            parts.append(f"{name} −{pct(lo)} %")
        elif lo == 0:
            parts.append(f"{name} +{pct(hi)} %")
        else:
            parts.append(f"{name} −{pct(lo)}/+{pct(hi)} %")
    return ", ".join(parts)
