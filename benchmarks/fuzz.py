"""The long fuzz run: coverage-guided fuzzing of every registered parser (``tests/fuzzing.py``), then the
line and branch coverage of each parser module that the run reached.

    python benchmarks/fuzz.py --cases 100000            # per target: kineto, nccl-log, horovod, any-format
    python benchmarks/fuzz.py --cases 5000 --target kineto --engine random   # the unguided baseline

Engines:

- ``atheris`` (default when ``pip install atheris`` works — ``pip install -e '.[fuzz]'``): libFuzzer's
  coverage-guided loop over the parser modules (``tracekit.parsers``, branch coverage instrumented at
  import; atheris's comparison tracing is off: it leaks the compared objects, ~1 MB per case). Its
  corpus starts from the registry's seeds (generated files of every writer era, the real recordings of
  ``tests/data`` and ``samples/``, ../shared/data when present), keeps every case that reached new
  branches, and mutates with libFuzzer's byte mutators and the registry's structure-aware ones
  (:func:`tests.fuzzing.mutate`: truncation inside strings/numbers/records, wrong types, huge numbers,
  deep nesting, gzip damage, ...) half and half.
- ``random``: the registry's mutations of the seeds only (no feedback), run under coverage.py; the
  baseline the guided engine is measured against, and the fallback where Atheris does not install.

Every case is parsed and checked against the registry's contract (:func:`tests.fuzzing.check`: a parsed
file, or a TraceError naming the file, within its CPU-time bound); a parsed case is also analysed
(iterations, attribution, collectives, critical path, what-if) when its CRC-32 falls in the sample
(``--analyse-every K``: 1 in K), and every case the fuzzer kept in its corpus is analysed afterwards.
Each target runs in its own child process (libFuzzer owns the process), one after another; a child that
dies (a crash in native code, a hang past ``--timeout``, memory past ``--rss-limit-mb``) is restarted on
the same corpus, and its input is replayed in a fresh process to tell a real finding from the machine's
noise. Afterwards the kept corpus is replayed under coverage.py: lines and branches of each parser
module reached by the seeds alone and by seeds + corpus.

Everything lives under ``--workdir`` (default ``.fuzz/``): ``TARGET/corpus`` (kept between runs, so a
second run continues), ``TARGET/findings`` (each finding's input and traceback), logs and statistics.
Prints the cases run per target, the distinct findings and the coverage table; exit status 1 when
anything was found. ``--save DIR`` also copies each finding's input there.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
import zlib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PARSERS_DIR = ROOT / "parsers"
DEFAULT_TARGETS = ("kineto", "nccl-log", "horovod", "any-format")


# --- shared by the child processes -------------------------------------------------------------------


class Recorder:
    """Counts a child's cases and writes its distinct findings (``findings/KEY.bin`` + ``.txt``) and its
    statistics (``stats-PID.json``, rewritten every :attr:`FLUSH` cases) under ``out``."""

    FLUSH = 100

    def __init__(self, out: Path, target: str, engine: str) -> None:
        self.out = out
        self.findings = out / "findings"
        self.findings.mkdir(parents=True, exist_ok=True)
        self.stats_path = out / f"stats-{engine}-{os.getpid()}.json"
        self.stats: dict[str, Any] = {"target": target, "engine": engine, "cases": 0, "parsed": 0, "refused": 0,
                                      "analysed": 0, "findings": 0, "cpu_s": 0.0, "wall_s": 0.0,
                                      "mutations": {}}
        self.cpu0, self.wall0 = time.process_time(), time.perf_counter()
        self.seen = {p.stem for p in self.findings.glob("*.bin")}

    def case(self, mutation: str, parsed: bool | None, analysed: bool) -> None:
        s = self.stats
        s["cases"] += 1
        if parsed is not None:
            s["parsed" if parsed else "refused"] += 1
        s["analysed"] += analysed
        s["mutations"][mutation] = s["mutations"].get(mutation, 0) + 1
        if s["cases"] % self.FLUSH == 0:
            self.flush()

    def finding(self, finding: Any) -> None:
        key = finding_key(finding.problem, finding.detail)
        if key in self.seen:
            return
        self.seen.add(key)
        self.stats["findings"] += 1
        (self.findings / f"{key}.bin").write_bytes(finding.data)
        (self.findings / f"{key}.txt").write_text(f"{finding.summary()}\n\n{finding.detail}")
        print(f"FINDING {key} {finding.summary()}", file=sys.stderr, flush=True)
        self.flush()

    def flush(self) -> None:
        self.stats["cpu_s"] = round(time.process_time() - self.cpu0, 2)
        self.stats["wall_s"] = round(time.perf_counter() - self.wall0, 2)
        tmp = self.stats_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.stats))
        os.replace(tmp, self.stats_path)


def finding_key(problem: str, detail: str) -> str:
    """The same bug found twice gets the same key: the exception type and the innermost frame of
    tracekit's code in the traceback (else the problem's text with its numbers removed)."""
    frames = [line.strip() for line in detail.splitlines() if line.strip().startswith('File "')]
    ours = [f for f in frames if "/tracekit/" in f or "/parsers/" in f or "/tui/" in f]
    where = ours[-1] if ours else (frames[-1] if frames else "")
    what = problem.split(":")[0]
    if not where:
        what = "".join(c for c in problem if not c.isdigit())[:120]
    where = where.split('"')[1].rsplit("/", 1)[-1] + where.split('"')[2].split(",")[1] if '"' in where else where
    return hashlib.sha1(f"{what}|{where}".encode()).hexdigest()[:12]


def scratch(out: Path) -> Path:
    """Where a child writes each case before parsing it: memory (/dev/shm) when there is one, else ``out``."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else out


