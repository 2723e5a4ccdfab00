"""Speed and memory of the NCCL debug log parser on a big, COLL-heavy log.

Generates a realistic log of a 16-rank job (2 nodes x 8 GPUs, NCCL 2.21, torchrun ``[defaultN]:``
prefixes, interleaved output, INIT/NET/transport lines, DDP-like gradient buckets, a few broadcasts
and all-gathers, TUNING lines from rank 0) of ``--size-mb`` MB in a temporary directory, then runs in
separate child processes (so each peak RSS is its own):

* ``tracekit``: :func:`tracekit.parsers.nccl.parse`;
* ``baseline``: the obvious parser -- ``for line in open(...)`` and ``re.match`` of the anchor + the
  COLL regex of FORMATS.md 2.4, appending each match's fields to a list.

Prints MB/s (wall and CPU time, each child pinned to one core) and peak RSS of both, and the speed
ratio. ``--ranks 1`` gives the log of rank 0 alone (``NCCL_DEBUG_FILE`` per process), where every COLL
line is followed by its TUNING line. Usage::

    python benchmarks/nccl_parse.py [--size-mb 300] [--ranks 16] [--gzip] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import subprocess
import sys
import tempfile
import time

BASELINE_RE = re.compile(
    r".*?(?P<host>[^\s:\[\]]*):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] NCCL INFO "
    r"(?P<op>[A-Za-z]+): opCount (?P<opcount>[0-9a-fA-F]+) sendbuff (?P<sendbuff>\S+) "
    r"recvbuff (?P<recvbuff>\S+) "
    r"count (?P<count>\d+) datatype (?P<dtype>\d+) op (?P<redop>\d+) root (?P<root>-?\d+) comm (?P<comm>\S+) "
    r"\[nranks=(?P<nranks>\d+)\] stream (?P<stream>\S+)(?P<rest>.*)$")


def generate(path: str, size_mb: float, ranks: int = 16, gpus_per_node: int = 8, seed: int = 0) -> int:
    """Write the log; returns its size in bytes."""
    rng = random.Random(seed)
    target = int(size_mb * 1e6)
    procs = []
    for g in range(ranks):
        node = g // gpus_per_node
        host = f"gpu-node-{node + 1:02d}"
        pid = 51000 + 17 * g
        dev = g % gpus_per_node
        procs.append({
            "g": g, "host": host, "pid": pid, "dev": dev, "bus": f"{0x1b + 0x20 * dev:x}000",
            "comm": f"0x55d{rng.randrange(1 << 36):09x}", "stream": f"0x55d{rng.randrange(1 << 36):09x}",
            "pre": f"[default{g}]:{host}:{pid}:{pid} [{dev}] NCCL INFO ",
        })
    comm_id = "0x7a3f09c2e1d44b10"
    written = 0
    with open(path, "w", buffering=1 << 22) as f:
        def put(lines: list[str]) -> None:
            nonlocal written
            text = "\n".join(lines) + "\n"
            f.write(text)
            written += len(text)

        put(["NCCL version 2.21.5+cuda12.4"])
        for p in procs:
            pre = p["pre"]
            r = p["g"]
            lines = [pre + "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB eth0:10.8.0.21<0>",
                     pre + "Using network IB",
                     pre + (f"ncclCommInitRank comm {p['comm']} rank {r} nranks {ranks} cudaDev {p['dev']} "
                            f"nvmlDev {p['dev']} busId {p['bus']} commId {comm_id} - Init START")]
            nxt = procs[(r + 1) % ranks]
            for ch in range(16):
                if nxt["host"] == p["host"]:
                    lines.append(pre + f"Channel {ch:02d}/0 : {r}[{p['dev']}] -> {nxt['g']}[{nxt['dev']}] "
                                 "via P2P/CUMEM/read")
                else:
                    lines.append(pre + f"Channel {ch:02d}/0 : {r}[{p['dev']}] -> {nxt['g']}[{nxt['dev']}] "
                                 f"[send] via NET/IB/{ch % 2}/GDRDMA")
            lines.append(pre + (f"ncclCommInitRank comm {p['comm']} rank {r} nranks {ranks} "
                                f"cudaDev {p['dev']} nvmlDev {p['dev']} busId {p['bus']} commId {comm_id} "
                                "- Init COMPLETE"))
            put(lines)
        # training: per step 24 gradient buckets (allreduce, grouped by 2), an allgather and a broadcast
        buckets = [rng.choice((6553600, 26214400, 1048576, 65536)) for _ in range(24)]
        opcount = 0
        buf = "0x7f1c00000000"
        while written < target:
            calls = [("AllReduce", c, 7) for c in buckets] + [("AllGather", 524288, 9), ("Broadcast", 1, 4)]
            block: list[str] = []
            for g0 in range(0, len(calls), 2):
                group = calls[g0:g0 + 2]
                order = list(range(ranks))
                rng.shuffle(order)
                for r in order:
                    p = procs[r]
                    for op, count, dt in group:
                        block.append(f"{p['pre']}{op}: opCount {opcount:x} sendbuff {buf} recvbuff {buf} "
                                     f"count {count} datatype {dt} op 0 root 0 comm {p['comm']} "
                                     f"[nranks={ranks}] stream {p['stream']}")
                    if r == 0:
                        for op, count, dt in group:
                            nbytes = count * {7: 4, 9: 2, 4: 8}[dt]
                            algo, proto = ("RING", "SIMPLE") if nbytes > 65536 else ("TREE", "LL")
                            block.append(f"{p['pre']}{op}: {nbytes} Bytes -> Algo {algo} proto {proto} "
                                         "channel{Lo..Hi}={0..15}")
                opcount += 1
            put(block)
    return written


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def child_parse(path: str) -> dict:
    import pyarrow as pa

    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    from tracekit.parsers import nccl

    c0, t0 = _cpu(), time.perf_counter()
    pf = nccl.parse(path)
    dt, cpu = time.perf_counter() - t0, _cpu() - c0
    return {"seconds": dt, "cpu": cpu, "rows": pf.collectives.num_rows, "topology": pf.topology.num_rows,
            "tuned": pf.collectives.column("algorithm").null_count, "diagnostics": len(pf.diagnostics),
            "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}


def child_baseline(path: str) -> dict:
    c0, t0 = _cpu(), time.perf_counter()
    rows = []
    with open(path, errors="replace") as f:
        for line in f:
            m = BASELINE_RE.match(line)
            if m:
                rows.append(m.groups())
    dt, cpu = time.perf_counter() - t0, _cpu() - c0
    return {"seconds": dt, "cpu": cpu, "rows": len(rows),
            "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}


def run_child(kind: str, path: str) -> dict:
    """Run one measurement in a fresh interpreter pinned to one core (one polars/Arrow thread)."""
    env = dict(os.environ, POLARS_MAX_THREADS="1", OMP_NUM_THREADS="1")
    cpu = sorted(os.sched_getaffinity(0))[0] if hasattr(os, "sched_getaffinity") else None

    def pin() -> None:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})

    out = subprocess.run([sys.executable, __file__, "--child", kind, path], check=True, capture_output=True,
                         text=True, env=env, preexec_fn=pin)
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(name: str, mb: float, r: dict, extra: str = "") -> None:
    print(f"{name:<10}: {r['seconds']:6.2f} s wall {mb / r['seconds']:7.1f} MB/s | {r['cpu']:6.2f} s CPU "
          f"{mb / r['cpu']:7.1f} MB/s | peak RSS {r['maxrss_kb'] / 1024:6.0f} MiB {extra}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=float, default=300.0)
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--gzip", action="store_true", help="also time a gzip copy of the log")
    ap.add_argument("--keep", help="write the log into this directory and keep it")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, path = args.child
        print(json.dumps(child_parse(path) if kind == "parse" else child_baseline(path)))
        return
    tmp = None
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        d = args.keep
    else:
        tmp = tempfile.TemporaryDirectory(prefix="nccl-bench-")
        d = tmp.name
    try:
        path = os.path.join(d, "nccl_16ranks.log")
        t0 = time.perf_counter()
        size = generate(path, args.size_mb, args.ranks)
        took = time.perf_counter() - t0
        print(f"generated {size / 1e6:.0f} MB ({args.ranks} ranks) in {took:.1f} s: {path}")
        mb = size / 1e6
        print("one core each (pinned, POLARS_MAX_THREADS=1); CPU = user+sys of the child, robust to a busy "
              "machine")
        res = run_child("parse", path)
        report("tracekit", mb, res, f"| {res['rows']} collectives, {res['topology']} links, "
               f"{res['rows'] - res['tuned']} with algorithm")
        if args.gzip:
            import gzip
            import shutil
            gz = path + ".gz"
            with open(path, "rb") as src, gzip.open(gz, "wb", compresslevel=3) as dst:
                shutil.copyfileobj(src, dst, 1 << 22)
            rg = run_child("parse", gz)
            report("tracekit.gz", mb, rg, "(MB of uncompressed log)")
        if not args.no_baseline:
            base = run_child("baseline", path)
            report("baseline", mb, base, f"| {base['rows']} COLL lines")
            print(f"speed-up  : {base['seconds'] / res['seconds']:.1f}x wall, "
                  f"{base['cpu'] / res['cpu']:.1f}x CPU over line-by-line re.match")
            if base["rows"] != res["rows"]:
                print(f"note: row counts differ ({res['rows']} vs {base['rows']})")
    finally:
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    main()
