"""The per-rank unit of a dataset (:mod:`tracekit.scale.dataset`): one input file turned, anywhere (a local process or a
Dask worker), into its part — per-rank Parquet tables and a small JSON summary — with no effect but those files.

The same input gives the same bytes wherever and however often it runs (a Dask task is run again when the worker
that held its result is lost): the tables are written in a fixed row order, and where and how long the unit ran is
returned with its summary, not written into it (``tests/test_faults.py`` builds a unit twice and compares every
file).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
import pyarrow as pa

from tracekit.analysis import attribution, idle, iterations, top_ops
from tracekit.loading.cache import file_crc32
from tracekit.loading.traceset import PER_RANK_FORMATS, RankFacts
from tracekit.model import schema
from tracekit.model.diagnostics import Diagnostic, TraceError
from tracekit.model.units import DEFAULT_BUDGET
from tracekit.scale import bounded, parquet
from tracekit.scale.memory import json_bytes, peak_rss_mb

if TYPE_CHECKING:
    import pyarrow.parquet as pq

DATASET_VERSION = "2"
#: the per-rank tables of a part (besides events), in write order
SMALL_TABLES = ("collectives", "iterations", "breakdown", "topology")
#: attribution's intervals of a rank (:func:`tracekit.analysis.attribution.activity`; a communication interval's
#: collective): what splitting its exposed communication into waiting and transfer reads, once the collectives are
#: matched across ranks, instead of every event again
ACTIVITY = pa.schema([("rank", pa.int32()), ("start_ns", pa.int64()), ("end_ns", pa.int64()), ("cls", pa.int64()),
                      ("collective_id", pa.int64())])
SCHEMAS = {"events": schema.EVENTS, "collectives": schema.COLLECTIVES, "iterations": schema.ITERATIONS,
           "breakdown": schema.BREAKDOWN, "topology": schema.TOPOLOGY, "activity": ACTIVITY,
           "top_ops": schema.TOP_OPS, "op_totals": top_ops.TOTALS_SCHEMA, "idle_breakdown": schema.IDLE_BREAKDOWN}
#: per-rank tables a unit computes where it holds the rank's events (not for a rank read in bounded memory), so that
#: no later step reads every event again; a rank without them gets them computed from its events
UNIT_TABLES = ("activity", "top_ops", "op_totals", "idle_breakdown")
#: what a unit's summary says about where and how it ran, not about its input: returned, never written into its part
RUN_FACTS = ("host", "pid", "wall_s", "cpu_s", "peak_rss_mb")


# how much memory a job needs and the machine has: tracekit.scale.memory (its names are read from here too)


# --- the unit --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Unit:
    """One file's work: parse ``path``, analyse it, write the part ``staging/part-{index}``."""

    index: int
    path: str
    staging: str
    step_marker: str | None = None
    memory_budget: int = DEFAULT_BUDGET
    #: also build the rank's compact dependency graph (:mod:`tracekit.scale.rank_graph`: critical path, what-if)
    graph: bool = False


class _ParquetSink:
    """Streams batches into one Parquet file (:func:`tracekit.scale.parquet.options`), dropping the rank column; small
    batches are gathered into row groups of about :data:`ROW_GROUP` rows (bounded buffering)."""

    ROW_GROUP = 1 << 17

    def __init__(self, path: Path, sch: pa.Schema) -> None:
        self.path = path
        self.schema = _without_rank(sch)
        self.writer: pq.ParquetWriter | None = None
        self.pending: list[pa.Table] = []
        self.rows = 0

    def write(self, data: pa.Table | pa.RecordBatch) -> None:
        t = data if isinstance(data, pa.Table) else pa.Table.from_batches([data])
        self.pending.append(_drop_rank(t).cast(self.schema))
        self.rows += t.num_rows
        if self.rows >= self.ROW_GROUP:
            self._flush()

    def _flush(self) -> None:
        import pyarrow.parquet as pq
        if self.writer is None:
            self.writer = pq.ParquetWriter(str(self.path), self.schema, **parquet.options(self.schema))
        t = pa.concat_tables(self.pending) if self.pending else self.schema.empty_table()
        self.writer.write_table(t, row_group_size=1 << 20)
        self.pending, self.rows = [], 0

    def close(self) -> None:
        if self.pending or self.writer is None:
            self._flush()
        assert self.writer is not None
        self.writer.close()


def _without_rank(sch: pa.Schema) -> pa.Schema:
    i = sch.get_field_index("rank")
    return sch.remove(i) if i >= 0 else sch


def _drop_rank(t: pa.Table) -> pa.Table:
    return t.drop_columns(["rank"]) if "rank" in t.column_names else t


def _add_rank(t: pa.Table, rank: int) -> pa.Table:
    """A per-rank part's table (stored without its rank: the partition key says it) with ``rank`` added."""
    return t.append_column(schema.EVENTS.field("rank"), pa.array(np.full(t.num_rows, rank, np.int32)))


def _with_rank(t: pa.Table, rank: int) -> pa.Table:
    i = t.schema.get_field_index("rank")
    return t.set_column(i, t.schema.field(i), pa.array(np.full(t.num_rows, rank, dtype=np.int32)))


