"""Horovod timelines in the analysis and the CLI: iterations, ``horovod_breakdown`` checked against a hand
computation on generated timelines, fused tensors counted once, ``tracekit tensors``, merging rank 0's
timeline into its five-way attribution (the real recorded pair, and generated GPU jobs whose timeline has
no absolute clock), and every real timeline through summary, tensors and export without a traceback."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq
import pytest

from tests import kineto_traces as kt
from tracekit.analysis.horovod import windows as horovod
from tracekit.analysis.pipeline import Analysis, analyse
from tracekit.cli import main
from tracekit.loading import traceset
from tracekit.model.schema import BREAKDOWN

from .horovod_timelines import Timeline, make_timeline

RECORDED = Path(__file__).parent / "data" / "horovod"
PAIR = [RECORDED / "timeline_with_kineto.json.gz", RECORDED / "timeline_with_kineto.rank0.pt.trace.json.gz"]
TIMELINES = sorted(p.name for p in RECORDED.glob("timeline_*.json.gz") if ".pt.trace" not in p.name)
SHARED = ["01_smdebug_horovod_timeline_small_original_2020-05-13.json",
          "02_smdebug_horovod_timeline_small_trimmed_2020-05-28.json",
          "03_smdebug_rewritten_1593673051472361_horovod_timeline.json",
          "04_smdebug_rewritten_1593673051473228_horovod_timeline.json"]
#: real timelines whose damage the CLI must warn about
DAMAGED = {"timeline_killed.json.gz": "never ended", "timeline_with_kineto.json.gz": "never ended",
           SHARED[1]: "outside a NEGOTIATE", SHARED[3]: "non-zero dur"}
TRANSFER = ("NCCL_", "MPI_", "GLOO_", "CCL_")


def run(paths: list[str | Path], **kw: Any) -> Analysis:
    return analyse(traceset.load([str(p) for p in paths], use_cache=False), **kw)


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def union(intervals: list[tuple[int, int]], lo: int, hi: int) -> int:
    """Length of the union of ``intervals`` clipped to [lo, hi): the plain, obviously right way."""
    clipped = sorted((max(s, lo), min(e, hi)) for s, e in intervals if min(e, hi) > max(s, lo))
    total, cur_s, cur_e = 0, None, None
    for s, e in clipped:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s  # type: ignore[operator]
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s  # type: ignore[operator]
    return total


def truth_breakdown(tl: Timeline) -> list[dict[str, int]]:
    """``horovod_breakdown`` of a generated timeline, from the generator's own record of what ran."""
    epoch = tl.epoch_us or 0
    ns = lambda us: (epoch + us) * 1000  # noqa: E731
    n_iter = max(i.iteration for i in tl.instances) + 1
    starts = [min(ns(i.negotiate[0]) for i in tl.instances if i.iteration == k) for k in range(n_iter)]
    last_end = max(ns(i.op_span[1]) for i in tl.instances)
    ends = [*starts[1:], last_end]
    phases = [(name, ns(s), ns(e)) for i in tl.instances for name, s, e in i.phases]
    neg = [(ns(i.negotiate[0]), ns(i.negotiate[1])) for i in tl.instances]
    out = []
    for k in range(n_iter):
        lo, hi = starts[k], ends[k]
        in_win = [i for i in tl.instances if i.transfer and lo <= ns(i.transfer[0]) < hi]
        transfer = union([(s, e) for n, s, e in phases if n.startswith(TRANSFER)], lo, hi)
        out.append({
            "iteration": k, "start_ns": lo, "end_ns": hi, "wall_ns": hi - lo, "transfer_ns": transfer,
            "link_idle_ns": hi - lo - transfer, "negotiation_ns": union(neg, lo, hi),
            "queue_ns": union([(s, e) for n, s, e in phases if n == "QUEUE"], lo, hi),
            "memcpy_ns": union([(s, e) for n, s, e in phases if n.startswith("MEMCPY_")], lo, hi),
            "wait_for_data_ns": 0, "instances": len(in_win), "responses": len({i.response for i in in_win}),
            "bytes": sum(i.bytes or 0 for i in in_win),
            # allreduce bus bytes: 2(n-1)/n x S per call
            "bus_bytes": sum(round((i.bytes or 0) * 2 * (tl.ranks - 1) / tl.ranks) for i in in_win),
        })
    return out


