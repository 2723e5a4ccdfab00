"""One verdict (DESIGN.md "Verdict"), on jobs designed to have each class: generated GPU jobs whose truth is known
(``benchmarks/jobgen.py``), CPU jobs with a slow rank, and the fallback where no replay can run."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest

from benchmarks import jobgen
from tests import kineto_traces as kt
from tracekit.analysis import verdict
from tracekit.api import load
from tracekit.model.units import format_duration

MS = 1_000_000
#: 2 hosts x 2 GPUs, 4 steps, 8 layers of 2.4 ms forward; gradients 8 x 8 MB
BASE = jobgen.JobSpec(ranks=4, gpus_per_host=2, steps=4, layers=8, param_bytes=8 << 20, bucket_bytes=16 << 20,
                      clock_skew_ns=300_000, fwd_ns=2_400_000)


def _verdict(tmp_path: Path, spec: jobgen.JobSpec, **load_kw):
    jobgen.write_job(tmp_path / "job", spec)
    job = load([str(tmp_path / "job")], link_bw=f"{spec.inter_bps / 1e9:g}Gbit", cache=False, **load_kw)
    return job, job.verdict


def _consistent(v) -> None:
    """No output contradicts itself: the headline is the text's first sentence, the class is the replays'."""
    a = v.answer
    assert v.text.startswith(v.headline) and a.kind == v.kind
    assert "Communication-bound" not in v.text and "is not the bottleneck" not in v.text
    if v.kind == "link-bound":
        assert a.shares["link"] >= verdict.SIGNIFICANT and a.shares["link"] >= a.shares["stragglers"]
    if v.kind == "straggler-bound" or (v.kind == "input-bound" and a.stragglers):
        assert a.shares["stragglers"] >= verdict.SIGNIFICANT and a.shares["stragglers"] > a.shares["link"]
    if v.kind in ("compute-bound", "host-bound"):
        assert a.shares["link"] < verdict.SIGNIFICANT and a.shares["stragglers"] < verdict.SIGNIFICANT
    if v.kind == "mixed" and a.shares["link"] >= verdict.MIXED:
        assert a.shares["stragglers"] >= verdict.MIXED


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_a_slow_link_is_link_bound_and_says_what_a_faster_one_buys(tmp_path: Path, parallel: str) -> None:
    _, v = _verdict(tmp_path, replace(BASE, parallel=parallel, inter_bps=10e9))
    _consistent(v)
    assert v.kind == "link-bound"
    free = jobgen.iteration_ns(replace(BASE, parallel=parallel, inter_bps=10e9, comm_free=True))
    assert v.answer.replays["free_communication"] == pytest.approx(free, rel=0.03)
    assert "Gbit/s to reach 0.9" in v.text  # what a faster link would buy


def test_a_slow_rank_is_straggler_bound_and_named(tmp_path: Path) -> None:
    spec = replace(BASE, inter_bps=200e9, stragglers=((3, 1.5),))
    _, v = _verdict(tmp_path, spec)
    _consistent(v)
    assert v.kind == "straggler-bound" and "rank 3" in v.headline
    s = v.answer.stragglers
    assert [x.rank for x in s] == [3] and s[0].doing == "device"
    balanced = jobgen.iteration_ns(replace(spec, stragglers=()))
    assert v.answer.replays["stragglers_removed"] == pytest.approx(balanced, rel=0.03)


def test_a_slow_rank_of_a_pipelines_lighter_stage_is_measured_against_its_peers(tmp_path: Path) -> None:
    # DP x TP x PP: stage 1 runs less device work than stage 0, so against every rank's median the heavier stage
    # would be "excess" and rank 20 (stage 1, 1.3x slower) would hide under stage 0's median
    spec = jobgen.JobSpec(ranks=32, layers=8, steps=4, gpus_per_host=8, tp=4, pp=2, microbatches=2, inter_bps=25e9,
                          intra_bps=400e9, clock_skew_ns=2_000_000, stragglers=((20, 1.3),))
    jobgen.write_job(tmp_path / "job", spec)
    job = load([str(tmp_path / "job")], link_bw="inter=25gbit,intra=400gbit", cache=False)
    b = job.analysis.whatif.balance
    at = {int(r): i for i, r in enumerate(b.ranks.tolist())}
    assert b.peers[at[0]] == b.peers[at[15]] != b.peers[at[16]] == b.peers[at[31]]  # the two stages
    v = job.verdict
    _consistent(v)
    s = v.answer.stragglers
    assert [x.rank for x in s] == [20] and s[0].doing == "device"
    light = int(b.median_device_ns[at[20]]) // b.iterations
    assert s[0].device_excess_ns == pytest.approx(0.3 * light, rel=0.05)
    balanced = jobgen.iteration_ns(replace(spec, stragglers=()))
    assert v.answer.replays["stragglers_removed"] == pytest.approx(balanced, rel=0.03)


def test_a_host_whose_input_stalls_is_named_with_what_it_was_doing(tmp_path: Path) -> None:
    spec = replace(BASE, inter_bps=200e9, stalls=((1, 40 * MS),))
    _, v = _verdict(tmp_path, spec)
    _consistent(v)
    assert v.kind == "input-bound" and "data loaders of host node001" in v.headline
    assert {x.rank for x in v.answer.stragglers} == {2, 3}
    assert all(x.doing == "input" for x in v.answer.stragglers) and "DataLoader" in v.text
    # the stall at the size the trace shows it (each rank's loader spans 40 ms more than the median rank's)
    assert all(x.input_excess_ns == pytest.approx(40 * MS, rel=0.01) for x in v.answer.stragglers)
    assert "40 ms more than the median rank's" in v.headline


def test_a_rank_whose_data_loader_stalls_is_input_bound_at_the_stall_s_size(tmp_path: Path) -> None:
    """One rank's loader stalls 50 ms every step (one GPU per host): the balance replay's excess of its thread's gaps
    was 37.5 ms ("its input pipeline takes 37.5 ms more"); its enumerate(DataLoader) spans 50.4 ms, 50 ms more than
    the median rank's, which is what the verdict says, naming the rank and its data loader."""
    spec = replace(BASE, gpus_per_host=1, inter_bps=200e9, stalls=((2, 50 * MS),))
    job, v = _verdict(tmp_path, spec)
    _consistent(v)
    assert v.kind == "input-bound" and v.headline.startswith("Input-bound: the job waits on rank 2's data loader")
    (s,) = v.answer.stragglers
    loads = job.events.filter(pl.col("name").cast(pl.String).str.starts_with("enumerate(DataLoader)")
                              & (pl.col("rank") == 2)).get_column("dur_ns")
    assert s.input_ns == pytest.approx(loads.mean(), rel=0.01)
    assert f"spans {format_duration(s.input_ns)} per iteration, {format_duration(s.input_excess_ns)} more" in v.headline
    assert s.input_excess_ns == pytest.approx(50 * MS, rel=0.01)
    balanced = jobgen.iteration_ns(replace(spec, stalls=()))
    assert v.answer.replays["stragglers_removed"] == pytest.approx(balanced, rel=0.03)


