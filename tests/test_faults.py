"""What tracekit survives: faults injected on purpose — a process killed, a dataset damaged or removed, a rank
deleted or cut short, a file damaged, a disk full — each costing time or a warning, never the answer. The sections
below are the list in docs/faults.md, one test per line there."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks import jobgen
from tests import unit_hooks
from tests.dask_processes import running_cluster
from tests.tmpfs_mounts import needs_mount, tmpfs
from tracekit.cli import main
from tracekit.scale import engine
from tracekit.scale.dataset import Dataset
from tracekit.scale.unit import Unit, run_unit

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples" / "ddp-gloo"
SPEC = jobgen.JobSpec(ranks=4, gpus_per_host=2, steps=3, layers=6, param_bytes=8 << 20, bucket_bytes=16 << 20,
                      clock_skew_ns=500_000, stragglers=((2, 1.25),))


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("job")
    jobgen.write_job(d, SPEC)
    return d


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def _digests(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*"))
            if p.is_file()}


# --- killed ------------------------------------------------------------------------------------------------------


def test_a_unit_run_twice_writes_the_same_bytes(job: Path, tmp_path: Path) -> None:
    # what makes a task run again after a lost worker indistinguishable from one run once: every file of the part,
    # the rank's dependency graph and the summary included, is the same bytes (the graph's hand-off edges came out of
    # a hash group-by in any order, so graph.edges.parquet differed between runs)
    trace = sorted(job.rglob("*.json*"))[1]
    parts = []
    for k in range(3):
        staging = tmp_path / f"s{k}"
        staging.mkdir()
        summary = run_unit(Unit(0, str(trace), str(staging), None, 1 << 30, graph=True))
        assert summary["graph"] and summary["pid"] == os.getpid()  # where it ran is returned, not written
        parts.append(_digests(staging / "part-000000"))
    assert {"graph.edges.parquet", "graph.act.parquet", "summary.json", "events.parquet"} <= set(parts[0])
    assert parts[1] == parts[0] and parts[2] == parts[0]


@pytest.fixture(scope="module")
def marks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("marks")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, marks: Path) -> Iterator:
    """A real scheduler and two worker processes whose units announce themselves (:mod:`tests.unit_hooks`)."""
    pytest.importorskip("dask.distributed")
    env = {unit_hooks.MARKS: str(marks), unit_hooks.LINGER: "0.5", "TRACEKIT_TEST_PRELOAD": "1"}
    with running_cluster(tmp_path_factory.mktemp("dask"), env=env, preload="tests.unit_hooks") as c:
        yield c


class _Killer(threading.Thread):
    """Kills, by its pid and once, the process that starts its ``own``-th task (from the tasks' marks), ``delay``
    seconds into it (the task lingers longer: still running). ``own=2``: a worker that also holds the result of its
    first task, which the command has read by then."""

    def __init__(self, marks: Path, own: int = 1, delay: float = 0.0, pids: set[int] | None = None) -> None:
        super().__init__(daemon=True)
        self.marks, self.own, self.delay, self.pids = marks, own, delay, pids
        self.killed: int | None = None
        self.victim_task = ""
        self.done = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + 120
        while not self.done.is_set() and time.monotonic() < deadline:
            seen = sorted((m.name.rsplit("-", 3) for m in self.marks.iterdir()), key=lambda m: int(m[3]))
            started: dict[str, int] = {}
            for kind, task, pid, _ in seen:
                started[pid] = started.get(pid, 0) + 1
                if started[pid] == self.own:
                    assert self.pids is None or int(pid) in self.pids, "a task ran outside the workers"
                    time.sleep(self.delay)
                    os.kill(int(pid), signal.SIGKILL)
                    self.killed, self.victim_task = int(pid), f"{kind}-{task}"
                    return
            time.sleep(0.02)


#: when the worker is killed: running its first task; running its second, holding the first one's result (which the
#: command has read: the scheduler would run it again, and the files it writes must be the same bytes); running a
#: graph unit of a dataset made without graphs (``critical-path`` on what ``summary`` made)
MOMENTS = [("summary", 1, 0.0), ("whatif", 2, 0.3), ("critical-path", 1, 0.1)]


@pytest.mark.parametrize(("command", "own", "delay"), MOMENTS)
def test_a_dask_worker_killed_mid_task_costs_time_not_the_answer(cluster, marks: Path, job: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str], command: str,
                                                                 own: int, delay: float) -> None:
    args = [command, str(job), "--link-bw", "10gbit", "--json"]
    if command == "whatif":
        args += ["--bandwidth", "10gbit,40gbit"]
    undisturbed = _json(capsys, [*args, "--engine", "local", "--dataset", str(tmp_path / "local")])
    pids = cluster.top_up(2)  # two workers (a replacement for the one an earlier case killed)
    on_dask = ["--scheduler", cluster.address, "--dataset", str(tmp_path / "dask")]
    if command == "critical-path":  # the dataset made by summary, without graphs: the graph units run now
        _json(capsys, ["summary", str(job), "--json", *on_dask])
    for p in marks.iterdir():
        p.unlink()
    killer = _Killer(marks, own, delay, set(pids.values()))
    killer.start()
    try:
        out = _json(capsys, [*args, *on_dask])
    finally:
        killer.done.set()
        killer.join()
    assert killer.killed is not None, "no worker was killed"
    assert out == undisturbed
    # the killed worker's task ran again, on the other worker
    again = [p.name for p in marks.iterdir() if p.name.startswith(f"{killer.victim_task}-")
             and int(p.name.split("-")[2]) != killer.killed]
    assert again, sorted(p.name for p in marks.iterdir())
    assert command != "critical-path" or killer.victim_task.startswith("graph-")
    ds = Dataset.open(tmp_path / "dask")
    assert ds is not None and ds.verify()


def test_a_local_worker_process_killed_costs_time_not_the_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv(unit_hooks.MARKS, str(marks))  # the spawned processes inherit it
    monkeypatch.setenv(unit_hooks.LINGER, "0.3")
    killer = _Killer(marks, own=2, delay=0.1)
    killer.start()
    try:
        got = dict(engine.LocalEngine(jobs=2).map(unit_hooks.slow_square, list(range(6))))
    finally:
        killer.done.set()
        killer.join()
    assert killer.killed is not None and killer.killed != os.getpid()
    assert got == {i: i * i for i in range(6)}


# --- a dataset's life cycle ----------------------------------------------------------------------------------------


def test_a_dataset_is_one_directory_rm_rf_removes(job: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                  ) -> None:
    home = tmp_path / "here" / "ds"
    assert main(["summary", str(job), "--json", "--dataset", str(home)]) == 0
    other = sorted(job.rglob("*.json"))[:2]
    assert main(["summary", *map(str, other), "--json", "--dataset", str(home), "--rebuild"]) == 0
    capsys.readouterr()
    assert os.listdir(tmp_path / "here") == ["ds"]  # no sibling data directory, no lock file beside it
    assert {n for n in os.listdir(home) if not n.startswith(".version-")} == {"current"}
    ds = Dataset.open(home)
    assert ds is not None and ds.root.parent == home and ds.ranks.num_rows == 2
    del ds
    import shutil

    shutil.rmtree(home)
    assert os.listdir(tmp_path / "here") == []


def test_the_same_inputs_are_the_same_after_damage(job: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                   ) -> None:
    # what a failed run left (here: files of the dataset damaged) is repaired by running the command again: the
    # units of the damaged parts run again, the rest is carried over; no "other inputs", no flag needed
    args = ["whatif", str(job), "--link-bw", "10gbit", "--json", "--bandwidth", "10gbit,40gbit",
            "--dataset", str(tmp_path / "ds")]
    first = _json(capsys, args)
    ds = Dataset.open(tmp_path / "ds")
    assert ds is not None
    for name in ("rank=1/graph.edges.parquet", "rank=2/breakdown.parquet"):
        p = ds.root / name
        data = p.read_bytes()
        p.unlink()
        p.write_bytes(data[:100] + bytes(8) + data[108:])
    (ds.root / "rank=3" / "collectives.parquet").unlink()
    del ds
    assert main(args) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == first
    assert "3 files of the dataset damaged" in captured.err and "3 of 4 units run again" in captured.err
    ds = Dataset.open(tmp_path / "ds")
    assert ds is not None and ds.verify()
    assert main(args) == 0 and "damaged" not in capsys.readouterr().err  # whole again: reused silently


def test_a_graph_damaged_during_a_run_is_built_again(job: Path, tmp_path: Path) -> None:
    import tracekit

    with tracekit.load(job, link_bw="10gbit", dataset=tmp_path / "ref", graphs=True) as ref:
        want = ref.critical_path_summary
    with tracekit.load(job, link_bw="10gbit", dataset=tmp_path / "ds", graphs=True) as j:
        ds = j.analysis.dataset
        assert ds is not None
        p = ds.root / "rank=0" / "graph.act.parquet"
        data = p.read_bytes()
        p.unlink()
        p.write_bytes(data[:-20])  # damaged after the build, before the graphs are read
        assert j.critical_path_summary.equals(want)
        assert any("graph of rank=0 did not verify: built again from the rank's events" in str(d)
                   for d in ds.diagnostics)


def test_no_cache_advice_names_no_deleted_dataset(job: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from tracekit.scale import graphs

    monkeypatch.setattr(graphs, "verify_files", lambda *a, **k: False)  # graphs that never verify: a failing disk
    assert main(["critical-path", str(job), "--json", "--no-cache", "--engine", "local"]) == 1
    err = capsys.readouterr().err
    assert "do not verify" in err and "tracekit-dataset-" not in err and "--rebuild" not in err


def test_a_failed_build_leaves_nothing_a_rerun_trips_over(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("hello, not a trace")  # the unit fails, the build with it (a single input: an error)
    home = tmp_path / "ds"
    assert main(["summary", str(bad), "--dataset", str(home)]) == 1
    assert not home.exists()
    assert main(["summary", str(SAMPLES), "--json", "--dataset", str(home)]) == 0
    capsys.readouterr()


def _suggested_flags() -> dict[str, set[str]]:
    """Every ``--flag`` named in a string of the package's source (messages, notes, help), with the files naming it;
    docstrings and other programs' flags (``srun --label``, ``horovodrun --timeline-filename``, ``docker
    --timestamps``, ``torchrun --standalone --nproc_per_node``; the parser's own worker ``--part``) left out."""
    import ast
    import re

    foreign = {"--label", "--timeline-filename", "--timestamps", "--part", "--standalone", "--nproc_per_node"}
    out: dict[str, set[str]] = {}
    for path in [*ROOT.joinpath("tracekit").rglob("*.py"), *ROOT.joinpath("parsers").rglob("*.py"),
                 *ROOT.joinpath("tui").rglob("*.py")]:
        tree = ast.parse(path.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) and n.body
                and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9_-]+", node.value):
                    if flag not in foreign:
                        out.setdefault(flag, set()).add(str(path.relative_to(ROOT)))
    return out


