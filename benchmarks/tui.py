"""TUI benchmark: launch → first full paint on a cached multi-rank job, and pan/zoom key → repaint with
~10 M events on the timeline; each against a baseline measured in the same run.

    python benchmarks/tui.py [--size-mb 300] [--ranks 8] [--events 10000000] [--keep DIR]

1. Generates ``--ranks`` synthetic PyTorch GPU traces of ``--size-mb`` each (``benchmarks/synthetic.py``)
   and warms the caches (parse cache + results cache) once, as a first ``tracekit inspect`` would.
2. **Launch**: a fresh ``python`` process imports the app and runs it headless at 160×50; measured from
   process start (interpreter start-up excluded, imports included) until the overview is painted with
   the job's numbers. Baseline: the same app with the results cache disabled, i.e. painting only after
   reading every event and analysing the job (what a TUI that computes on open would do).
3. **Pan/zoom**: the warm job's ranks are replicated until there are ``--events`` events, analysed, and
   the timeline model built; then, in the running app, each key (zoom in, zoom out, pan right, pan left)
   is timed from the key's action to every visible lane redrawn (``render_line`` of the whole canvas),
   and end to end through Textual: from the key event entering the app to Textual writing the next
   frame (event dispatch, the action, layout, compositing, the details panel and status line).
   Baseline: drawing the same view by binning every event in view per lane (numpy, O(events) per
   repaint).

4. **Cold inspect**: the same app on a fresh cache directory (nothing parsed or analysed before), timed from
   process start until the overview is painted, the critical path is shown and the what-if is ready.
   Baseline: ``tracekit summary --no-cache --json`` of the same job (the whole text answer), same run.

Targets (issue 6): first full paint <= 1 s; pan/zoom key to repaint <= 50 ms with 10 M events. Issue 13:
cold, 8 x 300 MB on 2 cores, overview <= 15 s and critical path + what-if <= 25 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

CHILD_WARM = """
import json, sys, time
from tracekit.tui.data import LoadCallbacks, LoadOptions, load_job
t = time.perf_counter()
data = load_job([sys.argv[1]], LoadOptions(cache_dir=sys.argv[2]), LoadCallbacks())
print(json.dumps({"wall": time.perf_counter() - t, "events": data.events, "from_cache": data.from_cache}))
"""

CHILD_LAUNCH = """
import time
T0 = time.perf_counter()
import asyncio, json, sys
from tracekit.tui.app import InspectApp
from tracekit.tui.data import LoadOptions
from tracekit.tui.overview import OverviewView
T_IMPORT = time.perf_counter() - T0
if sys.argv[3] == "no-results-cache":
    import tracekit.tui.data as data_mod
    data_mod.results_cache.load = lambda root, key: None      # the baseline: analyse before painting
    data_mod.results_cache.store = lambda root, key, a: None
out = {}

async def main():
    app = InspectApp([sys.argv[1]], LoadOptions(cache_dir=sys.argv[2]))
    async with app.run_test(size=(160, 50)) as pilot:
        while "painted" not in app.phases:  # every view shown, and the refresh that painted them
            await asyncio.sleep(0.002)
        out["first_paint"] = time.perf_counter() - T0
        assert app.query_one(OverviewView).query_one("#verdict").content
        while "timeline" not in app.phases:
            await asyncio.sleep(0.01)
        out["timeline_ready"] = time.perf_counter() - T0
        out["from_cache"] = app.data.from_cache
        out["events"] = app.data.events

asyncio.run(main())
out["import"] = T_IMPORT
print(json.dumps(out))
"""

CHILD_COLD = """
import time
T0 = time.perf_counter()
import asyncio, json, sys
from tracekit.tui.app import InspectApp
from tracekit.tui.data import LoadOptions
out = {}

