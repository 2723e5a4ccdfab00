"""The analysis pipeline: a TraceSet in, every result table out. Pure functions of the tables; the CLI,
the exporters and the TUI only read an :class:`Analysis`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Protocol

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.allocators import release_memory
from tracekit.analysis import (
    attribution,
    background,
    bottleneck,
    collectives,
    idle,
    iterations,
    link_classes,
    links,
    loader,
    missing,
    one_job,
    ranges,
    top_ops,
    verdict,
    waited,
)
from tracekit.analysis.graph import critical_path, dag, whatif
from tracekit.analysis.hang import stuck as hang
from tracekit.analysis.horovod import windows as horovod
from tracekit.analysis.nccl import join as nccl_join
from tracekit.analysis.nccl import problems as nccl_problems
from tracekit.analysis.nccl import topology as nccl_topology
from tracekit.loading.traceset import TraceSet
from tracekit.model import schema
from tracekit.model.diagnostics import Diagnostic, TraceError
from tracekit.model.units import memory_budget

if TYPE_CHECKING:
    from concurrent.futures import Future

    from tracekit.scale.dataset import Dataset

#: memory one event takes while its rank's exposed communication is split (events table + attribution sweep)
SPLIT_BYTES_PER_EVENT = 400


class RankGraphSource(Protocol):
    """What a job analysed rank by rank gives :attr:`Analysis.graph` and :attr:`Analysis.whatif`
    (:class:`tracekit.scale.graphs.RankGraphs`; named here so that the analysis does not import the scale layer)."""

    leaves: pl.DataFrame | None

    def graph(self, analysis: Analysis) -> dag.Graph: ...

    def paths(self, analysis: Analysis, iteration: int | list[int] | None = None) -> pl.DataFrame: ...

    def model(self, analysis: Analysis) -> whatif.Model: ...


@dataclass
class EventBatches:
    """The events of every rank as a stream of batches (for exports that must not hold them all)."""

    dataset: Dataset
    schema: pa.Schema = schema.EVENTS

    def batches(self) -> Iterator[pa.RecordBatch]:
        return self.dataset.event_batches()


@dataclass
class Analysis:
    """Results of analysing one job. Table column names are a public contract (DESIGN.md)."""

    traces: TraceSet
    events: pa.Table  # with the iteration column filled
    iterations: pa.Table
    breakdown: pa.Table
    ranks: pa.Table  # the TraceSet's ranks with the clock columns filled
    collectives: pa.Table  # the TraceSet's, with NCCL-log facts joined into the trace rows
    instances: pa.Table  # collective_instances
    members: pa.Table  # collective_members: one row per (instance, rank)
    line_rate_bps: float | None = None
    line_rate_source: str | None = None  # "given", "topology" or None
    #: line rates of some links only, by selector (process group name or description, ``intra``, ``inter``)
    line_rates: dict[str, float] = field(default_factory=dict)
    matched: bool = False  # whether collectives were matched across ranks (wait/transfer known)
    notes: list[str] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)  # the inputs' and the analysis' warnings
    #: Horovod timelines' tables (tracekit/analysis/horovod/windows.py), None without one
    horovod: horovod.Result | None = None
    dataset: Dataset | None = None  # set when analysed rank by rank: the events stay on disk (``events`` is empty)
    #: ranks the job had (stated world size, process groups' members) that no input holds (:mod:`.missing`)
    missing_ranks: list[int] = field(default_factory=list)
    memory_budget: str | int | None = None  # rank by rank: the memory one rank's events may take (--memory-budget)
    #: rank by rank: where the job's dependency graph comes from — the ranks' compact graphs, combined on first use
    #: (:class:`tracekit.scale.graphs.RankGraphs`); None where there is none
    rank_graphs: RankGraphSource | None = None

    @property
    def horovod_only(self) -> bool:
        """A job of Horovod timelines without profiler traces: no compute to attribute, no five-way breakdown."""
        return self.horovod is not None and self.horovod.only

    @cached_property
    def graph(self) -> dag.Graph:
        """The dependency graph of the whole job (built on first use; rank by rank, combined from the ranks'
        compact graphs: :mod:`tracekit.analysis.graph.compact`)."""
        if self.dataset is not None:
            if self.rank_graphs is None:
                raise TraceError(None, "the critical path and what-if need the ranks' dependency graphs, which this "
                                 "job analysed rank by rank does not have")
            graph = self.rank_graphs.graph(self)
            release_memory()
            return graph
        # Horovod's phases are a coordinator's per-tensor view, not a thread's program order: the graph (critical
        # path, what-if) is built from the profiler traces only
        events = self.events if self.horovod is None else horovod.without_timeline(self.events)
        graph = dag.build(events, self.ranks, self.consistent_members)
        release_memory()  # the build's temporaries (~90 MB of a 300 MB trace's) would stay in glibc's heap
        return graph

    @cached_property
    def consistent_members(self) -> pl.DataFrame | None:
        """The members of instances consistent in time (:func:`tracekit.analysis.graph.whatif.consistent_members`):
        the collective edges of the graph, of the what-if model and of the ranks' graphs held apart, made once."""
        return whatif.consistent_members(self.members, self.instances, self.collectives)

    @cached_property
    def critical_path(self) -> pl.DataFrame:
        """Critical-path segments of every iteration (:mod:`tracekit.analysis.graph.critical_path`): rank by rank,
        followed where the ranks' graphs are held unless the job's graph is combined already (the same segments)."""
        if self._held_apart:
            return self.rank_graphs.paths(self)  # type: ignore[union-attr]
        return critical_path.paths(self.graph, self.iterations, self.ranks)

    @property
    def _held_apart(self) -> bool:
        """Whether the critical path and the what-if go where the ranks' graphs are held (rank by rank, the job's graph
        not combined)."""
        return self.dataset is not None and self.rank_graphs is not None and "graph" not in self.__dict__

    @cached_property
    def critical_path_summary(self) -> pl.DataFrame:
        """Per iteration: path length, share of each label, ranks crossed, most waited-on rank."""
        return critical_path.summary(self.critical_path, self.iterations, self.ranks)

    @property
    def pg_desc(self) -> dict[str, str]:
        """Process group name -> description, from the traces' ``pg_config``."""
        return collectives.group_descs(f.meta for f in self.traces.files)

    @cached_property
    def whatif(self) -> whatif.Model:
        """The what-if model of the job (its graph with re-costable transfers): rank by rank, replayed where the ranks'
        graphs are held unless the job's graph is combined already (the same predictions)."""
        if self._held_apart:
            model = self.rank_graphs.model(self)  # type: ignore[union-attr]
            if self.measured_iteration_ns:
                model.measured_iteration_ns = self.measured_iteration_ns
            return model
        graph = self.graph
        leaves = self.rank_graphs.leaves if self.dataset is not None and self.rank_graphs is not None else None
        model = whatif.build(self.events if self.dataset is None else None, self.collectives, self.ranks,
                             self.members, self.instances, line_rate_bps=self.line_rate_bps, graph=graph,
                             line_rates=self.line_rates, pg_desc=self.pg_desc, group_links=self.group_links,
                             leaves=leaves, consistent=self.consistent_members)
        if self.measured_iteration_ns:  # the one measured figure every view gives (the graph's is the same statistic)
            model.measured_iteration_ns = self.measured_iteration_ns
        release_memory()
        return model

    @cached_property
    def loader_events(self) -> pa.Table:
        """Every rank's data-loader ``__next__`` events (:func:`tracekit.analysis.loader.events`): from the events in
        memory, or from each rank's events in turn in the per-rank dataset of a job analysed rank by rank (the columns
        it needs, 16 ranks at a time: a scan of every rank at once held ~0.7 GB more for 512 GPU ranks)."""
        if self.dataset is None:
            return loader.events(self.events)
        parts = [loader.events(scan) for scan in self.dataset.scans("events", 16)]
        return pa.concat_tables(parts) if parts else loader.events(schema.empty(schema.EVENTS))

    @cached_property
    def one_job(self) -> one_job.OneJob:
        """Whether the traces are one job's (:mod:`tracekit.analysis.one_job`), and every rank's files."""
        return one_job.check(self.ranks, self.collectives, self.instances, self.iterations)

    @cached_property
    def measured_iteration_ns(self) -> int | None:
        """The job's measured iteration time, the one figure every view gives: the median time between consecutive
        iteration starts on the job clock (:func:`tracekit.analysis.iterations.measured_iteration_ns`)."""
        return iterations.measured_iteration_ns(self.iterations, self.ranks)

    @cached_property
    def bottleneck(self) -> bottleneck.Bottleneck | None:
        """Is the network the bottleneck? None when the job has no communication."""
        if self.horovod_only or (self.dataset is not None and self.rank_graphs is None) or \
                self.whatif.comm.height == 0:
            return None
        return self.bottleneck_of(self.whatif)

    def bottleneck_of(self, model: whatif.Model) -> bottleneck.Bottleneck | None:
        """:func:`~tracekit.analysis.bottleneck.bottleneck` of ``model`` (this job's, or it under another per-call
        latency), with the breakdown's word where the replay gains far less than the exposed communication
        suggests (:func:`~tracekit.analysis.bottleneck.with_small_gain_note`)."""
        b = bottleneck.bottleneck(model)
        if b is None:
            return None
        bd = self.breakdown
        wall = pc.sum(bd.column("wall_ns")).as_py() or 0
        if wall <= 0:
            return b
        exposed = (pc.sum(bd.column("exposed_comm_ns")).as_py() or 0) - (pc.sum(bd.column("wait_ns")).as_py() or 0)
        return bottleneck.with_small_gain_note(b, exposed / wall)

    @cached_property
    def verdict(self) -> verdict.Answer:
        """The job's one verdict (:mod:`tracekit.analysis.verdict`): from the replays and the critical path, or from
        the attribution alone (and saying so) where no replay can run."""
        if self.horovod_only:
            return verdict.from_attribution(self.breakdown, collectives.stragglers(self.instances),
                                            "Horovod timelines alone have no dependency graph to replay")
        if self.dataset is not None and self.rank_graphs is None:
            return verdict.from_attribution(self.breakdown, collectives.stragglers(self.instances),
                                            "the job was read rank by rank without the ranks' dependency graphs, "
                                            "which the replays need (tracekit whatif or critical-path builds them)")
        told = self._hang_answer
        if told is not None:
            return told
        if self.breakdown.num_rows == 0:
            return verdict.Answer("none", "No iterations found: nothing to attribute.")
        if not self.one_job.one:  # unrelated traces: no cross-rank verdict
            return verdict.Answer("none", self.one_job.headline(), source="check")
        # the path's sample on a thread of its own (verdict_path), the ranks' balance (the stragglers' replay needs
        # it) on another, beside the replays of free and measured communication
        model = self.whatif
        if model.graph is not None:
            self.graph  # noqa: B018 (built before the threads below read it)
        # (where the ranks' graphs are held apart, their hosts take one question at a time: RankPaths.lock)
        path_soon = None if "verdict_path" in self.__dict__ else background.start(
            lambda: self.verdict_path, name="tracekit-paths")
        balance_soon = background.start(lambda: model.balance, name="tracekit-balance")
        loader_soon = background.start(lambda: self.loader_events, name="tracekit-loader")  # (no replay: beside them)
        if model.remote is not None:  # the replays the verdict and the bottleneck read, in one batch
            with contextlib.suppress(whatif.UnknownSizes):  # (a scenario nobody can cost raises where it is asked)
                model.remote.replay([(model, sc) for sc in verdict.point_scenarios(model)])
        b = self.bottleneck
        balance_soon.result()
        loader_soon.result()
        segs, summ = path_soon.result() if path_soon is not None else self.verdict_path
        return verdict.classify(model, b, summ, self.breakdown, self.iterations, self.ranks,
                                segs, self.link_busy.to_pylist(), verdict.input_time(self.loader_events),
                                loader.spans(self.loader_events, self.ranks),
                                waited.most_waited_on(self.instances, collectives.stragglers(self.instances),
                                                      self.iterations, self.ranks, self.measured_iteration_ns),
                                uncertainty=self.uncertainty)

    @cached_property
    def verdict_path(self) -> tuple[pl.DataFrame, pl.DataFrame]:
        """The measured critical path's segments of a few iterations spread over the job, and its summary: what the
        verdict and the ranges read (the same whatever else was computed; off the whole path where it exists)."""
        its = critical_path.sample(critical_path.iteration_spans(self.iterations, self.ranks)["iteration"].to_list())
        segs = (self.critical_path.filter(pl.col("iteration").is_in(its)) if "critical_path" in self.__dict__
                else self.rank_graphs.paths(self, its) if self._held_apart  # type: ignore[union-attr]
                else critical_path.paths(self.graph, self.iterations, self.ranks, iteration=its))
        return segs, critical_path.summary(segs, self.iterations, self.ranks)

    @cached_property
    def uncertainty(self) -> ranges.Uncertainty:
        """What is uncertain in this job's trace, behind every prediction's range (`tracekit.analysis.ranges`)."""
        return ranges.measure(self.whatif, self.breakdown, self.verdict_path[0],
                              replay_ns=self.whatif.replayed_iteration_ns)

    @property
    def summary_verdict(self) -> verdict.Answer:
        """The verdict ``tracekit summary`` gives: :attr:`verdict`, except for a job read rank by rank, which summary
        does not replay (the replays are whatif's and critical-path's): then from the attribution, and saying so."""
        if self.dataset is not None and "verdict" not in self.__dict__ and self._hang_answer is None:
            if self.breakdown.num_rows and not self.one_job.one:
                return verdict.Answer("none", self.one_job.headline(), source="check")
            return verdict.from_attribution(self.breakdown, collectives.stragglers(self.instances),
                                            "summary reads a job rank by rank without replaying it (tracekit whatif "
                                            "or critical-path gives the verdict from the replays)")
        return self.verdict

    @cached_property
    def hang(self) -> hang.Hang | None:
        """Where every rank stands in every process group, and who the job waits for, from its Flight Recorder dumps
        (else NCCL's watchdog lines): :mod:`tracekit.analysis.hang.stuck`. None with neither."""
        tables = self.traces.tables
        logs = any(f.format == "nccl-log" for f in self.traces.files)
        if "fr_dumps" not in tables and not logs:
            return None
        sizes = [w for w in self.ranks.column("world_size").to_pylist() if w] if self.ranks.num_rows else []
        return hang.analyse(tables, groups=collectives.groups_from_meta(f.meta for f in self.traces.files),
                            world_size=max(sizes, default=None), events=self.events if self.dataset is None else None,
                            problems=self.nccl_problems if logs else None)

    @property
    def _hang_answer(self) -> verdict.Answer | None:
        """The verdict a hang or desync gives (it comes first), or where dumps are all there is; else None."""
        h = self.hang
        if h is None or (h.kind == "none" and self.breakdown.num_rows):
            return None
        return verdict.from_hang(h)

    # ------------------------------------------------------------- the NCCL logs' topology and problems

    @cached_property
    def communicators(self) -> pa.Table:
        """COMMUNICATORS of the job's NCCL logs: every member of every communicator, its host and GPU."""
        return nccl_topology.communicators([self.traces.tables.get("communicators")])

    @cached_property
    def connections(self) -> pl.DataFrame:
        """The ``topology`` rows with each connection's transport name, peer host and link class
        (:func:`~tracekit.analysis.nccl.topology.connections`)."""
        return nccl_topology.connections(self.traces.topology, self.communicators)

    @cached_property
    def comm_links(self) -> pl.DataFrame:
        """Per NCCL communicator: its link class and binding transport (:mod:`tracekit.analysis.nccl.topology`)."""
        return nccl_topology.comm_links(self.connections, self.communicators)

    @cached_property
    def group_links(self) -> pa.Table:
        """GROUP_LINKS: each process group's link class and transport, from the NCCL logs (else the hosts)."""
        groups = collectives.groups_from_meta(f.meta for f in self.traces.files)
        return nccl_topology.group_links(self.collectives, self.comm_links, self.communicators, groups, self.ranks)

    @property
    def nccl_processes(self) -> list[dict]:
        """The processes the NCCL logs show (their ``meta["processes"]``)."""
        return [p for f in self.traces.files if f.format == "nccl-log" for p in f.meta.get("processes") or []]

    @cached_property
    def topology_overview(self) -> dict:
        """The NCCL topology summary prints: nodes × GPUs, transports inside and across nodes, networks
        (:func:`~tracekit.analysis.nccl.topology.overview`); empty without an NCCL log."""
        return nccl_topology.overview(self.communicators, self.connections, self.comm_links,
                                      self.traces.tables.get("nccl_network"), self.nccl_processes)

    @cached_property
    def nccl_problems(self) -> pa.Table:
        """NCCL_PROBLEMS: WARN lines, socket fallbacks, GPU Direct RDMA off, NCCL versions that differ, watchdog
        timeouts and which rank stopped first, each with its file and line (:mod:`tracekit.analysis.nccl.problems`)."""
        conns, comms = self.connections, self.comm_links
        inter = (conns.height and (conns.get_column("link_class") == "inter").any()) or \
            (comms.height and (comms.get_column("link_class") == "inter").any())
        multi_node = True if inter else False if conns.height else None
        return nccl_problems.problems(self.traces.files, multi_node)

    @cached_property
    def link_busy(self) -> pa.Table:
        """LINK_BUSY: how busy each link class (and transport) was (:mod:`tracekit.analysis.link_classes`)."""
        return link_classes.busy(self.collectives, self.members, self.breakdown, self.group_links, self.ranks)

    @cached_property
    def top_ops(self) -> pa.Table:
        """Per rank, attribution class and op: the time of the kernels and CPU operators behind each class
        (:mod:`tracekit.analysis.top_ops`)."""
        return self._per_rank_events(lambda ev, it: top_ops.table(ev, it, self._activity_of(ev)), schema.TOP_OPS,
                                     "top_ops")

    @cached_property
    def op_totals(self) -> pa.Table:
        """Per rank and op: calls and time inside the iteration windows (:func:`tracekit.analysis.top_ops.totals`)."""
        return self._per_rank_events(lambda ev, it: top_ops.totals(ev, it, self._activity_of(ev)),
                                     top_ops.TOTALS_SCHEMA, "op_totals")

    @cached_property
    def idle_breakdown(self) -> pa.Table:
        """Per window: its idle time split into host-bound, synchronisation and other
        (:mod:`tracekit.analysis.idle`)."""
        return self._per_rank_events(lambda ev, it: idle.breakdown(ev, it, self.breakdown, self._activity_of(ev)),
                                     schema.IDLE_BREAKDOWN, "idle_breakdown")

    @cached_property
    def activity(self) -> pl.DataFrame:
        """Attribution's intervals of the job's events (:func:`tracekit.analysis.attribution.activity`), once for
        the top ops, the idle split and the timeline (in memory only)."""
        return attribution.activity(self.events)

    def _activity_of(self, events: pa.Table) -> pl.DataFrame | None:
        """:attr:`activity` when ``events`` are the job's own in memory, else None (computed from them)."""
        return self.activity if events is self.events and self.dataset is None else None

    def _per_rank_events(self, fn, out_schema: pa.Schema, stored: str | None = None) -> pa.Table:
        """``fn(events, iterations)`` of the job — of each rank in turn when the events stay on disk (a rank over the
        memory budget is left out, and a note says so; the table ``stored`` where the rank's unit wrote it)."""
        if self.horovod_only or self.breakdown.num_rows == 0:
            return schema.empty(out_schema)
        if self.dataset is None:
            events = self.events if self.horovod is None else horovod.without_timeline(self.events)
            return schema.conform(fn(events, self.iterations), out_schema)
        budget = memory_budget(self.memory_budget)
        iters = pl.from_arrow(self.iterations)
        assert isinstance(iters, pl.DataFrame)
        parts, too_big = [], []
        have = self.dataset.ranks_with(stored) if stored else set()
        if have:
            t = self.dataset.table(stored)  # type: ignore[arg-type]
            parts.append(schema.conform(t, out_schema))
        for rank, n in sorted(self.dataset.rank_event_counts().items()):
            if rank in have:
                continue
            if n * SPLIT_BYTES_PER_EVENT > budget:
                too_big.append(rank)
                continue
            parts.append(schema.conform(fn(self.dataset.rank_events(rank),
                                           iters.filter(pl.col("rank") == rank).to_arrow()), out_schema))
        if too_big:
            note = (f"top ops and idle split of rank{'s' if len(too_big) > 1 else ''} {_ranks_text(too_big)} left out: "
                    "its events exceed the memory budget")
            if note not in self.notes:
                self.notes.append(note)
        out = pa.concat_tables(parts) if parts else schema.empty(out_schema)
        if len(parts) > 1 and out.num_rows:  # rank by rank, in rank order (each rank's rows as it ordered them)
            ranks = pl.from_arrow(out.select(["rank"]))
            assert isinstance(ranks, pl.DataFrame)
            out = out.take(ranks.with_row_index("_i").sort("rank", maintain_order=True).get_column("_i").to_arrow())
        return out

    def prefetch(self, *names: str) -> None:
        """Compute these analyses (cached properties): the first in this thread, the others one after another in a
        second one. numpy, polars and Arrow release the GIL in their loops, so the what-if's graph and the top ops
        share two cores; a thread each would hold every one's working memory at once for no more cores. An
        analysis that fails here is left uncomputed and raises again where it is used."""
        todo = [n for n in names if n not in self.__dict__]
        if len(todo) < 2:
            return
        future = self.start(*todo[1:])
        self._compute(todo[:1])
        if future is not None:
            future.result()

    def start(self, *names: str) -> Future[None] | None:
        """Begin computing these analyses, in order, in a thread of their own (None: all are computed already);
        the future is done when they are. Wait for it before using them: a cached property computed in two
        threads at once would be computed twice."""
        todo = [n for n in names if n not in self.__dict__]
        return background.start(self._compute, todo) if todo else None

    def _compute(self, names: list[str]) -> None:
        """Compute each named analysis; one that fails is left for where it is used, to raise there."""
        for n in names:
            with contextlib.suppress(Exception):
                getattr(self, n)

    def tables(self, *, paths: bool = True, ops: bool = True) -> Tables:
        """Every exportable table by name (the events as a stream of batches when they stay on disk), each
        computed when first looked up (exporting one table computes no other); ``paths=False`` leaves out the
        critical-path tables, which build the job's dependency graph on first use, and ``ops=False`` the top ops
        and idle split (the TUI asks without them until its loading worker has computed them)."""
        out: dict[str, Callable[[], pa.Table | EventBatches]] = {
            "ranks": lambda: self.ranks,
            "events": lambda: self.events if self.dataset is None else EventBatches(self.dataset),
            "iterations": lambda: self.iterations,
            "breakdown": lambda: self.breakdown,
            "collectives": lambda: self.collectives,
            "collective_instances": lambda: self.instances,
            "collective_members": lambda: self.members,
        }
        if self.traces.topology.num_rows:
            out["topology"] = lambda: self.traces.topology
        extra = self.traces.tables
        for name, table_schema in (("communicators", schema.COMMUNICATORS), ("nccl_graph", schema.NCCL_GRAPH),
                                   ("nccl_network", schema.NCCL_NETWORK)):
            if extra.get(name) is not None and extra[name].num_rows:
                out[name] = (lambda: self.communicators) if name == "communicators" else \
                    (lambda t=extra[name], s=table_schema: schema.conform(t, s))
        if any(f.format == "nccl-log" for f in self.traces.files):
            out["nccl_problems"] = lambda: self.nccl_problems
            if self.collectives.num_rows and not self.horovod_only:  # a job of traces and its NCCL logs
                out["group_links"] = lambda: self.group_links
                out["link_busy"] = lambda: self.link_busy
        if "fr_dumps" in extra:  # the Flight Recorder dumps' tables and every rank's position in every group
            for name in hang.FR_TABLES:
                if name in extra:
                    out[name] = lambda t=extra[name]: t
            out["hang_positions"] = lambda: self.hang.positions if self.hang is not None else \
                schema.empty(schema.HANG_POSITIONS)
        if ops and not self.horovod_only:
            out["top_ops"] = lambda: self.top_ops
            out["idle_breakdown"] = lambda: self.idle_breakdown
        # a timeline alone has no compute to follow a path through; rank by rank, the ranks' graphs combined
        if paths and not self.horovod_only and (self.dataset is None or self.rank_graphs is not None):
            out["critical_path"] = lambda: self.critical_path.to_arrow()
            out["critical_path_summary"] = lambda: self.critical_path_summary.to_arrow()
        if self.horovod is not None:
            for name, table in self.horovod.tables().items():
                out[name] = lambda t=table: t
        return Tables(out)


