"""Big and hostile inputs at the command line: ``tracekit summary`` on a 10 GB gzip bomb, a million ranks
claimed in the metadata, 100 000 tiny files, symbolic link loops and file names with newlines or markup.
Each ends within a bound on wall time and peak memory, with the right answer or a clear one-line reason
naming the file; the inputs are generated here and stay small on disk.

Peak memory is ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` read by a small launcher process (:data:`LAUNCH`)
around the command: a process started by this (big) test process would inherit its high-water mark
across exec, the launcher's own child does not.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests import kineto_traces as kt

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "ddp-gloo"

LAUNCH = textwrap.dedent("""
    import json, resource, subprocess, sys, time
    t = time.perf_counter()
    r = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=float(sys.argv[0] or 300))
    print(json.dumps({"rc": r.returncode, "wall_s": time.perf_counter() - t, "stdout": r.stdout, "stderr": r.stderr,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
""")


def launch(*args: str, cache: Path, timeout: float = 120, command: str = "summary") -> subprocess.Popen:
    """Start ``tracekit COMMAND ARGS`` through the launcher; :func:`collect` gives its outcome."""
    cmd = [sys.executable, "-c", LAUNCH.replace("sys.argv[0] or 300", str(timeout)), sys.executable, "-m",
           "tracekit.cli", command, *args]
    env = {**os.environ, "TRACEKIT_CACHE_DIR": str(cache), "COLUMNS": "200"}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def collect(p: subprocess.Popen, timeout: float = 150) -> dict:
    """Exit status, output, wall seconds and peak RSS (MB) of a :func:`launch`."""
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, err
    return json.loads(out)


def summary(*args: str, cache: Path, timeout: float = 120) -> dict:
    """``tracekit summary ARGS`` through the launcher: exit status, output, wall seconds, peak RSS (MB)."""
    return collect(launch(*args, cache=cache, timeout=timeout), timeout + 30)


def one_line_error(res: dict, path: Path | str) -> str:
    """The run failed with exactly one line on stderr, naming ``path``; returns that line."""
    assert res["rc"] == 1, res
    lines = res["stderr"].splitlines()
    assert len(lines) == 1, res["stderr"]
    assert lines[0].startswith("tracekit: ") and str(path) in lines[0], lines[0]
    return lines[0]


# --- a 10 GB gzip bomb -----------------------------------------------------------------------------------


def test_a_10_gb_gzip_bomb_is_refused_in_bounded_time_and_memory(tmp_path: Path) -> None:
    # 160 gzip members of 64 MiB of whitespace inside a trace's event array: 10 GiB of content in 10 MB
    member = gzip.compress(b" " * (64 << 20), compresslevel=9)
    bomb = tmp_path / "bomb.pt.trace.json.gz"
    with open(bomb, "wb") as f:
        f.write(gzip.compress(b'{"traceEvents": ['))
        for _ in range(160):
            f.write(member)
    assert bomb.stat().st_size < 12 << 20
    res = summary(str(bomb), cache=tmp_path / "cache")
    line = one_line_error(res, bomb)
    assert "refusing to inflate further" in line
    assert res["wall_s"] < 60 and res["peak_rss_mb"] < 600, res  # measured: ~4 s, ~260 MB


# --- a million ranks claimed --------------------------------------------------------------------------------


def _million_rank_traces(d: Path, n: int = 1_000_000) -> None:
    """Two GPU ranks of a job whose metadata claims ``n`` ranks: ``world_size``, one ``pg_config`` group of
    ``n`` ranks, ``Group size`` and ``Process Group Ranks`` of the first two NCCL calls (gzip: ~2 MB each)."""
    d.mkdir()
    ranks = "[" + ", ".join(map(str, range(n))) + "]"
    for r in range(2):
        text = kt.write(d / "plain.json", kt.gpu_rank_events(r, 3, world=n), rank=r, world_size=n).read_text()
        info = json.dumps({"backend": "nccl", "rank": r, "world_size": n, "pg_count": 1, "pg_config": [
            {"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "pg_size": n, "ranks": []}]})
        info = info.replace('"ranks": []', f'"ranks": {ranks}')
        i = text.index('"distributedInfo": ') + len('"distributedInfo": ')
        text = text[:i] + info + text[text.index("}", i) + 1:]
        text = text.replace('"Process Group Name": "0"', f'"Process Group Name": "0", "Process Group Ranks": "{ranks}"',
                            2)
        with gzip.open(d / f"rank{r}.pt.trace.json.gz", "wt", compresslevel=1) as f:
            f.write(text)
    (d / "plain.json").unlink()


def test_a_million_ranks_claimed_in_the_metadata(tmp_path: Path) -> None:
    d = tmp_path / "job"
    _million_rank_traces(d)
    res = summary(str(d), "--json", cache=tmp_path / "cache")
    assert res["rc"] == 0, res["stderr"]
    out = json.loads(res["stdout"])
    assert [r["rank"] for r in out["ranks"]] == [0, 1]  # the ranks traced, not the ranks claimed
    assert res["wall_s"] < 60 and res["peak_rss_mb"] < 800, res  # measured: ~3 s, ~330 MB


# --- 100 000 tiny files --------------------------------------------------------------------------------------


def test_a_hundred_thousand_tiny_files(tmp_path: Path) -> None:
    # the wrong directory given (or a job directory full of small logs): 100 000 tiny files, two traces
    d = tmp_path / "many"
    d.mkdir()
    for i in range(100_000):
        fd = os.open(d / f"f{i:06d}.log", os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, b"x" * (i % 3))  # empty, 1 and 2 bytes
        os.close(fd)
    for r in (0, 1):
        shutil.copy(SAMPLE / f"rank{r}.pt.trace.json.gz", d / f"rank{r}.pt.trace.json.gz")
    res = summary(str(d), "--json", cache=tmp_path / "cache")
    assert res["rc"] == 0, res["stderr"]
    assert [r["rank"] for r in json.loads(res["stdout"])["ranks"]] == [0, 1]
    assert res["wall_s"] < 90 and res["peak_rss_mb"] < 600, res  # measured: ~8 s, ~210 MB


def test_many_tiny_traces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # every file a (tiny) trace: each is parsed and cached. The cache swept its whole directory once per
    # entry stored (quadratic: 2 000 tiny traces took 112 s, 100 000 would have taken days); it sweeps once
    # per process now. And the per-rank tables stop at 64 rows (--json has every rank).
    from tracekit.loading import atomic, traceset

    ev = b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 5}]}'
    d = tmp_path / "tiny"
    d.mkdir()
    for i in range(100):
        (d / f"rank{i}.json").write_bytes(ev)
    listed = []
    real_listdir = os.listdir
    monkeypatch.setattr(atomic.os, "listdir", lambda p: listed.append(p) or real_listdir(p))
    monkeypatch.setattr(atomic, "_SWEPT", set())
    assert traceset.load([str(d)], cache_dir=tmp_path / "cache0").ranks.num_rows == 100
    assert len(listed) == 1, len(listed)
    res = summary(str(d), cache=tmp_path / "cache")
    assert res["rc"] == 0, res["stderr"]
    assert "100 ranks" in res["stdout"] and "showing 64 of 100 ranks" in res["stdout"]


# --- symbolic link loops, dangling links, unreadable files -----------------------------------------------------


def test_symlink_loops_and_dangling_links(tmp_path: Path) -> None:
    d = tmp_path / "job"
    shutil.copytree(SAMPLE, d)
    os.symlink("loop2", d / "loop1")
    os.symlink("loop1", d / "loop2")
    os.symlink("self", d / "self")
    os.symlink("nowhere", d / "dangling")
    os.symlink(".", d / "again")  # a directory link back up: not followed in the walk
    os.symlink("..", d / "up")
    res = summary(str(d), "--json", cache=tmp_path / "cache")
    assert res["rc"] == 0, res["stderr"]
    assert [r["rank"] for r in json.loads(res["stdout"])["ranks"]] == [0, 1]
    warnings = res["stderr"].splitlines()
    assert any("skipped: a symbolic link loop and 2 more" in w for w in warnings), warnings
    assert any("dangling" in w and "dangling symbolic link (to nowhere)" in w for w in warnings), warnings
    assert res["wall_s"] < 60, res
    # named on the command line: one line each
    loop, dangling = (launch(str(d / name), cache=tmp_path / "cache") for name in ("loop1", "dangling"))
    assert "a symbolic link loop" in one_line_error(collect(loop), d / "loop1")
    assert "dangling symbolic link" in one_line_error(collect(dangling), d / "dangling")


# --- file names with newlines, escapes and markup ------------------------------------------------------------


def test_file_names_with_newlines_and_markup(tmp_path: Path) -> None:
    d = tmp_path / "job["
    d.mkdir()
    cut = gzip.decompress((SAMPLE / "rank1.pt.trace.json.gz").read_bytes())
    shutil.copy(SAMPLE / "rank0.pt.trace.json.gz", d / "rank0\nline two.json.gz")
    (d / "rank1]\x1b[31m.json").write_bytes(cut[: len(cut) // 2])  # truncated: a warning naming it
    (d / "rank0]").write_bytes(cut[: len(cut) // 3])  # 'job[/rank0]' reads as a closing markup tag
    p = tmp_path / "job[/rank0]"
    bad = d / "not\na trace.json"
    bad.write_text("hello")
    runs = [launch(str(x), cache=tmp_path / f"cache{i}") for i, x in enumerate((d, p, bad))]
    res = collect(runs[0])
    assert res["rc"] == 0, res["stderr"]
    assert "3 ranks" in res["stdout"]
    warnings = [w for w in res["stderr"].splitlines() if w.startswith("warning")]
    assert any("rank1]\\x1b[31m.json" in w and "truncated" in w for w in warnings), warnings
    assert "\x1b" not in res["stderr"]  # never a raw escape sequence on the terminal
    # a path that reads as a closing markup tag: was an internal error (MarkupError)
    res = collect(runs[1])
    assert res["rc"] == 0, res["stderr"]
    assert f"warning: {p}: byte" in res["stderr"], res["stderr"]
    # errors are one line too, the newline shown as \n
    line = one_line_error(collect(runs[2]), str(bad).replace("\n", "\\n"))
    assert "not a trace tracekit can read" in line


def test_markup_in_event_names_is_printed_as_text(tmp_path: Path) -> None:
    # a kernel or thread named like a rich closing tag ('[/x]') was an internal error (MarkupError)
    doc = json.loads(gzip.decompress((SAMPLE / "rank0.pt.trace.json.gz").read_bytes()))
    for e in doc["traceEvents"]:
        if isinstance(e.get("name"), str) and e["name"].startswith(("aten::linear", "gloo:all_reduce")):
            e["name"] += "[/x] [bold"
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps(doc))
    runs = [launch(str(p), cache=tmp_path / command, command=command) for command in ("critical-path", "collectives")]
    for r in runs:
        res = collect(r)
        assert res["rc"] == 0, res["stderr"]
        assert "[/x] [bold" in res["stdout"]
