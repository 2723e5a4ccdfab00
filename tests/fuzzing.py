"""Fuzzing harness shared by ``tests/test_fuzz.py`` (a small budget in CI) and ``benchmarks/fuzz.py`` (a long run).

A fuzz *target* is a parser plus a seed corpus: :data:`TARGETS` is the registry, so adding a parser is one
line (``register(Target("nccl-log", nccl.parse, nccl_seeds))``). Inputs are mutated seeds —
byte flips, truncation at every offset class (inside a string, inside a number, between records,
inside the gzip header or body), deep nesting, huge numbers, bad UTF-8, wrong types per field, gzip of
garbage, empty gzip members, NUL bytes — and each case is checked by :func:`check`: the only allowed
outcomes are a parsed file (possibly with diagnostics) or :class:`tracekit.model.diagnostics.TraceError`
naming the file, in bounded time, and the analysis of whatever was parsed must not fail either.
"""

from __future__ import annotations

import functools
import gzip
import json
import os
import random
import re
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests import kineto_traces as kt
from tracekit.model.diagnostics import TraceError
from tracekit.model.schema import ParsedFile

#: time allowed per case: this much, plus SECONDS_PER_MB for every MB of (decompressed) input
BASE_SECONDS = 10.0
SECONDS_PER_MB = 5.0


@dataclass
class Target:
    """A parser under fuzzing: ``parse(path) -> ParsedFile``; ``seeds()`` gives the corpus (bytes);
    ``json_seeds`` says the seeds are JSON documents (enables the structure-aware mutations)."""

    name: str
    parse: Callable[[str], ParsedFile]
    seeds: Callable[[], list[bytes]]
    json_seeds: bool = True
    #: formats (``parsers.formats()`` names) whose real files (:func:`real_files`) join the corpus
    formats: tuple[str, ...] = ()
    _cache: list[bytes] = field(default_factory=list, repr=False)

    def corpus(self) -> list[bytes]:
        """The seeds, then a prefix of every real file of :attr:`formats`; each distinct input once."""
        if not self._cache:
            seen: set[bytes] = set()
            for data in [*self.seeds(), *(real_seed(p) for p, fmt in real_files() if fmt in self.formats)]:
                if data and data not in seen:
                    seen.add(data)
                    self._cache.append(data)
        return self._cache


