"""NCCL-log calls joined to trace kernels: sizes, commId and call index reach traces that lack them."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from tests import kineto_traces as kt
from tracekit.analysis.pipeline import analyse
from tracekit.loading.traceset import load

OLD_NCCL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
COMM_ID = "0x5d2e9a0c4471b3f8"


def _log(rank: int, calls: list[tuple[str, int, int]], *, comm: str = COMM_ID, host: str = "node0") -> str:
    """A 2.21-style NCCL log of one process: Init of a 2-rank comm, then COLL lines (op, count, datatype)."""
    pid = 4000 + rank
    lines = ["NCCL version 2.21.5+cuda12.4",
             f"{host}:{pid}:{pid} [{rank}] NCCL INFO ncclCommInitRank comm 0x55b07c1e9f3{rank} rank {rank} nranks 2 "
             f"cudaDev {rank} nvmlDev {rank} busId {rank}b000 commId {comm} - Init COMPLETE"]
    for k, (op, count, dt) in enumerate(calls):
        lines.append(f"{host}:{pid}:{pid + 7} [{rank}] NCCL INFO {op}: opCount {k:x} sendbuff 0x7f2d10000000 "
                     f"recvbuff 0x7f2d10000000 count {count} datatype {dt} op 0 root 0 comm 0x55b07c1e9f3{rank} "
                     f"[nranks=2] stream 0x55b07a2c4e10")
    return "\n".join(lines) + "\n"


@pytest.fixture
def job(tmp_path: Path) -> Path:
    # traces of 2 steps whose NCCL kernels carry no sizes (PyTorch < 2.2 and no record_param_comms sizes)
    for r in (0, 1):
        evs = [e for e in kt.gpu_job(2, t0=kt.EPOCH_NS + 100_000 * r, nccl_name=OLD_NCCL, with_kernel_args=False)
               if e.name not in ("record_param_comms", "nccl:all_reduce")]
        kt.write(tmp_path / f"rank{r}.json", evs, rank=r, era="int-us")
        # the log covers the whole run: 3 warm-up calls of other sizes, then the 2 profiled steps, then more
        calls = [("AllReduce", 1000, 7), ("Broadcast", 50, 0), ("AllReduce", 2000, 7),
                 ("AllReduce", 1 << 20, 7), ("AllReduce", 1 << 20, 7), ("AllReduce", 5, 7)]
        (tmp_path / f"nccl.node0.{4000 + r}.log").write_text(_log(r, calls))
    return tmp_path


def test_trace_rows_get_the_logs_facts(job: Path) -> None:
    for r in (0, 1):  # a log where the traced pair of all-reduces fits one place only
        calls = [("Broadcast", 50, 0), ("AllReduce", 1 << 20, 7), ("AllReduce", 1 << 20, 7), ("Broadcast", 60, 0)]
        (job / f"nccl.node0.{4000 + r}.log").write_text(_log(r, calls))
    res = analyse(load([str(job)]))
    c = pl.from_arrow(res.collectives).filter(pl.col("source") == "kineto-kernel").sort(["rank", "start_ns"])
    assert c.height == 4
    assert set(c["pg"].to_list()) == {COMM_ID}
    assert c["seq"].to_list() == [1, 2, 1, 2]
    assert c["bytes"].to_list() == [(1 << 20) * 4] * 4
    assert c["dtype"].to_list() == ["float32"] * 4
    # ... so they match across ranks by (commId, call index)
    inst = pl.from_arrow(res.instances)
    assert inst.height == 2 and set(inst["matched_by"].to_list()) == {"pg+seq"}


def test_no_sizes_and_several_fits_is_not_guessed(job: Path) -> None:
    res = analyse(load([str(job)]))
    c = pl.from_arrow(res.collectives).filter(pl.col("source") == "kineto-kernel")
    assert c["bytes"].null_count() == c.height
    assert any("fit several places" in str(d) for d in res.diagnostics)


def test_sizes_in_the_trace_pick_the_right_calls(job: Path) -> None:
    for r in (0, 1):
        evs = [e for e in kt.gpu_job(2, t0=kt.EPOCH_NS + 100_000 * r, nccl_name=OLD_NCCL)
               if e.name not in ("record_param_comms", "nccl:all_reduce")]
        kt.write(job / f"rank{r}.json", evs, rank=r, era="int-us")
    res = analyse(load([str(job)]))
    c = pl.from_arrow(res.collectives).filter(pl.col("source") == "kineto-kernel").sort(["rank", "start_ns"])
    assert c["seq"].to_list() == [3, 4, 3, 4]  # the 4th and 5th calls are the ones of the trace's size
    # ... so they match across ranks by (commId, call index)
    inst = pl.from_arrow(res.instances)
    assert inst.height == 2 and set(inst["matched_by"].to_list()) == {"pg+seq"}


def test_a_log_of_another_run_is_not_joined(job: Path) -> None:
    for r in (0, 1):
        (job / f"nccl.node0.{4000 + r}.log").write_text(_log(r, [("Broadcast", 7, 0)] * 3))
    res = analyse(load([str(job)]))
    c = pl.from_arrow(res.collectives).filter(pl.col("source") == "kineto-kernel")
    assert c["bytes"].null_count() == c.height
    assert any("not joined" in str(d) for d in res.diagnostics)


def test_log_without_trace_is_reported(tmp_path: Path) -> None:
    (tmp_path / "nccl.node0.4000.log").write_text(_log(0, [("AllReduce", 10, 7)]))
    kt.write(tmp_path / "rank1.json", kt.gpu_job(1), rank=1)
    res = analyse(load([str(tmp_path)]))
    assert any("matches no trace" in str(d) for d in res.diagnostics)


def test_summary_of_nccl_logs(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tracekit.cli import main

    assert main(["summary", str(job / "nccl.node0.4000.log"), str(job / "nccl.node0.4001.log")]) == 0
    out = capsys.readouterr().out
    assert "no iterations found" in out and COMM_ID in out and "allreduce×5" in out
    assert main(["summary", str(job), "--json"]) == 0
    import json

    data = json.loads(capsys.readouterr().out)
    assert data["nccl"][0]["comm_id"] == COMM_ID and data["job"]["ranks"] == 2


def test_logs_without_init_lines_still_join(job: Path) -> None:
    """Issue 16: excerpts without the Init lines (COLL lines only). Each log's communicator comes from its
    pointer and ``[nranks=2]`` (an inferred id, equal on both ranks), its rank from the device ``[r]``; the
    trace rows get (pg, seq) and sizes from them and match across ranks."""
    for r in (0, 1):
        calls = [("Broadcast", 50, 0), ("AllReduce", 1 << 20, 7), ("AllReduce", 1 << 20, 7), ("Broadcast", 60, 0)]
        text = "".join(x + "\n" for x in _log(r, calls).splitlines() if " opCount " in x)
        (job / f"nccl.node0.{4000 + r}.log").write_text(text)
    res = analyse(load([str(job)]))
    c = pl.from_arrow(res.collectives).filter(pl.col("source") == "kineto-kernel").sort(["rank", "start_ns"])
    assert set(c["pg"].to_list()) == {"inferred-n2-0"}
    assert c["seq"].to_list() == [1, 2, 1, 2]
    assert c["bytes"].to_list() == [(1 << 20) * 4] * 4
    inst = pl.from_arrow(res.instances)
    assert inst.height == 2 and set(inst["matched_by"].to_list()) == {"pg+seq"}
