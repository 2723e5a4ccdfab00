"""Scale benchmark on consistent generated jobs of known truth (``benchmarks/jobgen.py``): the rank-by-rank mode's
summary, what-if and critical path on jobs bigger than this machine's memory, checked against what the generator
knows (who straggles, which link binds), and ``tracekit inspect`` opened on a built dataset of many ranks.

    python benchmarks/scale_jobs.py --workdir DIR [--cases big,many] [--jobs 2] [--keep]

Cases (issue 28):

``big``   256 ranks x 100 MB (25.6 GB of JSON): a DP x TP x PP mesh (TP groups of 4 inside hosts of 8 GPUs, 2
          pipeline stages, DP across 32 hosts on a 25 Gbit/s inter-node link), rank 77 computing 30 % slower.
          Targets: whatif and critical-path with the whole process tree's peak RSS <= 4 GB, in <= 1.3x the wall time
          of summary (rank by rank) measured in the same run; the straggler and the binding link they name are the
          generator's.
``many``  1 024 ranks x 10 MB: the same mesh shape (128 hosts), rank 777 slower. Targets: summary, whatif and
          critical-path each <= 3 min; inspect's first paint from the built dataset <= 5 s and going to rank 1 000
          <= 1 s.

Every command runs as the user runs it (``tracekit ... --engine local``, through ``benchmarks/process_tree.py``:
wall, CPU and the peak RSS of the whole tree, workers included), on a fresh dataset each (``--no-cache``; summary's
is kept, under ``--dataset``, for inspect). The traces are generated into ``DIR/CASE/job`` (kept for a later run with
``--keep``; removed otherwise, with the datasets). The machine's load average is printed beside the figures: on a
shared machine it is what they should be read with.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import textwrap
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import process_tree

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from benchmarks import jobgen  # noqa: E402

MESH = dict(gpus_per_host=8, tp=4, pp=2, microbatches=2, inter_bps=25e9, intra_bps=400e9, clock_skew_ns=2_000_000)
CASES = {
    "big": (jobgen.JobSpec(ranks=256, layers=16, steps=6, stragglers=((77, 1.3),), **MESH), 100.0),  # type: ignore
    "many": (jobgen.JobSpec(ranks=1024, layers=8, steps=5, stragglers=((777, 1.3),), **MESH), 10.0),  # type: ignore
    # a smoke test of this script (--cases tiny --goto 30)
    "tiny": (jobgen.JobSpec(ranks=32, layers=8, steps=4, stragglers=((13, 1.3),), **MESH), 1.0),  # type: ignore
}
LINK_BW = "inter=25gbit,intra=400gbit"
#: each link class made 4x faster on its own: the one that buys more is the binding link
SCENARIOS = "inter=100gbit,intra=1600gbit"

INSPECT = """
import time
T0 = time.perf_counter()
import asyncio, json, sys
from tracekit.tui.app import InspectApp
from tracekit.tui.data import LoadOptions
from tracekit.tui.timeline_view import TimelineView
out = {}

async def main():
    app = InspectApp([sys.argv[1]], LoadOptions(dataset=sys.argv[2], by_rank=None, jobs=1))
    async with app.run_test(size=(160, 50)) as pilot:
        while "painted" not in app.phases and "failed" not in app.phases:
            await asyncio.sleep(0.005)
        out["first_paint"] = time.perf_counter() - T0
        out["error"] = app.error
        while "whatif" not in app.phases and "failed" not in app.phases:  # loaded: the user scrolls
            await asyncio.sleep(0.02)
        out["loaded"] = time.perf_counter() - T0
        await pilot.press("3")
        await pilot.pause()
        view = app.query_one(TimelineView)
        canvas = view.canvas
        for y in range(canvas.size.height):  # the first screen's ranks drawn
            canvas.render_line(y)
        await pilot.press("g", *sys.argv[3])  # typed, then timed from enter: the rank's lanes and those below it
        t = time.perf_counter()                # read and drawn, and the screen refreshed
        await pilot.press("enter")
        while canvas.model.lanes[canvas.cursor_lane].rank != int(sys.argv[3]):
            await asyncio.sleep(0.001)
        for y in range(canvas.size.height):
            canvas.render_line(y)
        await pilot.pause()
        out["goto"] = time.perf_counter() - t
        out["ranks_read"] = len(canvas.model.source.loaded)
        out["ranks"] = len(canvas.model.source.ranks)

