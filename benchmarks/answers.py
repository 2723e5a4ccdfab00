"""The answers a change must not move: ``summary --json`` and ``whatif --json`` of every test input, sample and shared
recording, dumped by one tracekit and compared with another's dump.

    python benchmarks/answers.py dump DIR [--tracekit COMMAND] [--tree REV] [--extra INPUT ...]
    python benchmarks/answers.py compare DIR_A DIR_B

``dump`` runs the given ``tracekit`` command (default: the one beside this interpreter; ``--tree REV``: this
repository at that git revision, built as ``benchmarks/summary.py --compare-rev`` builds it) on ``tests/data/jobs/*``,
``samples/ddp-gloo`` and every input under ``../shared/data`` (each file or job folder alone), plus ``--extra``
inputs (a generated trace, a generated job): ``summary --json --no-cache`` without and with a 1 Gbit/s line rate, and
``whatif --json --no-cache`` with that line rate over a small grid (two rates, two compressions). Each answer is one
file (its exit code and stderr's last line where it failed); a dump into a folder that has some goes on with the
rest. ``compare`` says which answers differ, leaving out the
fields that time the command itself.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
#: fields that time the command or name where it ran (not answers)
TIMING_KEYS = {"elapsed_s", "wall_s", "seconds", "took_s", "cache_dir", "cache"}
RUNS = {
    "summary": ["summary", "--json", "--no-cache", "-q"],
    "summary-1gbit": ["summary", "--json", "--no-cache", "-q", "--link-bw", "1gbit"],
    "whatif-1gbit": ["whatif", "--json", "--no-cache", "-q", "--link-bw", "1gbit", "--bandwidth", "500mbit,4gbit",
                     "--compression", "1,2"],
}


def inputs(extra: list[str]) -> dict[str, Path]:
    """Every input by a name for its answers' files."""
    out: dict[str, Path] = {}
    for d in sorted((ROOT / "tests" / "data" / "jobs").iterdir()):
        if d.is_dir():
            out[f"jobs-{d.name}"] = d
    out["sample-ddp-gloo"] = ROOT / "samples" / "ddp-gloo"
    if SHARED.is_dir():
        traces = sorted(f for f in SHARED.rglob("*") if f.is_file() and f.name.endswith((".json", ".json.gz")))
        for f in traces:
            out["shared-" + str(f.relative_to(SHARED)).replace("/", "-")] = f
        for d in sorted({f.parent for f in traces}):  # a folder of several traces is a job of its own too
            if sum(f.parent == d for f in traces) > 1:
                out["shared-dir-" + str(d.relative_to(SHARED)).replace("/", "-")] = d
    for e in extra:
        out["extra-" + Path(e).name] = Path(e)
    return out


def dump(into: Path, tracekit: list[str], extra: list[str]) -> None:
    """Every answer of ``tracekit`` (a command) into ``into``, one file each."""
    into.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TRACEKIT_CACHE_DIR": str(into / ".cache")}
    for name, path in inputs(extra).items():
        for run, args in RUNS.items():
            if (into / f"{name}.{run}.json").exists():  # a dump goes on where a stopped one left off
                continue
            p = subprocess.run([*tracekit, args[0], str(path), *args[1:]], capture_output=True, text=True, env=env)
            out = into / f"{name}.{run}.json"
            if p.returncode == 0:
                out.write_text(p.stdout)
            else:
                out.write_text(json.dumps({"exit": p.returncode, "stderr": p.stderr.strip().splitlines()[-1:]}))
            print(f"{name:60} {run:16} exit {p.returncode}", flush=True)


def _strip(x: object) -> object:
    if isinstance(x, dict):
        return {k: _strip(v) for k, v in x.items() if k not in TIMING_KEYS}
    if isinstance(x, list):
        return [_strip(v) for v in x]
    return x


def compare(a: Path, b: Path) -> int:
    """Print which answers differ between two dumps (timing fields left out); 1 where any does."""
    names = sorted({f.name for f in a.glob("*.json")} | {f.name for f in b.glob("*.json")})
    differ = 0
    for n in names:
        fa, fb = a / n, b / n
        if not fa.exists() or not fb.exists():
            print(f"only in one: {n}")
            differ += 1
            continue
        try:
            ja, jb = _strip(json.loads(fa.read_text())), _strip(json.loads(fb.read_text()))
        except ValueError:
            ja, jb = fa.read_text(), fb.read_text()
        if ja != jb:
            print(f"DIFFERENT: {n}")
            differ += 1
    print(f"{len(names) - differ} of {len(names)} answers identical")
    return 1 if differ else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("dir")
    d.add_argument("--tracekit", default=str(Path(sys.executable).with_name("tracekit")))
    d.add_argument("--tree", metavar="REV", help="run this repository at git revision REV instead")
    d.add_argument("--extra", nargs="*", default=[])
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    args = ap.parse_args()
    if args.cmd == "dump":
        command = shlex.split(args.tracekit)
        if args.tree:
            sys.path.insert(0, str(ROOT / "benchmarks"))
            import summary

            site = summary._other_tree(args.tree, Path(tempfile.mkdtemp(prefix="tracekit-answers-")))
            command = [sys.executable, "-c", textwrap.dedent(summary.OTHER_TREE), str(site)]
        dump(Path(args.dir), command, args.extra)
    else:
        sys.exit(compare(Path(args.a), Path(args.b)))


if __name__ == "__main__":
    main()
