"""What ``tracekit inspect`` shows, and how it is loaded in phases (no Textual here).

Loading a big job takes seconds, so the app shows each result as soon as it exists:

1. ``summary`` — the breakdown, iterations and ranks (from the results cache when warm, which needs
   no event at all): the overview and the iterations table can paint;
2. ``analysis`` — the parsed events and the full :class:`~tracekit.analysis.pipeline.Analysis` (from the parse
   cache when warm; analysed now, or rebuilt from the results cache): export works, and views that
   need other analysis tables appear;
3. ``timeline`` — the :class:`~tracekit.views.timeline.TimelineModel` with its levels of detail;
4. ``critical_path`` — the job's dependency graph and the critical path of every iteration
   (``Analysis.critical_path`` / ``critical_path_summary``, cached properties that compute on first
   access, or come from the results cache when an earlier launch stored them) with its marks on the
   timeline: the critical-path view and the timeline overlay appear;
5. ``whatif`` — the what-if model, the link replays (``Analysis.bottleneck``) and the job's one verdict
   (``Analysis.verdict``: a few replays of the graph and its critical path): the overview's verdict and the what-if
   view appear;
6. ``diff`` (only with ``LoadOptions.diff_paths``, ``tracekit inspect BASE --diff NEW``) — the other run loaded
   and analysed with the same options, and :func:`tracekit.diff.compare` of the two: the Diff tab appears.

:func:`load_job` runs the phases in order and reports each through callbacks; the app runs it in a
worker thread, so views only read what a phase computed and the UI thread never builds a graph.
Nothing here computes anything the CLI cannot: it calls the same tracekit functions.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from tracekit import results_cache
from tracekit.allocators import release_memory
from tracekit.model.diagnostics import Diagnostic, TraceError
from tracekit.model.units import count

if TYPE_CHECKING:
    from concurrent.futures import Future

    import polars as pl

    from tracekit.analysis.bottleneck import Bottleneck
    from tracekit.analysis.compare import Diff
    from tracekit.analysis.pipeline import Analysis
    from tracekit.analysis.verdict import Answer
    from tracekit.views.timeline import Marks, TimelineModel

#: name of the critical path's marks on the timeline (``TimelineCanvas.marks``)
PATH_MARKS = "critical_path"


@dataclass(frozen=True)
class LoadOptions:
    """The CLI's common options."""

    use_cache: bool = True
    cache_dir: str | None = None
    jobs: int | None = None
    step_marker: str | None = None
    link_bw_bps: float | None = None
    line_rates: tuple[tuple[str, float], ...] = ()  # rates of some links only, by selector (--link-bw dp=...)
    diff_paths: tuple[str, ...] = ()  # another run to compare with (--diff): phase 6
    #: rank by rank (:mod:`tracekit.scale`): True, False, or None to choose by whether the job fits in memory (a big-job
    #: option given means True)
    by_rank: bool | None = False
    engine: str | None = None  # --engine local|dask
    scheduler: str | None = None  # --scheduler tcp://...
    dataset: str | None = None  # --dataset DIR (a built one opens without reading a trace)
    memory_budget: str | None = None  # --memory-budget
    rebuild: bool = False  # --rebuild
    rank_regex: str | None = None  # --rank-regex

    @property
    def big_job_options(self) -> bool:
        """Whether an option of the big-jobs group was given (which means rank by rank)."""
        return any(x is not None for x in (self.engine, self.scheduler, self.dataset, self.memory_budget))