# ---------------------------------------------------------------------------------------------------
# timeline-only jobs: iterations and horovod_breakdown against a hand computation


@pytest.mark.parametrize(("era", "fuse", "ranks"), [("new", 2, 4), ("new", 1, 2), ("old", 3, 3), ("new", 5, 8)])
def test_breakdown_matches_hand_computation(tmp_path: Path, era: str, fuse: int, ranks: int) -> None:
    tl = make_timeline(era=era, iterations=4, fuse=fuse, ranks=ranks, interleave_seed=7)
    path = tmp_path / "timeline.json"
    path.write_bytes(tl.data)
    a = run([path], link_bw_bps=1e9)
    assert a.horovod is not None and a.horovod.only and a.horovod_only
    assert a.breakdown.num_rows == 0  # no compute: no five-way breakdown
    # iterations from tensor repetition, said in the notes
    it = a.iterations.to_pylist()
    assert {r["method"] for r in it} == {"horovod tensor-repetition"} and len(it) == 4
    assert "iterations from horovod tensor-repetition" in a.notes
    got = a.horovod.breakdown.to_pylist()
    want = truth_breakdown(tl)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        for k, v in w.items():
            assert g[k] == v, (k, g, w)
        assert g["link_idle_ns"] + g["transfer_ns"] == g["wall_ns"]
        assert g["busbw_gbps"] == pytest.approx(w["bus_bytes"] * 8 / w["transfer_ns"])
        assert g["link_utilisation"] == pytest.approx(w["bus_bytes"] * 8 / (1e9 * w["wall_ns"] / 1e9))
        assert g["transfer_share"] == pytest.approx(w["transfer_ns"] / w["wall_ns"])
    # Horovod events keep their instance-based iteration (a phase belongs to its tensor's iteration)
    ev = pl.from_arrow(a.events.select(["cat", "name", "iteration"]))
    assert ev.filter(pl.col("name").cast(pl.String).str.starts_with("NEGOTIATE_")).get_column("iteration") \
        .null_count() == 0


def test_fused_tensors_are_never_double_counted(tmp_path: Path) -> None:
    """Four tensors fused per response: each carries the whole response's transfer, the totals are unions."""
    tl = make_timeline(iterations=3, fuse=4, tensors=[f"allreduce.t{i}" for i in range(8)],
                       dtypes=["float32"], cycles=False)
    path = tmp_path / "timeline.json"
    path.write_bytes(tl.data)
    a = run([path])
    assert a.horovod is not None
    epoch = tl.epoch_us or 0
    tr = [((epoch + s) * 1000, (epoch + e) * 1000) for i in tl.instances for n, s, e in i.phases
          if n.startswith(TRANSFER)]
    whole = union(tr, min(s for s, _ in tr), max(e for _, e in tr))
    per_instance = sum(e - s for s, e in tr)
    assert whole < per_instance / 3  # four copies of every transfer phase, µs apart
    hb = pl.from_arrow(a.horovod.breakdown)
    assert hb.get_column("transfer_ns").sum() == whole
    assert a.horovod.totals["transfer_ns"] == whole
    t = pl.from_arrow(a.horovod.tensors)
    assert t.height == 8 and set(t.get_column("fusion_size_median").to_list()) == {4.0}
    # per tensor: the response's whole transfer, for each of its instances
    by_resp: dict[int, list[tuple[int, int]]] = {}
    for i in tl.instances:
        by_resp.setdefault(i.response, []).extend(((epoch + s) * 1000, (epoch + e) * 1000)
                                                 for n, s, e in i.phases if n.startswith(TRANSFER))
    resp_len = {r: union(v, min(s for s, _ in v), max(e for _, e in v)) for r, v in by_resp.items()}
    for row in t.iter_rows(named=True):
        mine = [i for i in tl.instances if i.tensor == row["tensor"]]
        assert row["instances"] == 3
        assert row["transfer_ns"] == sum(resp_len[i.response] for i in mine)
        assert row["bytes"] == mine[0].bytes and row["bytes_total"] == sum(i.bytes or 0 for i in mine)
        group_bytes = sum(j.bytes or 0 for i in mine for j in tl.instances if j.response == i.response)
        assert row["busbw_gbps"] == pytest.approx(group_bytes * 8 / row["transfer_ns"])  # 2 ranks: factor 1
    # the rows, summed, would count every response four times
    assert t.get_column("transfer_ns").sum() == 4 * whole


