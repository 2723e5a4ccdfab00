"""The per-rank dataset: every input file turned, independently and anywhere (local processes or a Dask
cluster, :mod:`tracekit.scale.engine`), into per-rank Parquet files plus a small JSON summary, then combined
lazily with polars.

The unit of work is :func:`tracekit.scale.unit.run_unit`: one file → its events (iteration filled), collectives,
iterations and breakdown — attribution is per rank, so it is computed where the rank is parsed — written under a
staging directory, and a summary (rank claim, meta, diagnostics, file checksums). The combine step, :func:`build`,
only reads the summaries: it assigns ranks exactly like :func:`tracekit.loading.traceset.assemble`, renames each part
to ``rank=R`` and writes the ``ranks`` table. Analyses then read the small tables (breakdown, iterations,
collectives) and :meth:`Dataset.scan` the events lazily — no step ever holds every rank's events. Cross-rank analyses
need only the collectives of all ranks.

Layout: one directory, all of it inside (``rm -rf DATASET`` removes it), each build a version published atomically
(:mod:`tracekit.loading.versioned`); a version is a Hive-partitioned Parquet dataset that polars, pyarrow.dataset
and DuckDB read as is (``DATASET/current/rank=*/events.parquet``)::

    DATASET/
      current -> .version-XXXX  the published version
      .version-XXXX/
        manifest.json           version, key of the inputs, ranks, files with sizes and CRC-32 (sealed)
        ranks.parquet           one row per rank (schema.RANKS)
        rank=R/events.parquet   that rank's events, iteration filled (schema.EVENTS without rank)
        rank=R/collectives.parquet, iterations.parquet, breakdown.parquet   (likewise without rank)
        rank=R/summary.json     the unit's summary: source file, meta, diagnostics
        shared/part-N/...       files of formats that hold several ranks (tables keep their rank column)

It is reused as long as its inputs (path, size, mtime), the parser versions, the step marker and the layout version
are unchanged and its files verify; where some do not, the units of the damaged parts run again (the others' files
are carried over as they are) and the result is published as a new version.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from tracekit.loading import versioned
from tracekit.loading.atomic import data_dir, real_dir, remove_dir
from tracekit.loading.cache import file_crc32, os_error, read_text, seal, unseal, verify_files
from tracekit.loading.traceset import assign_ranks, discover, unread
from tracekit.model import schema
from tracekit.model.diagnostics import Diagnostic, TraceError
from tracekit.model.schema import ParsedFile
from tracekit.model.units import DEFAULT_BUDGET, memory_budget, parse_size  # noqa: F401 (re-exported)
from tracekit.scale.memory import (  # noqa: F401 (read from here by the API, the TUI and the tests)
    IN_MEMORY_BASE,
    IN_MEMORY_FACTOR,
    available_memory,
    in_memory_need,
    json_bytes,
    peak_rss_mb,
)
from tracekit.scale.unit import (  # noqa: F401 (the unit's names, read from here too)
    ACTIVITY,
    DATASET_VERSION,
    RUN_FACTS,
    SCHEMAS,
    SMALL_TABLES,
    TEMP_PREFIX,
    UNIT_TABLES,
    Unit,
    _add_rank,
    _write,
    run_unit,
)

Progress = Callable[[int, int, str], None]

# pyarrow.parquet is imported where used: it and the file systems it loads are ~10 ms of every command's start, and
# only the rank-by-rank path needs them

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


# --- the dataset -----------------------------------------------------------------------------------


def inputs_key(files: list[str], step_marker: str | None, rank_regex: str | None = None
               ) -> tuple[str, list[list[Any]]]:
    """Key of a set of inputs: changes when a file, a parser, the step marker, the rank regex or the layout does."""
    from tracekit.parsers import detect

    ident = []
    for f in files:
        st = os.stat(f)
        fmt = detect(f) if st.st_size else None
        ident.append([os.path.abspath(f), st.st_size, st.st_mtime_ns, fmt.version if fmt else None])
    text = json.dumps([DATASET_VERSION, step_marker, ident, *([rank_regex] if rank_regex else [])])
    return hashlib.sha256(text.encode()).hexdigest()[:32], ident


#: where a dataset made without graphs records the ones added later (:mod:`tracekit.scale.graphs`)
GRAPHS_MANIFEST = "graphs.json"
#: a dataset's small files are checked this many at a time, on this many threads
VERIFY_CHUNK = 256
VERIFY_THREADS = 8


@dataclass
class Dataset:
    """A per-rank dataset on disk: small tables read whole, events scanned lazily. ``root`` is the version read (the
    files are under it), ``home`` the dataset's directory."""

    root: Path
    manifest: dict[str, Any]
    reused: bool = False
    temporary: bool = False
    _cache: dict[str, pa.Table] = field(default_factory=dict)
    #: warnings about how the dataset was made (e.g. not kept in the cache), beside its inputs'
    extra_diagnostics: list[Diagnostic] = field(default_factory=list)
    home: Path | None = None
    #: the version held while it is read
    held: versioned.Reading | None = field(default=None, repr=False, compare=False)

    @classmethod
    def open(cls, home: str | os.PathLike, *, follow: bool = True) -> Dataset | None:
        """The dataset in the directory ``home``, or None if there is none (or its manifest is damaged); the version
        read is held (:class:`tracekit.loading.versioned.Reading`) so that a newer one published meanwhile leaves it
        in place. Without ``follow`` (a dataset in the cache), a link at ``home`` is not followed. Datasets of
        earlier layouts (``home`` a link to a hidden ``.data-…`` sibling, or the files in ``home`` itself) open too."""
        home = Path(home)
        held = versioned.Reading.of(home, follow=follow)
        root: Path | None
        if held is not None:
            root, reading = held
        else:
            root, reading = (home if follow else data_dir(home)), None
        if root is None:
            return None
        try:
            manifest = unseal(read_text(root / "manifest.json"))
        except OSError:
            return None
        if manifest is None or manifest.get("version") != DATASET_VERSION:
            return None
        return cls(root, manifest, home=home, held=reading)

    def recorded_files(self) -> dict[str, Any]:
        """Size and CRC-32 of every file: the manifest's, and those of the graphs built later (:data:`GRAPHS_MANIFEST`,
        which wins for a graph built again)."""
        files = dict(self.manifest.get("files", {}))
        try:
            extra = unseal(read_text(self.root / GRAPHS_MANIFEST))
        except OSError:
            extra = None
        if extra is not None and extra.get("key") == self.manifest.get("key"):
            files.update(extra.get("files", {}))
        return files

    def damaged(self) -> list[str]:
        """The files that are not there with their size and CRC-32 (none: the dataset is whole). Events: size only
        — reading gigabytes on every reuse would defeat the reuse; they are written with Parquet page checksums,
        which a reader can verify with ``page_checksum_verification=True``, and their CRC-32 is in the manifest."""
        items = list(self.recorded_files().items())

        def bad(chunk: list[tuple[str, Any]]) -> list[str]:
            return [k for k, v in chunk if not verify_files(self.root, {k: v}, mode="size" if k.endswith(
                "events.parquet") else None)]

        if len(items) < VERIFY_CHUNK:
            return bad(items)
        # a job of a thousand ranks has ten thousand small files: read and checked on threads (the reads and the
        # CRC wait without the GIL)
        from concurrent.futures import ThreadPoolExecutor

        chunks = [items[i:i + VERIFY_CHUNK] for i in range(0, len(items), VERIFY_CHUNK)]
        with ThreadPoolExecutor(VERIFY_THREADS) as pool:
            return [k for c in pool.map(bad, chunks) for k in c]

    def verify(self) -> bool:
        """Whether every file is whole (:meth:`damaged`)."""
        return not self.damaged()

    @property
    def name(self) -> str:
        """The dataset's directory as the user knows it (a temporary one is not named: it is gone after the run)."""
        return "the temporary per-rank dataset" if self.temporary else str(self.home or self.root)

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
        return self._scan(name, *self._files(name))

    def scans(self, name: str = "events", ranks: int = 64) -> Iterator[pl.LazyFrame]:
        """:meth:`scan` of ``ranks`` ranks at a time (the shared parts with the last, in :meth:`scan`'s order): a query
        that reads a column of every row holds one group's, not the job's."""
        ranked, shared = self._files(name)
        starts = list(range(0, len(ranked), ranks)) or [0]
        for i in starts:
            yield self._scan(name, ranked[i:i + ranks], shared if i == starts[-1] else [])

    def _scan(self, name: str, ranked: list[Path], shared: list[Path]) -> pl.LazyFrame:
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
        """The NCCL debug logs and Flight Recorder dumps of the dataset as parsed files without events (path, meta,
        topology, extra tables: the communicators, network and problems, the dumps' tables, which an analysis of the
        job reads from them)."""
        import pyarrow.parquet as pq
        by_path = {s["path"]: s for s in self.summaries if s.get("format") in ("nccl-log", "flight-recorder")}
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
            if r != rank:  # (a path per part would make a loop over the ranks quadratic: 0.26 M paths at 512)
                continue
            p = self.root / d / "events.parquet"
            if p.exists():
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
        if self.held is not None:
            self.held.close()
        if self.temporary:
            home = self.home or self.root
            shutil.rmtree(home.parent if home.parent.name.startswith(TEMP_PREFIX) else home, ignore_errors=True)


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
          graphs: bool = False, rank_regex: str | None = None) -> Dataset:
    """Turn the traces under ``paths`` into a per-rank dataset (reusing a matching one) and open it; ``rank_regex``:
    :func:`tracekit.loading.traceset.assign_ranks`.

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
    key, ident = inputs_key(files, step_marker, rank_regex)
    kw = {"engine": engine, "step_marker": step_marker, "budget": budget, "force": force, "jobs": jobs,
          "progress": progress, "graphs": graphs, "rank_regex": rank_regex}
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
    target = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX)) / "dataset"
    try:
        return _build(files, notes, key, ident, target, temporary=True, explicit=False, **kw)
    except BaseException as exc:
        shutil.rmtree(target.parent, ignore_errors=True)
        if not isinstance(exc, OSError):
            raise
        code, why = os_error(exc)
        if code not in _UNWRITABLE:
            raise
        raise TraceError(None, f"cannot write the temporary per-rank dataset in {target.parent.parent}: {why} (free "
                         "some space, or give --dataset DIR on another disk)") from None


def _build(files: list[str], notes: list[Diagnostic], key: str, ident: list[list[Any]], home: Path, *,
           temporary: bool, explicit: bool, engine: Any, step_marker: str | None, budget: str | int | None,
           force: bool, jobs: int | None, progress: Progress | None, graphs: bool = False,
           rank_regex: str | None = None) -> Dataset:
    from tracekit.scale import engine as engines

    # --dataset DIR is the user's own path (a link they made is theirs); in the cache, a link is never followed
    existing = Dataset.open(home, follow=explicit) if os.path.lexists(home) else None
    carried: dict[str, tuple[Path, dict[str, Any]]] = {}  # input -> its whole part in a damaged dataset of them
    repaired: list[str] = []
    if existing is not None and existing.manifest.get("key") == key:
        bad = existing.damaged()
        if not bad:
            existing.reused = True
            known = existing.manifest.get("diagnostics", [])  # the notes of its own build are there already
            existing.extra_diagnostics = [n for n in notes if n.__dict__ not in known]
            return existing
        # the same inputs, some files damaged: the units of the damaged parts run again, the others are carried over
        whole = {p["dir"] for p in existing.manifest.get("parts", [])
                 if not any(k.startswith(f"{p['dir']}/") for k in bad)}
        old = {s["path"]: s for s in existing.summaries}
        carried = {p["path"]: (existing.root / p["dir"], old[p["path"]]) for p in existing.manifest["parts"]
                   if p["dir"] in whole and p.get("path") in old}
        repaired = bad
    elif existing is not None and explicit and not force:
        raise TraceError(str(home), "holds a dataset of other inputs (--rebuild replaces it)")
    elif explicit and not force and _foreign(home):
        raise TraceError(str(home), "exists and is not a tracekit dataset (give another --dataset DIR, or --rebuild "
                         "to put the dataset in it beside what it holds)")
    if existing is not None and existing.held is None:
        _migrate(home, existing)  # an earlier layout: its files go, the new version goes in
    if existing is not None and existing.held is not None:
        existing.held.close()
    if not explicit and os.path.islink(home):
        home.unlink()  # a link planted in the cache under a dataset's name: replaced, never followed
    version = versioned.Version.start(home)
    data = version.path
    try:
        staging = data / ".staging"
        staging.mkdir()
        b = memory_budget(budget)
        units = [Unit(i, f, str(staging), step_marker, b, graphs) for i, f in enumerate(files)]
        summaries: list[dict[str, Any] | None] = [None] * len(units)
        todo = []
        for u in units:
            part = carried.get(u.path)
            if part is not None and _carry(part[0], staging / f"part-{u.index:06d}", part[1]):
                summaries[u.index] = {**part[1], "index": u.index}
            else:
                todo.append(u)
        total = sum(os.path.getsize(u.path) for u in todo)
        eng = engine or engines.LocalEngine(jobs, total)
        done = 0
        with eng:
            for i, summary in eng.map(run_unit, todo):
                summaries[todo[i].index] = summary
                done += os.path.getsize(todo[i].path)
                if progress:
                    progress(done, total, todo[i].path)
        failed = [TraceError(**s["failed"]) for s in summaries if s is not None and s.get("failed")]
        manifest = _combine(data, [s for s in summaries if s is not None and not s.get("failed")],
                            [*notes, *unread(failed, len(units))], step_marker, rank_regex)
        manifest.update(key=key, inputs=ident, step_marker=step_marker, engine=getattr(eng, "name", "?"))
        (data / "manifest.json").write_text(seal(manifest))
        shutil.rmtree(staging, ignore_errors=True)
        _, held = version.publish(lambda v: _holds(v, key))
    except BaseException:
        version.abort()
        raise
    ds = Dataset.open(home, follow=explicit)
    held.close()
    if ds is None:
        raise TraceError(str(home), "the dataset just written cannot be read back")
    ds.temporary = temporary
    if repaired:
        ds.extra_diagnostics.append(Diagnostic(ds.name, f"{len(repaired)} file{'s' if len(repaired) > 1 else ''} of "
                                               f"the dataset damaged ({', '.join(repaired[:3])}"
                                               f"{', …' if len(repaired) > 3 else ''}): "
                                               f"{len(todo)} of {len(units)} units run again"))
    return ds


def _holds(version: Path, key: str) -> bool:
    """Whether the published ``version`` is a whole dataset of the inputs ``key`` (another writer's, published while
    this one was building: it serves, and this one is dropped)."""
    try:
        manifest = unseal(read_text(version / "manifest.json"))
    except OSError:
        return False
    return bool(manifest and manifest.get("key") == key and Dataset(version, manifest).verify())


def _carry(src: Path, dst: Path, summary: dict[str, Any]) -> bool:
    """Bring a whole part of the dataset's previous version into ``dst`` (hard links: published files are never
    modified in place; copies where links cannot be made); False when it cannot be."""
    try:
        dst.mkdir()
        for name in [*summary["files"], "summary.json"]:
            try:
                os.link(src / name, dst / name)
            except OSError:
                shutil.copyfile(src / name, dst / name)
    except (OSError, KeyError):
        shutil.rmtree(dst, ignore_errors=True)
        return False
    return True


def _foreign(home: Path) -> bool:
    """Whether ``home`` is a directory (or file) with something in it that is not a dataset's."""
    if not os.path.lexists(home):
        return False
    if not os.path.isdir(home):
        return True
    return not versioned.is_home(home) and any(home.iterdir())


def _migrate(home: Path, old: Dataset) -> None:
    """Remove a dataset of an earlier layout from ``home``: a link to a hidden ``.data-`` sibling (both go), or the
    files in ``home`` itself (its manifest first, so that nothing half-removed reads as a dataset)."""
    if os.path.islink(home):
        remove_dir(home)
        return
    (home / "manifest.json").unlink(missing_ok=True)
    names = {"ranks.parquet", "graphs.json", "job", "shared", ".staging", *(d.split("/")[0] for d, _ in old.parts)}
    for name in names:
        p = home / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                p.unlink()


def _combine(data: Path, summaries: list[dict[str, Any]], notes: list[Diagnostic], step_marker: str | None,
             rank_regex: str | None = None) -> dict[str, Any]:
    """Assign ranks from the summaries, move each part to its partition, write the ranks table."""
    diags = [*notes]
    for s in summaries:
        diags.extend(Diagnostic(**d) for d in s["diagnostics"])
    per_rank = [s for s in summaries if s["per_rank"]]
    ranks, sources, rank_diags = assign_ranks([(s["path"], s["claimed_rank"]) for s in per_rank], rank_regex)
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
                    p.unlink(missing_ok=True)  # a part carried over holds links to the previous version's files
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
