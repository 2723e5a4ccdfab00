"""Real jobs beyond plain DDP, recorded once on this project's VM (tests/data/jobs/README.md): DDP profiled
without record_shapes at two line rates, FSDP2, a two-stage GPipe pipeline, gradient accumulation and a job
with two process groups (tensor-parallel pairs + data parallel). Each is checked for what tracekit must get
right on it: attribution adds up, every collective matches, the critical path accounts for every iteration,
the what-if moves the right way — and no figure rests on a size nobody knows."""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path

import polars as pl
import pytest

from tracekit.analysis.graph import whatif
from tracekit.analysis.pipeline import Analysis, analyse
from tracekit.cli import main
from tracekit.loading import traceset
from tracekit.model.schema import CLASSES
from tracekit.views import summary

JOBS = Path(__file__).resolve().parent / "data" / "jobs"


@cache
def _analysis(name: str, rate: float | None = 1e9, line_rates: tuple[tuple[str, float], ...] = ()) -> Analysis:
    return analyse(traceset.load([str(JOBS / name)], use_cache=False), link_bw_bps=rate, line_rates=dict(line_rates))


def _run(name: str) -> dict:
    return json.loads((JOBS / name / "run.json").read_text())


def _truth_ns(name: str) -> float:
    """The job's own clock: median wall time of its profiled steps."""
    import statistics

    run = _run(name)
    return statistics.median(s["wall_s"] for r in run["step_times"]["ranks"].values() for s in r["steps"]
                             if s["phase"] == "active") * 1e9


@pytest.mark.parametrize("name", ["ddp-noshapes-1gbit", "fsdp-1gbit", "pipeline-1gbit", "accumulate-1gbit",
                                  "dp-tp-300mbit"])
def test_every_job_adds_up_and_matches(name: str) -> None:
    res = _analysis(name)
    b = pl.from_arrow(res.breakdown)
    assert b.height == len(_run(name)["profiler"]["profiled_steps"]) * _run(name)["world_size"]
    assert (b.select(pl.sum_horizontal([f"{c}_ns" for c in CLASSES])).to_series() == b.get_column("wall_ns")).all()
    ov = summary.collectives_overview(res.instances)
    assert ov["instances"] > 0 and ov["matched"] == ov["instances"]
    assert ov["partial"] == 0 and ov["inconsistent"] == 0 and ov["size_mismatch"] == 0
    assert b.get_column("wait_ns").null_count() == 0  # every window's exposed communication is split
    # the critical path of every iteration is as long as the iteration
    cps = res.critical_path_summary
    assert cps.height == len(_run(name)["profiler"]["profiled_steps"])
    assert (cps.get_column("path_ns") == cps.get_column("iteration_ns")).all()
    # a measured schedule contradicts hardly any dependency (clock noise between ranks may flip one)
    assert sum(res.graph.violated.values()) <= 0.01 * res.graph.src.size


def test_fsdp_all_gathers_in_forward_and_backward_and_reduces_gradients() -> None:
    res = _analysis("fsdp-1gbit")
    inst = pl.from_arrow(res.instances)
    per_it = inst.group_by(["iteration", "op"]).len()
    layers = _run("fsdp-1gbit")["model"]["layers"] + 1  # one FSDP unit per Linear
    gathers = per_it.filter(pl.col("op") == "allgather").get_column("len")
    reduces = per_it.filter(pl.col("op") == "allreduce").get_column("len")  # gloo's reduce-scatter fallback
    assert (gathers >= layers).all() and (gathers <= 2 * layers).all()
    assert (reduces == layers).all()
    # every gradient byte is reduced once per iteration (fp32 parameters, padded to the world size)
    grad = _run("fsdp-1gbit")["model"]["gradient_bytes"]
    red = inst.filter(pl.col("op") == "allreduce").group_by("iteration").agg(pl.col("bytes").sum())
    assert ((red.get_column("bytes") - grad).abs() < 0.01 * grad).all()