def test_negotiation_stragglers_in_tensors(tmp_path: Path) -> None:
    tl = make_timeline(iterations=3, ranks=3, cache_hits=False, cycles=False)
    path = tmp_path / "timeline.json"
    path.write_bytes(tl.data)
    a = run([path])
    assert a.horovod is not None
    t = {r["tensor"]: r for r in a.horovod.tensors.to_pylist()}
    for name in {i.tensor for i in tl.instances}:
        mine = [i for i in tl.instances if i.tensor == name]
        last = [0, 0, 0]
        for i in mine:
            last[i.ticks[-1][0]] += 1
        assert t[name]["last_ticks"] == last
        assert t[name]["ticked"] == 3
        assert t[name]["negotiation_wait_ns"] == sum((i.ticks[-1][1] - i.ticks[0][1]) * 1000 for i in mine)
        assert t[name]["negotiate_ns"] == sum((i.negotiate[1] - i.negotiate[0]) * 1000 for i in mine)
    assert a.horovod.totals["judged"] == len(tl.instances)


def test_bogus_duration_is_flagged_not_trusted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A phase whose end comes before its begin (a rewritten file) is reported and left out."""
    tl = make_timeline(iterations=2, cycles=False)
    text = tl.data.decode()
    # the first MEMCPY_IN phase: move its end 500 µs before its begin
    m = re.search(r'\{"ph": "B", "name": "MEMCPY_IN_FUSION_BUFFER", "ts": (\d+), "pid": (\d+)\}', text)
    assert m is not None
    b_ts, pid = int(m.group(1)), m.group(2)
    e = re.compile(r'\{"ph": "E", "ts": (\d+), "pid": ' + pid + r"\}")
    m2 = e.search(text, m.end())
    assert m2 is not None
    text = text[:m2.start()] + f'{{"ph": "E", "ts": {b_ts - 500}, "pid": {pid}}}' + text[m2.end():]
    path = tmp_path / "timeline.json"
    path.write_text(text)
    a = run([path])
    assert any("end before they begin" in str(d) for d in a.diagnostics)
    assert a.horovod is not None
    assert int(pl.from_arrow(a.horovod.breakdown).get_column("memcpy_ns").min()) >= 0  # type: ignore[arg-type]
    rc, _, err = cli(["summary", str(path), "--no-cache"], capsys)
    assert rc == 0 and "bogus duration" in err and "Traceback" not in err


def test_cut_mid_record_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tl = make_timeline(iterations=3, cycles=False)
    k = len(tl.ends) * 2 // 3
    cut = tl.starts[k] + 9  # inside record k
    path = tmp_path / "timeline.json"
    path.write_bytes(tl.data[:cut])
    for cmd in (["summary"], ["tensors"], ["export", "-o", str(tmp_path / "out")]):
        rc, _, err = cli([*cmd, str(path), "--no-cache"], capsys)
        assert rc == 0, err
        assert "cut mid-record: 9 bytes" in err and "Traceback" not in err


# ---------------------------------------------------------------------------------------------------
# every real timeline through the CLI


def _real(name: str, shared_dir: Path | None) -> Path:
    if name in SHARED:
        if shared_dir is None:
            pytest.skip("shared data absent")
        return shared_dir / "horovod" / name
    return RECORDED / name


@pytest.fixture
def shared_dir() -> Path | None:
    from tests.conftest import shared_data_dir

    d = shared_data_dir()
    return d if (d / "horovod").is_dir() else None


@pytest.mark.parametrize("name", TIMELINES + SHARED)
def test_every_real_timeline_through_the_cli(name: str, shared_dir: Path | None, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = str(_real(name, shared_dir))
    rc, out, err = cli(["summary", path, "--no-cache"], capsys)
    assert "Traceback" not in err and "internal error" not in err
    if name == SHARED[2]:  # a rewrite holding nothing but a cycle marker
        assert rc == 1 and err.count("\n") == 1 and "no events to analyse" in err
        return
    assert rc == 0, err
    assert "horovod timeline" in out and re.search(r"\d iterations? \(horovod", out)
    if name in DAMAGED:
        assert "warning" in err and DAMAGED[name] in err
    rc, out, err = cli(["summary", path, "--no-cache", "--json", "-q"], capsys)
    assert rc == 0
    data = json.loads(out)
    assert data["horovod"]["only"] and data["breakdown"] == [] and data["verdict"] == data["horovod"]["text"]
    assert data["horovod"]["breakdown"] and "iterations from horovod" in " ".join(data["notes"])
    rc, out, err = cli(["tensors", path, "--no-cache", "--limit", "0"], capsys)
    assert rc == 0 and "tensors" in out and "last to ask" in out, err
    rc, out, _ = cli(["tensors", path, "--no-cache", "--json", "--sort", "negotiation"], capsys)
    payload = json.loads(out)
    assert rc == 0 and payload["tensors"] and payload["totals"]["tensors"] == len(payload["tensors"])
    neg = [r["negotiate_ns"] for r in payload["tensors"]]
    assert neg == sorted(neg, key=lambda v: -1 if v is None else v, reverse=True)
    rc, _, err = cli(["export", path, "--no-cache", "-q", "-o", str(tmp_path / "out")], capsys)
    assert rc == 0, err
    written = {p.stem for p in (tmp_path / "out").iterdir()}
    assert {"horovod_breakdown", "horovod_tensors", "horovod_instances", "horovod_ticks",
            "horovod_iterations", "events"} <= written
    assert "critical_path" not in written  # a timeline alone has no compute to follow
    rc, _, _ = cli(["export", path, "--no-cache", "-q", "-o", str(tmp_path / "one.parquet")], capsys)
    assert rc == 0 and pq.read_table(tmp_path / "one.parquet").column_names == horovod.BREAKDOWN_COLUMNS


def test_recorded_timeline_numbers() -> None:
    """The 2-rank Gloo job of 20 steps: 20 iterations of 8 gradients (208 552 bytes), each tensor in all 20."""
    a = run([RECORDED / "timeline_gloo_2rank.json.gz"])
    assert a.horovod is not None
    hb = pl.from_arrow(a.horovod.breakdown)
    assert hb.height == 20
    assert hb.get_column("instances").to_list()[:19] == [8] * 19  # the last also holds avg_loss
    assert set(hb.get_column("bytes").to_list()[:19]) == {208552}
    s = horovod.summary(a.horovod)
    assert 0 < s["transfer_share"] < 0.5 and 0 < s["negotiation_share"] < 1
    t = {r["tensor"]: r for r in a.horovod.tensors.to_pylist()}
    assert t["allreduce.fc1.weight"]["bytes"] == 64 * 784 * 4 and t["allreduce.fc1.weight"]["instances"] == 20
    assert t["broadcast.fc1.weight"]["bytes"] is None  # 0.28.1 logs no dtype/shape on broadcasts


def test_tensors_needs_a_timeline(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = cli(["tensors", str(PAIR[1]), "--no-cache"], capsys)
    assert rc == 1 and out == "" and err.startswith("tracekit: no Horovod timeline") and err.count("\n") == 1


# ---------------------------------------------------------------------------------------------------
# merged with rank 0's profiler trace


@pytest.fixture(scope="module")
def pair() -> Analysis:
    return run(PAIR)


def test_pair_iterations_are_profiler_steps(pair: Analysis) -> None:
    it = pair.iterations.to_pylist()
    assert {r["method"] for r in it} == {"ProfilerStep"} and [r["iteration"] for r in it] == list(range(2, 20))
    assert pair.horovod is not None and pair.horovod.merged and not pair.horovod.only
    # by time, each ProfilerStep#k holds the 8 allreduces Horovod counted as its iteration k
    ev = pl.from_arrow(pair.events.select(["name", "iteration", "start_ns"]))
    ar = ev.filter(pl.col("name").cast(pl.String) == "ALLREDUCE").drop_nulls("iteration")
    counts = ar.group_by("iteration").len().sort("iteration")
    assert counts.get_column("len").to_list()[:-1] == [8] * 17
    hb = pl.from_arrow(pair.horovod.breakdown)
    assert hb.get_column("iteration").to_list() == list(range(2, 20))
    assert hb.get_column("instances").to_list() == [8] * 18
    assert set(hb.get_column("bytes").to_list()) == {208552}
    assert any("merged into rank 0" in n for n in pair.notes)


def test_pair_merged_breakdown(pair: Analysis) -> None:
    b = pl.from_arrow(pair.breakdown)
    hb = pl.from_arrow(pair.horovod.breakdown)  # type: ignore[union-attr]
    assert b.height == 18 and b.get_column("rank").to_list() == [0] * 18
    for row, h in zip(b.iter_rows(named=True), hb.iter_rows(named=True), strict=True):
        assert (row["start_ns"], row["end_ns"]) == (h["start_ns"], h["end_ns"])
        # the windows add up exactly, and exposed communication splits into wait + transfer exactly
        assert sum(row[f"{c}_ns"] for c in ("compute", "overlapped", "exposed_comm", "memory", "idle")) \
            == row["wall_ns"]
        assert row["wait_ns"] is not None and row["wait_ns"] + row["transfer_ns"] == row["exposed_comm_ns"]
        # plausible against the timeline: the link was busy exactly while Horovod transferred (the trace has no
        # communication of its own), exposed transfer is part of that, waiting part of the negotiation
        assert row["link_active_ns"] == h["transfer_ns"]
        assert 0 <= row["transfer_ns"] <= h["transfer_ns"]
        assert 0 <= row["wait_ns"] <= h["negotiation_ns"]
        assert row["exposed_comm_ns"] <= h["transfer_ns"] + h["negotiation_ns"]
        assert row["memory_ns"] <= h["memcpy_ns"]
        assert row["comm_bytes"] == 208552
    tot = b.select(pl.col("exposed_comm_ns").sum(), pl.col("wall_ns").sum(), pl.col("compute_ns").sum()).row(0)
    assert tot[0] > 0 and 0.2 < tot[0] / tot[1] < 0.9 and tot[2] > 0


def test_pair_summary_and_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [str(p) for p in PAIR]
    rc, out, err = cli(["summary", *args, "--no-cache", "--link-bw", "1gbit"], capsys)
    assert rc == 0 and "Traceback" not in err
    assert "iterations from ProfilerStep" in out and "merged into rank 0" in out
    assert "horovod timeline · 18 windows (rank 0's iterations)" in out
    assert "Horovod's transfer phases" in out  # the links caption says where busy time came from
    rc, out, _ = cli(["summary", *args, "--no-cache", "--json", "-q"], capsys)
    data = json.loads(out)
    assert len(data["breakdown"]) == 18 and data["horovod"]["merged"] and not data["horovod"]["only"]
    assert data["horovod"]["timelines"][0]["clock"] == "epoch" and data["horovod"]["timelines"][0]["offset_ns"] == 0
    assert data["job"]["wait_share_of_exposed"] is not None
    rc, _, _ = cli(["export", *args, "--no-cache", "-q", "-o", str(tmp_path / "out")], capsys)
    assert rc == 0
    b = pq.read_table(tmp_path / "out" / "breakdown.parquet")
    assert b.schema.names == BREAKDOWN.names and b.num_rows == 18
    assert pq.read_table(tmp_path / "out" / "horovod_breakdown.parquet").num_rows == 18
    inst = pq.read_table(tmp_path / "out" / "horovod_instances.parquet")
    assert {"timeline", "bus_bytes", "payload_bytes"} <= set(inst.column_names)


def test_trace_without_steps_takes_horovod_iterations(tmp_path: Path) -> None:
    """Rank 0's trace without ProfilerStep: Horovod's iterations become rank 0's windows, and the trace's
    events join them by time."""
    text = gzip.decompress(PAIR[1].read_bytes()).decode().replace("ProfilerStep#", "Step_")
    trace = tmp_path / "rank0.pt.trace.json"
    trace.write_text(text)
    a = run([PAIR[0], trace])
    it = pl.from_arrow(a.iterations)
    assert it.get_column("method").unique().to_list() == ["horovod tensor-repetition"] and it.height == 20
    assert "iterations from horovod tensor-repetition" in a.notes
    b = pl.from_arrow(a.breakdown)
    assert b.height == 20 and b.get_column("wait_ns").null_count() == 0
    assert b.get_column("compute_ns").sum() > 0
    for row in b.iter_rows(named=True):
        assert sum(row[f"{c}_ns"] for c in ("compute", "overlapped", "exposed_comm", "memory", "idle")) \
            == row["wall_ns"]
    ops = pl.from_arrow(a.events.select(["kind", "iteration"])).filter(pl.col("kind").cast(pl.String) == "cpu_op")
    assert ops.get_column("iteration").null_count() < ops.height // 10


def test_timeline_of_another_run_is_not_merged() -> None:
    a = run([RECORDED / "timeline_gloo_2rank.json.gz", PAIR[1]])
    assert a.horovod is not None and not a.horovod.merged
    assert any("does not overlap rank 0's trace" in str(d) for d in a.diagnostics)
    b = pl.from_arrow(a.breakdown)
    assert b.height == 18 and b.get_column("exposed_comm_ns").sum() == 0  # the trace alone
    assert a.horovod.breakdown.num_rows == 20  # the timeline in its own iterations


def test_two_timelines_are_numbered_in_time_order() -> None:
    a = run([RECORDED / "timeline_nocache.json.gz", RECORDED / "timeline_gloo_2rank.json.gz"])
    assert a.horovod is not None and len(a.horovod.timelines) == 2
    assert [t.iteration_base for t in a.horovod.timelines] == [0, 20]
    assert a.iterations.column("iteration").to_pylist() == list(range(40))
    starts = a.iterations.column("start_ns").to_pylist()
    assert starts == sorted(starts)
    inst = pl.from_arrow(a.horovod.instances.select(["timeline", "collective_id"])).drop_nulls()
    assert inst.get_column("timeline").unique().sort().to_list() == [0, 1]
    assert inst.get_column("collective_id").n_unique() == inst.height  # one id space per rank
    t = {r["tensor"]: r for r in a.horovod.tensors.to_pylist()}
    assert t["allreduce.fc1.weight"]["instances"] == 40


def _old_layout(src: Path, dst: Path) -> None:
    """The recorded timeline as a <= 0.20.0 writer would leave it: no epoch header, no closing ']'."""
    text = gzip.decompress(src.read_bytes()).decode()
    lines = text.split("\n")
    assert "start_time_since_epoch_in_micros" in lines[1]
    body = "\n".join([lines[0], *lines[3:]])
    dst.write_text(body.rstrip().rstrip("]") + ",\n")


def test_pair_without_absolute_clock_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A CPU job's trace has no communication kernels: a boot-relative timeline cannot be aligned to it."""
    tl = tmp_path / "timeline.json"
    _old_layout(PAIR[0], tl)
    a = run([tl, PAIR[1]])
    assert a.horovod is not None and not a.horovod.merged
    assert any("not merged" in str(d) and "no communication kernels" in str(d) for d in a.diagnostics)
    b = pl.from_arrow(a.breakdown)
    assert b.height == 18 and b.get_column("wait_ns").null_count() == 18  # the trace alone
    assert b.get_column("exposed_comm_ns").sum() == 0
    hb = pl.from_arrow(a.horovod.breakdown)
    assert hb.height == 20  # on its own clock, in its own iterations
    rc, _, err = cli(["summary", str(tl), str(PAIR[1]), "--no-cache"], capsys)
    assert rc == 0 and "not merged" in err


