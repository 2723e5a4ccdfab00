"""The dependency graph of a job analysed rank by rank: each rank's compact graph, made where its unit runs, and the
job's graph combined from them (:mod:`tracekit.analysis.graph.compact`; DESIGN.md "At scale").

A rank's unit (:func:`tracekit.scale.dataset.run_unit`, in a local process or on a Dask worker) builds the rank's
dependency graph from its events — on its own clock, without the collective edges, which need every rank — compacts
it, and writes beside the rank's other tables::

    rank=R/graph.act.parquet      its compact activities (node times as t_start, t_end)
    rank=R/graph.edges.parquet    its edges (src, dst, lag, etype, gap)
    rank=R/graph.leaves.parquet   its innermost compute operations (what the contention fit reads)

A dataset made without them (by ``summary``) gets them from its events later: :func:`ensure` runs one
:func:`run_graph_unit` per rank on the same engine and records the files in ``graphs.json`` (sealed, beside the
manifest). :func:`combined` then reads every rank's graph, puts it on the job clock and adds the collective edges:
what the combine step holds is the compact graphs of every rank, never an event.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
import pyarrow as pa

from tracekit.analysis import background
from tracekit.analysis.graph import compact, dag, whatif
from tracekit.loading.cache import read_text, seal, unseal, verify_files
from tracekit.model import schema
from tracekit.model.diagnostics import Diagnostic, TraceError
from tracekit.scale.dataset import GRAPHS_MANIFEST
from tracekit.scale.rank_graph import FILES, GRAPH_BYTES_PER_EVENT, fits, rank_graph, write_rank_graph  # noqa: F401
from tracekit.scale.rank_parts import Source
from tracekit.scale.rank_paths import JobTables, RankPaths
from tracekit.scale.unit import where

if TYPE_CHECKING:
    from tracekit.scale.dataset import Dataset


#: threads reading the ranks' graph files
READ_THREADS = 8
#: a job whose ranks' graphs took less than this to build (:data:`GRAPH_BYTES_PER_EVENT` per event: ~3 M events) has
#: its critical path followed in the client's process (starting worker processes would cost more than they save:
#: 32 generated GPU ranks of 45 000 events, 2.9 s and 664 MB in one process, 5.3 s in three); more, in worker
#: processes (one per core), so that the client's memory does not grow with the job
HOSTS_MIN_BYTES = 2 << 30
#: the bytes of its ranks' stored tables each host reads ahead as it starts (:meth:`RankGraphs.open_soon`): they are
#: its graphs soon, and the rest is read as each rank is bound
PREFETCH_BYTES = 256 << 20


@dataclass(frozen=True)
class GraphUnit:
    """One rank's graph from its events in the dataset: read ``root/part/events.parquet``, write the graph beside."""

    root: str
    part: str
    budget: int


def run_graph_unit(u: GraphUnit) -> dict[str, Any]:
    """The graph of one rank of an existing dataset (pure: its effects are the graph's files in the rank's part)."""
    import pyarrow.parquet as pq

    d = Path(u.root) / u.part
    p = d / "events.parquet"
    if not p.exists():
        raise TraceError(where(d), "the dataset's events are not visible here (workers must see --dataset at the same "
                         "path)")
    n = pq.ParquetFile(str(p)).metadata.num_rows
    if not fits(n, u.budget):
        return {"part": u.part, "files": {}, "skipped": n}
    t = pq.read_table(str(p))
    t = t.append_column(schema.EVENTS.field("rank"), pa.array(np.zeros(t.num_rows, np.int32)))
    events = schema.conform(t, schema.EVENTS)
    return {"part": u.part, "files": write_rank_graph(events, d), "skipped": None}


def available(ds: Dataset) -> dict[str, dict[str, Any]]:
    """The graph files the dataset has (from its build, or added later and recorded in :data:`GRAPHS_MANIFEST`)."""
    files = {k: v for k, v in ds.manifest.get("files", {}).items() if k.rsplit("/", 1)[-1] in FILES}
    try:
        extra = unseal(read_text(ds.root / GRAPHS_MANIFEST))
    except OSError:
        extra = None
    if extra is not None and extra.get("key") == ds.manifest.get("key") and extra.get("format") == compact.FORMAT:
        files.update(extra.get("files", {}))
    return files