asyncio.run(main())
print(json.dumps(out))
"""


def generate(spec: jobgen.JobSpec, size_mb: float, d: Path, workers: int) -> dict:
    """Write the job (unless the same one is there) and return its truth; prints the generation speed."""
    want = jobgen.pad_for(spec, size_mb)
    truth_file = d / "truth.json"
    if truth_file.exists():
        old = json.loads(truth_file.read_text())
        if old["spec"] == json.loads(json.dumps(asdict(want))) and len(list(d.glob("*.pt.trace.json"))) == spec.ranks:
            print(f"  reusing {d} ({spec.ranks} ranks)", flush=True)
            return old
    shutil.rmtree(d, ignore_errors=True)
    t = time.perf_counter()
    jobgen.write_job(d, want, workers=workers)
    wall = time.perf_counter() - t
    size = sum(p.stat().st_size for p in d.glob("*.pt.trace.json"))
    print(f"  generated {spec.ranks} ranks, {size / 1e9:.1f} GB in {wall:.0f} s ({size / 1e6 / wall:.0f} MB/s with "
          f"{workers} processes)", flush=True)
    return json.loads(truth_file.read_text())


def tracekit(args: list[str], env: dict[str, str]) -> tuple[process_tree.Measured, dict | None]:
    m = process_tree.run([sys.executable, "-m", "tracekit.cli", *args], env=env)
    out = None
    if m.returncode == 0:
        try:
            out = json.loads(m.stdout)
        except ValueError:
            out = None
    return m, out


def binding_link(rows: list[dict]) -> str | None:
    """The link class whose 4x faster rate buys more (the whatif rows of :data:`SCENARIOS`)."""
    best = {r["links"].split("=")[0]: r["speedup"] for r in rows if r.get("links")}
    return max(best, key=best.__getitem__) if best else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", required=True, help="where the traces and datasets go (tens of GB)")
    ap.add_argument("--cases", default="big,many")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (generation, units)")
    ap.add_argument("--keep", action="store_true", help="keep the generated traces for a later run")
    ap.add_argument("--goto", type=int, default=1000, help="the rank inspect goes to (case many)")
    ap.add_argument("--inspect-only", action="store_true", help="measure inspect alone, on the dataset a run with "
                    "--keep left")
    args = ap.parse_args()
    process_tree.compile_bytecode(ROOT / "tracekit", ROOT / "parsers", ROOT / "tui")
    work = Path(args.workdir)
    tmp = work / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TMPDIR": str(tmp), "TRACEKIT_CACHE_DIR": str(work / "cache")}
    import psutil

    print(f"machine: {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB; jobs {args.jobs}; "
          f"python {sys.version.split()[0]}", flush=True)
    results = []
    try:
        for case in [c.strip() for c in args.cases.split(",") if c.strip()]:
            spec, size_mb = CASES[case]
            d = work / case / "job"
            print(f"\n{case}: {spec.ranks} ranks x {size_mb:g} MB", flush=True)
            truth = generate(spec, size_mb, d, args.jobs)
            size = sum(p.stat().st_size for p in d.glob("*.pt.trace.json"))
            common = [str(d), "--engine", "local", "-j", str(args.jobs), "--link-bw", LINK_BW, "--json", "-q"]
            ds_dir = work / case / "dataset"
            rows = {}
            commands = (("summary", ["--dataset", str(ds_dir), "--no-cache"]),
                        ("whatif", ["--no-cache", "--bandwidth", SCENARIOS]),
                        ("critical-path", ["--no-cache"]))
            if args.inspect_only and (ds_dir / "manifest.json").exists():
                commands = ()
            else:
                shutil.rmtree(ds_dir, ignore_errors=True)  # summary builds it anew
            for name, extra in commands:
                load = os.getloadavg()[0]
                m, out = tracekit([name, *common, *extra], env)
                rows[name] = (m, out, load)
                status = "ok" if m.returncode == 0 else f"FAILED ({m.stderr.strip().splitlines()[-1:]})"
                print(f"  {name:14} {m.wall:7.1f} s wall {m.cpu:7.1f} s CPU {m.peak_bytes / 2**30:5.2f} GiB peak  "
                      f"load {load:.1f}  {status}", flush=True)
            checks = {}
            summ = rows["summary"][1] or {} if rows else {}
            wi = rows["whatif"][1] or {} if rows else {}
            cp = rows["critical-path"][1] or {} if rows else {}
            stragglers = [s["rank"] for s in summ.get("stragglers", [])[:1]]
            waited = Counter(r["most_waited_on"] for r in cp.get("summary", []) if r.get("most_waited_on") is not None)
            checks["straggler (summary)"] = (stragglers[:1], truth["straggler_ranks"])
            answer = wi.get("answer") or {}
            checks["straggler (whatif's verdict)"] = ([s["rank"] for s in answer.get("stragglers", [])][:1],
                                                      truth["straggler_ranks"])
            # the straggler's slow work is on the path of most iterations (the path runs through it: in a pipeline
            # the rank the path *waits on* longest can be its stage partner, waiting on the straggler's sends)
            on_path = Counter(r for row in cp.get("summary", []) for r in row.get("ranks") or [])
            iters = len(cp.get("summary", []))
            checks["straggler on the critical path (most iterations)"] = (
                sorted(r for r in truth["straggler_ranks"] if on_path[r] * 2 > iters), truth["straggler_ranks"])
            print(f"  (most waited on, per iteration: {dict(waited.most_common(3))})", flush=True)
            checks["binding link (whatif)"] = (binding_link(wi.get("rows", [])), truth["binding_link"])
            checks["iteration (whatif, measured)"] = (wi.get("measured_iteration_ns"), truth["iteration_ns"])
            for k, (got, want) in checks.items():
                ok = got == want if not isinstance(got, int) else abs(got - want) <= 0.01 * want
                print(f"  check {k}: {got} (truth {want}) {'ok' if ok else 'MISMATCH'}", flush=True)
            inspect = None
            if case in ("many", "tiny"):
                m = process_tree.run([sys.executable, "-c", textwrap.dedent(INSPECT), str(d), str(ds_dir),
                                      str(args.goto)], env=env)
                inspect = json.loads(m.stdout.strip().splitlines()[-1]) if m.returncode == 0 else \
                    {"error": m.stderr.strip().splitlines()[-1:]}
                print(f"  inspect: {inspect}", flush=True)
            results.append((case, spec, size, rows, checks, inspect))
            if not args.keep:
                shutil.rmtree(ds_dir, ignore_errors=True)
        print("\n| case | command | wall s | CPU s | peak RSS (tree) | vs summary | load |")
        print("|---|---|---:|---:|---:|---:|---:|")
        for _case, spec, size, rows, _, inspect in results:
            base = rows["summary"][0].wall if rows else float("nan")
            for name, (m, _, load) in rows.items():
                print(f"| {spec.ranks} x {size / spec.ranks / 1e6:.0f} MB ({size / 1e9:.1f} GB) | {name} | "
                      f"{m.wall:.1f} | {m.cpu:.1f} | {m.peak_bytes / 2**30:.2f} GiB | {m.wall / base:.2f}x | "
                      f"{load:.1f} |")
            if inspect:
                print(f"| {spec.ranks} x {size / spec.ranks / 1e6:.0f} MB | inspect: first paint (built dataset) | "
                      f"{inspect.get('first_paint', float('nan')):.2f} | | | | |")
                print(f"| {spec.ranks} x {size / spec.ranks / 1e6:.0f} MB | inspect: g {args.goto} (read, drawn) | "
                      f"{inspect.get('goto', float('nan')):.2f} | | | | |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(work / "cache", ignore_errors=True)
        if not args.keep:
            for case in CASES:
                shutil.rmtree(work / case, ignore_errors=True)


if __name__ == "__main__":
    main()