def shared_data_dir() -> Path:
    env = os.environ.get("TRACEKIT_SHARED_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"


def kineto_seeds() -> list[bytes]:
    """Every Kineto writer era of ``tests/kineto_traces.py`` (GPU and CPU jobs); the real traces join every
    target's corpus through :func:`real_files`."""
    import tempfile

    out: list[bytes] = []
    with tempfile.TemporaryDirectory() as d:
        for i, era in enumerate(kt.ERAS):
            out.append(kt.write(Path(d) / f"{era}.json", kt.gpu_job(2), era=era, pretty=i % 2 == 1).read_bytes())
        ms = 1_000_000
        cpu = [kt.Ev("ProfilerStep#1", "user_annotation", kt.EPOCH_NS, 20 * ms, tid=10),
               kt.Ev("aten::mm", "cpu_op", kt.EPOCH_NS + ms, 9 * ms, tid=10),
               kt.Ev("gloo:all_reduce", "user_annotation", kt.EPOCH_NS + 5 * ms, 10 * ms, tid=11,
                     args={"Input Dims": [[100]], "Input type": ["float"]})]
        extra = [{"ph": "M", "name": "process_name", "pid": 4242, "tid": 0, "args": {"name": "python"}},
                 {"ph": "i", "s": "t", "name": "[memory]", "pid": 4242, "tid": 10, "ts": kt.RawNumber("5.5"),
                  "args": {"Bytes": 64}},
                 {"ph": "B", "name": "phase", "pid": 4242, "tid": 1, "ts": kt.RawNumber("100.5"),
                  "cat": "user_annotation"}, {"ph": "E", "pid": 4242, "tid": 1, "ts": kt.RawNumber("200.5")}]
        out.append(kt.write(Path(d) / "cpu.json", cpu, era="relative-after", backend="gloo",
                            extra_events=extra).read_bytes())
    return out


#: real files are cut to about this much (decompressed) at a record or line boundary: the fuzzer's cases stay
#: small and fast, and the prefix still holds the file's header, metadata and first records
REAL_PREFIX = 48 << 10


@functools.cache
def real_files() -> tuple[tuple[Path, str], ...]:
    """Every real input file of the project and its format (sniffed by content, as the CLI does): the
    recordings under ``tests/data`` and ``samples/``, and ../shared/data when present."""
    from tracekit.parsers import detect

    root = Path(__file__).resolve().parents[1]
    out = []
    for d in (root / "tests" / "data", root / "samples", shared_data_dir()):
        if not d.is_dir():
            continue
        for p in sorted(d.rglob("*")):
            if not p.is_file() or p.suffix in (".py", ".md", ".svg", ".pyc"):
                continue
            try:
                fmt = detect(str(p))
            except (OSError, TraceError):
                continue
            if fmt is not None:
                out.append((p, fmt.name))
    return tuple(out)


def real_seed(path: Path, limit: int = REAL_PREFIX) -> bytes:
    """The (decompressed) content of a real file, cut before ``limit`` bytes at the last record boundary
    (JSON: ``},`` then the brackets closed) or line end, so that it still parses."""
    try:
        with (gzip.open(path, "rb") if path.read_bytes()[:2] == b"\x1f\x8b" else open(path, "rb")) as f:
            head = f.read(limit + 1)
    except (OSError, EOFError):
        return b""
    if len(head) <= limit:
        return head
    head = head[:limit]
    if head.lstrip()[:1] in (b"{", b"["):
        cut = head.rfind(b"},")
        if cut <= 0:
            return head
        return head[: cut + 1] + (b"]}" if head.lstrip()[:1] == b"{" else b"]")
    cut = head.rfind(b"\n")
    return head[: cut + 1] if cut > 0 else head


TARGETS: dict[str, Target] = {}


def register(target: Target) -> None:
    """Add a parser to the fuzzing registry (one line per parser)."""
    TARGETS[target.name] = target


def nccl_log_seeds() -> list[bytes]:
    """NCCL debug logs of ``tests/nccl_logs.py``: old and new grammar eras, launcher prefixes, timestamps,
    interleaved processes with widowed lines and garbage; then the excerpts of ``tests/data/nccl`` (synthetic,
    as pasted into bug reports: no Init lines, no host prefix, 2.19+ forms, NVLS, CollNet, SUBSYS=ALL)."""
    from tests import nccl_logs as nl

    out = []
    for i, (era, launcher, ts) in enumerate([("2.4.8", None, None), ("2.12.12", "torchrun", "all"),
                                             ("2.18.5", "srun", None), ("2.21.5", "openmpi", "all"),
                                             (nl.ERAS[-1], "ray", None)]):
        job = nl.make_job(era, nranks=4, seed=i)
        out.append(nl.render(job, launcher=launcher, timestamps=ts, seed=i, widows=2 if launcher is None else 0,
                             garbage=0.05).encode())
    out += [p.read_bytes() for p in sorted((Path(__file__).parent / "data" / "nccl").glob("*.log"))]
    return out


def horovod_seeds() -> list[bytes]:
    """Horovod timelines of ``tests/horovod_timelines.py`` (both eras, in and out of time order); the real
    recordings (``tests/data/horovod``, ../shared/data/horovod) join through :func:`real_files`."""
    from tests.horovod_timelines import make_timeline

    return [make_timeline(era=era, iterations=2, tensors=["a", "b", "c"], interleave_seed=seed).data
            for era in ("new", "old") for seed in (None, 9)]


def flight_recorder_seeds() -> list[bytes]:
    """Synthetic NCCL dumps of ``tests/flight_recorder_dumps.py`` (schema 1.1 to 2.10, pickle and JSON); the recorded
    gloo dumps (``tests/data/flight_recorder``) join through :func:`real_files`."""
    import pickle

    from tests import flight_recorder_dumps as frd

    dumps = [frd.job(v, world=2, steps=3)[0] for v in ("1.1", "1.4", "2.3", "2.10")]
    return [*(pickle.dumps(d, protocol=2) for d in dumps), frd.as_json(dumps[-1])]


def _register_defaults() -> None:
    from tracekit import parsers
    from tracekit.parsers import flight_recorder, horovod, kineto, nccl

    register(Target("kineto", kineto.parse, kineto_seeds, formats=("kineto",)))
    register(Target("nccl-log", nccl.parse, nccl_log_seeds, json_seeds=False, formats=("nccl-log",)))
    register(Target("horovod", horovod.parse, horovod_seeds, formats=("horovod",)))
    register(Target("flight-recorder", flight_recorder.parse, flight_recorder_seeds, formats=("flight-recorder",)))
    # the dispatching entry point: sniffing, gzip, empty files, then whichever parser claims the file
    register(Target("any-format", parsers.parse, lambda: [
        *TARGETS["kineto"].corpus(), *TARGETS["nccl-log"].corpus()[:2], *TARGETS["horovod"].corpus()[:2]]))


_register_defaults()


# --- mutations -------------------------------------------------------------------------------------

HUGE_NUMBERS = ["1e400", "-1e400", str(2**100), str(2**63), str(-(2**63) - 1), "9300000000000000000",
                "1e21", "123456789012345678901234567890.5", "-0", "1e-400", "0.0000000000000000000001",
                "NaN", "Infinity", "-Infinity", "nan", "inf", "1" * 400]
WRONG_VALUES: list[Any] = ["str", "", "12", "1.5", "stream 7", [1, 2], [], {"a": 1}, {}, None, True, False,
                           -1, 0, 2**64, 1.5, -3.25, "\u0000", "\ud800"]
FIELDS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "args", "id", "s")
ARG_FIELDS = ("External id", "external id", "correlation", "device", "stream", "bytes", "Collective name",
              "In msg nelems", "Out msg nelems", "Group size", "dtype", "Process Group Name",
              "Process Group Ranks", "Input Dims", "Input type", "Seq", "Rank", "name", "labels")
