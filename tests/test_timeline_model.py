"""The timeline view model: levels of detail conserve busy time, rows never exceed the width, the
classes lanes agree with the breakdown, and the cursor/jump/search queries find the right events."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import kineto_traces as kt
from tracekit.analysis.pipeline import Analysis, analyse
from tracekit.loading.traceset import load
from tracekit.model.schema import CLASSES
from tracekit.views.timeline import CLASSES_LANE, Intervals, TimelineModel, cell_ns, ticks

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "ddp-gloo"


@pytest.fixture(scope="module")
def sample() -> tuple[Analysis, TimelineModel]:
    result = analyse(load([str(SAMPLE)], use_cache=False))
    return result, TimelineModel.build(result)


@pytest.fixture(scope="module")
def gpu(tmp_path_factory: pytest.TempPathFactory) -> tuple[Analysis, TimelineModel]:
    d = tmp_path_factory.mktemp("gpu")
    kt.write(d / "rank0.json", kt.gpu_job(3), rank=0)
    kt.write(d / "rank1.json", kt.gpu_job(3, t0=kt.EPOCH_NS + 300_000), rank=1)
    result = analyse(load([str(d)], use_cache=False))
    return result, TimelineModel.build(result, finest=64)


def _reference(intervals: list[tuple[int, int]], lo: int, hi: int) -> np.ndarray:
    """Per-nanosecond coverage of the union of ``intervals`` over ``[lo, hi)``."""
    ns = np.zeros(hi - lo, dtype=bool)
    for s, e in intervals:
        ns[max(s, lo) - lo:max(min(e, hi) - lo, 0)] = True
    return ns


spans = st.lists(st.tuples(st.integers(0, 300), st.integers(0, 60)), max_size=30)


@settings(max_examples=150, deadline=None)
@given(spans, spans, st.integers(1, 40))
def test_intervals_match_a_per_ns_reference(a: list[tuple[int, int]], b: list[tuple[int, int]], width: int) -> None:
    ia = sorted((s, s + d) for s, d in a)
    ib = sorted((s, s + d) for s, d in b)

    def build(iv: list[tuple[int, int]]) -> Intervals:
        return Intervals.union(np.array([s for s, _ in iv], dtype=np.int64),
                               np.array([e for _, e in iv], dtype=np.int64))

    ua, ub = build(ia), build(ib)
    ref_a, ref_b = _reference(ia, 0, 400), _reference(ib, 0, 400)
    assert ua.total == ref_a.sum()
    assert np.all(ua.start[1:] > ua.end[:-1])  # disjoint, not even touching
    edges = np.arange(0, 401, width)
    assert ua.coverage(edges).tolist() == [int(ref_a[x:y].sum()) for x, y in itertools.pairwise(edges)]
    assert ua.intersect(ub).total == (ref_a & ref_b).sum()
    assert ua.merge(ub).total == (ref_a | ref_b).sum()


def test_levels_conserve_busy_time(sample: tuple[Analysis, TimelineModel]) -> None:
    _, model = sample
    assert model.lanes
    for lane in model.lanes:
        totals = [s.total for s in lane.sets]
        for level in lane.levels:
            assert level.dtype == np.int64
            if lane.is_classes:
                assert level[:, :-1].sum() == level[:, -1].sum() == lane.busy.total  # classes partition windows
            else:
                assert level[:, :-1].sum(axis=0).tolist() == totals
                assert int(level[:, -1].sum()) == lane.busy.total
        assert lane.levels[-1].shape[0] == 1


def test_rows_never_exceed_the_width_and_match_on_demand_binning(sample: tuple[Analysis, TimelineModel]) -> None:
    _, model = sample
    for width in (1, 37, 160, 400):
        fit = model.fit_zoom(width)
        for zoom in (0, 9, fit - 13, fit - 4, fit, fit + 3, model.max_zoom(width)):
            for offset in (-5, 0, 11, 3 * width):
                for lane in (0, 1, len(model.lanes) - 1):
                    cells = model.cells(lane, zoom, offset, width)
                    assert cells.kind.shape == cells.fill.shape == (width,)
                    assert cells.fill.min() >= 0 and cells.fill.max() <= 1
                    edges = model.t0 + (np.arange(width + 1) + offset) * cell_ns(zoom)
                    assert np.array_equal(model.coverage(lane, zoom, offset, width),
                                          model.lanes[lane].coverage(edges))


def test_whole_job_fits_at_fit_zoom(sample: tuple[Analysis, TimelineModel]) -> None:
    _, model = sample
    z = model.fit_zoom(120)
    assert cell_ns(z) * 120 >= model.span > cell_ns(z - 1) * 120
    assert model.span / cell_ns(z) > 120 * 0.75  # four zoom steps per doubling: at most 25 % unused


def test_classes_lanes_add_up_to_the_breakdown(sample: tuple[Analysis, TimelineModel]) -> None:
    result, model = sample
    b = pl.from_arrow(result.breakdown)
    assert isinstance(b, pl.DataFrame)
    sums = b.group_by("rank").agg(*[pl.col(f"{c}_ns").sum() for c in CLASSES], pl.col("wall_ns").sum())
    for row in sums.iter_rows(named=True):
        li = model.lane_index(row["rank"], CLASSES_LANE)
        assert li is not None
        lane = model.lanes[li]
        assert lane.kinds == CLASSES
        got = lane.levels[0].sum(axis=0).tolist()
        assert got == [row[f"{c}_ns"] for c in CLASSES] + [row["wall_ns"]]


def test_lane_order_and_kinds(gpu: tuple[Analysis, TimelineModel]) -> None:
    _, model = gpu
    names = [(ln.rank, ln.name) for ln in model.lanes]
    assert names[0] == (0, CLASSES_LANE)
    rank0 = [n for r, n in names if r == 0]
    assert rank0[1].startswith("gpu") and rank0[-1].startswith("cpu")  # device streams before CPU threads
    kinds = {k for ln in model.lanes for k in ln.kinds}
    assert {"compute", "comm", "memory"} <= kinds
    assert "annotation" not in kinds  # step markers are metadata, not drawn


def test_event_at_and_jumps(sample: tuple[Analysis, TimelineModel]) -> None:
    result, model = sample
    main = next(ln for ln in model.lanes if ln.rank == 0 and ln.kinds == ("cpu_op",))
    i = model.next_event(model.t0, model.lanes_of_rank(0), ("comm",))
    assert i is not None and model.event_name(i) == "gloo:all_reduce"
    comm_lane = model.lane_of_event(i)
    assert model.lanes[comm_lane].rank == 0 and "comm" in model.lanes[comm_lane].kinds
    j = model.next_event(int(model.ev_start[i]), model.lanes_of_rank(0), ("comm",))
    assert j is not None and model.ev_start[j] > model.ev_start[i]
    assert model.next_event(int(model.ev_start[j]), model.lanes_of_rank(0), ("comm",), forward=False) == i
    # a 1 µs cell inside a nested op shows the innermost op there
    row = model.ev_row[i]
    assert result.events.column("kind")[int(row)].as_py() == "comm"
    t = int(model.ev_start[main.ev_lo]) + 500
    k = model.event_at(main.index, t, t + 1_000)
    assert k is not None
    inner = (model.ev_start[main.ev_lo:main.ev_hi] <= t) & (model.ev_end[main.ev_lo:main.ev_hi] >= t + 1_000)
    shortest = int((model.ev_end[main.ev_lo:main.ev_hi] - model.ev_start[main.ev_lo:main.ev_hi])[inner].min())
    assert model.ev_end[k] - model.ev_start[k] == shortest
    assert model.event_at(main.index, model.t1 + 10, model.t1 + 20) is None


def test_search_marks(sample: tuple[Analysis, TimelineModel]) -> None:
    result, model = sample
    hits = model.search("ALL_reduce")  # case-insensitive
    names = result.events.column("name").cast(pa.string()).to_pylist()
    assert len(hits) == sum(1 for n in names if "all_reduce" in n.lower())
    assert np.all(np.diff(hits.start) >= 0)
    first = hits.next_after(model.t0 - 1)
    assert first == 0
    assert hits.prev_before(int(hits.start[0])) is None
    lane = int(hits.lane[0])
    assert hits.on_lane(lane).total > 0
    assert len(model.search("[unclosed")) == 0  # not a valid regex: searched as text
    assert len(model.search("no such op anywhere")) == 0


def test_marks_from_an_analysis_table(sample: tuple[Analysis, TimelineModel]) -> None:
    _, model = sample
    lane = model.lanes[1]
    s = int(model.ev_start[lane.ev_lo])
    table = pa.table({"rank": [lane.rank, lane.rank], "lane": [lane.name, None],
                      "start_ns": [s, s + 10], "end_ns": [s + 5, s + 20]})
    marks = model.marks_from_table("critical path", table)
    assert len(marks) == 2
    assert set(marks.lane.tolist()) == {lane.index, model.lane_index(lane.rank, CLASSES_LANE)}


def test_marks_on_the_job_clock_with_labels(sample: tuple[Analysis, TimelineModel]) -> None:
    """The critical path's segments are on the job clock already and carry what each one is; the details
    panel asks which mark covers the cursor's cell."""
    _, model = sample
    lane = model.lanes[1]
    s = int(model.ev_start[lane.ev_lo])
    table = pa.table({"rank": [lane.rank] * 3, "lane": [lane.name] * 3, "start_ns": [s + 20, s, s + 10],
                      "end_ns": [s + 30, s + 10, s + 12], "label": ["c", "a", "b"]})
    model.clock_offsets[lane.rank] = 1_000  # a rank-clock table would move; a job-clock one does not
    try:
        moved = model.marks_from_table("t", table)
        marks = model.marks_from_table("t", table, job_clock=True, label="label")
    finally:
        model.clock_offsets[lane.rank] = 0
    assert moved.start.tolist() == [s + 1_000, s + 1_010, s + 1_020]
    assert marks.start.tolist() == [s, s + 10, s + 20] and marks.label is not None
    assert marks.label.tolist() == ["a", "b", "c"]  # sorted along with the times
    assert marks.at(lane.index, s + 9, s + 13) == 1  # overlaps a by 1 ns, b by 2 ns
    assert marks.at(lane.index, s + 12, s + 20) is None
    assert marks.at(lane.index + 1, s, s + 40) is None


def test_labels_name_wide_spans(sample: tuple[Analysis, TimelineModel]) -> None:
    _, model = sample
    comm = next(ln for ln in model.lanes if ln.kinds == ("comm",))
    s = comm.sets[0]
    span = int(s.end[0] - s.start[0])
    zoom = model.fit_zoom(20, span)  # the first all-reduce spans about 20 cells
    offset = int((s.start[0] - model.t0) // cell_ns(zoom))
    labels = model.labels(comm.index, zoom, offset, 80)
    assert labels and labels[0][3] == "gloo:all_reduce" and labels[0][0] == 0
    assert all(0 <= a < b <= 80 for a, b, _, _ in labels)
    assert model.labels(comm.index, 0, 0, 80) == []  # nothing in view at the very start


def test_ticks_are_round_and_spaced() -> None:
    t = ticks(0, 40, 100)  # 10 µs... per cell: round steps at least 14 cells apart
    assert t[0] == (0, 0)
    cells = [c for c, _ in t]
    assert all(b - a >= 14 for a, b in itertools.pairwise(cells))
    step = t[1][1] - t[0][1]
    assert str(step).strip("0") in {"1", "2", "5"}
