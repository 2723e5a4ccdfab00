"""Whole-command benchmark: what a user waits for, ``tracekit summary FILE --no-cache --json``, against HTA's
temporal breakdown of the same file, in one run.

    python benchmarks/summary.py [--size-mb 300] [--ranks 8] [--repeat 3] [--hta-python /tmp/hta-venv/bin/python]
                                 [--skip-hta] [--hta-repeat 1] [--compare-rev REV] [--workdir DIR] [--startup-runs 10]
                                 [--trace FILE]

Every measurement runs as a child process (``benchmarks/process_tree.py``): wall, the CPU time of its process tree
and the tree's peak RSS (the command's own high-water mark or the most the tree held at once, whichever is larger).
Both trees run from their bytecode cache, as an installed tracekit does. Traces are generated PyTorch-2.4-style GPU
traces (``benchmarks/synthetic.py``, 8-rank job metadata); the N-rank job is N distinct files (one per rank,
different seeds), parsed from the page cache (``--no-cache`` skips tracekit's parse cache, not the OS's); ``--trace``
measures a given (real) trace in their place.

Measured:
  1. ``tracekit summary FILE --no-cache --json``, 1 file: wall, CPU, peak RSS (``--repeat`` runs);
     ``--compare-rev REV`` runs the same command from another git revision of this repository too;
  2. HTA: ``TraceAnalysis(trace_dir=...).get_temporal_breakdown()`` on the same file, in the interpreter of
     ``--hta-python`` (HTA pins its own pandas: keep it in a separate venv); ``--skip-hta`` leaves it out;
  3. where tracekit's time goes, in one process: imports, parse (one process), analysis, and the graph +
     replay behind the verdict (what-if, reported separately);
  4. the parser alone: MB per CPU-second in one process (with and without the C extension), and wall with
     ``--jobs`` (scanner threads, or the file split across processes: as ``kineto.parse`` chooses);
  5. ``tracekit summary DIR --no-cache --json`` of ``--ranks`` ranks x ``--size-mb``;
  6. start-up: ``tracekit --help`` and ``tracekit summary samples/ddp-gloo`` (warm parse cache),
     ``--startup-runs`` runs each.

Targets (issues 13 and 40): 1 x 300 MB cold summary, its verdict included, >= 25x HTA's temporal breakdown, peak RSS
<= 2.0x the JSON (aim: 1.5x), parse >= 200 MB/s per core; 8 x 300 MB cold summary <= 20 s on 2 cores; --help <= 0.3 s;
sample summary <= 1 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import process_tree
import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

HTA = """
import json, logging, sys, time
logging.disable(logging.WARNING)
t = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
analyzer = TraceAnalysis(trace_dir=sys.argv[1])
t_load = time.perf_counter()
df = analyzer.get_temporal_breakdown(visualize=False)
print(json.dumps({"load_s": t_load - t, "breakdown_s": time.perf_counter() - t_load, "rows": len(df)}))
"""

STAGES = """
import json, os, resource, sys, time
t0 = time.perf_counter(); c0 = time.process_time()
laps = {}
def lap(name):
    global t0, c0
    t, c = time.perf_counter(), time.process_time()
    laps[name] = {"wall": t - t0, "cpu": c - c0}
    t0, c0 = t, c
from tracekit.analysis import pipeline as analysis
from tracekit.loading import traceset
from tracekit.views import summary
import tracekit.parsers.kineto
lap("imports")
ts = traceset.load(sys.argv[1:], use_cache=False, jobs=1)
lap("parse (one process)")
result = analysis.analyse(ts)
lap("analysis")
result.bottleneck
lap("graph + replay (bottleneck)")
result.verdict
lap("the rest of the verdict")
summary.job(result.breakdown)
lap("summary tables")
print(json.dumps({"laps": laps, "events": result.events.num_rows}))
"""

PARSE = """
import json, resource, sys, time
from tracekit.parsers import kineto
def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime
def main():
    t, c, k = time.perf_counter(), time.process_time(), children_cpu()
    workers = int(sys.argv[2])
    parsed = kineto.parse(sys.argv[1], workers=workers)
    print(json.dumps({"parse_wall": time.perf_counter() - t,
                      "parse_cpu": time.process_time() - c + children_cpu() - k, "events": parsed.events.num_rows,
                      "native": kineto.native_scan() is not None, "threaded": kineto.scanner_threads(workers) > 0}))
