"""The interleaved testbed (issue 27, docs/accuracy.md): real jobs whose link rate changed *while they ran*
(``tests/data/jobs/interleaved-*``: blocks of 3 profiled steps at 1 Gbit/s, 3 Gbit/s, 300 Mbit/s, 1 Gbit/s,
100 Mbit/s, 3 Gbit/s, 300 Mbit/s, 100 Mbit/s), every block predicted from every other block
(``benchmarks/whatif_accuracy.py``), the noise floor from blocks at the same rate; and the recordings designed to
have one verdict class each (``tests/data/jobs/class-*``)."""

from __future__ import annotations

import itertools
import json
import math
import statistics
from functools import cache
from pathlib import Path

import polars as pl
import pytest

import tracekit
from benchmarks import whatif_accuracy as wa

JOBS = Path(__file__).resolve().parent / "data" / "jobs"
KINDS = ("ddp", "ddp-noshapes", "fsdp", "pipeline")
RATES = {"100mbit": 1e8, "300mbit": 3e8, "1gbit": 1e9, "3gbit": 3e9}


def _run(name: str) -> dict:
    return json.loads((JOBS / name / "run.json").read_text())


@cache
def _pairs(kind: str) -> tuple[wa.Pair, ...]:
    return tuple(wa.block_pairs(JOBS / f"interleaved-{kind}"))


def _truth(name: str) -> dict[int, float]:
    """Each block's measured iteration, from run.json alone: per step the slowest rank, the block's median."""
    run = _run(name)
    walls: dict[int, list[float]] = {}
    steps = [r["steps"] for r in run["step_times"]["ranks"].values()]
    for i, s in enumerate(steps[0]):
        if s.get("block") is not None:
            walls.setdefault(s["block"], []).append(max(r[i]["wall_s"] for r in steps))
    return {k: statistics.median(v) * 1e9 for k, v in walls.items()}


@pytest.mark.parametrize("kind", KINDS)
def test_blocks_are_the_schedule_the_job_ran(kind: str) -> None:
    name = f"interleaved-{kind}"
    run = _run(name)
    blocks = wa.blocks(JOBS / name)
    assert [b.rate for b in blocks] == wa.SCHEDULE.split(",")
    assert [b.rate_bps for b in blocks] == [RATES[b.rate] for b in blocks]
    steps = [s for b in blocks for s in b.steps]
    assert steps == run["profiler"]["profiled_steps"] and all(len(b.steps) == 3 for b in blocks)
    # the link's rate was changed before every block but the first, between its steps and the previous block's
    starts = {s["step"]: s["start_unix_ns"] for s in run["step_times"]["ranks"]["0"]["steps"]}
    for b, info in zip(blocks[1:], run["schedule"]["blocks"][1:], strict=True):
        assert starts[b.steps[0] - 1] < info["changed_unix_ns"] < starts[b.steps[0]]
    assert {b.index: b.measured_ns for b in blocks} == pytest.approx(_truth(name), rel=1e-12)
    assert wa.blocks(JOBS / name, drop_first=True)[2].steps == blocks[2].steps[1:]
    # one trace per rank holds every block
    job = tracekit.load(str(JOBS / name), cache=False)
    assert sorted(job.breakdown.get_column("iteration").unique().to_list()) == steps


@pytest.mark.parametrize("kind", KINDS)
def test_every_block_is_predicted_from_every_other(kind: str) -> None:
    pairs = _pairs(kind)
    n = len(wa.SCHEDULE.split(","))
    assert sorted((p.src.index, p.dst.index) for p in pairs) == [(a, b) for a in range(n) for b in range(n) if a != b]
    assert all(math.isfinite(p.error) and p.predicted_ns > 0 for p in pairs)
    by = {d: [p for p in pairs if p.direction == d] for d in ("same", "faster", "slower")}
    assert (len(by["same"]), len(by["faster"]), len(by["slower"])) == (8, 24, 24)  # 4 rates, each twice
    assert all(p.src.rate == p.dst.rate for p in by["same"])
    assert all(p.dst.rate_bps > p.src.rate_bps for p in by["faster"])
    # the error is the prediction against the target block's own clock
    truth = _truth(f"interleaved-{kind}")
    assert all(p.error == pytest.approx(p.predicted_ns / truth[p.dst.index] - 1, rel=1e-12) for p in pairs)
    # from every block, a slower link is never predicted faster
    for a in range(n):
        pred = {}
        for p in pairs:
            if p.src.index == a:
                pred.setdefault(p.dst.rate_bps, []).append(p.predicted_ns)
        pred = {r: statistics.median(v) for r, v in pred.items()}
        rates = sorted(pred)
        assert all(pred[lo] >= pred[hi] for lo, hi in itertools.pairwise(rates)), (a, pred)


