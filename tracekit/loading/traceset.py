"""A TraceSet: every input of one job, parsed (in parallel, through the cache) into one set of tables
with ranks assigned.

Ranks come from what each file says (``distributedInfo.rank``, NCCL Init lines), else from the file
name (``rank-3``, ``worker3``, the training tools' layouts of :mod:`tracekit.loading.layouts`), else from the order
given, and the ``ranks`` table says which; ``--rank-regex`` takes them from the paths first.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.allocators import release_memory
from tracekit.loading import cache, layouts
from tracekit.model import schema
from tracekit.model.diagnostics import Diagnostic, TraceError, printable
from tracekit.model.schema import ParsedFile
from tracekit.model.units import count
from tracekit.parsers import Format, detect, parse

#: formats worth a summary without any event or call: NCCL logs (topology, problems), Flight Recorder dumps (a hang)
STANDALONE_FORMATS = frozenset({"nccl-log", "flight-recorder"})
#: below this much input, parsing in worker processes costs more than it saves
PARALLEL_MIN_BYTES = 64 << 20

Progress = Callable[[int, int, str], None]


@dataclass
class TraceSet:
    """All tables of a job. Events, collectives and topology carry a ``rank`` column."""

    ranks: pa.Table
    events: pa.Table
    collectives: pa.Table
    topology: pa.Table
    tables: dict[str, pa.Table] = field(default_factory=dict)
    files: list[ParsedFile] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)

    @property
    def rank_ids(self) -> list[int]:
        return sorted(self.ranks.column("rank").to_pylist())

    @property
    def empty(self) -> bool:
        """Nothing to analyse: no events, no collective calls, no NCCL debug log and no Flight Recorder dump (a log of
        ``NCCL_DEBUG=INFO`` alone has no calls, but its communicators, topology and problems are worth a summary of
        their own; dumps alone say where a hung job stands)."""
        return (self.events.num_rows == 0 and self.collectives.num_rows == 0
                and not any(f.format in STANDALONE_FORMATS for f in self.files))


def _unreadable(path: str, exc: OSError) -> str:
    """Why ``path`` cannot be read, in words (a symbolic link loop and a dangling link say so)."""
    if exc.errno == errno.ELOOP:
        return "a symbolic link loop"
    if os.path.islink(path) and not os.path.exists(path):
        try:
            return f"a dangling symbolic link (to {os.readlink(path)})"
        except OSError:
            return "a dangling symbolic link"
    return exc.strerror or str(exc)


def discover(paths: Iterable[str]) -> tuple[list[str], list[Diagnostic]]:
    """Expand directories into the trace files they contain (by content, not name).

    A path given that cannot be read is an error naming it; inside a directory, files that cannot be read
    (symbolic link loops, dangling links, no permission) and subdirectories that cannot be listed are
    skipped with one warning per reason. Symbolic links to directories are not followed inside a walk (a
    link back up would loop), and a file reached twice (links, hard links) is read once. Of the traces a tool
    writes for several profiling windows of one rank, the last is read (:func:`layouts.last_windows`, a warning).
    """
    found: list[str] = []
    notes: list[Diagnostic] = []
    for p in paths:
        if os.path.isdir(p):
            skipped = 0
            unreadable: dict[str, list[str]] = {}

            def listing_error(exc: OSError, _bad: dict[str, list[str]] = unreadable) -> None:
                name = exc.filename or "?"
                _bad.setdefault(f"directories that cannot be listed ({exc.strerror or exc})", []).append(name)

            for root, dirs, files in os.walk(p, onerror=listing_error):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in sorted(files):
                    if name.startswith("."):
                        continue
                    fp = os.path.join(root, name)
                    try:
                        is_trace = os.path.getsize(fp) and detect(fp) is not None
                    except OSError as exc:
                        unreadable.setdefault(_unreadable(fp, exc), []).append(fp)
                        continue
                    except TraceError as exc:  # cannot be read (permission, I/O error)
                        unreadable.setdefault(exc.message, []).append(fp)
                        continue
                    if is_trace:
                        found.append(fp)
                    else:
                        skipped += 1
            for reason, names in unreadable.items():
                more = f" and {len(names) - 1} more" if len(names) > 1 else ""
                notes.append(Diagnostic(names[0], f"skipped: {reason}{more}"))
            if not any(f.startswith(os.path.join(p, "")) or f == p for f in found):
                raise TraceError(p, "no traces found in this directory")
            if skipped:
                notes.append(Diagnostic(p, f"skipped {count(skipped, 'file')} that "
                                           f"{'is' if skipped == 1 else 'are'} not traces", level="info"))
        elif os.path.exists(p):
            found.append(p)
        elif os.path.islink(p):
            try:
                os.stat(p)
            except OSError as exc:
                raise TraceError(p, _unreadable(p, exc)) from None
        else:
            raise TraceError(p, "no such file or directory")
    seen: set[str] = set()
    unique = []
    for f in found:
        key = os.path.realpath(f)
        if key not in seen:
            seen.add(key)
            unique.append(f)
    kept, windows = layouts.last_windows(unique)  # one profiling window per rank of the tools that write several
    return kept, notes + windows


def _identity(st: os.stat_result) -> tuple[int, ...]:
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev


def parse_stable(path: str, fmt: Format | None = None, workers: int = 1) -> tuple[ParsedFile, os.stat_result | None]:
    """Parse ``path`` and make sure it did not change while it was read (size, times, inode before and
    after): a file rewritten meanwhile is read again once; if it changed again, the result is kept with a
    warning and no stat is returned (so it is not cached under either version)."""
    for _ in range(2):
        st = os.stat(path)
        parsed = _parse_format(path, fmt, workers) if fmt is not None else parse(path)
        try:
            after = _identity(os.stat(path))
        except OSError:  # removed meanwhile
            after = ()
        if after == _identity(st):
            return parsed, st
    parsed.diagnostics.append(Diagnostic(path, "the file changed while it was read (twice): what was read may mix "
                                         "its versions; read it again once it is written"))
    return parsed, None


def _cache_note(root: str, exc: OSError) -> Diagnostic:
    return Diagnostic(root, f"the parse cache is not written ({printable(cache.os_error(exc)[1])}): the traces "
                      "will be parsed again next time (--cache-dir elsewhere, or --no-cache)")


def _parse_cached(path: str, cache_root: str | None, notes: list[Diagnostic] | None = None,
                  workers: int = 1) -> ParsedFile:
    """Parse one file, through the cache when ``cache_root`` is given; a big Kineto trace is split across
    ``workers`` processes (:func:`tracekit.parsers.kineto.parse`). A cache that cannot be written (read-only,
    full, not a directory) never stops the analysis: the first such error goes to ``notes``."""
    fmt = detect(path) if os.path.getsize(path) else None
    if fmt is None:
        return parse(path)
    if cache_root is None:
        return parse_stable(path, fmt, workers)[0]
    try:
        hit = cache.load(Path(cache_root) / cache.entry_key(path, fmt.version))
    except OSError:
        hit = None
    if hit is not None:
        return hit
    parsed, st = parse_stable(path, fmt, workers)
    if st is None:
        return parsed
    entry = Path(cache_root) / cache.entry_key(path, fmt.version, st)
    try:
        cache.store(parsed, entry)
    except OSError as exc:
        if notes is not None and not any(n.path == cache_root for n in notes):
            notes.append(_cache_note(cache_root, exc))
        return parsed
    return cache.load(entry) or parsed


def _parse_format(path: str, fmt: Format, workers: int) -> ParsedFile:
    if workers > 1 and fmt.name == "kineto":
        from tracekit.parsers import kineto

        return kineto.parse(path, workers=workers)
    return fmt.parse(path)


def _worker(path: str, cache_root: str, scratch: str | None = None) -> tuple[str, str | None]:
    """Process-pool task: parse into a cache entry; returns the entry's path and, when the cache could not
    be written and the entry went to ``scratch`` instead, why."""
    fmt = detect(path)
    version = fmt.version if fmt else "?"
    entry = Path(cache_root) / cache.entry_key(path, version)
    if cache.load(entry) is not None:
        return str(entry), None
    parsed, st = parse_stable(path)
    if st is not None:
        entry = Path(cache_root) / cache.entry_key(path, version, st)
        try:
            cache.store(parsed, entry)
            return str(entry), None
        except OSError as exc:
            if scratch is None:
                raise
            reason = cache.os_error(exc)[1]
    else:
        if scratch is None:
            raise TraceError(path, "the file changed while it was read (twice)")
        reason = None  # not cached: it changed while it was read
    entry = Path(scratch) / cache.entry_key(path, version)
    cache.store(parsed, entry)
    return str(entry), reason


def load(paths: Iterable[str], *, use_cache: bool = True, cache_dir: str | os.PathLike | None = None,
         jobs: int | None = None, progress: Progress | None = None,
         found: tuple[list[str], list[Diagnostic]] | None = None, rank_regex: str | None = None) -> TraceSet:
    """Load every trace under ``paths`` (files or directories) into one TraceSet (``found``: what
    :func:`discover` gave for ``paths``, when the caller already looked: 100 000 files are sniffed once;
    ``rank_regex``: :func:`assign_ranks`).

    Several processes may load the same traces through one cache at once; a cache that cannot be written
    (read-only, full, not a directory of its own) costs a warning, never the answer."""
    files, notes = found if found is not None else discover(paths)
    if not files:
        raise TraceError(None, "no input files")
    sizes = [os.path.getsize(f) for f in files]
    total = sum(sizes)
    cache_root = str(cache_dir or cache.default_dir()) if use_cache else None
    jobs = jobs or (os.cpu_count() or 1)
    parsed: list[ParsedFile | None] = [None] * len(files)
    cache_notes: list[Diagnostic] = []
    failed: list[TraceError] = []  # inputs that cannot be read: the others are analysed without them
    done = 0
    if cache_root is not None:  # cache hits reopen here: no worker process is started for them
        for i, f in enumerate(files):
            fmt = detect(f) if sizes[i] else None
            try:
                parsed[i] = cache.load(Path(cache_root) / cache.entry_key(f, fmt.version)) if fmt else None
            except OSError:
                parsed[i] = None
            if parsed[i] is not None:
                done += sizes[i]
                if progress:
                    progress(done, total, f)
    todo = [i for i in range(len(files)) if parsed[i] is None]
    if jobs > 1 and len(todo) > 1 and sum(sizes[i] for i in todo) >= PARALLEL_MIN_BYTES:
        # entries the cache cannot take (read-only, full) go to a scratch directory instead
        scratch = tempfile.mkdtemp(prefix="tracekit-")
        root = cache_root or scratch
        try:
            with ProcessPoolExecutor(max_workers=min(jobs, len(todo)), mp_context=get_context("spawn")) as pool:
                futures = {pool.submit(_worker, files[i], root, scratch): i for i in todo}
                for fut in as_completed(futures):
                    i = futures[fut]
                    try:
                        entry, reason = fut.result()
                    except OSError as exc:  # not even the scratch directory could take it: parse it here
                        entry, reason = None, cache.os_error(exc)[1]
                    except TraceError as exc:
                        failed.append(exc)
                        continue
                    if reason and cache_root is not None and not cache_notes:
                        cache_notes.append(_cache_note(cache_root, OSError(reason)))
                    parsed[i] = cache.load(Path(entry)) if entry else None
                    if parsed[i] is None:  # replaced and removed meanwhile, or never written: parse it here
                        parsed[i] = _parse_cached(files[i], None)
                    done += sizes[i]
                    if progress:
                        progress(done, total, files[i])
        finally:
            # tables are memory-mapped: the mapping survives the unlink on POSIX
            shutil.rmtree(scratch, ignore_errors=True)
    else:
        # fewer files than processes: each big one is split across them instead
        split = jobs if len(todo) == 1 else 1
        for i in todo:
            f = files[i]
            try:
                parsed[i] = _parse_cached(f, cache_root, cache_notes, split)
            except TraceError as exc:
                failed.append(exc)
                continue
            done += sizes[i]
            if progress:
                progress(done, total, f)
    traces = assemble([p for p in parsed if p is not None], notes + cache_notes + unread(failed, len(files)),
                      rank_regex=rank_regex)
    if todo:  # what the parse and the joining of the files' tables freed goes back (kept in glibc's heap for the
        release_memory()  # analysis to reuse: 100-200 MB more at an 8 x 300 MB job's peak, and no faster)
    return traces


def unread(failed: list[TraceError], inputs: int) -> list[Diagnostic]:
    """The warnings for inputs that could not be read among ``inputs`` (one damaged file never takes the others
    down); when none could be read, the first one's error is raised."""
    if failed and len(failed) >= inputs:
        raise failed[0]
    return [Diagnostic(e.path or "", f"left out, the other inputs analysed without it: {e.message}",
                       offset=e.offset, line=e.line) for e in failed]


