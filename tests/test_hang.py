"""The hang, named (issue 38), on the recorded gloo jobs of ``tests/data/flight_recorder``: every case read and named
right in ``summary`` (its first line), ``--json`` (the ``hang`` object), the Python API (``Job.hang``, the verdict)
and the Parquet export; dumps beside profiler traces; a job read rank by rank; the NCCL cases (synthetic, from the
format in PyTorch's source: ``tests/flight_recorder_dumps.py``) and NCCL's watchdog lines alone."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tracekit
from tests import flight_recorder_dumps as frd
from tracekit.analysis.hang import stuck as hang_mod
from tracekit.cli import main
from tracekit.model.diagnostics import TraceError
from tracekit.parsers import parse

DATA = Path(__file__).parent / "data" / "flight_recorder"
NCCL = Path(__file__).parent / "data" / "nccl"

#: what record.py did in each case: (kind, cause ranks, why, where: (group, collective) the cause is named at,
#: the ranks that left no dump)
TRUTH = {
    "healthy": ("none", [], None, None, []),
    "delayed": ("none", [], None, None, []),
    "hang-skip": ("hung", [1], "never entered", ("0", 9), []),
    "hang-timeout": ("hung", [1], "never entered", ("0", 9), []),
    "desync-shape": ("desync", [1], "desync", ("0", 9), []),
    "desync-dtype": ("desync", [1], "desync", ("0", 10), []),
    "desync-op": ("desync", [1], "desync", ("0", 9), []),
    "desync-size": ("desync", [1], "desync", ("0", 9), [0]),
    "no-dump": ("hung", [2], "no dump", None, [2]),
    "subgroup-stuck": ("hung", [1], "never entered", ("1", 4), []),
    "subgroup-skip": ("hung", [1], "skipped", ("1", 4), []),
}


def load(*paths: Path, **kw) -> tracekit.Job:  # type: ignore[no-untyped-def]
    return tracekit.load([str(p) for p in paths], cache=False, **kw)


def test_the_truth_covers_every_recorded_case() -> None:
    assert sorted(TRUTH) == sorted(p.name for p in DATA.iterdir() if (p / "job.json").exists())
    for case in TRUTH:
        job = json.loads((DATA / case / "job.json").read_text())
        dumped = sorted(int(p.name.rsplit("_", 1)[1]) for p in (DATA / case / "pickle").iterdir())
        assert sorted(set(range(job["world_size"])) - set(dumped)) == TRUTH[case][4]


@pytest.mark.parametrize("form", ["both", "pickle", "json"])
@pytest.mark.parametrize("case", sorted(TRUTH))
def test_every_case_is_named_right(case: str, form: str) -> None:
    """``Job.hang`` and the verdict of each case, from both forms together (each rank read once), the pickles alone
    and the JSON alone (no stacks there)."""
    kind, ranks, why, where, no_dump = TRUTH[case]
    path = DATA / case if form == "both" else DATA / case / form
    job = load(path)
    h = job.hang
    assert h is not None and (h.kind, h.cause_ranks, h.no_dump) == (kind, ranks, no_dump)
    assert h.ranks == sorted(set(range(h.world_size)) - set(no_dump))
    assert job.verdict.kind == kind and job.verdict.headline == h.headline
    if why is not None:
        (cause,) = h.causes
        assert cause.why == why and (cause.pg, cause.seq) == (where or (None, None))
        assert f"rank {ranks[0]} " in h.headline and (where is None or f"#{where[1]} " in h.headline)
        if why != "no dump":
            assert (cause.stack is not None) == (form != "json")
            assert (cause.where or "").startswith("train at ") == (form != "json")
    if form == "both":
        assert any("each rank's read once" in n for n in h.notes)


def test_a_hang_names_who_waits_and_who_is_held() -> None:
    h = load(DATA / "subgroup-stuck").hang
    assert h is not None
    by_pg = {s.pg: s for s in h.stuck}
    assert (by_pg["1"].seq, by_pg["1"].waiting, by_pg["1"].behind, by_pg["1"].knock_on) == (4, (0,), (1,), False)
    assert (by_pg["0"].seq, by_pg["0"].waiting, by_pg["0"].behind, by_pg["0"].knock_on) == (9, (2, 3), (0, 1), True)
    assert by_pg["0"].blocked == {0: "pg 1 #4"}
    pos = pl.from_arrow(h.positions)
    assert pos.filter(pl.col("pg") == "0").select("rank", "state", "entered_seq", "cause").rows() == [
        (0, "behind", 8, False), (1, "behind", 8, True), (2, "waiting", 9, False), (3, "waiting", 9, False)]
    assert pos.filter(pl.col("pg") == "2").get_column("state").to_list() == ["done", "done"]
    assert "Knock-on: ranks 2 and 3 wait in all_reduce #9 of pg 0 (default_pg) for ranks 0 and 1" in h.text


def test_a_wait_cycle_names_the_rank_that_broke_its_order() -> None:
    """subgroup-skip: rank 0 waits in pg 1 for rank 1, rank 1 in pg 0 for rank 0; the cause is rank 1, which entered
    pg 0's #9 without its pg 1 call, as its own history says it always made one first."""
    h = load(DATA / "subgroup-skip").hang
    assert h is not None
    assert "Hung: rank 1 skipped all_reduce #4 of pg 1 and went on to all_reduce #9 of pg 0 (default_pg)" in h.headline
    by_pg = {s.pg: s for s in h.stuck}
    assert by_pg["0"].knock_on and not by_pg["1"].knock_on
    assert by_pg["1"].blocked == {1: "pg 0 (default_pg) #9"}


