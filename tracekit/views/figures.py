"""The data behind every picture of a job: one pure function per chart, returning plain polars tables (and a
small dataclass for the what-if curves). The HTML report (``tracekit report``, :mod:`tracekit.views.html_report`)
and the what-if plots of ``tracekit inspect`` draw these and compute nothing themselves; nothing here imports
a plotting library, so the figures are tested without one.

Times on a shared axis are on the job clock (a rank's own time plus its ``ranks.clock_offset_ns``), relative
to the job's origin: the earliest iteration start of any rank (:func:`origin_ns`).

- :func:`rank_breakdown` — per rank, the five attribution classes (stacked bars);
- :func:`iteration_times` — per rank and iteration, the window's wall time;
- :func:`link_activity` — per rank and time bin, how busy its link was (the ``link_active`` union of
  :mod:`tracekit.analysis.links`, binned);
- :func:`path_composition` — per iteration, what its critical path was spent on;
- :func:`collective_points` — per collective instance matched across ranks, its arrival skew and bus bandwidth;
- :func:`whatif_curves` — Zhang et al.'s curves: the scaling factor against the line rate and against the
  compression ratio, at the job's measured link efficiency and at full utilisation, with the measured point;
- :func:`verdicts` — the plain-language answers the terminal prints;
- :func:`collect` — all of them for one :class:`~tracekit.analysis.pipeline.Analysis`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
import pyarrow as pa

from tracekit.analysis.graph.critical_path import LABELS
from tracekit.model.schema import CLASSES
from tracekit.views.report import CLASS_LABELS, CLASS_STYLES, KIND_STYLES, PATH_STYLES

if TYPE_CHECKING:
    from tracekit.analysis.bottleneck import Bottleneck
    from tracekit.analysis.graph.whatif import Model
    from tracekit.analysis.pipeline import Analysis

#: line rates of the rate curve, as multiples of the rate the job ran on (1 is the measured point)
RATE_MULTIPLES: tuple[float, ...] = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)
#: line rates of the rate curve when the job's own is unknown (full utilisation only), bits/s
RATE_GRID_BPS: tuple[float, ...] = (1e8, 2.5e8, 1e9, 2.5e9, 1e10, 2.5e10, 1e11, 2e11, 4e11)
#: compression ratios of the compression curve (1 = none: the measured point)
COMPRESSIONS: tuple[float, ...] = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0, 32.0, 64.0)
#: time bins of the link activity chart
LINK_BINS = 200


def hex_colour(style: str) -> str:
    """The ``#rrggbb`` of a rich style's foreground colour (``"bold red1"`` → ``#ff0000``), as rich's default
    terminal theme shows it."""
    from rich.style import Style
    from rich.terminal_theme import DEFAULT_TERMINAL_THEME

    colour = Style.parse(style).color
    if colour is None:
        return "#808080"
    return colour.get_truecolor(DEFAULT_TERMINAL_THEME).hex


#: the attribution classes' colours (tracekit.views.report.CLASS_STYLES) as CSS colours
CLASS_COLOURS: dict[str, str] = {c: hex_colour(CLASS_STYLES[c]) for c in CLASSES}
#: the critical path's labels' colours (tracekit.views.report.PATH_STYLES) as CSS colours
PATH_COLOURS: dict[str, str] = {lab: hex_colour(PATH_STYLES[lab]) for lab in LABELS}
#: communication's colour on the timeline (tracekit.views.report.KIND_STYLES)
COMM_COLOUR: str = hex_colour(KIND_STYLES["comm"])


def _offsets(ranks: pa.Table | None) -> pl.DataFrame:
    """``rank, off``: each rank's clock offset (0 where unknown)."""
    if ranks is None or ranks.num_rows == 0:
        return pl.DataFrame(schema={"rank": pl.Int32, "off": pl.Int64})
    r = pl.from_arrow(ranks.select(["rank", "clock_offset_ns"]))
    assert isinstance(r, pl.DataFrame)
    return r.select(pl.col("rank").cast(pl.Int32), pl.col("clock_offset_ns").fill_null(0).cast(pl.Int64).alias("off"))


def origin_ns(iterations: pa.Table, ranks: pa.Table | None = None) -> int:
    """The job's time origin on the job clock: the earliest iteration start of any rank (0 without iterations)."""
    it = pl.from_arrow(iterations.select(["rank", "start_ns"]))
    assert isinstance(it, pl.DataFrame)
    if it.height == 0:
        return 0
    it = it.with_columns(pl.col("rank").cast(pl.Int32)).join(_offsets(ranks), on="rank", how="left")
    return int(it.select((pl.col("start_ns") + pl.col("off").fill_null(0)).min()).item())


