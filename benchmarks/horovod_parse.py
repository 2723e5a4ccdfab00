"""Benchmark: parse a large Horovod timeline in bounded memory, against a naive baseline.

Writes a synthetic timeline of ``--size-mb`` MB (default 1024) in a temporary directory: a job of
``--ranks`` ranks reducing ``--tensors`` gradients per iteration, fused four at a time, each with a
negotiation (one tick per rank), a top-level op and four activities, laid out exactly as Horovod's
writer does (``--era new``: >= 0.20.1, one line; ``--era old``: <= 0.20.0, unterminated). Then, each in
a fresh child process so that peak RSS is its own:

* ``tracekit``: ``tracekit.parsers.horovod.parse`` on the whole file;
* ``tracekit-prefix`` and ``baseline`` on the first ``--baseline-mb`` MB (cut at a record boundary):
  the baseline repairs the text into valid JSON, ``json.loads`` it and pairs B/E records with a
  per-record Python loop (dict stacks), which is what a straightforward reader does. It runs on a prefix
  because ``json.loads`` of the whole file would need tens of GB.

Prints MB/s, peak RSS and the ratios. Timings are for information; the tests never assert them.

    python benchmarks/horovod_parse.py --size-mb 1024
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

PHASES = ("QUEUE", "MEMCPY_IN_FUSION_BUFFER", "NCCL_ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER")


def _iteration_template(tensors: int, ranks: int, fuse: int, era: str,
                        first: bool) -> tuple[str, np.ndarray]:
    """The text of one iteration with ``%d`` for every ts, and the ts offsets (µs) in text order.

    Laid out like Horovod's writer: <= 0.20.0 ends every record with ``,\\n``; >= 0.20.1 ends metadata
    records with ``,\\n`` and separates events with ``,`` on one line (the next iteration's text starts
    with the ``,`` that follows this one's last event)."""
    records: list[tuple[bool, str]] = []  # (is metadata, text)
    offs: list[int] = []
    t = 0

    def event(text: str, ts: int) -> None:
        records.append((False, text))
        offs.append(ts)

    for g0 in range(0, tensors, fuse):
        group = range(g0 + 1, min(tensors, g0 + fuse) + 1)
        for pid in group:
            if first:
                records.append((True, f'{{"name": "process_name", "ph": "M", "pid": {pid}, "args": {{"name": '
                                      f'"DistributedOptimizer.Allreduce/layer{pid}.weight"}}}}'))
                records.append((True, f'{{"name": "process_sort_index", "ph": "M", "pid": {pid}, '
                                      f'"args": {{"sort_index": {pid}}}}}'))
            event(f'{{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": %d, "pid": {pid}}}', t)
            for r in range(ranks):
                rank = (r * 7 + pid) % ranks
                event(f'{{"ph": "X", "name": "{rank}", "ts": %d, "pid": {pid}, "dur": 0}}', t + 1 + r * 3)
            event(f'{{"ph": "E", "ts": %d, "pid": {pid}}}', t + 2 + ranks * 3)
            t += 1
        t += ranks * 3 + 10
        for pid in group:
            event(f'{{"ph": "B", "name": "ALLREDUCE", "ts": %d, "pid": {pid}}}', t)
            t += 1
        for ph in PHASES:
            for pid in group:
                event(f'{{"ph": "B", "name": "{ph}", "ts": %d, "pid": {pid}}}', t)
                t += 1
            t += 20
            for pid in group:
                event(f'{{"ph": "E", "ts": %d, "pid": {pid}}}', t)
                t += 1
        for pid in group:
            event(f'{{"ph": "E", "ts": %d, "pid": {pid}, "args": {{"dtype": "float32", '
                  f'"shape": "[{pid * 64}, 1024]"}}}}', t)
            t += 1
        t += 50
    parts: list[str] = []
    prev_meta = True  # the start of an iteration: nothing to separate from (see above)
    for meta, text in records:
        if era == "old":
            parts.append(text + ",\n")
        elif meta:
            parts.append(("" if prev_meta else ",") + text + ",\n")
        else:
            parts.append(("" if prev_meta else ",") + text)
        prev_meta = meta
    return "".join(parts), np.asarray(offs, np.int64)


def generate(path: str, size_mb: float, ranks: int, tensors: int, era: str) -> int:
    """Write the synthetic timeline; returns its size in bytes."""
    target = int(size_mb * (1 << 20))
    first_t, first_o = _iteration_template(tensors, ranks, 4, era, True)
    rest_t, rest_o = _iteration_template(tensors, ranks, 4, era, False)
    span = int(max(first_o.max(), rest_o.max())) + 5000
    with open(path, "w") as f:
        if era == "new":
            f.write('[\n{"name": "process_name", "ph": "M", "pid": 0, "args": '
                    '{"start_time_since_epoch_in_micros":1719912345678901}},\n'
                    '{"name": "process_sort_index", "ph": "M", "pid": 0, "args": {"sort_index": 0}},\n')
        else:
            f.write("[\n")
        written = f.tell()
        base = 1000
        it = 0
        while written < target:
            tmpl, offs = (first_t, first_o) if it == 0 else (rest_t, rest_o)
            text = tmpl % tuple((offs + base).tolist())
            if it and era == "new":
                text = "," + text  # after the previous iteration's last event
            f.write(text)
            written += len(text)
            base += span
            it += 1
        f.write("]" if era == "new" else "")  # <= 0.20.0 never closes the array
    return os.path.getsize(path)


def prefix(path: str, mb: float, out: str) -> int:
    """Copy the first ``mb`` MB of ``path``, cut after a complete record, to ``out``."""
    with open(path, "rb") as f:
        data = f.read(int(mb * (1 << 20)))
    cut = max(data.rfind(b"},{"), data.rfind(b"},\n{"))
    data = data[: cut + 1] if cut > 0 else data
    with open(out, "wb") as f:
        f.write(data)
    return len(data)


def baseline(path: str) -> dict[str, Any]:
    """The naive reader: repair to valid JSON, json.loads, per-record Python pairing with dict stacks."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    text = text.rstrip().rstrip(",")
    if not text.endswith("]"):
        text += "]"
    records = json.loads(text)
    stacks: dict[int, list[tuple[str, int]]] = {}
    events: list[tuple[int, str, int, int]] = []
    ticks: list[tuple[int, int, int]] = []
    names: dict[int, str] = {}
    epoch = 0
    for r in records:
        ph = r.get("ph")
        if ph == "M":
            a = r.get("args", {})
            if "start_time_since_epoch_in_micros" in a:
                epoch = a["start_time_since_epoch_in_micros"]
            elif "name" in a:
                names[r["pid"]] = a["name"]
        elif ph == "B":
            stacks.setdefault(r["pid"], []).append((r["name"], r["ts"]))
        elif ph == "E":
            st = stacks.get(r["pid"])
            if st:
                name, start = st.pop()
                events.append((r["pid"], name, (epoch + start) * 1000, (r["ts"] - start) * 1000))
        elif ph == "X":
            ticks.append((r["pid"], int(r["name"]), (epoch + r["ts"]) * 1000))
    return {"events": len(events), "ticks": len(ticks)}


def child(mode: str, path: str) -> None:
    """Parse ``path`` one way and print what it found, its time and this process's peak RSS.

    Imports happen before the clock starts (they are the same for any file size)."""
    from tracekit.parsers import horovod

    rss0 = _rss_now_mb()
    t0 = time.perf_counter()
    if mode == "baseline":
        out = baseline(path)
    else:
        pf = horovod.parse(path)
        nbytes = pf.events.nbytes + pf.collectives.nbytes + sum(t.nbytes for t in pf.tables.values())
        out = {"events": pf.events.num_rows - pf.meta["dangling"],
               "ticks": pf.tables["horovod_ticks"].num_rows,
               "collectives": pf.collectives.num_rows, "output_mb": nbytes / (1 << 20)}
    out["rss_after_imports_mb"] = rss0
    out["seconds"] = time.perf_counter() - t0
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    _release_free_heap()
    out["rss_end_mb"] = _rss_now_mb()  # what the results (and the baseline's objects) keep resident
    print(json.dumps(out))


def _rss_now_mb() -> float:
    """Resident set size now (ru_maxrss of a fresh child can inherit its parent's at fork)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


def _release_free_heap() -> None:
    """Give freed heap pages back to the OS (glibc), so that RSS shows what is still in use."""
    import contextlib
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def run_child(mode: str, path: str) -> dict[str, Any]:
    res = subprocess.run([sys.executable, __file__, "--child", mode, path], capture_output=True, text=True,
                         check=False)
    if res.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{res.stderr}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=float, default=1024)
    ap.add_argument("--baseline-mb", type=float, default=64)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--tensors", type=int, default=160)
    ap.add_argument("--era", choices=("new", "old"), default="new")
    ap.add_argument("--dir", default=None, help="where to write the timeline (default: a temp dir)")
    ap.add_argument("--child", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    ap.add_argument("--generate", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    if args.generate:
        g = args.generate
        generate(g[0], float(g[1]), int(g[2]), int(g[3]), g[4])
        return
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (timings scale with it)")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = os.path.join(tmp, "timeline.json")
        t0 = time.perf_counter()
        # generate in a child too, so that this process stays small and the children's peaks are their own
        subprocess.run([sys.executable, __file__, "--generate", path, str(args.size_mb), str(args.ranks),
                        str(args.tensors), args.era], check=True)
        size = os.path.getsize(path)
        print(f"generated {size / 1e6:.0f} MB ({args.era} era, {args.ranks} ranks, {args.tensors} tensors) "
              f"in {time.perf_counter() - t0:.1f} s")
        small = os.path.join(tmp, "prefix.json")
        psize = prefix(path, args.baseline_mb, small)
        rows = []
        for name, mode, p, sz in (("tracekit", "tracekit", path, size),
                                  ("tracekit-prefix", "tracekit", small, psize),
                                  ("baseline", "baseline", small, psize)):
            r = run_child(mode, p)
            r["name"], r["mb"] = name, sz / 1e6
            r["mb_s"] = r["mb"] / r["seconds"]
            rows.append(r)
            extra = f", output {r['output_mb']:.0f} MiB" if "output_mb" in r else ""
            print(f"{name:16s} {r['mb']:8.0f} MB  {r['seconds']:7.2f} s  {r['mb_s']:7.1f} MB/s  "
                  f"peak RSS {r['peak_rss_mb']:7.0f} MiB  events {r['events']}{extra}")
        full, pre, base = rows
        assert pre["events"] == base["events"], "tracekit and the baseline disagree on the prefix"
        print(f"speed: tracekit {full['mb_s']:.1f} MB/s vs baseline {base['mb_s']:.1f} MB/s "
              f"= {full['mb_s'] / base['mb_s']:.1f}x (same prefix: {pre['mb_s'] / base['mb_s']:.1f}x)")
        held = full["rss_end_mb"] - full["rss_after_imports_mb"]
        print(f"memory: tracekit peak RSS {full['peak_rss_mb']:.0f} MiB for a {full['mb']:.0f} MB file "
              f"({full['peak_rss_mb'] * 1.048576 / full['mb']:.2f} x file size): "
              f"{full['rss_after_imports_mb']:.0f} MiB interpreter and libraries, {held:.0f} MiB held by "
              f"the result tables ({full['output_mb']:.0f} MiB of Arrow buffers, some all-null and never "
              f"touched), {full['peak_rss_mb'] - full['rss_end_mb']:.0f} MiB working set; baseline "
              f"{base['peak_rss_mb'] * 1.048576 / base['mb']:.1f} x its input")


if __name__ == "__main__":
    main()