# ---------------------------------------------------------------------------------------------------
# generated GPU jobs: a timeline without absolute clock aligned on rank 0's NCCL kernels

OFFSET = kt.EPOCH_NS - 5_000_000_000


def gpu_pair(d: Path, *, iterations: int = 8, profile: list[int] | None = None, step_shift: int = 0,
             offset: int = OFFSET) -> Timeline:
    """A <= 0.20.0 timeline (no epoch) and rank 0's Kineto trace of the same job: per profiled iteration k a
    ProfilerStep#(k + step_shift), a compute kernel, and one NCCL kernel inside each fused response's
    NCCL_ALLREDUCE phases; the trace's clock is the timeline's + ``offset``."""
    tl = make_timeline(era="old", backend="NCCL", iterations=iterations, cycles=False)
    (d / "timeline.json").write_bytes(tl.data)
    resp: dict[int, list[int]] = {}
    for inst in tl.instances:
        tr = inst.transfer
        assert tr is not None
        r = resp.setdefault(inst.response, [tr[0], tr[1], inst.iteration])
        r[0], r[1] = min(r[0], tr[0]), max(r[1], tr[1])
    starts = {k: min(i.negotiate[0] for i in tl.instances if i.iteration == k) for k in range(iterations)}
    last = max(i.op_span[1] for i in tl.instances) + 1
    evs: list[kt.Ev] = []
    corr = 1
    for k in profile if profile is not None else range(iterations):
        s, e = starts[k] * 1000 + offset, starts.get(k + 1, last) * 1000 + offset
        evs += [kt.Ev(f"ProfilerStep#{k + step_shift}", "user_annotation", s, e - s - 1, tid=1),
                kt.Ev("aten::mm", "cpu_op", s + 1000, 5000, tid=1, args={"External id": corr}),
                kt.Ev("cudaLaunchKernel", "cuda_runtime", s + 2000, 2000, tid=1, args={"correlation": corr}),
                kt.Ev("sgemm_kernel", "kernel", s + 5000, 20_000, device=0, stream=7, args={"correlation": corr})]
        corr += 1
        for rs, re_, it in resp.values():
            if it == k:
                ks, ke = rs * 1000 + offset + 2000, re_ * 1000 + offset - 2000
                evs += [kt.Ev("cudaLaunchKernel", "cuda_runtime", s + 3000, 1000, tid=1, args={"correlation": corr}),
                        kt.Ev("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
                              "kernel", ks, ke - ks, device=0, stream=13, args={"correlation": corr})]
                corr += 1
    kt.write(d / "rank0.json", evs, rank=0, world_size=2)
    return tl