if __name__ == "__main__":
    main()
"""

#: run tracekit's CLI from another source tree (``--compare-rev``): the editable install's finder is removed
#: so that the tree on sys.path[0] is the one imported
OTHER_TREE = """
import sys
sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path.insert(0, sys.argv.pop(1))
from tracekit import cli
if hasattr(cli, "run"):  # the console command of that revision, as its users run it (it exits)
    cli.run()
else:
    sys.exit(cli.main(sys.argv[1:]))
"""


def measure(cmd: list[str], *, cwd: Path | None = None, env: dict | None = None) -> dict:
    """Run ``cmd`` (:func:`process_tree.run`); wall, CPU and peak RSS (MB) of its tree, and its stdout."""
    m = process_tree.run(cmd, cwd=cwd, env=env)
    if m.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ...: exit {m.returncode}: {m.stderr[-1500:]}")
    return {"wall": m.wall, "cpu": m.cpu, "peak_mb": m.peak_bytes / 1e6, "stdout": m.stdout}


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def _tracekit() -> list[str]:
    exe = Path(sys.executable).with_name("tracekit")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "tracekit.cli"]


def _other_tree(rev: str, into: Path) -> Path:
    """An importable copy of this repository at ``rev`` (packages laid out as installed)."""
    src = into / "src"
    src.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    site = into / "site"
    shutil.copytree(src / "tracekit", site / "tracekit")
    shutil.copytree(src / "parsers", site / "tracekit" / "parsers")
    shutil.copytree(src / "tui", site / "tracekit" / "tui")
    if (src / "setup.py").exists():  # its C extension, built as its install would build it
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(site)], cwd=src,
                       check=True, capture_output=True)
    process_tree.compile_bytecode(site / "tracekit")
    return site


def _stats(runs: list[dict], key: str) -> str:
    v = sorted(r[key] for r in runs)
    if len(v) == 1:
        return f"{v[0]:.2f}"
    return f"{v[0]:.2f} (median {statistics.median(v):.2f}, max {v[-1]:.2f})"


def _rate(mb: float, s: float) -> str:
    return f"{mb / s:.0f} MB/s" if s > 0 else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=float, default=300, help="JSON size of each rank's trace")
    ap.add_argument("--ranks", type=int, default=8, help="ranks of the multi-rank job (0: skip it)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each tracekit command")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes for tracekit (--jobs)")
    ap.add_argument("--hta-python", default="/tmp/hta-venv/bin/python",
                    help="interpreter with HolisticTraceAnalysis installed (import hta)")
    ap.add_argument("--skip-hta", action="store_true", help="do not run HTA")
    ap.add_argument("--hta-repeat", type=int, default=1,
                    help="runs of HTA (its time moves with the VM's load as much as tracekit's: one run is one sample)")
    ap.add_argument("--compare-rev", metavar="REV", help="also run `tracekit summary` from this git revision")
    ap.add_argument("--startup-runs", type=int, default=10, help="runs of each start-up command (0: skip)")
    ap.add_argument("--workdir", help="keep generated traces here (default: a temporary directory, removed)")
    ap.add_argument("--trace", metavar="FILE", help="measure this trace (a real one) instead of a generated one: "
                    "linked into a folder of its own under the workdir for HTA")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    from synthetic import write_trace

    work = Path(args.workdir or tempfile.mkdtemp(prefix="tracekit-summary-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="tracekit-summary-bench-tmp-"))
    mb = int(args.size_mb)
    one_dir = work / (f"one_{mb}mb" if not args.trace else "given")
    one_dir.mkdir(exist_ok=True)
    one = one_dir / ("rank0.json" if not args.trace else Path(args.trace).name)
    if args.trace and not one.exists():
        one.symlink_to(Path(args.trace).resolve())
    try:
        if not one.exists():
            print(f"generating one {args.size_mb:.0f} MB trace ...", flush=True)
            write_trace(one, args.size_mb, rank=0, world=8)
        size_mb = one.stat().st_size / 1e6
        print(f"machine: {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB, load average "
              f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}; python {sys.version.split()[0]}; tracekit --jobs "
              f"{args.jobs}; trace {one} ({size_mb:.0f} MB)")
        process_tree.compile_bytecode(ROOT / "tracekit", ROOT / "parsers", ROOT / "tui")
        summary_cmd = [*_tracekit(), "summary", str(one), "--no-cache", "--json", "--jobs", str(args.jobs)]
        rows: list[tuple[str, list[dict]]] = []

        # 1. the whole command, this tree (and another revision, interleaved run by run)
        other = _other_tree(args.compare_rev, tmp / "rev") if args.compare_rev else None
        mine: list[dict] = []
        theirs: list[dict] = []
        for _ in range(args.repeat):
            mine.append(measure(summary_cmd))
            if other is not None:
                theirs.append(measure([*_py(OTHER_TREE), str(other), *summary_cmd[1:]]))
        rows.append(("tracekit summary (this tree)", mine))
        if other is not None:
            rows.append((f"tracekit summary ({args.compare_rev})", theirs))
            same = json.loads(mine[0]["stdout"]) == json.loads(theirs[0]["stdout"])
            print(f"summary --json output of this tree and {args.compare_rev}: {'identical' if same else 'DIFFERENT'}")

        # 2. HTA
        hta = None
        if not args.skip_hta:
            try:
                hta_runs = []
                for _ in range(args.hta_repeat):
                    run = measure([args.hta_python, "-c", textwrap.dedent(HTA), str(one_dir)])
                    run.update(json.loads(run["stdout"].strip().splitlines()[-1]))
                    hta_runs.append(run)
                rows.append(("HTA get_temporal_breakdown", hta_runs))
                hta = {k: statistics.median(r[k] for r in hta_runs) for k in ("wall", "cpu", "load_s", "breakdown_s")}
            except (RuntimeError, FileNotFoundError) as exc:
                print(f"HTA: not measured ({str(exc).strip().splitlines()[-1] if str(exc).strip() else exc})")

        print()
        print(f"{'1 file, ' + f'{size_mb:.0f} MB, cold':38} {'wall s':>36} {'CPU s (tree)':>36} "
              f"{'peak RSS MB (tree)':>36}")
        for name, runs in rows:
            print(f"{name:38} {_stats(runs, 'wall'):>36} {_stats(runs, 'cpu'):>36} {_stats(runs, 'peak_mb'):>36}")
        best = min(r["wall"] for r in mine)
        med = statistics.median(r["wall"] for r in mine)
        peak = statistics.median(r["peak_mb"] for r in mine)
        if hta is not None:
            print(f"HTA / tracekit (wall): {hta['wall'] / med:.1f}x median, {hta['wall'] / best:.1f}x best "
                  f"(target >= 25x; HTA's median of {args.hta_repeat}); HTA: read {hta['load_s']:.1f} s, breakdown "
                  f"{hta['breakdown_s']:.1f} s")
            print(f"HTA / tracekit (CPU):  {hta['cpu'] / statistics.median(r['cpu'] for r in mine):.1f}x median")
        if theirs:
            cpu_ratio = statistics.median(r["cpu"] for r in theirs) / statistics.median(r["cpu"] for r in mine)
            print(f"{args.compare_rev} / this tree (wall): {statistics.median(r['wall'] for r in theirs) / med:.2f}x "
                  f"median; (CPU): {cpu_ratio:.2f}x; peak RSS "
                  f"{statistics.median(r['peak_mb'] for r in theirs):.0f} -> {peak:.0f} MB")
        print(f"peak RSS / JSON: {peak / size_mb:.2f}x median (target <= 2.0x, aim 1.5x)")

        # 3. where the time goes (one process, no split: the parts add up)
        st = measure([*_py(STAGES), str(one)])
        laps = json.loads(st["stdout"].strip().splitlines()[-1])["laps"]
        print()
        print("one process, stage by stage:   " + "; ".join(f"{k} {v['wall']:.2f} s wall / {v['cpu']:.2f} s CPU"
                                                           for k, v in laps.items()))
        print(f"  (graph, replays and paths belong to the verdict; peak RSS of that process {st['peak_mb']:.0f} MB)")

        # 4. the parser alone
        def parse_runs(workers: int, env: dict | None = None) -> list[dict]:
            runs = [measure([*_py(PARSE), str(one), str(workers)], env=env) for _ in range(args.repeat)]
            for r in runs:
                r.update(json.loads(r["stdout"].strip().splitlines()[-1]))
            return runs

        # the C batch scanner where it is built (the default), and the msgspec path it replaces
        p1, pn = parse_runs(1), parse_runs(args.jobs)
        p0 = parse_runs(1, {**os.environ, "TRACEKIT_NO_EXTENSION": "1"})
        how = "C scanner" if p1[0]["native"] else "msgspec (the C extension is not built)"
        print(f"parser (kineto.parse alone, imports excluded), one process, {how}: wall {_stats(p1, 'parse_wall')} s, "
              f"CPU {_stats(p1, 'parse_cpu')} s = {size_mb / min(r['parse_cpu'] for r in p1):.0f} MB per "
              f"CPU-second at best (target >= 200 per core)")
        print(f"  the same without the C extension: wall {_stats(p0, 'parse_wall')} s, CPU {_stats(p0, 'parse_cpu')} s"
              f" = {size_mb / min(r['parse_cpu'] for r in p0):.0f} MB per CPU-second at best")
        split = f"one process, {args.jobs - 1} scanner thread(s)" if pn[0]["threaded"] else \
            f"split over {args.jobs} processes"
        print(f"parser with --jobs {args.jobs} ({split}): wall {_stats(pn, 'parse_wall')} s, CPU (all processes) "
              f"{_stats(pn, 'parse_cpu')} s = {size_mb / min(r['parse_cpu'] for r in pn):.0f} MB per CPU-second, "
              f"{_rate(size_mb, min(r['parse_wall'] for r in pn))} wall at best")

        # 5. N ranks
        if args.ranks > 1:
            many = work / f"ranks{args.ranks}_{mb}mb"
            many.mkdir(exist_ok=True)
            for r in range(args.ranks):
                f = many / f"rank{r}.json"
                if not f.exists():
                    if r == 0:
                        os.link(one, f)
                    else:
                        print(f"generating rank {r} ...", flush=True)
                        write_trace(f, args.size_mb, rank=r, world=args.ranks, seed=r)
            total_mb = sum(f.stat().st_size for f in many.iterdir()) / 1e6
            runs = [measure([*_tracekit(), "summary", str(many), "--no-cache", "--json", "--jobs", str(args.jobs)])
                    for _ in range(max(1, args.repeat - 1))]
            print()
            print(f"{args.ranks} ranks x {args.size_mb:.0f} MB ({total_mb:.0f} MB), cold: wall "
                  f"{_stats(runs, 'wall')} s (target <= 20 s), CPU {_stats(runs, 'cpu')} s, peak RSS "
                  f"{_stats(runs, 'peak_mb')} MB; "
                  f"{_rate(total_mb, min(r['wall'] for r in runs))} at best")

        # 6. start-up
        if args.startup_runs:
            help_runs = [measure([*_tracekit(), "--help"]) for _ in range(args.startup_runs)]
            sample = [*_tracekit(), "summary", str(ROOT / "samples" / "ddp-gloo")]
            measure(sample)  # warms the parse cache
            sample_runs = [measure(sample) for _ in range(args.startup_runs)]
            print()
            print(f"tracekit --help:                  wall {_stats(help_runs, 'wall')} s, CPU "
                  f"{_stats(help_runs, 'cpu')} s (target <= 0.3 s)")
            print(f"tracekit summary samples/ddp-gloo: wall {_stats(sample_runs, 'wall')} s, CPU "
                  f"{_stats(sample_runs, 'cpu')} s (target <= 1 s; parse cache warm)")
        print(f"\nload average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())} (the machine is shared: "
              "wall times vary with what else runs; CPU times less)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