def _write(table: pa.Table, path: Path, keep_rank: bool = False) -> None:
    import pyarrow.parquet as pq
    t = table if keep_rank else _drop_rank(table)
    pq.write_table(t, str(path), **parquet.options(t.schema))


#: a temporary dataset's directory (``--no-cache``) is ``$TMPDIR/tracekit-dataset-XXXX/dataset``
TEMP_PREFIX = "tracekit-dataset-"


def where(path: Path) -> str | None:
    """``path`` to name in a message, or None inside a temporary dataset (gone once the command ends)."""
    return None if any(p.startswith(TEMP_PREFIX) for p in path.parts) else str(path)


def run_unit(u: Unit) -> dict[str, Any]:
    """The per-rank unit: parse one file and analyse it, write its part, return its summary.

    Pure in the sense that matters for distribution: its only effects are the files under
    ``staging/part-{index}`` (written to a temporary directory and renamed), and the same input gives
    the same part wherever it runs.
    """
    from tracekit.parsers import detect, kineto, parse

    wall0, cpu0 = time.perf_counter(), time.process_time()
    staging = Path(u.staging)
    part = staging / f"part-{u.index:06d}"
    if not staging.is_dir():
        raise TraceError(where(staging), f"the dataset directory is not visible on worker {socket.gethostname()}: "
                         "give --dataset a path on a filesystem every worker shares")
    if not os.path.exists(u.path):
        raise TraceError(u.path, f"no such file on worker {socket.gethostname()} (workers must see the inputs "
                         "at the same paths)")
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=staging))
    try:
        fmt = detect(u.path) if os.path.getsize(u.path) else None
        spilled = fmt is not None and fmt.name == "kineto" and 1.5 * json_bytes(u.path) > u.memory_budget
        before = os.stat(u.path)
        if spilled:
            (tmp / "spill").mkdir()
            parsed = kineto.parse(u.path, spill_dir=str(tmp / "spill"))
        else:
            parsed = parse(u.path)
        after = os.stat(u.path)
        if (before.st_size, before.st_mtime_ns, before.st_ino) != (after.st_size, after.st_mtime_ns, after.st_ino):
            # the dataset's key holds the file's stat from before: the next run sees the change and rebuilds
            parsed.diagnostics.append(Diagnostic(u.path, "the file changed while it was read: what was read may mix "
                                                 "its versions; read it again once it is written"))
        per_rank = parsed.format in PER_RANK_FORMATS
        facts = RankFacts()
        extent = _Extent()
        unit_tables: dict[str, pa.Table] = {}
        graph_files: dict[str, Any] = {}
        graph_skipped = False
        has_steps = True
        if per_rank:
            # attribution is per rank: analyse with a stand-in rank (0); the real one is the partition key
            colls = _with_rank(parsed.collectives, 0)
            sink = _ParquetSink(tmp / "events.parquet", schema.EVENTS)
            if parsed.events_file:
                def take(b: pa.RecordBatch) -> None:
                    facts.add(b)
                    extent.add(b)
                    sink.write(b)

                iters, bd = bounded.analyse(parsed.events_file, 0, colls, u.step_marker, take, require_steps=False)
            else:
                ev, iters = iterations.assign(_with_rank(parsed.events, 0), u.step_marker, require_steps=False)
                act = attribution.activity(ev)
                bd = attribution.breakdown(ev, iters, colls, act=act)
                facts.add(ev)
                extent.add(ev)
                sink.write(ev)
                unit_tables = _unit_tables(ev, iters, bd, act)
            sink.close()
            if u.graph:
                from tracekit.scale import rank_graph as graphs

                if not graphs.fits(facts.events, u.memory_budget):
                    graph_skipped = True
                elif parsed.events_file:  # read back what was written batch by batch: it fits the budget
                    graph_files = graphs.write_rank_graph(_read_events(tmp / "events.parquet"), tmp)
                else:
                    graph_files = graphs.write_rank_graph(ev, tmp)
            has_steps = iters.num_rows > 0 and "whole-trace" not in iters.column("method").to_pylist()
            tables = {"collectives": colls, "iterations": iters, "breakdown": bd, "topology": parsed.topology,
                      **unit_tables}
        else:  # a format that holds several ranks: its tables carry their ranks
            ev, iters = iterations.assign(parsed.events, u.step_marker, require_steps=False)
            bd = attribution.breakdown(ev, iters, parsed.collectives)
            _write(ev, tmp / "events.parquet", keep_rank=True)
            facts.add(ev)
            tables = {"collectives": parsed.collectives, "iterations": iters, "breakdown": bd,
                      "topology": parsed.topology}
        for name, t in tables.items():
            _write(t, tmp / f"{name}.parquet", keep_rank=not per_rank)
        for name, t in parsed.tables.items():
            _write(t, tmp / f"extra.{name}.parquet", keep_rank=True)
        shutil.rmtree(tmp / "spill", ignore_errors=True)
        files = {p.name: {"size": p.stat().st_size, "crc32": file_crc32(p)} for p in sorted(tmp.iterdir())}
        st = os.stat(u.path)
        summary = {
            "version": DATASET_VERSION, "index": u.index, "path": u.path, "size": st.st_size,
            "mtime_ns": st.st_mtime_ns, "format": parsed.format, "parser_version": fmt.version if fmt else None,
            "per_rank": per_rank, "claimed_rank": parsed.meta.get("rank"), "meta": parsed.meta,
            "diagnostics": [d.__dict__ for d in parsed.diagnostics], "bytes_lost": parsed.bytes_lost,
            "complete": parsed.complete, "events": facts.events, "has_steps": has_steps,
            "collectives": parsed.collectives.num_rows,
            "methods": sorted(set(iters.column("method").to_pylist())) if iters.num_rows else [],
            "rank_row": facts.row(parsed, 0, "") if per_rank else None,
            "ranks_seen": sorted({int(r) for r in ev.column("rank").to_pylist() if r is not None})
            if not per_rank else [],
            "spilled": spilled, "files": files, "host": socket.gethostname(), "pid": os.getpid(),
            "graph": bool(graph_files), "graph_skipped": graph_skipped, **extent.summary(),
            "activity_rows": unit_tables["activity"].num_rows if "activity" in unit_tables else None,
            "wall_s": time.perf_counter() - wall0, "cpu_s": time.process_time() - cpu0,
            "peak_rss_mb": peak_rss_mb(),
        }
        # the file holds what the input alone decides (where and how long it ran are returned, not written): the
        # same input gives the same bytes, so a unit run twice (a Dask task recomputed after a lost worker) is
        # indistinguishable from one run once
        kept = {k: v for k, v in summary.items() if k not in RUN_FACTS}
        (tmp / "summary.json").write_text(json.dumps(kept, default=str, sort_keys=True))
        try:
            os.replace(tmp, part)
        except OSError:  # ran before (the same bytes, above): the first one stays, readers never see it go
            if not (part / "summary.json").is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except TraceError as exc:  # the file cannot be read: said in the summary (the other units' files are analysed)
        shutil.rmtree(tmp, ignore_errors=True)
        return {"version": DATASET_VERSION, "index": u.index, "path": u.path,
                "failed": {"path": exc.path, "message": exc.message, "offset": exc.offset, "line": exc.line}}
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return summary