@pytest.mark.parametrize("profile", [None, [3, 4]])
def test_relative_clock_aligned_on_kernels(tmp_path: Path, profile: list[int] | None) -> None:
    gpu_pair(tmp_path, profile=profile)
    a = run([tmp_path])
    assert a.horovod is not None and a.horovod.merged
    t = a.horovod.timelines[0]
    assert t.clock == "relative_unknown" and t.merged and "aligned on" in t.how
    assert abs(t.offset_ns - OFFSET) <= 2_000  # the kernels sit 2 µs inside their phases
    if profile is not None:  # shifts by whole iterations fit equally: the step numbers decide
        assert "ProfilerStep#k holds Horovod's iteration k" in t.how
    b = pl.from_arrow(a.breakdown)
    assert b.height == (8 if profile is None else 2)
    assert b.get_column("wait_ns").null_count() == 0
    for row in b.iter_rows(named=True):
        assert sum(row[f"{c}_ns"] for c in ("compute", "overlapped", "exposed_comm", "memory", "idle")) \
            == row["wall_ns"]
        assert row["wait_ns"] + row["transfer_ns"] == row["exposed_comm_ns"]
    # Horovod's collectives moved to the trace's clock with their phases
    c = pl.from_arrow(a.traces.collectives.select(["source", "start_ns"])).filter(pl.col("source") == "horovod")
    assert int(c.get_column("start_ns").min()) > kt.EPOCH_NS - 10 * 10**9  # type: ignore[arg-type]