def sampled(data: bytes, every: int) -> bool:
    """The deterministic 1-in-``every`` sample of cases that are analysed while fuzzing."""
    return every <= 1 or zlib.crc32(data) % every == 0


def child_atheris(a: argparse.Namespace) -> None:
    """One target under libFuzzer (this process never returns: libFuzzer exits)."""
    import atheris
    from atheris.import_hook import HookManager

    # atheris.instrument_imports() with its comparison (dataflow) tracing leaks ~1 MB per case here (the
    # compared operands -- numpy arrays, blocks -- are never released: 3 GB after 4 000 cases, with atheris
    # 2.3.0 and 3.0.0 alike); branch coverage alone does not, and the seeds' tokens go in as a dictionary.
    # HookManager is what instrument_imports() returns, with that one switch exposed (it instruments the
    # whole top-level package, as instrument_imports does).
    with HookManager({"tracekit"}, set(), True, trace_dataflow=False):
        import tracekit.parsers  # noqa: F401
        from tracekit.parsers import (  # noqa: F401
            horovod,
            json_stream,
            kineto,
            nccl,
            source,
            timestamps,
        )
    sys.path.insert(0, str(ROOT))
    from tests import fuzzing

    target = fuzzing.TARGETS[a.child]
    out = Path(a.out)
    rec = Recorder(out, target.name, "atheris")
    case_path = scratch(out) / f"tracekit-fuzz-{os.getpid()}.json"
    last_mutation = ["seed"]

    def one(data: bytes) -> None:
        mutation = last_mutation[0]  # "seed" until libFuzzer first calls the mutator
        _one_case(fuzzing, target, data, case_path, mutation, sampled(data, a.analyse_every), rec)

    seeds = target.corpus()

    def mutator(data: bytes, max_size: int, seed: int) -> bytes:
        # a third: the registry's structure-aware mutation of a seed (whole JSON documents, where wrong types,
        # huge numbers and nesting apply); a third: of this corpus entry; a third: libFuzzer's own mutators
        # (bit flips, inserts, the dictionary of the seeds' tokens, crossover) -- libFuzzer keeps whichever
        # result reaches new branches
        rng = random.Random(seed)
        r = rng.random()
        if r < 2 * a.structured / 3 or not data:
            base = rng.choice(seeds) if r < a.structured / 3 or not data else data
            try:
                what, out_data = fuzzing.mutate(base, rng, target.json_seeds)
            except Exception:  # a mutation that does not apply to this input: libFuzzer's instead
                what, out_data = "", b""
            if what and 0 < len(out_data) <= max_size:
                last_mutation[0] = what if base is data else f"seed-{what}"
                return out_data
        last_mutation[0] = "libfuzzer"
        return atheris.Mutate(data, max_size)

    argv = [sys.argv[0], str(out / "corpus"), str(out / "seeds"), f"-runs={a.runs}", f"-max_len={a.max_len}",
            f"-dict={out / 'tokens.dict'}",
            "-len_control=0", f"-timeout={a.timeout}", f"-rss_limit_mb={a.rss_limit_mb}",
            f"-artifact_prefix={out / 'artifacts'}/", f"-seed={a.seed}", "-print_final_stats=1",
            "-reduce_inputs=1"]
    atheris.Setup(argv, one, custom_mutator=mutator)
    try:
        atheris.Fuzz()
    finally:
        rec.flush()


