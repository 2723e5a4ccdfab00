"""``tracekit.torch.profile``: torch.profiler set up the way tracekit's analysis needs it, in one line.

Use it around a training loop and call ``.step()`` once per iteration::

    import tracekit.torch

    with tracekit.torch.profile() as prof:
        for batch in loader:
            train_step(batch)
            prof.step()

What it sets, and why:

* a schedule that skips the first ``wait`` steps (start-up, allocator and NCCL warm-up are not typical),
  warms the profiler up for ``warmup`` steps and records ``active`` steps (``repeat`` windows);
* CPU activity, plus CUDA when a GPU is available (kernels, memcpys and their correlation ids link GPU
  work to the step that launched it);
* ``record_shapes=True``: ``Input Dims`` are the only size of gloo work and of NCCL calls before
  PyTorch 2.2 (FORMATS.md §1.6); collective metadata (``record_param_comms``) is recorded by PyTorch;
* one file per rank, named by rank (``rank{r}.pt.trace.json.gz``; ``rank{r}.w{k}.…`` with several
  windows), written atomically (temporary name, then rename) into ``out_dir``, else ``$TRACEKIT_RUN_DIR``
  (set by ``tracekit record``), else ``./tracekit-traces``. The rank comes from torch.distributed when it
  is initialised, else from the launcher's environment (``RANK``, Horovod's, MPI's, Slurm's, then
  ``LOCAL_RANK``), else 0.

torch is imported only when ``profile()`` is called: tracekit itself never needs it, and importing this
module without torch installed works (calling ``profile()`` then says how to install it).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

ENV_RUN_DIR = "TRACEKIT_RUN_DIR"
DEFAULT_DIR = "tracekit-traces"
# Global rank as launchers publish it, most specific first; LOCAL_RANK is only right on a single node.
RANK_ENV = ("RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "LOCAL_RANK")
INSTALL_HINT = "pip install 'tracekit[torch]'"


def _import_torch() -> Any:
    """The real ``torch`` package (absolute import), or an ImportError that says how to install it."""
    try:
        import torch
        import torch.profiler  # the submodule must be importable too
    except ImportError as exc:
        raise ImportError(f"tracekit.torch needs PyTorch, which is not installed: {INSTALL_HINT}") from exc
    return torch


def current_rank() -> int:
    """This process's global rank: torch.distributed when initialised, else the launcher's environment, else 0."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except ImportError:
        pass
    for name in RANK_ENV:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 0


def trace_name(rank: int, window: int | None = None, gzip: bool = True) -> str:
    """File name of a rank's trace: ``rank3.pt.trace.json.gz``, or ``rank3.w1.pt.trace.json.gz`` for window 1
    of a schedule with several windows (tracekit reads ranks from these names when a trace lacks
    ``distributedInfo``, e.g. Horovod jobs)."""
    middle = "" if window is None else f".w{window}"
    return f"rank{rank}{middle}.pt.trace.json" + (".gz" if gzip else "")


class Profile:
    """A running ``torch.profiler.profile`` that writes each finished window to the run directory.

    Use it as a context manager and call :meth:`step` once per iteration. ``profiler`` is the underlying
    ``torch.profiler.profile`` (for ``key_averages()`` and friends); ``files`` lists the traces written so
    far; ``out_dir`` is where they go.
    """

    def __init__(self, out_dir: str | os.PathLike[str] | None = None, *, wait: int = 1, warmup: int = 1,
                 active: int = 3, repeat: int = 1, record_shapes: bool = True, with_stack: bool = False,
                 profile_memory: bool = False, activities: list[Any] | None = None, rank: int | None = None,
                 gzip: bool = True) -> None:
        for name, value, low in (("wait", wait, 0), ("warmup", warmup, 0), ("active", active, 1),
                                 ("repeat", repeat, 0)):
            if not isinstance(value, int) or value < low:
                raise ValueError(f"tracekit.torch.profile: {name} must be an integer >= {low}, not {value!r}")
        torch = _import_torch()
        from torch.profiler import ProfilerActivity, schedule

        self.out_dir = Path(out_dir or os.environ.get(ENV_RUN_DIR) or DEFAULT_DIR)
        self.rank = rank
        self.gzip = gzip
        self.repeat = repeat
        self.first_active = wait + warmup
        self.files: list[Path] = []
        self.steps = 0
        if activities is None:
            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(ProfilerActivity.CUDA)
        self.profiler = torch.profiler.profile(
            activities=activities,
            schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=repeat),
            on_trace_ready=self._write,
            record_shapes=record_shapes,
            with_stack=with_stack,
            profile_memory=profile_memory,
        )

    def __enter__(self) -> Profile:
        self.out_dir.mkdir(parents=True, exist_ok=True)  # fail now, not after the first window
        self.profiler.__enter__()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.profiler.__exit__(exc_type, exc, tb)
        if exc_type is None and not self.files:
            warnings.warn(f"tracekit.torch.profile: no trace was written: the loop made {self.steps} step() "
                          f"calls and the first profiled step is #{self.first_active} (wait + warmup)",
                          RuntimeWarning, stacklevel=2)

    def step(self) -> None:
        """Mark the end of one training iteration (drives the schedule; call it once per iteration)."""
        self.profiler.step()
        self.steps += 1

    def _write(self, prof: Any) -> None:
        """``on_trace_ready``: export the finished window under a temporary name, then rename it into place."""
        # the rank is resolved this late because init_process_group may run after profile() was created
        rank = current_rank() if self.rank is None else self.rank
        window = None if self.repeat == 1 else len(self.files)
        final = self.out_dir / trace_name(rank, window, self.gzip)
        # a hidden name (tracekit skips dot files) ending like the final one: torch gzips when it ends in .gz
        tmp = self.out_dir / f".{final.name}.{os.getpid()}.tmp{'.gz' if self.gzip else ''}"
        try:
            prof.export_chrome_trace(str(tmp))
            os.replace(tmp, final)
        finally:
            if tmp.exists():
                tmp.unlink()
        self.files.append(final)


def profile(out_dir: str | os.PathLike[str] | None = None, *, wait: int = 1, warmup: int = 1, active: int = 3,
            repeat: int = 1, record_shapes: bool = True, with_stack: bool = False, profile_memory: bool = False,
            activities: list[Any] | None = None, rank: int | None = None, gzip: bool = True) -> Profile:
    """A context manager that profiles a training loop for tracekit; call ``.step()`` once per iteration.

    ``wait`` steps are skipped, ``warmup`` steps warm the profiler up, ``active`` steps are recorded, and
    the cycle runs ``repeat`` times (0: until the loop ends). Each finished window becomes one file per
    rank in ``out_dir`` (default ``$TRACEKIT_RUN_DIR``, else ``./tracekit-traces``); with several windows
    (``rank{r}.w{k}.…``) give tracekit one window at a time (``tracekit summary DIR/rank*.w0.*``), since it
    takes each file for a rank of its own. ``with_stack`` adds
    Python frames (large files); ``profile_memory`` adds allocator events; ``activities`` overrides
    CPU (+ CUDA when available); ``rank`` overrides the detected rank; ``gzip=False`` writes plain JSON.
    Raises ImportError (with the install command) when torch is missing.
    """
    return Profile(out_dir, wait=wait, warmup=warmup, active=active, repeat=repeat, record_shapes=record_shapes,
                   with_stack=with_stack, profile_memory=profile_memory, activities=activities, rank=rank,
                   gzip=gzip)
