"""Are the ranges calibrated? Every prediction's range against a truth measured apart from the trace it came from.

    python benchmarks/ranges_calibration.py [--interleaved DIR ...] [--generated] [--ranks 16] [--json FILE] [-v]

Sources of truth (issue 35):

- **interleaved recordings** (``benchmarks/whatif_accuracy.py --interleaved``; the small ones committed in
  ``tests/data/jobs`` by default, ``--interleaved DIR`` for larger sets): every block predicted from every other block
  of the same recording, at the target block's rate; the truth is the target block's own clock (the median of its
  steps' slowest-rank wall times). Same-rate pairs too: the range of the job as it ran must hold its twin block.
- **generated GPU jobs** (``--generated``, ``benchmarks/jobgen.py``): the cases of ``benchmarks/gpu_truth.py``, each
  predicted with free communication, at four line rates and with the stragglers removed; the truth is the generator's
  simulation of that variant *as a new run* (another seed: other jitter draws), so run-to-run variation is part of
  what the range must hold.

Prints, per source and job kind: predictions, how often the truth fell inside the range (target >= 85 %, aim 90 %),
the median half-width (target <= 10 % on recorded runs, <= 3 % where sizes are known and iterations steady), the
median |error| of the point; with ``-v`` every miss with what its range was made of.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import gpu_truth, jobgen  # noqa: E402
from benchmarks.whatif_accuracy import blocks, interleaved_dirs  # noqa: E402

KINDS = ("ddp", "ddp-noshapes", "fsdp", "pipeline")


@dataclass(frozen=True)
class Check:
    """One prediction against its truth."""

    source: str  # "interleaved" or "generated"
    kind: str
    label: str
    point: float
    low: float
    high: float
    truth: float
    sources: dict[str, tuple[float, float]]

    @property
    def inside(self) -> bool:
        return self.low <= self.truth <= self.high

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2 / self.point

    @property
    def error(self) -> float:
        return self.point / self.truth - 1


def interleaved_checks(run_dir: Path, kind: str) -> list[Check]:
    """Every block of an interleaved recording predicted, with its range, from every block (itself excepted)."""
    from tracekit.analysis import ranges
    from tracekit.analysis.graph.whatif import Scenario
    from tracekit.analysis.pipeline import analyse
    from tracekit.loading import traceset

    ts = traceset.load([str(run_dir)], use_cache=False)
    bl = blocks(run_dir)
    out = []
    for a in bl:
        an = analyse(ts, link_bw_bps=a.rate_bps, only_iterations=a.steps)
        unc = an.uncertainty
        others = [b for b in bl if b.index != a.index]
        got = ranges.predict(unc, [Scenario(bandwidth_bps=b.rate_bps) for b in others])
        for b, rg in zip(others, got, strict=True):
            out.append(Check("interleaved", kind, f"{run_dir.name} #{a.index} {a.rate} -> #{b.index} {b.rate}",
                             rg.point, rg.low, rg.high, b.measured_ns, rg.sources))
    return out


def generated_checks(ranks: int, steps: int, root: Path) -> list[Check]:
    """The cases of gpu_truth.py, each prediction against a new run (another seed) of its variant."""
    import tracekit
    from tracekit.analysis import ranges
    from tracekit.analysis.graph.whatif import Scenario

    out = []
    for name, _designed, spec in gpu_truth.cases(jobgen.JobSpec(ranks=ranks, steps=steps)):
        d = root / name.replace(" ", "-").replace("+", "and")
        jobgen.write_job(d, spec, workers=2)
        job = tracekit.load([str(d)], link_bw=f"{spec.inter_bps / 1e9:g}Gbit", cache=False)
        an = job.analysis
        unc = an.uncertainty
        scen = [Scenario(), Scenario(free=True), *[Scenario(bandwidth_bps=r) for r in gpu_truth.RATES],
                Scenario(balanced=True)]
        new = replace(spec, seed=spec.seed + 1)
        truth = [jobgen.iteration_ns(new), jobgen.iteration_ns(replace(new, comm_free=True)),
                 *[jobgen.iteration_ns(replace(new, inter_bps=r)) for r in gpu_truth.RATES],
                 jobgen.iteration_ns(replace(new, stragglers=(), stalls=()))]
        labels = ["as it ran", "free", *[f"{r / 1e9:g}G" for r in gpu_truth.RATES], "balanced"]
        for lab, rg, t in zip(labels, ranges.predict(unc, scen), truth, strict=True):
            out.append(Check("generated", spec.parallel, f"{name}: {lab}", rg.point, rg.low, rg.high, t, rg.sources))
    return out


def table(checks: list[Check]) -> str:
    """Per source and kind: predictions, coverage, median half-width, median |error|."""
    lines = [f"{'source':<12} {'kind':<14} {'n':>4} {'inside':>8} {'half-width':>11} {'|error|':>8}",
             f"{'':<12} {'':<14} {'':>4} {'':>8} {'median':>11} {'median':>8}"]
    keys = sorted({(c.source, c.kind) for c in checks})
    for src in sorted({c.source for c in checks}):
        keys.append((src, "all"))
    keys.append(("all", "all"))
    for src, kind in keys:
        sel = [c for c in checks if src in ("all", c.source) and kind in ("all", c.kind)]
        if not sel:
            continue
        inside = sum(c.inside for c in sel) / len(sel)
        lines.append(f"{src:<12} {kind:<14} {len(sel):>4} {100 * inside:>7.0f}% "
                     f"{100 * statistics.median(c.half_width for c in sel):>10.1f}% "
                     f"{100 * statistics.median(abs(c.error) for c in sel):>7.1f}%")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--interleaved", nargs="*", default=[str(ROOT / "tests" / "data" / "jobs")],
                    help="folders holding interleaved-KIND[-N] recordings (default: tests/data/jobs)")
    ap.add_argument("--generated", action="store_true", help="also the generated GPU jobs of gpu_truth.py")
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--json", metavar="FILE", help="write every check to FILE")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every miss")
    a = ap.parse_args()
    from tracekit.analysis.ranges import sources_text

    checks: list[Check] = []
    for base in a.interleaved:
        for kind in KINDS:
            for d in interleaved_dirs(Path(base), kind):
                checks += interleaved_checks(d, kind)
    if a.generated:
        with tempfile.TemporaryDirectory(prefix="tracekit-calibration-") as tmp:
            checks += generated_checks(a.ranks, a.steps, Path(tmp))
    print(table(checks))
    if a.verbose:
        print("\nmisses (prediction (range) against the truth; what the range was made of):")
        for c in checks:
            if not c.inside:
                print(f"  {c.label:<52} {c.point / 1e6:8.1f} ({c.low / 1e6:.1f}–{c.high / 1e6:.1f}) ms, truth "
                      f"{c.truth / 1e6:8.1f} ms ({100 * c.error:+.1f} %); {sources_text(c.sources)}")
    if a.json:
        Path(a.json).write_text(json.dumps([{**c.__dict__, "inside": c.inside} for c in checks], indent=1))


if __name__ == "__main__":
    main()
