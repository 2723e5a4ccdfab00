"""The per-rank dataset: every input file turned, independently and anywhere (local processes or a Dask
cluster, :mod:`tracekit.scale.engine`), into per-rank Parquet files plus a small JSON summary, then combined
lazily with polars.

The unit of work is :func:`run_unit`: one file → its events (iteration filled), collectives, iterations
and breakdown — attribution is per rank, so it is computed where the rank is parsed — written under a
staging directory, and a summary (rank claim, meta, diagnostics, file checksums). A file larger than the
memory budget is parsed and analysed in bounded memory (:mod:`tracekit.scale.bounded`). The combine step,
:func:`build`, only reads the summaries: it assigns ranks exactly like :func:`tracekit.loading.traceset.assemble`,
renames each part to ``rank=R`` and writes the ``ranks`` table. Analyses then read the small tables
(breakdown, iterations, collectives) and :meth:`Dataset.scan` the events lazily — no step ever holds every
rank's events. Cross-rank analyses need only the collectives of all ranks.

Layout (a Hive-partitioned Parquet dataset; polars, pyarrow.dataset and DuckDB read it as is)::

    DATASET/
      manifest.json             version, key of the inputs, ranks, files with sizes and CRC-32 (sealed)
      ranks.parquet             one row per rank (schema.RANKS)
      rank=R/events.parquet     that rank's events, iteration filled (schema.EVENTS without rank)
      rank=R/collectives.parquet, iterations.parquet, breakdown.parquet   (likewise without rank)
      rank=R/summary.json       the unit's summary: source file, meta, diagnostics, timings
      shared/part-N/...         files of formats that hold several ranks (tables keep their rank column)

A dataset is written into a hidden directory beside its name and published atomically
(:mod:`tracekit.loading.atomic`); it is reused as long as its inputs (path, size, mtime), the parser versions, the
step marker and the layout version are unchanged and its files verify.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
import pyarrow as pa

from tracekit.analysis import attribution, idle, iterations, top_ops
from tracekit.loading.atomic import apply_modes, data_dir, new_data_dir, publish_dir, real_dir, remove_dir, sweep_stale
from tracekit.loading.cache import file_crc32, os_error, read_text, seal, unseal, verify_files
from tracekit.loading.traceset import PER_RANK_FORMATS, RankFacts, assign_ranks, discover
from tracekit.model import schema
from tracekit.model.diagnostics import Diagnostic, TraceError
from tracekit.model.schema import ParsedFile
from tracekit.model.units import DEFAULT_BUDGET, memory_budget, parse_size  # noqa: F401 (re-exported)
from tracekit.scale import bounded
from tracekit.scale.memory import (  # noqa: F401 (read from here by the API, the TUI and the tests)
    IN_MEMORY_BASE,
    IN_MEMORY_FACTOR,
    available_memory,
    in_memory_need,
    json_bytes,
    peak_rss_mb,
)

if TYPE_CHECKING:  # imported where used: Parquet and the file systems it loads are ~10 ms of every command's
    import pyarrow.parquet as pq  # start, and only the rank-by-rank path needs them

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
Progress = Callable[[int, int, str], None]


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
    """Streams batches into one Parquet file (zstd, page checksums), dropping the rank column; small
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
            self.writer = pq.ParquetWriter(str(self.path), self.schema, compression="zstd",
                                           write_page_checksum=True)
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
    pq.write_table(table if keep_rank else _drop_rank(table), str(path), compression="zstd",
                   write_page_checksum=True)


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
        raise TraceError(str(staging), f"the dataset directory is not visible on worker {socket.gethostname()}: "
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
        (tmp / "summary.json").write_text(json.dumps(summary, default=str))
        if part.exists():
            shutil.rmtree(part)
        os.replace(tmp, part)
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
    return {"activity": schema.conform(activity.to_arrow(), ACTIVITY), "top_ops": top_ops.table(ev, iters, act),
            "op_totals": top_ops.totals(ev, iters, act), "idle_breakdown": idle.breakdown(ev, iters, bd, act)}


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


#: the per-rank tables also written for the whole job at once (``job/NAME.parquet``, every rank's rows with their
#: rank, in the parts' order): reopening a dataset of a thousand ranks then reads one file per table, not a thousand
JOB_TABLES = ("collectives", "iterations", "breakdown", "topology", "top_ops", "op_totals", "idle_breakdown")


def _job_tables(data: Path, parts: list[tuple[str, int | None]]) -> dict[str, dict[str, int]]:
    """Write :data:`JOB_TABLES` of the per-rank parts under ``data/job``; returns their sizes and CRC-32s."""
    import pyarrow.parquet as pq

    ranked = [(d, r) for d, r in parts if r is not None]
    if not ranked:
        return {}
    (data / "job").mkdir(exist_ok=True)
    out = {}
    for name in JOB_TABLES:
        files = [(data / d / f"{name}.parquet", r) for d, r in ranked if (data / d / f"{name}.parquet").exists()]
        if len(files) < len(ranked):  # a rank without it (read in bounded memory): per-rank files only
            continue
        t = _read_ranked(data, [str(f) for f, _ in files], SCHEMAS[name]) if len(files) > 1 else None
        if t is None:
            t = pa.concat_tables([schema.conform(_add_rank(pq.read_table(str(f)), r), SCHEMAS[name])
                                  for f, r in files])
        p = data / "job" / f"{name}.parquet"
        _write(t, p, keep_rank=True)
        out[f"job/{name}.parquet"] = {"size": p.stat().st_size, "crc32": file_crc32(p)}
    return out


def _read_ranked(root: Path, files: list[str], sch: pa.Schema) -> pa.Table | None:
    """Per-rank files of one table read as one Arrow dataset (``rank`` from the ``rank=R`` directories), in the
    files' order; None when their schemas do not read together (each file is then read on its own)."""
    import pyarrow.dataset as pds

    try:
        d = pds.dataset(files, format="parquet", partition_base_dir=str(root),
                        partitioning=pds.partitioning(pa.schema([("rank", pa.int32())]), flavor="hive"))
        return schema.conform(d.to_table(), sch)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None


def _read_events(path: Path) -> pa.Table:
    """A part's events.parquet as an EVENTS table (rank 0: the stand-in the unit analyses with)."""
    import pyarrow.parquet as pq

    return schema.conform(_add_rank(pq.read_table(str(path)), 0), schema.EVENTS)


# --- the dataset -----------------------------------------------------------------------------------


def inputs_key(files: list[str], step_marker: str | None) -> tuple[str, list[list[Any]]]:
    """Key of a set of inputs: changes when a file, a parser, the step marker or the layout does."""
    from tracekit.parsers import detect

    ident = []
    for f in files:
        st = os.stat(f)
        fmt = detect(f) if st.st_size else None
        ident.append([os.path.abspath(f), st.st_size, st.st_mtime_ns, fmt.version if fmt else None])
    text = json.dumps([DATASET_VERSION, step_marker, ident])
    return hashlib.sha256(text.encode()).hexdigest()[:32], ident


#: a dataset's small files are checked this many at a time, on this many threads
VERIFY_CHUNK = 256
VERIFY_THREADS = 8


@dataclass
class Dataset:
    """A per-rank dataset on disk: small tables read whole, events scanned lazily."""

    root: Path
    manifest: dict[str, Any]
    reused: bool = False
    temporary: bool = False
    _cache: dict[str, pa.Table] = field(default_factory=dict)
    #: warnings about how the dataset was made (e.g. not kept in the cache), beside its inputs'
    extra_diagnostics: list[Diagnostic] = field(default_factory=list)

    @classmethod
    def open(cls, root: str | os.PathLike, *, follow: bool = True) -> Dataset | None:
        """The dataset at ``root``, or None if there is none (or its manifest is damaged). Without
        ``follow`` (a dataset in the cache), a link at ``root`` that is not one of ours is not followed."""
        root = Path(root)
        if not follow and data_dir(root) is None:
            return None
        try:
            manifest = unseal(read_text(root / "manifest.json"))
        except OSError:
            return None
        if manifest is None or manifest.get("version") != DATASET_VERSION:
            return None
        return cls(root, manifest)

    def verify(self) -> bool:
        """Every file is there with its size and CRC-32 (events: size only — reading gigabytes on every
        reuse would defeat the reuse; they are written with Parquet page checksums, which a reader can
        verify with ``page_checksum_verification=True``, and their CRC-32 is in the manifest)."""
        files = self.manifest.get("files", {})
        small = {k: v for k, v in files.items() if not k.endswith("events.parquet")}
        big = {k: {**v} for k, v in files.items() if k.endswith("events.parquet")}
        if not verify_files(self.root, big, mode="size"):
            return False
        if len(small) < VERIFY_CHUNK:
            return verify_files(self.root, small)
        # a job of a thousand ranks has ten thousand small files: read and checked on threads (the reads and the
        # CRC wait without the GIL)
        from concurrent.futures import ThreadPoolExecutor

        items = list(small.items())
        chunks = [dict(items[i:i + VERIFY_CHUNK]) for i in range(0, len(items), VERIFY_CHUNK)]
        with ThreadPoolExecutor(VERIFY_THREADS) as pool:
            return all(pool.map(lambda c: verify_files(self.root, c), chunks))

    @property
    def parts(self) -> list[tuple[str, int | None]]:
        """``(relative directory, rank or None for shared parts)``."""
        return [(p["dir"], p.get("rank")) for p in self.manifest["parts"]]

    def _files(self, name: str) -> tuple[list[Path], list[Path]]:
        ranked = [self.root / d / f"{name}.parquet" for d, r in self.parts if r is not None]
        shared = [self.root / d / f"{name}.parquet" for d, r in self.parts if r is None]
        return [p for p in ranked if p.exists()], [p for p in shared if p.exists()]

    def scan(self, name: str = "events") -> pl.LazyFrame:
        """A lazy frame over one table of every rank (``rank`` from the partition key): nothing is read
        until it is collected, and then only the columns and row groups a query needs."""
        ranked, shared = self._files(name)
        frames = []
        if ranked:
            frames.append(pl.scan_parquet(ranked, hive_partitioning=True, hive_schema={"rank": pl.Int32}))
        if shared:
            frames.append(pl.scan_parquet(shared, hive_partitioning=False))
        if not frames:
            empty = pl.from_arrow(SCHEMAS[name].empty_table())
            assert isinstance(empty, pl.DataFrame)
            return empty.lazy()
        frames = [f.select(SCHEMAS[name].names) for f in frames]
        return pl.concat(frames, how="vertical_relaxed") if len(frames) > 1 else frames[0]

    def table(self, name: str) -> pa.Table:
        """A small table (collectives, iterations, breakdown, topology) of every rank, in rank order."""
        import pyarrow.parquet as pq
        if name not in self._cache:
            parts = []
            whole = f"job/{name}.parquet"
            if whole in self.manifest.get("files", {}):  # every rank's rows in one file
                many: pa.Table | None = schema.conform(pq.read_table(str(self.root / whole)), SCHEMAS[name])
            else:
                ranked = [str(self.root / d / f"{name}.parquet") for d, r in self.parts if r is not None]
                ranked = [p for p in ranked if os.path.exists(p)]
                many = _read_ranked(self.root, ranked, SCHEMAS[name]) if len(ranked) > 8 else None
            if many is not None:  # every rank's file at once, on Arrow's threads (a job of 1 024 ranks has as many)
                parts.append(many)
            for d, r in self.parts:
                if many is not None and r is not None:
                    continue
                p = self.root / d / f"{name}.parquet"
                if not p.exists():
                    continue
                t = pq.read_table(str(p))
                if r is not None:
                    t = _add_rank(t, r)
                parts.append(schema.conform(t, SCHEMAS[name]))
            t = pa.concat_tables(parts) if parts else schema.empty(SCHEMAS[name])
            if name in ("iterations", "breakdown") and t.num_rows:
                t = t.sort_by([("rank", "ascending"), ("start_ns", "ascending")])
            self._cache[name] = t
        return self._cache[name]

    def log_files(self) -> list[ParsedFile]:
        """The NCCL debug logs of the dataset as parsed files without events (path, meta, topology, extra tables:
        the communicators, network and problems an analysis of the job reads from them)."""
        import pyarrow.parquet as pq
        by_path = {s["path"]: s for s in self.summaries if s.get("format") == "nccl-log"}
        out = []
        for part in self.manifest.get("parts", []):
            s = by_path.get(part.get("path"))
            if s is None:
                continue
            d = self.root / part["dir"]
            extra = {p.name.removeprefix("extra.").removesuffix(".parquet"): pq.read_table(str(p))
                     for p in sorted(d.glob("extra.*.parquet"))}
            topo = d / "topology.parquet"
            out.append(ParsedFile(path=s["path"], format=s["format"], meta=s.get("meta") or {}, tables=extra,
                                  topology=schema.conform(pq.read_table(str(topo)), schema.TOPOLOGY)
                                  if topo.exists() else schema.empty(schema.TOPOLOGY)))
        return out

    def ranks_with(self, name: str) -> set[int]:
        """The ranks whose part has the table ``name`` (the :data:`UNIT_TABLES` only where its unit held the rank's
        events), from the manifest."""
        files = self.manifest.get("files", {})
        return {int(r) for d, r in self.parts if r is not None and f"{d}/{name}.parquet" in files}

    def ranks_table(self, name: str, ranks: list[int]) -> pa.Table:
        """The table ``name`` of some ranks (their per-rank parts), with ``rank``, in the parts' order."""
        want = set(ranks)
        files = [str(self.root / d / f"{name}.parquet") for d, r in self.parts if r in want]
        files = [f for f in files if os.path.exists(f)]
        many = _read_ranked(self.root, files, SCHEMAS[name]) if len(files) > 1 else None
        if many is not None:
            return many
        parts = [self.rank_table(name, r) for d, r in self.parts if r in want]
        return pa.concat_tables(parts) if parts else schema.empty(SCHEMAS[name])

    def rank_table(self, name: str, rank: int) -> pa.Table:
        """One rank's table ``name`` (its per-rank parts), with ``rank``."""
        import pyarrow.parquet as pq
        parts = [schema.conform(_add_rank(pq.read_table(str(self.root / d / f"{name}.parquet")), rank), SCHEMAS[name])
                 for d, r in self.parts if r == rank and (self.root / d / f"{name}.parquet").exists()]
        return pa.concat_tables(parts) if parts else schema.empty(SCHEMAS[name])

    def rank_event_counts(self) -> dict[int, int]:
        """Events per rank of the per-rank parts (from the Parquet footers: nothing else is read)."""
        import pyarrow.parquet as pq
        out: dict[int, int] = {}
        for d, r in self.parts:
            p = self.root / d / "events.parquet"
            if r is not None and p.exists():
                out[r] = out.get(r, 0) + pq.ParquetFile(str(p)).metadata.num_rows
        return out

    def rank_events(self, rank: int, columns: list[str] | None = None) -> pa.Table:
        """Every event of one rank (of its per-rank parts), as one EVENTS table (only ``columns`` read, the others
        null, where given)."""
        import pyarrow.parquet as pq
        parts = []
        for d, r in self.parts:
            p = self.root / d / "events.parquet"
            if r == rank and p.exists():
                t = pq.read_table(str(p), columns=[c for c in columns if c != "rank"] if columns else None)
                t = _add_rank(t, rank)
                parts.append(schema.conform(t, schema.EVENTS))
        return pa.concat_tables(parts).unify_dictionaries() if parts else schema.empty(schema.EVENTS)

    def event_batches(self) -> Iterator[pa.RecordBatch]:
        """Every rank's events as EVENTS batches, one row group at a time (bounded memory)."""
        import pyarrow.parquet as pq
        for d, r in self.parts:
            p = self.root / d / "events.parquet"
            if not p.exists():
                continue
            f = pq.ParquetFile(str(p))
            for b in f.iter_batches(batch_size=1 << 20):
                t = pa.Table.from_batches([b])
                if r is not None:
                    t = _add_rank(t, r)
                yield from schema.conform(t, schema.EVENTS).to_batches()

    @property
    def ranks(self) -> pa.Table:
        import pyarrow.parquet as pq
        return pq.read_table(str(self.root / "ranks.parquet")).cast(schema.RANKS)

    @property
    def diagnostics(self) -> list[Diagnostic]:
        return [*self.extra_diagnostics, *(Diagnostic(**d) for d in self.manifest.get("diagnostics", []))]

    @property
    def notes(self) -> list[str]:
        methods = self.manifest.get("methods", [])
        return ["iterations from " + ", ".join(methods)] if methods else []

    @property
    def summaries(self) -> list[dict[str, Any]]:
        return list(self.manifest.get("summaries", []))

    def cleanup(self) -> None:
        """Remove a temporary dataset (``--no-cache``)."""
        if self.temporary:
            remove_dir(self.root)
            if self.root.parent.name.startswith("tracekit-dataset-"):
                shutil.rmtree(self.root.parent, ignore_errors=True)


def default_root(cache_dir: str | os.PathLike | None) -> Path:
    from tracekit.loading import cache

    return Path(cache_dir or cache.default_dir()) / "datasets"


#: what says a directory cannot take the dataset (rather than a bug): read-only, full, over quota, denied,
#: not a directory (of its own)
_UNWRITABLE = (errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.ELOOP,
               errno.ENOENT, errno.EEXIST)


def build(paths: list[str], *, out: str | os.PathLike | None = None, engine: Any = None,
          step_marker: str | None = None, budget: str | int | None = None, use_cache: bool = True,
          cache_dir: str | os.PathLike | None = None, force: bool = False, jobs: int | None = None,
          progress: Progress | None = None, found: tuple[list[str], list[Diagnostic]] | None = None,
          graphs: bool = False) -> Dataset:
    """Turn the traces under ``paths`` into a per-rank dataset (reusing a matching one) and open it.

    ``out``: where (default: ``<cache>/datasets/<key of the inputs>``; a temporary directory without
    the cache). ``engine``: from :func:`tracekit.scale.engine.make` (default: local processes). When the cache
    cannot take the dataset (read-only, full, a link planted in place of ``datasets/``), it is built in a
    temporary directory instead, with a warning; a ``out`` that cannot is a one-line TraceError. ``graphs``: every
    rank's unit also builds the rank's compact dependency graph (:mod:`tracekit.scale.graphs`; a dataset reused
    without them gets them later from its events, :func:`tracekit.scale.graphs.ensure`).
    """

    files, notes = found if found is not None else discover(paths)
    if not files:
        raise TraceError(None, "no input files")
    key, ident = inputs_key(files, step_marker)
    kw = {"engine": engine, "step_marker": step_marker, "budget": budget, "force": force, "jobs": jobs,
          "progress": progress, "graphs": graphs}
    if out is not None:
        try:
            return _build(files, notes, key, ident, Path(out), temporary=False, explicit=True, **kw)
        except OSError as exc:
            code, why = os_error(exc)
            if code not in _UNWRITABLE:
                raise
            raise TraceError(str(out), f"cannot write the dataset here: {why}") from None
    if use_cache:
        try:
            root = real_dir(default_root(cache_dir))
            return _build(files, notes, key, ident, root / key, temporary=False, explicit=False, **kw)
        except OSError as exc:
            code, why = os_error(exc)
            if code not in _UNWRITABLE:
                raise
            notes = [*notes, Diagnostic(str(default_root(cache_dir)), "the per-rank dataset could not be kept in the "
                                        f"cache ({why}): built in a temporary directory instead")]
    target = Path(tempfile.mkdtemp(prefix="tracekit-dataset-")) / "dataset"
    try:
        return _build(files, notes, key, ident, target, temporary=True, explicit=False, **kw)
    except OSError as exc:
        shutil.rmtree(target.parent, ignore_errors=True)
        code, why = os_error(exc)
        if code not in _UNWRITABLE:
            raise
        raise TraceError(str(target.parent), f"cannot write the per-rank dataset: {why} (free some space, or give "
                         "dataset= a directory on another disk)") from None


def _build(files: list[str], notes: list[Diagnostic], key: str, ident: list[list[Any]], target: Path, *,
           temporary: bool, explicit: bool, engine: Any, step_marker: str | None, budget: str | int | None,
           force: bool, jobs: int | None, progress: Progress | None, graphs: bool = False) -> Dataset:
    from tracekit.scale import engine as engines

    out = target if explicit else None
    # --dataset DIR is the user's own path (a link they made is theirs); in the cache, a link is trusted only
    # if it is one of ours
    existing = Dataset.open(target, follow=explicit) if target.exists() else None
    if existing is not None and existing.manifest.get("key") == key and existing.verify():
        existing.reused = True
        known = existing.manifest.get("diagnostics", [])  # the notes of its own build are there already
        existing.extra_diagnostics = [n for n in notes if n.__dict__ not in known]
        return existing
    if target.exists() and out is not None and not force and existing is None and any(Path(target).iterdir()):
        raise TraceError(str(target), "exists and is not a tracekit dataset (use --force to replace it)")
    if target.exists() and out is not None and not force and existing is not None:
        raise TraceError(str(target), "holds a dataset of other inputs (use --force to replace it)")
    target.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale(target.parent)
    data = new_data_dir(target)
    try:
        staging = data / ".staging"
        staging.mkdir()
        b = memory_budget(budget)
        units = [Unit(i, f, str(staging), step_marker, b, graphs) for i, f in enumerate(files)]
        total = sum(os.path.getsize(f) for f in files)
        eng = engine or engines.LocalEngine(jobs, total)
        summaries: list[dict[str, Any] | None] = [None] * len(units)
        done = 0
        with eng:
            for i, summary in eng.map(run_unit, units):
                summaries[i] = summary
                done += os.path.getsize(files[i])
                if progress:
                    progress(done, total, files[i])
        manifest = _combine(data, [s for s in summaries if s is not None], notes, step_marker)
        manifest.update(key=key, inputs=ident, step_marker=step_marker, engine=getattr(eng, "name", "?"))
        (data / "manifest.json").write_text(seal(manifest))
        shutil.rmtree(staging, ignore_errors=True)
        if target.exists() or target.is_symlink():
            publish_dir(data, target)
        elif temporary or out is not None:
            apply_modes(data, target.parent)
            os.replace(data, target)
        else:
            publish_dir(data, target)
    except BaseException:
        shutil.rmtree(data, ignore_errors=True)
        raise
    ds = Dataset.open(target)
    if ds is None:
        raise TraceError(str(target), "the dataset just written cannot be read back")
    ds.temporary = temporary
    return ds


def _combine(data: Path, summaries: list[dict[str, Any]], notes: list[Diagnostic], step_marker: str | None
             ) -> dict[str, Any]:
    """Assign ranks from the summaries, move each part to its partition, write the ranks table."""
    diags = [*notes]
    for s in summaries:
        diags.extend(Diagnostic(**d) for d in s["diagnostics"])
    per_rank = [s for s in summaries if s["per_rank"]]
    ranks, sources, rank_diags = assign_ranks([(s["path"], s["claimed_rank"]) for s in per_rank])
    diags.extend(rank_diags)
    if step_marker and not any(s["has_steps"] for s in summaries):
        raise TraceError(None, f"step_marker={step_marker!r} matches no annotation in the traces")
    any_steps = any(s["has_steps"] for s in per_rank)
    staging = data / ".staging"
    parts: list[dict[str, Any]] = []
    files: dict[str, Any] = {}
    rows = []
    methods: set[str] = set()
    for s, r, src in zip(per_rank, ranks, sources, strict=True):
        d = f"rank={r}"
        os.replace(staging / f"part-{s['index']:06d}", data / d)
        part_files = dict(s["files"])
        if any_steps and not s["has_steps"]:
            # as in the whole-job analysis: once any rank has steps, a rank without them has no windows
            for name in ("iterations", "breakdown", "top_ops", "op_totals", "idle_breakdown"):
                p = data / d / f"{name}.parquet"
                if name in ("iterations", "breakdown") or p.exists():
                    _write(schema.empty(SCHEMAS[name]), p)
                    part_files[p.name] = {"size": p.stat().st_size, "crc32": file_crc32(p)}
        else:
            methods.update(s["methods"])
        parts.append({"dir": d, "rank": r, "path": s["path"]})
        files.update({f"{d}/{k}": v for k, v in part_files.items()})
        rows.append({**s["rank_row"], "rank": r, "rank_source": src})
    seen: set[int] = set()
    for s in summaries:
        if s["per_rank"]:
            continue
        d = f"shared/part-{s['index']:06d}"
        (data / "shared").mkdir(exist_ok=True)
        os.replace(staging / f"part-{s['index']:06d}", data / d)
        parts.append({"dir": d, "rank": None, "path": s["path"]})
        files.update({f"{d}/{k}": v for k, v in s["files"].items()})
        seen.update(s["ranks_seen"])
        methods.update(s["methods"])
    ranks_table = schema.table(schema.RANKS, {k: [row.get(k) for row in rows] for k in schema.RANKS.names}) \
        if rows else schema.empty(schema.RANKS)
    others = sorted(seen - set(ranks))
    if others:
        more = schema.table(schema.RANKS, {"rank": others, "rank_source": ["other format"] * len(others),
                                           "clock_offset_ns": [0] * len(others)})
        ranks_table = pa.concat_tables([ranks_table, more])
    _write(ranks_table, data / "ranks.parquet", keep_rank=True)
    p = data / "ranks.parquet"
    files["ranks.parquet"] = {"size": p.stat().st_size, "crc32": file_crc32(p)}
    files.update(_job_tables(data, [(q["dir"], q["rank"]) for q in parts]))
    skipped = [{"rank": p["rank"]} for p, s in zip(parts, per_rank, strict=False) if s.get("graph_skipped")]
    return {"version": DATASET_VERSION, "parts": parts, "files": files, "methods": sorted(methods),
            "graphs_skipped": skipped,
            "diagnostics": [d.__dict__ for d in diags], "summaries": summaries,
            "events": sum(s["events"] for s in summaries),
            "collectives": sum(s["collectives"] for s in summaries)}
