"""The what-if of a job analysed rank by rank, replayed where the ranks' graphs are held
(:mod:`tracekit.scale.rank_whatif`): the client holds the table of communication calls and what crosses ranks, the hosts
replay their ranks collective by collective — every prediction, the balance behind "stragglers removed", the contention
fit and the critical path of a replayed schedule must equal the combined graph's, in this process and on worker
processes, and the client must never combine the graph."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import tracekit
from benchmarks import jobgen
from tests.test_rank_paths import SPECS, generated
from tracekit.analysis.graph import whatif
from tracekit.analysis.graph.whatif import Scenario, predict_many
from tracekit.analysis.verdict import replay_unexplained
from tracekit.cli import main
from tracekit.scale import graphs
from tracekit.scale.rank_parts import Hosts
from tracekit.scale.rank_paths import RankPaths
from tracekit.scale.rank_whatif import open_model

ROOT = Path(__file__).resolve().parents[1]
#: what each job is replayed under: links slower and faster, free, full utilisation, compression, more workers, the
#: stragglers' excess removed (with and without communication)
SCENARIOS = [Scenario(), Scenario(free=True), Scenario(bandwidth_scale=0.25), Scenario(bandwidth_scale=4.0),
             Scenario(balanced=True), Scenario(efficiency="full"), Scenario(compression=4.0), Scenario(workers=64),
             Scenario(free=True, balanced=True)]


@pytest.fixture(scope="module", params=["ddp", "mesh", "fsdp"])
def job(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tracekit.Job]:
    yield from generated(request.param, tmp_path_factory)


def _equal_to_the_combined(an: object, jobs: int) -> None:
    ref = an.whatif  # type: ignore[attr-defined]
    with Hosts(jobs) as hosts:
        held = RankPaths.open(hosts, graphs.sources(an.dataset, an), an)  # type: ignore[attr-defined]
        model = open_model(held, an, line_rate_bps=an.line_rate_bps)  # type: ignore[attr-defined]
        assert model.graph is None and model.remote is not None
        assert predict_many(model, SCENARIOS) == predict_many(ref, SCENARIOS)
        assert model.contention == ref.contention
        if ref.contention.measured:  # the ranges' bounds of the fit re-cost compute on the hosts too
            lo, hi = whatif.recost_compute(ref, 1.1), whatif.recost_compute(model, 1.1)
            assert predict_many(hi, SCENARIOS[:3]) == predict_many(lo, SCENARIOS[:3])
        b, want = model.balance, ref.balance
        for f in ("ranks", "device_ns", "host_ns", "gap_ns", "median_device_ns", "median_host_ns", "device_factor",
                  "host_factor", "gap_factor"):
            assert np.array_equal(getattr(b, f), getattr(want, f)), f
        assert np.array_equal(b.peers >= 0, want.peers >= 0)
        for sc in (Scenario(free=True), Scenario(bandwidth_scale=0.5)):
            got = replay_unexplained(model, sc, an.iterations, an.ranks)  # type: ignore[attr-defined]
            assert got == replay_unexplained(ref, sc, an.iterations, an.ranks)  # type: ignore[attr-defined]


@pytest.mark.parametrize("jobs", [0, 2])
def test_predictions_equal_the_combined_graphs(job: tracekit.Job, jobs: int) -> None:
    _equal_to_the_combined(job.analysis, jobs)


@pytest.mark.parametrize("name", ["class-host-bound", "interleaved-pipeline"])
def test_recorded_jobs_with_contention_and_pairs(name: str, tmp_path: Path) -> None:
    """Real gloo jobs: compute slowed by transfers (the fit and its re-costing on the hosts), a pipeline's send/recv
    pairs queued on the sender's link across ranks."""
    with tracekit.load(ROOT / "tests" / "data" / "jobs" / name, link_bw="1gbit", dataset=tmp_path / "ds",
                       graphs=True) as j:
        assert j.analysis.whatif.contention.measured or name != "class-host-bound"
        _equal_to_the_combined(j.analysis, 2)


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", ["class-host-bound", "dp-tp-300mbit"])
def test_whatif_rank_by_rank_is_the_whatif_in_memory(name: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """``tracekit whatif`` with a dataset prints what it prints in memory (rows, ranges, verdict, bottleneck)."""
    common = ["whatif", str(ROOT / "tests" / "data" / "jobs" / name), "--link-bw", "1gbit", "--json", "--no-cache",
              "--bandwidth", "300mbit,3gbit"]
    assert _json(capsys, [*common, "--dataset", str(tmp_path / "ds")]) == _json(capsys, common)


def test_the_client_never_combines_the_graph(tmp_path: Path) -> None:
    jobgen.write_job(tmp_path / "job", SPECS["ddp"])
    with tracekit.load(tmp_path / "job", link_bw="10gbit", dataset=tmp_path / "ds", graphs=True) as j:
        rows = j.whatif(bandwidth=["1gbit", "40gbit"], stragglers_removed=True)
        v = j.verdict
        assert rows.height == 3 and v.answer.kind
        assert "graph" not in j.analysis.__dict__ and j.analysis.whatif.graph is None
    with tracekit.load(tmp_path / "job", link_bw="10gbit") as mem:
        assert mem.whatif(bandwidth=["1gbit", "40gbit"], stragglers_removed=True).equals(rows)
        assert mem.verdict.answer.as_dict() == v.answer.as_dict()


def test_jobs_one_at_a_time_where_few_fit(job: tracekit.Job, monkeypatch: pytest.MonkeyPatch) -> None:
    """A host with little room replays one job at a time (:data:`tracekit.scale.rank_whatif.REPLAY_BYTES`): the same
    predictions."""
    from tracekit.scale import rank_whatif

    monkeypatch.setattr(rank_whatif, "REPLAY_BYTES", 1)
    with Hosts(0) as hosts:
        an = job.analysis
        held = RankPaths.open(hosts, graphs.sources(an.dataset, an), an)
        model = open_model(held, an, line_rate_bps=an.line_rate_bps)
        assert model.remote.batch == 1
        assert predict_many(model, SCENARIOS) == predict_many(an.whatif, SCENARIOS)


def test_a_job_the_hosts_replayed_is_not_replayed_again(job: tracekit.Job, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each replay costs a round trip per collective: the verdict, its ranges and the bottleneck ask some of the same
    scenarios, and the hosts replay each once (the same predictions); the critical path of a replayed schedule (the
    verdict's caveat) is followed from the times the hosts kept of a free-communication replay, else runs its own."""
    from tracekit.scale.rank_whatif import RankReplays

    an = job.analysis
    asked = [SCENARIOS[2], Scenario(free=True), SCENARIOS[0], SCENARIOS[3], SCENARIOS[3]]
    want = predict_many(an.whatif, asked)
    shares = [replay_unexplained(an.whatif, sc, an.iterations, an.ranks) for sc in (Scenario(free=True), SCENARIOS[3])]
    ran: list[int] = []
    run = RankReplays._run
    monkeypatch.setattr(RankReplays, "_run", lambda self, batch, keep: ran.append(len(batch)) or run(self, batch, keep))
    with Hosts(0) as hosts:
        held = RankPaths.open(hosts, graphs.sources(an.dataset, an), an)
        model = open_model(held, an, line_rate_bps=an.line_rate_bps)
        first = predict_many(model, SCENARIOS[:3])
        assert predict_many(model, asked) == want and want[:3] == [first[2], first[1], first[0]]
        assert ran == [3, 1]  # the new scenario once, though asked twice
        # the caveat's path: free communication's times kept on the hosts since the first batch; another runs again
        assert replay_unexplained(model, Scenario(free=True), an.iterations, an.ranks) == shares[0]
        assert ran == [3, 1]
        assert replay_unexplained(model, SCENARIOS[3], an.iterations, an.ranks) == shares[1]
        assert ran == [3, 1, 1]
        assert replay_unexplained(model, Scenario(free=True), an.iterations, an.ranks) == shares[0]
        assert ran == [3, 1, 1]