def rank_breakdown(breakdown: pa.Table) -> pl.DataFrame:
    """Per rank and attribution class (in :data:`tracekit.model.schema.CLASSES` order): ``rank, cls, label, ns,
    share`` — the class's time summed over the rank's windows and its share of the rank's wall time."""
    b = pl.from_arrow(breakdown.select(["rank", "wall_ns", *[f"{c}_ns" for c in CLASSES]]))
    assert isinstance(b, pl.DataFrame)
    schema = {"rank": pl.Int32, "cls": pl.String, "label": pl.String, "ns": pl.Int64, "share": pl.Float64}
    if b.height == 0:
        return pl.DataFrame(schema=schema)
    per = b.group_by("rank").agg(pl.col("wall_ns").sum(), *[pl.col(f"{c}_ns").sum() for c in CLASSES])
    parts = [per.select(pl.col("rank").cast(pl.Int32), pl.lit(c).alias("cls"), pl.lit(CLASS_LABELS[c]).alias("label"),
                        pl.col(f"{c}_ns").cast(pl.Int64).alias("ns"),
                        pl.when(pl.col("wall_ns") > 0).then(pl.col(f"{c}_ns") / pl.col("wall_ns")).otherwise(0.0)
                        .alias("share"))
             for c in CLASSES]
    order = {c: i for i, c in enumerate(CLASSES)}
    return (pl.concat(parts).with_columns(pl.col("cls").replace_strict(order, return_dtype=pl.Int32).alias("_o"))
            .sort(["rank", "_o"]).drop("_o").cast(schema))  # type: ignore[arg-type]


def iteration_times(breakdown: pa.Table) -> pl.DataFrame:
    """Per rank and iteration: ``rank, iteration, wall_ns`` (the window's length), by rank then iteration."""
    b = pl.from_arrow(breakdown.select(["rank", "iteration", "wall_ns"]))
    assert isinstance(b, pl.DataFrame)
    return b.select(pl.col("rank").cast(pl.Int32), pl.col("iteration").cast(pl.Int64),
                    pl.col("wall_ns").cast(pl.Int64)).sort(["rank", "iteration"])


