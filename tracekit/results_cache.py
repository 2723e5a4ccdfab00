"""A cache of analysis results, beside the parse cache, so that reopening a job shows its results at
once: ``tracekit inspect`` paints the overview from here before it has read a single event.

An entry holds the result tables that are not inputs (``iterations``, ``breakdown``), the ``ranks``
table, the analysis notes and input diagnostics, and the events' ``iteration`` column (so the full
:class:`~tracekit.analysis.pipeline.Analysis` is rebuilt from the parsed events without analysing again); the
critical-path tables and the job's dependency graph join it once a session has computed them
(:func:`store_paths`, :func:`store_graph`), so a later launch neither follows the path nor builds the graph.

The manifest also holds the summary figures (the job's shares, per rank, per iteration) as JSON, so a
view can show them without importing polars.

The key covers every file under the paths given (path, size, mtime — no file is opened, so a lookup
is instant), the options that change results (``--step-marker``, ``--link-bw``) and a fingerprint of tracekit's own
source (parsers included), so any change to the inputs or to the code misses. Entries are written to
a temporary directory and renamed into place; a damaged or stale entry reads as a miss.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from tracekit.loading import cache as parse_cache
from tracekit.loading.atomic import (
    apply_modes,
    atomic_write,
    data_dir,
    new_data_dir,
    publish_dir,
    real_dir,
    sweep_stale,
)
from tracekit.loading.cache import read_text
from tracekit.model import schema
from tracekit.model.diagnostics import Diagnostic

if TYPE_CHECKING:
    from tracekit.analysis.graph.dag import Graph
    from tracekit.analysis.pipeline import Analysis
    from tracekit.loading.traceset import TraceSet

RESULTS_VERSION = "2"
_PACKAGE = Path(__file__).resolve().parent


@cache
def code_fingerprint() -> str:
    """Hash of the source of tracekit's core and parsers: results depend on nothing else."""
    import tracekit.parsers as parsers_pkg

    h = hashlib.blake2b(digest_size=16)
    for folder in (_PACKAGE, Path(parsers_pkg.__file__).resolve().parent):
        for f in sorted(folder.rglob("*.py")):  # tracekit's subpackages too
            h.update(str(f.relative_to(folder)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def key(paths: list[str], step_marker: str | None, link_bw_bps: float | None = None,
        line_rates: dict[str, float] | None = None, *, rank_regex: str | None = None) -> str | None:
    """The entry key of the job given as ``paths`` (files and directories, as on the command line), or
    None when a path does not exist.

    It hashes every file under the paths (name, size, mtime) without opening any, so a lookup costs a
    directory walk: any file added, removed or touched misses, as does any change to tracekit's code
    (which covers the parsers' versions too).
    """
    parts = [RESULTS_VERSION, code_fingerprint(), step_marker or "", repr(link_bw_bps),
             repr(sorted((line_rates or {}).items())), *([f"rank_regex={rank_regex}"] if rank_regex else [])]
    for p in paths:
        if os.path.isdir(p):
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in sorted(files):
                    if not name.startswith("."):
                        parts.append(_stat_key(os.path.join(root, name)))
        elif os.path.exists(p):
            parts.append(_stat_key(p))
        else:
            return None
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def _stat_key(path: str) -> str:
    try:
        st = os.stat(path)
    except OSError:  # a link loop or a dangling link (skipped by discover): its own stat
        st = os.lstat(path)
    return f"{os.path.abspath(path)}\0{st.st_size}\0{st.st_mtime_ns}"


def default_root() -> Path:
    """Results live under the parse cache's directory."""
    return parse_cache.default_dir() / "results"


@dataclass
class Results:
    """What an entry holds: enough for the overview and the iterations table."""

    ranks: pa.Table
    iterations: pa.Table
    breakdown: pa.Table
    notes: list[str] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    #: the events' iteration column, in the TraceSet's event order
    event_iteration: pa.ChunkedArray | None = None
    events: int = 0
    #: :func:`figures` of the breakdown (JSON), so that showing them needs no polars
    figures: dict[str, Any] | None = None
    #: the trace files the job was read from
    files: list[str] = field(default_factory=list)
    #: cross-rank results: the collectives (NCCL logs joined in), matched instances and members
    collectives: pa.Table | None = None
    instances: pa.Table | None = None
    members: pa.Table | None = None
    line_rate_bps: float | None = None
    line_rate_source: str | None = None
    line_rates: dict[str, float] = field(default_factory=dict)
    matched: bool = False
    #: the critical-path tables, once a session has computed them (:func:`store_paths`)
    critical_path: pa.Table | None = None
    critical_path_summary: pa.Table | None = None
    #: the directory of the job's dependency graph, once a session has built it (:func:`store_graph`)
    graph_dir: Path | None = None


def figures(breakdown: pa.Table, ranks: pa.Table | None = None) -> dict[str, Any]:
    """The roll-ups a summary shows: ``job`` (:func:`tracekit.views.summary.job`), ``per_rank`` and
    ``per_iteration`` (rows of :func:`tracekit.views.summary.per_rank` / ``per_iteration``), as plain Python."""
    from tracekit.views import summary

    return {"job": summary.job(breakdown, ranks), "per_rank": summary.per_rank(breakdown).to_dicts(),
            "per_iteration": summary.per_iteration(breakdown).to_dicts()}


def _write(table: pa.Table, path: Path, compression: str | None = None) -> None:
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema, options=options) as writer:
        writer.write_table(table, max_chunksize=1 << 20)


def _read(path: Path) -> pa.Table:
    if not stat.S_ISREG(os.lstat(path).st_mode):  # a link or anything else planted in a shared cache
        raise OSError(f"{path}: not a regular file")
    return pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()


def store(root: str | os.PathLike, entry_key: str, analysis: Analysis) -> None:
    """Write the results of ``analysis`` as entry ``entry_key`` under ``root`` (atomically, published like a
    parse-cache entry: :func:`tracekit.loading.atomic.publish_dir`). Jobs with a Horovod timeline are not stored
    (their merged result is not rebuilt from these tables). OSError when the cache cannot be written."""
    if analysis.horovod is not None:
        return
    entry = real_dir(Path(root)) / entry_key
    sweep_stale(entry.parent)
    tmp = new_data_dir(entry)
    try:
        _write(analysis.ranks, tmp / "ranks.arrow")
        _write(analysis.iterations, tmp / "iterations.arrow")
        _write(analysis.breakdown, tmp / "breakdown.arrow")
        _write(analysis.collectives, tmp / "collectives.arrow")
        _write(analysis.instances, tmp / "instances.arrow")
        _write(analysis.members, tmp / "members.arrow")
        _write(pa.table({"iteration": analysis.events.column("iteration")}), tmp / "event_iteration.arrow")
        manifest = {"version": RESULTS_VERSION, "notes": analysis.notes, "events": analysis.events.num_rows,
                    "diagnostics": [d.__dict__ for d in analysis.diagnostics],
                    "figures": figures(analysis.breakdown, analysis.ranks),
                    "files": [f.path for f in analysis.traces.files],
                    "line_rate_bps": analysis.line_rate_bps, "line_rate_source": analysis.line_rate_source,
                    "line_rates": analysis.line_rates, "matched": analysis.matched}
        (tmp / "manifest.json").write_text(json.dumps(manifest, default=str))
        publish_dir(tmp, entry)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _entry_dir(root: str | os.PathLike, entry_key: str) -> Path | None:
    """The data directory of entry ``entry_key`` (never through a link planted in the cache), or None."""
    try:
        return data_dir(real_dir(Path(root), create=False) / entry_key)
    except OSError:
        return None


def load(root: str | os.PathLike, entry_key: str) -> Results | None:
    """Reopen entry ``entry_key`` (memory-mapped), or None if absent, stale or damaged."""
    entry = _entry_dir(root, entry_key)
    if entry is None:
        return None
    try:
        manifest = json.loads(read_text(entry / "manifest.json"))
        if manifest.get("version") != RESULTS_VERSION:
            return None
        ranks = schema.conform(_read(entry / "ranks.arrow"), schema.RANKS)
        iterations = schema.conform(_read(entry / "iterations.arrow"), schema.ITERATIONS)
        breakdown = schema.conform(_read(entry / "breakdown.arrow"), schema.BREAKDOWN)
        event_iteration = _read(entry / "event_iteration.arrow").column("iteration")
        collectives = schema.conform(_read(entry / "collectives.arrow"), schema.COLLECTIVES)
        instances = _read(entry / "instances.arrow")
        members = _read(entry / "members.arrow")
        diagnostics = [Diagnostic(**d) for d in manifest.get("diagnostics", [])]
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowInvalid):
        return None
    try:  # optional: missing until a session computed them; damaged, they are computed again
        paths = _read(entry / "critical_path.arrow"), _read(entry / "critical_path_summary.arrow")
    except (OSError, ValueError, pa.ArrowInvalid):
        paths = (None, None)
    return Results(ranks=ranks, iterations=iterations, breakdown=breakdown, notes=list(manifest.get("notes", [])),
                   diagnostics=diagnostics, event_iteration=event_iteration, events=int(manifest.get("events", 0)),
                   figures=manifest.get("figures"), files=list(manifest.get("files", [])), collectives=collectives,
                   instances=instances, members=members, line_rate_bps=manifest.get("line_rate_bps"),
                   line_rate_source=manifest.get("line_rate_source"), matched=bool(manifest.get("matched")),
                   line_rates={str(k): float(v) for k, v in (manifest.get("line_rates") or {}).items()},
                   critical_path=paths[0], critical_path_summary=paths[1],
                   graph_dir=entry / "graph" if (entry / "graph" / "violated.json").exists() else None)


