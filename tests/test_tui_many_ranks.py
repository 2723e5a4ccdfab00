"""``tracekit inspect`` on a job read rank by rank, opened from its per-rank dataset: an overview that summarises many
ranks (the distribution of each class, the outliers and stragglers named, not a row per rank), a timeline that reads
only the ranks it draws (``g`` to a rank, ``F`` to keep a host or a group), and the critical-path and what-if tabs
from the ranks' compact graphs (Pilot, as tests/test_tui.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from textual.widgets import Input, TabbedContent

from benchmarks import jobgen
from tests.test_tui import canvas, loaded, text_of
from tracekit.scale import dataset, engine
from tracekit.tui.app import InspectApp
from tracekit.tui.data import LoadOptions
from tracekit.tui.timeline_view import TimelineView
from tracekit.views import many_ranks
from tracekit.views.ranked_timeline import RankedTimeline

#: 40 ranks on 10 hosts; rank 13 computes 40 % slower, host 7's input pipeline stalls 4 ms a step
SPEC = jobgen.JobSpec(ranks=40, gpus_per_host=4, steps=3, layers=4, param_bytes=4 << 20, bucket_bytes=8 << 20,
                      clock_skew_ns=200_000, stragglers=((13, 1.4),), stalls=((7, 4_000_000),))
SIZE = (160, 50)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The job's traces, and a per-rank dataset of them already built (as ``tracekit summary --dataset`` leaves it)."""
    root = tmp_path_factory.mktemp("many")
    jobgen.write_job(root / "job", SPEC)
    dataset.build([str(root / "job")], out=root / "ds", engine=engine.LocalEngine(jobs=1))
    return root / "job", root / "ds"


def _app(built: tuple[Path, Path]) -> InspectApp:
    job, ds = built
    return InspectApp([str(job)], LoadOptions(dataset=str(ds), link_bw_bps=10e9, by_rank=None, jobs=1))


def test_the_distribution_and_the_outliers_of_many_ranks() -> None:
    per_rank = [{"rank": r, "median_iteration_ns": 100_000_000, "compute_share": 0.5, "overlapped_share": 0.1,
                 "exposed_comm_share": 0.3, "memory_share": 0.0, "idle_share": 0.1} for r in range(40)]
    per_rank[13]["compute_share"] = 0.8  # one rank computes far more
    for r in (28, 29, 30, 31):  # every rank of one host idles
        per_rank[r]["idle_share"] = 0.4
    dist = many_ranks.distribution(per_rank)
    row = dist.filter(dist["figure"] == "compute").row(0, named=True)
    assert row["median"] == 0.5 and row["max"] == 0.8 and row["max_rank"] == 13
    hosts = {r: f"node{r // 4:03d}" for r in range(40)}
    found = many_ranks.outliers(per_rank, hosts)
    who = {o["who"] for o in found}
    assert "rank 13" in who and "host node007 (4 ranks)" in who
    assert not any(o["who"] in {f"rank {r}" for r in (28, 29, 30, 31)} for o in found)  # named once, as the host


def test_a_ranked_timeline_draws_what_the_whole_one_draws(tmp_path: Path) -> None:
    """Every cell, event and search hit of the timeline read rank by rank is the in-memory timeline's."""
    import tracekit
    from tracekit.views.ranked_timeline import RankSource
    from tracekit.views.timeline import TimelineModel

    jobgen.write_job(tmp_path / "job", jobgen.JobSpec(ranks=4, gpus_per_host=2, steps=3, layers=4))
    whole = TimelineModel.build(tracekit.load(tmp_path / "job", cache=False).analysis)
    with tracekit.load(tmp_path / "job", dataset=tmp_path / "ds") as job:
        ranked = RankedTimeline(RankSource(job.analysis), max_events=10)  # one rank held at a time
        assert [(ln.rank, ln.name) for ln in whole.lanes] == [(ln.rank, ln.name) for ln in ranked.lanes]
        assert (whole.t0, whole.t1) == (ranked.t0, ranked.t1)
        for li in range(len(whole.lanes)):
            for zoom in (whole.fit_zoom(120), whole.fit_zoom(120) - 9):
                a, b = whole.cells(li, zoom, 3, 120), ranked.cells(li, zoom, 3, 120)
                assert np.array_equal(a.kind, b.kind) and np.allclose(a.fill, b.fill)
            mid = (whole.t0 + whole.t1) // 2
            i, j = whole.event_at(li, mid, mid + 2_000_000), ranked.event_at(li, mid, mid + 2_000_000)
            assert (i is None) == (j is None)
            if i is not None and j is not None:
                assert whole.event_name(i) == ranked.event_name(j) and whole.ev_start[i] == ranked.ev_start[j]
                assert ranked.lane_of_event(j) == li and ranked.record(j)["name"] == whole.event_name(i)
        assert len(ranked.source.loaded) == 1  # the others were let go
        for r in range(4):  # read every rank again: a search looks through the ranks read
            ranked.ensure(ranked.lanes_of_rank(r)[1])
        ranked.max_events = 10**9
        for r in range(4):
            ranked.ensure(ranked.lanes_of_rank(r)[1])
        assert len(whole.search("AllReduce")) == len(ranked.search("AllReduce")) > 0


