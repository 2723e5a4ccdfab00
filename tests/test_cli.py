"""The command line as a user meets it: output, JSON, export, errors in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import polars as pl
import pyarrow.parquet as pq
import pytest

from tests import kineto_traces as kt
from tracekit.cli import main


@pytest.fixture
def job(tmp_path: Path) -> Path:
    d = tmp_path / "job"
    d.mkdir()
    kt.write(d / "rank0.pt.trace.json.gz", kt.gpu_job(3), rank=0)
    kt.write(d / "rank1.pt.trace.json.gz", kt.gpu_job(3, t0=kt.EPOCH_NS + 300_000), rank=1)
    (d / "notes.txt").write_text("not a trace")
    return d


def test_summary_table(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", str(job)]) == 0
    out = capsys.readouterr().out
    assert "2 ranks" in out and "3 iterations" in out
    assert "worst iteration" in out and "most exposed rank" in out
    assert "43.6 %" in out  # compute 12 ms of 27.5 ms (windows 10 + 10 + 7.5 ms)


def test_summary_json(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", str(job), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["job"]["ranks"] == 2 and data["job"]["iterations"] == 3
    assert {r["rank"] for r in data["ranks"]} == {0, 1}
    row = data["breakdown"][0]
    assert set(row) >= {"rank", "iteration", "wall_ns", "compute_ns", "overlapped_ns", "exposed_comm_ns",
                        "memory_ns", "idle_ns"}
    for r in data["breakdown"]:
        assert r["compute_ns"] + r["overlapped_ns"] + r["exposed_comm_ns"] + r["memory_ns"] + r["idle_ns"] == \
            r["wall_ns"]


def test_export_directory_readable_by_polars_pyarrow_duckdb(job: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["export", str(job), "-o", str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["breakdown.parquet", "collective_instances.parquet", "collective_members.parquet",
                     "collectives.parquet", "critical_path.parquet", "critical_path_summary.parquet",
                     "events.parquet", "idle_breakdown.parquet", "iterations.parquet", "ranks.parquet",
                     "top_ops.parquet"]
    b = pl.read_parquet(out / "breakdown.parquet")
    assert b.height == 6
    assert pq.read_table(out / "events.parquet").num_rows > 0
    n = duckdb.sql(f"select count(*) from '{out / 'collectives.parquet'}'").fetchall()[0][0]
    assert n == 6
    # not overwritten without --force
    assert main(["export", str(job), "-o", str(out)]) == 1
    assert main(["export", str(job), "-o", str(out), "--force"]) == 0


def test_export_single_file(job: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "b.parquet"
    assert main(["export", str(job), "-o", str(out)]) == 0
    assert pl.read_parquet(out).columns[:3] == ["rank", "iteration", "start_ns"]
    before = out.read_bytes()
    assert main(["export", str(job), "-o", str(out)]) == 1
    assert "already exists" in capsys.readouterr().err
    assert out.read_bytes() == before
    assert main(["export", str(job), "-o", str(tmp_path / "e.parquet"), "--table", "events"]) == 0


def test_inputs_are_never_written_next_to(job: Path, tmp_path: Path) -> None:
    before = sorted(os.listdir(job))
    main(["summary", str(job)])
    main(["export", str(job), "-o", str(tmp_path / "x")])
    assert sorted(os.listdir(job)) == before


@pytest.mark.parametrize("content", [b"", b"{\"traceEvents\": [", b"\x1f\x8b\x08\x00garbage", b"hello"])
def test_bad_input_is_one_line_without_traceback(tmp_path: Path, content: bytes) -> None:
    p = tmp_path / "bad.json"
    p.write_bytes(content)
    r = subprocess.run([sys.executable, "-m", "tracekit.cli", "summary", str(p)], capture_output=True, text=True)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and str(p) in lines[0], r.stderr


def test_console_command_exits_with_its_output_flushed_and_nothing_left(tmp_path: Path) -> None:
    """The console command leaves without the interpreter's teardown: all it printed reaches a pipe, its exit code
    is kept, and the temporary dataset of a memory budget is gone."""
    sample = Path(__file__).resolve().parents[1] / "samples" / "ddp-gloo"
    env = dict(os.environ, TMPDIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "tracekit.cli", "summary", str(sample), "--json", "--no-cache",
                        "--memory-budget", "1GB"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["job"]["iterations"] > 0
    assert list(tmp_path.iterdir()) == []
    r = subprocess.run([sys.executable, "-m", "tracekit.cli", "summary", str(tmp_path / "nope")],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 1 and "no such file" in r.stderr


@pytest.mark.parametrize("json_out", [False, True])
def test_a_reader_that_stops_early_ends_the_command_quietly(json_out: bool) -> None:
    """``tracekit summary … | head -1``: the report and ``--json`` alike end with exit 0 and nothing on stderr
    once the reader has gone (rich's console would exit 1)."""
    sample = Path(__file__).resolve().parents[1] / "samples" / "ddp-gloo"
    cmd = [sys.executable, "-m", "tracekit.cli", "summary", str(sample), *(["--json"] if json_out else [])]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    first = p.stdout.readline()
    p.stdout.close()  # the reader goes away after one line, before the report is written out
    err = p.stderr.read()
    assert p.wait(timeout=120) == 0, err
    assert first.strip() and err == b""


def test_run_flushes_and_runs_exit_handlers_before_leaving(monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``run`` does before ``os._exit``: buffered output is written, exit handlers run, the code is kept; with
    another thread alive it leaves the usual way, which waits for it."""
    import io

    from tracekit import cli

    done: list[object] = []

    class Out(io.StringIO):
        def flush(self) -> None:
            done.append("flush")

    monkeypatch.setattr(cli, "main", lambda: 3)
    monkeypatch.setattr(sys, "stdout", Out())
    monkeypatch.setattr(cli.atexit, "_run_exitfuncs", lambda: done.append("handlers"))
    monkeypatch.setattr(cli.os, "_exit", lambda code: done.append(("exit", code)))
    monkeypatch.setattr(cli.threading, "active_count", lambda: 1)
    monkeypatch.setattr(cli.sys, "gettrace", lambda: None)  # as without coverage or a debugger
    monkeypatch.setattr(cli.sys, "getprofile", lambda: None)
    cli.run()
    assert done[0] == "flush" and done[-2:] == ["handlers", ("exit", 3)]
    monkeypatch.setattr(cli.threading, "active_count", lambda: 2)
    with pytest.raises(SystemExit) as info:
        cli.run()
    assert info.value.code == 3 and ("exit", 3) not in done[3:]
    monkeypatch.setattr(cli.threading, "active_count", lambda: 1)
    monkeypatch.setattr(cli.sys, "getprofile", lambda: print)  # a profiler: it reports at the usual exit
    with pytest.raises(SystemExit):
        cli.run()
    assert ("exit", 3) not in done[3:]


def test_missing_path_and_bad_regex(tmp_path: Path, job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", str(tmp_path / "nope")]) == 1
    assert "no such file" in capsys.readouterr().err
    assert main(["summary", str(job), "--step-marker", "("]) == 1
    assert "not a valid regular expression" in capsys.readouterr().err


def test_help_everywhere() -> None:
    for args in (["--help"], ["summary", "--help"], ["export", "--help"], ["collectives", "--help"]):
        with pytest.raises(SystemExit) as info:
            main(args)
        assert info.value.code == 0


def test_truncated_rank_is_warned_but_analysed(job: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    raw = kt.write(tmp_path / "r2.json", kt.gpu_job(3), rank=2).read_bytes()
    (job / "rank2.json.tmp").write_bytes(raw[: len(raw) * 3 // 4])
    assert main(["summary", str(job)]) == 0
    captured = capsys.readouterr()
    assert "3 ranks" in captured.out
    assert "truncated" in captured.err and "rank2.json.tmp" in captured.err


@pytest.fixture
def straggling(tmp_path: Path) -> Path:
    """Four GPU ranks on unsynchronised clocks; rank 2 arrives 0.8 ms late at every big all-reduce."""
    return kt.write_gpu_job(tmp_path / "straggling", [0, 3_700_000, -1_200_000, 0], straggler=2, late=800_000)


def test_summary_links_stragglers_and_verdict(straggling: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", str(straggling), "--link-bw", "100Gbit"]) == 0
    out = capsys.readouterr().out
    assert "line rate 100 Gbit/s" in out and "link busy" in out and "utilisation" in out
    assert "top stragglers" in out
    assert "Rank 2 is the straggler" in " ".join(out.split())


def test_summary_json_has_links_clocks_stragglers(straggling: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", str(straggling), "--json", "--link-bw", "25GB/s"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["line_rate_bps"] == 200e9 and data["line_rate_source"] == "given"
    for key in ("link_busy_share", "busbw_gbps", "link_utilisation", "wait_share_of_exposed"):
        assert data["job"][key] is not None
    assert [c["clock_offset_ns"] for c in data["clocks"]] == [0, -3_700_000, 1_200_000, 0]
    assert data["stragglers"][0]["rank"] == 2
    assert data["collectives"]["matched"] == 6 and data["collectives"]["judged"] == 3
    assert "straggler" in data["verdict"]
    row = data["breakdown"][0]
    assert row["wait_ns"] + row["transfer_ns"] == row["exposed_comm_ns"]
    assert {"bus_bytes", "link_active_ns", "link_idle_ns", "busbw_gbps", "ideal_comm_ns",
            "link_utilisation"} <= set(row)


def test_collectives_command(straggling: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["collectives", str(straggling), "--sort", "wait", "--limit", "2"]) == 0
    out = capsys.readouterr().out
    assert "6 collectives" in out and "showing 2 of 6" in out and "by op" in out
    assert "allreduce" in out and "4.19 MB" in out
    assert main(["collectives", str(straggling), "--json", "--link-bw", "100gbit"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["instances"]) == 6
    first = data["instances"][0]
    assert set(first) >= {"pg", "seq", "op", "bytes", "bus_bytes", "ranks", "first_start_ns", "last_start_ns",
                          "skew_ns", "transfer_ns", "straggler_rank", "busbw_gbps", "link_utilisation"}
    assert [i["straggler_rank"] for i in data["instances"] if i["bytes"] == 4 << 20] == [2, 2, 2]


def test_export_link_tables(straggling: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["export", str(straggling), "-o", str(out), "--link-bw", "100Gbit"]) == 0
    inst = pl.read_parquet(out / "collective_instances.parquet")
    assert inst.height == 6 and inst["link_utilisation"].null_count() == 0
    b = pl.read_parquet(out / "breakdown.parquet")
    assert b["link_utilisation"].null_count() == 0 and b["busbw_gbps"].null_count() == 0
    assert pl.read_parquet(out / "ranks.parquet")["clock_offset_ns"].to_list() == [0, -3_700_000, 1_200_000, 0]
    assert pl.read_parquet(out / "collective_members.parquet").height == 24
    doc = pq.read_schema(out / "breakdown.parquet").field("busbw_gbps").metadata
    assert doc and b"Gbit/s" in doc[b"doc"]


@pytest.mark.parametrize("rate", ["100mbps", "fast", "100G"])
def test_bad_link_bw_is_one_line(straggling: Path, rate: str) -> None:
    r = subprocess.run([sys.executable, "-m", "tracekit.cli", "summary", str(straggling), "--link-bw", rate],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--link-bw" in lines[0]