def test_pipeline_send_recv_pairs_match_and_the_receiver_waits() -> None:
    res = _analysis("pipeline-1gbit")
    inst = pl.from_arrow(res.instances)
    assert set(inst.get_column("op").to_list()) == {"sendrecv"}
    assert (inst.get_column("matched_by") == "p2p order").all()
    mem = pl.from_arrow(res.members).join(pl.from_arrow(res.collectives.select(["rank", "collective_id", "op"])),
                                          on=["rank", "collective_id"])
    # a send never waits for its receiver (gloo sends eagerly); a receive posted early waits for the send
    assert (mem.filter(pl.col("op") == "send").get_column("wait_ns") == 0).all()
    assert mem.filter(pl.col("op") == "recv").get_column("wait_ns").max() > 0
    # both stages' gloo work is in the graph, not swallowed by the operators it overlaps
    assert res.whatif.comm.height == 2 * inst.height
    m = res.whatif
    slow, same, fast = (whatif.predict(m, whatif.Scenario(bandwidth_bps=r)) for r in (1e8, 1e9, 1e10))
    assert slow > same > fast
    assert abs(same / _truth_ns("pipeline-1gbit") - 1) < 0.15


def test_gradient_accumulation_iterations_hold_every_micro_step() -> None:
    res = _analysis("accumulate-1gbit")
    run = _run("accumulate-1gbit")
    inst = pl.from_arrow(res.instances)
    buckets = len(run["ddp"]["rebuilt_bucket_sizes"].split(","))
    # one all-reduce per bucket per iteration: the no_sync micro-step communicates nothing
    assert (inst.group_by("iteration").len().get_column("len") == buckets).all()
    b = pl.from_arrow(res.breakdown)
    assert (b.get_column("comm_bytes") == run["model"]["gradient_bytes"]).all()
    # the iteration (two forward/backward passes) is as long as the job's own clock says
    assert abs(res.whatif.measured_iteration_ns / _truth_ns("accumulate-1gbit") - 1) < 0.15


def test_two_process_groups_are_told_apart_and_costed_on_their_own() -> None:
    res = _analysis("dp-tp-300mbit", 3e8)
    run = _run("dp-tp-300mbit")
    inst = pl.from_arrow(res.instances)
    groups = {tuple(g) for g in run["parallel"]["tp_groups"] + run["parallel"]["dp_groups"]}
    assert {tuple(r) for r in inst.get_column("ranks").to_list()} == groups
    assert (inst.get_column("nranks") == 2).all()
    assert not any("more ranks than their group" in str(d) for d in res.diagnostics)
    assert {"tp", "dp"} <= set(res.pg_desc.values())
    m = _analysis("dp-tp-300mbit", None, (("dp", 3e8), ("tp", 2e10))).whatif
    base = whatif.predict(m, whatif.Scenario())
    dp_slow = whatif.predict(m, whatif.Scenario(links=(("dp", 1e8),)))
    dp_fast = whatif.predict(m, whatif.Scenario(links=(("dp", 3e9),)))
    tp_slow = whatif.predict(m, whatif.Scenario(links=(("tp", 1e9),)))
    assert dp_slow > base > dp_fast
    assert tp_slow > base
    with pytest.raises(ValueError, match="no link matches 'pp'"):
        whatif.predict(m, whatif.Scenario(links=(("pp", 1e9),)))


