"""Top ops per attribution class (tracekit/analysis/top_ops.py): hand-computed on generated GPU and CPU traces, and
invariants on real GPU traces."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from tests import kineto_traces as kt
from tracekit.analysis import top_ops
from tracekit.analysis.pipeline import analyse
from tracekit.loading import traceset

MS = kt.MS
T0 = kt.EPOCH_NS
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def _frame(t) -> pl.DataFrame:
    out = pl.from_arrow(t)
    assert isinstance(out, pl.DataFrame)
    return out


def _row(t: pl.DataFrame, cls: str, name: str) -> dict:
    rows = t.filter((pl.col("class") == cls) & (pl.col("name") == name)).to_dicts()
    assert len(rows) == 1, (cls, name, t)
    return rows[0]


def test_gpu_job_by_hand(tmp_path: Path) -> None:
    """kt.gpu_iteration, 3 steps: sgemm [2, 6) = 3 ms compute + 1 ms overlapped; add_kernel 1 ms compute; NCCL
    [5, 8) = 1 ms overlapped + 2 ms exposed; the copy 0.5 ms memory — per iteration."""
    a = analyse(traceset.load([str(kt.write(tmp_path / "r0.json", kt.gpu_job(3), rank=0, world_size=1))],
                              use_cache=False))
    t = _frame(a.top_ops)
    assert set(t["rank"]) == {0}
    sgemm = _row(t, "compute", "sgemm_kernel")
    assert (sgemm["calls"], sgemm["time_ns"], sgemm["per_iteration_ns"], sgemm["kind"]) == (3, 9 * MS, 3 * MS,
                                                                                           "compute")
    assert sgemm["class_share"] == pytest.approx(0.75) and sgemm["rank_in_class"] == 1
    add = _row(t, "compute", "add_kernel")
    assert (add["time_ns"], add["class_share"], add["rank_in_class"]) == (3 * MS, pytest.approx(0.25), 2)
    assert _row(t, "overlapped", "sgemm_kernel")["time_ns"] == 3 * MS
    nccl_o, nccl_e = _row(t, "overlapped", NCCL), _row(t, "exposed_comm", NCCL)
    assert (nccl_o["time_ns"], nccl_o["class_share"], nccl_o["kind"]) == (3 * MS, 1.0, "comm")
    assert (nccl_e["time_ns"], nccl_e["class_share"]) == (6 * MS, 1.0)
    mem = _row(t, "memory", "Memcpy DtoH (Device -> Pageable)")
    assert (mem["time_ns"], mem["calls"], mem["kind"]) == (1_500_000, 3, "memory")
    assert t.height == 6  # nothing else: no CPU op on a GPU rank, no copy under a kernel
    # every class's time, per rank, matches the breakdown
    b = _frame(a.breakdown)
    for cls in top_ops.CLASSES:
        share = t.filter(pl.col("class") == cls)
        assert (share["time_ns"] / share["class_share"]).round().cast(pl.Int64).unique().to_list() == \
            [b[f"{cls}_ns"].sum()]
    job = top_ops.job_level(a.top_ops, a.breakdown, n=1)
    # overlapped: sgemm and NCCL tie at 3 ms, the name decides
    assert job["name"].to_list() == ["sgemm_kernel", NCCL, NCCL, "Memcpy DtoH (Device -> Pageable)"]
    totals = _frame(a.op_totals)
    assert _row(totals.with_columns(pl.lit("x").alias("class")), "x", "sgemm_kernel")["time_ns"] == 12 * MS
    assert _row(totals.with_columns(pl.lit("x").alias("class")), "x", NCCL)["time_ns"] == 9 * MS


def test_cpu_only_rank_lists_top_level_operators(tmp_path: Path) -> None:
    """A gloo rank: aten::linear [0, 4) ⊃ aten::addmm [0.5, 3.5), aten::relu [4, 5) on the main thread, the
    all-reduce [3, 8) on a worker; step 2 has aten::linear [10, 14). Window 1 = [0, 10): linear 3 ms compute +
    1 ms overlapped, relu 1 ms overlapped, the all-reduce 2 ms overlapped + 3 ms exposed; window 2: linear
    4 ms compute. The nested addmm is folded into linear."""
    def op(name: str, s: float, e: float, tid: int = 1, cat: str = "cpu_op") -> kt.Ev:
        return kt.Ev(name, cat, T0 + int(s * MS), int((e - s) * MS), tid=tid, pid=7)

    evs = [op("ProfilerStep#1", 0, 10, cat="user_annotation"), op("ProfilerStep#2", 10, 20, cat="user_annotation"),
           op("aten::linear", 0, 4), op("aten::addmm", 0.5, 3.5), op("aten::relu", 4, 5),
           op("gloo:all_reduce", 3, 8, tid=2, cat="user_annotation"), op("aten::linear", 10, 14)]
    a = analyse(traceset.load([str(kt.write(tmp_path / "r0.json", evs, rank=0, world_size=1, backend="gloo"))],
                              use_cache=False))
    t = _frame(a.top_ops)
    assert "aten::addmm" not in t["name"].to_list()
    lin = _row(t, "compute", "aten::linear")
    assert (lin["time_ns"], lin["calls"], lin["kind"], lin["per_iteration_ns"]) == (7 * MS, 2, "cpu_op", 3_500_000)
    assert _row(t, "overlapped", "aten::linear")["time_ns"] == MS
    assert _row(t, "overlapped", "aten::relu")["time_ns"] == MS
    ar_o, ar_e = _row(t, "overlapped", "gloo:all_reduce"), _row(t, "exposed_comm", "gloo:all_reduce")
    assert (ar_o["time_ns"], ar_e["time_ns"], ar_e["kind"]) == (2 * MS, 3 * MS, "comm")
    b = _frame(a.breakdown).sort("iteration")
    assert b["compute_ns"].to_list() == [3 * MS, 4 * MS] and b["overlapped_ns"].to_list() == [2 * MS, 0]


@pytest.mark.parametrize("rel", ["hta/nccl_parser_config/nccl_data.json.gz", "hta/trace_filter",
                                 "hta/trace_diff/control/control.json.gz"])
def test_real_gpu_traces(shared_data: Path, rel: str) -> None:
    """Each class's instants are covered by the ops it lists: per rank, the ops of a class add up to at least the
    class's time (concurrent ops each count), and no op has more than the class."""
    path = shared_data / rel
    if not path.exists():
        pytest.skip(f"{rel} is absent")
    a = analyse(traceset.load([str(path)], use_cache=False))
    t = _frame(a.top_ops)
    b = _frame(a.breakdown)
    assert t.height and set(t["kind"]) <= {"compute", "comm", "memory"}
    assert (t["class_share"] <= 1 + 1e-9).all()
    for rank in b["rank"].unique().to_list():
        for cls in top_ops.CLASSES:
            total = int(b.filter(pl.col("rank") == rank)[f"{cls}_ns"].sum())
            ops = t.filter((pl.col("rank") == rank) & (pl.col("class") == cls))
            if cls == "overlapped":
                for kind in ("compute", "comm"):
                    assert ops.filter(pl.col("kind") == kind)["time_ns"].sum() >= total
            else:
                assert ops["time_ns"].sum() >= total
            if total == 0:
                assert ops.height == 0
    job = top_ops.job_level(a.top_ops, a.breakdown)
    assert job.filter(pl.col("class") == "exposed_comm")["kind"].unique().to_list() in ([], ["comm"])