def assign_ranks(claims: list[tuple[str, int | None]], rank_regex: str | None = None
                 ) -> tuple[list[int], list[str], list[Diagnostic]]:
    """Ranks of per-rank traces from ``(path, rank the file claims)`` in input order: what the file says
    (``distributedInfo``), else the file name (:mod:`tracekit.loading.layouts`: ``rank3``, ``worker3``, the
    tools' layouts), else the order given. ``rank_regex`` (``--rank-regex``) takes the rank from each path first,
    over ``distributedInfo``; a file name and a ``distributedInfo`` that disagree get a warning.

    Returns ``(ranks, sources, diagnostics)``; a rank claimed twice is kept by the first file only.
    """
    rx = layouts.compile_rank_regex(rank_regex) if rank_regex else None
    if rx is not None:
        named = [(layouts.regex_rank(rx, p), False) for p, _ in claims]
        if claims and all(r is None for r, _ in named):
            raise TraceError(None, f"--rank-regex {rank_regex!r} finds no rank in any of the {len(claims)} traces' "
                                   f"paths (e.g. {claims[0][0]})")
    else:
        named = [(nf.rank, nf.local) for nf in (layouts.facts(p) for p, _ in claims)]
    first, second = ((named, [(r, False) for _, r in claims]) if rx is not None
                     else ([(r, False) for _, r in claims], named))
    diags = _rank_disagreements(claims, named, rx is not None)
    if rx is not None:
        unmatched = [p for (p, _), (r, _) in zip(claims, named, strict=True) if r is None]
        if unmatched:
            more = f" and {len(unmatched) - 1} more" if len(unmatched) > 1 else ""
            diags.append(Diagnostic(unmatched[0], f"--rank-regex {rank_regex!r} finds no rank in this path{more}: "
                                                  "their ranks come from distributedInfo, else the order given"))
    labels = ("rank regex", "distributedInfo") if rx is not None else ("distributedInfo", "file name")
    assigned: dict[int, int] = {}
    source: dict[int, str] = {}
    taken: set[int] = set()
    for i, (path, _) in enumerate(claims):
        r = first[i][0]
        if r is not None and r not in taken:
            assigned[i], source[i] = r, labels[0]
            taken.add(r)
        elif r is not None:
            diags.append(Diagnostic(path, f"rank {r} is claimed by another file too; "
                                          "are these traces from the same job?"))
    for i in range(len(claims)):
        r = second[i][0]
        if i not in assigned and r is not None and r not in taken:
            assigned[i], source[i] = r, labels[1]
            taken.add(r)
    nxt = 0
    for i in range(len(claims)):
        if i in assigned:
            continue
        while nxt in taken:
            nxt += 1
        assigned[i], source[i] = nxt, "order"
        taken.add(nxt)
    return [assigned[i] for i in range(len(claims))], [source[i] for i in range(len(claims))], diags


