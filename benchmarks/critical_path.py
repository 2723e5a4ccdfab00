"""The dependency-graph engine at scale: a synthetic 8-rank GPU job of about 1 M activities (CPU operators launching
kernels, NCCL all-reduces matched across ranks) — the graph's build, its binding edges, every iteration's critical path,
replays and the what-if grid — with the engine (``tracekit/engine``, C) against the numpy paths it replaces
(``TRACEKIT_NO_EXTENSION=1``: lane rounds, numpy binding, a Python loop along the path), in the same run.

    python benchmarks/critical_path.py [--activities 1000000] [--repeat 3] [--networkx]

CPU times are the calling thread's (one core); the grid's is wall time on every core (its scenarios run on threads).

Targets (issue 40): replay and critical path >= 20 M graph nodes per second on one core; the what-if grid of 27
scenarios (3 line rates x 3 compressions x 3 worker counts) <= 0.5 s. Earlier (issues 5, 13): the critical path of
1 M activities <= 5 s, >= 1 M nodes/s; the grid <= 5 s.
"""

from __future__ import annotations

from tracekit import allocators

allocators.configure()  # as the command line does, before polars and Arrow load

import argparse  # noqa: E402
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
import pyarrow as pa  # noqa: E402

from tracekit.analysis import iterations  # noqa: E402
from tracekit.analysis.graph import critical_path, dag, replay, whatif  # noqa: E402
from tracekit.model import schema  # noqa: E402

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


def _best(fn, repeat: int) -> tuple[float, float, object]:
    """(best thread CPU s, best wall s, result) of ``repeat`` calls."""
    cpu, wall, out = math.inf, math.inf, None
    for _ in range(repeat):
        c, w = time.thread_time(), time.perf_counter()
        out = fn()
        cpu, wall = min(cpu, time.thread_time() - c), min(wall, time.perf_counter() - w)
    return cpu, wall, out


@contextlib.contextmanager
def numpy_paths():
    """The analysis without the engine, as where its extension is not built."""
    old = os.environ.get("TRACEKIT_NO_EXTENSION")
    os.environ["TRACEKIT_NO_EXTENSION"] = "1"
    try:
        yield
    finally:
        if old is None:
            del os.environ["TRACEKIT_NO_EXTENSION"]
        else:
            os.environ["TRACEKIT_NO_EXTENSION"] = old


