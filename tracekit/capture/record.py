"""``tracekit record -- COMMAND…``: run a training command with every capture switched on, then say what it got.

The command runs unchanged except for its environment, which gains (FORMATS.md §1.1, §2.1, §3.1):

=============================== ============================================ =====================================
variable                        value                                        why
=============================== ============================================ =====================================
``NCCL_DEBUG``                  ``INFO``                                     INFO lines are the NCCL log
``NCCL_DEBUG_SUBSYS``           ``INIT,COLL,TUNING,NET,GRAPH,ENV``           COLL must be named to get one line per
                                                                             collective; TUNING gives algo/proto
``NCCL_DEBUG_FILE``             ``RUN_DIR/nccl.%h.%p.log``                   one clean file per process
``NCCL_DEBUG_TIMESTAMP_LEVELS`` ``ALL``                                      wall-clock time on every line (NCCL
                                                                             2.26+; ignored before)
``HOROVOD_TIMELINE``            ``RUN_DIR/horovod_timeline.json``            Horovod's timeline (rank 0 writes it)
``HOROVOD_TIMELINE_MARK_CYCLES`` ``1``                                       cycle markers
``TRACEKIT_RUN_DIR``            ``RUN_DIR``                                  where ``tracekit.torch.profile`` writes
=============================== ============================================ =====================================

Precedence: a variable the user already set (to anything, even empty) is kept and reported, so
``NCCL_DEBUG=WARN tracekit record -- …`` turns NCCL logging down. ``TRACEKIT_RUN_DIR`` is tracekit's own
and always points at this run's directory. Launcher flags win over the environment in the workers
(``horovodrun --timeline-filename``).

Process handling: stdin/stdout/stderr are the command's; the command runs in its own process group, which
gets the terminal (like a shell's foreground job) when tracekit has it, so Ctrl-C and Ctrl-Z reach every
process of the job once and interactive debuggers still read the terminal. SIGINT, SIGTERM, SIGHUP,
SIGQUIT, SIGUSR1 and SIGUSR2 sent to tracekit are forwarded to the command's process group. The exit code
is the command's (128 + n when a signal n ended it; 127/126 when it cannot be started).

Outputs: ``RUN_DIR/record.json``, a manifest (command, environment, times, exit code, files) written
atomically when the command starts and again when it ends. This module never imports torch.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tracekit import __version__
from tracekit.model.diagnostics import TraceError

NCCL_SUBSYS = "INIT,COLL,TUNING,NET,GRAPH,ENV"
HOROVOD_TIMELINE_NAME = "horovod_timeline.json"
MANIFEST = "record.json"
RUNS_DIR = "tracekit-runs"
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126

KIND_KINETO = "profiler trace"
KIND_NCCL = "NCCL log"
KIND_HOROVOD = "Horovod timeline"
KIND_PARTIAL = "incomplete profiler trace"
KIND_OTHER = "other"
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[-_]?(\d+)", re.IGNORECASE)


def wanted_env(run_dir: Path) -> dict[str, str]:
    """The variables tracekit sets for a capture into ``run_dir`` (absolute), in the order they are shown."""
    nccl_dir = str(run_dir).replace("%", "%%")  # NCCL expands %h/%p in the path and reads %% as %
    return {
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": NCCL_SUBSYS,
        "NCCL_DEBUG_FILE": f"{nccl_dir}/nccl.%h.%p.log",
        "NCCL_DEBUG_TIMESTAMP_LEVELS": "ALL",
        "HOROVOD_TIMELINE": str(run_dir / HOROVOD_TIMELINE_NAME),
        "HOROVOD_TIMELINE_MARK_CYCLES": "1",
        "TRACEKIT_RUN_DIR": str(run_dir),
    }


@dataclass
class EnvPlan:
    """The child's environment and what tracekit did to it: ``set`` (ours), ``kept`` (the user's value won),
    ``notes`` (one line each on what a kept value means for the capture)."""

    env: dict[str, str]
    set: dict[str, str] = field(default_factory=dict)
    kept: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def plan_env(base: Mapping[str, str], run_dir: Path) -> EnvPlan:
    """Add the capture variables to ``base`` without overriding any the user set (``TRACEKIT_RUN_DIR`` aside)."""
    plan = EnvPlan(env=dict(base))
    for name, value in wanted_env(run_dir).items():
        if name in base and name != "TRACEKIT_RUN_DIR":
            plan.kept[name] = base[name]
        else:
            plan.set[name] = value
            plan.env[name] = value
    kept = plan.kept
    if "NCCL_DEBUG" in kept and kept["NCCL_DEBUG"].strip().upper() not in ("INFO", "TRACE"):
        plan.notes.append(f"keeping your NCCL_DEBUG={kept['NCCL_DEBUG']}: NCCL writes no INFO lines "
                          "(no per-collective lines, no topology)")
    if "NCCL_DEBUG_SUBSYS" in kept:
        subsys = {s.strip().upper() for s in kept["NCCL_DEBUG_SUBSYS"].split(",")}
        if not subsys & {"COLL", "ALL"} or "^COLL" in subsys:
            plan.notes.append(f"keeping your NCCL_DEBUG_SUBSYS={kept['NCCL_DEBUG_SUBSYS']}: it does not name "
                              "COLL, so NCCL logs no collective calls")
    if "NCCL_DEBUG_FILE" in kept:
        plan.notes.append(f"keeping your NCCL_DEBUG_FILE={kept['NCCL_DEBUG_FILE']}: NCCL logs go there, "
                          "not into the run directory")
    if "HOROVOD_TIMELINE" in kept:
        plan.notes.append(f"keeping your HOROVOD_TIMELINE={kept['HOROVOD_TIMELINE']}: the timeline goes there, "
                          "not into the run directory")
    for name in kept.keys() - {"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE", "HOROVOD_TIMELINE"}:
        plan.notes.append(f"keeping your {name}={kept[name]}")
    if base.get("TRACEKIT_RUN_DIR") not in (None, str(run_dir)):
        plan.notes.append(f"TRACEKIT_RUN_DIR was {base['TRACEKIT_RUN_DIR']}; it is this run's directory now")
    return plan


# ---------------------------------------------------------------------------------------------------
# The run directory
# ---------------------------------------------------------------------------------------------------


def default_run_dir(now: dt.datetime | None = None, base: Path | None = None) -> Path:
    """``./tracekit-runs/<UTC timestamp>``, with ``-2``, ``-3``… when a run of the same second exists."""
    stamp = (now or dt.datetime.now(dt.UTC)).strftime("%Y%m%dT%H%M%SZ")
    root = (base or Path.cwd()) / RUNS_DIR
    path = root / stamp
    n = 2
    while path.exists() and any(path.iterdir()):
        path = root / f"{stamp}-{n}"
        n += 1
    return path


def prepare_run_dir(path: Path, force: bool) -> tuple[bool, dict[str, tuple[int, int]]]:
    """Create ``path`` (refusing a non-empty one unless ``force``); return whether it was created and a
    snapshot ``{relative path: (size, mtime_ns)}`` of what was already there."""
    if path.exists() and not path.is_dir():
        raise TraceError(str(path), "exists and is not a directory")
    before = snapshot(path) if path.is_dir() else {}
    if path.is_dir() and any(path.iterdir()) and not force:
        raise TraceError(str(path), "exists and is not empty (choose another --out, or --force to record into "
                                    "it anyway; files already there are kept)")
    created = not path.exists()
    path.mkdir(parents=True, exist_ok=True)
    return created, before


def snapshot(run_dir: Path) -> dict[str, tuple[int, int]]:
    """Every regular file under ``run_dir`` with its size and modification time."""
    found: dict[str, tuple[int, int]] = {}
    for root, _dirs, files in os.walk(run_dir):
        for name in files:
            p = Path(root) / name
            with contextlib.suppress(OSError):
                st = p.lstat()
                found[p.relative_to(run_dir).as_posix()] = (st.st_size, st.st_mtime_ns)
    return found


@dataclass(frozen=True)
class Captured:
    """One file the command left in the run directory."""

    path: str  # relative to the run directory
    kind: str
    bytes: int
    rank: int | None = None


def classify(rel: str) -> str:
    """What a file in the run directory is, from its name (the names tracekit and the tools write)."""
    name = rel.rsplit("/", 1)[-1]
    if re.search(r"\.pt\.trace\.json(\.gz)?$", name):
        return KIND_KINETO if not name.startswith(".") else KIND_PARTIAL
    if re.search(r"\.json(\.gz)?\.tmp$|\.tmp(\.gz)?$", name):
        return KIND_PARTIAL  # Kineto's <path>.tmp or tracekit.torch's temporary name: the writer died
    if re.fullmatch(r"nccl\..*\.log", name):
        return KIND_NCCL
    if name == HOROVOD_TIMELINE_NAME:
        return KIND_HOROVOD
    return KIND_OTHER


def captured_files(run_dir: Path, before: Mapping[str, tuple[int, int]]) -> tuple[list[Captured], list[str]]:
    """Files written or changed since ``before`` (this run's captures, manifest excluded), and the older
    files that were left as they were."""
    now = snapshot(run_dir)
    new, old = [], []
    for rel, (size, mtime) in sorted(now.items()):
        if rel == MANIFEST or rel.startswith(f".{MANIFEST}"):
            continue
        if before.get(rel) == (size, mtime):
            old.append(rel)
            continue
        kind = classify(rel)
        m = _RANK_IN_NAME.search(rel.rsplit("/", 1)[-1])
        rank = int(m.group(1)) if m and kind == KIND_KINETO else None
        new.append(Captured(rel, kind, size, rank))
    return new, old


def write_manifest(run_dir: Path, data: Mapping[str, Any]) -> None:
    """Write ``record.json`` atomically (temporary file in the same directory, then rename)."""
    final = run_dir / MANIFEST
    tmp = run_dir / f".{MANIFEST}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        os.replace(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


# ---------------------------------------------------------------------------------------------------
# Running the command
# ---------------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """How the command ended: ``exit_code`` as a shell reports it, the signal that killed it (if any), and
    the signals tracekit forwarded to it."""

    exit_code: int
    signal: str | None = None
    forwarded: list[str] = field(default_factory=list)


def _terminal() -> int | None:
    """A file descriptor of our controlling terminal when our process group is its foreground job, else None
    (then the command stays a background group and tracekit forwards the terminal's signals itself)."""
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp():
                return fd
        except OSError:
            continue
    return None


def _give_terminal(fd: int, pgrp: int) -> None:
    """Make ``pgrp`` the terminal's foreground group; SIGTTOU is blocked so a background caller may do it."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTTOU})
    try:
        with contextlib.suppress(OSError):  # the group may be gone already
            os.tcsetpgrp(fd, pgrp)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _exit_code(status: int) -> tuple[int, str | None]:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return 128 + sig, signal.Signals(sig).name
    return os.waitstatus_to_exitcode(status), None


@contextlib.contextmanager
def _forwarding(outcome: Outcome) -> Iterator[Callable[[int], None]]:
    """While the block runs, send every FORWARDED signal tracekit receives to a process group. The block
    names the group by calling the yielded function; signals that arrive before that are held until then."""
    target: list[int] = []
    held: list[int] = []

    def send(signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(target[0], signum)

    def forward(signum: int, _frame: object) -> None:
        outcome.forwarded.append(signal.Signals(signum).name)
        if target:
            send(signum)
        else:
            held.append(signum)

    def start(pgrp: int) -> None:
        target.append(pgrp)
        while held:
            send(held.pop(0))

    old = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        yield start
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def run_command(argv: Sequence[str], env: Mapping[str, str]) -> Outcome:
    """Run ``argv`` with ``env`` and the caller's stdin/stdout/stderr in its own process group, forwarding
    signals to it and handing it the terminal; return how it ended. Raises OSError when it cannot start."""
    tty = _terminal()

    def child_setup() -> None:  # runs in the child between fork and exec
        os.setpgid(0, 0)
        if tty is not None:  # also done by the parent below; whoever is first wins the race with exec
            _give_terminal(tty, os.getpgrp())

    outcome = Outcome(exit_code=0)
    # the handlers go in before the child exists, so that no signal can kill tracekit and orphan the job
    with _forwarding(outcome) as forward_to:
        proc = subprocess.Popen(list(argv), env=dict(env), preexec_fn=child_setup)
        try:
            forward_to(proc.pid)
            if tty is not None:
                _give_terminal(tty, proc.pid)
            status = _wait(proc.pid, tty)
        finally:
            if tty is not None:
                _give_terminal(tty, os.getpgrp())
    outcome.exit_code, outcome.signal = _exit_code(status)
    proc.returncode = outcome.exit_code  # reaped above; keeps Popen from waiting again
    return outcome


def _wait(pid: int, tty: int | None) -> int:
    """Wait for process ``pid`` to end and return its wait status. With a terminal, act as a shell's job
    would: when Ctrl-Z stops the command, take the terminal back and stop too, so the shell regains control;
    once continued (``fg``), give the terminal back and continue the command."""
    while True:
        _pid, status = os.waitpid(pid, os.WUNTRACED if tty is not None else 0)
        if tty is None or not os.WIFSTOPPED(status):
            return status
        _give_terminal(tty, os.getpgrp())
        os.kill(os.getpid(), signal.SIGTSTP)  # returns once we are continued (at once if nobody can)
        if os.tcgetpgrp(tty) == os.getpgrp():  # continued in the foreground (fg, not bg)
            _give_terminal(tty, pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGCONT)


# ---------------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------------


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _shown(path: Path) -> str:
    """``path`` as the user would type it: relative to the working directory when inside it, shell-quoted."""
    try:
        rel = path.relative_to(Path.cwd())
        return shlex.quote(str(rel) or ".")
    except ValueError:
        return shlex.quote(str(path))


def _iso(ns: int) -> str:
    return dt.datetime.fromtimestamp(ns / 1e9, dt.UTC).isoformat(timespec="milliseconds")


def _names(files: Sequence[Captured], limit: int = 4) -> str:
    shown = ", ".join(f.path for f in files[:limit])
    return shown + (f", … ({len(files) - limit} more)" if len(files) > limit else "")


def report(files: Sequence[Captured], plan: EnvPlan, run_dir: Path, command: Sequence[str], outcome: Outcome,
           duration_s: float, older: Sequence[str], next_commands: Sequence[str], out: IO[str]) -> None:
    """Print what the run captured, what is missing and why, and the commands to run next."""
    shown = _shown(run_dir)
    ended = (f"was ended by {outcome.signal} (exit code {outcome.exit_code})" if outcome.signal
             else f"exited with code {outcome.exit_code}")
    if files:
        print(f"tracekit record: the command {ended} after {duration_s:.1f} s; captured in {shown}:", file=out)
    else:
        print(f"tracekit record: the command {ended} after {duration_s:.1f} s; nothing was captured in {shown}",
              file=out)
    by_kind: dict[str, list[Captured]] = {}
    for f in files:
        by_kind.setdefault(f.kind, []).append(f)
    for kind in (KIND_KINETO, KIND_NCCL, KIND_HOROVOD, KIND_PARTIAL, KIND_OTHER):
        group = by_kind.get(kind, [])
        if not group:
            continue
        ranks = sorted({f.rank for f in group if f.rank is not None})
        label = kind + ("s" if len(group) > 1 and kind != KIND_OTHER else "")
        if ranks:
            label += f" (ranks {_ranges(ranks)})"
        print(f"  {len(group):4d} {label:<36} {_size(sum(f.bytes for f in group)):>9}  {_names(group)}",
              file=out)
    notes: list[str] = []
    if not by_kind.get(KIND_KINETO):
        notes.append("warning: no profiler traces. Wrap the training loop in tracekit.torch.profile() and call "
                     ".step() once per iteration (it writes into $TRACEKIT_RUN_DIR), or point torch.profiler's "
                     "output there")
    if by_kind.get(KIND_PARTIAL):
        notes.append("warning: some traces are incomplete (their writer was killed mid-file); tracekit reads "
                     "what they hold")
    if not by_kind.get(KIND_NCCL) and "NCCL_DEBUG_FILE" in plan.set:
        notes.append("note: no NCCL logs: no process initialised NCCL (CPU/gloo jobs write none)")
    horovod = any("horovod" in a.lower() or a.startswith("hvd") for a in command)
    if horovod and not by_kind.get(KIND_HOROVOD) and "HOROVOD_TIMELINE" in plan.set:
        notes.append("note: no Horovod timeline: Horovod's rank 0 writes it from hvd.init() on; "
                     "horovodrun --timeline-filename overrides HOROVOD_TIMELINE")
    if older:
        notes.append(f"note: {len(older)} older files in {shown} were left as they were (tracekit reads them too)")
    for note in notes:
        print(f"tracekit record: {note}", file=out)
    if any(f.kind in (KIND_KINETO, KIND_NCCL, KIND_HOROVOD) for f in files):
        print("next:", file=out)
        for cmd in next_commands:
            print(f"  tracekit {cmd} {shown}", file=out)


def _ranges(values: Sequence[int]) -> str:
    """``0-3, 5`` for [0, 1, 2, 3, 5]."""
    parts: list[str] = []
    start = prev = values[0]
    for v in [*values[1:], None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ", ".join(parts)


def record(command: Sequence[str], out: str | None = None, force: bool = False, *,
           next_commands: Sequence[str] = ("summary",), log: IO[str] | None = None) -> int:
    """Run ``command`` with captures on into ``out`` (default ``./tracekit-runs/<UTC time>``), print what was
    captured, write ``record.json``; return the command's exit code."""
    log = log or sys.stderr
    run_dir = Path(out).expanduser() if out else default_run_dir()
    run_dir = Path(os.path.abspath(run_dir))
    created, before = prepare_run_dir(run_dir, force)
    plan = plan_env(os.environ, run_dir)
    print(f"tracekit record: capturing into {_shown(run_dir)}", file=log)
    for note in plan.notes:
        print(f"tracekit record: {note}", file=log)
    log.flush()
    manifest: dict[str, Any] = {
        "recorded_by": f"tracekit {__version__}",
        "command": list(command),
        "cwd": os.getcwd(),
        "host": socket.gethostname(),
        "run_dir": str(run_dir),
        "env": {"set": plan.set, "kept": plan.kept},
        "started_at": None, "ended_at": None, "duration_s": None,
        "exit_code": None, "signal": None, "forwarded_signals": [],
        "files": [],
    }
    start_ns = time.time_ns()
    t0 = time.monotonic()
    manifest["started_at"] = _iso(start_ns)
    write_manifest(run_dir, manifest)  # now, so that a killed tracekit still leaves one
    try:
        outcome = run_command(command, plan.env)
    except OSError as exc:  # the command could not be started: leave nothing behind
        with contextlib.suppress(OSError):
            (run_dir / MANIFEST).unlink()
            if created:
                run_dir.rmdir()
        code = EXIT_NOT_FOUND if isinstance(exc, FileNotFoundError) else EXIT_NOT_EXECUTABLE
        why = "command not found" if code == EXIT_NOT_FOUND else (exc.strerror or str(exc)).lower()
        print(f"tracekit record: {command[0]}: {why}", file=log)
        return code
    files, older = captured_files(run_dir, before)
    manifest.update(
        ended_at=_iso(time.time_ns()), duration_s=round(time.monotonic() - t0, 3), exit_code=outcome.exit_code,
        signal=outcome.signal, forwarded_signals=outcome.forwarded,
        files=[{"path": f.path, "kind": f.kind, "bytes": f.bytes, **({} if f.rank is None else {"rank": f.rank})}
               for f in files],
    )
    if older:
        manifest["older_files"] = older
    write_manifest(run_dir, manifest)
    report(files, plan, run_dir, command, outcome, manifest["duration_s"], older, next_commands, log)
    return outcome.exit_code