def link_intervals(events: pa.Table, instances: pa.Table | None = None,
                   members: pa.Table | None = None) -> pl.DataFrame:
    """The intervals a rank's link was active, on its own clock: ``rank, start_ns, end_ns`` — transfer time of
    collectives matched across ranks (waiting left out), all communication time elsewhere; the intervals whose
    union is the breakdown's ``link_active_ns``."""
    from tracekit.analysis import collectives
    from tracekit.analysis.attribution import TRANSFER, UNSPLIT

    ev = pl.from_arrow(events.select(["rank", "kind", "start_ns", "dur_ns"]))
    assert isinstance(ev, pl.DataFrame)
    comm = ev.filter(pl.col("kind").cast(pl.String) == "comm").select(
        pl.col("rank").cast(pl.Int32), "start_ns", (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"))
    if members is None or instances is None or members.num_rows == 0 or instances.num_rows == 0:
        return comm
    matching = collectives.Matching(instances=instances, members=members, clocks=pl.DataFrame())
    if not matching.matched:
        return comm
    split = collectives.comm_split(events, matching)
    return split.filter(pl.col("cls").is_in([TRANSFER, UNSPLIT])).select(
        pl.col("rank").cast(pl.Int32), "start_ns", "end_ns")


def link_activity(events: pa.Table, iterations: pa.Table, ranks: pa.Table | None = None,
                  instances: pa.Table | None = None, members: pa.Table | None = None,
                  bins: int = LINK_BINS) -> pl.DataFrame:
    """Per rank and time bin, how busy its link was: ``rank, bin, start_ns, end_ns, busy_ns, busy_share``.

    The job's span (first iteration start to last iteration end of any rank, job clock) is cut into ``bins``
    equal bins; ``start_ns``/``end_ns`` are relative to :func:`origin_ns`; ``busy_ns`` is the union of the rank's
    :func:`link_intervals` inside the bin (so the link is idle ``1 - busy_share`` of it)."""
    from tracekit.analysis.intervals import union_length

    schema = {"rank": pl.Int32, "bin": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64, "busy_ns": pl.Int64,
              "busy_share": pl.Float64}
    it = pl.from_arrow(iterations.select(["rank", "start_ns", "end_ns"]))
    assert isinstance(it, pl.DataFrame)
    if it.height == 0 or bins < 1:
        return pl.DataFrame(schema=schema)
    off = _offsets(ranks)
    it = it.with_columns(pl.col("rank").cast(pl.Int32)).join(off, on="rank", how="left").with_columns(
        pl.col("off").fill_null(0))
    t0 = int(it.select((pl.col("start_ns") + pl.col("off")).min()).item())
    t1 = int(it.select((pl.col("end_ns") + pl.col("off")).max()).item())
    if t1 <= t0:
        return pl.DataFrame(schema=schema)
    edges = t0 + np.rint(np.linspace(0, t1 - t0, bins + 1)).astype(np.int64)
    edges = np.unique(edges)
    n_bins = edges.size - 1
    rank_ids = np.array(sorted(set(it.get_column("rank").to_list())), dtype=np.int64)
    active = link_intervals(events, instances, members).join(off, on="rank", how="left").with_columns(
        (pl.col("start_ns") + pl.col("off").fill_null(0)).alias("s"), (pl.col("end_ns") + pl.col("off").fill_null(0))
        .alias("e"))
    win_rank = np.repeat(rank_ids, n_bins)
    win_start = np.tile(edges[:-1], rank_ids.size)
    win_end = np.tile(edges[1:], rank_ids.size)
    busy = union_length(active.get_column("rank").to_numpy().astype(np.int64), active.get_column("s").to_numpy(),
                        active.get_column("e").to_numpy(), win_rank, win_start, win_end) if active.height else \
        np.zeros(win_rank.size, dtype=np.int64)
    width = win_end - win_start
    return pl.DataFrame({
        "rank": win_rank.astype(np.int32), "bin": np.tile(np.arange(n_bins), rank_ids.size),
        "start_ns": win_start - t0, "end_ns": win_end - t0, "busy_ns": busy.astype(np.int64),
        "busy_share": np.where(width > 0, busy / np.maximum(width, 1), 0.0),
    }, schema=schema)


def path_composition(summary: pl.DataFrame) -> pl.DataFrame:
    """Per iteration and critical-path label (in :data:`tracekit.analysis.graph.critical_path.LABELS` order):
    ``iteration, label, ns, share`` — the time of the iteration's critical path spent so (its shares of ``path_ns``)."""
    schema = {"iteration": pl.Int64, "label": pl.String, "ns": pl.Int64, "share": pl.Float64}
    if summary.height == 0:
        return pl.DataFrame(schema=schema)
    parts = [summary.select(pl.col("iteration").cast(pl.Int64), pl.lit(lab).alias("label"),
                            (pl.col(f"{lab}_share") * pl.col("path_ns")).round().cast(pl.Int64).alias("ns"),
                            pl.col(f"{lab}_share").cast(pl.Float64).alias("share"))
             for lab in LABELS]
    order = {lab: i for i, lab in enumerate(LABELS)}
    return (pl.concat(parts).with_columns(pl.col("label").replace_strict(order, return_dtype=pl.Int32).alias("_o"))
            .sort(["iteration", "_o"]).drop("_o"))


def collective_points(instances: pa.Table, origin: int = 0) -> pl.DataFrame:
    """One row per collective instance matched across ranks (two members or more): ``instance, op, pg,
    iteration, t_ns`` (first arrival, relative to ``origin`` on the job clock), ``skew_ns, busbw_gbps, bytes,
    straggler_rank``, in time order. ``busbw_gbps`` is null where the size or the transfer is unknown."""
    cols = ["instance", "op", "pg", "iteration", "first_start_ns", "skew_ns", "busbw_gbps", "bytes",
            "straggler_rank", "ranks"]
    i = pl.from_arrow(instances.select(cols))
    assert isinstance(i, pl.DataFrame)
    return (i.filter(pl.col("ranks").list.len() >= 2)
            .select("instance", pl.col("op").fill_null("?"), "pg", "iteration",
                    (pl.col("first_start_ns") - origin).alias("t_ns"), "skew_ns", "busbw_gbps", "bytes",
                    "straggler_rank")
            .sort("t_ns"))


@dataclass(frozen=True)
class Curves:
    """Zhang et al.'s what-if curves of one job (:func:`whatif_curves`).

    ``by_rate``: ``efficiency, scale, bandwidth_bps, iteration_ns, scaling_factor`` — the line rate as a multiple
    of each link's own (``scale``) and, when the job has one rate, in bits/s (NaN otherwise). ``by_compression``:
    ``efficiency, compression, iteration_ns, scaling_factor`` at the job's own line rate. ``efficiency`` is
    ``measured`` (the link as efficient as the job used it) or ``full`` (the whole line rate). The measured point
    is ``(line_rate_bps, measured_scaling)`` on the first and ``(1, measured_scaling)`` on the second; ``notes``
    say why a curve is missing or what it assumes."""

    by_rate: pl.DataFrame
    by_compression: pl.DataFrame
    line_rate_bps: float | None
    measured_iteration_ns: int
    free_ns: int
    measured_scaling: float
    target: float = 0.9
    notes: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        """True when neither curve has a point."""
        return self.by_rate.height == 0 and self.by_compression.height == 0


_RATE_SCHEMA = {"efficiency": pl.String, "scale": pl.Float64, "bandwidth_bps": pl.Float64, "iteration_ns": pl.Int64,
                "scaling_factor": pl.Float64}
_COMPRESSION_SCHEMA = {"efficiency": pl.String, "compression": pl.Float64, "iteration_ns": pl.Int64,
                       "scaling_factor": pl.Float64}


class Cancelled(Exception):
    """:func:`whatif_curves` was asked to stop."""


def whatif_curves(model: Model, bottleneck: Bottleneck | None = None, *,
                  rate_multiples: Sequence[float] = RATE_MULTIPLES, rate_grid_bps: Sequence[float] = RATE_GRID_BPS,
                  compressions: Sequence[float] = COMPRESSIONS,
                  cancelled: Callable[[], bool] = lambda: False) -> Curves:
    """The scaling factor (iteration time with free communication / predicted) against the line rate and
    against the compression ratio, each at the measured efficiency and at full utilisation of the link
    (:func:`tracekit.analysis.graph.whatif.predict` for every point; ``bottleneck`` saves the two replays it already
    made).

    With the job's line rate known the rate curve runs over ``rate_multiples`` of it; without, only at full
    utilisation over the absolute ``rate_grid_bps`` (a note says so) and the measured point has no place on that
    axis. A curve the model cannot cost (sizes unknown, no line rate) is left empty with a note. Raises
    :class:`Cancelled` as soon as ``cancelled()`` is true (checked before every replay)."""
    from tracekit.analysis.graph.whatif import Scenario, predict

    def run(sc: Scenario) -> int:
        if cancelled():
            raise Cancelled
        return predict(model, sc)

    free = bottleneck.free_ns if bottleneck is not None else run(Scenario(free=True))
    measured = bottleneck.measured_ns if bottleneck is not None else run(Scenario())
    target = bottleneck.target if bottleneck is not None else 0.9
    notes: list[str] = []
    rate_known = model.line_rate_known
    single = model.line_rate_bps if rate_known else None

    def sf(t: int) -> float:
        return free / t if t > 0 else 1.0

    rate_rows: list[dict[str, Any]] = []
    comp_rows: list[dict[str, Any]] = []
    try:
        if rate_known:
            for eff in ("measured", "full"):
                for m in rate_multiples:
                    t = measured if eff == "measured" and m == 1.0 else run(Scenario(bandwidth_scale=m, efficiency=eff))
                    rate_rows.append({"efficiency": eff, "scale": m,
                                      "bandwidth_bps": single * m if single else math.nan, "iteration_ns": t,
                                      "scaling_factor": sf(t)})
        else:
            notes.append("the line rate the job ran on is unknown (--link-bw): the rate curve assumes full "
                         "utilisation of each rate, and the measured point has no place on it")
            for r in rate_grid_bps:
                t = run(Scenario(bandwidth_bps=r, efficiency="full"))
                rate_rows.append({"efficiency": "full", "scale": math.nan, "bandwidth_bps": r, "iteration_ns": t,
                                  "scaling_factor": sf(t)})
    except ValueError as exc:  # sizes unknown (UnknownSizes) or a rate nobody gave
        rate_rows = []
        notes.append(f"no line-rate curve: {exc}")
    try:
        for eff in ("measured", "full") if rate_known else ("measured",):
            for c in compressions:
                t = measured if eff == "measured" and c == 1.0 else run(Scenario(compression=c, efficiency=eff))
                comp_rows.append({"efficiency": eff, "compression": c, "iteration_ns": t, "scaling_factor": sf(t)})
    except ValueError as exc:
        comp_rows = []
        notes.append(f"no compression curve: {exc}")
    if bottleneck is not None and bottleneck.assumption:
        notes.append(bottleneck.assumption)
    return Curves(by_rate=pl.DataFrame(rate_rows, schema=_RATE_SCHEMA),
                  by_compression=pl.DataFrame(comp_rows, schema=_COMPRESSION_SCHEMA),
                  line_rate_bps=single, measured_iteration_ns=measured, free_ns=free, measured_scaling=sf(measured),
                  target=target, notes=notes)


def verdicts(analysis: Analysis) -> dict[str, str | None]:
    """The plain-language answers ``tracekit summary`` prints: the job's one verdict (``headline``, its ``kind`` and
    ``answer``: the support and caveat after the headline; :attr:`tracekit.analysis.pipeline.Analysis.verdict`),
    ``paragraph`` (the measurements: :func:`tracekit.views.verdict.paragraph`) and ``bottleneck`` (the link
    replays' answer, None without one)."""
    from tracekit.views import summary, verdict

    job = summary.job(analysis.breakdown, analysis.ranks)
    answer = analysis.verdict
    para = verdict.paragraph(job, summary.stragglers(analysis.instances),
                             summary.collectives_overview(analysis.instances),
                             line_rate_bps=analysis.line_rate_bps, line_rate_source=analysis.line_rate_source,
                             n_ranks=analysis.ranks.num_rows, sizes=summary.transfer_sizes(analysis.collectives),
                             link_classes=analysis.link_busy.to_pylist())
    b = analysis.bottleneck
    return {"headline": answer.headline, "kind": answer.kind,
            "answer": " ".join([*answer.support, *([answer.caveat] if answer.caveat else [])]) or None,
            "paragraph": para, "bottleneck": b.text if b is not None else None}


@dataclass
class ReportData:
    """Everything the HTML report shows, computed (:func:`collect`)."""

    title: str
    facts: list[tuple[str, str]]  # (what, value) lines of the report's header
    verdicts: dict[str, str | None]
    rank_breakdown: pl.DataFrame
    iteration_times: pl.DataFrame
    link_activity: pl.DataFrame
    path_composition: pl.DataFrame
    collectives: pl.DataFrame
    curves: Curves | None
    line_rate_bps: float | None
    notes: list[str] = field(default_factory=list)


def _shown_path(path: str) -> str:
    """``path`` relative to the working directory when it lies under it."""
    import os

    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive
        return path
    return path if rel.startswith("..") else rel


def _listed(names: Sequence[str], most: int) -> str:
    return ", ".join(names) if len(names) <= most else f"{', '.join(names[:most])} and {len(names) - most} more"


def collect(analysis: Analysis, *, inputs: Sequence[str] | None = None, bins: int = LINK_BINS) -> ReportData:
    """Every figure of :class:`ReportData` for ``analysis`` (builds the dependency graph and replays it for the
    critical path and the what-if curves, as ``tracekit critical-path`` and ``tracekit whatif`` do); ``inputs``
    are the paths as the user gave them (the title), else the trace files."""
    from tracekit.model.units import format_rate
    from tracekit.views import summary
    from tracekit.views.report import fmt_ns

    job = summary.job(analysis.breakdown, analysis.ranks)
    origin = origin_ns(analysis.iterations, analysis.ranks)
    graph_ok = not analysis.horovod_only and (analysis.dataset is None or analysis.rank_graphs is not None)
    paths = path_composition(analysis.critical_path_summary) if graph_ok else path_composition(pl.DataFrame())
    bottleneck = analysis.bottleneck if graph_ok else None
    curves = whatif_curves(analysis.whatif, bottleneck) if bottleneck is not None else None
    files = [_shown_path(f.path) for f in analysis.traces.files]
    named = [_shown_path(p) for p in inputs] if inputs else files
    rate = analysis.line_rate_bps
    facts = [("inputs", _listed(files, 8)), ("ranks", str(job.get("ranks", 0))),
             ("iterations", str(job.get("iterations", 0)))]
    if job.get("median_iteration_ns") is not None:
        facts.append(("median iteration", fmt_ns(job["median_iteration_ns"])))
    source = "" if analysis.line_rate_source == "given" else f" ({analysis.line_rate_source})"
    facts.append(("line rate", format_rate(rate) + source if rate else "unknown (give --link-bw)"))
    return ReportData(
        title="tracekit report: " + _listed(named, 3), facts=facts, verdicts=verdicts(analysis),
        rank_breakdown=rank_breakdown(analysis.breakdown), iteration_times=iteration_times(analysis.breakdown),
        link_activity=link_activity(analysis.events, analysis.iterations, analysis.ranks, analysis.instances,
                                    analysis.members, bins=bins),
        path_composition=paths, collectives=collective_points(analysis.instances, origin), curves=curves,
        line_rate_bps=rate, notes=list(analysis.notes))
