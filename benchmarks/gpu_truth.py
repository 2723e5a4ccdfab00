"""The replay and the verdict against GPU jobs whose truth is known (issues 27 and 31).

    python benchmarks/gpu_truth.py [--ranks 16] [--steps 6] [--out DIR]

Each case is a job of ``benchmarks/jobgen.py`` (DDP or FSDP, the backward on the autograd engine's thread, 2 hosts x 8
GPUs by default) designed to have one verdict class: link-bound on a slow link, straggler-bound with one slow rank,
input-bound with one host's input pipeline stalling, compute-bound on a fast link, host-bound with slow launches,
mixed with a slow rank on a middling link. For each it prints tracekit's predictions next to the generator's truth — the
iteration time with free communication, on other line rates, and with the stragglers' excess removed — and the
verdict's class next to the designed one. Targets (issue 31): every prediction within 3 % of the truth, every class
right.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import jobgen

MS = 1_000_000
RATES = (10e9, 40e9, 100e9, 400e9)


def cases(base: jobgen.JobSpec) -> list[tuple[str, str, jobgen.JobSpec]]:
    """(name, designed class, spec) of every case, for DDP and FSDP."""
    out = []
    for par in ("ddp", "fsdp"):
        b = replace(base, parallel=par)
        out += [
            (f"{par} 10G", "link-bound", replace(b, inter_bps=10e9)),
            (f"{par} slow rank", "straggler-bound", replace(b, inter_bps=200e9, stragglers=((5, 1.5),))),
            (f"{par} host stall", "input-bound", replace(b, inter_bps=200e9, stalls=((1, 40 * MS),))),
            (f"{par} 400G", "compute-bound", replace(b, inter_bps=400e9)),
            (f"{par} slow launch", "host-bound", replace(b, inter_bps=400e9, fwd_ns=300_000, cpu_op_ns=4 * MS)),
        ]
    out.append(("ddp slow rank + link", "mixed", replace(base, inter_bps=20e9, stragglers=((1, 1.5),))))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", help="keep the generated jobs here (default: a temporary directory)")
    a = ap.parse_args()
    import tracekit
    from tracekit.analysis.graph.whatif import Scenario, predict_many

    base = jobgen.JobSpec(ranks=a.ranks, steps=a.steps)
    root = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="tracekit-gpu-truth-"))
    errors: list[float] = []
    right = 0
    rows = cases(base)
    print(f"{'case':22s} {'designed':16s} {'verdict':16s} {'free':>7s} " +
          " ".join(f"{r / 1e9:>5g}G" for r in RATES) + f" {'balanced':>8s}   (prediction / truth - 1, %)")
    for name, designed, spec in rows:
        d = root / name.replace(" ", "-").replace("+", "and")
        jobgen.write_job(d, spec, workers=2)
        job = tracekit.load([str(d)], link_bw=f"{spec.inter_bps / 1e9:g}Gbit", cache=False)
        model = job.analysis.whatif
        scen = [Scenario(free=True), *[Scenario(bandwidth_bps=r) for r in RATES], Scenario(balanced=True)]
        pred = predict_many(model, scen)
        truth = [jobgen.iteration_ns(replace(spec, comm_free=True)),
                 *[jobgen.iteration_ns(replace(spec, inter_bps=r)) for r in RATES],
                 jobgen.iteration_ns(replace(spec, stragglers=(), stalls=()))]
        err = [100 * (p / t - 1) for p, t in zip(pred, truth, strict=True)]
        errors += [abs(e) for e in err]
        kind = job.verdict.kind
        right += kind == designed
        print(f"{name:22s} {designed:16s} {kind:16s} " + " ".join(f"{e:+6.1f}" for e in err[:1]) + " " +
              " ".join(f"{e:+6.1f}" for e in err[1:-1]) + f" {err[-1]:+8.1f}" + ("" if kind == designed else "  ✗"))
    print(f"\n{len(errors)} predictions: median |error| {statistics.median(errors):.2f} %, worst {max(errors):.2f} % "
          f"(target ≤ 3 %); verdict class right on {right} of {len(rows)}")


if __name__ == "__main__":
    main()
