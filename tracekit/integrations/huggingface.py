"""Hugging Face ``transformers.Trainer``: a ``TrainerCallback`` that profiles a few training steps on every rank and,
when training ends, prints on rank 0 what sets the job's pace (docs/integrations/huggingface.md)::

    from transformers import Trainer
    from tracekit.integrations.huggingface import TracekitCallback

    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[TracekitCallback()])
    trainer.train()   # at the end, rank 0 prints the verdict and `tracekit inspect <folder>`

The traces go to ``$TRACEKIT_RUN_DIR``, else ``<output_dir>/tracekit-traces`` (one per rank, the schedule of
:func:`tracekit.torch.profile`; a step is an optimizer step, gradient accumulation included).
"""

from __future__ import annotations

import os
from typing import Any

from tracekit.integrations.profiled_run import ProfiledRun

INSTALL_HINT = "pip install 'tracekit[transformers]'"

try:
    from transformers import TrainerCallback
except ImportError as exc:
    raise ImportError(f"tracekit.integrations.huggingface needs transformers, which is not installed: "
                      f"{INSTALL_HINT}") from exc


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


class TracekitCallback(TrainerCallback):
    """Profile training steps ``wait`` + ``warmup`` + 1 … + ``active`` on every rank (``tracekit.torch``'s schedule),
    then on rank 0 read the ranks' traces, print the verdict and log it to ``log`` (``"wandb"``, ``"mlflow"``,
    ``"tensorboard"``). The options are those of :class:`tracekit.integrations.profiled_run.ProfiledRun`; after
    ``train()``, ``job`` is the :class:`tracekit.Job` on rank 0."""

    def __init__(self, out_dir: str | os.PathLike[str] | None = None, **options: Any) -> None:
        self.run = ProfiledRun(out_dir, **options)

    @property
    def job(self) -> Any:
        return self.run.job

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.run.start(args.output_dir or ".")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.run.step()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.run.finish(rank=args.process_index, world_size=args.world_size, barrier=_barrier)