def test_class_times_read_rows_of_a_rank_alike_in_any_order() -> None:
    """Intervals given rank by rank (slices) and shuffled (indices) get the same time per class."""
    import numpy as np

    from tracekit.analysis.top_ops import _class_times

    rng = np.random.default_rng(7)
    seg_rank = np.repeat(np.arange(3), 40)
    seg_start = np.concatenate([np.sort(rng.choice(10_000, 40, replace=False)) for _ in range(3)]).astype(np.int64)
    seg_len = rng.integers(1, 200, seg_rank.size).astype(np.int64)
    seg_code = rng.integers(-1, 4, seg_rank.size).astype(np.int64)
    segs = (seg_rank, seg_start, seg_len, seg_code)
    rank = np.sort(rng.integers(0, 4, 300))  # rank 3 has no segments
    start = rng.integers(0, 10_000, rank.size).astype(np.int64)
    end = start + rng.integers(0, 3_000, rank.size)
    by_rank = _class_times(segs, rank, start, end)
    shuffle = rng.permutation(rank.size)
    shuffled = _class_times(segs, rank[shuffle], start[shuffle], end[shuffle])
    assert (shuffled == by_rank[shuffle]).all()
    assert by_rank[rank == 3].sum() == 0 and by_rank.sum() > 0
