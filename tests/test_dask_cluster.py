"""The rank-by-rank mode on a real Dask cluster: a ``dask scheduler`` process and two ``dask worker`` processes on
localhost, started here as a user starts them by hand (not a LocalCluster inside the test), then stopped by their
process ids. summary, whatif and critical-path with ``--scheduler tcp://…`` give what the job gives in memory."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("dask.distributed")

from benchmarks import jobgen
from tracekit.cli import main

SPEC = jobgen.JobSpec(ranks=4, gpus_per_host=2, steps=3, layers=6, param_bytes=8 << 20, bucket_bytes=16 << 20,
                      clock_skew_ns=500_000, stragglers=((2, 1.25),))
#: how long the cluster may take to come up on a busy 2-core machine
START_S = 60


def _stop(procs: list[subprocess.Popen]) -> None:
    """Each process by its id: SIGTERM, then SIGKILL for one that does not go."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
            p.wait(timeout=10)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``tcp://127.0.0.1:PORT`` of a scheduler with two single-threaded worker processes (no nanny: each worker is
    the process we started)."""
    root = tmp_path_factory.mktemp("dask")
    sched_file = root / "scheduler.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                                     os.environ.get("PYTHONPATH")]))}
    log = open(root / "cluster.log", "wb")  # noqa: SIM115 (closed below)
    procs: list[subprocess.Popen] = []
    try:
        procs.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                       "--port", "0", "--no-dashboard", "--scheduler-file", str(sched_file)],
                                      stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root))
        deadline = time.monotonic() + START_S
        while not sched_file.exists():
            if time.monotonic() > deadline or procs[0].poll() is not None:
                pytest.fail(f"the dask scheduler did not start: {(root / 'cluster.log').read_text()[-2000:]}")
            time.sleep(0.2)
        address = json.loads(sched_file.read_text())["address"]
        for i in range(2):
            procs.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", address,
                                           "--nthreads", "1", "--no-nanny", "--no-dashboard", "--name", f"w{i}",
                                           "--local-directory", str(root / f"w{i}")],
                                          stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root))
        from dask.distributed import Client

        with Client(address, timeout="30s") as client:
            client.wait_for_workers(2, timeout=START_S)
            pids = set(client.run(os.getpid).values())
        assert pids == {p.pid for p in procs[1:]}  # the workers are the processes started here
        yield address
    finally:
        _stop(procs[::-1])
        log.close()
    assert all(p.poll() is not None for p in procs)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("job")
    jobgen.write_job(d, SPEC)
    return d


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_whatif_critical_path_and_summary_on_a_dask_cluster(cluster: str, job: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    common = [str(job), "--link-bw", "10gbit", "--json", "--no-cache"]
    on = ["--scheduler", cluster, "--dataset", str(tmp_path / "ds")]
    whatif = ["whatif", *common, "--bandwidth", "10gbit,40gbit"]
    assert _json(capsys, [*whatif, *on]) == _json(capsys, whatif)
    # the dataset the cluster wrote: every rank's graph came from a worker
    summaries = [json.loads(p.read_text()) for p in (tmp_path / "ds").glob("rank=*/summary.json")]
    assert len(summaries) == SPEC.ranks and all(s["graph"] for s in summaries)
    assert len({s["pid"] for s in summaries} - {os.getpid()}) == 2  # both workers, not this process
    path = _json(capsys, ["critical-path", *common, *on])
    assert path["summary"] == _json(capsys, ["critical-path", *common])["summary"]
    summary = _json(capsys, ["summary", *common, *on])
    assert summary["collectives"] == _json(capsys, ["summary", *common])["collectives"]
