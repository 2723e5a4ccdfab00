"""What the framework callbacks share: a few training steps profiled on every rank with ``tracekit.torch``'s schedule,
then, on rank 0, this run's traces read back, the verdict printed and logged to the trackers asked for.

The callbacks only say when steps end, which rank this is and how the ranks wait for each other; everything else is
here, so Lightning's and Hugging Face's callbacks profile and report alike."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracekit.capture import torch as tk_torch
from tracekit.integrations import trackers
from tracekit.model.diagnostics import TraceError

if TYPE_CHECKING:
    from tracekit.api import Job

#: the folder under the framework's own output folder that the traces go to (unless given, or $TRACEKIT_RUN_DIR)
SUBDIR = "tracekit-traces"


class ProfiledRun:
    """The profiled window of one training run on this rank, and the report at its end (rank 0).

    ``out_dir``: where every rank writes ``rank{r}.pt.trace.json.gz`` (default ``$TRACEKIT_RUN_DIR``, else the
    framework's output folder + ``/tracekit-traces``); ``wait``, ``warmup``, ``active``: the schedule of
    :func:`tracekit.torch.profile` (steps skipped, warmed up, recorded); ``link_bw``: the line rate the job runs on
    (as ``tracekit.load``); ``log``: trackers to log the answer to (``"wandb"``, ``"mlflow"``, ``"tensorboard"``),
    with ``log_dir``, ``log_project`` and ``whatif`` as :func:`tracekit.integrations.trackers.log` takes them;
    ``echo``: where the report's lines go (default: printed); ``profile_options``: more options of
    :func:`tracekit.torch.profile` (``with_stack``, ``profile_memory``, ``record_shapes``, ``activities``)."""

    def __init__(self, out_dir: str | os.PathLike[str] | None = None, *, wait: int = 1, warmup: int = 1,
                 active: int = 3, link_bw: str | float | None = None, log: str | Sequence[str] | None = None,
                 log_dir: str | os.PathLike[str] | None = None, log_project: str | None = None,
                 whatif: Mapping[str, Any] | None = None, echo: Callable[[str], None] | None = None,
                 profile_options: Mapping[str, Any] | None = None) -> None:
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.schedule = {"wait": wait, "warmup": warmup, "active": active}
        self.link_bw = link_bw
        self.log = trackers.parse(log)  # a wrong name fails when the callback is made, not after training
        self.log_dir, self.log_project, self.whatif = log_dir, log_project, whatif
        self.echo = echo or _print
        self.profile_options = dict(profile_options or {})
        self.profile: tk_torch.Profile | None = None
        self.steps = 0
        #: the traces this rank wrote in this run (a folder reused keeps older ones: they are not this run's)
        self.written: list[Path] = []
        #: the job read back at the end (rank 0), and the trackers' lines
        self.job: Job | None = None
        self.logged: list[str] = []

    @property
    def running(self) -> bool:
        return self.profile is not None

    def start(self, default_dir: str | os.PathLike[str]) -> None:
        """Start profiling (at the first training step); ``default_dir`` is the framework's output folder."""
        if self.profile is not None:
            return
        if self.out_dir is None:
            env = os.environ.get(tk_torch.ENV_RUN_DIR)
            self.out_dir = Path(env) if env else Path(default_dir) / SUBDIR
        self.steps = 0
        self.written = []
        self.profile = tk_torch.profile(self.out_dir, repeat=1, **self.schedule, **self.profile_options)
        self.profile.__enter__()

    def step(self) -> None:
        """One training step ended: drive the schedule, and stop once the window is written."""
        if self.profile is None:
            return
        self.profile.step()
        self.steps += 1
        if self.profile.files:
            self.stop()

    def stop(self) -> None:
        """Stop profiling (the window is written already, or the run ended before it was)."""
        prof, self.profile = self.profile, None
        if prof is not None:
            with warnings.catch_warnings():  # "no trace was written": finish() says it, in its own words
                warnings.simplefilter("ignore", RuntimeWarning)
                prof.__exit__(None, None, None)
            self.written = list(prof.files)

    def files(self, world_size: int) -> list[Path]:
        """The traces of this run's ranks."""
        assert self.out_dir is not None
        return [self.out_dir / tk_torch.trace_name(r) for r in range(world_size)]

    def finish(self, *, rank: int, world_size: int, barrier: Callable[[], None] | None = None) -> Job | None:
        """End of training: stop, wait for every rank's trace (``barrier``), and on rank 0 read them, print the
        verdict and log it. Returns the :class:`tracekit.Job` on rank 0 (None elsewhere, or without traces)."""
        self.stop()
        if barrier is not None and world_size > 1:
            barrier()
        if rank != 0 or self.out_dir is None:
            return None
        files = self.files(world_size)
        # every rank runs the same steps: rank 0's own trace says whether this run's window was written
        missing = [str(r) for r, f in enumerate(files) if not f.exists() or (r == 0 and f not in self.written)]
        need = (f"profiling needs {sum(self.schedule.values())} training steps (wait {self.schedule['wait']}, warmup "
                f"{self.schedule['warmup']}, active {self.schedule['active']}); this rank made {self.steps}")
        if missing:
            self.echo(f"tracekit: no trace of rank {', '.join(missing)} in {self.out_dir}: {need}")
            return None
        import tracekit

        try:
            job = tracekit.load([str(f) for f in files], link_bw=self.link_bw)
            if job.n_iterations == 0:  # stopped while warming up: a trace, but no step recorded
                self.echo(f"tracekit: no profiled step in the traces in {self.out_dir}: {need}")
                return None
            verdict = job.verdict
            self.echo(f"tracekit: {_count(job.n_ranks, 'rank')} · {_count(job.n_iterations, 'iteration')} profiled "
                      f"in {self.out_dir}")
            self.echo(f"verdict: {verdict.text}")
            self.echo(f"look closer: tracekit inspect {_shown(self.out_dir, files)}")
            if self.log:
                self.logged = trackers.log(job, self.log, log_dir=self.log_dir, project=self.log_project,
                                           whatif=self.whatif)
                for line in self.logged:
                    self.echo(f"tracekit: logged to {line}")
        except TraceError as exc:  # the training is done: say what went wrong, never fail the run for it
            self.echo(f"tracekit: {exc}")
            return None
        self.job = job
        return job


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _print(line: str) -> None:
    print(line, file=sys.stdout, flush=True)


def _shown(out_dir: Path, files: list[Path]) -> str:
    """The folder when it holds this run's traces alone, else the files (a folder reused by a bigger job)."""
    from tracekit.loading.traceset import discover

    try:
        found = {Path(f).resolve() for f in discover([str(out_dir)])[0]}
    except TraceError:
        found = set()
    if found == {f.resolve() for f in files}:
        return str(out_dir)
    return " ".join(str(f) for f in files)
