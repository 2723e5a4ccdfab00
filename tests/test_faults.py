"""What tracekit survives: faults injected on purpose — a process killed, a file truncated, deleted or corrupted, a
disk full — each costing time or a warning, never the answer. Each test is one line of the list in docs/faults.md.

Killed
- a Dask worker killed by its pid while it holds a task, during ``summary``, ``whatif`` and ``critical-path`` on a
  real scheduler with two workers: the same answer as undisturbed (the scheduler runs the task again; a unit gives
  the same bytes however often it runs)
- a local worker process killed: the pool starts again for the tasks not done
- the build killed: the previous dataset stays (tests/test_dataset.py::test_killed_build_leaves_the_previous_dataset)

Truncated, deleted, corrupted, full
- see the sections below
"""

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
    from tests.dask_processes import Cluster

    c = Cluster(tmp_path_factory.mktemp("dask"), env={unit_hooks.MARKS: str(marks), unit_hooks.LINGER: "0.5",
                                                      "TRACEKIT_TEST_PRELOAD": "1"}, preload="tests.unit_hooks")
    try:
        c.start(2)
        yield c
    finally:
        c.stop()


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