def test_every_rank_waiting_for_its_data_loader_is_input_bound(tmp_path: Path) -> None:
    """Every rank's loader takes 40 ms a step: no straggler, no link — the path runs through the loaders' waits (a
    third of it), which the verdict called compute-bound (the compute, two thirds, outweighed the host)."""
    _, v = _verdict(tmp_path, replace(BASE, inter_bps=200e9, stalls=((0, 40 * MS), (1, 40 * MS))))
    _consistent(v)
    assert v.kind == "input-bound" and "waiting for their data loader" in v.headline
    assert v.answer.shares["input"] >= verdict.SIGNIFICANT


def test_a_fast_link_and_balanced_ranks_are_compute_bound(tmp_path: Path) -> None:
    _, v = _verdict(tmp_path, replace(BASE, inter_bps=400e9))
    _consistent(v)
    assert v.kind == "compute-bound"


def test_slow_launches_are_host_bound(tmp_path: Path) -> None:
    # every forward operator takes 4 ms on the CPU against 0.3 ms of kernel: the GPU waits for its launches
    _, v = _verdict(tmp_path, replace(BASE, inter_bps=400e9, fwd_ns=300_000, cpu_op_ns=4 * MS))
    _consistent(v)
    assert v.kind == "host-bound"


def test_a_link_and_a_straggler_that_cost_alike_are_mixed_and_both_named(tmp_path: Path) -> None:
    spec = replace(BASE, inter_bps=15e9, stragglers=((1, 1.4),))
    _, v = _verdict(tmp_path, spec)
    _consistent(v)
    assert v.kind == "mixed" and "rank 1" in v.headline and "link" in v.headline


def test_a_cpu_job_waiting_on_a_slow_data_loader(tmp_path: Path) -> None:
    """gloo (CPU) ranks: rank 3's loader takes 30 ms more every iteration; everyone waits for it."""
    for r, evs in kt.gloo_job(4, 3, loader_ns={3: 30 * MS}).items():
        kt.write(tmp_path / f"rank{r}.json", evs, rank=r, world_size=4, backend="gloo")
    v = load([str(tmp_path)], cache=False).verdict
    _consistent(v)
    assert v.kind == "input-bound" and "rank 3's data loader" in v.headline
    assert v.answer.stragglers[0].doing == "input"