def test_cli_per_link_rates(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(JOBS / "dp-tp-300mbit")
    assert main(["whatif", path, "--link-bw", "dp=300mbit,tp=20gbit", "--bandwidth", "dp=100mbit,dp=1gbit+tp=5gbit",
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["links"] for r in rows] == ["dp=100 Mbit/s", "dp=1 Gbit/s,tp=5 Gbit/s", None]  # + stragglers removed
    rows = rows[:2]
    assert rows[0]["iteration_ns"] > rows[1]["iteration_ns"]
    assert main(["whatif", path, "--link-bw", "dp=300mbit", "--bandwidth", "dp=fast"]) == 1
    assert "--bandwidth" in capsys.readouterr().err


# --- sizes unknown: never a verdict from an unknown ------------------------------------------------------------


def test_sizes_unknown_are_said_and_never_summed_as_zero(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(JOBS / "ddp-noshapes-1gbit")
    assert main(["summary", path, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    sizes = data["transfer_sizes"]
    assert sizes["known"] == 0 and sizes["unknown"] == sizes["calls"] > 0 and sizes["by_source"] == {}
    assert all(r["comm_bytes"] is None and r["bus_bytes"] is None for r in data["breakdown"])
    assert data["job"].get("busbw_gbps") is None
    assert "record_shapes" in data["verdict"] and "not known" in data["verdict"]
    b = data["bottleneck"]
    assert b["sizes"]["unknown"] == sizes["calls"] and b["scaling_factor_full_utilisation"] is None
    assert "bottleneck" not in b["text"].split(".")[-1] or "cannot be told" in b["text"]
    assert "cannot be told" in b["text"] and "--link-bw" in b["text"] and "record_shapes" in b["text"]
    assert not b["text"].startswith(("The link is the bottleneck", "The network is not"))


def test_sizes_unknown_with_a_line_rate_the_verdict_names_its_assumption(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(JOBS / "ddp-noshapes-100mbit")
    assert main(["summary", path, "--json", "--link-bw", "100mbit"]) == 0
    b = json.loads(capsys.readouterr().out)["bottleneck"]
    assert b["sizes"]["estimated"] == b["sizes"]["calls"] and b["sizes"]["measured"] == 0
    assert b["assumption"] and "estimated from the transfer times" in b["assumption"]
    assert b["assumption"] in b["text"] and "record_shapes" in b["text"]


def test_whatif_without_sizes_or_line_rate_says_what_to_pass(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["whatif", str(JOBS / "ddp-noshapes-1gbit"), "--bandwidth", "10gbit"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--link-bw" in err and "record_shapes" in err


def test_time_estimated_sizes_predict_another_line_rate() -> None:
    """No shapes recorded: sizes come from transfer times at the 1 Gbit/s line rate; the job recorded at
    100 Mbit/s is then predicted from them (and the other way round). These are two separate recordings made while
    other work shared the VM (tests/data/jobs/README.md), so the bounds hold the machine's noise too: towards the
    slower link 27 % since gloo's host work per byte is 0.8 ns (was 1.5, which the loaded VM's 1 Gbit/s recording
    happened to fit: 18 %), the value the interleaved recordings measure — there, on one job whose rate changes
    while it runs, it brought DDP without shapes from 10.8 / 5.0 % median error (faster / slower) to 6.6 / 3.3 %,
    worst 22.4 / 18.7 to 16.4 / 9.0 % (docs/accuracy.md)."""
    fast, slow = _analysis("ddp-noshapes-1gbit", 1e9).whatif, _analysis("ddp-noshapes-100mbit", 1e8).whatif
    assert fast.sizes["estimated"] == fast.comm.height
    to_slow = whatif.predict(fast, whatif.Scenario(bandwidth_bps=1e8)) / _truth_ns("ddp-noshapes-100mbit") - 1
    to_fast = whatif.predict(slow, whatif.Scenario(bandwidth_bps=1e9)) / _truth_ns("ddp-noshapes-1gbit") - 1
    assert abs(to_slow) < 0.3, to_slow
    assert abs(to_fast) < 0.35, to_fast
    # what the estimate says a rank put on the link per iteration is the model's gradient, within 15 %
    grad = _run("ddp-noshapes-100mbit")["model"]["gradient_bytes"]
    bus = slow.comm.group_by("rank").agg(pl.col("bus").sum()).get_column("bus") / 4  # 4 iterations
    assert ((bus / grad - 1).abs() < 0.15).all(), bus.to_list()


def test_contention_is_measured_and_reported(capsys: pytest.CaptureFixture[str]) -> None:
    """The sample (500 Mbit/s) repeats its backward passes with more or less of its gradient all-reduces in
    flight: the slowdown is measured, said in the verdict and given in summary --json; where the trace cannot
    tell (every iteration of a 100 Mbit/s job overlaps alike), that is said instead of a number."""
    sample = str(JOBS.parents[2] / "samples" / "ddp-gloo")
    assert main(["summary", sample, "--link-bw", "500mbit", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    c = data["contention"]
    assert c["measured"] and c["slowdown"] > 1.0 and c["identities"] >= 3
    assert c["standard_error"] > 0 and math.log(c["slowdown"]) > 2 * c["standard_error"]
    assert f"{100 * (c['slowdown'] - 1):.0f} % slower" in data["bottleneck"]["text"]
    quiet = _analysis("ddp-noshapes-100mbit", 1e8).whatif.contention
    assert not quiet.measured and quiet.slowdown == 1.0 and "could not be measured" in quiet.sentence()