async def main():
    app = InspectApp([sys.argv[1]], LoadOptions(cache_dir=sys.argv[2]))
    async with app.run_test(size=(160, 50)) as pilot:
        for phase, key in (("painted", "overview"), ("critical_path", "critical_path"), ("whatif", "whatif")):
            while phase not in app.phases and "failed" not in app.phases:
                await asyncio.sleep(0.01)
            out[key] = time.perf_counter() - T0
        out["failed"] = getattr(app, "error", None) if "failed" in app.phases else None
        out["from_cache"] = app.data.from_cache
        await pilot.pause()  # let the views the last phase added finish mounting before the app closes

asyncio.run(main())
print(json.dumps(out))
"""

CHILD_PANZOOM = """
import asyncio, json, statistics, sys, time
import numpy as np, pyarrow as pa
from tracekit.loading import traceset
from tracekit.analysis.pipeline import analyse
from tracekit.views.timeline import TimelineModel, cell_ns
from tracekit.tui.app import LAST_PHASE, InspectApp
from tracekit.tui.data import PATH_MARKS, JobData
from tracekit.tui.timeline_canvas import TimelineCanvas
from textual import events

ts = traceset.load([sys.argv[1]], cache_dir=sys.argv[2])
want = int(sys.argv[3])
ev, ranks = ts.events, ts.ranks
copies = max(1, -(-want // ev.num_rows))
n0 = int(ranks.num_rows)
parts, rparts = [], []
for c in range(copies):
    r = ev.column("rank").to_numpy() + c * n0
    parts.append(ev.set_column(0, "rank", pa.array(r.astype(np.int32))))
    rparts.append(ranks.set_column(0, "rank", pa.array((ranks.column("rank").to_numpy() + c * n0).astype(np.int32))))
ts.events = pa.concat_tables(parts).unify_dictionaries()
ts.ranks = pa.concat_tables(rparts)
t = time.perf_counter()
analysis = analyse(ts)
t_analyse = time.perf_counter() - t
t = time.perf_counter()
model = TimelineModel.build(analysis)
t_build = time.perf_counter() - t
data = JobData.from_analysis(analysis)
data.timeline = model
out = {"events": model.events, "ranks": int(ts.ranks.num_rows), "lanes": len(model.lanes),
       "analyse_s": t_analyse, "build_s": t_build}


def naive_row(lane, zoom, first, width):
    # baseline: bin every event in view (numpy, O(events in view)), as a drawing without levels would
    ln = model.lanes[lane]
    cell = cell_ns(zoom)
    v0 = model.t0 + first * cell
    v1 = v0 + width * cell
    if ln.is_classes:
        return np.zeros(width)
    s = model.ev_start[ln.ev_lo:ln.ev_hi]
    e = model.ev_end[ln.ev_lo:ln.ev_hi]
    sel = (s < v1) & (e > v0)
    s, e = np.maximum(s[sel], v0), np.minimum(e[sel], v1)
    busy = np.zeros(width + 1)
    c0, c1 = (s - v0) // cell, (e - v0 - 1) // cell
    one = c0 == c1
    np.add.at(busy, c0[one], (e - s)[one])
    # events over several cells: first and last cell partial, whole cells in between
    many = ~one
    np.add.at(busy, c0[many], (v0 + (c0[many] + 1) * cell - s[many]))
    np.add.at(busy, c1[many], (e[many] - (v0 + c1[many] * cell)))
    inner = np.zeros(width + 2)
    np.add.at(inner, c0[many] + 1, 1)
    np.add.at(inner, c1[many], -1)
    return busy[:width] + np.cumsum(inner)[:width] * cell


async def main():
    app = InspectApp(data=data)
    async with app.run_test(size=(160, 50)) as pilot:
        t = time.perf_counter()
        while LAST_PHASE not in app.phases:  # the critical path (drawn over the lanes) and what-if, as loaded
            await pilot.pause(0.05)
        out["paths_s"] = time.perf_counter() - t
        out["path_segments"] = len(data.path_marks) if data.path_marks is not None else 0
        await pilot.press("3")
        await pilot.pause()
        canvas = app.query_one(TimelineCanvas)
        height = canvas.size.height
        frames = []
        display = app._display

        def timed_display(screen, renderable):
            display(screen, renderable)
            frames.append(time.perf_counter())

        app._display = timed_display
        keys = {"zoom in": ("plus", lambda: canvas.action_zoom(-1)),
                "zoom out": ("minus", lambda: canvas.action_zoom(1)),
                "pan right": ("right_square_bracket", lambda: canvas.action_pan(1)),
                "pan left": ("left_square_bracket", lambda: canvas.action_pan(-1))}
        direct, e2e, naive = {k: [] for k in keys}, {k: [] for k in keys}, {k: [] for k in keys}
        plain = {k: [] for k in keys}  # the same repaints with the critical path hidden
        canvas.action_fit()
        for rnd in range(6):
            for name, (key, act) in keys.items():
                canvas._lines.clear()  # every repaint measured draws its rows anew
                t = time.perf_counter()
                act()
                for y in range(height):
                    canvas.render_line(y)
                direct[name].append(time.perf_counter() - t)
                canvas._lines.clear()
                canvas.hidden_marks.add(PATH_MARKS)
                t = time.perf_counter()
                for y in range(height):
                    canvas.render_line(y)
                plain[name].append(time.perf_counter() - t)
                canvas.hidden_marks.discard(PATH_MARKS)
                t = time.perf_counter()
                for lane in range(canvas.top_lane, min(canvas.top_lane + canvas.lane_rows, len(model.lanes))):
                    naive_row(lane, canvas.zoom, canvas.first_cell, canvas.track_width)
                naive[name].append(time.perf_counter() - t)
                canvas._lines.clear()
                n = len(frames)
                t = time.perf_counter()
                app._driver.send_message(events.Key(key, None))
                while len(frames) == n:  # until Textual has written the next frame
                    await asyncio.sleep(0.0002)
                e2e[name].append(frames[n] - t)
                await pilot.pause()
            canvas.action_fit()
        out["visible_lanes"] = min(canvas.lane_rows, len(model.lanes))
        out["width"] = canvas.track_width
        out["direct_ms"] = {k: 1e3 * statistics.median(v) for k, v in direct.items()}
        out["direct_max_ms"] = max(1e3 * max(v) for v in direct.values())
        out["plain_rows_ms"] = {k: 1e3 * statistics.median(v) for k, v in plain.items()}
        out["e2e_ms"] = {k: 1e3 * statistics.median(v) for k, v in e2e.items()}
        out["naive_ms"] = {k: 1e3 * statistics.median(v) for k, v in naive.items()}

asyncio.run(main())
print(json.dumps(out))
"""


def child(code: str, *args: str) -> dict:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                       cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=float, default=300, help="JSON size of each rank's trace")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--events", type=int, default=10_000_000, help="events on the timeline for pan/zoom")
    ap.add_argument("--repeat", type=int, default=3, help="launches measured (median reported)")
    ap.add_argument("--keep", metavar="DIR", help="write the traces and caches here and keep them")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    from process_tree import compile_bytecode
    from synthetic import write_trace

    compile_bytecode(ROOT / "tracekit", ROOT / "parsers", ROOT / "tui")  # the launches start as an install's would
    work = Path(args.keep or tempfile.mkdtemp(prefix="tracekit-tui-bench-"))
    job = work / f"job_{args.ranks}x{int(args.size_mb)}mb"
    job.mkdir(parents=True, exist_ok=True)
    for r in range(args.ranks):
        path = job / f"rank{r}.pt.trace.json"
        if not path.exists():
            print(f"generating rank {r}: {args.size_mb:.0f} MB ...", flush=True)
            write_trace(path, args.size_mb, rank=r, world=args.ranks, seed=r)
    cache = work / "cache"
    total_mb = sum(p.stat().st_size for p in job.iterdir()) / 1e6
    print(f"job: {job} ({args.ranks} ranks, {total_mb:.0f} MB); machine: {os.cpu_count()} cores; "
          f"python {sys.version.split()[0]}", flush=True)
    warm = child(CHILD_WARM, str(job), str(cache))
    print(f"first open (parse + analyse + cache): {warm['wall']:.1f} s, {warm['events']:,} events", flush=True)

    def median(runs: list[dict], key: str) -> float:
        vals = sorted(r[key] for r in runs)
        return vals[len(vals) // 2]

    launches = [child(CHILD_LAUNCH, str(job), str(cache), "cached") for _ in range(args.repeat)]
    baseline = [child(CHILD_LAUNCH, str(job), str(cache), "no-results-cache") for _ in range(max(1, args.repeat // 2))]
    assert all(r["from_cache"] for r in launches)
    paint, base_paint = median(launches, "first_paint"), median(baseline, "first_paint")
    print()
    print(f"launch → first full paint (overview), warm caches, {args.repeat} launches, median:")
    best = min(r["first_paint"] for r in launches)
    print(f"  tracekit inspect:                 {paint:.3f} s  (best {best:.3f} s; imports "
          f"{median(launches, 'import'):.3f} s; timeline ready at {median(launches, 'timeline_ready'):.2f} s)")
    print(f"  baseline (analyse, then paint):   {base_paint:.3f} s")
    print(f"  ratio: {base_paint / paint:.1f}x faster; target <= 1 s: {'met' if paint <= 1 else 'NOT met'}")

    print()
    print("cold inspect (no parse cache, no results cache: a fresh cache directory each launch), median of "
          f"{args.repeat}:")
    colds = []
    for _ in range(args.repeat):
        fresh = Path(tempfile.mkdtemp(prefix="tracekit-tui-cold-"))
        try:
            colds.append(child(CHILD_COLD, str(job), str(fresh)))
        finally:
            shutil.rmtree(fresh, ignore_errors=True)
    assert not any(r["failed"] or r["from_cache"] for r in colds), colds
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tracekit.cli", "summary", str(job), "--no-cache", "--json"], cwd=ROOT,
                   check=True, capture_output=True)
    summary_s = time.perf_counter() - t
    over, paths, whatif = (median(colds, k) for k in ("overview", "critical_path", "whatif"))
    print(f"  overview painted {over:.1f} s (target <= 15 s: {'met' if over <= 15 else 'NOT met'}); critical path "
          f"{paths:.1f} s; what-if {whatif:.1f} s (target <= 25 s for both: "
          f"{'met' if max(paths, whatif) <= 25 else 'NOT met'})")
    print(f"  baseline: `tracekit summary --no-cache --json` of the same job {summary_s:.1f} s; the overview comes "
          f"{summary_s / over:.1f}x sooner than that text answer")

    pz = child(CHILD_PANZOOM, str(job), str(cache), str(args.events))
    print()
    print(f"pan/zoom with {pz['events']:,} events on {pz['lanes']} lanes ({pz['ranks']} ranks; analysed in "
          f"{pz['analyse_s']:.1f} s, timeline model built in {pz['build_s']:.1f} s, critical path "
          f"({pz['path_segments']:,} segments, drawn over the lanes) and what-if in {pz['paths_s']:.1f} s); "
          f"{pz['visible_lanes']} lanes × {pz['width']} cells visible; medians of 6 presses:")
    print(f"  {'key':10} {'canvas':>12} {'key→frame':>12} {'baseline':>10} {'ratio':>7} {'rows, path hidden':>18}")
    for k in pz["direct_ms"]:
        d, e, n, p = pz["direct_ms"][k], pz["e2e_ms"][k], pz["naive_ms"][k], pz["plain_rows_ms"][k]
        print(f"  {k:10} {d:>9.1f} ms {e:>9.1f} ms {n:>7.0f} ms {n / d:>6.0f}x {p:>15.1f} ms")
    worst = max(pz["e2e_ms"].values())
    print(f"  canvas: the key's action and every visible row drawn (with the critical path); key→frame: the key "
          f"event in, Textual's next frame out; slowest single canvas repaint {pz['direct_max_ms']:.1f} ms")
    print(f"  target <= 50 ms key→repaint: {'met' if worst <= 50 else 'NOT met'} "
          f"(median key→frame of the slowest key {worst:.1f} ms)")


if __name__ == "__main__":
    main()