def test_summary_json_and_the_terminal_say_the_same(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from tracekit.cli import main

    jobgen.write_job(tmp_path / "job", replace(BASE, inter_bps=10e9))
    assert main(["summary", str(tmp_path / "job"), "--link-bw", "10gbit", "--json", "--no-cache"]) == 0
    answer = json.loads(capsys.readouterr().out)["answer"]
    assert answer["kind"] == "link-bound" and answer["text"].startswith(answer["headline"])
    assert main(["summary", str(tmp_path / "job"), "--link-bw", "10gbit", "--no-cache"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith("verdict: " + " ".join(answer["headline"].split()))


def test_rank_by_rank_the_verdict_is_the_replays_and_summary_says_it_does_not_replay(tmp_path: Path) -> None:
    """A job read rank by rank replays on the ranks' compact graphs: the same verdict as in memory. Its summary does
    not replay (the per-rank units' figures only) and says its verdict rests on the attribution."""
    jobgen.write_job(tmp_path / "job", replace(BASE, inter_bps=10e9))
    whole = load([str(tmp_path / "job")], link_bw="10Gbit", cache=False).verdict
    job = load([str(tmp_path / "job")], link_bw="10Gbit", cache=False, by_rank=True)
    assert job.summary()["answer"]["source"] == "attribution"
    assert "attribution alone" in job.summary()["answer"]["text"]
    v = job.verdict
    assert v.answer.source == "replay" and v.kind == whole.kind == "link-bound"


def test_one_measured_figure_for_now_and_the_replay_as_its_self_check(capsys: pytest.CaptureFixture[str]) -> None:
    """The bundled sample: summary said a median of 237 ms (the slowest rank's window), whatif "measured iteration
    233 ms" and its row at the job's own rate 237 ms, "0.98x". One measured figure everywhere (the median time between
    iteration starts); the replay's distance from it is the model's self-check, and speed-ups are against the replay."""
    import json

    from tracekit.cli import main

    sample = str(Path(__file__).resolve().parents[1] / "samples" / "ddp-gloo")
    assert main(["summary", sample, "--link-bw", "500mbit", "--json", "--no-cache"]) == 0
    s = json.loads(capsys.readouterr().out)
    now = s["job"]["median_iteration_ns"]
    assert s["answer"]["measured_iteration_ns"] == s["bottleneck"]["measured_iteration_ns"] == now
    replayed = s["answer"]["replayed_iteration_ns"]
    assert replayed == s["answer"]["replays"]["as_measured"] == s["bottleneck"]["replayed_iteration_ns"] != now
    assert s["answer"]["self_check"].startswith("The model replays the measured job within")
    assert s["answer"]["self_check"] in s["answer"]["text"]
    assert main(["whatif", sample, "--link-bw", "500mbit", "--bandwidth", "500mbit,1gbit", "--json",
                 "--no-cache"]) == 0
    w = json.loads(capsys.readouterr().out)
    assert w["measured_iteration_ns"] == now and w["replayed_iteration_ns"] == replayed
    own = w["rows"][0]
    assert own["iteration_ns"] == replayed and own["speedup"] == 1.0  # the job as it ran is no speed-up
    assert w["rows"][1]["speedup"] == pytest.approx(replayed / w["rows"][1]["iteration_ns"])
    assert main(["whatif", sample, "--link-bw", "500mbit", "--bandwidth", "500mbit", "--no-cache"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    from tracekit.views.formats import fmt_ns

    assert f"measured iteration {fmt_ns(now)}" in out and "1.00x" in out and "0.98x" not in out
    job = load([sample], link_bw="500mbit", cache=False)
    assert job.iteration_ns == now == job.verdict.measured_iteration_ns
    assert job.summary()["job"]["median_iteration_ns"] == now


def test_the_rank_everyone_waited_on_from_before_the_window_is_accounted_for(tmp_path: Path) -> None:
    """One traced step; rank 7 enters it 7.5 ms after the others (what delayed it happened before the trace began), so
    all the waiting is for rank 7. The links paragraph said "Rank 7 is the straggler" while the verdict did not name
    it; now the verdict says so, that its work is no more than its peers', and what the trace cannot tell."""
    spec = jobgen.JobSpec(ranks=8, gpus_per_host=4, steps=1, layers=8, inter_bps=100e9, late=((7, 7_500_000),))
    _, v = _verdict(tmp_path, spec)
    _consistent(v)
    assert "Rank 7 is the straggler" in v.links
    w = v.answer.waited_on
    assert w is not None and w.rank == 7 and w.before_window and w.iterations == 1
    assert w.entry_ns == pytest.approx(7_500_000, abs=500_000)  # the hosts' clocks are aligned to within that
    assert "waited most on rank 7" in v.text and "began before the traced window" in v.text
    assert "trace more steps to see whether it repeats" in v.text
    assert 7 not in {s.rank for s in v.answer.stragglers}
    # the same job entered together: nobody is waited on like that, and nothing is said
    _, calm = _verdict(tmp_path / "calm", replace(spec, late=()))
    assert calm.answer.waited_on is None and "began before the traced window" not in calm.text
