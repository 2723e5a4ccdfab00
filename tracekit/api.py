"""tracekit's Python API: load a job, read its results as polars DataFrames, ask what the command line asks.

::

    import tracekit

    job = tracekit.load("runs/ddp", link_bw="100gbit")
    job.breakdown                      # one row per rank x iteration window (polars DataFrame)
    job.whatif(bandwidth=["100gbit", "400gbit"], compression=[1, 4])
    print(job.verdict)                 # is the network the bottleneck?
    job.export("out/")                 # every table as Parquet

:func:`load` reads and analyses the inputs exactly as ``tracekit summary`` does (the same caches; a job too
big for memory is analysed rank by rank, and its ``events`` stay on disk as a lazy frame); :class:`Job` holds
the result. Every table has the public column names of DESIGN.md (times int64 ``*_ns`` on the rank's clock,
``*_share`` ratios). The command line is a client of this module: ``summary --json`` prints
:meth:`Job.summary`, ``whatif`` prints :meth:`Job.whatif`, ``export`` calls :meth:`Job.export`.
"""

from __future__ import annotations

import html
import logging
import math
import os
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import polars as pl
import pyarrow as pa

from tracekit.model import schema
from tracekit.model.diagnostics import Diagnostic, TraceError
from tracekit.model.options import naming
from tracekit.model.units import count

if TYPE_CHECKING:
    from tracekit.analysis.bottleneck import Bottleneck
    from tracekit.analysis.compare import Diff
    from tracekit.analysis.graph.whatif import Scenario
    from tracekit.analysis.hang.stuck import Hang
    from tracekit.analysis.one_job import OneJob
    from tracekit.analysis.pipeline import Analysis
    from tracekit.analysis.verdict import Answer

__all__ = ["Job", "Verdict", "compare", "load"]

PathArg = str | os.PathLike[str]
#: a line rate: bits/s, or text such as ``"100gbit"``, ``"25GB/s"``; for some links only ``"dp=25gbit"``
RateArg = str | float | int
log = logging.getLogger("tracekit")


def _paths(paths: PathArg | Iterable[PathArg]) -> list[str]:
    if isinstance(paths, str | os.PathLike):
        return [os.fspath(paths)]
    out = [os.fspath(p) for p in paths]
    if not out:
        raise TraceError(None, "no input paths given")
    return out


def _link_rates(link_bw: RateArg | None) -> tuple[float | None, dict[str, float]]:
    from tracekit.model.units import parse_link_rates

    if link_bw is None:
        return None, {}
    if isinstance(link_bw, int | float):
        if not link_bw > 0 or not math.isfinite(link_bw):
            raise TraceError(None, f"link_bw={link_bw!r} is not a positive line rate")
        return float(link_bw), {}
    return parse_link_rates(str(link_bw))


