"""The idle split (tracekit/analysis/idle.py): host-bound + sync + other = the breakdown's idle_ns to the nanosecond,
with hand-computed gaps on generated traces, null on CPU-only ranks, and on real GPU traces."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest

from tests import kineto_traces as kt
from tracekit.analysis import idle
from tracekit.analysis.pipeline import analyse
from tracekit.loading import traceset

MS = kt.MS
T0 = kt.EPOCH_NS


def _analyse(*paths: Path):
    return analyse(traceset.load([str(p) for p in paths], use_cache=False))


def _frame(t: pa.Table) -> pl.DataFrame:
    out = pl.from_arrow(t)
    assert isinstance(out, pl.DataFrame)
    return out


def _assert_adds_up(a) -> pl.DataFrame:
    """Every known split adds up to its window's idle_ns, which is the breakdown's."""
    i = _frame(a.idle_breakdown)
    b = _frame(a.breakdown).select("rank", "start_ns", pl.col("idle_ns").alias("b_idle"))
    j = i.join(b, on=["rank", "start_ns"], how="inner")
    assert j.height == i.height == b.height
    assert (j["idle_ns"] == j["b_idle"]).all()
    known = j.filter(pl.col("host_bound_ns").is_not_null())
    assert (known["host_bound_ns"] + known["sync_ns"] + known["other_ns"] == known["idle_ns"]).all()
    assert (known["host_bound_ns"] >= 0).all() and (known["sync_ns"] >= 0).all() and (known["other_ns"] >= 0).all()
    return j


def three_kinds(path: Path) -> Path:
    """One GPU rank, two steps, with a gap of every kind (times from T0, ms):

    step 1 [0, 20): launches A@0.5, B@1.5, C@6, D@7; cudaStreamSynchronize [2, 4.5), cudaDeviceSynchronize
    [8.5, 10.2). Kernels A [1, 3), B [4, 5), C [6.5, 8), D [9, 10). Step 2 [20, 30): launch E@20.1, E [21, 22).

    Window 1 is [1, 21) (first device activity of each step): gaps [3, 4) sync (B was launched before it
    began, the host sat in cudaStreamSynchronize), [5, 6.5) host-bound (C launched at 6), [8, 9) half sync
    (cudaDeviceSynchronize from 8.5), half other, and [10, 21) host-bound (E launched at 20.1): host-bound
    12.5 ms, sync 1.5 ms, other 0.5 ms = idle 14.5 ms. Window 2 is [21, 22): no idle.
    """
    def launch(at: float, corr: int) -> kt.Ev:
        return kt.Ev("cudaLaunchKernel", "cuda_runtime", T0 + int(at * MS), 5_000, tid=1, args={"correlation": corr})

    def kernel(name: str, s: float, e: float, corr: int) -> kt.Ev:
        return kt.Ev(name, "kernel", T0 + int(s * MS), int((e - s) * MS), device=0, stream=7,
                     args={"correlation": corr})

    evs = [
        kt.Ev("ProfilerStep#1", "user_annotation", T0, 20 * MS, tid=1),
        kt.Ev("ProfilerStep#2", "user_annotation", T0 + 20 * MS, 10 * MS, tid=1),
        launch(0.5, 1), launch(1.5, 2), launch(6, 3), launch(7, 4), launch(20.1, 5),
        kt.Ev("cudaStreamSynchronize", "cuda_runtime", T0 + 2 * MS, 2_500_000, tid=1),
        kt.Ev("cudaDeviceSynchronize", "cuda_runtime", T0 + 8_500_000, 1_700_000, tid=1),
        kernel("A", 1, 3, 1), kernel("B", 4, 5, 2), kernel("C", 6.5, 8, 3), kernel("D", 9, 10, 4),
        kernel("E", 21, 22, 5),
    ]
    return kt.write(path, evs, rank=0, world_size=1)


def test_every_kind_of_gap_by_hand(tmp_path: Path) -> None:
    a = _analyse(three_kinds(tmp_path / "rank0.json"))
    j = _assert_adds_up(a).sort("iteration")
    first, second = j.row(0, named=True), j.row(1, named=True)
    assert first["idle_ns"] == 14_500_000
    assert (first["host_bound_ns"], first["sync_ns"], first["other_ns"]) == (12_500_000, 1_500_000, 500_000)
    assert first["gaps"] == 4 and first["device"] is True
    assert (second["idle_ns"], second["host_bound_ns"], second["sync_ns"], second["other_ns"]) == (0, 0, 0, 0)
    per = idle.per_rank(a.idle_breakdown).row(0, named=True)
    assert per["host_bound_share"] == pytest.approx(12.5 / 14.5)
    assert per["sync_share"] == pytest.approx(1.5 / 14.5)
    job = idle.job(a.idle_breakdown)
    assert job["idle_ns"] == 14_500_000 and job["other_ns"] == 500_000


def test_gpu_job_idle_tail_is_host_bound(tmp_path: Path) -> None:
    """kt.gpu_iteration: each window but the last ends with 2.5 ms idle before the next step's first kernel,
    which the CPU launched 1 ms into that step — after the gap began."""
    p0 = kt.write(tmp_path / "rank0.json", kt.gpu_job(3), rank=0)
    p1 = kt.write(tmp_path / "rank1.json", kt.gpu_job(3, t0=kt.EPOCH_NS + 300_000), rank=1)
    a = _analyse(p0, p1)
    j = _assert_adds_up(a).sort(["rank", "iteration"])
    assert j["idle_ns"].to_list() == [2_500_000, 2_500_000, 0] * 2
    assert j["host_bound_ns"].to_list() == [2_500_000, 2_500_000, 0] * 2
    assert j["sync_ns"].sum() == 0 and j["other_ns"].sum() == 0


def test_cpu_only_ranks_are_not_applicable(tmp_path: Path) -> None:
    paths = [kt.write(tmp_path / f"rank{r}.json", evs, rank=r, world_size=2, backend="gloo")
             for r, evs in kt.gloo_job(2, steps=3, loader_ns={1: 3 * MS}).items()]
    a = _analyse(*paths)
    j = _assert_adds_up(a)
    assert j["host_bound_ns"].null_count() == j.height and j["sync_ns"].null_count() == j.height
    assert j["other_ns"].null_count() == j.height and j["gaps"].null_count() == j.height
    assert not j["device"].any()
    per = idle.per_rank(a.idle_breakdown)
    assert per["host_bound_share"].null_count() == per.height
    assert idle.job(a.idle_breakdown)["host_bound_ns"] is None


def test_sample_is_cpu_only() -> None:
    a = analyse(traceset.load([str(Path(__file__).resolve().parents[1] / "samples" / "ddp-gloo")], use_cache=False))
    j = _assert_adds_up(a)
    assert j.height == 10 and j["host_bound_ns"].null_count() == 10


def test_cuda_sync_records_count_as_sync(tmp_path: Path) -> None:
    """Kineto's cuda_sync records (on the device rows, timed as the host's wait) cover idle like the call."""
    evs = [
        kt.Ev("ProfilerStep#1", "user_annotation", T0, 10 * MS, tid=1),
        kt.Ev("ProfilerStep#2", "user_annotation", T0 + 10 * MS, 10 * MS, tid=1),
        kt.Ev("cudaLaunchKernel", "cuda_runtime", T0 + 100_000, 5_000, tid=1, args={"correlation": 1}),
        kt.Ev("cudaLaunchKernel", "cuda_runtime", T0 + 200_000, 5_000, tid=1, args={"correlation": 2}),
        kt.Ev("cudaLaunchKernel", "cuda_runtime", T0 + 10_100_000, 5_000, tid=1, args={"correlation": 3}),
        kt.Ev("A", "kernel", T0 + MS, MS, device=0, stream=7, args={"correlation": 1}),
        kt.Ev("B", "kernel", T0 + 4 * MS, MS, device=0, stream=7, args={"correlation": 2}),
        kt.Ev("Stream Sync", "cuda_sync", T0 + 2 * MS, 3 * MS, device=0, stream=7, args={"stream": 7}),
        kt.Ev("C", "kernel", T0 + 11 * MS, MS, device=0, stream=7, args={"correlation": 3}),
    ]
    a = _analyse(kt.write(tmp_path / "rank0.json", evs, rank=0, world_size=1))
    first = _assert_adds_up(a).sort("iteration").row(0, named=True)
    # [2, 4) covered by the sync record (B launched before); [5, 11) host-bound (C launched at 10.1)
    assert (first["idle_ns"], first["sync_ns"], first["host_bound_ns"], first["other_ns"]) == \
        (8 * MS, 2 * MS, 6 * MS, 0)


@pytest.mark.parametrize("rel", ["hta/nccl_parser_config/nccl_data.json.gz", "hta/trace_filter",
                                 "hta/negative_queue_length_values_check/rank0.json.gz",
                                 "hta/trace_diff/control/control.json.gz"])
def test_real_gpu_traces_add_up(shared_data: Path, rel: str) -> None:
    path = shared_data / rel
    if not path.exists():
        pytest.skip(f"{rel} is absent")
    a = analyse(traceset.load([str(path)], use_cache=False))
    j = _assert_adds_up(a)
    assert j["device"].all()
    known = j.filter(pl.col("host_bound_ns").is_not_null())
    assert known.height == j.height  # every window of a GPU rank is split
    assert known["idle_ns"].sum() > 0
    assert known["host_bound_ns"].sum() + known["sync_ns"].sum() > 0  # real traces do wait on their hosts


def test_earliest_launch_per_start_is_the_same_on_the_packed_key_and_on_the_pair() -> None:
    """Grouping on one packed (rank, start) key gives the pair's grouping, order, nulls and types; starts too far
    apart for the key take the pair."""
    import numpy as np
    import polars as pl

    from tracekit.analysis.idle import _earliest_per_start

    def by_pair(a: pl.DataFrame) -> pl.DataFrame:
        return (a.group_by(["rank", "start_ns"]).agg(pl.col("launch_ns").min())
                .with_columns(pl.col("rank").cast(pl.Int64)).sort(["rank", "start_ns"]))

    rng = np.random.default_rng(3)
    for scale in (1, 10**6, 10**17):  # the last does not fit the key
        n = 200
        launch = pl.Series(rng.integers(0, 100, n)).set(pl.Series(rng.random(n) < 0.3), None)
        a = pl.DataFrame({"rank": rng.integers(0, 4, n).astype(np.int32), "start_ns": rng.integers(-20, 20, n) * scale,
                          "launch_ns": launch}, schema={"rank": pl.Int32, "start_ns": pl.Int64, "launch_ns": pl.Int64})
        got = _earliest_per_start(a)
        assert got.equals(by_pair(a)) and got.schema == by_pair(a).schema


def test_host_bound_gaps_are_the_same_in_numpy_and_in_polars() -> None:
    """The packed numpy path (:func:`idle._host_bound`) finds the gaps the polars join finds, with ties of starts and
    gap ends, activities without a launch in the trace, calls of another rank, and gaps after the last activity."""
    import numpy as np

    from tracekit.analysis import attribution

    rng = np.random.default_rng(7)
    for trial in range(6):
        n = 400
        kind = rng.choice(["runtime", "compute", "memory", "cpu_op"], n)
        dev = np.where(np.isin(kind, ["compute", "memory"]), 0, -1)
        corr = rng.integers(0, 40, n)
        corr_null = rng.random(n) < 0.15
        events = pa.table({
            "rank": pa.array(rng.integers(0, 3, n), pa.int32()),
            "lane": pa.array(rng.choice(["s7", "s8", "t1"], n)).dictionary_encode(),
            "kind": pa.array(kind).dictionary_encode(),
            "start_ns": pa.array(rng.integers(0, 60, n) * (1 + trial * 1000), pa.int64()),
            "dur_ns": pa.array(rng.integers(0, 5, n), pa.int64()),
            "device": pa.array(dev, pa.int32(), mask=dev < 0),
            "correlation": pa.array(corr, pa.int64(), mask=corr_null),
        })
        act = attribution.activity(events)
        g = 300
        g_rank = rng.integers(0, 4, g).astype(np.int64)  # rank 3 has no activity
        g_end = rng.integers(-5, 70, g) * (1 + trial * 1000)
        g_start = g_end - rng.integers(0, 30, g) * (1 + trial * 1000)
        got = idle._host_bound(events, act, g_rank, g_start, g_end)
        assert got is not None
        want = idle._host_bound_joined(events, act, g_rank, g_start, g_end)
        assert got.tolist() == want.tolist()
        assert 0 < got.sum() < g