def test_relative_clock_ambiguous_is_refused(tmp_path: Path) -> None:
    """Two profiled steps in the middle of the run, numbered unlike Horovod's iterations: every shift by whole
    iterations fits, nothing tells them apart, so the timeline is not merged (and says why)."""
    gpu_pair(tmp_path, profile=[3, 4], step_shift=10)
    a = run([tmp_path])
    assert a.horovod is not None and not a.horovod.merged
    assert any("shifts by whole iterations" in str(d) for d in a.diagnostics)
    assert pl.from_arrow(a.breakdown).get_column("wait_ns").null_count() == 2  # rank 0's trace alone


def test_align_refuses_unrelated_kernels() -> None:
    rs = [i * 1_000_000 for i in range(20)]
    re_ = [s + 100_000 for s in rs]
    a = horovod.align(rs, re_, [123_457 + i * 777_000 for i in range(10)],
                      [123_457 + i * 777_000 + 300_000 for i in range(10)])
    assert a.offset_ns is None and "long enough" in a.text
    a = horovod.align(rs, re_, [123_457 + i * 777_000 for i in range(10)],
                      [123_457 + i * 777_000 + 30_000 for i in range(10)])
    assert a.offset_ns is None and "whatever the offset" in a.text
    a = horovod.align(rs, re_, [], [])
    assert a.offset_ns is None and "no communication kernels" in a.text


def test_jobs_without_horovod_are_unchanged(capsys: pytest.CaptureFixture[str]) -> None:
    sample = Path(__file__).parents[1] / "samples" / "ddp-gloo"
    rc, out, _ = cli(["summary", str(sample), "--no-cache", "--json", "-q"], capsys)
    assert rc == 0
    data = json.loads(out)
    assert "horovod" not in data
    a = run([sample])
    assert a.horovod is None and not any(k.startswith("horovod") for k in a.tables())