def load(paths: PathArg | Iterable[PathArg], *, link_bw: RateArg | None = None, step_marker: str | None = None,
         cache: bool = True, cache_dir: PathArg | None = None, jobs: int | None = None, by_rank: bool | None = None,
         engine: str | None = None, scheduler: str | None = None, dataset: PathArg | None = None,
         memory_budget: str | int | None = None, rebuild: bool = False, graphs: bool = False,
         on_start: Callable[[list[str], int], None] | None = None,
         progress: Callable[[int, int, str], None] | None = None,
         on_note: Callable[[str], None] | None = None,
         iterations: str | Iterable[int] | None = None, rank_regex: str | None = None) -> Job:
    """Read and analyse a job: trace files and directories (searched recursively, files recognised by content).

    ``link_bw`` is the line rate the job ran on (``"100gbit"``, ``"25GB/s"``, bits/s as a number, or per process
    group ``"dp=25gbit,tp=900GB/s"``); ``step_marker`` a regular expression for iterations without
    ``ProfilerStep#N``. Parsed files are cached (``cache=False`` parses again; ``cache_dir`` moves the cache).

    By default a job is analysed in memory unless it would not fit, in which case — or with ``by_rank=True``,
    ``engine`` (``"local"``/``"dask"``), ``scheduler``, ``dataset`` or ``memory_budget`` — it is analysed rank by
    rank through a per-rank Parquet dataset; ``by_rank=False`` forces memory. Rank by rank, the critical path and
    the what-if run on the ranks' compact dependency graphs (`tracekit.analysis.graph.compact`): ``graphs=True``
    builds them with the dataset (what ``tracekit whatif`` and ``critical-path`` ask for), otherwise they are built
    from the dataset's events on first use. ``on_start(files, total_bytes)`` is
    called once the inputs are found, ``progress(done_bytes, total_bytes, path)`` while they are read, and
    ``on_note(text)`` with what the user should know about how the job was read (default: logged).
    ``iterations`` (``"3-8"``, ``"2,4,6-9"`` or numbers, e.g. ``range(3, 9)``) analyses those iterations alone:
    applied once they are found, before matching, attribution and the dependency graph (in memory only).
    ``rank_regex`` (e.g. ``"rank(\\d+)"``) takes each trace's rank from its path (its group ``rank``, else its first
    group), over the ``distributedInfo`` in the file; without it, the rank is the file's ``distributedInfo``, else
    what its name says (the training tools' layouts: docs/integrations/layouts.md), else the order.

    Raises `tracekit.model.diagnostics.TraceError` (one line) for a bad input or option."""
    from tracekit.analysis.pipeline import analyse
    from tracekit.loading import traceset
    from tracekit.scale import dataset as dataset_mod

    names = _paths(paths)
    if rank_regex is not None:
        from tracekit.loading.layouts import compile_rank_regex

        compile_rank_regex(rank_regex)  # a bad one is a one-line error before anything is read
    link_bw_bps, line_rates = _link_rates(link_bw)
    only = _iterations(iterations)
    if jobs is not None and jobs < 1:
        raise TraceError(None, f"jobs={jobs}: must be at least 1")
    files, _ = traceset.discover(names)
    total = sum(os.path.getsize(f) for f in files)
    wants = any(x is not None for x in (engine, scheduler, dataset, memory_budget))
    rank_by_rank = bool(by_rank) or wants
    if by_rank is None and not wants:
        need, have = dataset_mod.in_memory_need(files), dataset_mod.available_memory()
        if need > have:
            rank_by_rank = True
            (on_note or log.info)(f"analysing {count(len(files), 'file')} rank by rank: in memory they would need "
                                  f"about {need / 2**30:.1f} GiB, {have / 2**30:.1f} GiB is available")
    if on_start is not None:
        on_start(files, total)
    cache_root = None if cache_dir is None else os.fspath(cache_dir)
    if rank_by_rank and only is not None:
        raise TraceError(None, "iterations= needs the job in memory: run without engine=, scheduler=, dataset= "
                               "and memory_budget=")
    if rank_by_rank:
        from tracekit.scale import engine as engine_mod
        from tracekit.scale.analyse import analyse_dataset
        from tracekit.scale.graphs import RankGraphs

        def make_engine() -> engine_mod.Engine:
            return engine_mod.make(engine or "local", scheduler=scheduler, jobs=jobs, total_bytes=total)

        ds = dataset_mod.build(names, out=None if dataset is None else os.fspath(dataset), engine=make_engine(),
                               step_marker=step_marker, budget=memory_budget, use_cache=cache, cache_dir=cache_root,
                               force=rebuild, progress=progress, graphs=graphs, rank_regex=rank_regex)
        rank_graphs = None
        try:
            if ds.manifest.get("events", 0) == 0 and ds.manifest.get("collectives", 0) == 0 and not any(
                    s.get("format") in traceset.STANDALONE_FORMATS for s in ds.summaries):  # logs, dumps alone
                damage = "; ".join(str(d) for d in ds.diagnostics if d.level != "info")
                raise TraceError(", ".join(files), "no events to analyse" + (f" ({damage})" if damage else ""))
            rank_graphs = RankGraphs(ds, make_engine, memory_budget)
            if graphs:  # asked for the replays: their hosts start while the job is analysed
                rank_graphs.open_soon()
            analysis = analyse_dataset(ds, link_bw_bps=link_bw_bps, memory_budget=memory_budget,
                                       line_rates=line_rates, rank_graphs=rank_graphs)
        except BaseException:
            if rank_graphs is not None:
                rank_graphs.close()
            ds.cleanup()
            raise
        return Job(analysis, names)
    ts = traceset.load(names, use_cache=cache, cache_dir=cache_root, jobs=jobs, progress=progress,
                       rank_regex=rank_regex)
    if ts.empty:
        damage = "; ".join(str(d) for d in ts.diagnostics if d.level != "info")
        raise TraceError(", ".join(files), "no events to analyse" + (f" ({damage})" if damage else ""))
    return Job(analysis=analyse(ts, step_marker=step_marker, link_bw_bps=link_bw_bps, line_rates=line_rates,
                                only_iterations=only), paths=names)


def _iterations(value: str | Iterable[int] | None) -> frozenset[int] | None:
    """``load``'s ``iterations`` as a set of iteration numbers (None: all)."""
    import numbers

    from tracekit.analysis.iterations import parse_selection

    if value is None:
        return None
    if isinstance(value, str):
        return parse_selection(value)
    out = set()
    for v in value:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise TraceError(None, f"iterations: {v!r} is not an iteration number")
        out.add(int(v))
    if not out:
        raise TraceError(None, "iterations: the selection is empty")
    return frozenset(out)


