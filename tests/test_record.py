"""``tracekit record`` and ``tracekit.torch.profile``: a real 2-rank torchrun job recorded and summarised end to
end, exit codes and signals passed through, environment precedence, run-directory safety, usage errors,
the terminal handed to the command, and the profiler helper on its own."""

from __future__ import annotations

import contextlib
import datetime as dt
import gzip
import importlib.util
import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from tracekit.capture import record as rec
from tracekit.cli import main

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
BIN = Path(sys.executable).parent
HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")


def _tracekit() -> list[str]:
    exe = BIN / "tracekit"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "tracekit.cli"]


def _torchrun() -> list[str]:
    exe = BIN / "torchrun"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "torch.distributed.run"]


def _env(**extra: str) -> dict[str, str]:
    """The test's environment without any capture variable a developer may have exported."""
    env = {k: v for k, v in os.environ.items() if k not in rec.wanted_env(Path("/x"))}
    return {**env, **extra}


def _record(args: Sequence[str], env: dict[str, str] | None = None, timeout: float = 120,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*_tracekit(), "record", *args], capture_output=True, text=True, timeout=timeout,
                          env=env or _env(), stdin=subprocess.DEVNULL, cwd=cwd)


def _manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "record.json").read_text())


# -- (a) a real job, recorded and summarised -------------------------------------------------------------


