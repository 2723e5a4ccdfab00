"""Scale benchmark: peak memory and throughput of ``tracekit summary`` for 1, 8 and 64 ranks and for one
huge file, against the plain in-memory path (every rank's events in one process) in the same run.

    python benchmarks/scale.py [--rank-mb 100] [--ranks 1,8,64] [--big-mb 4000] [--jobs 2]
                               [--engine local|dask] [--baseline-cap-gb 12] [--workdir /tmp/x]

Each measurement runs in a child process (``benchmarks/process_tree.py``): the peak RSS of its whole process
tree (the command and its worker processes) and the tree's CPU time; tracekit runs from its bytecode cache, as
an installed tracekit does. Ranks are one generated PyTorch-2.4-style GPU trace of ``--rank-mb``
MB hard-linked as ``rank-N.json`` (ranks from the file names; no disk space per rank, and the page cache
holds the bytes once, so this measures parsing and analysis, not the disk). The huge file is one generated
trace of ``--big-mb`` MB. The baseline is killed when its tree passes ``--baseline-cap-gb``.

Targets (issue 7): one 4 GB file in <= 1 GB peak RSS; 64 ranks x 300 MB complete on a 24 GB machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import textwrap
from pathlib import Path

import process_tree
import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

BASELINE = """
import json, sys, time
from tracekit.views import summary
from tracekit.loading import traceset
from tracekit.analysis.pipeline import analyse
t = time.perf_counter()
result = analyse(traceset.load(sys.argv[1:-1], use_cache=False, jobs=int(sys.argv[-1])))
job = summary.job(result.breakdown)
print(json.dumps({"wall": time.perf_counter() - t, "events": result.events.num_rows, "ranks": job["ranks"],
                  "windows": result.breakdown.num_rows}))
"""

DATASET = """
import json, sys, time
from tracekit.scale import dataset, engine
from tracekit.views import summary
from tracekit.scale.analyse import analyse_dataset
paths, jobs, eng_name, budget = sys.argv[1:-3], int(sys.argv[-3]), sys.argv[-2], sys.argv[-1]
t = time.perf_counter()
eng = engine.make(eng_name, jobs=jobs, total_bytes=10**12)
ds = dataset.build(paths, engine=eng, use_cache=False, budget=budget)
result = analyse_dataset(ds)
job = summary.job(result.breakdown)
wall = time.perf_counter() - t
units = ds.summaries
print(json.dumps({"wall": wall, "events": ds.manifest["events"], "ranks": job["ranks"],
                  "windows": result.breakdown.num_rows, "spilled": sum(u["spilled"] for u in units),
                  "unit_peak_mb": max(u["peak_rss_mb"] for u in units)}))
ds.cleanup()
"""


def measure(code: str, args: list[str], cap_bytes: int | None = None) -> dict:
    """Run ``code`` in a child (:func:`process_tree.run`); its JSON line plus the tree's peak RSS (MiB) and CPU
    seconds."""
    m = process_tree.run([sys.executable, "-c", textwrap.dedent(code), *args], cap_bytes=cap_bytes)
    peak_mb = m.peak_bytes / 2**20
    if m.capped:
        return {"failed": f"killed at {cap_bytes / 2**30:g} GiB of RSS", "peak_mb": peak_mb, "cpu": m.cpu}
    if m.returncode != 0:
        return {"failed": (m.stderr.strip().splitlines() or ["?"])[-1][:200], "peak_mb": peak_mb, "cpu": m.cpu}
    r = json.loads(m.stdout.strip().splitlines()[-1])
    r.update(peak_mb=peak_mb, cpu=m.cpu)
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rank-mb", type=float, default=100, help="JSON size of each rank's trace")
    ap.add_argument("--ranks", default="1,8,64", help="rank counts to measure")
    ap.add_argument("--big-mb", type=float, default=4000, help="size of the single huge file (0: skip)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    ap.add_argument("--engine", choices=("local", "dask"), default="local")
    ap.add_argument("--budget", default="1G", help="memory budget per unit (tracekit --memory-budget)")
    ap.add_argument("--baseline-cap-gb", type=float, default=12, help="kill the baseline beyond this RSS")
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--workdir", help="where generated traces go (default: a temporary directory, removed)")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    from synthetic import write_trace

    process_tree.compile_bytecode(ROOT / "tracekit", ROOT / "parsers", ROOT / "tui")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="tracekit-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    cap = int(args.baseline_cap_gb * 2**30)
    print(f"machine: {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB; jobs {args.jobs}; "
          f"engine {args.engine}; memory budget per unit {args.budget}; python {sys.version.split()[0]}")
    rows = []
    try:
        base = work / f"base_{int(args.rank_mb)}mb.json"
        if not base.exists() and args.ranks.strip():
            print(f"generating one {args.rank_mb:.0f} MB rank trace ...", flush=True)
            write_trace(base, args.rank_mb, rank=None)
        for n in [int(x) for x in args.ranks.split(",") if x.strip()]:
            d = work / f"ranks{n}_{int(args.rank_mb)}mb"
            d.mkdir(exist_ok=True)
            for r in range(n):
                link = d / f"rank-{r}.json"
                if not link.exists():
                    os.link(base, link)
            files = [str(d / f"rank-{r}.json") for r in range(n)]
            rows.append((f"{n} ranks x {args.rank_mb:.0f} MB", n * os.path.getsize(base), files))
        if args.big_mb:
            big = work / f"big_{int(args.big_mb)}mb.json"
            if not big.exists():
                print(f"generating one {args.big_mb:.0f} MB trace ...", flush=True)
                write_trace(big, args.big_mb, rank=0)
            rows.append((f"1 file of {os.path.getsize(big) / 1e9:.1f} GB", os.path.getsize(big), [str(big)]))
        print()
        head = (f"{'input':26} {'path':10} {'wall s':>8} {'CPU s':>8} {'MB/s':>7} {'MB/CPU-s':>9} "
                f"{'peak RSS MB':>12} {'RSS vs mem':>12}  notes")
        print(head)
        print("-" * len(head))
        for name, size, files in rows:
            mb = size / 1e6
            ds = measure(DATASET, [*files, str(args.jobs), args.engine, args.budget])
            bl = None if args.skip_baseline else measure(BASELINE, [*files, str(args.jobs)], cap)
            for label, r in (("tracekit", ds), ("in-memory", bl)):
                if r is None:
                    continue
                if "failed" in r:
                    print(f"{name:26} {label:10} {'-':>8} {r['cpu']:>8.1f} {'-':>7} {'-':>9} {r['peak_mb']:>12.0f} "
                          f"{'':>12}  FAILED: {r['failed']}", flush=True)
                    continue
                ratio = ""
                if label == "tracekit" and bl is not None and "failed" not in bl:
                    ratio = f"{r['peak_mb'] / bl['peak_mb']:.2f}x"
                notes = f"{r['events']} events, {r['windows']} windows"
                if label == "tracekit":
                    notes += f"; {r['spilled']} files read in bounded memory; largest unit {r['unit_peak_mb']:.0f} MB"
                print(f"{name:26} {label:10} {r['wall']:>8.1f} {r['cpu']:>8.1f} {mb / r['wall']:>7.0f} "
                      f"{mb / max(r['cpu'], 1e-9):>9.0f} {r['peak_mb']:>12.0f} {ratio:>12}  {notes}", flush=True)
        print("\npeak RSS: the whole process tree (command + worker processes); "
              "RSS vs mem: tracekit's peak / the in-memory path's; MB = 10^6 bytes of JSON")
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
