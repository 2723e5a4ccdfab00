"""What the replays of a job analysed rank by rank hold on the client, and how it grows with the job (issue 36):
``tracekit whatif`` and ``tracekit critical-path`` on a built per-rank dataset of generated DDP GPU jobs of several
sizes, against another revision of this repository on the same datasets in the same run.

    python benchmarks/graph_memory.py --workdir DIR [--ranks 32,128] [--layers 200] [--steps 20]
                                      [--compare-rev REV] [--repeat 1] [--commands whatif,critical-path]
                                      [--engine local|dask]

``--commands inspect`` times ``tracekit inspect`` of the dataset instead (headless, from process start: the overview
painted, the critical path shown, the verdict shown), each revision in turn, ``--repeat`` times.

Each job is ``benchmarks/jobgen.py``'s DDP job (8 GPUs per host, every gradient all-reduce over all ranks, rank 5
30 % slower) with ``--layers`` layers and ``--steps`` steps: 200 x 20 gives ~17 500 activities and ~45 000 edges per
rank in its compact graph, the shape of a real GPU rank (every kernel its launch edge). The dataset is built first
(``summary --dataset``, then the ranks' graphs by a first ``critical-path``), so what is measured is the combine step
and the analysis on the client: wall, CPU and the peak RSS of the command's process tree
(``benchmarks/process_tree.py``). Both revisions must print the same answers (``--json`` compared).

Printed per job and per command and revision: wall, CPU and the peak of the command's process tree, of the command's
own process (the client: its high-water mark) and of its worker processes at once (those that hold the ranks' graphs
for the critical path, :mod:`tracekit.scale.rank_parts`); then how the peaks grow from the smallest job to the
largest against how the ranks grow. Targets (issue 36): 128 ranks x 20 MB with <= 1 GB on the client; 512 ranks
<= 1.2x the client memory of 128; inspect of the 128-rank job shows its verdict within 15 s of launch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import process_tree
from summary import OTHER_TREE, _other_tree

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from benchmarks import jobgen  # noqa: E402

LINK_BW = "10gbit"
COMMANDS = {"whatif": ["--link-bw", LINK_BW, "--bandwidth", "25gbit,100gbit"],
            "critical-path": []}
#: ``tracekit inspect DIR --dataset DS --link-bw 10gbit`` run headless (Textual's pilot) from process start: when the
#: overview is painted, the critical path shown and the verdict shown (``--commands inspect``); argv: the other tree's
#: site ("" for this tree), the job, the dataset, the engine
INSPECT = """
import time
T0 = time.perf_counter()
import asyncio, json, sys
if sys.argv[1]:
    sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    sys.path.insert(0, sys.argv[1])
from tracekit.tui.app import InspectApp
from tracekit.tui.data import LoadOptions
out = {}

async def main():
    app = InspectApp([sys.argv[2]], LoadOptions(dataset=sys.argv[3], by_rank=True, link_bw_bps=10e9,
                                                engine=sys.argv[4]))
    async with app.run_test(size=(160, 50)) as pilot:
        for phase, key in (("painted", "overview"), ("critical_path", "critical_path"), ("whatif", "verdict")):
            while phase not in app.phases and "failed" not in app.phases:
                await asyncio.sleep(0.01)
            out[key] = time.perf_counter() - T0
        out["failed"] = getattr(app, "error", None) if "failed" in app.phases else None
        out["headline"] = app.data.verdict.headline if app.data.verdict is not None else None
        await pilot.pause()

if __name__ == "__main__":
    asyncio.run(main())
    print(json.dumps(out))
