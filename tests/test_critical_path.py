"""Critical paths on traces whose true critical path is known, and on real traces."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import kineto_traces as kt
from tests.conftest import shared_data_dir
from tracekit.analysis import iterations
from tracekit.analysis.graph import critical_path, dag, replay
from tracekit.loading.traceset import load

MS = 1_000_000


def _members(coll) -> pl.DataFrame:
    """Instances by (op, bytes, ordinal): enough for these constructed traces."""
    c = pl.from_arrow(coll).sort(["rank", "start_ns"]).with_columns(
        pl.int_range(pl.len()).over(["rank", "op", "bytes"]).alias("k"))
    return c.with_columns(pl.struct(["op", "bytes", "k"]).rank("dense").cast(pl.Int64).alias("instance")).select(
        ["rank", "collective_id", "instance"])


def _analyse(tmp_path: Path, per_rank: dict[int, list]) -> tuple:
    for r, evs in per_rank.items():
        kt.write(tmp_path / f"rank{r}.json", evs, rank=r, world_size=len(per_rank), backend="gloo")
    ts = load([str(tmp_path)])
    ev, it = iterations.assign(ts.events)
    g = dag.build(ev, ts.ranks, _members(ts.collectives))
    return ts, ev, it, g


def test_slow_data_loader_on_rank_3_makes_everyone_wait_on_rank_3(tmp_path: Path) -> None:
    ts, _, it, g = _analyse(tmp_path, kt.gloo_job(4, 2, loader_ns={3: 30 * MS}))
    segs = critical_path.paths(g, it, ts.ranks)
    summ = critical_path.summary(segs, it, ts.ranks)
    assert (summ["path_ns"] == summ["iteration_ns"]).all()
    assert summ["most_waited_on"].to_list() == [3, 3]
    for i in (0, 1):
        s = segs.filter(pl.col("iteration") == i)
        waiting = s.filter(pl.col("label") == "waiting")
        # rank 3 arrives 29 ms after the others: all of it is on the path as "waiting on rank 3"
        assert waiting["waiting_on"].unique().to_list() == [3]
        assert waiting["dur_ns"].sum() == 29 * MS
        assert set(waiting["rank"].to_list()) == {3}
        # the loader of rank 3 is on the path
        assert s.filter((pl.col("rank") == 3) & pl.col("name").str.starts_with("enumerate(DataLoader)")).height
        assert s.filter(pl.col("label") == "transfer")["dur_ns"].sum() == 4 * MS


def test_no_straggler_no_waiting(tmp_path: Path) -> None:
    ts, _, it, g = _analyse(tmp_path, kt.gloo_job(2, 2))
    segs = critical_path.paths(g, it, ts.ranks)
    assert segs.filter(pl.col("label") == "waiting").height == 0
    summ = critical_path.summary(segs, it, ts.ranks)
    assert (summ["path_ns"] == summ["iteration_ns"]).all()


def test_sync_bound_single_rank(tmp_path: Path) -> None:
    t0 = kt.EPOCH_NS
    evs = [
        kt.Ev("ProfilerStep#1", "user_annotation", t0, 40 * MS),
        kt.Ev("aten::mm", "cpu_op", t0 + 1 * MS, MS // 10),
        kt.Ev("cudaLaunchKernel", "cuda_runtime", t0 + 1 * MS + 10_000, 5_000, args={"correlation": 1}),
        kt.Ev("aten::item", "cpu_op", t0 + 2 * MS, 30 * MS + 100_000),
        kt.Ev("cudaStreamSynchronize", "cuda_runtime", t0 + 2 * MS + 50_000, 30 * MS, args={"correlation": 2}),
        kt.Ev("aten::add", "cpu_op", t0 + 33 * MS, MS),
        kt.Ev("big_gemm", "kernel", t0 + 1 * MS + 20_000, 31 * MS, device=0, stream=7, args={"correlation": 1}),
    ]
    kt.write(tmp_path / "rank0.json", evs)
    ts = load([str(tmp_path)])
    ev, it = iterations.assign(ts.events)
    g = dag.build(ev, ts.ranks)
    segs = critical_path.paths(g, it, ts.ranks)
    summ = critical_path.summary(segs, it, ts.ranks)
    assert summ["path_ns"].to_list() == summ["iteration_ns"].to_list()
    # the kernel the CPU waited for is on the path, not the CPU's waiting
    assert summ["compute_share"][0] > 0.9
    assert segs.filter(pl.col("name") == "big_gemm")["dur_ns"].sum() == 31 * MS


def test_overlapped_communication_is_not_on_the_path(tmp_path: Path) -> None:
    t0 = kt.EPOCH_NS
    nccl = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
    evs = [
        kt.Ev("ProfilerStep#1", "user_annotation", t0, 40 * MS),
        kt.Ev("cudaLaunchKernel", "cuda_runtime", t0 + 10_000, 5_000, args={"correlation": 1}),
        kt.Ev("cudaLaunchKernel", "cuda_runtime", t0 + 20_000, 5_000, args={"correlation": 2}),
        kt.Ev("cudaLaunchKernel", "cuda_runtime", t0 + 30_000, 5_000, args={"correlation": 3}),
        kt.Ev("gemm", "kernel", t0 + 100_000, 10 * MS, device=0, stream=7, args={"correlation": 1}),
        kt.Ev(nccl, "kernel", t0 + 10 * MS + 200_000, 5 * MS, device=0, stream=13, args={"correlation": 3}),
        kt.Ev("gemm2", "kernel", t0 + 10 * MS + 150_000, 20 * MS, device=0, stream=7, args={"correlation": 2}),
    ]
    kt.write(tmp_path / "rank0.json", evs)
    ts = load([str(tmp_path)])
    ev, it = iterations.assign(ts.events)
    segs = critical_path.paths(dag.build(ev, ts.ranks), it, ts.ranks)
    assert segs.filter(pl.col("label") == "transfer").height == 0
    assert set(segs.filter(pl.col("label") == "compute")["name"].to_list()) == {"gemm", "gemm2"}


def test_unchanged_replay_reproduces_the_trace(tmp_path: Path) -> None:
    *_, g = _analyse(tmp_path, kt.gloo_job(3, 3, loader_ns={1: 7 * MS}))
    times, _ = replay.replay(g, g.weight())
    assert np.array_equal(times, g.node_time)


def test_replay_without_segment_offsets_gives_the_same_times(tmp_path: Path) -> None:
    """Spans so long that segment offsets would overflow int64 take a per-segment running max: same times;
    damaged timestamps years apart fall back to float64 instead of overflowing."""
    *_, g = _analyse(tmp_path, kt.gloo_job(3, 3, loader_ns={1: 7 * MS}))
    w = g.weight().copy()
    w[g.etype == dag.EDGE_TYPES.index("own")] //= 2
    expected, _ = replay.replay(g, w)
    # a graph with many segments: push the last node years later, so the offsets no longer fit
    far = dataclasses.replace(g, node_time=g.node_time.copy())
    far.node_time[-1] += 1 << 55
    assert replay.chains(far).seg.max() + 1 >= 4  # 32 * 2^55 * segments >= 2^62: no offsets
    times, _ = replay.replay(far, w)
    assert np.array_equal(times[:-1], expected[:-1])
    huge = dataclasses.replace(g, node_time=g.node_time.copy())
    huge.node_time[-1] += 1 << 60
    times, _ = replay.replay(huge, w)
    assert np.abs(times[:-1] - expected[:-1]).max() <= 1 << 10  # float64 over a 2^60 ns span


@pytest.mark.parametrize("rel", ["kineto-legacy/hta_critical_path__cuda_event_sync.json.gz",
                                 "hta/nccl_parser_config/nccl_data.json.gz", "hta/trace_filter"])
def test_real_traces(shared_data: Path, rel: str) -> None:
    ts = load([str(shared_data / rel)])
    ev, it = iterations.assign(ts.events)
    g = dag.build(ev, ts.ranks)
    times, _ = replay.replay(g, g.weight())
    assert np.array_equal(times, g.node_time)
    segs = critical_path.paths(g, it, ts.ranks)
    summ = critical_path.summary(segs, it, ts.ranks)
    assert summ.height == len(set(it.column("iteration").to_pylist()))
    assert (summ["path_ns"] == summ["iteration_ns"]).all()
    if "cuda_event_sync" in rel:
        assert int((g.etype == dag.EDGE_TYPES.index("sync")).sum()) == 3


def test_runs_merge_consecutive_segments_as_a_person_reads_the_path(tmp_path: Path) -> None:
    ts, _, it, g = _analyse(tmp_path, kt.gloo_job(4, 2, loader_ns={3: 30 * MS}))
    segs = critical_path.paths(g, it, ts.ranks)
    runs = critical_path.runs(segs)
    assert runs.height <= segs.height
    assert runs["segments"].sum() == segs.height
    for i in (0, 1):
        r = runs.filter(pl.col("iteration") == i)
        s = segs.filter(pl.col("iteration") == i)
        assert r["dur_ns"].sum() == s["dur_ns"].sum()  # nothing lost or counted twice
        assert r["start_ns"].to_list() == sorted(r["start_ns"].to_list())
        # neighbours always differ in rank, what or activity
        rows = r.to_dicts()
        assert all((a["rank"], a["what"], a["name"]) != (b["rank"], b["what"], b["name"])
                   for a, b in itertools.pairwise(rows))
        waiting = r.filter(pl.col("label") == "waiting")
        assert waiting["what"].unique().to_list() == ["waiting on rank 3"]
        assert waiting["dur_ns"].sum() == 29 * MS
    assert critical_path.runs(segs.head(0)).height == 0


def test_most_waited_on_is_the_longest_wait_and_the_lowest_rank_on_a_tie() -> None:
    import pyarrow as pa

    def seg(it: int, start: int, dur: int, label: str, waiting_on: int | None) -> dict:
        return {"iteration": it, "step": 0, "rank": 0, "lane": "cpu", "start_ns": start, "end_ns": start + dur,
                "dur_ns": dur, "label": label, "waiting_on": waiting_on, "name": None, "event_row": None, "edge": "own"}

    segs = pl.DataFrame([seg(0, 0, 10, "waiting", 2), seg(0, 10, 3, "waiting", 1), seg(0, 13, 3, "waiting", 1),
                         seg(0, 16, 3, "waiting", 1), seg(1, 100, 5, "waiting", 3), seg(1, 105, 5, "waiting", 1),
                         seg(2, 200, 5, "compute", None)], schema=critical_path.SEGMENT_SCHEMA)
    its = pa.table({"rank": pa.array([0, 0, 0], pa.int32()), "iteration": [0, 1, 2], "start_ns": [0, 100, 200],
                    "end_ns": [19, 110, 205]})
    summ = critical_path.summary(segs, its)
    # rank 2 was waited on for 10 ns once, rank 1 for 9 ns in three pieces: rank 2; a tie goes to rank 1
    assert summ["most_waited_on"].to_list() == [2, 1, None]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["cpu/tid 7", "gpu0/stream7", "gpu0/stream13", "trace",
                                                              "cpu/tid 12", "gpu1/stream7", "é/x"]),
                          st.integers(0, 50), st.integers(0, 20), st.booleans()), max_size=60),
       st.booleans())
def test_activities_sorted_on_lane_codes_equal_the_sort_on_lane_text(rows, shuffled_dict) -> None:
    """dag's sort on lane codes read off the dictionary (one string per lane) gives the frame the sort on each
    row's lane text gives: same rows, order, ids, nesting and lanes (still codes: build makes text of the activities'
    only), whatever the dictionary's own order."""
    import pyarrow as pa

    lanes = sorted({r[1] for r in rows})
    if shuffled_dict:
        lanes = lanes[::-1]
    lane = pa.DictionaryArray.from_arrays(pa.array([lanes.index(r[1]) for r in rows], pa.int32()),
                                          pa.array(lanes, pa.string()))
    df = pl.DataFrame({"rank": [r[0] for r in rows], "lane": pl.Series(lane.dictionary.to_pylist(),
                                                                        dtype=pl.String).gather(lane.indices
                                                                                                .to_numpy()),
                       "start": [r[2] for r in rows], "end": [r[2] + r[3] for r in rows]},
                      schema={"rank": pl.Int32, "lane": pl.Categorical, "start": pl.Int64, "end": pl.Int64})
    keep = np.flatnonzero([r[4] for r in rows])
    codes = dag.lane_codes(pa.chunked_array([lane], lane.type))
    assert codes is not None
    fast = dag._kept_by_lane(df, keep, codes)
    slow = dag._kept_by_lane(df, keep, None)
    if keep.size:
        assert fast.get_column("lane").dtype == pl.Categorical  # text only for the activities build picks
    assert slow.get_column("lane").dtype == pl.String
    assert fast.with_columns(pl.col("lane").cast(pl.String)).equals(slow)