def store_paths(root: str | os.PathLike, entry_key: str, analysis: Analysis) -> None:
    """Add the critical-path tables of ``analysis`` (computed: this builds the job's graph) to the existing
    entry ``entry_key``, each file written whole under a temporary name and renamed; no entry, no-op."""
    entry = _entry_dir(root, entry_key)
    if entry is None or not (entry / "manifest.json").exists():
        return
    for name, frame in (("critical_path", analysis.critical_path),
                        ("critical_path_summary", analysis.critical_path_summary)):
        table = frame.to_arrow()
        atomic_write(entry / f"{name}.arrow", lambda tmp, t=table: _write(t, Path(tmp)), share=entry.parent)


def store_graph(root: str | os.PathLike, entry_key: str, graph: Graph) -> None:
    """Add the job's dependency graph to the existing entry ``entry_key`` (a directory written aside and
    renamed into place, so it is whole or absent); no entry, or a graph already there: no-op."""
    entry = _entry_dir(root, entry_key)
    if entry is None or not (entry / "manifest.json").exists() or (entry / "graph").exists():
        return
    tmp = Path(tempfile.mkdtemp(prefix=".graph-", dir=entry))
    try:
        # zstd: a tenth of the size (activities repeat their names and lanes), read back in ~0.3 s per M rows
        _write(graph.act.to_arrow(), tmp / "activities.arrow", "zstd")
        _write(pa.table({"src": graph.src, "dst": graph.dst, "lag": graph.lag, "etype": graph.etype,
                         "slack": graph.slack}), tmp / "edges.arrow", "zstd")
        _write(pa.table({"node_time": graph.node_time, "binding": graph.binding}), tmp / "nodes.arrow", "zstd")
        if graph.hubs is not None:  # the collective edges that leave a hub, and each hub's members
            h = graph.hubs
            _write(pa.table({"edge": h.edge, "hub": h.hub}), tmp / "hub_edges.arrow", "zstd")
            _write(pa.table({"member": h.member}), tmp / "hub_members.arrow", "zstd")
            _write(pa.table({"ptr": h.ptr}), tmp / "hub_ptr.arrow", "zstd")
        (tmp / "violated.json").write_text(json.dumps(graph.violated))
        apply_modes(tmp, entry.parent)
        os.rename(tmp, entry / "graph")
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (entry / "graph").exists():  # lost a race to another launch: theirs is as good
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _graph(d: Path) -> Graph | None:
    """The graph stored in ``d`` (arrays copied out of the mapped files), or None if damaged."""
    import numpy as np
    import polars as pl

    from tracekit.analysis.graph.collective_edges import Hubs
    from tracekit.analysis.graph.dag import Graph

    try:
        act = pl.from_arrow(_read(d / "activities.arrow"))
        edges, nodes = _read(d / "edges.arrow"), _read(d / "nodes.arrow")
        violated = {str(k): int(v) for k, v in json.loads((d / "violated.json").read_text()).items()}
        if not isinstance(act, pl.DataFrame) or nodes.num_rows != 2 * act.height:
            return None

        def col(t: pa.Table, name: str) -> np.ndarray:
            return np.array(t.column(name).to_numpy())  # writable, like a freshly built graph's

        hubs = None
        if (d / "hub_edges.arrow").exists():
            he = _read(d / "hub_edges.arrow")
            hubs = Hubs(edge=col(he, "edge"), hub=col(he, "hub"), member=col(_read(d / "hub_members.arrow"), "member"),
                        ptr=col(_read(d / "hub_ptr.arrow"), "ptr"))
        return Graph(act=act, src=col(edges, "src"), dst=col(edges, "dst"), lag=col(edges, "lag"),
                     etype=col(edges, "etype"), node_time=col(nodes, "node_time"), binding=col(nodes, "binding"),
                     slack=col(edges, "slack"), violated=violated, hubs=hubs)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, pa.ArrowInvalid):
        return None