TOP_FIELDS = ("distributedInfo", "baseTimeNanoseconds", "deviceProperties", "traceName", "schemaVersion",
              "displayTimeUnit", "traceEvents")
INFO_FIELDS = ("rank", "world_size", "backend", "nccl_version", "pg_config", "pg_count")
BAD_UTF8 = [b"\xff", b"\xfe\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80", b"\xe2\x82"]


def _loads(seed: bytes) -> Any | None:
    try:
        return json.loads(seed)
    except ValueError:
        return None


def _events_of(doc: Any) -> list | None:
    if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        return doc["traceEvents"]
    if isinstance(doc, list):
        return doc
    return None


def _dump(doc: Any, rng: random.Random) -> bytes:
    return json.dumps(doc, indent=rng.choice([None, 1]), ensure_ascii=rng.random() < 0.5).encode("utf-8",
                                                                                                "surrogatepass")


def _positions(data: bytes, kind: str) -> list[int]:
    """Offsets of one class: inside a string, inside a number, between records, anywhere."""
    if kind == "string":
        return [m.end() for m in re.finditer(rb'"', data[:-1])]
    if kind == "number":
        return [m.start() + 1 + k for m in re.finditer(rb"[0-9]{2,}", data) for k in range(m.end() - m.start() - 1)]
    if kind == "record":
        return [m.start() + k for m in re.finditer(rb"},", data) for k in (1, 2)]
    return list(range(len(data) + 1))