def test_a_collective_retired_though_a_member_never_came() -> None:
    """With a process-group timeout, gloo retires the collective that timed out like a completed one: it cannot have
    completed (rank 1 never entered it), and the text says so."""
    h = load(DATA / "hang-timeout").hang
    assert h is not None and h.stuck[0].retired == (0, 2)
    assert "retired does not mean completed" in h.text
    pos = pl.from_arrow(h.positions).sort("rank")
    assert pos.get_column("retired_seq").to_list() == [9, 8, 9]
    assert pos.get_column("state").to_list() == ["waiting", "behind", "waiting"]


def test_a_late_arrival_where_nothing_hangs() -> None:
    h = load(DATA / "delayed").hang
    assert h is not None and h.late is not None
    assert (h.late.rank, h.late.pg, h.late.seq) == (2, "0", 9)
    assert hang_mod.LATE_NS <= h.late.skew_ns < 10 * hang_mod.LATE_NS  # record.py sleeps 2.5 s there
    assert load(DATA / "healthy").hang.late is None


def test_desync_says_what_differs() -> None:
    what = {c: load(DATA / c).hang.desyncs[0].what for c in ("desync-shape", "desync-dtype", "desync-op",
                                                           "desync-size")}
    assert what == {"desync-shape": "shape", "desync-dtype": "dtype", "desync-op": "operation", "desync-size": "size"}
    d = load(DATA / "desync-size").hang.desyncs[0]
    assert d.calls == {1: "all_reduce [288] Float", 2: "all_reduce [272] Float", 3: "all_reduce [272] Float"}
    assert d.odd == (1,) and d.majority == "all_reduce [272] Float"


# ------------------------------------------------------------------------------------------- the CLI