def _unit_tables(ev: pa.Table, iters: pa.Table, bd: pa.Table, act: pl.DataFrame) -> dict[str, pa.Table]:
    """The :data:`UNIT_TABLES` of one rank held in memory (its attribution intervals computed once for all)."""
    coll = pl.from_arrow(ev.select(["collective_id"]))
    assert isinstance(coll, pl.DataFrame)
    activity = act.select("rank", "start_ns", "end_ns", "cls", coll.get_column("collective_id").gather(
        act.get_column("row")).alias("collective_id"))
    times = top_ops.op_times(ev, iters, act) if iters.num_rows and ev.num_rows else None
    return {"activity": schema.conform(activity.to_arrow(), ACTIVITY),
            "top_ops": top_ops.table(ev, iters, act, times), "op_totals": top_ops.totals(ev, iters, act, times),
            "idle_breakdown": idle.breakdown(ev, iters, bd, act)}


class _Extent:
    """A rank's lanes (events per lane, annotations left out) and the span of its events (own clock), gathered batch
    by batch: what a timeline needs to lay the rank out before reading it."""

    def __init__(self) -> None:
        self.lanes: dict[str, int] = {}
        self.first: int | None = None
        self.last: int | None = None

    def add(self, ev: pa.Table | pa.RecordBatch) -> None:
        if not ev.num_rows:
            return
        import pyarrow.compute as pc

        drawn = ~schema.dict_match(ev.column("kind"), "^annotation$") & pc.is_valid(ev.column("kind")).to_numpy(
            zero_copy_only=False)  # a lane of annotations only is drawn by no timeline
        counts = pc.value_counts(ev.column("lane").filter(pa.array(drawn)))
        for v, n in zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist(), strict=True):
            if v is not None:
                self.lanes[str(v)] = self.lanes.get(str(v), 0) + int(n)
        keep = pa.array(drawn)
        start = ev.column("start_ns").filter(keep)
        lo = pc.min(start).as_py()
        hi = pc.max(pc.add(start, pc.fill_null(ev.column("dur_ns").filter(keep), 0))).as_py()
        if lo is not None:
            self.first = lo if self.first is None else min(self.first, lo)
        if hi is not None:
            self.last = hi if self.last is None else max(self.last, hi)

    def summary(self) -> dict[str, Any]:
        return {"lanes": sorted(self.lanes.items()), "t_first": self.first, "t_last": self.last}


def _read_events(path: Path) -> pa.Table:
    """A part's events.parquet as an EVENTS table (rank 0: the stand-in the unit analyses with)."""
    import pyarrow.parquet as pq

    return schema.conform(_add_rank(pq.read_table(str(path)), 0), schema.EVENTS)