def mutate(seed: bytes, rng: random.Random, json_seed: bool = True) -> tuple[str, bytes]:
    """One mutation of ``seed``: returns ``(what, data)``."""
    kinds = ["flip", "truncate", "nul", "bad-utf8", "gzip-garbage", "gzip-truncate", "gzip-empty-members",
             "splice", "repeat"]
    if json_seed:
        kinds += ["wrong-type", "wrong-type", "wrong-arg", "wrong-top", "huge-number", "huge-number",
                  "deep-nesting", "unescaped"]
    kind = rng.choice(kinds)
    data = seed
    if kind == "flip":
        b = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            if b:
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8) if rng.random() < 0.7 else rng.randrange(1, 256)
        return kind, bytes(b)
    if kind == "truncate":
        cls = rng.choice(["string", "number", "record", "any"])
        pos = _positions(data, cls) or [len(data) // 2]
        return f"truncate-{cls}", data[: rng.choice(pos)]
    if kind == "nul":
        i = rng.randrange(len(data) + 1)
        return kind, data[:i] + b"\x00" * rng.choice([1, 2, 100]) + data[i:]
    if kind == "bad-utf8":
        strings = _positions(data, "string") or [0]
        i = rng.choice(strings)
        return kind, data[:i] + rng.choice(BAD_UTF8) + data[i:]
    if kind == "gzip-garbage":
        body = rng.choice([os.urandom(rng.randint(0, 2000)), data[: rng.randint(0, len(data))], b""])
        z = gzip.compress(body)
        return kind, z if rng.random() < 0.5 else z[:10] + os.urandom(rng.randint(0, 200))
    if kind == "gzip-truncate":
        z = gzip.compress(data)
        cut = rng.choice([rng.randint(0, 10), rng.randint(10, max(10, len(z)))])
        return kind, z[:cut]
    if kind == "gzip-empty-members":
        z = gzip.compress(data)
        parts = [gzip.compress(b""), z, gzip.compress(b"")]
        if rng.random() < 0.3:
            parts.append(b"\x00" * 16)
        if rng.random() < 0.3:
            parts.append(b"trailing garbage")
        return kind, b"".join(parts)
    if kind == "splice":
        i, j = sorted(rng.randrange(len(data) + 1) for _ in range(2))
        return kind, data[:i] + data[j:]
    if kind == "repeat":
        i, j = sorted(rng.randrange(len(data) + 1) for _ in range(2))
        return kind, data[:j] + data[i:j] * rng.randint(1, 5) + data[j:]
    doc = _loads(seed)
    events = _events_of(doc)
    if doc is None or events is None:
        return "flip", mutate(seed, rng, False)[1]
    if kind in ("wrong-type", "wrong-arg") and events:
        for _ in range(rng.randint(1, 4)):
            e = rng.choice(events)
            if not isinstance(e, dict):
                continue
            if kind == "wrong-type":
                e[rng.choice(FIELDS)] = rng.choice([*WRONG_VALUES, *(float("nan"), float("inf"))])
            else:
                a = e.get("args") if isinstance(e.get("args"), dict) else {}
                a[rng.choice(ARG_FIELDS)] = rng.choice(WRONG_VALUES)
                e["args"] = a
        return kind, _dump(doc, rng)
    if kind == "wrong-top" and isinstance(doc, dict):
        key = rng.choice(TOP_FIELDS)
        if key == "distributedInfo" and rng.random() < 0.6:
            info = doc.get("distributedInfo") if isinstance(doc.get("distributedInfo"), dict) else {}
            info[rng.choice(INFO_FIELDS)] = rng.choice([*WRONG_VALUES, 2**100, -5])
            doc["distributedInfo"] = info
        else:
            doc[key] = rng.choice([*WRONG_VALUES, 2**100, -(2**70)])
        return kind, _dump(doc, rng)
    if kind == "huge-number":
        text = _dump(doc, rng).decode("utf-8", "surrogatepass")
        field_name = rng.choice(["ts", "dur", "pid", "tid", "correlation", "External id", "device", "stream",
                                 "baseTimeNanoseconds", "rank", "world_size", "In msg nelems", "bytes"])

        spots = list(re.finditer(rf'"{re.escape(field_name)}": (-?[0-9][0-9.eE+-]*)', text))
        # replace from the end so earlier offsets stay valid
        for m in sorted(rng.sample(spots, min(len(spots), rng.randint(1, 3))), key=lambda m: -m.start()):
            text = text[: m.start(1)] + rng.choice(HUGE_NUMBERS) + text[m.end(1):]
        return kind, text.encode("utf-8", "surrogatepass")
    if kind == "deep-nesting":
        depth = rng.choice([100, 1000, 10_000, 100_000])
        where = rng.choice(["event", "args", "member", "top"])
        nest = "[" * depth + "]" * depth if rng.random() < 0.7 else '{"a":' * depth + "1" + "}" * depth
        if rng.random() < 0.2:
            nest = nest[: len(nest) // 2]  # unclosed
        if where == "top":
            return kind, nest.encode()
        text = _dump(doc, rng).decode("utf-8", "surrogatepass")
        if where == "member" and isinstance(doc, dict):
            text = text.replace('"traceEvents"', f'"deep": {nest}, "traceEvents"', 1)
        elif where == "args":
            text = text.replace('"args": {', f'"args": {{"deep": {nest}, ', 1)
        else:
            i = text.find("{", text.find("[") if isinstance(doc, dict) else 0)
            text = text[:i] + nest + ", " + text[i:] if i > 0 else text
        return kind, text.encode("utf-8", "surrogatepass")
    if kind == "unescaped":
        text = _dump(doc, rng).decode("utf-8", "surrogatepass")
        inject = rng.choice(['"', '\\', '\\"', '\n', '\t', '\\u12', '\\x41', '"}, {"'])
        i = text.find('"name": "')
        if i < 0:
            return kind, text.encode("utf-8", "surrogatepass")
        j = i + len('"name": "') + rng.randint(0, 3)
        return kind, (text[:j] + inject + text[j:]).encode("utf-8", "surrogatepass")
    return kind, data


# --- checking --------------------------------------------------------------------------------------


@dataclass
class Finding:
    """A disallowed outcome: the target, the mutation, what happened, and the input (for reproduction)."""

    target: str
    mutation: str
    problem: str
    data: bytes
    detail: str = ""

    def summary(self) -> str:
        return f"[{self.target}] {self.mutation}: {self.problem}"


def _decompressed_mb(data: bytes) -> float:
    if data[:2] == b"\x1f\x8b":
        try:
            import zlib

            d = zlib.decompressobj(31)
            return len(d.decompress(data, 1 << 30)) / 1e6
        except Exception:
            return len(data) / 1e6
    return len(data) / 1e6


def check(target: Target, data: bytes, path: Path, mutation: str = "", *, analyse: bool = True,
          cli: bool = False, outcome: dict[str, bool] | None = None) -> Finding | None:
    """Parse ``data`` (written to ``path``) with ``target``; a :class:`Finding` for anything not allowed.

    Allowed: a ParsedFile (then, with ``analyse``, iterations and attribution of it must not fail), or a
    TraceError whose message names the file. Not allowed: any other exception, a TraceError without the
    file name, more CPU time than :data:`BASE_SECONDS` + :data:`SECONDS_PER_MB` per MB. With ``cli``, the
    ``tracekit summary`` command must also end with exit status 0 or 1 (never the internal-error 70).
    ``outcome["parsed"]`` says whether the parser returned a file (True) or refused it (False).
    """
    path.write_bytes(data)
    limit = BASE_SECONDS + SECONDS_PER_MB * _decompressed_mb(data)
    # CPU seconds, not wall: on a shared machine (or a paused fuzzer) wall time says nothing about the parser
    t0 = time.process_time()
    try:
        parsed = target.parse(str(path))
    except TraceError as exc:
        if str(path) not in str(exc):
            return Finding(target.name, mutation, f"TraceError without the file name: {exc}", data)
        parsed = None
    except RecursionError as exc:
        return Finding(target.name, mutation, f"RecursionError: {str(exc)[:100]}", data, traceback.format_exc())
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # pyo3's PanicException (polars, a Rust panic) is a BaseException
        return Finding(target.name, mutation, f"{type(exc).__name__}: {str(exc)[:200]}", data,
                       traceback.format_exc())
    elapsed = time.process_time() - t0
    if outcome is not None:
        outcome["parsed"] = parsed is not None
    if elapsed > limit:
        return Finding(target.name, mutation, f"took {elapsed:.1f} CPU-s (limit {limit:.1f} s)", data)
    if parsed is not None and analyse:
        from tracekit.analysis.pipeline import analyse as run_analysis
        from tracekit.loading.traceset import assemble

        try:
            result = run_analysis(assemble([parsed]))
            if not result.horovod_only:  # the lazily built results too: graph, critical path, what-if
                _ = result.critical_path_summary, result.bottleneck
            # the NCCL logs' topology, problems and link classes; a Flight Recorder dump's hang
            _ = result.topology_overview, result.nccl_problems, result.link_busy, result.hang
        except TraceError:
            pass
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            return Finding(target.name, mutation, f"analysis: {type(exc).__name__}: {str(exc)[:200]}", data,
                           traceback.format_exc())
    if cli:
        import contextlib
        import io

        from tracekit.cli import EXIT_INTERNAL, main

        # --json, and the terminal's text (names in the data go through rich markup there)
        for argv in (["summary", str(path), "--no-cache", "--json", "-q"], ["summary", str(path), "--no-cache"]):
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                rc = main(argv)
            if rc == EXIT_INTERNAL or rc not in (0, 1):
                return Finding(target.name, mutation, f"CLI exit {rc}: {err.getvalue().strip()[:300]}", data)
    return None


def run(n_cases: int, seed: int = 0, targets: list[str] | None = None, workdir: Path | None = None,
        analyse: bool = True, cli: bool = False, log: Callable[[str], None] | None = None
        ) -> tuple[int, list[Finding]]:
    """Run ``n_cases`` random mutations over the registered targets; returns (cases run, findings)."""
    import tempfile

    rng = random.Random(seed)
    names = targets or sorted(TARGETS)
    findings: list[Finding] = []
    seen: set[str] = set()
    with tempfile.TemporaryDirectory(dir=workdir) as d:
        for i in range(n_cases):
            t = TARGETS[names[i % len(names)]]
            corpus = t.corpus()
            what, data = mutate(rng.choice(corpus), rng, t.json_seeds)
            f = check(t, data, Path(d) / f"case{i % 7}.json", what, analyse=analyse, cli=cli)
            if f is not None:
                key = f.problem.split(":")[0] + f.problem[-60:]
                if key not in seen:
                    seen.add(key)
                    findings.append(f)
                    if log:
                        log(f"case {i}: {f.summary()}")
    return n_cases, findings
