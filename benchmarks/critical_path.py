"""Critical path at scale: a synthetic 8-rank GPU job of about 1 M activities (CPU operators launching
kernels, NCCL all-reduces matched across ranks), timed end to end — dependency graph, binding edges,
every iteration's critical path and one what-if replay — against networkx's DAG longest path on the same
graph (the usual Python tool), in the same run.

    python benchmarks/critical_path.py [--activities 1000000] [--no-baseline]

Then the what-if grid of issue 13: 3 line rates x 3 compressions x 3 worker counts on the same job.

Targets: critical path on 1 M activities in <= 5 s (issue 5), >= 1 M graph nodes per second and the grid in
<= 5 s (issue 13).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import polars as pl
import pyarrow as pa

from tracekit.analysis import critical_path, dag, iterations, replay, whatif
from tracekit.model import schema

NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def job(activities: int, ranks: int = 8, steps: int = 16, buckets: int = 20, seed: int = 0
        ) -> tuple[pa.Table, pa.Table, pl.DataFrame]:
    """Events of the job (one table), its ranks table and the members of its collective instances."""
    rng = np.random.default_rng(seed)
    per_step = max(1, activities // (ranks * steps * 2))  # kernels per step and rank (+ as many CPU ops)
    cols: dict[str, list] = {k: [] for k in ("rank", "lane", "kind", "name", "cat", "start_ns", "dur_ns", "device",
                                             "stream", "correlation", "collective_id")}
    members = {"rank": [], "collective_id": [], "instance": []}

    def add(rank, lane, kind, name, cat, s, d, dev=None, stream=None, corr=None, cid=None):
        for k, v in zip(cols, (rank, lane, kind, name, cat, s, d, dev, stream, corr, cid), strict=True):
            cols[k].append(v)

    for r in range(ranks):
        t = 1_700_000_000_000_000_000
        corr = 1
        cid = 0
        gpu = t
        comm = t
        for step in range(steps):
            step_row = len(cols["name"])
            add(r, "cpu/tid 1", "annotation", f"ProfilerStep#{step}", "user_annotation", t, 1, None, None, None, None)
            step_start = t
            cpu_ops = rng.integers(3_000, 9_000, per_step)
            kernels = rng.integers(2_000, 12_000, per_step)
            ready = np.linspace(0, per_step - 1, buckets).astype(int)
            b = 0
            for i in range(per_step):
                add(r, "cpu/tid 1", "cpu_op", "aten::mm", "cpu_op", t, int(cpu_ops[i]))
                add(r, "cpu/tid 1", "runtime", "cudaLaunchKernel", "cuda_runtime", t + 500, 1_000, None, None, corr)
                gpu = max(gpu, t + 3_000)
                add(r, "gpu0/stream7", "compute", "gemm", "kernel", gpu, int(kernels[i]), 0, 7, corr)
                gpu += int(kernels[i]) + 200
                corr += 1
                t += int(cpu_ops[i]) + 300
                if b < buckets and i == ready[b]:
                    add(r, "cpu/tid 1", "runtime", "cudaLaunchKernel", "cuda_runtime", t, 1_000, None, None, corr)
                    comm = max(comm, gpu) + 1_000 * r  # ranks arrive at different times
                    add(r, "gpu0/stream13", "comm", NCCL, "kernel", comm, 400_000, 0, 13, corr, cid)
                    members["rank"].append(r)
                    members["collective_id"].append(cid)
                    members["instance"].append(step * buckets + b)
                    comm += 400_000
                    corr += 1
                    cid += 1
                    b += 1
            t = max(t, comm) + 10_000
            cols["dur_ns"][step_row] = t - step_start
    events = schema.table(schema.EVENTS, cols)
    ranks_t = schema.table(schema.RANKS, {"rank": list(range(ranks)), "clock_offset_ns": [0] * ranks})
    m = pl.DataFrame(members, schema={"rank": pl.Int32, "collective_id": pl.Int64, "instance": pl.Int64})
    return events, ranks_t, m


def _collectives(events: pa.Table) -> pa.Table:
    """The collectives table of the job's NCCL kernels: 8-rank all-reduces of 25 MB buckets."""
    ev = pl.from_arrow(events.select(["rank", "collective_id", "start_ns", "dur_ns", "lane"])).filter(
        pl.col("collective_id").is_not_null())
    return schema.table(schema.COLLECTIVES, {
        "rank": ev["rank"].to_list(), "collective_id": ev["collective_id"].to_list(), "op": ["allreduce"] * ev.height,
        "bytes": [25 << 20] * ev.height, "nranks": [8] * ev.height, "start_ns": ev["start_ns"].to_list(),
        "end_ns": (ev["start_ns"] + ev["dur_ns"]).to_list(), "lane": ev["lane"].cast(pl.String).to_list(),
        "source": ["kineto-kernel"] * ev.height, "size_source": ["args"] * ev.height})