@dataclass
class JobData:
    """Everything the views read. ``analysis`` and ``timeline`` are None until their phase is done."""

    files: list[str]
    ranks: pa.Table
    iterations: pa.Table
    breakdown: pa.Table
    notes: list[str] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    events: int = 0
    from_cache: bool = False
    analysis: Analysis | None = None
    timeline: TimelineModel | None = None
    #: :func:`tracekit.results_cache.figures` of the breakdown (from the cache, or computed when asked)
    figures: dict[str, Any] | None = None
    #: phase 4 is done: the critical-path tables are computed and :meth:`tables` lists them
    paths_ready: bool = False
    #: the critical path as labelled timeline marks (None before phase 4 or without a path)
    path_marks: Marks | None = None
    #: phase 5 is done: ``analysis.whatif`` is built and :attr:`bottleneck` is its verdict
    whatif_ready: bool = False
    #: "is the network the bottleneck?" (None before phase 5, or for a job without communication)
    bottleneck: Bottleneck | None = None
    #: the job's one verdict (:mod:`tracekit.analysis.verdict`; None before phase 5)
    verdict: Answer | None = None
    #: phase 6 is done: :attr:`diff` compares the job with the run of ``LoadOptions.diff_paths``
    diff_ready: bool = False
    #: the comparison with another run (None before phase 6, or without ``--diff``)
    diff: Diff | None = None
    #: ``(root, key)`` of the job's results-cache entry, where phase 4 adds the critical path it computes
    results_entry: tuple[str, str] | None = None
    #: phases 4 and 5 computing in a thread of their own since the overview (they wait for it), and which of the
    #: analysis's results existed before it started (those came from the results cache)
    background: tuple[Future[None] | None, frozenset[str]] | None = field(default=None, repr=False)
    #: the verdict computing on a thread of its own since the overview (a job read rank by rank), or None
    replays: Future[None] | None = field(default=None, repr=False)
    #: how the job was loaded (phase 6 loads the other run the same way), and the paths it was given as
    options: LoadOptions | None = None
    inputs: list[str] = field(default_factory=list)
    _tables: tuple[tuple[int, bool], dict[str, pa.Table]] | None = field(default=None, repr=False)

    @classmethod
    def from_analysis(cls, analysis: Analysis, files: list[str] | None = None) -> JobData:
        src = files if files is not None else [f.path for f in analysis.traces.files]
        return cls(files=src, ranks=analysis.traces.ranks, iterations=analysis.iterations,
                   breakdown=analysis.breakdown, notes=list(analysis.notes),
                   diagnostics=list(analysis.diagnostics), events=analysis.events.num_rows,
                   analysis=analysis)

    def tables(self) -> dict[str, pa.Table]:
        """Every result table there is so far, by its public name (views check for theirs here). Never
        computes an analysis: the critical-path tables are listed once phase 4 has computed them."""
        if self.analysis is None:
            return {"ranks": self.ranks, "iterations": self.iterations, "breakdown": self.breakdown}
        # the top ops and idle split once the loading worker has computed them (listing them would compute them,
        # on whichever thread asks first: the UI thread, at the first paint)
        ops = {"top_ops", "idle_breakdown"} <= self.analysis.__dict__.keys()
        key = (id(self.analysis), self.paths_ready, ops)
        if self._tables is None or self._tables[0] != key:
            # every table computed now (in the loading worker, see complete()), not when a view looks one up
            self._tables = (key, dict(self.analysis.tables(paths=self.paths_ready, ops=ops)))  # type: ignore[arg-type]
        return self._tables[1]

    def _figures(self) -> dict[str, Any]:
        if self.figures is None:
            self.figures = results_cache.figures(self.breakdown, self.analysis.ranks if self.analysis else None)
        return self.figures

    @property
    def job(self) -> dict[str, Any]:
        """Whole-job figures (:func:`tracekit.views.summary.job`)."""
        return self._figures()["job"]

    @property
    def per_rank(self) -> list[dict[str, Any]]:
        """Rows of :func:`tracekit.views.summary.per_rank`."""
        return self._figures()["per_rank"]

    @property
    def per_iteration(self) -> list[dict[str, Any]]:
        """Rows of :func:`tracekit.views.summary.per_iteration`."""
        return self._figures()["per_iteration"]

    @property
    def warnings(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.level != "info"]