def test_every_flag_a_message_suggests_exists() -> None:
    from tracekit.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.choices and isinstance(a.choices, dict))
    accepted = {name: set(p._option_string_actions) | set(parser._option_string_actions)
                for name, p in sub.choices.items()}
    suggested = _suggested_flags()
    assert "--rebuild" in suggested and "--link-bw" in suggested
    for flag, where in suggested.items():
        assert any(flag in opts for opts in accepted.values()), (flag, where)
    # what the dataset's code suggests is said to every command that builds one (summary, whatif, critical-path...)
    for flag, where in suggested.items():
        if any(w.startswith(("tracekit/scale/", "tracekit/loading/")) for w in where):
            assert flag in accepted["summary"] and flag in accepted["whatif"], (flag, where)


# --- deleted -------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sixteen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("sixteen")
    jobgen.write_job(d, jobgen.JobSpec(ranks=16, gpus_per_host=4, steps=3, layers=4, param_bytes=4 << 20,
                                       bucket_bytes=8 << 20))
    return d


@pytest.mark.parametrize("mode", [[], ["--engine", "local"]], ids=["in memory", "rank by rank"])
def test_a_deleted_rank_is_named_with_what_it_costs(sixteen: Path, tmp_path: Path, mode: list[str],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    import tracekit

    job = tmp_path / "job"
    shutil.copytree(sixteen, job)
    whole = _json(capsys, ["summary", str(job), "--json", "--no-cache", *mode])
    assert whole["missing_ranks"] == [] and not any("missing" in d for d in whole["diagnostics"])
    (rank9,) = [p for p in job.glob("*.json") if '"rank": 9,' in p.read_text()]
    rank9.unlink()
    assert main(["summary", str(job), "--no-cache", *mode]) == 0
    err = capsys.readouterr().err
    assert "rank 9 of 16 is missing from the inputs (world size 16 in the traces' distributedInfo" in err
    for effect in ("matched among the 15 ranks present and flagged partial", "waiting and transfer are not told apart",
                   "the verdict compare the ranks present only"):
        assert effect in err
    assert _json(capsys, ["summary", str(job), "--json", "--no-cache", *mode])["missing_ranks"] == [9]
    with tracekit.load(job, cache=False, by_rank=bool(mode)) as j:
        assert j.missing_ranks == [9]


# --- truncated -----------------------------------------------------------------------------------------------------


def test_a_rank_cut_in_half_measures_its_loss_and_tells_one_story(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "job"
    jobgen.write_job(job, jobgen.JobSpec(ranks=4, gpus_per_host=2, steps=8, layers=6, param_bytes=8 << 20,
                                         bucket_bytes=16 << 20))
    cut = next(p for p in job.glob("*.json") if '"rank": 1,' in p.read_text())
    size = cut.stat().st_size
    os.truncate(cut, size // 2)
    assert main(["summary", str(job), "--no-cache"]) == 0
    out, err = capsys.readouterr()
    flat = " ".join(out.split())
    import re

    m = re.search(r"rank 1's trace is cut short: about ([\d.]+) kB of it \((\d+) %\) is missing", err)
    assert m, err
    assert abs(float(m.group(1)) * 1e3 - (size - size // 2)) < 0.02 * size and 45 <= int(m.group(2)) <= 55
    lost = re.search(r"it has (\d+) of the (\d+) iterations its peers have: iterations (\d+)-(\d+) are lost", err)
    assert lost and int(lost.group(2)) == 8 and int(lost.group(1)) < 8 and int(lost.group(4)) == 7
    # the links paragraph and the verdict: the same share of exposed communication split, neither saying it cannot be
    # told apart at all
    covered = re.findall(r"where its collectives were matched on all their ranks \((\d+) % of it\)", flat)
    assert len(covered) == 2 and covered[0] == covered[1], flat
    assert "cannot be told apart: no collective" not in flat and "were not matched across ranks)" not in flat


# --- corrupted -----------------------------------------------------------------------------------------------------

NCCL_LOG = ROOT / "tests" / "data" / "nccl" / "2.7_ib_openmpi.log"


def _with_line(at: int, line: bytes, tmp_path: Path, name: str, replace: bool = True) -> Path:
    lines = NCCL_LOG.read_bytes().split(b"\n")
    lines[at - 1:at if replace else at - 1] = [line]
    p = tmp_path / name
    p.write_bytes(b"\n".join(lines))
    return p


def test_nul_bytes_early_in_an_nccl_log_are_read_past(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = _with_line(3, bytes(40), tmp_path, "bad.log")  # was refused as "not a trace" (sniffing reads the head)
    doc = _json(capsys, ["summary", str(bad), "--json", "--no-cache"])
    assert any("line 3" in d and "not NCCL log lines (skipped" in d for d in doc["diagnostics"])
    import tracekit

    # beside the job's traces (which it once took down too): read, and the traces' figures as without it (through the
    # API: the verdict's replays of this pairing of a log and an unrelated job are slow, and not what is tested here)
    with tracekit.load([SAMPLES, bad], cache=False) as both, tracekit.load(SAMPLES, cache=False) as alone:
        assert both.breakdown.equals(alone.breakdown)
        assert {f.format for f in both.analysis.traces.files} == {"kineto", "nccl-log"}


def test_an_unreadable_input_among_several_costs_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                           ) -> None:
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(bytes(range(256)) * 20)
    alone = _json(capsys, ["summary", str(SAMPLES), "--json", "--no-cache"])
    for mode in ([], ["--engine", "local"]):
        doc = _json(capsys, ["summary", str(SAMPLES), str(garbage), "--json", "--no-cache", *mode])
        assert doc["job"] == alone["job"] if not mode else doc["job"]["ranks"] == 2
        assert any(str(garbage) in d and "left out, the other inputs analysed without it" in d
                   for d in doc["diagnostics"])
        assert main(["summary", str(garbage), "--no-cache", *mode]) == 1  # alone, it is the error
        assert "not a trace tracekit can read" in capsys.readouterr().err


def test_every_dropped_nccl_line_is_counted(tmp_path: Path) -> None:
    from tracekit.parsers import parse

    log = _with_line(11, b"host0:1234:1234 [0] NCCL INFO Ring 00 : 0 -> 1 -> 99999999999999999999999", tmp_path,
                     "ring.log", replace=False)
    messages = [str(d) for d in parse(str(log)).diagnostics]
    assert any("line 11" in m and "1x INFO 'damaged Ring line'" in m for m in messages), messages
    assert not [str(d) for d in parse(str(NCCL_LOG)).diagnostics if "damaged" in str(d)]


# --- disk full -----------------------------------------------------------------------------------------------------


@needs_mount
def test_a_full_disk_leaves_the_previous_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "job"
    jobgen.write_job(job, jobgen.JobSpec(ranks=4, gpus_per_host=2, steps=8, layers=6, param_bytes=8 << 20,
                                         bucket_bytes=16 << 20))
    with tmpfs("size=400k") as disk:
        home = disk / "ds"
        one = str(sorted(job.glob("*.json"))[0])
        before = _json(capsys, ["summary", one, "--json", "--dataset", str(home)])
        used = os.statvfs(disk)
        # the whole job does not fit beside it: one line naming the dataset, and the previous one stays whole
        assert main(["summary", str(job), "--json", "--dataset", str(home), "--rebuild"]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"tracekit: {home}: cannot write the dataset here: No space left on device"]
        assert {n for n in os.listdir(home) if not n.startswith(".version-")} == {"current"}
        assert len(os.listdir(home)) == 2  # current and its version: the failed one is gone
        assert os.statvfs(disk).f_bfree == used.f_bfree  # and so is the space it took
        ds = Dataset.open(home)
        assert ds is not None and ds.verify()
        assert _json(capsys, ["summary", one, "--json", "--dataset", str(home)]) == before
        # a new dataset on the full disk: nothing of it is left
        assert main(["summary", str(job), "--dataset", str(disk / "other")]) == 1
        assert not (disk / "other").exists()
