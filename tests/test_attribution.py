"""Attribution adds up to every window exactly and matches a per-nanosecond reference."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import kineto_traces as kt
from tracekit.analysis import attribution, iterations
from tracekit.analysis.intervals import first_match, lane_order, prev_max_end, sweep, union_length
from tracekit.analysis.pipeline import analyse
from tracekit.loading.traceset import load
from tracekit.model import schema

MS = 1_000_000


def test_known_gpu_iterations(tmp_path: Path) -> None:
    kt.write(tmp_path / "rank0.json", kt.gpu_job(3))
    result = analyse(load([str(tmp_path)]))
    b = pl.from_arrow(result.breakdown).sort("iteration")
    assert b["iteration"].to_list() == [1, 2, 3]
    assert b["wall_ns"].to_list() == [10 * MS, 10 * MS, 15 * MS // 2]
    assert b["compute_ns"].to_list() == [4 * MS] * 3
    assert b["overlapped_ns"].to_list() == [1 * MS] * 3
    assert b["exposed_comm_ns"].to_list() == [2 * MS] * 3
    assert b["memory_ns"].to_list() == [MS // 2] * 3
    assert b["idle_ns"].to_list() == [5 * MS // 2, 5 * MS // 2, 0]
    assert b["comm_bytes"].to_list() == [4 << 20] * 3
    assert b["wait_ns"].null_count() == 3  # unknown until collectives are matched across ranks


def test_gpu_work_spilling_past_its_step_belongs_to_the_launching_step(tmp_path: Path) -> None:
    evs = kt.gpu_job(2)
    # the second step's CPU side ends early; its kernels still belong to step 2 via correlation
    kt.write(tmp_path / "rank0.json", evs)
    result = analyse(load([str(tmp_path)]))
    ev = pl.from_arrow(result.events).with_columns(pl.col("name").cast(pl.String))
    kernels = ev.filter(pl.col("name") == "add_kernel").sort("start_ns")
    assert kernels["iteration"].to_list() == [1, 2]


def test_cpu_only_rank_counts_cpu_operators_as_compute(tmp_path: Path) -> None:
    t0 = kt.EPOCH_NS
    evs = [
        kt.Ev("ProfilerStep#1", "user_annotation", t0, 20 * MS, tid=10),
        kt.Ev("aten::mm", "cpu_op", t0 + 1 * MS, 9 * MS, tid=10),
        kt.Ev("gloo:all_reduce", "user_annotation", t0 + 5 * MS, 10 * MS, tid=11,
              args={"Input Dims": [[100]], "Input type": ["float"]}),
        kt.Ev("aten::add_", "cpu_op", t0 + 17 * MS, 2 * MS, tid=10),
        kt.Ev("python frame", "python_function", t0, 20 * MS, tid=10),  # never counts
    ]
    kt.write(tmp_path / "rank0.json", evs, backend="gloo")
    b = pl.from_arrow(analyse(load([str(tmp_path)])).breakdown).row(0, named=True)
    # window [0, 19 ms): compute [1,5), overlapped [5,10), exposed [10,15), idle [0,1)+[15,17), compute [17,19)
    assert (b["compute_ns"], b["overlapped_ns"], b["exposed_comm_ns"], b["idle_ns"]) == \
        (6 * MS, 5 * MS, 5 * MS, 3 * MS)
    assert b["wall_ns"] == 19 * MS


def test_whole_trace_window_without_step_markers(tmp_path: Path) -> None:
    evs = [e for e in kt.gpu_job(2) if not e.name.startswith("ProfilerStep")]
    kt.write(tmp_path / "rank0.json", evs)
    result = analyse(load([str(tmp_path)]))
    assert result.iterations.column("method").to_pylist() == ["whole-trace"]
    b = result.breakdown.to_pylist()[0]
    assert sum(b[f"{c}_ns"] for c in schema.CLASSES) == b["wall_ns"]


def test_step_marker_regex(tmp_path: Path) -> None:
    evs = [kt.Ev(e.name.replace("ProfilerStep#", "train_step_"), e.cat, e.start, e.dur, e.tid, e.pid, e.device,
                 e.stream, e.args) for e in kt.gpu_job(3)]
    kt.write(tmp_path / "rank0.json", evs)
    result = analyse(load([str(tmp_path)]), step_marker=r"train_step_(\d+)")
    assert sorted(result.iterations.column("iteration").to_pylist()) == [1, 2, 3]
    assert set(result.iterations.column("method").to_pylist()) == {"step-marker"}


# --- property: the sweep equals a brute-force per-nanosecond reference -------------------------

intervals = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 25), st.integers(0, 3)), max_size=25)


def _reference(ivs, w0, w1):
    """Per-ns classification inside [w0, w1)."""
    out = dict.fromkeys(schema.CLASSES, 0)
    for t in range(w0, w1):
        active = {c for s, d, c in ivs if s <= t < s + d}
        compute = attribution.COMPUTE in active
        comm = attribution.TRANSFER in active or attribution.WAIT in active
        if compute and comm:
            out["overlapped"] += 1
        elif compute:
            out["compute"] += 1
        elif comm:
            out["exposed_comm"] += 1
        elif attribution.MEMORY in active:
            out["memory"] += 1
        else:
            out["idle"] += 1
    return out


@settings(max_examples=300, deadline=None)
@given(ivs=intervals, w=st.tuples(st.integers(0, 40), st.integers(1, 50)), w2=st.integers(1, 30))
def test_sweep_matches_brute_force(ivs, w, w2) -> None:
    w0, wlen = w
    windows = [(w0, w0 + wlen), (w0 + wlen, w0 + wlen + w2)]
    rank = np.zeros(len(ivs), dtype=np.int64)
    start = np.array([s for s, _, _ in ivs], dtype=np.int64)
    end = np.array([s + d for s, d, _ in ivs], dtype=np.int64)
    cls = np.array([c for _, _, c in ivs], dtype=np.int64)
    s = sweep(rank, start, end, cls, 4, np.zeros(2, np.int64), np.array([a for a, _ in windows]),
              np.array([b for _, b in windows]))
    c = (s.state & 1) != 0
    comm = (s.state & 6) != 0
    mem = (s.state & 8) != 0
    got = {"compute": s.total(2, c & ~comm), "overlapped": s.total(2, c & comm),
           "exposed_comm": s.total(2, ~c & comm), "memory": s.total(2, ~c & ~comm & mem)}
    for i, (a, b) in enumerate(windows):
        ref = _reference(ivs, a, b)
        got_i = {k: int(v[i]) for k, v in got.items()}
        got_i["idle"] = (b - a) - sum(got_i.values())
        assert got_i == ref
        assert sum(got_i.values()) == b - a


@settings(max_examples=200, deadline=None)
@given(ivs=intervals)
def test_union_counts_concurrent_intervals_once(ivs) -> None:
    start = np.array([s for s, _, _ in ivs], dtype=np.int64)
    end = np.array([s + d for s, d, _ in ivs], dtype=np.int64)
    got = union_length(np.zeros(len(ivs), np.int64), start, end, np.zeros(1, np.int64), np.array([0]),
                       np.array([100]))
    assert int(got[0]) == len({t for s, d, _ in ivs for t in range(s, s + d)})


@settings(max_examples=100, deadline=None)
@given(ivs=st.lists(st.tuples(st.integers(0, 1), st.integers(0, 60), st.integers(1, 25), st.integers(0, 3)),
                    min_size=1, max_size=30))
def test_breakdown_adds_up_on_random_multi_rank_events(ivs) -> None:
    kinds = ["compute", "comm", "memory", "comm"]
    n = len(ivs)
    events = schema.table(schema.EVENTS, {
        "rank": [r for r, _, _, _ in ivs], "lane": [f"gpu0/stream{c}" for *_, c in ivs],
        "kind": [kinds[c] for *_, c in ivs], "name": ["k"] * n, "cat": ["kernel"] * n,
        "start_ns": [s for _, s, _, _ in ivs], "dur_ns": [d for _, _, d, _ in ivs], "device": [0] * n,
    })
    _, iters = iterations.assign(events)
    b = attribution.breakdown(events, iters)
    for row in b.to_pylist():
        assert sum(row[f"{c}_ns"] for c in schema.CLASSES) == row["wall_ns"]
        assert min(row[f"{c}_ns"] for c in schema.CLASSES) >= 0


def test_comm_split_into_wait_and_transfer() -> None:
    events = schema.table(schema.EVENTS, {
        "rank": [0, 0], "lane": ["gpu0/stream7", "gpu0/stream13"], "kind": ["compute", "comm"],
        "name": ["k", "nccl"], "cat": ["kernel", "kernel"], "start_ns": [0, 50], "dur_ns": [60, 50],
        "device": [0, 0]})
    iters = schema.table(schema.ITERATIONS, {"rank": [0], "iteration": [0], "start_ns": [0], "end_ns": [100],
                                             "method": ["x"]})
    split = pl.DataFrame({"rank": [0, 0], "start_ns": [50, 80], "end_ns": [80, 100],
                          "cls": [attribution.WAIT, attribution.TRANSFER]})
    row = attribution.breakdown(events, iters, comm_split=split).to_pylist()[0]
    assert (row["overlapped_ns"], row["exposed_comm_ns"], row["wait_ns"], row["transfer_ns"]) == (10, 40, 20, 20)


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 100), st.integers(0, 40)), min_size=1, max_size=60),
       far=st.booleans())
def test_prev_max_end_is_the_running_max_of_earlier_rows_of_the_group(rows, far) -> None:
    """Both ways of computing it (one int64 accumulate; polars when groups x span overflow int64) agree with
    the definition."""
    rows.sort()
    lane = np.array([g for g, _, _ in rows], dtype=np.int64)
    start = np.array([s for _, s, _ in rows], dtype=np.int64)
    end = start + np.array([d for _, _, d in rows], dtype=np.int64)
    if far:  # a span so long that the offsets between groups no longer fit one int64
        start[-1] += 1 << 61
        end[-1] += 1 << 61
    got = prev_max_end(lane, start, end)
    lo = np.iinfo(np.int64).min
    want = [max((int(end[j]) for j in range(i) if lane[j] == lane[i]), default=lo) for i in range(len(rows))]
    assert got.tolist() == want


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 3), st.integers(-1, 3), st.integers(0, 50), st.integers(0, 20)),
                     min_size=1, max_size=60), far=st.booleans())
def test_lane_order_sorts_by_rank_lane_start_and_end_descending_stably(rows, far) -> None:
    """The packed int64 key and the lexsort it falls back on (spans too long for the key) give the stable order
    by (rank, lane, start, -end), and group ids that change exactly where (rank, lane) does."""
    rank = np.array([r for r, _, _, _ in rows], dtype=np.int64)
    lane = np.array([c for _, c, _, _ in rows], dtype=np.int64)
    start = np.array([s for _, _, s, _ in rows], dtype=np.int64)
    end = start + np.array([d for _, _, _, d in rows], dtype=np.int64)
    if far:
        start[0] += 1 << 61
        end[0] += 1 << 61
    order, group = lane_order(rank, lane, start, end)
    assert order.tolist() == sorted(range(len(rows)), key=lambda i: (rank[i], lane[i], start[i], -end[i], i))
    pairs = list(zip(rank[order].tolist(), lane[order].tolist(), strict=True))
    assert [a != b for a, b in itertools.pairwise(pairs)] == (group[1:] != group[:-1]).tolist()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.none() | st.integers(0, 6), st.booleans(), st.booleans(),
                          st.integers(0, 9)), min_size=1, max_size=40))
def test_device_rows_take_the_first_source_iteration_on_packed_keys_as_in_a_join(rows):
    """iterations._through: the packed-key numpy lookup gives what the polars join gives (keys beyond 2^40 take
    that path): the target rows whose (rank, key) a source row has, each with the first such source's iteration."""
    rank, key, source, target, it = (list(c) for c in zip(*rows, strict=True))

    def through(offset: int) -> tuple[list[int], list[int]]:
        df = pl.DataFrame({"rank": pl.Series(rank, dtype=pl.Int32),
                           "k": pl.Series([None if k is None else k + offset for k in key], dtype=pl.Int64)})
        hit, found = iterations._through(df, "k", np.array(source), np.array(target), np.array(it, dtype=np.int64))
        order = np.argsort(hit, kind="stable")
        return hit[order].tolist(), found[order].tolist()

    expected_rows = [i for i in range(len(rows)) if target[i] and key[i] is not None
                     and any(source[j] and key[j] == key[i] and rank[j] == rank[i] for j in range(len(rows)))]
    expected_it = [next(it[j] for j in range(len(rows)) if source[j] and key[j] == key[i] and rank[j] == rank[i])
                   for i in expected_rows]
    assert through(0) == (expected_rows, expected_it)
    assert through(1 << 41) == (expected_rows, expected_it)  # beyond the packed key: the join


@given(st.lists(st.integers(-3, 6), max_size=30), st.lists(st.integers(-5, 8), max_size=30))
def test_first_match_is_each_querys_first_equal_key(keys, queries) -> None:
    """Per query: whether a key equals it, and the first such key's position, as a scan of the keys finds it."""
    hit, first = first_match(np.array(keys, dtype=np.int64), np.array(queries, dtype=np.int64))
    for q, h, f in zip(queries, hit.tolist(), first.tolist(), strict=True):
        assert h == (q in keys)
        if h:
            assert f == keys.index(q)


def test_runs_are_the_distinct_values_and_bounds_of_a_sorted_column() -> None:
    from tracekit.analysis.intervals import runs

    values, bounds = runs(np.array([1, 1, 2, 5, 5, 5]))
    assert values.tolist() == [1, 2, 5] and bounds.tolist() == [0, 2, 3, 6]
    empty = runs(np.zeros(0, np.int64))
    assert empty is not None and empty[0].size == 0 and empty[1].tolist() == [0]
    assert runs(np.array([2, 1])) is None  # not sorted: the caller gathers instead