@dataclass
class LoadCallbacks:
    """Where :func:`load_job` reports; every callback is optional."""

    progress: Callable[[str, float | None], None] | None = None  # what it is doing, fraction done
    summary: Callable[[JobData], None] | None = None
    analysis: Callable[[JobData], None] | None = None
    timeline: Callable[[JobData], None] | None = None
    critical_path: Callable[[JobData], None] | None = None
    whatif: Callable[[JobData], None] | None = None
    diff: Callable[[JobData], None] | None = None
    #: True once the caller no longer wants the rest (the app is closing): later phases are skipped
    cancelled: Callable[[], bool] | None = None

    def stop(self) -> bool:
        return bool(self.cancelled and self.cancelled())

    def say(self, what: str, fraction: float | None = None) -> None:
        if self.progress:
            self.progress(what, fraction)


def _results_key(paths: list[str], options: LoadOptions) -> str | None:
    """The results cache's key of ``paths`` read with ``options``."""
    return results_cache.key(paths, options.step_marker, options.link_bw_bps, dict(options.line_rates),
                             rank_regex=options.rank_regex)


def _results_root(options: LoadOptions) -> str:
    return str(results_cache.default_root() if options.cache_dir is None
               else os.path.join(options.cache_dir, "results"))


def cached_summary(paths: list[str], options: LoadOptions) -> tuple[JobData, results_cache.Results] | None:
    """Phase 1 from the results cache alone (no trace is opened), or None on a miss. Cheap enough to
    run before the app draws its first screen. (Rank by rank, phase 1 comes from the dataset instead.)"""
    if not options.use_cache or options.by_rank or options.big_job_options:
        return None
    key = _results_key(paths, options)
    cached = results_cache.load(_results_root(options), key) if key else None
    if cached is None:
        return None
    data = JobData(files=cached.files, ranks=cached.ranks, iterations=cached.iterations, breakdown=cached.breakdown,
                   notes=cached.notes, diagnostics=cached.diagnostics, events=cached.events, from_cache=True,
                   figures=cached.figures)
    return data, cached


def load_job(paths: list[str], options: LoadOptions, callbacks: LoadCallbacks,
             start: tuple[JobData, results_cache.Results] | None = None) -> JobData:
    """Load ``paths`` in the three phases of the module docstring; raises TraceError for bad input.
    ``start`` is what :func:`cached_summary` found, when the caller already looked (phase 1 is then
    not reported again)."""
    from tracekit.loading import traceset

    callbacks.say("finding traces")
    if start is None:
        start = cached_summary(paths, options)
        if start is not None and callbacks.summary:
            callbacks.summary(start[0])
    data, cached = start if start is not None else (None, None)
    # the results' key from before the traces are read: if one changes meanwhile, the key taken after the
    # analysis differs and nothing is stored under a key that does not describe what was read
    key_before = _results_key(paths, options) \
        if options.use_cache else None
    found = traceset.discover(paths)
    files = found[0]
    if not files:
        raise TraceError(None, "no input files")
    total = sum(os.path.getsize(f) for f in files)
    if rank_by_rank(options, files, callbacks):
        return _load_by_rank(paths, options, callbacks, found, total)
    callbacks.say(f"reading {count(len(files), 'file')}", 0.0)

    def progress(done: int, _total: int, path: str) -> None:
        callbacks.say(f"read {os.path.basename(path)}", done / total if total else 1.0)

    traces = traceset.load(paths, use_cache=options.use_cache, cache_dir=options.cache_dir, jobs=options.jobs,
                           progress=progress, found=found, rank_regex=options.rank_regex)
    if traces.empty:
        damage = "; ".join(str(d) for d in traces.diagnostics if d.level != "info")
        raise TraceError(", ".join(files), "no events to analyse" + (f" ({damage})" if damage else ""))
    from tracekit.analysis.pipeline import analyse

    analysis = results_cache.analysis_from(traces, cached) if cached is not None else None
    key = _results_key(paths, options) \
        if options.use_cache else None
    if analysis is None:
        callbacks.say("analysing", None)
        analysis = analyse(traces, step_marker=options.step_marker, link_bw_bps=options.link_bw_bps,
                           line_rates=dict(options.line_rates))
        if key and key == key_before:
            with contextlib.suppress(OSError):  # an unwritable cache never stops the inspection
                results_cache.store(_results_root(options), key, analysis)
    if data is None:
        data = JobData.from_analysis(analysis, files)
        data.figures = results_cache.figures(analysis.breakdown, analysis.ranks)  # here, not on the UI thread
        if callbacks.summary:
            callbacks.summary(data)
    else:
        data.analysis = analysis
        data.files = files
        data.diagnostics = list(analysis.diagnostics)  # the inputs' and the analysis' (as the CLI prints them)
    data.results_entry = (_results_root(options), key) if key and key == key_before else None
    # the critical path and the what-if's replays side by side with the top ops and the timeline: numpy and
    # polars release the GIL, so the two cores both work
    had = frozenset(analysis.__dict__)
    data.background = (None if analysis.horovod_only or analysis.dataset is not None else
                       analysis.start("critical_path", "critical_path_summary", "bottleneck", "verdict"), had)
    callbacks.say("top ops and idle time", None)
    analysis.top_ops  # noqa: B018  (computed here, in the worker: JobData.tables() lists them)
    analysis.idle_breakdown  # noqa: B018
    data.options = options
    data.inputs = list(paths)
    if callbacks.analysis:
        callbacks.analysis(data)
    return complete(data, callbacks)