@pytest.mark.parametrize("order", [(0, 1, 2), (1, 0, 2)])
def test_stream_edges_break_ties_in_launch_by_activity_order(order: tuple[int, ...]) -> None:
    """Two compute kernels launched at the same nanosecond on two streams, then an all-reduce: the stream it waits
    for is that of the later of the two in the launches' row order (the activities' order in a build), the same on
    every run."""
    act = pl.DataFrame({"a": [0, 1, 2], "kind": ["compute", "compute", "comm"]})
    lk = pl.DataFrame({"a": [0, 1, 2], "rank": [0, 0, 0], "device": [0, 0, 0], "stream": [7, 8, 13],
                       "l_start": [100, 100, 200]})[list(order)]
    start = np.array([300, 300, 500])
    end = np.array([400, 450, 900])
    edges: list[tuple[list[int], list[int], str]] = []
    dag._stream_edges(lambda s, d, lag, kind: edges.append((np.asarray(s).tolist(), np.asarray(d).tolist(), kind)),
                      act, lk, end, start)
    later = order[1]  # the second of the tied launches in the rows' order
    assert ([2 * later + 1], [2 * 2], "stream") in edges


def _label_cases(tmp_path: Path, shared: Path | None) -> list[tuple[str, list[str]]]:
    """Inputs whose graphs have every kind of rank: CPU only (gloo), GPU, a job of both, real traces."""
    gloo = kt.gloo_job(2, 2)
    cases: list[tuple[str, list[str]]] = []
    for name, per_rank in (("gloo", gloo), ("gpu", {0: kt.gpu_job(), 1: kt.gpu_job()}),
                           ("mixed", {0: kt.gpu_job(), 1: gloo[1]})):
        d = tmp_path / name
        d.mkdir()
        for r, evs in per_rank.items():
            kt.write(d / f"rank{r}.json", evs, rank=r, world_size=len(per_rank), backend="gloo")
        cases.append((name, [str(d)]))
    recorded = Path(__file__).parent / "data" / "gpu" / "gloo-2rank"
    if recorded.is_dir():
        cases.append(("recorded GPU job", [str(recorded)]))
    if shared is not None:
        cases += [(rel, [str(shared / rel)]) for rel in ("kineto-legacy/hta_critical_path__cuda_event_sync.json.gz",
                                                          "hta/trace_filter")]
    return cases


