"""A long fuzz run over every registered parser (``tests/fuzzing.py``): prints the cases run per target and
every distinct finding (a traceback, a TraceError without the file name, or a case over its time limit).

    python benchmarks/fuzz.py --cases 20000 [--seed 1] [--target kineto] [--cli] [--save DIR]

CI runs the same mutations with a budget of seconds (``tests/test_fuzz.py``); this is the minutes-long run
whose counts go in the issue notes. Exit status 1 when anything was found.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=5000, help="total cases (spread over the targets)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--target", action="append", help="only this registered target (repeatable)")
    ap.add_argument("--cli", action="store_true", help="also run `tracekit summary` on every case (slower)")
    ap.add_argument("--no-analysis", action="store_true", help="parse only; skip iterations + attribution")
    ap.add_argument("--save", metavar="DIR", help="write each finding's input here")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from tests import fuzzing

    targets = args.target or sorted(fuzzing.TARGETS)
    for t in targets:
        n = len(fuzzing.TARGETS[t].corpus())
        print(f"target {t}: {n} seeds")
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    cases, findings = fuzzing.run(args.cases, seed=args.seed, targets=targets, analyse=not args.no_analysis,
                                  cli=args.cli, log=lambda line: print(line, flush=True))
    wall = time.perf_counter() - t0
    per_target = Counter(targets[i % len(targets)] for i in range(cases))
    print()
    print(f"cases: {cases} in {wall:.0f} s wall, {time.process_time() - cpu0:.0f} s CPU "
          f"({cases / wall:.1f} cases/s); " + ", ".join(f"{k} {v}" for k, v in sorted(per_target.items())))
    print(f"distinct findings: {len(findings)}")
    for i, f in enumerate(findings):
        print(f"  {i + 1}. {f.summary()}")
        if args.save:
            out = Path(args.save)
            out.mkdir(parents=True, exist_ok=True)
            (out / f"finding-{i + 1}.bin").write_bytes(f.data)
            (out / f"finding-{i + 1}.txt").write_text(f.summary() + "\n\n" + f.detail)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
