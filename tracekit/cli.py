"""The ``tracekit`` command line: ``summary``, ``export`` and friends.

User mistakes and damaged inputs end in one line on stderr and a non-zero exit, never a traceback
(set ``TRACEKIT_DEBUG=1`` to see one for tracekit's own bugs).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console

from tracekit import __version__
from tracekit.diagnostics import Diagnostic, TraceError

EXIT_INPUT = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 70
PROGRESS_MIN_BYTES = 16 << 20


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="trace files or directories (Kineto JSON[.gz]; directories are searched)")
    p.add_argument("--no-cache", action="store_true", help="parse again instead of reusing the parse cache")
    p.add_argument("--cache-dir", metavar="DIR", help="where parsed tables are cached "
                   "(default $TRACEKIT_CACHE_DIR or ~/.cache/tracekit)")
    p.add_argument("--jobs", "-j", type=int, metavar="N", help="parse files in N processes (default: cores)")
    p.add_argument("--step-marker", metavar="REGEX",
                   help="annotation name that marks iterations when there is no ProfilerStep#N "
                        "(a numeric group, if any, gives the iteration number)")
    p.add_argument("--quiet", "-q", action="store_true", help="do not print warnings about the inputs")
    g = p.add_argument_group("big jobs", "each file becomes a per-rank Parquet partition (events, collectives, "
                             "iterations, breakdown) plus a small summary; the results are combined lazily")
    g.add_argument("--engine", choices=("local", "dask"), default="local",
                   help="where files are parsed and analysed: local processes (default) or a Dask cluster "
                        "(a LocalCluster of --jobs workers unless --scheduler is given)")
    g.add_argument("--scheduler", metavar="URL", help="Dask scheduler to run on, e.g. tcp://head-node:8786 "
                   "(implies --engine dask; workers must see the inputs and --dataset at the same paths)")
    g.add_argument("--dataset", metavar="DIR", help="keep the per-rank dataset here (default: in the cache, "
                   "reused while the inputs are unchanged); on a cluster, a directory every worker can write")
    g.add_argument("--rebuild", action="store_true", help="replace a --dataset DIR that holds other inputs")
    g.add_argument("--memory-budget", metavar="SIZE", help="memory per file being read, e.g. 1G (default "
                   "$TRACEKIT_MEMORY_BUDGET or 1G): bigger files are read in bounded memory through disk")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tracekit",
        description="Where did each iteration of each rank go, and is the network the bottleneck? "
                    "Reads PyTorch-profiler traces of distributed jobs.")
    parser.add_argument("--version", action="version", version=f"tracekit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("summary", help="per-rank breakdown of iteration time (compute, overlapped and "
                       "exposed communication, memory, idle)",
                       description="Print where each rank's iteration time went.")
    _common(p)
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of tables")
    p.set_defaults(func=cmd_summary)

    p = sub.add_parser("export", help="write the analysis tables to Parquet",
                       description="Write analysis tables to Parquet: OUT.parquet gets one table "
                                   "(--table, default breakdown); any other OUT is a directory that gets "
                                   "one file per table (ranks, events, iterations, breakdown, collectives).")
    _common(p)
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="a .parquet file or a directory")
    p.add_argument("--table", metavar="NAME", help="export only this table")
    p.add_argument("--force", action="store_true", help="overwrite existing output files")
    p.set_defaults(func=cmd_export)
    return parser


def _load(args: argparse.Namespace, console: Console):
    """Build (or reuse) the per-rank dataset of the inputs and open its results."""
    from tracekit import dataset, engine, traceset
    from tracekit.analysis import DatasetAnalysis

    files, _ = traceset.discover(args.paths)
    total = sum(os.path.getsize(f) for f in files)
    progress_cb = None
    bar = None
    if total >= PROGRESS_MIN_BYTES and console.is_terminal and not getattr(args, "json", False):
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

        bar = Progress(TextColumn("reading traces"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                       console=console, transient=True)
        task = bar.add_task("read", total=total)
        bar.start()

        def progress_cb(done: int, _total: int, _path: str) -> None:
            bar.update(task, completed=done)

    if args.jobs is not None and args.jobs < 1:
        raise TraceError(None, "--jobs must be at least 1")
    eng = engine.make(args.engine, scheduler=args.scheduler, jobs=args.jobs, total_bytes=total)
    try:
        ds = dataset.build(args.paths, out=args.dataset, engine=eng, step_marker=args.step_marker,
                           budget=args.memory_budget, use_cache=not args.no_cache, cache_dir=args.cache_dir,
                           force=args.rebuild, progress=progress_cb)
    finally:
        if bar is not None:
            bar.stop()
    if ds.manifest.get("events", 0) == 0 and ds.manifest.get("collectives", 0) == 0:
        damage = "; ".join(str(d) for d in ds.diagnostics if d.level != "info")
        ds.cleanup()
        raise TraceError(", ".join(files), "no events to analyse" + (f" ({damage})" if damage else ""))
    return DatasetAnalysis(ds)


def _warn(diags: Sequence[Diagnostic], console: Console, quiet: bool) -> None:
    if quiet:
        return
    shown = [d for d in diags if d.level != "info"]
    for d in shown[:20]:
        console.print(f"[yellow]warning[/]: {d}", highlight=False, soft_wrap=True)
    if len(shown) > 20:
        console.print(f"[yellow]warning[/]: … and {len(shown) - 20} more")


def cmd_summary(args: argparse.Namespace) -> int:
    err = Console(stderr=True)
    result = _load(args, err)
    try:
        from tracekit import summary

        if args.json:
            payload = _summary_json(result, summary)
            sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")
            _warn(result.diagnostics, err, args.quiet)
            return 0
        from tracekit.report import render_summary

        out = Console() if sys.stdout.isatty() else Console(width=120)
        render_summary(out, result)
        _warn(result.diagnostics, err, args.quiet)
        return 0
    finally:
        result.dataset.cleanup()


def _summary_json(result: Any, summary: Any) -> dict[str, Any]:
    return {
        "job": summary.job(result.breakdown),
        "ranks": summary.per_rank(result.breakdown).to_dicts(),
        "iterations": summary.per_iteration(result.breakdown).to_dicts(),
        "breakdown": result.breakdown.to_pylist(),
        "notes": result.notes,
        "diagnostics": [str(d) for d in result.diagnostics],
    }


def cmd_export(args: argparse.Namespace) -> int:
    from tracekit.export import export

    err = Console(stderr=True)
    if os.path.exists(args.output) and args.output.endswith(".parquet") and not args.force:
        raise TraceError(args.output, "already exists (use --force to overwrite)")
    result = _load(args, err)
    try:
        written = export(result.tables(), args.output, force=args.force, table=args.table)
    finally:
        result.dataset.cleanup()
    for path in written:
        err.print(f"wrote {path}", highlight=False, soft_wrap=True)
    _warn(result.diagnostics, err, args.quiet)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except TraceError as exc:
        print(f"tracekit: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        print("tracekit: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as exc:
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        print(f"tracekit: {where}{exc.strerror or exc}", file=sys.stderr)
        return EXIT_INPUT
    except Exception as exc:  # tracekit's own bug: one line, unless debugging
        if os.environ.get("TRACEKIT_DEBUG"):
            raise
        print(f"tracekit: internal error: {type(exc).__name__}: {exc} "
              "(set TRACEKIT_DEBUG=1 for the traceback)", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
