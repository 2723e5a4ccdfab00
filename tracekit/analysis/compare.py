"""Two runs of the same job side by side: the comparison of two :class:`~tracekit.analysis.pipeline.Analysis`
results, which the views draw (:func:`tracekit.views.report.diff_renderables`) for ``tracekit diff BASE NEW`` and
the Diff tab of ``tracekit inspect BASE --diff NEW``, and the API offers (``tracekit.diff(a, b)``, ``job.diff(other)``:
:mod:`tracekit.diff`, which loads the runs and adds each one's verdict).

Runs rarely profile the same number of iterations, so everything is compared *per iteration*: a rank's
figure is its total over its iteration windows divided by its number of windows; the job's is the total
over every rank's windows divided by their number (the mean rank-iteration). Iteration time is the median
window (per rank) or the median of the per-iteration maximum over ranks (the job, as ``summary`` reports it).

Tables (polars DataFrames, one row per scope: ``rank`` null for the whole job, then every rank present in
both runs):

``iterations``     windows, median and mean iteration time of each run, the change
``breakdown``      per iteration: wall and every class of the breakdown (compute, overlapped, exposed_comm
                   with its wait and transfer, memory, idle with its host-bound / sync / other split), and
                   its share of the iteration, in each run
``comm``           per op: calls per iteration, bytes per call, bytes per iteration, achieved bus bandwidth,
                   waiting and transfer per iteration, in each run (an op missing from a run: 0 calls)
``ops``            the kernels / CPU operators whose time per iteration changed most, matched by kind and name
                   (the ops :mod:`tracekit.analysis.top_ops` lists; largest change first, ``top`` of them per scope)
``critical_path``  the critical path's composition per iteration: time and share per label in each run
                   (job only; empty when a run was analysed rank by rank)
``waited_on``      per rank that others waited for (the straggler of the matched collectives): the waiting per
                   rank-iteration it caused in each run

plus each run's job iteration times (``base_iteration_ns``, ``new_iteration_ns``: one per iteration, the slowest
rank's window), from which ``Diff.regression`` decides whether NEW is slower beyond a threshold and beyond the
runs' own spread (:mod:`tracekit.analysis.regression`, the CI gate of ``tracekit diff --fail-on-regression``),

and each run's verdict (a :class:`tracekit.Verdict`, set by the API) and notes on what could not be compared.
Every figure here comes from the analysis' tables (the breakdown, the collectives, :mod:`tracekit.analysis.top_ops`,
:mod:`tracekit.analysis.idle` and :mod:`tracekit.analysis.graph.critical_path`): the diff only lines them up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import polars as pl
import pyarrow as pa

from tracekit.analysis.graph.critical_path import LABELS

if TYPE_CHECKING:
    from tracekit.analysis.pipeline import Analysis
    from tracekit.analysis.regression import Regression

__all__ = ["BREAKDOWN_ROWS", "TOP", "Diff", "Verdict", "compare"]

#: the rows of the ``breakdown`` table, in display order
BREAKDOWN_ROWS = ("wall", "compute", "overlapped", "exposed_comm", "wait", "transfer", "memory", "idle",
                  "host_bound", "sync", "other_idle")
#: how many changed ops each scope keeps
TOP = 20
_SCOPE = pl.Int32


class Verdict(Protocol):
    """What a :class:`Diff` needs of each run's verdict (a :class:`tracekit.Verdict`): its answer and its
    ``tracekit diff --json`` form."""

    text: str

    def to_dict(self) -> dict[str, Any]: ...


@dataclass
class Diff:
    """The comparison of two runs (``base`` → ``new``); see the module docstring for the tables."""

    base: str
    new: str
    iterations: pl.DataFrame
    breakdown: pl.DataFrame
    comm: pl.DataFrame
    ops: pl.DataFrame
    critical_path: pl.DataFrame
    base_verdict: Verdict | None
    new_verdict: Verdict | None
    base_ranks: int = 0
    new_ranks: int = 0
    #: ranks present in both runs (per-rank rows exist for these)
    ranks: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    waited_on: pl.DataFrame = field(default_factory=pl.DataFrame)
    #: each run's job iteration times, in iteration order (the slowest rank's window of each iteration)
    base_iteration_ns: list[int] = field(default_factory=list)
    new_iteration_ns: list[int] = field(default_factory=list)

    def job(self, name: str) -> pl.DataFrame:
        """The whole-job rows (``rank`` null) of table ``name``."""
        t: pl.DataFrame = getattr(self, name)
        return t.filter(pl.col("rank").is_null()) if "rank" in t.columns else t

    def rank(self, name: str, rank: int) -> pl.DataFrame:
        """The rows of table ``name`` for one rank."""
        t: pl.DataFrame = getattr(self, name)
        return t.filter(pl.col("rank") == rank)

    def tables(self) -> dict[str, pl.DataFrame]:
        return {"iterations": self.iterations, "breakdown": self.breakdown, "comm": self.comm, "ops": self.ops,
                "critical_path": self.critical_path, "waited_on": self.waited_on}

    def regression(self, threshold: float | str = 0.05) -> Regression:
        """Is the new run slower than the base by more than ``threshold`` (a share of the base's median iteration,
        ``0.05`` or ``"5%"``) and by more than the two runs' own spread? The answer of ``tracekit diff
        --fail-on-regression``, with which classes grew (``tracekit.analysis.regression`` says the rule)."""
        from tracekit.analysis import regression

        return regression.gate(self.base_iteration_ns, self.new_iteration_ns, regression.parse_threshold(threshold),
                               self.job("breakdown"), self.waited_on, base_name=self.base, new_name=self.new)

    def to_dict(self) -> dict[str, Any]:
        """Everything as plain Python (what ``tracekit diff --json`` prints)."""

        def verdict(v: Verdict | None) -> dict[str, Any] | None:
            return None if v is None else v.to_dict()

        return {"base": self.base, "new": self.new, "base_ranks": self.base_ranks, "new_ranks": self.new_ranks,
                "ranks": self.ranks, **{k: v.to_dicts() for k, v in self.tables().items()},
                "base_verdict": verdict(self.base_verdict), "new_verdict": verdict(self.new_verdict),
                "notes": self.notes}

    def __repr__(self) -> str:
        it = self.job("iterations")
        line = ""
        if it.height:
            r = it.row(0, named=True)
            line = f": median iteration {r['base_median_ns']} ns -> {r['new_median_ns']} ns"
        return f"tracekit.Diff({self.base!r} -> {self.new!r}{line})"


def compare(base: Analysis, new: Analysis, *, base_name: str = "base", new_name: str = "new",
            top: int = TOP) -> Diff:
    """The :class:`Diff` of two analysed runs, named ``base_name`` and ``new_name`` in its notes; without verdicts
    (the API adds them: :func:`tracekit.api.compare`). The critical paths are compared where both runs were
    analysed in memory."""
    a, b = base, new
    ra = set(a.breakdown.column("rank").to_pylist())
    rb = set(b.breakdown.column("rank").to_pylist())
    both = sorted(ra & rb)
    notes: list[str] = []
    if ra != rb:
        notes.append(f"the runs have different ranks ({len(ra)} in {base_name}, {len(rb)} in {new_name}): per-rank "
                     f"rows only for the {len(both)} in both" if both else
                     f"the runs share no rank ({len(ra)} in {base_name}, {len(rb)} in {new_name}): the job only")
    for run, name in ((a, base_name), (b, new_name)):
        if run.breakdown.num_rows == 0:
            notes.append(f"{name} has no iteration window to compare (a Horovod timeline alone?)")
    paths = pl.DataFrame()
    if a.breakdown.num_rows and b.breakdown.num_rows:
        paths = critical_path_rows(a.critical_path, b.critical_path)
    return Diff(
        base=base_name, new=new_name,
        iterations=_pair(iteration_rows(a.breakdown), iteration_rows(b.breakdown), ["rank"], both),
        breakdown=_pair(breakdown_rows(a.breakdown, a.idle_breakdown), breakdown_rows(b.breakdown, b.idle_breakdown),
                        ["rank", "class"], both, order=("class", BREAKDOWN_ROWS)),
        comm=_pair(comm_rows(a), comm_rows(b), ["rank", "op"], both, fill={"calls_per_iteration": 0.0}),
        ops=changed_ops(op_rows(a.op_totals, a.breakdown), op_rows(b.op_totals, b.breakdown), both, top),
        critical_path=paths, base_verdict=None, new_verdict=None,
        base_ranks=len(ra), new_ranks=len(rb), ranks=both, notes=notes,
        waited_on=waited_on_rows(waits(a), waits(b)),
        base_iteration_ns=iteration_times(a.breakdown), new_iteration_ns=iteration_times(b.breakdown))


# ---------------------------------------------------------------------------------------------------
# one run's figures, per scope (rank null = the job)


def _frame(t: pa.Table | pl.DataFrame) -> pl.DataFrame:
    out = pl.from_arrow(t) if isinstance(t, pa.Table) else t
    assert isinstance(out, pl.DataFrame)
    return out


def _job_scope(df: pl.DataFrame) -> pl.DataFrame:
    return df.with_columns(pl.lit(None, dtype=_SCOPE).alias("rank"))


def iteration_rows(breakdown: pa.Table) -> pl.DataFrame:
    """``rank, windows, median_ns, mean_ns``: per rank its windows' wall time; the job's from the iteration
    times (the slowest rank's window of each iteration)."""
    b = _frame(breakdown)
    cols = {"rank": _SCOPE, "windows": pl.Int64, "median_ns": pl.Int64, "mean_ns": pl.Int64}
    if b.height == 0:
        return pl.DataFrame(schema=cols)
    per = b.group_by("rank").agg(pl.len().cast(pl.Int64).alias("windows"),
                                 pl.col("wall_ns").median().round().cast(pl.Int64).alias("median_ns"),
                                 pl.col("wall_ns").mean().round().cast(pl.Int64).alias("mean_ns"))
    its = b.group_by("iteration").agg(pl.col("wall_ns").max())
    job = pl.DataFrame({"windows": [b.height], "median_ns": [int(its.get_column("wall_ns").median() or 0)],
                        "mean_ns": [round(float(its.get_column("wall_ns").mean() or 0))]})
    return pl.concat([_job_scope(job), per.with_columns(pl.col("rank").cast(_SCOPE))], how="diagonal_relaxed") \
        .select(list(cols)).cast(cols)  # type: ignore[arg-type]


def iteration_times(breakdown: pa.Table) -> list[int]:
    """The job's time of each iteration, in iteration order: the slowest rank's window (the times whose median
    ``iteration_rows`` reports for the job)."""
    b = _frame(breakdown)
    if b.height == 0:
        return []
    return b.group_by("iteration").agg(pl.col("wall_ns").max()).sort("iteration").get_column("wall_ns").to_list()


def waits(analysis: Any) -> pl.DataFrame:
    """``straggler_rank, ns``: per rank that others waited for (the last to arrive at a matched collective), the
    waiting it caused per rank-iteration (the members' ``wait_ns`` inside the iteration windows)."""
    b = _frame(analysis.breakdown)
    cols = {"straggler_rank": pl.Int32, "ns": pl.Int64}
    if b.height == 0:
        return pl.DataFrame(schema=cols)
    win = b.select(pl.col("rank").cast(pl.Int32), "iteration")
    inst = _frame(analysis.instances).select("instance", "iteration", "straggler_rank") \
        .filter(pl.col("straggler_rank").is_not_null())
    m = _frame(analysis.members).select("instance", pl.col("rank").cast(pl.Int32), "wait_ns") \
        .join(inst, on="instance", how="inner").join(win, on=["rank", "iteration"], how="semi") \
        .filter(pl.col("rank") != pl.col("straggler_rank"))
    return m.group_by("straggler_rank").agg((pl.col("wait_ns").sum() / b.height).round().alias("ns")) \
        .cast(cols).sort("straggler_rank")  # type: ignore[arg-type]


def waited_on_rows(a: pl.DataFrame, b: pl.DataFrame) -> pl.DataFrame:
    """``straggler_rank, base_ns, new_ns, delta_ns``: :func:`waits` of both runs side by side (0 where a rank
    made no one wait)."""
    out = a.rename({"ns": "base_ns"}).join(b.rename({"ns": "new_ns"}), on="straggler_rank", how="full",
                                           coalesce=True)
    out = out.with_columns(pl.col("base_ns").fill_null(0), pl.col("new_ns").fill_null(0))
    return out.with_columns((pl.col("new_ns") - pl.col("base_ns")).alias("delta_ns")).sort("straggler_rank")


def breakdown_rows(breakdown: pa.Table, idle: pa.Table) -> pl.DataFrame:
    """``rank, class, ns, share``: per iteration, each class's time (:data:`BREAKDOWN_ROWS`) and its share of the
    wall time. A part that is unknown in some window of the scope (wait/transfer unsplit, idle split not
    applicable) is null."""
    b = _frame(breakdown)
    cols = {"rank": _SCOPE, "class": pl.String, "ns": pl.Int64, "share": pl.Float64}
    if b.height == 0:
        return pl.DataFrame(schema=cols)
    i = _frame(idle).select("rank", "start_ns", pl.col("host_bound_ns"), pl.col("sync_ns"),
                            pl.col("other_ns").alias("other_idle_ns"))
    b = b.join(i.with_columns(pl.col("rank").cast(b.schema["rank"])), on=["rank", "start_ns"], how="left")
    names = list(BREAKDOWN_ROWS)

    def agg(frame: pl.DataFrame, by: list[str]) -> pl.DataFrame:
        exprs = [pl.len().alias("_n"), pl.col("wall_ns").sum().alias("_wall")]
        for c in names:
            col = pl.col(f"{c}_ns")
            exprs.append(pl.when(col.null_count() == 0).then(col.sum()).alias(c))
        g = frame.group_by(by).agg(exprs) if by else frame.select(exprs)
        return g

    per = agg(b, ["rank"]).with_columns(pl.col("rank").cast(_SCOPE))
    job = _job_scope(agg(b, []))
    wide = pl.concat([job, per], how="diagonal_relaxed")
    long = wide.unpivot(index=["rank", "_n", "_wall"], on=names, variable_name="class", value_name="total")
    return long.select(
        "rank", "class", (pl.col("total") / pl.col("_n")).round().cast(pl.Int64).alias("ns"),
        (pl.col("total") / pl.col("_wall")).alias("share")).cast(cols)  # type: ignore[arg-type]


def comm_rows(analysis: Any) -> pl.DataFrame:
    """Per scope and op: ``calls_per_iteration, bytes_per_call, bytes_per_iteration, busbw_gbps,
    wait_ns, transfer_ns`` (the last two per iteration; from the matched collectives' members)."""
    cols = {"rank": _SCOPE, "op": pl.String, "calls_per_iteration": pl.Float64, "bytes_per_call": pl.Float64,
            "bytes_per_iteration": pl.Float64, "busbw_gbps": pl.Float64, "wait_ns": pl.Int64,
            "transfer_ns": pl.Int64}
    b = _frame(analysis.breakdown)
    if b.height == 0:
        return pl.DataFrame(schema=cols)
    win = b.select(pl.col("rank").cast(pl.Int32), pl.col("iteration"), pl.col("start_ns").alias("w_start"),
                   pl.col("end_ns").alias("w_end")).sort("w_start")
    n_win = win.group_by("rank").len().rename({"len": "_windows"})
    total_windows = win.height
    c = _frame(analysis.collectives).select(pl.col("rank").cast(pl.Int32), "op", "bytes", "start_ns") \
        .filter(pl.col("start_ns").is_not_null())
    c = (c.with_columns(pl.col("op").fill_null("?")).sort("start_ns")
         .join_asof(win, left_on="start_ns", right_on="w_start", by="rank", strategy="backward",
                    check_sortedness=False)
         .filter(pl.col("start_ns") < pl.col("w_end")))

    def calls(frame: pl.DataFrame, by: list[str]) -> pl.DataFrame:
        return frame.group_by(by).agg(pl.len().alias("_calls"), pl.col("bytes").sum().alias("_bytes"),
                                      pl.col("bytes").is_not_null().sum().alias("_known"))

    inst = _frame(analysis.instances).select("instance", pl.col("op").fill_null("?"), "bus_bytes", "transfer_ns",
                                             "iteration")
    m = _frame(analysis.members).select("instance", pl.col("rank").cast(pl.Int32), "wait_ns",
                                        pl.col("transfer_ns").alias("m_transfer"))
    m = m.join(inst, on="instance", how="inner").join(win.select("rank", "iteration"), on=["rank", "iteration"],
                                                     how="semi")

    def members(frame: pl.DataFrame, by: list[str]) -> pl.DataFrame:
        timed = pl.col("m_transfer").is_not_null() & pl.col("bus_bytes").is_not_null()
        return frame.group_by(by).agg(
            pl.col("wait_ns").sum().alias("_wait"), pl.col("m_transfer").sum().alias("_transfer"),
            (pl.col("bus_bytes").filter(timed).sum() * 8 / pl.col("m_transfer").filter(timed).sum())
            .alias("_busbw"))

    per = calls(c, ["rank", "op"]).join(members(m, ["rank", "op"]), on=["rank", "op"], how="full", coalesce=True) \
        .join(n_win, on="rank", how="left")
    # the job: bus bandwidth over the instances (each transfer once), everything else over every rank's windows
    ji = inst.join(m.select("instance").unique(), on="instance", how="semi")
    timed = pl.col("transfer_ns").is_not_null() & pl.col("bus_bytes").is_not_null()
    jbw = ji.group_by("op").agg((pl.col("bus_bytes").filter(timed).sum() * 8 / pl.col("transfer_ns").filter(timed)
                                 .sum()).alias("_busbw"))
    job = (calls(c, ["op"]).join(members(m, ["op"]).drop("_busbw"), on="op", how="full", coalesce=True)
           .join(jbw, on="op", how="left").with_columns(pl.lit(total_windows).alias("_windows")))
    both = pl.concat([_job_scope(job), per.with_columns(pl.col("rank").cast(_SCOPE))], how="diagonal_relaxed")
    return both.select(
        "rank", "op",
        (pl.col("_calls").fill_null(0) / pl.col("_windows")).alias("calls_per_iteration"),
        pl.when(pl.col("_known") > 0).then(pl.col("_bytes") / pl.col("_known")).alias("bytes_per_call"),
        pl.when(pl.col("_known") == pl.col("_calls")).then(pl.col("_bytes") / pl.col("_windows"))
        .alias("bytes_per_iteration"),
        pl.col("_busbw").fill_nan(None).alias("busbw_gbps"),
        (pl.col("_wait") / pl.col("_windows")).round().alias("wait_ns"),
        (pl.col("_transfer") / pl.col("_windows")).round().alias("transfer_ns"),
    ).cast(cols).sort(["rank", "op"], nulls_last=False)  # type: ignore[arg-type]


def op_rows(op_totals: pa.Table, breakdown: pa.Table) -> pl.DataFrame:
    """Per scope and op (kind, name): ``calls`` and ``ns`` per iteration."""
    t = _frame(op_totals)
    b = _frame(breakdown)
    cols = {"rank": _SCOPE, "kind": pl.String, "name": pl.String, "calls": pl.Float64, "ns": pl.Int64}
    if t.height == 0 or b.height == 0:
        return pl.DataFrame(schema=cols)
    n_win = b.group_by("rank").len().rename({"len": "_windows"}).with_columns(pl.col("rank").cast(pl.Int32))
    per = t.join(n_win, on="rank", how="left").select(
        pl.col("rank").cast(_SCOPE), "kind", "name", (pl.col("calls") / pl.col("_windows")).alias("calls"),
        (pl.col("time_ns") / pl.col("_windows")).round().cast(pl.Int64).alias("ns"))
    job = t.group_by(["kind", "name"]).agg(pl.col("calls").sum(), pl.col("time_ns").sum()).select(
        "kind", "name", (pl.col("calls") / b.height).alias("calls"),
        (pl.col("time_ns") / b.height).round().cast(pl.Int64).alias("ns"))
    return pl.concat([_job_scope(job), per], how="diagonal_relaxed").select(list(cols)).cast(cols)  # type: ignore[arg-type]


def critical_path_rows(base: pl.DataFrame, new: pl.DataFrame) -> pl.DataFrame:
    """Per label of the critical path: ``base_ns, new_ns`` (mean per iteration), ``delta_ns``, ``base_share,
    new_share`` (of the path)."""

    def per_label(segs: pl.DataFrame) -> pl.DataFrame:
        n = segs.get_column("iteration").n_unique() if segs.height else 0
        total = int(segs.get_column("dur_ns").sum()) if segs.height else 0
        lab = pl.DataFrame({"label": list(LABELS)})
        if segs.height == 0:
            return lab.with_columns(pl.lit(None, dtype=pl.Int64).alias("ns"), pl.lit(None, dtype=pl.Float64)
                                    .alias("share"))
        g = segs.group_by("label").agg(pl.col("dur_ns").sum().alias("_t"))
        return lab.join(g, on="label", how="left").with_columns(pl.col("_t").fill_null(0)).select(
            "label", (pl.col("_t") / n).round().cast(pl.Int64).alias("ns"),
            (pl.col("_t") / total if total else pl.lit(None, dtype=pl.Float64)).alias("share"))

    a, b = per_label(base), per_label(new)
    out = a.rename({"ns": "base_ns", "share": "base_share"}).join(
        b.rename({"ns": "new_ns", "share": "new_share"}), on="label", how="left", maintain_order="left")
    return out.select("label", "base_ns", "new_ns", (pl.col("new_ns") - pl.col("base_ns")).alias("delta_ns"),
                      "base_share", "new_share")


# ---------------------------------------------------------------------------------------------------
# the two runs side by side


def _pair(a: pl.DataFrame, b: pl.DataFrame, keys: list[str], ranks: list[int], *,
          fill: dict[str, float] | None = None, order: tuple[str, tuple[str, ...]] | None = None) -> pl.DataFrame:
    """``base_X``/``new_X`` for every value column ``X`` of ``a`` and ``b``, joined on ``keys``: the job's rows, and
    those of ``ranks``; ``delta_X`` for the numeric ones (new - base)."""
    values = [c for c in a.columns if c not in keys]
    keep = pl.col("rank").is_null() | pl.col("rank").is_in(ranks)
    x = a.filter(keep).rename({c: f"base_{c}" for c in values})
    y = b.filter(keep).rename({c: f"new_{c}" for c in values})
    # join with nulls as equal keys (the job's rank is null)
    out = x.join(y, on=keys, how="full", coalesce=True, nulls_equal=True)
    for c, v in (fill or {}).items():
        out = out.with_columns(pl.col(f"base_{c}").fill_null(v), pl.col(f"new_{c}").fill_null(v))
    deltas = [(pl.col(f"new_{c}") - pl.col(f"base_{c}")).alias(f"delta_{c}") for c in values
              if a.schema[c].is_numeric()]
    out = out.with_columns(deltas)
    cols = [*keys, *[f"{p}_{c}" for c in values for p in ("base", "new", "delta")
                     if f"{p}_{c}" in out.columns]]
    out = out.select(cols)
    sort_keys = ["rank"]
    if order is not None:
        col, names = order
        out = out.with_columns(pl.col(col).replace_strict({n: i for i, n in enumerate(names)}, default=len(names),
                                                          return_dtype=pl.Int64).alias("_o"))
        sort_keys.append("_o")
    sort_keys += [k for k in keys if k != "rank" and (order is None or k != order[0])]
    out = out.sort(sort_keys, nulls_last=False)
    return out.drop("_o") if order is not None else out


def changed_ops(a: pl.DataFrame, b: pl.DataFrame, ranks: list[int], top: int) -> pl.DataFrame:
    """The ops matched by (kind, name) whose time per iteration changed most (``top`` per scope; an op in one
    run only counts from zero)."""
    out = _pair(a, b, ["rank", "kind", "name"], ranks, fill={"calls": 0.0, "ns": 0})
    out = out.with_columns(pl.col("base_ns").fill_null(0), pl.col("new_ns").fill_null(0)) \
        .with_columns((pl.col("new_ns") - pl.col("base_ns")).alias("delta_ns"),
                      (pl.col("new_calls") - pl.col("base_calls")).alias("delta_calls"))
    out = out.with_columns(pl.col("delta_ns").abs().alias("_abs")).sort(
        ["rank", "_abs", "kind", "name"], descending=[False, True, False, False], nulls_last=False)
    out = out.filter(pl.int_range(pl.len()).over("rank") < top).drop("_abs")
    return out.select("rank", "kind", "name", "base_ns", "new_ns", "delta_ns", "base_calls", "new_calls",
                      "delta_calls")