def networkx_longest(g: dag.Graph) -> float:
    import networkx as nx

    graph = nx.DiGraph()
    graph.add_weighted_edges_from(zip(g.src.tolist(), g.dst.tolist(), g.weight().tolist(), strict=True))
    t = time.perf_counter()
    nx.dag_longest_path_length(graph)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--activities", type=int, default=1_000_000)
    ap.add_argument("--no-baseline", action="store_true", help="skip networkx (it needs minutes and GBs)")
    args = ap.parse_args()
    print("generating ...", flush=True)
    events, ranks, members = job(args.activities)
    t0 = time.perf_counter()
    ev, it = iterations.assign(events)
    t1 = time.perf_counter()
    g = dag.build(ev, ranks, members)
    t2 = time.perf_counter()
    segs = critical_path.paths(g, it, ranks)
    t3 = time.perf_counter()
    summ = critical_path.summary(segs, it, ranks)
    ok = bool((summ["path_ns"] == summ["iteration_ns"]).all())
    times, rounds = replay.replay(g, g.weight())
    t4 = time.perf_counter()
    print(f"activities: {g.act.height:,}  nodes: {g.n_nodes:,}  edges: {g.src.size:,}  iterations: {summ.height}")
    print(f"iteration assignment     {t1 - t0:6.2f} s")
    print(f"dependency graph + bind  {t2 - t1:6.2f} s")
    print(f"critical paths           {t3 - t2:6.2f} s   (every path length equals its iteration time: {ok})")
    print(f"one replay               {t4 - t3:6.2f} s   ({rounds} rounds; reproduces the trace: "
          f"{bool(np.array_equal(times, g.node_time))})")
    total = t3 - t1
    print(f"critical path total      {total:6.2f} s   (target <= 5 s for 1 M activities; "
          f"{g.n_nodes / total / 1e6:.2f} M graph nodes per second, target >= 1)")
    t5 = time.perf_counter()
    model = whatif.build(ev, _collectives(ev), ranks, graph=g, line_rate_bps=100e9)
    t6 = time.perf_counter()
    grid = [whatif.Scenario(bandwidth_bps=r, compression=c, workers=w)
            for r in (25e9, 100e9, 400e9) for c in (1, 2, 4) for w in (8, 64, 256)]
    rows = whatif.sweep(model, grid)
    t7 = time.perf_counter()
    print(f"what-if model            {t6 - t5:6.2f} s   (sizes {model.sizes['measured']} measured)")
    print(f"what-if grid of {len(grid)}       {t7 - t6:6.2f} s   (3 rates x 3 compressions x 3 worker counts, "
          f"{len(grid) + 1} replays; target <= 5 s); iteration {rows['iteration_ns'].min() / 1e6:.1f}.."
          f"{rows['iteration_ns'].max() / 1e6:.1f} ms")
    if not args.no_baseline:
        base = networkx_longest(g)
        print(f"networkx dag_longest_path_length on the same graph: {base:.2f} s (graph building not counted); "
              f"tracekit graph + every path is {base / total:.1f}x faster")


if __name__ == "__main__":
    main()