@dataclass(frozen=True)
class Verdict:
    """What sets this job's pace, and is the network the bottleneck?

    ``kind`` is the one classification (``link-bound``, ``straggler-bound``, ``host-bound``, ``compute-bound``,
    ``mixed``, or ``none`` without iterations), derived from the replays and the critical path
    (`tracekit.analysis.verdict`); ``headline`` is its first sentence and ``text`` the whole answer (the
    replays behind it, the stragglers named, exposed communication split into waiting and transfer, and a caveat
    where it rests on unexplained gaps). ``answer`` holds its figures; ``links`` is the measurement paragraph of
    ``tracekit summary``; ``bottleneck`` the link replays' figures (None without communication or a replay)."""

    text: str
    kind: str
    headline: str
    links: str
    bottleneck: Bottleneck | None = None
    answer: Answer | None = None

    @property
    def measured_iteration_ns(self) -> int | None:
        """The job's measured iteration time: the one figure ``summary``, ``whatif`` and the verdict give."""
        return self.answer.measured_ns if self.answer is not None else None

    @property
    def scaling_factor(self) -> float | None:
        """Iteration time with free communication / the job replayed as measured (None without a replay)."""
        return None if self.bottleneck is None else self.bottleneck.scaling_measured

    def __str__(self) -> str:
        return self.text

    def to_dict(self) -> dict[str, Any]:
        """The verdict as plain Python (each run's verdict in ``tracekit diff --json``)."""
        return {"text": self.text, "kind": self.kind, "headline": self.headline, "links": self.links,
                "answer": self.answer.as_dict() if self.answer is not None else None,
                "bottleneck": bottleneck_payload(self.bottleneck,
                                                 self.answer.measured_ns if self.answer is not None else None)}


def _frame(table: pa.Table) -> pl.DataFrame:
    out = pl.from_arrow(table)
    assert isinstance(out, pl.DataFrame)
    return out


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return [None]
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        return [value]
    out = list(value)
    return out or [None]


def scenarios(bandwidth: RateArg | Mapping[str, RateArg] | Sequence[RateArg | Mapping[str, RateArg]] | None = None,
              compression: float | Sequence[float] = 1, workers: int | Sequence[int] | None = None,
              efficiency: str | float | None = None, codec_cost: float | None = None, *,
              link_bw_known: bool = False) -> list[Scenario]:
    """The what-if scenarios for every combination of the lists (as ``tracekit whatif`` sweeps them), checked as
    the command line checks them. ``bandwidth`` items are line rates for every link (bits/s or ``"10gbit"``),
    rates of some links only (``"dp=25gbit"``, ``"dp=25gbit+tp=900GB/s"`` or ``{"dp": "25gbit"}``), or None for
    the rate the job ran on; ``efficiency`` is ``"measured"`` (as this job's links did; needs the job's line
    rate, ``link_bw_known``), ``"full"`` or a share of the line rate (default: measured when the line rate is
    known, else full); ``codec_cost`` the encode+decode cost of compression in ns per payload byte."""
    from tracekit.analysis.graph import whatif
    from tracekit.model.units import parse_link_rates, parse_rate

    bands: list[tuple[float | None, tuple[tuple[str, float], ...]]] = []
    for item in _as_list(bandwidth):
        if item is None:
            bands.append((None, ()))
        elif isinstance(item, Mapping):
            bands.append((None, tuple((str(k), v if isinstance(v, int | float) else
                                       parse_rate(str(v), option="bandwidth=")) for k, v in item.items())))
        elif isinstance(item, int | float):
            if not item > 0:
                raise TraceError(None, f"bandwidth={item!r}: must be positive")
            bands.append((float(item), ()))
        else:
            default, named = parse_link_rates(str(item).replace("+", ","), option="bandwidth=")
            bands.append((default, tuple(named.items())))
    comps = [_positive(c, float, "compression=") for c in _as_list(compression)]
    workers_l = [None if w is None else _positive(w, int, "workers=") for w in _as_list(workers)]
    eff: str | float
    if efficiency is None:
        eff = "measured" if link_bw_known else "full"
    elif efficiency in ("full", "measured"):
        eff = str(efficiency)
    else:
        text = efficiency.split(",")[0] if isinstance(efficiency, str) else efficiency
        eff = _positive(text, float, "efficiency=")
        if eff > 1:
            raise TraceError(None, f"efficiency={eff!r}: a share of the line rate is at most 1")
    if eff == "measured" and not link_bw_known and any(r is not None or named for r, named in bands):
        raise TraceError(None, "efficiency='measured' needs link_bw= (the line rate the job ran on)")
    if eff != "measured" and not link_bw_known and bands == [(None, ())]:
        raise TraceError(None, "give bandwidth= (the line rates to predict for) or link_bw=")
    codec = whatif.DEFAULT_CODEC_NS_PER_BYTE if codec_cost is None else float(codec_cost)
    return [whatif.Scenario(bandwidth_bps=r, links=named, compression=c or 1.0, workers=w, efficiency=eff,
                            codec_ns_per_byte=codec)
            for r, named in bands for c in comps for w in workers_l]