"""


def _tracekit() -> list[str]:
    return [sys.executable, "-m", "tracekit.cli"]


def _job(workdir: Path, ranks: int, layers: int, steps: int) -> Path:
    """The generated job of ``ranks`` ranks (reused when the same one is there)."""
    d = workdir / f"ddp-{ranks}x{layers}x{steps}"
    spec = jobgen.JobSpec(ranks=ranks, gpus_per_host=8, layers=layers, steps=steps, stragglers=((5, 1.3),))
    if not (d / "truth.json").exists() or len(list(d.glob("*.pt.trace.json"))) != ranks:
        jobgen.write_job(d, spec, workers=os.cpu_count() or 1)
    return d


def _run(cmd: list[str], env: dict[str, str]) -> tuple[process_tree.Measured, str]:
    m = process_tree.run(cmd, env=env)
    if m.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:6])} ...: exit {m.returncode}: {m.stderr[-800:]}")
    return m, m.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", required=True, help="where the jobs and datasets go (kept for later runs)")
    ap.add_argument("--ranks", default="32,128", help="rank counts")
    ap.add_argument("--layers", type=int, default=200)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--compare-rev", metavar="REV", help="also run each command from this git revision")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--commands", default=",".join(COMMANDS), help="which commands to measure")
    ap.add_argument("--engine", default="local", choices=["local", "dask"],
                    help="where the ranks' graphs are held: local worker processes, or a Dask LocalCluster the "
                         "command starts (its workers are the command's child processes, measured as workers)")
    args = ap.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    process_tree.compile_bytecode(ROOT / "tracekit", ROOT / "parsers", ROOT / "tui")  # as an install's would start
    trees = {"this tree": _tracekit()}
    sites = {"this tree": ""}
    tmp = Path(tempfile.mkdtemp(prefix="graph-memory-", dir=work))
    if args.compare_rev:
        site = _other_tree(args.compare_rev, tmp / "rev")
        trees[args.compare_rev] = [sys.executable, "-c", OTHER_TREE, str(site)]
        sites[args.compare_rev] = str(site)
    print(f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    peaks: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for ranks in [int(x) for x in args.ranks.split(",")]:
        job = _job(work, ranks, args.layers, args.steps)
        ds = work / f"ds-{job.name}"
        size = sum(p.stat().st_size for p in job.glob("*.pt.trace.json")) / 1e9
        # the dataset and the ranks' graphs, built once (not measured)
        _run([*_tracekit(), "summary", str(job), "--dataset", str(ds), "--engine", "local", "--json"], env)
        _run([*_tracekit(), "critical-path", str(job), "--dataset", str(ds), "--engine", "local", "--json"], env)
        graphs = sum(1 for _ in (ds / "current").glob("rank=*/graph.act.parquet"))
        print(f"\n{ranks} ranks ({size:.1f} GB of JSON, {graphs} rank graphs)", flush=True)
        for cmd, extra in ((c, COMMANDS.get(c, [])) for c in args.commands.split(",")):
            if cmd == "inspect":
                _inspect(sites, job, ds, args.engine, args.repeat, env)
                continue
            outs = {}
            for name, exe in trees.items():
                runs = []
                for _ in range(args.repeat):
                    m, out = _run([*exe, cmd, str(job), "--dataset", str(ds), "--engine", args.engine, "--json",
                                   "--no-cache", *extra], env)
                    runs.append(m)
                    outs[name] = out
                best = min(runs, key=lambda r: r.peak_bytes)
                peaks.setdefault((cmd, name), []).append((ranks, best.peak_bytes / 1e6))
                client = min(r.client_peak_bytes for r in runs)
                peaks.setdefault((cmd + " (client)", name), []).append((ranks, client / 1e6))
                print(f"  {cmd:14s} {name:12s} wall {min(r.wall for r in runs):6.1f} s  CPU "
                      f"{min(r.cpu for r in runs):6.1f} s  peak {best.peak_bytes / 1e6:7.0f} MB  (client "
                      f"{client / 1e6:5.0f} MB, workers at once {best.workers_peak_bytes / 1e6:5.0f} MB)", flush=True)
            if len(outs) > 1:
                a, b = (json.loads(o) for o in outs.values())
                print(f"  {cmd:14s} answers of both revisions: {'identical' if a == b else 'DIFFERENT'}", flush=True)
    print("\ngrowth of the peak from the smallest job to the largest:")
    for (cmd, name), row in peaks.items():
        if len(row) > 1:
            (r0, p0), (r1, p1) = row[0], row[-1]
            print(f"  {cmd:23s} {name:12s} {r1 / r0:.0f}x the ranks: {p1 / p0:.2f}x the peak ({p0:.0f} -> {p1:.0f} MB)")


def _inspect(sites: dict[str, str], job: Path, ds: Path, engine: str, repeat: int, env: dict[str, str]) -> None:
    """:data:`INSPECT` of each tree, ``repeat`` times in turn: the median of each moment, and whether the verdicts
    agree."""
    import statistics

    got: dict[str, list[dict]] = {name: [] for name in sites}
    for _ in range(repeat):
        for name, site in sites.items():
            # (not under the process tree's memory sampler: every 10 ms it reads each process's memory, CPU this
            # 2-core machine's three processes would otherwise have)
            done = subprocess.run([sys.executable, "-c", INSPECT, site, str(job), str(ds), engine], env=env,
                                  capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise SystemExit(f"inspect of {name}: exit {done.returncode}: {done.stderr[-800:]}")
            got[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    for name, runs in got.items():
        failed = [r["failed"] for r in runs if r["failed"]]
        med = {k: statistics.median(r[k] for r in runs) for k in ("overview", "critical_path", "verdict")}
        each = ", ".join(f"{r['verdict']:.1f}" for r in runs)
        print(f"  inspect        {name:12s} overview {med['overview']:5.1f} s  critical path "
              f"{med['critical_path']:5.1f} s  verdict {med['verdict']:5.1f} s  (median of {len(runs)}; each: {each} s)"
              + (f"  FAILED: {failed[0]}" if failed else ""), flush=True)
    heads = {r["headline"] for runs in got.values() for r in runs}
    if len(sites) > 1:
        print(f"  inspect        verdicts of both revisions: {'identical' if len(heads) == 1 else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