def child_random(a: argparse.Namespace) -> None:
    """One target with the registry's mutations and no feedback, under coverage.py."""
    import coverage

    cov = coverage.Coverage(branch=True, source=[str(PARSERS_DIR)], data_file=None)
    cov.start()
    sys.path.insert(0, str(ROOT))
    from tests import fuzzing

    target = fuzzing.TARGETS[a.child]
    out = Path(a.out)
    rec = Recorder(out, target.name, "random")
    rng = random.Random(a.seed)
    cov.stop()  # finding the real files sniffs them with every parser: not the target's coverage
    corpus = target.corpus()
    cov.start()
    case_path = scratch(out) / f"tracekit-fuzz-{os.getpid()}.json"
    for seed in corpus:  # the seeds themselves first, like libFuzzer
        _one_case(fuzzing, target, seed, case_path, "seed", sampled(seed, a.analyse_every), rec)
    for _ in range(max(0, a.runs - len(corpus))):
        what, data = fuzzing.mutate(rng.choice(corpus), rng, target.json_seeds)
        _one_case(fuzzing, target, data, case_path, what, sampled(data, a.analyse_every), rec)
    cov.stop()
    rec.flush()
    _coverage_json(cov, Path(a.coverage_out))


def _one_case(fuzzing: Any, target: Any, data: bytes, path: Path, mutation: str, analyse: bool,
              rec: Recorder) -> None:
    outcome: dict[str, bool] = {}
    finding = fuzzing.check(target, data, path, mutation, analyse=analyse, outcome=outcome)
    if finding is not None:
        rec.finding(finding)
    rec.case(mutation, outcome.get("parsed"), analyse and bool(outcome.get("parsed")))


def child_replay(a: argparse.Namespace) -> None:
    """Every input under ``a.inputs`` checked with the whole analysis, under coverage.py."""
    import coverage

    cov = coverage.Coverage(branch=True, source=[str(PARSERS_DIR)], data_file=None)
    cov.start()
    sys.path.insert(0, str(ROOT))
    from tests import fuzzing

    target = fuzzing.TARGETS[a.child]
    out = Path(a.out)
    rec = Recorder(out, target.name, f"replay-{Path(a.coverage_out).stem}")
    case_path = scratch(out) / f"tracekit-fuzz-{os.getpid()}.json"
    files = sorted(p for d in a.inputs for p in Path(d).iterdir() if p.is_file())
    for p in files:
        _one_case(fuzzing, target, p.read_bytes(), case_path, "replay", True, rec)
    cov.stop()
    rec.flush()
    _coverage_json(cov, Path(a.coverage_out), inputs=len(files))


def _coverage_json(cov: Any, path: Path, **extra: Any) -> None:
    """Per parser module: statements, lines reached, branches, branches reached."""
    tmp = path.with_suffix(".cov.json")
    cov.json_report(outfile=str(tmp))
    report = json.loads(tmp.read_text())
    tmp.unlink()
    modules = {}
    for f, info in report["files"].items():
        s = info["summary"]
        # named by its path under parsers/: each format package has its own tables.py, records.py, ...
        file = Path(f).resolve()
        name = file.relative_to(PARSERS_DIR).as_posix() if file.is_relative_to(PARSERS_DIR) else file.name
        modules[name] = {"lines": s["num_statements"], "lines_hit": s["covered_lines"],
                         "branches": s.get("num_branches", 0), "branches_hit": s.get("covered_branches", 0)}
    path.write_text(json.dumps({"modules": modules, **extra}, indent=1))