async def test_inspect_a_dataset_of_many_ranks(built: tuple[Path, Path]) -> None:
    app = _app(built)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, timeout=120)
        assert app.data is not None and app.data.analysis is not None and app.data.analysis.dataset is not None
        overview = text_of(app, "#ranks")
        assert "median" in overview and "p90" in overview
        assert "rank 39" not in text_of(app, "#per-rank")  # no row per rank
        standing = text_of(app, "#per-rank")
        assert "rank 13" in standing  # the slow rank: an outlier and the one waited for
        assert "host node007" in standing  # the stalled host, named once
        tabs = app.query_one("#views", TabbedContent)
        for key, view in (("4", "critical_path"), ("6", "whatif")):
            await pilot.press(key)
            await pilot.pause()
            assert tabs.active == view
        assert app.data.analysis.critical_path_summary.height == SPEC.steps - 1 or \
            app.data.analysis.critical_path_summary.height == SPEC.steps
        # the timeline: every rank laid out, a rank read only when drawn
        await pilot.press("3")
        await pilot.pause()
        c = canvas(app)
        model = c.model
        assert isinstance(model, RankedTimeline)
        assert {ln.rank for ln in model.lanes} == set(range(SPEC.ranks))
        read = {model.source.ranks[s] for s in model.source.loaded}
        assert read and max(read) < 20  # the first screen's ranks, not every rank
        view = app.query_one(TimelineView)
        await pilot.press("g")
        await pilot.pause()
        box = app.query_one("#timeline-search", Input)
        assert box.display
        await pilot.press(*"37", "enter")
        await pilot.pause()
        assert model.lanes[c.cursor_lane].rank == 37
        assert 37 in {model.source.ranks[s] for s in model.source.loaded}
        details = text_of(app, "#timeline-details")
        assert "rank 37" in details
        # keep one host: its ranks only, drawn from what was read
        assert view.filter("host node007") == 4
        assert isinstance(c.model, RankedTimeline) and {ln.rank for ln in c.model.lanes} == {28, 29, 30, 31}
        cells = c.model.cells(0, c.zoom, c.first_cell, 50)
        assert (cells.kind >= 0).any()
        assert view.filter("group 0") == SPEC.ranks  # the default group (pg_config name "0"): every rank
        assert view.filter("ranks 0-3,12") == 5
        assert view.filter("") == SPEC.ranks
        # jumping to a rank the filter leaves out shows every rank again
        view.filter("host node000")
        assert view.goto("33") and c.model is app.data.timeline
        # a search looks through the ranks read so far
        hits = view.search("AllReduce")
        assert hits > 0
        slots = np.unique(np.asarray(c.marks["search"].event) >> 32)
        assert {model.source.ranks[int(s)] for s in slots} <= {model.source.ranks[s] for s in model.source.loaded}


def test_many_ranks_tables_read_as_one_dataset(built: tuple[Path, Path]) -> None:
    """Every rank's file of a table read at once (Arrow's threads) is what reading them one by one gives."""
    import pyarrow as pa

    ds = dataset.Dataset.open(built[1])
    assert ds is not None
    for name in ("iterations", "breakdown", "collectives", "top_ops", "op_totals", "idle_breakdown"):
        fast = ds.table(name)
        ds._cache.clear()
        one_by_one = pa.concat_tables([ds.rank_table(name, r) for d, r in ds.parts if r is not None])
        if name in ("iterations", "breakdown"):
            one_by_one = one_by_one.sort_by([("rank", "ascending"), ("start_ns", "ascending")])
        assert fast.equals(one_by_one), name