def test_activity_labels_read_off_the_builds_kind_codes_equal_those_read_off_the_text(tmp_path: Path) -> None:
    """The build keeps each activity's kind as a code (what the critical path labels activities by, without reading
    their text again): the codes name the activities' kinds, and the labels from them are the text's, on CPU-only,
    GPU and mixed jobs (a CPU rank's operators are compute there, a GPU rank's are CPU work)."""
    from tracekit.model import schema

    shared = shared_data_dir()
    cases = _label_cases(tmp_path, shared if shared.is_dir() else None)
    mixed_seen = False
    for name, paths in cases:
        ts = load(paths)
        ev, _ = iterations.assign(ts.events)
        g = dag.build(ev, ts.ranks)
        assert g.kind is not None and g.kind.size == g.act.height, name
        kinds = [schema.KINDS[k] if k >= 0 else None for k in g.kind.tolist()]
        assert kinds == g.act.get_column("kind").to_list(), name
        codes = critical_path._activity_labels(g)
        text = critical_path._activity_labels(dataclasses.replace(g, kind=None))  # (a fresh cache)
        assert np.array_equal(codes, text), name
        if name == "mixed":
            compute = critical_path.LABELS.index("compute")
            ops = (g.act.get_column("kind") == "cpu_op").to_numpy()
            rank = g.act.get_column("rank").to_numpy()
            assert (codes[ops & (rank == 1)] == compute).all() and (codes[ops & (rank == 0)] != compute).all()
            mixed_seen = True
    assert mixed_seen