def _rank_disagreements(claims: list[tuple[str, int | None]], named: list[tuple[int | None, bool]],
                        by_regex: bool) -> list[Diagnostic]:
    """One warning for the files whose name (a node-local rank aside) says another rank than their
    ``distributedInfo``, naming the first and which rank was taken."""
    off = [(p, n, c) for (p, c), (n, local) in zip(claims, named, strict=True)
           if n is not None and c is not None and n != c and not local]
    if not off:
        return []
    path, name, claimed = off[0]
    more = f" (and {len(off) - 1} more files)" if len(off) > 1 else ""
    if by_regex:
        text = (f"--rank-regex gives rank {name}, the file's distributedInfo says rank {claimed}{more}: "
                f"rank {name} taken")
    else:
        text = (f"the file name says rank {name}, the file's distributedInfo rank {claimed}{more}: rank {claimed} "
                "taken (--rank-regex takes the ranks from the names)")
    return [Diagnostic(path, text)]


#: formats with one file per rank that does not know its global rank in its tables
PER_RANK_FORMATS = frozenset({"kineto"})


def assemble(files: list[ParsedFile], notes: list[Diagnostic] | None = None, *, rank_regex: str | None = None
             ) -> TraceSet:
    """Assign ranks (:func:`assign_ranks`) and concatenate the tables of parsed files."""
    diags = list(notes or [])
    for f in files:
        diags.extend(f.diagnostics)
    # ranks of per-rank traces (Kineto): file content, then file name, then order
    traced = [f for f in files if f.format in PER_RANK_FORMATS]
    rank_list, source_list, rank_diags = assign_ranks([(f.path, f.meta.get("rank")) for f in traced], rank_regex)
    diags.extend(rank_diags)
    assigned = dict(enumerate(rank_list))
    source = dict(enumerate(source_list))
    events, colls, topo = [], [], []
    rank_rows: list[dict] = []
    extra: dict[str, list[pa.Table]] = {}
    for i, f in enumerate(traced):
        r = assigned[i]
        events.append(_with_rank(f.events, r))
        colls.append(_with_rank(f.collectives, r))
        topo.append(f.topology)
        rank_rows.append(_rank_row(f, r, source[i]))
    for f in files:
        if f.format in PER_RANK_FORMATS:
            for k, t in f.tables.items():
                extra.setdefault(k, []).append(t)
            continue
        # formats that know their ranks themselves (NCCL logs, Horovod timelines)
        events.append(f.events)
        colls.append(f.collectives)
        topo.append(f.topology)
        for k, t in f.tables.items():
            extra.setdefault(k, []).append(t)
    ev = _concat(events, schema.EVENTS)
    ranks = schema.table(schema.RANKS, {k: [row.get(k) for row in rank_rows] for k in schema.RANKS.names}) \
        if rank_rows else schema.empty(schema.RANKS)
    # ranks only seen by other formats
    known = set(ranks.column("rank").to_pylist())
    others = sorted({int(r) for t in events for r in pc.unique(t.column("rank")).to_pylist() if r is not None}
                    - known)
    if others:
        more = schema.table(schema.RANKS, {"rank": others, "rank_source": ["other format"] * len(others),
                                           "clock_offset_ns": [0] * len(others)})
        ranks = pa.concat_tables([ranks, more])
    return TraceSet(ranks=ranks, events=ev, collectives=_concat(colls, schema.COLLECTIVES),
                    topology=_concat(topo, schema.TOPOLOGY),
                    tables={k: pa.concat_tables(v, promote_options="permissive") for k, v in extra.items()},
                    files=files, diagnostics=diags)