def _fresh(g: dag.Graph) -> dag.Graph:
    """The graph without what replays and paths keep on it (plans, grids, label caches)."""
    return dataclasses.replace(g)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--activities", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each timed step (the best is reported)")
    ap.add_argument("--networkx", action="store_true", help="also time networkx's longest path (minutes, GBs)")
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} cores, load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}; engine "
          f"{'built' if dag.engine() is not None else 'NOT BUILT (both columns are numpy)'}", flush=True)
    print("generating ...", flush=True)
    events, ranks, members = job(args.activities)
    ev, it = iterations.assign(events)
    rows: list[tuple[str, float, float, str]] = []

    def report(name: str, engine_s: float, numpy_s: float, nodes: int | None) -> None:
        rate = f"{nodes / engine_s / 1e6:7.1f} M nodes/s" if nodes else ""
        rows.append((name, engine_s, numpy_s, rate))
        print(f"{name:44s} {engine_s:8.3f} s {rate:18s} numpy {numpy_s:8.3f} s  ({numpy_s / engine_s:5.1f}x)",
              flush=True)

    # the graph's build (its binding edges included), with and without the engine
    c_build, _, g = _best(lambda: dag.build(ev, ranks, members), args.repeat)
    with numpy_paths():
        n_build, _, g_np = _best(lambda: dag.build(ev, ranks, members), 1)
    assert np.array_equal(g.binding, g_np.binding) and np.array_equal(g.slack, g_np.slack)
    n = g.n_nodes
    print(f"activities: {g.act.height:,}  nodes: {n:,}  edges: {g.src.size:,}", flush=True)
    report("graph build (one thread's CPU)", c_build, n_build, n)
    c_bind, _, _ = _best(lambda: dag.bind(g.src, g.dst, g.lag, g.node_time), args.repeat)
    with numpy_paths():
        n_bind, _, _ = _best(lambda: dag.bind(g.src, g.dst, g.lag, g.node_time), 1)
    report("  of it: binding edges and slack", c_bind, n_bind, n)
    # every iteration's critical path (each path's length equals its iteration time)
    c_paths, _, segs = _best(lambda: critical_path.paths(_fresh(g), it, ranks), args.repeat)
    with numpy_paths():
        n_paths, _, segs_np = _best(lambda: critical_path.paths(_fresh(g), it, ranks), 1)
    assert segs.equals(segs_np)
    summ = critical_path.summary(segs, it, ranks)
    ok = bool((summ["path_ns"] == summ["iteration_ns"]).all())
    report(f"critical paths of {summ.height} iterations", c_paths, n_paths, None)
    report("critical path (binding + every path)", c_bind + c_paths, n_bind + n_paths, n)
    # replays: the first plans the graph (Kahn's order), later ones are one sweep each
    w = g.weight()
    c_first, _, (times, _) = _best(lambda: replay.replay(_fresh(g), w), args.repeat)
    c_again, _, _ = _best(lambda: replay.replay(g, w), args.repeat)
    with numpy_paths():
        n_replay, _, (times_np, rounds) = _best(lambda: replay.replay(_fresh(g), w), 1)
    assert np.array_equal(times, times_np) and np.array_equal(times, g.node_time)
    report("one replay, the graph's first (plan + sweep)", c_first, n_replay, n)
    report(f"  a later replay (sweep; numpy: {rounds} lane rounds)", c_again, n_replay, n)
    # the what-if grid: a new model each time, so that nothing of the last run's is kept
    grid = [whatif.Scenario(bandwidth_bps=r, compression=c, workers=k)
            for r in (25e9, 100e9, 400e9) for c in (1, 2, 4) for k in (8, 64, 256)]
    colls = _collectives(ev)

    t = time.perf_counter()
    model = whatif.build(ev, colls, ranks, graph=_fresh(g), line_rate_bps=100e9)
    t_model = time.perf_counter() - t
    best_grid, out = math.inf, None
    for _ in range(args.repeat):
        m = whatif.build(ev, colls, ranks, graph=_fresh(g), line_rate_bps=100e9)
        t = time.perf_counter()
        out = whatif.sweep(m, grid)
        best_grid = min(best_grid, time.perf_counter() - t)
    with numpy_paths():
        m = whatif.build(ev, colls, ranks, graph=_fresh(g), line_rate_bps=100e9)
        t = time.perf_counter()
        out_np = whatif.sweep(m, grid)
        n_grid = time.perf_counter() - t
    assert out.equals(out_np)
    print(f"what-if model {t_model:.2f} s wall (sizes {model.sizes['measured']} measured); the grid's predictions "
          f"{out['iteration_ns'].min() / 1e6:.1f}..{out['iteration_ns'].max() / 1e6:.1f} ms, the same with numpy",
          flush=True)
    report(f"what-if grid of {len(grid)} ({len(grid) + 1} replays, wall)", best_grid, n_grid, None)
    print(f"\nevery path length equals its iteration time: {ok}; the unchanged replay reproduces the trace: True; "
          "engine and numpy give the same graph, paths, replays and grid: True")
    cp = c_bind + c_paths
    print(f"targets: replay >= 20 M nodes/s on one core: first {n / c_first / 1e6:.1f} M, later "
          f"{n / c_again / 1e6:.1f} M; critical path >= 20 M nodes/s: {n / cp / 1e6:.1f} M; grid <= 0.5 s: "
          f"{best_grid:.2f} s (load average at the end {os.getloadavg()[0]:.1f})")
    if args.networkx:
        base = networkx_longest(g)
        print(f"networkx dag_longest_path_length on the same graph: {base:.2f} s (graph building not counted)")


if __name__ == "__main__":
    main()