@pytest.mark.slow
@needs_torch
def test_record_torchrun_job_then_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    hidden, layers = 64, 2
    t0 = time.monotonic()
    cmd = ["--out", str(out), "--force", "--", *_torchrun(), "--standalone", "--nproc_per_node", "2",
           str(SAMPLES / "train_ddp.py"), "--steps", "6", "--hidden", str(hidden), "--layers", str(layers),
           "--batch", "16"]
    proc = _record(cmd, timeout=180)
    if proc.returncode != 0 and "terminate called without an active exception" in proc.stderr:
        # torch's own threads can abort a worker while the interpreter tears down on a loaded machine (seen 2 of
        # ~6 loaded full runs, never alone): not tracekit's doing; one more recording tells it from a real failure
        proc = _record(cmd, timeout=180)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    # what it says it captured, and what to run next
    assert "2 profiler traces (ranks 0-1)" in proc.stderr
    assert f"tracekit summary {out}" in proc.stderr
    assert "no NCCL logs" in proc.stderr  # a gloo job: none, and it says why
    names = {p.name for p in out.iterdir()}
    assert names == {"rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz", "record.json"}

    manifest = _manifest(out)
    assert manifest["exit_code"] == 0 and manifest["signal"] is None
    assert manifest["command"][-1] == "16" and "train_ddp.py" in " ".join(manifest["command"])
    assert manifest["env"]["set"]["TRACEKIT_RUN_DIR"] == str(out)
    assert manifest["env"]["set"]["NCCL_DEBUG_SUBSYS"] == "INIT,COLL,TUNING,NET,GRAPH,ENV"
    assert {(f["path"], f["kind"], f.get("rank")) for f in manifest["files"]} == {
        ("rank0.pt.trace.json.gz", "profiler trace", 0), ("rank1.pt.trace.json.gz", "profiler trace", 1)}
    assert all(f["bytes"] == (out / f["path"]).stat().st_size for f in manifest["files"])
    assert 0 < manifest["duration_s"] < elapsed

    # the traces say which rank wrote them, and tracekit reads the run directory as it is
    for r in (0, 1):
        with gzip.open(out / f"rank{r}.pt.trace.json.gz", "rt") as f:
            info = json.load(f)["distributedInfo"]
        assert (info["rank"], info["world_size"], info["backend"]) == (r, 2, "gloo")
    assert main(["summary", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["job"]["ranks"] == 2
    # default schedule: wait 1, warmup 1, active 3 -> ProfilerStep#2..4 on both ranks
    assert sorted({(r["rank"], r["iteration"]) for r in data["breakdown"]}) == [
        (r, i) for r in (0, 1) for i in (2, 3, 4)]
    params = layers * (hidden * hidden + hidden) + hidden * 10 + 10
    for row in data["breakdown"]:
        parts = ("compute_ns", "overlapped_ns", "exposed_comm_ns", "memory_ns", "idle_ns")
        assert sum(row[c] for c in parts) == row["wall_ns"] > 0
        assert row["comm_bytes"] == 4 * params  # every step all-reduces every fp32 gradient
        # every step computes: alone, or hidden under communication (on a busy machine gloo's all-reduce can
        # stretch over all of a small model's backward)
        assert row["compute_ns"] + row["overlapped_ns"] > 0 and row["comm_ns"] > 0, row


# -- (b) exit codes and signals --------------------------------------------------------------------------


@pytest.mark.parametrize("code", [0, 3, 255])
def test_exit_code_passes_through(tmp_path: Path, code: int) -> None:
    proc = _record(["--out", str(tmp_path / "r"), "--", sys.executable, "-c", f"import sys; sys.exit({code})"])
    assert proc.returncode == code, proc.stderr
    assert _manifest(tmp_path / "r")["exit_code"] == code
    assert f"exited with code {code}" in proc.stderr


def test_stdout_and_stdin_are_the_commands(tmp_path: Path) -> None:
    proc = subprocess.run([*_tracekit(), "record", "--out", str(tmp_path / "r"), "--", sys.executable, "-c",
                           "import sys; print(sys.stdin.read().upper())"], input="hello", capture_output=True,
                          text=True, env=_env(), timeout=60)
    assert proc.returncode == 0
    assert proc.stdout == "HELLO\n"  # the command's output only; tracekit speaks on stderr


SLEEPER = r"""
import os, signal, subprocess, sys, time
marks = sys.argv[1]
def handler(signum, frame):
    open(os.path.join(marks, f"{os.getpid()}.{signal.Signals(signum).name}"), "w").close()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
    signal.signal(s, handler)
if len(sys.argv) > 2:  # a grandchild in the same process group, like torchrun's workers
    subprocess.Popen([sys.executable, __file__, marks])
open(os.path.join(marks, f"ready.{os.getpid()}"), "w").close()
time.sleep(60)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1])
def test_signals_are_forwarded_to_the_process_group(tmp_path: Path, sig: signal.Signals) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    marks = tmp_path / "marks"
    marks.mkdir()
    out = tmp_path / "r"
    proc = subprocess.Popen([*_tracekit(), "record", "--out", str(out), "--", sys.executable, str(script),
                             str(marks), "spawn"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(), start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(list(marks.glob("ready.*"))) < 2:
            assert time.monotonic() < deadline and proc.poll() is None, "the command did not start"
            time.sleep(0.05)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + sig, err
    got = sorted(p.name.split(".")[1] for p in marks.iterdir() if not p.name.startswith("ready"))
    assert got == [sig.name, sig.name], "the child and the grandchild both get the signal, once"
    manifest = _manifest(out)
    assert (manifest["exit_code"], manifest["signal"], manifest["forwarded_signals"]) == (
        128 + sig, sig.name, [sig.name])
    assert f"ended by {sig.name}" in err and "Traceback" not in err


def test_signals_before_the_command_exists_are_held_then_forwarded(tmp_path: Path) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    outcome = rec.Outcome(0)
    with rec._forwarding(outcome) as forward_to:
        os.kill(os.getpid(), signal.SIGUSR1)  # would end this process without the handler
        child = subprocess.Popen([sys.executable, str(script), str(tmp_path)], process_group=0)
        deadline = time.monotonic() + 30
        while not list(tmp_path.glob("ready.*")):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        forward_to(child.pid)
        assert child.wait(30) == -signal.SIGUSR1
    assert outcome.forwarded == ["SIGUSR1"]
    assert (tmp_path / f"{child.pid}.SIGUSR1").exists()
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # handlers restored


def _pty_record(args: Sequence[str], send: dict[bytes, bytes], timeout: float = 60) -> tuple[int, str]:
    """Run ``tracekit record ARGS`` on a new pseudo-terminal (as a login shell would: session leader, terminal
    in the foreground); when the output shows a key of ``send``, type its value. Returns (exit code, output)."""
    argv, env = [*_tracekit(), "record", *args], _env()
    pid, fd = pty.fork()
    if pid == 0:  # the child: exec at once, never return into pytest
        try:
            os.execve(argv[0], argv, env)
        finally:
            os._exit(127)
    seen = b""
    pending = dict(send)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:  # EIO: the terminal's last process is gone
                    break
                if not chunk:
                    break
                seen += chunk
            for key in list(pending):
                if key in seen:
                    os.write(fd, pending.pop(key))
        else:
            pytest.fail(f"timed out; output so far: {seen!r}")
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status), seen.decode(errors="replace")
    finally:
        with contextlib.suppress(ChildProcessError, ProcessLookupError):
            if os.waitpid(pid, os.WNOHANG) == (0, 0):
                os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        os.close(fd)


def test_command_reads_the_terminal(tmp_path: Path) -> None:
    # Without the terminal handed over, input() in a background process group would stop the job (SIGTTIN).
    code, output = _pty_record(["--out", str(tmp_path / "r"), "--", sys.executable, "-c",
                                "print('ready', flush=True); print('got', input())"],
                               {b"ready": b"hello\n"})
    assert code == 0, output
    assert "got hello" in output


def test_ctrl_c_at_the_terminal_reaches_the_command_once(tmp_path: Path) -> None:
    code, output = _pty_record(["--out", str(tmp_path / "r"), "--", sys.executable, "-c",
                                "import time; print('ready', flush=True); time.sleep(30)"],
                               {b"ready": b"\x03"})
    assert code == 130, output
    manifest = _manifest(tmp_path / "r")
    assert manifest["signal"] == "SIGINT"
    assert manifest["forwarded_signals"] == []  # the terminal sent it to the command's group directly


def test_command_not_found_leaves_nothing(tmp_path: Path) -> None:
    proc = _record(["--out", str(tmp_path / "r"), "--", "no-such-command-tracekit"])
    assert proc.returncode == 127
    assert proc.stderr.strip().splitlines()[-1] == "tracekit record: no-such-command-tracekit: command not found"
    assert not (tmp_path / "r").exists()
    script = tmp_path / "not-executable.sh"
    script.write_text("echo hi\n")
    proc = _record(["--out", str(tmp_path / "r2"), "--", str(script)])
    assert proc.returncode == 126 and "permission denied" in proc.stderr


# -- (c) environment precedence --------------------------------------------------------------------------


DUMP_ENV = "import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], 'w'))"


def test_environment_given_to_the_command(tmp_path: Path) -> None:
    out, dump = tmp_path / "r", tmp_path / "env.json"
    proc = _record(["--out", str(out), "--", sys.executable, "-c", DUMP_ENV, str(dump)])
    assert proc.returncode == 0, proc.stderr
    env = json.loads(dump.read_text())
    assert {k: env[k] for k in rec.wanted_env(out)} == {
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,COLL,TUNING,NET,GRAPH,ENV",
        "NCCL_DEBUG_FILE": f"{out}/nccl.%h.%p.log",
        "NCCL_DEBUG_TIMESTAMP_LEVELS": "ALL",
        "HOROVOD_TIMELINE": f"{out}/horovod_timeline.json",
        "HOROVOD_TIMELINE_MARK_CYCLES": "1",
        "TRACEKIT_RUN_DIR": str(out),
    }
    assert env["PATH"] == os.environ["PATH"]  # everything else as it was


def test_user_settings_win_and_are_reported(tmp_path: Path) -> None:
    out, dump = tmp_path / "r", tmp_path / "env.json"
    mine = {"NCCL_DEBUG": "WARN", "NCCL_DEBUG_SUBSYS": "INIT,NET", "HOROVOD_TIMELINE": "/elsewhere/t.json",
            "HOROVOD_TIMELINE_MARK_CYCLES": "", "TRACEKIT_RUN_DIR": "/old/run"}
    proc = _record(["--out", str(out), "--", sys.executable, "-c", DUMP_ENV, str(dump)], env=_env(**mine))
    assert proc.returncode == 0, proc.stderr
    env = json.loads(dump.read_text())
    for name in ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "HOROVOD_TIMELINE", "HOROVOD_TIMELINE_MARK_CYCLES"):
        assert env[name] == mine[name]  # kept, even the empty one
    assert env["NCCL_DEBUG_FILE"] == f"{out}/nccl.%h.%p.log"  # the ones not set are still ours
    assert env["TRACEKIT_RUN_DIR"] == str(out)  # tracekit's own: always this run
    assert "keeping your NCCL_DEBUG=WARN" in proc.stderr
    assert "does not name COLL" in proc.stderr
    assert "keeping your HOROVOD_TIMELINE=/elsewhere/t.json" in proc.stderr
    manifest = _manifest(out)
    assert manifest["env"]["kept"] == {k: v for k, v in mine.items() if k != "TRACEKIT_RUN_DIR"}
    assert "NCCL_DEBUG" not in manifest["env"]["set"] and manifest["env"]["set"]["TRACEKIT_RUN_DIR"] == str(out)


def test_plan_env_notes_and_escaping() -> None:
    run = Path("/runs/50%/a")
    plan = rec.plan_env({"NCCL_DEBUG": "info", "NCCL_DEBUG_SUBSYS": "ALL", "NCCL_DEBUG_FILE": "/tmp/n.%p"}, run)
    assert plan.notes == ["keeping your NCCL_DEBUG_FILE=/tmp/n.%p: NCCL logs go there, not into the run "
                          "directory"]  # INFO in any case and ALL are fine
    assert rec.plan_env({}, run).env["NCCL_DEBUG_FILE"] == "/runs/50%%/a/nccl.%h.%p.log"  # NCCL: %% is %
    assert rec.plan_env({}, run).env["HOROVOD_TIMELINE"] == "/runs/50%/a/horovod_timeline.json"
    assert any("COLL" in n for n in rec.plan_env({"NCCL_DEBUG_SUBSYS": "^COLL"}, run).notes)


# -- (d) the run directory ---------------------------------------------------------------------------------


def test_refuses_a_non_empty_run_dir(tmp_path: Path) -> None:
    out = tmp_path / "r"
    out.mkdir()
    (out / "rank0.pt.trace.json").write_text("old")
    marker = tmp_path / "ran"
    cmd = ["--", sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]
    proc = _record(["--out", str(out), *cmd])
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"tracekit: {out}: exists and is not empty (choose another --out, or --force " \
                                  "to record into it anyway; files already there are kept)"
    assert not marker.exists() and (out / "rank0.pt.trace.json").read_text() == "old"
    assert {p.name for p in out.iterdir()} == {"rank0.pt.trace.json"}

    proc = _record(["--out", str(out), "--force", *cmd])
    assert proc.returncode == 0 and marker.exists()
    assert (out / "rank0.pt.trace.json").read_text() == "old"
    assert "1 older files" in proc.stderr
    assert _manifest(out)["older_files"] == ["rank0.pt.trace.json"] and _manifest(out)["files"] == []

    (tmp_path / "file").write_text("x")
    proc = _record(["--out", str(tmp_path / "file"), *cmd])
    assert proc.returncode == 1 and "is not a directory" in proc.stderr


def test_empty_existing_dir_is_fine_and_default_dir_is_timestamped(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert _record(["--out", str(tmp_path / "empty"), "--", "true"]).returncode == 0
    proc = _record(["--", "true"], cwd=tmp_path)
    assert proc.returncode == 0
    (run,) = (tmp_path / "tracekit-runs").iterdir()
    assert dt.datetime.strptime(run.name, "%Y%m%dT%H%M%SZ")
    assert f"capturing into tracekit-runs/{run.name}" in proc.stderr  # shown relative to the working directory
    assert (run / "record.json").exists()


def test_default_run_dir_never_reuses_a_run(tmp_path: Path) -> None:
    now = dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    first = rec.default_run_dir(now, tmp_path)
    assert first == tmp_path / "tracekit-runs" / "20250102T030405Z"
    first.mkdir(parents=True)
    assert rec.default_run_dir(now, tmp_path) == first  # empty: fine
    (first / "record.json").write_text("{}")
    assert rec.default_run_dir(now, tmp_path).name == "20250102T030405Z-2"


def test_captured_files_are_classified(tmp_path: Path) -> None:
    for name in ("rank0.pt.trace.json.gz", "rank12.w1.pt.trace.json", "host_77.1712.pt.trace.json",
                 "nccl.node1.4242.log", "horovod_timeline.json", "rank1.pt.trace.json.tmp",
                 ".rank2.pt.trace.json.gz.99.tmp.gz", "notes.txt", ".record.json.1.tmp"):
        (tmp_path / name).write_text("x")
    files, older = rec.captured_files(tmp_path, {})
    kinds = {f.path: (f.kind, f.rank) for f in files}
    assert kinds == {
        "rank0.pt.trace.json.gz": ("profiler trace", 0),
        "rank12.w1.pt.trace.json": ("profiler trace", 12),
        "host_77.1712.pt.trace.json": ("profiler trace", None),
        "nccl.node1.4242.log": ("NCCL log", None),
        "horovod_timeline.json": ("Horovod timeline", None),
        "rank1.pt.trace.json.tmp": ("incomplete profiler trace", None),
        ".rank2.pt.trace.json.gz.99.tmp.gz": ("incomplete profiler trace", None),
        "notes.txt": ("other", None),
    }
    assert older == []


def test_report_lists_captures_and_next_commands(tmp_path: Path) -> None:
    import io

    files = [rec.Captured("rank0.pt.trace.json.gz", rec.KIND_KINETO, 2_000_000, 0),
             rec.Captured("rank1.pt.trace.json.gz", rec.KIND_KINETO, 2_100_000, 1),
             rec.Captured("nccl.a.1.log", rec.KIND_NCCL, 5000),
             rec.Captured("nccl.a.2.log", rec.KIND_NCCL, 5000)]
    buf = io.StringIO()
    rec.report(files, rec.plan_env({}, tmp_path), tmp_path, ["horovodrun", "-np", "2"], rec.Outcome(0), 1.5, [],
               ["summary", "inspect"], buf)
    text = buf.getvalue()
    assert "2 profiler traces (ranks 0-1)" in text and "4.1 MB" in text
    assert "2 NCCL logs" in text and "10.0 kB" in text
    assert "no Horovod timeline" in text and "no NCCL logs" not in text and "no profiler traces" not in text
    assert f"tracekit summary {tmp_path}" in text and f"tracekit inspect {tmp_path}" in text


def test_record_does_not_import_torch(tmp_path: Path) -> None:
    code = ("import sys; from tracekit.cli import main; "
            f"rc = main(['record', '--out', {str(tmp_path / 'r')!r}, '--', 'true']); "
            "assert 'torch' not in sys.modules, 'torch was imported'; sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr


# -- (e) usage errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "message"), [
    (["record"], "tracekit: record: no command given; usage: tracekit record [--out RUN_DIR] -- COMMAND [ARG ...]"),
    (["record", "--out", "x"], "tracekit: record: no command given; usage: tracekit record [--out RUN_DIR] -- "
                               "COMMAND [ARG ...]"),
    (["record", "--"], "tracekit: record: no command after --; usage: tracekit record [--out RUN_DIR] -- COMMAND "
                       "[ARG ...]"),
    (["record", "python", "train.py"], "tracekit: record: put the command after --, e.g. tracekit record -- "
                                       "python train.py"),
    (["record", "x", "--", "true"], "tracekit: record: unexpected arguments before --: x"),
])
def test_usage_errors_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip() == message
    assert list(tmp_path.iterdir()) == []  # nothing created


def test_arguments_after_the_separator_belong_to_the_command(tmp_path: Path) -> None:
    dump = tmp_path / "argv.json"
    proc = _record(["--out", str(tmp_path / "r"), "--", sys.executable, "-c",
                    "import json, sys; json.dump(sys.argv[1:], open(sys.argv[1], 'w'))", str(dump), "--out", "y",
                    "--force", "--", "-h"])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(dump.read_text()) == [str(dump), "--out", "y", "--force", "--", "-h"]


def test_help_explains_record() -> None:
    proc = subprocess.run([*_tracekit(), "record", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    for text in ("-- COMMAND", "NCCL_DEBUG_SUBSYS=INIT,COLL,TUNING,NET,GRAPH,ENV", "TRACEKIT_RUN_DIR",
                 "tracekit.torch.profile()", "horovodrun"):
        assert text in proc.stdout


# -- (f) tracekit.torch.profile on its own -----------------------------------------------------------------


def _tiny_loop(prof_factory, steps: int) -> object:
    import torch

    model = torch.nn.Linear(16, 16)
    with prof_factory() as prof:
        for _ in range(steps):
            model(torch.randn(4, 16)).sum().backward()
            prof.step()
    return prof


@needs_torch
def test_profile_writes_rank_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    import tracekit.torch as tt

    for name in tt.RANK_ENV:
        monkeypatch.delenv(name, raising=False)
    prof = _tiny_loop(lambda: tt.profile(tmp_path), 6)
    assert prof.files == [tmp_path / "rank0.pt.trace.json.gz"]
    assert [p.name for p in tmp_path.iterdir()] == ["rank0.pt.trace.json.gz"]  # no temporary file left
    with gzip.open(tmp_path / "rank0.pt.trace.json.gz", "rt") as f:
        trace = json.load(f)
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {n for n in names if n and n.startswith("ProfilerStep#")} == {"ProfilerStep#2", "ProfilerStep#3",
                                                                        "ProfilerStep#4"}
    assert any("Input Dims" in e.get("args", {}) for e in trace["traceEvents"])  # record_shapes
    assert main(["summary", str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["job"]["ranks"] == 1 and len(data["breakdown"]) == 3


@needs_torch
@pytest.mark.filterwarnings("ignore:.*Profiler clears events", "ignore:Profiler won't be using warmup")
def test_profile_directory_and_rank_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tracekit.torch as tt

    for name in tt.RANK_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TRACEKIT_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("HOROVOD_RANK", "3")
    prof = _tiny_loop(lambda: tt.profile(wait=0, warmup=1, active=1, repeat=2, gzip=False), 5)
    assert prof.files == [tmp_path / "run" / "rank3.w0.pt.trace.json", tmp_path / "run" / "rank3.w1.pt.trace.json"]
    for f in prof.files:
        assert json.loads(f.read_text())["traceEvents"]
    monkeypatch.setenv("RANK", "5")  # RANK comes first
    assert tt.current_rank() == 5
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRACEKIT_RUN_DIR")
    prof = _tiny_loop(lambda: tt.profile(wait=0, warmup=0, active=1, rank=7), 1)
    assert prof.files == [Path("tracekit-traces") / "rank7.pt.trace.json.gz"]


@needs_torch
def test_profile_warns_when_the_loop_is_too_short(tmp_path: Path) -> None:
    import tracekit.torch as tt

    with pytest.warns(RuntimeWarning, match=r"no trace was written: the loop made 1 step\(\) calls"):
        _tiny_loop(lambda: tt.profile(tmp_path), 1)
    assert list(tmp_path.iterdir()) == []


def test_profile_rejects_bad_schedules_and_explains_missing_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    import tracekit.torch as tt

    with pytest.raises(ValueError, match="active must be an integer >= 1"):
        tt.profile(active=0)
    monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not installed
    with pytest.raises(ImportError, match=r"pip install 'tracekit\[torch\]'"):
        tt.profile()