def rank_by_rank(options: LoadOptions, files: list[str], callbacks: LoadCallbacks | None = None) -> bool:
    """Whether the job is read rank by rank: asked for (``by_rank``, a big-job option), or, with ``by_rank`` None,
    because in memory it would not fit (as :func:`tracekit.api.load` decides)."""
    if options.by_rank or options.big_job_options:
        return True
    if options.by_rank is False:
        return False
    from tracekit.scale import dataset as dataset_mod

    need, have = dataset_mod.in_memory_need(files), dataset_mod.available_memory()
    if need > have and callbacks is not None:
        callbacks.say(f"reading {count(len(files), 'file')} rank by rank: in memory they would need about "
                      f"{need / 2**30:.1f} GiB, {have / 2**30:.1f} GiB is available")
    return need > have


def _load_by_rank(paths: list[str], options: LoadOptions, callbacks: LoadCallbacks,
                  found: tuple[list[str], list[Diagnostic]], total: int) -> JobData:
    """The phases of a job read rank by rank (:mod:`tracekit.scale`): the per-rank dataset (built, or reused:
    then nothing is read but its small tables) gives phase 1 from the breakdown its units wrote; phase 2 is
    :func:`tracekit.scale.analyse.analyse_dataset` (collectives matched across ranks, the exposed communication split
    rank by rank); the timeline reads the ranks it draws (:class:`~tracekit.views.ranked_timeline.RankedTimeline`); the
    critical path and what-if run on the ranks' compact graphs."""
    from tracekit.scale import dataset as dataset_mod
    from tracekit.scale import engine as engine_mod
    from tracekit.scale.analyse import analyse_dataset
    from tracekit.scale.graphs import RankGraphs

    files = found[0]

    def make_engine() -> engine_mod.Engine:
        return engine_mod.make(options.engine or "local", scheduler=options.scheduler, jobs=options.jobs,
                               total_bytes=total)

    def progress(done: int, _total: int, path: str) -> None:
        callbacks.say(f"rank by rank: read {os.path.basename(path)}", done / total if total else 1.0)

    callbacks.say(f"rank by rank: {count(len(files), 'file')} into a per-rank dataset", 0.0)
    ds = dataset_mod.build(paths, out=options.dataset, engine=make_engine(), step_marker=options.step_marker,
                           budget=options.memory_budget, use_cache=options.use_cache, cache_dir=options.cache_dir,
                           force=options.rebuild, progress=progress, found=found, graphs=True,
                           rank_regex=options.rank_regex)
    if ds.manifest.get("events", 0) == 0 and ds.manifest.get("collectives", 0) == 0:
        damage = "; ".join(str(d) for d in ds.diagnostics if d.level != "info")
        ds.cleanup()
        raise TraceError(", ".join(files), "no events to analyse" + (f" ({damage})" if damage else ""))
    breakdown = ds.table("breakdown")
    data = JobData(files=files, ranks=ds.ranks, iterations=ds.table("iterations"), breakdown=breakdown,
                   notes=[*ds.notes, "rank by rank"], diagnostics=list(ds.diagnostics),
                   events=int(ds.manifest.get("events", 0)), figures=results_cache.figures(breakdown, ds.ranks))
    if callbacks.summary:
        callbacks.summary(data)
    graphs = RankGraphs(ds, make_engine, options.memory_budget)
    graphs.open_soon()  # the hosts of the ranks' graphs start while the job is analysed
    callbacks.say(f"rank by rank: collectives of {count(ds.ranks.num_rows, 'rank')} matched, exposed communication "
                  "split", None)
    analysis = analyse_dataset(ds, link_bw_bps=options.link_bw_bps, memory_budget=options.memory_budget,
                               line_rates=dict(options.line_rates),
                               rank_graphs=graphs)
    data.analysis = analysis
    data.ranks, data.breakdown, data.notes = analysis.ranks, analysis.breakdown, list(analysis.notes)
    data.diagnostics = list(analysis.diagnostics)
    data.figures = results_cache.figures(analysis.breakdown, analysis.ranks)
    had = frozenset(analysis.__dict__)
    # the critical path shown as soon as it is followed; the verdict's replays (the bottleneck's among them) on a
    # thread of their own beside it (where the ranks' graphs are held, their hosts take one question at a time)
    data.background = (analysis.start("critical_path", "critical_path_summary"), had)
    data.replays = analysis.start("verdict")
    data.options = options
    data.inputs = list(paths)
    if callbacks.analysis:
        callbacks.analysis(data)
    return complete(data, callbacks)