@pytest.mark.parametrize("kind", KINDS)
def test_noise_floor_is_the_same_rate_blocks_own_difference(kind: str) -> None:
    """The floor is what a model exact for its source block would err by between two blocks at the same rate — the
    measured iterations' ratio, whatever the model — and the table's line puts each direction beside it."""
    pairs = _pairs(kind)
    truth = _truth(f"interleaved-{kind}")
    rate = {b.index: b.rate for b in wa.blocks(JOBS / f"interleaved-{kind}")}
    same = [(a, b) for a in truth for b in truth if a != b and rate[a] == rate[b]]
    floor = sorted(abs(truth[a] / truth[b] - 1) for a, b in same)
    row = wa.row(kind, list(pairs))
    assert row.floor == (statistics.median(floor), floor[-1], len(floor))
    model_same = [abs(p.error) for p in pairs if p.direction == "same"]
    assert row.same == (statistics.median(model_same), max(model_same), 8)
    for d in ("faster", "slower"):
        e = [abs(p.error) for p in pairs if p.direction == d]
        assert getattr(row, d) == (statistics.median(e), max(e), 24)
    ok = row.meets()
    assert ok["faster"] == (row.faster[0] <= row.floor[0] + 0.03 and row.faster[1] <= 0.15)
    assert kind in wa.format_table([row]).splitlines()[-1]


def test_accuracy_where_the_model_is_at_the_floor() -> None:
    """Where the model meets issue 27's target on the whole table (docs/accuracy.md) with a margin, it does on these
    small recordings too: towards slower links, DDP's median error within 3 points of its noise floor, and DDP without
    shapes never off by more than 15 %."""
    ddp = wa.row("ddp", list(_pairs("ddp")))
    assert ddp.slower[0] <= ddp.floor[0] + 0.03, ddp
    noshapes = wa.row("ddp-noshapes", list(_pairs("ddp-noshapes")))
    assert noshapes.slower[1] <= 0.15, noshapes


# --- the designed-class recordings ---------------------------------------------------------------------------------

CLASSES = ("link-bound", "straggler-bound", "host-bound", "compute-bound")
#: the verdict's class now of a recording designed (and named) as another
NAMED_NOW = {"host-bound": "input-bound"}


@cache
def _class_job(name: str) -> tracekit.Job:
    rate = _run(f"class-{name}")["link"].get("rate_bps")
    return tracekit.load(str(JOBS / f"class-{name}"), link_bw=rate, cache=False)


def _shares(job: tracekit.Job) -> dict[str, float]:
    b = job.breakdown
    wall = b.get_column("wall_ns").sum()
    return {c: b.get_column(f"{c}_ns").sum() / wall for c in ("compute", "overlapped", "exposed_comm", "idle",
                                                              "wait", "transfer")}


def test_designed_classes_are_what_they_were_made_to_be() -> None:
    """What each recording was made to show is in its traces, whatever the verdict makes of it."""
    link = _shares(_class_job("link-bound"))
    assert link["transfer"] > 0.7  # 100 Mbit/s: the gradient's transfer fills the iteration
    straggler = _class_job("straggler-bound")
    run = _run("class-straggler-bound")
    assert run["straggler"] == {"rank": 1, "sleep_ms": 400.0}
    b = straggler.breakdown
    wait0 = b.filter(pl.col("rank") == 0).get_column("wait_ns").sum() / b.filter(pl.col("rank") == 0).get_column(
        "wall_ns").sum()
    idle1 = b.filter(pl.col("rank") == 1).get_column("idle_ns").sum() / b.filter(pl.col("rank") == 1).get_column(
        "wall_ns").sum()
    assert wait0 > 0.5 and idle1 > 0.5  # rank 0 waits for rank 1, which sat idle (asleep)
    host = _class_job("host-bound")
    loads = host.events.filter(pl.col("name").cast(pl.String).str.starts_with("enumerate(DataLoader)"))
    assert loads.height == 2 * 4 and (loads.get_column("dur_ns") >= 400e6).all()  # every rank, every step
    assert _shares(host)["idle"] > 0.5
    compute = _shares(_class_job("compute-bound"))
    assert compute["compute"] + compute["overlapped"] > 0.7 and _run("class-compute-bound")["link"]["rate"] is None


@pytest.mark.parametrize("designed", CLASSES)
def test_verdict_class_is_the_designed_one(designed: str) -> None:
    """class-host-bound (every rank waits 400 ms a step for its data loader) is input-bound: the loader, as the trace
    shows it, is what sets the pace (docs/verdict.md)."""
    assert _class_job(designed).verdict.kind == NAMED_NOW.get(designed, designed)