def _with_rank(t: pa.Table, rank: int) -> pa.Table:
    i = t.schema.get_field_index("rank")
    return t.set_column(i, t.schema.field(i), pa.array(np.full(t.num_rows, rank, dtype=np.int32)))


def _concat(tables: list[pa.Table], sch: pa.Schema) -> pa.Table:
    tables = [schema.conform(t, sch) for t in tables if t.num_rows]
    if not tables:
        return schema.empty(sch)
    return pa.concat_tables(tables).unify_dictionaries()


class RankFacts:
    """The ``ranks`` row facts that need the events (most common CPU pid and device), gathered batch by
    batch: counts per value in order of first appearance, so the mode equals the whole table's."""

    def __init__(self) -> None:
        self.pids: dict[int, int] = {}
        self.devices: dict[int, int] = {}
        self.events = 0

    def add(self, ev: pa.Table | pa.RecordBatch) -> None:
        self.events += ev.num_rows
        if not ev.num_rows:
            return
        cpu_pid = ev.column("pid").filter(pa.array(schema.dict_match(ev.column("lane"), "^cpu")))  # one column
        for target, col in ((self.pids, cpu_pid), (self.devices, ev.column("device"))):
            vals = pc.drop_null(col)
            if len(vals):
                counts = pc.value_counts(vals)
                for v, n in zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist(),
                                strict=True):
                    target[v] = target.get(v, 0) + n

    @staticmethod
    def _best(counts: dict[int, int]) -> int | None:
        best = None
        for v, n in counts.items():
            if best is None or n > counts[best]:
                best = v
        return best

    def row(self, f: ParsedFile, rank: int, rank_source: str) -> dict:
        """A ``ranks`` row (schema.RANKS) for the rank read from ``f``."""
        return {
            "rank": rank, "rank_source": rank_source, "host": f.meta.get("host"),
            "pid": self._best(self.pids), "device": self._best(self.devices),
            "world_size": f.meta.get("world_size"), "backend": f.meta.get("backend"),
            "source_files": [f.path], "format": f.format, "format_version": f.meta.get("format_version"),
            "clock_offset_ns": 0, "events": self.events, "bytes_lost": f.bytes_lost, "complete": f.complete,
        }


def _rank_row(f: ParsedFile, rank: int, rank_source: str) -> dict:
    facts = RankFacts()
    facts.add(f.events)
    return facts.row(f, rank, rank_source)