def child_verify(a: argparse.Namespace) -> None:
    """Replay one input (a libFuzzer artifact) in a fresh process: prints a JSON verdict."""
    sys.path.insert(0, str(ROOT))
    from tests import fuzzing

    target = fuzzing.TARGETS[a.child]
    data = Path(a.inputs[0]).read_bytes()
    case = scratch(Path(a.out)) / f"tracekit-fuzz-verify-{os.getpid()}.json"
    try:
        finding = fuzzing.check(target, data, case, "artifact", analyse=True)
        verdict = {"finding": finding.summary() if finding else None, "detail": finding.detail if finding else ""}
    except BaseException as exc:  # reported: the parent decides
        verdict = {"finding": f"{type(exc).__name__}: {exc}", "detail": traceback.format_exc()}
    hwm = _peak_rss_mb()
    verdict["peak_rss_mb"] = hwm
    if not verdict["finding"] and hwm > a.rss_limit_mb:
        verdict["finding"] = f"[{target.name}] artifact: peak RSS {hwm:.0f} MB (limit {a.rss_limit_mb} MB)"
    print("VERDICT " + json.dumps(verdict), flush=True)


def _peak_rss_mb() -> float:
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM"))
    except (OSError, StopIteration):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --- the parent ---------------------------------------------------------------------------------------


def _child_cmd(mode: str, target: str, out: Path, a: argparse.Namespace, *extra: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), f"--{mode}", target, "--out", str(out),
            "--analyse-every", str(a.analyse_every), "--seed", str(a.seed), "--max-len", str(a.max_len),
            "--timeout", str(a.timeout), "--rss-limit-mb", str(a.rss_limit_mb), "--structured", str(a.structured),
            *extra]


def _stats(out: Path, engine: str) -> dict[str, Any]:
    total: dict[str, Any] = {"cases": 0, "parsed": 0, "refused": 0, "analysed": 0, "cpu_s": 0.0, "wall_s": 0.0,
                             "mutations": {}}
    for p in out.glob(f"stats-{engine}-*.json"):
        try:
            s = json.loads(p.read_text())
        except ValueError:
            continue
        for k in ("cases", "parsed", "refused", "analysed", "cpu_s", "wall_s"):
            total[k] += s.get(k, 0)
        for k, v in s.get("mutations", {}).items():
            total["mutations"][k] = total["mutations"].get(k, 0) + v
    return total


def _run_child(cmd: list[str], log: Path, out: Path) -> int:
    """Run a child process (its output to ``log``) and remove its scratch case file afterwards."""
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
        rc = proc.wait()
    _clean(proc.pid, out)
    return rc


def _clean(pid: int, out: Path) -> None:
    for name in (f"tracekit-fuzz-{pid}.json", f"tracekit-fuzz-verify-{pid}.json"):
        (scratch(out) / name).unlink(missing_ok=True)


def _write_seeds(target: Any, d: Path) -> int:
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    corpus = target.corpus()
    for data in corpus:
        (d / hashlib.sha1(data).hexdigest()).write_bytes(data)
    (d.parent / "tokens.dict").write_text("".join(f'"{_dict_escape(t)}"\n' for t in tokens(corpus)))
    return len(corpus)


def tokens(corpus: list[bytes], n: int = 300) -> list[bytes]:
    """libFuzzer's dictionary: the seeds' most common JSON strings (keys and values, quotes included) and
    words of text lines, so that byte-level mutations insert whole field names and keywords."""
    counts: dict[bytes, int] = {}
    for data in corpus:
        for t in set(re.findall(rb'"[^"\\\n]{1,40}"', data)) | set(re.findall(rb"[A-Za-z_#/:.-]{3,32}", data)):
            counts[t] = counts.get(t, 0) + 1
    return sorted(counts, key=lambda t: (-counts[t], t))[:n]


