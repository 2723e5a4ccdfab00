"""PyTorch Lightning: a ``Callback`` that profiles a few training steps on every rank and, when training ends, prints
on rank 0 what sets the job's pace (docs/integrations/lightning.md)::

    import lightning as L
    from tracekit.integrations.lightning import TracekitCallback

    trainer = L.Trainer(callbacks=[TracekitCallback()], ...)
    trainer.fit(model, loader)   # at the end, rank 0 prints the verdict and `tracekit inspect <folder>`

The traces go to ``$TRACEKIT_RUN_DIR``, else ``<default_root_dir>/tracekit-traces`` (one per rank, the schedule of
:func:`tracekit.torch.profile`: 1 step skipped, 1 warming up, 3 recorded). ``TracekitCallback`` derives from
``lightning.pytorch.Callback`` (from ``pytorch_lightning.Callback`` where only that package is installed);
:func:`callback_class` makes it for the other one.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from typing import Any

from tracekit.integrations.profiled_run import ProfiledRun

INSTALL_HINT = "pip install 'tracekit[lightning]'"


def _base(package: str) -> type:
    try:
        return importlib.import_module(package).Callback
    except ImportError as exc:
        raise ImportError(f"tracekit.integrations.lightning needs PyTorch Lightning ({package}), which is not "
                          f"installed: {INSTALL_HINT}") from exc


@functools.cache
def callback_class(package: str = "lightning.pytorch") -> type:
    """The tracekit callback as a subclass of ``package``'s ``Callback`` (``"lightning.pytorch"`` or
    ``"pytorch_lightning"``: Lightning's trainers accept callbacks of their own package only)."""
    base = _base(package)

    class TracekitCallback(base):  # type: ignore[valid-type,misc]
        """Profile training steps ``wait`` + ``warmup`` + 1 … + ``active`` on every rank (``tracekit.torch``'s
        schedule), then on rank 0 read the ranks' traces, print the verdict and log it to ``log`` (``"wandb"``,
        ``"mlflow"``, ``"tensorboard"``). The options are those of
        :class:`tracekit.integrations.profiled_run.ProfiledRun`; after ``fit``, ``job`` is the
        :class:`tracekit.Job` on rank 0."""

        def __init__(self, out_dir: str | os.PathLike[str] | None = None, **options: Any) -> None:
            super().__init__()
            self.run = ProfiledRun(out_dir, **options)

        @property
        def job(self) -> Any:
            return self.run.job

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            self.run.start(trainer.default_root_dir)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            self.run.step()

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            self.run.finish(rank=trainer.global_rank, world_size=trainer.world_size,
                            barrier=lambda: trainer.strategy.barrier("tracekit"))

        def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
            self.run.stop()

    TracekitCallback.__module__ = __name__
    TracekitCallback.__qualname__ = "TracekitCallback"
    return TracekitCallback


def _default_package() -> str:
    return "lightning.pytorch" if importlib.util.find_spec("lightning") is not None else "pytorch_lightning"


TracekitCallback = callback_class(_default_package())