def analysis_from(traces: TraceSet, results: Results) -> Analysis | None:
    """The Analysis of ``traces`` rebuilt from cached results (None if they do not fit the events)."""
    from tracekit.analysis.pipeline import Analysis

    col = results.event_iteration
    if col is None or len(col) != traces.events.num_rows or results.collectives is None:
        return None
    i = traces.events.schema.get_field_index("iteration")
    events = traces.events.set_column(i, schema.EVENTS.field("iteration"), col.cast(pa.int64()))
    analysis = Analysis(traces=traces, events=events, iterations=results.iterations, breakdown=results.breakdown,
                    ranks=results.ranks, collectives=results.collectives, instances=results.instances,
                    members=results.members, line_rate_bps=results.line_rate_bps,
                    line_rate_source=results.line_rate_source, line_rates=dict(results.line_rates),
                    matched=results.matched, notes=list(results.notes),
                    diagnostics=list(results.diagnostics))
    if results.critical_path is not None and results.critical_path_summary is not None:
        import polars as pl

        # the cached properties, filled: the job's graph is built only if what-if asks for it
        analysis.__dict__["critical_path"] = pl.from_arrow(results.critical_path)
        analysis.__dict__["critical_path_summary"] = pl.from_arrow(results.critical_path_summary)
    graph = _graph(results.graph_dir) if results.graph_dir is not None else None
    if graph is not None:
        analysis.__dict__["graph"] = graph
    return analysis