@pytest.mark.parametrize("case", sorted(TRUTH))
def test_summary_says_it_first(case: str, capsys: pytest.CaptureFixture[str]) -> None:
    kind, ranks, *_ = TRUTH[case]
    assert main(["summary", str(DATA / case), "--no-cache"]) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    word = {"hung": "verdict: Hung", "desync": "verdict: Desync", "none": "verdict: No hang"}[kind]
    assert first.startswith(word), first
    if ranks:
        assert f"rank {ranks[0]} " in first
        assert "← cause" in out
    assert "hang · " in out and "█" in out
    assert main(["summary", str(DATA / case), "--no-cache", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["hang"]["kind"] == kind and payload["hang"]["cause_ranks"] == ranks
    assert payload["answer"]["kind"] == kind and payload["answer"]["source"] == "hang"
    assert {p["rank"] for p in payload["hang"]["positions"]} == set(range(payload["hang"]["world_size"]))


def test_dumps_beside_profiler_traces_are_one_job(capsys: pytest.CaptureFixture[str]) -> None:
    """hang-skip holds the three ranks' profiler traces of steps 1-2 beside the dumps: the breakdown as ever, the
    hang first, and the cause's last traced events."""
    job = load(DATA / "hang-skip")
    assert job.n_ranks == 3 and job.n_iterations == 2
    h = job.hang
    assert h is not None and h.causes[0].trace and "gloo:all_reduce" in " ".join(h.causes[0].trace)
    assert job.verdict.kind == "hung"
    assert main(["summary", str(DATA / "hang-skip"), "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert out.index("verdict: Hung: rank 1") < out.index("hang · 3 Flight Recorder dumps") < out.index("3 ranks · 2")
    assert "Its profiler trace ends with" in out


def test_export_writes_the_entries(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["export", str(DATA / "subgroup-stuck"), "-o", str(out), "--no-cache"]) == 0
    entries = pl.read_parquet(out / "fr_entries.parquet")
    n = sum(parse(str(p)).tables["fr_entries"].num_rows for p in (DATA / "subgroup-stuck" / "pickle").iterdir())
    assert entries.height == 2 * n  # both forms of each dump: the export keeps what was read
    assert entries.schema["input_sizes"] == pl.List(pl.List(pl.Int64))
    pos = pl.read_parquet(out / "hang_positions.parquet")
    assert pos.filter(pl.col("cause")).get_column("rank").unique().to_list() == [1]
    for name in ("fr_dumps", "fr_pg_config", "fr_pg_status"):
        assert (out / f"{name}.parquet").exists()


def test_rank_by_rank_names_the_same(tmp_path: Path) -> None:
    job = load(DATA / "hang-skip", by_rank=True, dataset=tmp_path / "ds")
    assert job.hang is not None and (job.hang.kind, job.hang.cause_ranks) == ("hung", [1])
    assert job.summary()["hang"]["cause_ranks"] == [1]


def test_a_dump_without_a_rank_in_its_name(tmp_path: Path) -> None:
    for r in (0, 2):
        shutil.copy(DATA / "hang-skip" / "pickle" / f"fr_trace_rank_{r}", tmp_path / f"fr_trace_rank_{r}")
    shutil.copy(DATA / "hang-skip" / "pickle" / "fr_trace_rank_1", tmp_path / "stuck.dump")
    h = load(tmp_path).hang
    assert h is not None and h.cause_ranks == [1]
    assert any("without a rank in their name" in n for n in h.notes)


# ------------------------------------------------------------------------------------------- NCCL (synthetic)


@pytest.mark.parametrize("version", ["1.1", "1.4", "2.3", "2.10"])
def test_nccl_a_rank_that_stopped(tmp_path: Path, version: str) -> None:
    frd.write(frd.job(version, world=4, steps=6, fault="stopped", culprit=2), tmp_path)
    h = load(tmp_path).hang
    assert h is not None and (h.kind, h.cause_ranks) == ("hung", [2])
    assert h.stuck[0].seq == 6 and h.stuck[0].waiting == (0, 1, 3)
    pos = pl.from_arrow(h.positions).sort("rank")
    assert pos.get_column("started_seq").to_list() == [6, 6, 5, 6]
    assert pos.get_column("completed_seq").to_list() == [5, 5, 5, 5]
    assert "gloo" not in " ".join(h.notes)


def test_nccl_stuck_inside_a_collective(tmp_path: Path) -> None:
    """Every rank started the last all_reduce and none completed it: no rank is behind, the collective itself hangs
    (only NCCL's states can tell; gloo records no start)."""
    frd.write(frd.job("2.10", world=4, steps=5, fault="inside"), tmp_path, form="json")
    h = load(tmp_path).hang
    assert h is not None and h.kind == "hung" and h.causes == []
    assert h.headline.startswith("Hung inside all_reduce #5 of pg 0 (default_pg): every member entered it")


def test_nccl_a_gpu_that_never_started_the_collective(tmp_path: Path) -> None:
    """Every rank enqueued the last all_reduce; rank 2's GPU never started it (work before it on its stream does not
    finish) while the others started it and wait inside: rank 2 is the cause, not the network."""
    frd.write(frd.job("2.10", world=4, steps=5, fault="not-started", culprit=2), tmp_path)
    h = load(tmp_path).hang
    assert h is not None and (h.kind, h.cause_ranks) == ("hung", [2])
    assert h.causes[0].why == "not started" and h.stuck[0].unstarted == (2,)
    assert h.headline.startswith("Hung: rank 2 entered all_reduce #5 of pg 0 (default_pg) but its GPU never started "
                                 "it, where ranks 0, 1 and 3 started it and wait")
    states = dict(pl.from_arrow(h.positions).select("rank", "state").iter_rows())
    assert states == {0: "waiting", 1: "waiting", 2: "not started", 3: "waiting"}


def test_nccl_no_gpu_started_the_collective(tmp_path: Path) -> None:
    """Every rank enqueued the last all_reduce and no GPU started it: held before it on every GPU, no rank to blame;
    without starts in the dumps (gloo, NCCL without CUDA timing) the same dumps say only "inside"."""
    dumps = frd.job("2.10", world=4, steps=5, fault="queued")
    frd.write(dumps, tmp_path / "timed")
    h = load(tmp_path / "timed").hang
    assert h is not None and h.kind == "hung" and h.causes == []
    assert h.headline.startswith("Hung before all_reduce #5 of pg 0 (default_pg) started: every member entered it "
                                 "and no member's GPU started it")
    for dump in dumps.values():
        for e in dump["entries"]:
            e["time_discovered_started_ns"] = None
    frd.write(dumps, tmp_path / "untimed")
    h = load(tmp_path / "untimed").hang
    assert h is not None and h.headline.startswith("Hung inside all_reduce #5 of pg 0 (default_pg)")


def test_nccl_watchdog_lines_alone() -> None:
    """No dump, NCCL's watchdog lines: the rank that stopped first is the cause (tracekit.analysis.nccl.problems)."""
    job = load(NCCL / "pytorch_2.4_watchdog_rank_stopped.log")
    h = job.hang
    assert h is not None and (h.kind, h.source, h.cause_ranks) == ("hung", "nccl-log", [2])
    assert job.verdict.kind == "hung" and "rank 2 stopped first" in job.verdict.headline
    assert load(NCCL / "2.7_ib_openmpi.log").hang is None


def test_nccl_dumps_with_their_watchdog_lines(tmp_path: Path) -> None:
    frd.write(frd.job("2.10", world=4, steps=42, fault="stopped", culprit=2), tmp_path)
    shutil.copy(NCCL / "pytorch_2.4_watchdog_rank_stopped.log", tmp_path / "nccl.log")
    h = load(tmp_path).hang
    assert h is not None and h.cause_ranks == [2] and h.source == "flight-recorder"
    assert any("stopped first" in line for line in h.causes[0].nccl)
    assert "NCCL log: " in h.text


# ------------------------------------------------------------------------------------------- damage


_FIELDS = ("collective_seq_id", "process_group", "profiling_name", "input_sizes", "input_dtypes", "state", "retired",
           "time_created_ns", "record_id", "is_p2p", "frames")
_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.text(max_size=8),
                    st.lists(st.integers(-5, 5), max_size=3), st.lists(st.lists(st.integers(0, 9), max_size=2)),
                    st.floats(allow_nan=True), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5), st.sampled_from(_FIELDS), _VALUES), max_size=6),
       st.sampled_from(["pickle", "json"]))
def test_mistyped_dumps_never_break_the_analysis(tmp_path_factory: pytest.TempPathFactory, edits, form) -> None:
    """Any field of any entry of any rank's dump given any value: the job still reads, and the hang analysis answers
    (or the input is refused with one line)."""
    dumps = frd.job("2.10", world=4, steps=6, fault="stopped", culprit=2)
    for rank, i, key, value in edits:
        dumps[rank]["entries"][i % len(dumps[rank]["entries"])][key] = value
    d = tmp_path_factory.mktemp("mistyped")
    for rank, dump in dumps.items():
        data = pickle.dumps(dump, protocol=2) if form == "pickle" else frd.as_json(dump) \
            if _jsonable(dump) else pickle.dumps(dump, protocol=2)
        (d / f"nccl_trace_rank_{rank}").write_bytes(data)
    try:
        job = load(d)
    except TraceError:
        return
    h = job.hang
    assert h is not None and h.kind in hang_mod.KINDS and h.headline
    assert job.summary()["hang"]["kind"] == h.kind


def _jsonable(dump: dict) -> bool:
    try:
        frd.as_json(dump)
        return True
    except (TypeError, ValueError):
        return False