def _store(writes: list[Callable[[], None]]) -> None:
    """Write to the results cache; one that cannot be written never stops the inspection."""
    for write in writes:
        with contextlib.suppress(OSError):
            write()


def complete(data: JobData, callbacks: LoadCallbacks) -> JobData:
    """Phases 3–5 for ``data`` whose analysis exists: each is computed unless it was already, and
    reported in order; none is started once ``callbacks.cancelled()`` says so (a worker thread cannot be
    interrupted, and an app that quits waits for it)."""
    from tracekit.views.timeline import TimelineModel

    analysis = data.analysis
    assert analysis is not None
    by_rank = analysis.dataset is not None
    if not analysis.horovod_only and not by_rank:  # a job handed over with its analysis: the top ops here
        analysis.top_ops  # noqa: B018
        analysis.idle_breakdown  # noqa: B018
    pending, had = data.background or (None, frozenset(analysis.__dict__))
    graph_cached = "graph" in had  # from the results cache
    # what phases 4 and 5 add to the results cache is written after both are shown, not before
    later: list[Callable[[], None]] = []
    entry = data.results_entry or ("", "")
    if data.timeline is None and by_rank:  # lanes laid out now, each rank read when it is drawn
        from tracekit.views.ranked_timeline import RankedTimeline, RankSource

        callbacks.say(f"laying out the timeline of {count(data.ranks.num_rows, 'rank', grouped=True)}", None)
        data.timeline = RankedTimeline(RankSource(analysis))
    elif data.timeline is None:
        callbacks.say(f"building the timeline of {count(analysis.events.num_rows, 'event', grouped=True)}", None)
        data.timeline = TimelineModel.build(analysis)
    if callbacks.timeline:
        callbacks.timeline(data)
    if callbacks.stop():
        return data
    if pending is not None:  # the critical path and what-if computing since the overview
        pending.result()
    if not data.paths_ready:
        if not analysis.horovod_only:  # a Horovod timeline alone has no graph to follow
            cached = "critical_path" in had  # from the results cache: no graph to build
            callbacks.say("following the critical path of every iteration", None)
            data.path_marks = critical_path_marks(data.timeline, analysis.critical_path)
            analysis.critical_path_summary  # noqa: B018  (computed here, in the worker)
            if not cached and data.results_entry is not None:  # the next launch shows them at once
                later.append(lambda: results_cache.store_paths(*entry, analysis))
        data.paths_ready = True
        data.tables()  # the tables converted here too, not on the UI thread
    if callbacks.critical_path:
        callbacks.critical_path(data)
    if callbacks.stop():
        _store(later)
        return data
    if not data.whatif_ready:
        callbacks.say("what-if: replaying the job with free communication and at the line rate", None)
        if data.replays is not None:  # the verdict computing since the overview
            data.replays.result()
        data.bottleneck = analysis.bottleneck
        data.verdict = analysis.verdict
        data.whatif_ready = True
        if not graph_cached and "graph" in analysis.__dict__ and data.results_entry is not None:
            later.append(lambda: results_cache.store_graph(*entry, analysis.graph))  # the next launch skips it
    if callbacks.whatif:
        callbacks.whatif(data)
    if by_rank and not analysis.horovod_only and not callbacks.stop():
        # rank by rank the top ops and idle split read every rank's events again: last, once the rest is shown
        callbacks.say("top ops and idle time, rank by rank", None)
        analysis.top_ops  # noqa: B018
        analysis.idle_breakdown  # noqa: B018
        data.tables()  # converted here, not on the UI thread
        if callbacks.whatif:
            callbacks.whatif(data)
    _store(later)
    release_memory()  # the computation is over and the inspection waits for its user: what it freed goes back
    options = data.options
    if options is not None and options.diff_paths and not data.diff_ready:
        if callbacks.stop():
            return data
        from tracekit.api import Job, load
        from tracekit.diff import compare

        callbacks.say(f"diff: reading {', '.join(options.diff_paths)}", None)
        rates = ",".join([*([str(options.link_bw_bps)] if options.link_bw_bps else []),
                          *(f"{k}={v}" for k, v in options.line_rates)]) or None
        other = load(list(options.diff_paths), link_bw=rates, step_marker=options.step_marker,
                     cache=options.use_cache, cache_dir=options.cache_dir, jobs=options.jobs,
                     by_rank=analysis.dataset is not None, graphs=analysis.dataset is not None,
                     engine=options.engine, scheduler=options.scheduler, memory_budget=options.memory_budget)
        callbacks.say("diff: comparing the two runs (and replaying the other for its verdict)", None)
        data.diff = compare(Job(analysis, data.inputs or data.files), other)
        data.diff_ready = True
        if callbacks.diff:
            callbacks.diff(data)
    callbacks.say("ready", 1.0)
    return data


def critical_path_marks(model: TimelineModel, segments: pl.DataFrame) -> Marks:
    """The critical-path segments (job clock) as timeline marks labelled ``of iteration #N: what``, where
    ``what`` is the segment's label, waiting spelled ``waiting on rank k``."""
    import polars as pl

    what = pl.when(pl.col("label") == "waiting").then(
        pl.concat_str(pl.lit("waiting on rank "), pl.col("waiting_on").cast(pl.String))).otherwise(pl.col("label"))
    label = pl.concat_str(pl.lit("of iteration #"), pl.col("iteration").cast(pl.String), pl.lit(": "), what)
    table = segments.select("rank", "lane", "start_ns", "end_ns", label.alias("label")).to_arrow()
    return model.marks_from_table(PATH_MARKS, table, job_clock=True, label="label")