def missing(ds: Dataset) -> list[str]:
    """The per-rank parts whose graph is neither built nor known to be over the budget."""
    have = available(ds)
    skipped = set(_skipped(ds))
    return [d for d, r in ds.parts if r is not None and f"{d}/graph.act.parquet" not in have and d not in skipped]


def _skipped(ds: Dataset) -> list[str]:
    out = [f"rank={s['rank']}" for s in ds.manifest.get("graphs_skipped", [])]
    try:
        extra = unseal(read_text(ds.root / GRAPHS_MANIFEST))
    except OSError:
        extra = None
    if extra is not None and extra.get("key") == ds.manifest.get("key"):
        out += extra.get("skipped", [])
    return out


def damaged(ds: Dataset) -> list[str]:
    """The per-rank parts whose graph files are not there with their recorded size and CRC-32."""
    have = available(ds)
    bad = {k.rsplit("/", 1)[0] for k, v in have.items() if not verify_files(ds.root, {k: v})}
    return [d for d, r in ds.parts if d in bad]


def ensure(ds: Dataset, engine: Any = None, budget: int | None = None, parts: list[str] | None = None) -> None:
    """Give every rank of ``ds`` its graph (built from its events where the dataset was made without them; ``parts``:
    built again for these), on ``engine`` (default: local processes)."""
    from tracekit.model.units import memory_budget
    from tracekit.scale import engine as engines

    todo = missing(ds) if parts is None else parts
    if not todo:
        return
    b = memory_budget(budget)
    units = [GraphUnit(str(ds.root), d, b) for d in todo]
    eng = engine or engines.LocalEngine(None, sum(ds.rank_event_counts().values()) * 100)
    files: dict[str, Any] = {}
    skipped: list[str] = []
    with eng:
        for _, res in eng.map(run_graph_unit, units):
            files.update({f"{res['part']}/{k}": v for k, v in res["files"].items()})
            if res["skipped"] is not None:
                skipped.append(res["part"])
    try:
        old = unseal(read_text(ds.root / GRAPHS_MANIFEST)) or {}
    except OSError:
        old = {}
    if old.get("key") != ds.manifest.get("key") or old.get("format") != compact.FORMAT:
        old = {}
    record = {"key": ds.manifest.get("key"), "format": compact.FORMAT, "files": {**old.get("files", {}), **files},
              "skipped": sorted(set(old.get("skipped", [])) | set(skipped))}
    target = ds.root / GRAPHS_MANIFEST
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(seal(record))
    os.replace(tmp, target)


def usable(ds: Dataset, verify: bool = True) -> None:
    """Raise a one-line TraceError where a rank's graph was not built (over the memory budget) or (``verify``: its
    files read again) does not verify."""
    skipped = _skipped(ds)
    if skipped:
        ranks = ", ".join(s.split("=", 1)[-1] for s in skipped[:8])
        raise TraceError(None, f"the dependency graph of rank{'s' if len(skipped) > 1 else ''} {ranks} was not built: "
                         "its events exceed the memory budget (raise --memory-budget for the critical path and "
                         "what-if)")
    bad = damaged(ds) if verify else []
    if bad:
        raise TraceError(None, f"{ds.name}: the dependency graphs of "
                         f"{', '.join(bad[:4])} do not verify, even built again from the rank's events "
                         "(is the disk failing? " + ("--rebuild builds the dataset anew)" if not ds.temporary else
                                                     "run the command again)"))