def _positive(value: Any, kind: type, option: str) -> Any:
    if value is None:
        return None
    try:
        out = kind(str(value).strip()) if isinstance(value, str) else kind(value)
    except (TypeError, ValueError):
        raise TraceError(None, f"{naming(option, str(value).strip())}: not a number") from None
    if out <= 0:
        raise TraceError(None, f"{naming(option, str(value).strip())}: must be positive")
    return out


class Job:
    """One analysed job (from [load][tracekit.api.load]). Tables are polars DataFrames with the public schema; the
    critical path and the what-if replay are computed on first use (they build the job's dependency graph)."""

    def __init__(self, analysis: Analysis, paths: Sequence[str] = ()) -> None:
        self.analysis = analysis
        #: the inputs as given
        self.paths = [os.fspath(p) for p in paths] or [f.path for f in analysis.traces.files]
        ds = analysis.dataset
        self._finalizer = weakref.finalize(self, ds.cleanup) if ds is not None and ds.temporary else None

    # ----------------------------------------------------------------- identity

    @property
    def name(self) -> str:
        """A short label: the input path (or the first, and how many more)."""
        first = self.paths[0] if self.paths else "job"
        return first if len(self.paths) <= 1 else f"{first} (+{len(self.paths) - 1})"

    @property
    def n_ranks(self) -> int:
        return self.analysis.ranks.num_rows

    @property
    def n_iterations(self) -> int:
        """Distinct iterations with a window on some rank."""
        return len(set(self.analysis.breakdown.column("iteration").to_pylist()))

    @property
    def one_job(self) -> OneJob:
        """Whether the traces are one job's (``one``; ``reasons`` why not) and every rank's files: traces that are not
        one job get no cross-rank verdict (`tracekit.analysis.one_job`)."""
        return self.analysis.one_job

    @property
    def iteration_ns(self) -> int | None:
        """The measured iteration time (the median time between consecutive iteration starts on the job clock): the
        one figure ``summary``, ``whatif``, the verdict and ``inspect`` give; cheap (no replay)."""
        return self.analysis.measured_iteration_ns

    @property
    def line_rate_bps(self) -> float | None:
        """The line rate the figures compare with (given as ``link_bw``, or from an NCCL topology), bits/s."""
        return self.analysis.line_rate_bps

    @property
    def in_memory(self) -> bool:
        """False when the job was analysed rank by rank (events on disk; the critical path and what-if run on the ranks'
        compact graphs; no Chrome trace)."""
        return self.analysis.dataset is None

    @property
    def missing_ranks(self) -> list[int]:
        """Ranks the job had (the world size its traces state, its process groups' members) that no input holds."""
        return list(self.analysis.missing_ranks)

    @property
    def notes(self) -> list[str]:
        """How the job was read (iteration method, what was left out)."""
        return list(self.analysis.notes)

    @property
    def diagnostics(self) -> list[Diagnostic]:
        """Warnings about the inputs (damage repaired, files skipped) and the analysis."""
        return list(self.analysis.diagnostics)

    # ----------------------------------------------------------------- tables

    @cached_property
    def ranks(self) -> pl.DataFrame:
        """One row per rank: host, pid, device, world size, backend, source files, clock alignment."""
        return _frame(self.analysis.ranks)

    @property
    def events(self) -> pl.DataFrame | pl.LazyFrame:
        """Every timed activity (iteration filled): a DataFrame in memory, a ``LazyFrame`` over the per-rank
        Parquet dataset for a job analysed rank by rank (``collect()`` what you need).
        [scan_events][tracekit.api.Job.scan_events] is lazy either way."""
        if self.analysis.dataset is not None:
            return self.analysis.dataset.scan("events")
        return self._events_df

    @cached_property
    def _events_df(self) -> pl.DataFrame:
        return _frame(self.analysis.events)

    def scan_events(self) -> pl.LazyFrame:
        """The events as a ``LazyFrame``, whether the job is in memory or on disk."""
        ev = self.events
        return ev if isinstance(ev, pl.LazyFrame) else ev.lazy()

    @cached_property
    def iterations(self) -> pl.DataFrame:
        """One row per rank x iteration: its window and how iterations were found."""
        return _frame(self.analysis.iterations)

    @cached_property
    def breakdown(self) -> pl.DataFrame:
        """One row per rank x iteration window: compute, overlapped, exposed_comm, memory and idle (adding up to
        ``wall_ns``), wait and transfer, and the link columns."""
        return _frame(self.analysis.breakdown)

    @cached_property
    def collectives(self) -> pl.DataFrame:
        """One row per collective call on one rank (NCCL-log facts joined in)."""
        return _frame(self.analysis.collectives)

    @cached_property
    def collective_instances(self) -> pl.DataFrame:
        """One row per collective matched across ranks: skew, wait, transfer, straggler, bus bandwidth."""
        return _frame(self.analysis.instances)

    @cached_property
    def collective_members(self) -> pl.DataFrame:
        """One row per (instance, rank): the member's own wait and transfer."""
        return _frame(self.analysis.members)

    @cached_property
    def topology(self) -> pl.DataFrame:
        """Connections seen in NCCL debug logs (empty without one)."""
        return _frame(self.analysis.traces.topology)

    @cached_property
    def communicators(self) -> pl.DataFrame:
        """Every member of every NCCL communicator of the logs: commId, rank, nranks, nnodes, host, GPU, version."""
        return _frame(self.analysis.communicators)

    @property
    def topology_overview(self) -> dict[str, Any]:
        """The NCCL topology ``summary`` prints (nodes × GPUs, transports inside and across nodes, networks, per
        communicator its link class); empty without an NCCL log."""
        return self.analysis.topology_overview

    @cached_property
    def nccl_problems(self) -> pl.DataFrame:
        """Problems in the NCCL logs (WARN lines, socket fallbacks, GPU Direct RDMA off, NCCL versions that differ,
        watchdog timeouts, the rank that stopped first), each with its file and line."""
        return _frame(self.analysis.nccl_problems)

    @property
    def hang(self) -> Hang | None:
        """Where every rank stands in every process group and who the job waits for, from its Flight Recorder dumps
        (else NCCL's watchdog lines): ``kind`` (``hung``, ``desync``, ``none``), ``headline``, ``cause_ranks``,
        ``causes``, ``stuck``, ``desyncs``, ``positions`` (`tracekit.analysis.hang.stuck.Hang`); None without
        either (``docs/hangs.md``)."""
        return self.analysis.hang

    @cached_property
    def group_links(self) -> pl.DataFrame:
        """Per process group: its link class (intra/inter) and transport, from the NCCL logs (else the hosts)."""
        return _frame(self.analysis.group_links)

    @cached_property
    def link_classes(self) -> pl.DataFrame:
        """How busy each link class and transport was: ``link_class, transport, ranks, calls, bus_bytes, busy_ns,
        wall_ns, busy_share`` (``summary --json``'s ``link_classes``)."""
        return _frame(self.analysis.link_busy)

    @cached_property
    def top_ops(self) -> pl.DataFrame:
        """Per rank, attribution class and op: calls and time (`tracekit.analysis.top_ops`)."""
        return _frame(self.analysis.top_ops)

    def top_ops_job(self, n: int | None = 10) -> pl.DataFrame:
        """The job's top ``n`` ops per class over every rank (``summary --json``'s ``top_ops``)."""
        from tracekit.analysis import top_ops

        return top_ops.job_level(self.analysis.top_ops, self.analysis.breakdown, n)

    @cached_property
    def idle_breakdown(self) -> pl.DataFrame:
        """Per window: idle time split into host-bound, synchronisation and other (null on CPU-only ranks;
        `tracekit.analysis.idle`)."""
        return _frame(self.analysis.idle_breakdown)

    def critical_path(self, iteration: int | None = None) -> pl.DataFrame:
        """Segments of the critical path (``iteration, step, rank, lane, start_ns, end_ns, dur_ns, label,
        waiting_on, name, event_row, edge``; job clock) of every iteration, or of one. Builds the job's
        dependency graph on first use."""
        segs = self.analysis.critical_path
        if iteration is None:
            return segs
        have = self.critical_path_summary.get_column("iteration").to_list() if self.critical_path_summary.height \
            else []
        if iteration not in have:
            raise TraceError(None, f"no iteration {iteration} (have: {', '.join(map(str, have))})")
        return segs.filter(pl.col("iteration") == iteration)

    @property
    def critical_path_summary(self) -> pl.DataFrame:
        """Per iteration: the path's length (= the iteration time), the share of each label, the ranks it
        crosses and the rank most waited on."""
        return self.analysis.critical_path_summary

    def slowest_iteration(self) -> int:
        """The iteration with the longest critical path (the one ``tracekit critical-path`` shows)."""
        summ = self.critical_path_summary
        if summ.height == 0:
            raise TraceError(None, "no iteration with activity to follow a critical path through")
        return int(summ.sort("path_ns", descending=True).get_column("iteration")[0])

    def tables(self) -> dict[str, pl.DataFrame | pl.LazyFrame]:
        """Every result table by its public name (the names ``tracekit export`` writes)."""
        out: dict[str, pl.DataFrame | pl.LazyFrame] = {}
        for name, t in self.analysis.tables().items():
            out[name] = _frame(t) if isinstance(t, pa.Table) else self.scan_events()
        return out

    # ----------------------------------------------------------------- questions

    @property
    def verdict(self) -> Verdict:
        """What sets the job's pace (replays the job's graph on first use; see [Verdict][tracekit.api.Verdict])."""
        from tracekit.views import summary, verdict
        from tracekit.views.report import horovod_paragraph

        a = self.analysis
        answer = a.verdict
        if a.horovod_only:
            text = horovod_paragraph(a.horovod)
            return Verdict(text=f"{answer.text} {text}", kind=answer.kind, headline=answer.headline, links=text,
                           answer=answer)
        job = summary.job(a.breakdown, a.ranks)
        links = verdict.paragraph(job, summary.stragglers(a.instances), summary.collectives_overview(a.instances),
                                  line_rate_bps=a.line_rate_bps, line_rate_source=a.line_rate_source,
                                  n_ranks=a.ranks.num_rows, sizes=summary.transfer_sizes(a.collectives),
                                  link_classes=a.link_busy.to_pylist())
        b = a.bottleneck if a.dataset is None else None
        return Verdict(text=answer.text, kind=answer.kind, headline=answer.headline, links=links, bottleneck=b,
                       answer=answer)

    def whatif(self, bandwidth: RateArg | Mapping[str, RateArg] | Sequence[RateArg | Mapping[str, RateArg]] | None
               = None, compression: float | Sequence[float] = 1, workers: int | Sequence[int] | None = None,
               efficiency: str | float | None = None, *, latency: str | int | None = None,
               codec_cost: float | None = None, stragglers_removed: bool = False) -> pl.DataFrame:
        """Replay the job with re-costed transfers for every combination of ``bandwidth`` (line rates),
        ``compression`` (ratios) and ``workers``: one row per scenario with ``bandwidth_bps, compression, workers,
        efficiency, links, stragglers_removed, iteration_ns, speedup, scaling_factor``, each prediction with its range
        (``iteration_ns_low/high``, ``speedup_low/high``, ``scaling_factor_low/high``: meant to hold the truth 9
        times in 10) and ``range_sources``, what each range is made of (see `tracekit.api.scenarios` for the
        arguments; ``latency`` is the fixed cost per call, ns or ``"20us"``; ``stragglers_removed`` adds the row of
        the job as it ran with every rank's excess over the median rank's work removed). The rows ``tracekit whatif``
        prints."""
        from tracekit.analysis.graph.whatif import Scenario

        sc = scenarios(bandwidth, compression, workers, efficiency, codec_cost,
                       link_bw_known=self.line_rate_bps is not None or bool(self.analysis.line_rates))
        if stragglers_removed:
            sc = [*sc, Scenario(balanced=True)]
        return self.replay(sc, latency=latency)[0]

    def replay(self, scenarios: Sequence[Scenario], *, latency: str | int | None = None
               ) -> tuple[pl.DataFrame, Bottleneck | None]:
        """The rows of `tracekit.analysis.ranges.sweep` for ``scenarios``, and the bottleneck verdict under
        the same per-call latency (the job's own unless ``latency`` is given)."""
        from tracekit.analysis import ranges
        from tracekit.model.units import parse_duration

        model = self.analysis.whatif
        if model.comm.height == 0:
            raise TraceError(None, "the traces contain no communication: there is nothing to re-cost")
        unc = self.analysis.uncertainty
        saved = model.latency_ns
        if latency is not None:
            model.latency_ns = latency if isinstance(latency, int) else parse_duration(str(latency))
        try:
            try:
                rows = ranges.sweep(unc, list(scenarios))
            except ValueError as exc:
                raise TraceError(None, str(exc)) from exc
            verdict = self.analysis.bottleneck if latency is None or model.latency_ns == saved else \
                self.analysis.bottleneck_of(model)
        finally:
            model.latency_ns = saved
        return rows, verdict

    def summary(self) -> dict[str, Any]:
        """Every number of ``tracekit summary`` as plain Python (what ``summary --json`` prints)."""
        return summary_payload(self.analysis)

    def diff(self, other: Job) -> Diff:
        """This job (the base) against ``other`` (the new run): their [Diff][tracekit.analysis.compare.Diff]
        (`tracekit.api.compare`)."""
        return compare(self, other)

    # ----------------------------------------------------------------- output

    def export(self, out: PathArg, *, force: bool = False, table: str | None = None) -> list[str]:
        """Write every table as Parquet into the directory ``out`` (one ``<name>.parquet`` each), or one table
        (``table``, default ``breakdown``) into ``out`` when it ends in ``.parquet``; atomically, never over an
        existing file unless ``force``. Returns the paths written."""
        from tracekit.views.export import export

        target = os.fspath(out)
        if table is None and self.analysis.horovod_only and target.endswith(".parquet"):
            table = "horovod_breakdown"  # a timeline alone has no five-way breakdown
        return export(self.analysis.tables(), target, force=force, table=table)

    def to_chrome(self, path: PathArg, *, force: bool = False) -> int:
        """Write every rank as one Chrome-trace JSON file on one aligned clock (for Perfetto UI), with the critical
        path as flow arrows; atomically, never over an existing file unless ``force``. Returns the number of
        trace events written."""
        from tracekit.views.chrome import critical_path_flows, write_chrome_trace

        if not self.in_memory:
            raise TraceError(os.fspath(path), "a Chrome trace needs every event in memory: load without engine=, "
                             "scheduler=, dataset= and memory_budget=")
        return write_chrome_trace(self.analysis, path, force=force, flows=critical_path_flows(self.analysis))

    def close(self) -> None:
        """Let the worker processes holding the ranks' graphs go and remove a temporary per-rank dataset
        (``cache=False`` rank by rank); the job's events are gone after."""
        held = self.analysis.rank_graphs
        if held is not None and hasattr(held, "close"):
            held.close()
        if self._finalizer is not None:
            self._finalizer()

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- display

    def _overview(self) -> tuple[str, list[str], list[list[str]], list[str]]:
        """Title, header, rows and footer lines of the reprs (cheap: nothing is replayed)."""
        from tracekit.analysis.verdict import exposed_sentence
        from tracekit.views import summary
        from tracekit.views.report import SHORT_LABELS, fmt_bytes, fmt_ns, fmt_share

        a = self.analysis
        title = f"tracekit.Job {self.name}: {count(self.n_ranks, 'rank')} · {count(self.n_iterations, 'iteration')}"
        if a.dataset is not None:
            title += " · rank by rank"
        header = ["rank", "iters", "median", *[SHORT_LABELS[c] for c in schema.CLASSES], "comm/it"]
        rows: list[list[str]] = []
        pr = summary.per_rank(a.breakdown)
        for r in pr.iter_rows(named=True) if pr.height else []:
            rows.append([str(r["rank"]), str(r["iterations"]), fmt_ns(r["median_iteration_ns"]),
                         *[fmt_share(r[f"{c}_share"]) for c in schema.CLASSES],
                         fmt_bytes(r["comm_bytes_per_iteration"])])
        for rank in summary.without_iterations(a.breakdown, a.ranks):  # a file without iterations stays visible
            rows.append([str(rank), "0", "–", *["–" for _ in schema.CLASSES], "–"])
        footer = []
        answer = a.__dict__.get("verdict")  # only once computed: a repr replays nothing
        if answer is not None:
            footer.append(answer.text)
        elif a.breakdown.num_rows:
            footer.append((exposed_sentence(a.breakdown) or "") + " (job.verdict replays the job for the answer)")
        footer += a.notes
        return title, header, rows, footer

    def __repr__(self) -> str:
        title, header, rows, footer = self._overview()
        widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
        lines = [title, "  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
        lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
        return "\n".join(lines + footer)

    def _repr_html_(self) -> str:
        title, header, rows, footer = self._overview()
        th = "".join(f"<th>{html.escape(h)}</th>" for h in header)
        body = "".join("<tr>" + "".join(f"<td style='text-align:right'>{html.escape(c)}</td>" for c in r) + "</tr>"
                       for r in rows)
        notes = "".join(f"<p>{html.escape(f)}</p>" for f in footer)
        return (f"<div class='tracekit-job'><strong>{html.escape(title)}</strong>"
                f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>{notes}</div>")


# ---------------------------------------------------------------------------------------------------
# summary --json


def compare(base: Job, new: Job, *, top: int | None = None, verdicts: bool = True) -> Diff:
    """The :class:`~tracekit.analysis.compare.Diff` of two loaded jobs (:func:`tracekit.analysis.compare.compare`,
    ``top`` changed ops per scope, by default :data:`~tracekit.analysis.compare.TOP`), with each job's verdict.
    ``verdicts=False`` skips the what-if replays of the verdicts."""
    from tracekit.analysis import compare as comparison

    d = comparison.compare(base.analysis, new.analysis, base_name=base.name, new_name=new.name,
                           top=comparison.TOP if top is None else top)
    if verdicts:
        d.base_verdict, d.new_verdict = base.verdict, new.verdict
    return d


def summary_payload(result: Analysis) -> dict[str, Any]:
    """What ``tracekit summary --json`` prints for ``result``."""
    from tracekit.analysis import idle, top_ops
    from tracekit.views import summary, verdict

    if result.dataset is None and not result.horovod_only:
        result.prefetch("verdict", "top_ops", "idle_breakdown")
    job = summary.job(result.breakdown, result.ranks)
    strag = summary.stragglers(result.instances)
    if not result.one_job.one:  # traces that are not one job: nobody waited on anybody
        strag = strag.clear()
    overview = summary.collectives_overview(result.instances)
    extra = {"horovod": horovod_payload(result)} if result.horovod is not None else {}
    # rank by rank, summary stays with what the per-rank units computed: the replays are whatif's and critical-path's
    bottleneck = result.bottleneck if result.dataset is None else None
    idle_table = result.idle_breakdown
    link_rows = result.link_busy.to_pylist()
    return {
        "job": job,
        "ranks": summary.per_rank(result.breakdown).to_dicts(),
        "iterations": summary.per_iteration(result.breakdown).to_dicts(),
        "breakdown": result.breakdown.to_pylist(),
        "line_rate_bps": result.line_rate_bps,
        "line_rate_source": result.line_rate_source,
        "clocks": clocks(result),
        "collectives": overview,
        "transfer_sizes": summary.transfer_sizes(result.collectives),
        "stragglers": strag.to_dicts(),
        "verdict": extra["horovod"]["text"] if result.horovod_only else
        verdict.paragraph(job, strag, overview, line_rate_bps=result.line_rate_bps,
                          line_rate_source=result.line_rate_source, n_ranks=result.ranks.num_rows,
                          sizes=summary.transfer_sizes(result.collectives),
                          link_classes=link_rows),
        "answer": result.summary_verdict.as_dict(),
        "one_job": result.one_job.as_dict(),
        "ranks_without_iterations": summary.without_iterations(result.breakdown, result.ranks),
        "bottleneck": bottleneck_payload(bottleneck, result.measured_iteration_ns),
        "contention": result.whatif.contention.as_dict() if bottleneck is not None else None,
        "uncertainty": result.uncertainty.as_dict() if "uncertainty" in result.__dict__ else None,
        "nccl": summary.nccl_overview(result.collectives, result.traces.topology).to_dicts(),
        "topology": result.topology_overview or None,
        "nccl_problems": [{**p, "text": _problem_text(p)} for p in result.nccl_problems.to_pylist()],
        "hang": result.hang.as_dict() if result.hang is not None else None,
        "group_links": result.group_links.to_pylist(),
        "link_classes": link_rows,
        "top_ops": top_ops.job_level(result.top_ops, result.breakdown).to_dicts(),
        "idle": {"job": idle.job(idle_table), "ranks": idle.per_rank(idle_table).to_dicts()},
        "idle_breakdown": idle_table.to_pylist(),
        "missing_ranks": result.missing_ranks,
        "notes": result.notes,
        "diagnostics": [str(d) for d in result.diagnostics],
        **extra,
    }


def _problem_text(p: dict[str, Any]) -> str:
    """A problem of the NCCL logs as one diagnostic line: ``path: line N: message``."""
    return str(Diagnostic(p["path"] or "", p["message"], line=p["line"]))


def horovod_payload(result: Analysis) -> dict[str, Any]:
    """The ``horovod`` part of ``summary --json`` (present only when a timeline is)."""
    from tracekit.analysis.horovod import windows as horovod
    from tracekit.views.report import horovod_paragraph

    res = result.horovod
    assert res is not None
    return {
        "only": res.only, "merged": res.merged, "iteration_method": res.method, "world_size": res.world_size,
        "timelines": [{"path": t.path, "clock": t.clock, "format_version": t.meta.get("format_version"),
                       "offset_ns": t.offset_ns, "merged": t.merged, "how": t.how,
                       "iteration_method": t.method, "bytes_lost": t.meta.get("bytes_lost")}
                      for t in res.timelines],
        "summary": horovod.summary(res),
        "totals": res.totals,
        "breakdown": res.breakdown.to_pylist(),
        "text": horovod_paragraph(res),
    }


def bottleneck_payload(b: Bottleneck | None, measured_ns: int | None = None) -> dict[str, Any] | None:
    """A :class:`~tracekit.analysis.bottleneck.Bottleneck` as the ``bottleneck`` object of ``summary --json``:
    ``measured_iteration_ns`` the job's measured iteration (the one figure every view gives), ``replayed_iteration_ns``
    the job replayed as measured (what the replays' speed-ups are against)."""
    if b is None:
        return None
    return {"measured_iteration_ns": measured_ns, "replayed_iteration_ns": b.measured_ns,
            "free_comm_iteration_ns": b.free_ns,
            "scaling_factor_measured": b.scaling_measured, "scaling_factor_full_utilisation": b.scaling_full,
            "line_rate_bps": b.line_rate_bps, "compression_needed": b.compression_needed,
            "bandwidth_needed_bps": b.bandwidth_needed_bps, "bandwidth_needed_factor": b.bandwidth_needed_factor,
            "target": b.target, "text": b.text, "sizes": b.sizes, "assumption": b.assumption, "note": b.note}


def clocks(result: Analysis) -> list[dict[str, Any]]:
    """How each rank's clock was aligned (the ``clocks`` of the JSON outputs)."""
    cols = ["rank", "host", "clock_offset_ns", "clock_estimate_ns", "clock_residual_ns", "clock_method"]
    return result.ranks.select(cols).to_pylist()