def _dict_escape(token: bytes) -> str:
    return "".join(chr(b) if 0x20 <= b < 0x7F and b not in (0x22, 0x5C) else f"\\x{b:02x}" for b in token)


def _verify(target: str, artifact: Path, out: Path, a: argparse.Namespace) -> dict[str, Any]:
    proc = subprocess.Popen(_child_cmd("verify", target, out, a, "--inputs", str(artifact)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=max(600, a.timeout * 2))
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
    _clean(proc.pid, out)
    r = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    line = next((x for x in r.stdout.splitlines() if x.startswith("VERDICT ")), None)
    if line is None:
        return {"finding": f"the replay died too (exit {r.returncode}): {r.stderr.strip()[-300:]}", "detail": r.stderr}
    return json.loads(line.removeprefix("VERDICT "))


def fuzz_target(name: str, a: argparse.Namespace, say: Any) -> dict[str, Any]:
    """Fuzz one target for ``a.cases`` cases (restarting its child after crashes), then measure coverage."""
    from tests import fuzzing

    target = fuzzing.TARGETS[name]
    out = Path(a.workdir) / name
    (out / "corpus").mkdir(parents=True, exist_ok=True)
    (out / "artifacts").mkdir(exist_ok=True)
    for p in out.glob("stats-*.json"):
        p.unlink()
    n_seeds = _write_seeds(target, out / "seeds")
    corpus_before = len(list((out / "corpus").iterdir()))
    say(f"{name}: {n_seeds} seeds, {corpus_before} kept from earlier runs, {a.cases} cases ({a.engine})")
    t0 = time.perf_counter()
    crashes: list[dict[str, Any]] = []
    engine = a.engine
    if engine == "random":
        rc = _run_child(_child_cmd("child-random", name, out, a, "--runs", str(a.cases), "--coverage-out",
                                   str(out / "coverage-random.json")), out / "random.log", out)
        if rc != 0:
            crashes.append({"exit": rc, "verdict": {"finding": f"random child exit {rc} (see random.log)"}})
    else:
        stalls = 0
        while True:
            done = _stats(out, "atheris")["cases"]
            left = a.cases - done
            if left <= 0 or stalls >= 3:
                break
            before = set((out / "artifacts").iterdir())
            log = open(out / f"libfuzzer-{len(crashes)}.log", "w")  # noqa: SIM115
            proc = subprocess.Popen(_child_cmd("child-atheris", name, out, a, "--runs", str(left)),
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            last = time.monotonic()
            while proc.poll() is None:
                time.sleep(5)
                if time.monotonic() - last >= a.report_every:
                    last = time.monotonic()
                    s = _stats(out, "atheris")
                    say(f"  {name}: {s['cases']} cases, corpus {len(list((out / 'corpus').iterdir()))}, "
                        f"findings {len(list((out / 'findings').glob('*.bin')))}, {s['cpu_s']:.0f} CPU-s")
            log.close()
            _clean(proc.pid, out)
            now = _stats(out, "atheris")["cases"]
            stalls = stalls + 1 if now - done < 10 else 0
            if proc.returncode == 0:
                continue
            new = sorted(set((out / "artifacts").iterdir()) - before)
            for art in new:
                verdict = _verify(name, art, out, a)
                crashes.append({"exit": proc.returncode, "artifact": str(art), "verdict": verdict})
                say(f"  {name}: child exit {proc.returncode}, {art.name}: "
                    + (verdict["finding"] or "passes when replayed alone (the machine's noise, not a finding)"))
                if verdict["finding"]:
                    key = finding_key(verdict["finding"], verdict.get("detail", ""))
                    shutil.copy(art, out / "findings" / f"{key}.bin")
                    (out / "findings" / f"{key}.txt").write_text(
                        f"[{name}] {art.name.split('-')[0]}: {verdict['finding']}\n\n{verdict.get('detail', '')}")
            if not new:
                crashes.append({"exit": proc.returncode, "verdict": {"finding": f"child exit {proc.returncode}"}})
                say(f"  {name}: child exit {proc.returncode} without an artifact (see {log.name})")
    fuzz_wall = time.perf_counter() - t0
    stats = _stats(out, engine)
    result: dict[str, Any] = {"target": name, "engine": engine, "seeds": n_seeds, "fuzz_wall_s": round(fuzz_wall),
                              **{k: stats[k] for k in ("cases", "analysed", "cpu_s", "mutations")},
                              "crashes": crashes}
    if engine == "random":
        try:
            result["coverage"] = json.loads((out / "coverage-random.json").read_text())["modules"]
        except (OSError, ValueError):  # the child failed before writing it: its exit is among the crashes
            result["coverage"] = {}
    else:
        result["corpus"] = len(list((out / "corpus").iterdir()))
        t1 = time.perf_counter()
        cov = {}
        for label, dirs in (("seeds", [out / "seeds"]), ("fuzzed", [out / "seeds", out / "corpus"])):
            if a.no_coverage and label == "seeds":
                continue
            cmd = _child_cmd("replay", name, out, a, "--coverage-out", str(out / f"coverage-{label}.json"),
                             "--inputs", *map(str, dirs))
            _run_child(cmd, out / f"replay-{label}.log", out)
            try:
                cov[label] = json.loads((out / f"coverage-{label}.json").read_text())["modules"]
            except (OSError, ValueError):
                cov[label] = {}
        result["coverage_seeds"] = cov.get("seeds", {})
        result["coverage"] = cov.get("fuzzed", {})
        result["replay_wall_s"] = round(time.perf_counter() - t1)
        result["replayed"] = _stats(out, "replay-coverage-fuzzed")["cases"]
    result["findings"] = sorted((out / "findings").glob("*.txt"))
    return result


def _pct(hit: int, total: int) -> str:
    return f"{hit}/{total} ({100 * hit / total:.0f} %)" if total else "-"


def report(results: list[dict[str, Any]], say: Any, now: dict[str, str] | None = None) -> int:
    """Print the run's figures; ``now``: finding -> what replaying it on the current code gives."""
    say("")
    for r in results:
        say(f"{r['target']} ({r['engine']}): {r['cases']} cases in {r['fuzz_wall_s']} s wall, {r['cpu_s']:.0f} CPU-s "
            f"({r['cases'] / max(r['cpu_s'], 1e-9):.1f} cases per CPU-s); {r['analysed']} analysed while fuzzing"
            + (f", corpus {r['corpus']} kept and replayed with the whole analysis in {r['replay_wall_s']} s"
               if "corpus" in r else "") + f"; {len(r['findings'])} distinct findings")
    say("")
    say("coverage of the parser modules (lines, branches reached; seeds alone -> after fuzzing)")
    for r in results:
        say(f"  {r['target']}:")
        seeds = r.get("coverage_seeds", {})
        for mod, c in sorted(r["coverage"].items()):
            if not c["lines_hit"]:
                continue
            s = seeds.get(mod)
            before = (f"{_pct(s['lines_hit'], s['lines'])} lines, {_pct(s['branches_hit'], s['branches'])} branches"
                      " -> ") if s else ""
            say(f"    {mod:<22} {before}{_pct(c['lines_hit'], c['lines'])} lines, "
                f"{_pct(c['branches_hit'], c['branches'])} branches")
    findings = [f for r in results for f in r["findings"]]
    say("")
    say(f"distinct findings: {len(findings)}")
    for i, f in enumerate(findings):
        status = f"; now: {now[str(f)]}" if now is not None else ""
        say(f"  {i + 1}. {f.read_text().splitlines()[0]}  ({f.with_suffix('.bin')}{status})")
    noise = [c for r in results for c in r["crashes"] if not c["verdict"].get("finding")]
    if noise:
        say(f"child restarts that did not reproduce alone (killed from outside, or a timeout of a paused or "
            f"starved process, or a finding fixed while the run went on): {len(noise)}")
    if now is not None:
        return 1 if any(v != "fixed" for v in now.values()) else 0
    return 1 if findings else 0


def recheck(path: Path, a: argparse.Namespace, say: Any) -> int:
    """The report of an earlier run (its ``--json``) again, every finding replayed on the code as it is now."""
    results = json.loads(path.read_text())
    now = {}
    for r in results:
        r["findings"] = [Path(f) for f in r["findings"]]
        for f in r["findings"]:
            verdict = _verify(r["target"], f.with_suffix(".bin"), f.parent.parent, a)
            now[str(f)] = "fixed" if not verdict["finding"] else f"still: {verdict['finding']}"
    return report(results, say, now)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=5000, help="cases per target (default 5000)")
    ap.add_argument("--target", action="append", help="only this registered target (repeatable)")
    ap.add_argument("--engine", choices=["atheris", "random"], help="default: atheris when installed")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workdir", default=str(ROOT / ".fuzz"), help="corpora, findings, logs (default .fuzz/)")
    ap.add_argument("--analyse-every", type=int, default=10, metavar="K",
                    help="analyse 1 in K parsed cases while fuzzing (every kept case is analysed afterwards)")
    ap.add_argument("--structured", type=float, default=0.67, help="share of the registry's structure-aware "
                    "mutations (half of a seed, half of a corpus entry) among libFuzzer's (default 0.67)")
    ap.add_argument("--max-len", type=int, default=128 << 10, help="largest input libFuzzer makes (bytes)")
    ap.add_argument("--timeout", type=int, default=600, help="libFuzzer's wall-clock limit per case (s)")
    ap.add_argument("--rss-limit-mb", type=int, default=3072)
    ap.add_argument("--report-every", type=float, default=300, help="seconds between progress lines")
    ap.add_argument("--no-coverage", action="store_true", help="skip the seeds-only coverage replay")
    ap.add_argument("--save", metavar="DIR", help="copy each finding's input here")
    ap.add_argument("--json", metavar="FILE", help="write the results as JSON")
    ap.add_argument("--recheck", metavar="FILE", help="print the report of a run's --json FILE again, every "
                    "finding replayed on the code as it is now (fixed, or still found)")
    # the child processes
    ap.add_argument("--child-atheris", dest="child_atheris", help=argparse.SUPPRESS)
    ap.add_argument("--child-random", dest="child_random", help=argparse.SUPPRESS)
    ap.add_argument("--replay", dest="replay", help=argparse.SUPPRESS)
    ap.add_argument("--verify", dest="verify", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--runs", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--coverage-out", help=argparse.SUPPRESS)
    ap.add_argument("--inputs", nargs="*", default=[], help=argparse.SUPPRESS)
    a = ap.parse_args()
    for mode, fn in (("child_atheris", child_atheris), ("child_random", child_random), ("replay", child_replay),
                     ("verify", child_verify)):
        if getattr(a, mode):
            a.child = getattr(a, mode)
            fn(a)
            return 0
    if a.engine is None:
        try:
            import atheris  # noqa: F401

            a.engine = "atheris"
        except ImportError:
            print("atheris is not installed (pip install -e '.[fuzz]'): using the unguided random engine")
            a.engine = "random"
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.path.insert(0, str(ROOT))
    if a.recheck:
        return recheck(Path(a.recheck), a, lambda line: print(line, flush=True))
    if importlib.util.find_spec("coverage") is None:  # both engines measure what they reached with coverage.py
        print("fuzz.py: coverage.py is not installed (pip install -e '.[fuzz]')", file=sys.stderr)
        return 2
    from tests import fuzzing

    targets = a.target or [t for t in DEFAULT_TARGETS if t in fuzzing.TARGETS] + \
        sorted(set(fuzzing.TARGETS) - set(DEFAULT_TARGETS))

    def say(line: str) -> None:
        print(line, flush=True)

    results = [fuzz_target(t, a, say) for t in targets]
    rc = report(results, say)
    if a.save:
        save = Path(a.save)
        save.mkdir(parents=True, exist_ok=True)
        for r in results:
            for f in r["findings"]:
                shutil.copy(f.with_suffix(".bin"), save / f"{r['target']}-{f.stem}.bin")
                shutil.copy(f, save / f"{r['target']}-{f.stem}.txt")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1, default=str))
    return rc


if __name__ == "__main__":
    sys.exit(main())