def combined(ds: Dataset, analysis: JobTables, verify: bool = True) -> tuple[dag.Graph, pl.DataFrame | None]:
    """The job's graph (:func:`tracekit.analysis.graph.compact.combine`) and its compute leaves (job clock) from every
    rank's stored compact graph; raises a one-line TraceError when a rank has none (``verify``: or where a file does
    not verify, read again for it)."""
    import pyarrow.parquet as pq

    usable(ds, verify)
    have = available(ds)
    offsets = dag.clock_offsets(analysis.ranks)
    leaves: list[pa.Table] = []
    ranked = [(d, int(r)) for d, r in ds.parts if r is not None and f"{d}/graph.act.parquet" in have]

    def read(part: tuple[str, int]) -> tuple[pa.Table, pa.Table, pa.Table]:
        d, r = part
        act = pq.read_table(str(ds.root / d / "graph.act.parquet"))
        act = act.set_column(act.schema.get_field_index("rank"), "rank", pa.array(np.full(act.num_rows, r, np.int32)))
        return act, pq.read_table(str(ds.root / d / "graph.edges.parquet")), \
            pq.read_table(str(ds.root / d / "graph.leaves.parquet"))

    def parts() -> Iterator[tuple[pa.Table, pa.Table]]:
        """Every rank's graph in rank order, read ahead by a few threads (thousands of small files: their reads
        wait without the GIL), each let go once the combine has copied it; its compute leaves kept."""
        from collections import deque
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(READ_THREADS) as pool:
            ahead: deque = deque()
            todo = iter(ranked)
            for part in itertools.islice(todo, 2 * READ_THREADS):
                ahead.append((part[1], pool.submit(read, part)))
            while ahead:
                r, fut = ahead.popleft()
                act, edges, lv_t = fut.result()
                for part in itertools.islice(todo, 1):
                    ahead.append((part[1], pool.submit(read, part)))
                if lv_t.num_rows:
                    off = offsets.get(r, 0)
                    lv_t = lv_t.set_column(lv_t.schema.get_field_index("rank"), "rank",
                                           pa.array(np.full(lv_t.num_rows, r, np.int32)))
                    leaves.append(lv_t.set_column(lv_t.schema.get_field_index("start"), "start",
                                                  pa.array(lv_t.column("start").to_numpy() + off))
                                  .set_column(lv_t.schema.get_field_index("end"), "end",
                                              pa.array(lv_t.column("end").to_numpy() + off)))
                yield act, edges
                del act, edges

    if not ranked:
        raise TraceError(None, "no rank of the job has a dependency graph (no per-rank profiler traces)")
    graph = compact.combine(parts(), offsets, analysis.consistent_members)
    lv = pl.from_arrow(pa.concat_tables(leaves)) if leaves else None
    return graph, lv if isinstance(lv, pl.DataFrame) else None


def _stored(ds: Dataset) -> list[tuple[str, int]]:
    """The parts of ranks with a stored graph, and their ranks, in the order the job's graph joins them."""
    have = available(ds)
    return [(d, int(r)) for d, r in ds.parts if r is not None and f"{d}/graph.act.parquet" in have]


def sources(ds: Dataset, analysis: JobTables) -> list[Source]:
    """The ranks with a stored graph, in the order the job's graph joins them, with their clock offsets."""
    offsets = dag.clock_offsets(analysis.ranks)
    return [Source(str(ds.root), d, r, offsets.get(r, 0)) for d, r in _stored(ds)]


