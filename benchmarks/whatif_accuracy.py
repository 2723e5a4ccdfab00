"""What-if accuracy against reality: record the same 2-rank gloo DDP job across a ``tc``-shaped link at
several line rates, then predict each rate's iteration time from the trace recorded at another rate.

    sudo python benchmarks/whatif_accuracy.py [--rates 100mbit,200mbit,500mbit,1gbit] [--repeats 2]
        [--source 500mbit] [--out DIR | --reuse DIR]

Recordings use ``samples/record_ddp.py --link-rate`` (two network namespaces joined by a veth pair,
both directions shaped with ``tbf``; root and iproute2 needed). Rates are recorded round-robin over the
repeats, so background load spreads over all of them. The truth is each job's own clock: the median
wall time of its profiled steps (``run.json``). The prediction is tracekit's replay of the source trace
with the link's measured efficiency, at the target line rate (``--efficiency measured``).

Target (issue 5): median error <= 10 %, worst <= 20 %, from one source rate to the others.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def record(out: Path, rate: str, steps: int, extra: list[str]) -> None:
    cmd = [sys.executable, str(ROOT / "samples" / "record_ddp.py"), "--out", str(out), "--link-rate", rate,
           "--steps", str(steps), "--force", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"recording at {rate} failed: {proc.stderr.strip().splitlines()[-1:]}")


def measured_ns(run_dir: Path) -> float:
    run = json.loads((run_dir / "run.json").read_text())
    walls = [s["wall_s"] for r in run["step_times"]["ranks"].values() for s in r["steps"] if s["phase"] == "active"]
    return statistics.median(walls) * 1e9


def model(run_dir: Path, rate_bps: float):
    from tracekit import traceset, whatif
    from tracekit.analysis import analyse

    res = analyse(traceset.load([str(run_dir)], use_cache=False), link_bw_bps=rate_bps)
    return whatif.build(res.events, res.collectives, res.ranks, res.members, res.instances,
                        line_rate_bps=rate_bps)


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from tracekit import whatif
    from tracekit.units import parse_rate

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="100mbit,200mbit,500mbit,1gbit")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5, help="profiled steps per recording")
    ap.add_argument("--source", help="the rate to predict from (default: every rate in turn)")
    ap.add_argument("--out", help="keep the recordings here")
    ap.add_argument("--reuse", help="use recordings made earlier by this script (a DIR given to --out)")
    ap.add_argument("record_args", nargs="*", help="extra arguments for samples/record_ddp.py (after --)")
    args = ap.parse_args()
    rates = [r.strip() for r in args.rates.split(",") if r.strip()]
    bps = {r: parse_rate(r, option="--rates") for r in rates}
    base = Path(args.reuse or args.out or tempfile.mkdtemp(prefix="tracekit-whatif-"))
    if not args.reuse:
        for k in range(args.repeats):
            for r in rates:
                print(f"recording {r} (repeat {k + 1}/{args.repeats}) ...", flush=True)
                record(base / f"{r}-{k}", r, args.steps, args.record_args)
    runs = {r: sorted(p for p in base.glob(f"{r}-*") if (p / "run.json").exists()) for r in rates}
    truth = {r: statistics.median(measured_ns(p) for p in runs[r]) for r in rates}
    print(f"\nrecordings in {base}")
    print("measured iteration (median of profiled steps, median over repeats):")
    for r in rates:
        print(f"  {r:>9}: {truth[r] / 1e6:8.1f} ms  ({len(runs[r])} recordings)")
    sources = [args.source] if args.source else rates
    errors: dict[str, list[float]] = {}
    print("\nprediction error (predicted / measured - 1), from each recording of the source rate:")
    print(f"{'source':>9} -> " + " ".join(f"{t:>9}" for t in rates))
    for s in sources:
        errs: list[float] = []
        for p in runs[s]:
            m = model(p, bps[s])
            row = []
            for t in rates:
                pred = whatif.predict(m, whatif.Scenario(bandwidth_bps=bps[t]))
                e = pred / truth[t] - 1
                row.append(f"{100 * e:+8.1f}%")
                if t != s:
                    errs.append(e)
            print(f"{s:>9} -> " + " ".join(row))
        errors[s] = errs
    print()
    for s, errs in errors.items():
        a = sorted(abs(e) for e in errs)
        print(f"from {s:>9}: median |error| {100 * statistics.median(a):5.1f} %, worst {100 * a[-1]:5.1f} % "
              f"({len(a)} predictions)  target: median <= 10 %, worst <= 20 %")


if __name__ == "__main__":
    main()