class Tables(Mapping[str, "pa.Table | EventBatches"]):
    """Result tables by name, each computed when first looked up (``dict(tables)`` computes them all)."""

    def __init__(self, makers: dict[str, Callable[[], pa.Table | EventBatches]]) -> None:
        self._makers = makers
        self._made: dict[str, pa.Table | EventBatches] = {}

    def __getitem__(self, name: str) -> pa.Table | EventBatches:
        if name not in self._made:
            self._made[name] = self._makers[name]()
        return self._made[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._makers)

    def __len__(self) -> int:
        return len(self._makers)


def analyse(traces: TraceSet, *, step_marker: str | None = None, link_bw_bps: float | None = None,
            align_clocks: bool = True, line_rates: dict[str, float] | None = None,
            only_iterations: Collection[int] | None = None) -> Analysis:
    """Iterations, cross-rank matching and clocks, attribution (with wait/transfer where matched) and link
    figures for every rank of ``traces``. ``link_bw_bps`` is the line rate (bits/s) to compare with;
    ``line_rates`` that of some links only (the what-if's, by selector: :func:`tracekit.analysis.link_classes.selects`);
    ``only_iterations`` analyses those iterations alone (:func:`tracekit.analysis.iterations.select`: everything
    after the iterations are found, the graph and its replays included, sees only them)."""
    hvd = horovod.prepare(traces, step_marker)  # None without a Horovod timeline
    if only_iterations is not None and hvd is not None:
        raise TraceError(None, "iterations= does not apply to Horovod timelines (their cycles are not the "
                               "profiler's steps)")
    if hvd is not None:  # Horovod's collectives on the clock its timeline was aligned to
        traces = replace(traces, collectives=hvd.collectives)
    colls, join_notes = nccl_join.join(traces.collectives)
    base = traces.events if hvd is None else hvd.base_events(traces.events)
    # attribution's intervals read no iteration: without a timeline they are those of the events before their
    # iterations are assigned, computed meanwhile on the other core
    act_soon = background.start(attribution.activity, base) if hvd is None and only_iterations is None else None
    events, iters = iterations.assign(base, step_marker)
    if only_iterations is not None:
        events, iters, colls = iterations.select(events, iters, colls, frozenset(only_iterations))
    if hvd is not None:
        events, iters = hvd.use_iterations(events, iters)
    attr_events = events if hvd is None else hvd.attribution_events(events)
    groups = collectives.groups_from_meta(f.meta for f in traces.files)
    matching = collectives.match(colls, traces.ranks, groups=groups, events=events, align=align_clocks)
    colls = collectives.fill_sizes(colls, matching)
    split = collectives.comm_split(attr_events, matching) if matching.matched else None
    act = act_soon.result() if act_soon is not None else attribution.activity(attr_events)
    breakdown = attribution.breakdown(attr_events, iters, colls, comm_split=split, act=act)
    if hvd is not None:
        breakdown = hvd.attribute(breakdown, attr_events, iters, colls, split)
    rate, rate_source = links.line_rate(link_bw_bps, traces.topology)
    breakdown = links.window_links(breakdown, colls, rate)
    instances = links.instance_links(matching.instances, rate)
    ranks = collectives.apply_clocks(traces.ranks, matching.clocks)
    gone = missing.missing_ranks(traces.ranks, groups)
    gone_note = [n for n in [missing.note(gone, traces.ranks, groups, instances)] if n is not None]
    gone_note += missing.truncated(traces.ranks, iters)
    notes = []
    sizes_note = collectives.transfer_sizes(colls)["note"]
    if sizes_note:
        notes.append(sizes_note)
    methods = sorted(set(iters.column("method").to_pylist())) if iters.num_rows else []
    if methods:
        notes.append("iterations from " + ", ".join(methods))
    hvd_result = None
    if hvd is not None:
        notes.extend(hvd.notes)
        if hvd.only:
            notes.append("Horovod timeline without profiler traces: no compute to attribute (give rank 0's "
                         "trace for the five-way breakdown)")
        else:
            notes.append("critical path and what-if use the profiler traces only (Horovod's phases are not in "
                         "their graph)")
        hvd_result = horovod.result(hvd, iters, rate)
    result = Analysis(traces=traces, events=events, iterations=iters, breakdown=breakdown, ranks=ranks,
                      collectives=colls, instances=instances, members=matching.members, line_rate_bps=rate,
                      line_rate_source=rate_source, line_rates=dict(line_rates or {}), matched=matching.matched,
                      notes=notes,
                      diagnostics=[*traces.diagnostics, *gone_note, *join_notes, *matching.diagnostics,
                                   *(hvd.diagnostics if hvd is not None else [])],
                      horovod=hvd_result, missing_ranks=gone)
    if attr_events is events:  # the top ops, idle split and timeline use these same intervals
        result.__dict__["activity"] = act
    return result


def _ranks_text(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks[:8])) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")