@dataclass
class RankGraphs:
    """Where a job analysed rank by rank gets its dependency graph (:attr:`tracekit.analysis.pipeline.Analysis.graph`):
    the ranks' compact graphs in ``dataset``, built first where they are missing (on the engine ``engine()`` makes,
    default local processes), then combined. ``leaves`` are the compute leaves read with them (the what-if's
    contention fit)."""

    dataset: Dataset
    engine: Callable[[], Any] | None = None
    budget: str | int | None = None
    leaves: pl.DataFrame | None = None
    #: the peak resident bytes of each worker process that held the ranks' graphs for :meth:`paths` (empty: none)
    host_memory: list[int] = field(default_factory=list)
    _held: RankPaths | None = field(default=None, repr=False)
    _stack: contextlib.ExitStack | None = field(default=None, repr=False)
    _opening: Future[tuple[contextlib.ExitStack, Any]] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def graph(self, analysis: JobTables) -> dag.Graph:
        self._ready()
        graph, self.leaves = combined(self.dataset, analysis, verify=False)
        return graph

    def open_soon(self) -> None:
        """Begin, on a thread of its own, what :meth:`held` does first: the ranks' graphs' hosts started (worker
        processes take seconds to start and import what they run); a caller that will follow or replay the graphs
        calls it as soon as the dataset is open, so that the start overlaps the analysis. Does nothing after
        :meth:`held`."""
        with self._lock:
            if self._held is None and self._opening is None:
                self._opening = background.start(self._open_hosts, name="tracekit-hosts")

    def _open_hosts(self) -> tuple[contextlib.ExitStack, Any]:
        """The hosts of the ranks' graphs, started: worker processes (one per core, or the Dask cluster's workers) for
        a job of more than :data:`HOSTS_MIN_BYTES` of graphs, else this process. Returns what closes them, and
        them."""
        from tracekit.scale.engine import DaskEngine
        from tracekit.scale.rank_parts import default_jobs, hosts_for

        if missing(self.dataset):  # graphs to build first (on the engine: its workers, before any holds a rank)
            self._ready()
        events = sum(self.dataset.rank_event_counts().values())
        engine = self.engine() if self.engine is not None else None
        jobs = getattr(engine, "jobs", default_jobs()) if events * GRAPH_BYTES_PER_EVENT >= HOSTS_MIN_BYTES else 0
        stack = contextlib.ExitStack()
        try:
            if isinstance(engine, DaskEngine):
                stack.enter_context(engine)
            hosts = stack.enter_context(hosts_for(engine, jobs))
            hosts.pids()  # (each host up: started, its imports done)
            if jobs:  # each worker reads its ranks' tables while the client still analyses the job
                hosts.prefetch([(str(self.dataset.root), d) for d, _ in _stored(self.dataset)], PREFETCH_BYTES)
        except BaseException:
            stack.close()
            raise
        return stack, hosts

    def held(self, analysis: JobTables) -> RankPaths:
        """The ranks' graphs loaded where they are held (:mod:`tracekit.scale.rank_paths`), once (on the hosts
        :meth:`open_soon` started, or starts now); kept until :meth:`close`."""
        with self._lock:
            if self._held is None:
                opening, self._opening = self._opening, None
                stack, hosts = opening.result() if opening is not None else self._open_hosts()
                try:
                    self._ready()  # (here, not as the hosts start: a graph damaged meanwhile is built again)
                    usable(self.dataset, verify=False)
                    held = RankPaths.open(hosts, sources(self.dataset, analysis), analysis)
                except BaseException:
                    stack.close()
                    raise
                self._stack, self._held = stack, held
            return self._held

    def paths(self, analysis: JobTables, iteration: int | list[int] | None = None) -> pl.DataFrame:
        """The critical path of every iteration (or those asked), followed where the ranks' graphs are held
        (:mod:`tracekit.scale.rank_paths`): the same segments as the combined graph's, without combining it."""
        held = self.held(analysis)
        out = held.paths(analysis.iterations, analysis.ranks, iteration)
        with held.lock:
            self.host_memory = held.hosts.memory()
        return out

    def model(self, analysis: Any) -> whatif.Model:
        """The job's what-if model, replayed where the ranks' graphs are held (:mod:`tracekit.scale.rank_whatif`): the
        same predictions as the combined graph's, without combining it."""
        from tracekit.scale.rank_whatif import open_model

        held = self.held(analysis)
        model = open_model(held, analysis, line_rate_bps=analysis.line_rate_bps, line_rates=analysis.line_rates,
                           pg_desc=analysis.pg_desc, group_links=analysis.group_links)
        with held.lock:
            self.host_memory = held.hosts.memory()
        return model

    def close(self) -> None:
        """Let the hosts of the ranks' graphs go (their worker processes stop), those :meth:`open_soon` is starting
        too."""
        with self._lock:
            opening, self._opening = self._opening, None
            if opening is not None:
                with contextlib.suppress(Exception):  # (it failed: nothing to close)
                    opening.result()[0].close()
            if self._stack is not None:
                self._stack.close()
            self._stack, self._held = None, None

    def _ready(self) -> None:
        """Every rank's graph built (from its events where the dataset was made without it) and verified (those that
        did not, built again and verified once more: a one-line TraceError where they still do not)."""
        from tracekit.model.units import memory_budget

        todo = missing(self.dataset)
        if todo:
            ensure(self.dataset, self.engine() if self.engine is not None else None, memory_budget(self.budget))
        bad = damaged(self.dataset)
        if bad:  # files damaged since they were written: built again from the rank's events (the same bytes)
            ensure(self.dataset, self.engine() if self.engine is not None else None, memory_budget(self.budget),
                   parts=bad)
            self.dataset.extra_diagnostics.append(Diagnostic(
                self.dataset.name, f"the dependency graph{'s' if len(bad) > 1 else ''} of {', '.join(bad[:4])}"
                f"{', …' if len(bad) > 4 else ''} did not verify: built again from the rank's events"))
            usable(self.dataset)
