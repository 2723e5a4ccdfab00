"""The rank-by-rank mode on a real Dask cluster: a ``dask scheduler`` process and two ``dask worker`` processes on
localhost, started here as a user starts them by hand (not a LocalCluster inside the test), then stopped by their
process ids. summary, whatif and critical-path with ``--scheduler tcp://…`` give what the job gives in memory."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("dask.distributed")

import tracekit
from benchmarks import jobgen
from tests.dask_processes import running_cluster
from tracekit.cli import main
from tracekit.scale.dataset import Dataset

SPEC = jobgen.JobSpec(ranks=4, gpus_per_host=2, steps=3, layers=6, param_bytes=8 << 20, bucket_bytes=16 << 20,
                      clock_skew_ns=500_000, stragglers=((2, 1.25),))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``tcp://127.0.0.1:PORT`` of a scheduler with two single-threaded worker processes (no nanny: each worker is
    the process we started)."""
    with running_cluster(tmp_path_factory.mktemp("dask")) as c:
        yield c.address


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
    ds = Dataset.open(tmp_path / "ds")
    assert ds is not None
    summaries = ds.summaries  # as the units returned them: where they ran is not written into their parts
    assert len(summaries) == SPEC.ranks and all(s["graph"] for s in summaries)
    assert len({s["pid"] for s in summaries} - {os.getpid()}) == 2  # both workers, not this process
    path = _json(capsys, ["critical-path", *common, *on])  # followed through actors holding the ranks' graphs
    assert path["summary"] == _json(capsys, ["critical-path", *common])["summary"]
    local = _json(capsys, ["critical-path", *common, "--dataset", str(tmp_path / "ds")])  # this process holds them
    assert path["segments"] == local["segments"] and len(path["segments"]) > 10
    summary = _json(capsys, ["summary", *common, *on])
    assert summary["collectives"] == _json(capsys, ["summary", *common])["collectives"]


def test_the_ranks_graphs_stay_on_the_workers(cluster: str, job: Path, tmp_path: Path) -> None:
    """The critical path rank by rank on the cluster: one actor per worker holds its ranks' graphs; the path followed
    through them is the one this process finds holding them itself."""
    from tracekit.scale import graphs
    from tracekit.scale.engine import DaskEngine
    from tracekit.scale.rank_parts import DaskHosts, Hosts
    from tracekit.scale.rank_paths import RankPaths

    with tracekit.load(job, link_bw="10gbit", dataset=tmp_path / "ds", graphs=True) as j:
        an = j.analysis
        with DaskEngine(cluster) as eng, DaskHosts(eng.client) as hosts:
            held = RankPaths.open(hosts, graphs.sources(an.dataset, an), an)
            got = held.paths(an.iterations, an.ranks)
            pids = hosts.pids()
            assert len(set(pids)) == 2 and os.getpid() not in pids
            assert sorted(hosts.home.values()) == [0, 0, 1, 1]  # the ranks dealt to both
        with Hosts(0) as here:
            want = RankPaths.open(here, graphs.sources(an.dataset, an), an).paths(an.iterations, an.ranks)
        assert got.height > 10 and got.equals(want)
