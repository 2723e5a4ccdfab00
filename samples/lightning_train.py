"""PyTorch Lightning with tracekit's callback: a tiny model trained data-parallel on 2 CPU processes (gloo); at the
end rank 0 prints the verdict and where the traces are (docs/integrations/lightning.md)::

    torchrun --standalone --nproc_per_node 2 samples/lightning_train.py
    tracekit inspect tracekit-traces

``--tracker tensorboard`` (or ``wandb``, ``mlflow``) logs the answer too; ``--pytorch-profiler DIR`` first profiles a
run with Lightning's own ``PyTorchProfiler`` into DIR, a folder tracekit reads as well (``tracekit summary DIR``).
The tests run this script (tests/test_lightning.py).
"""

from __future__ import annotations

import argparse

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from tracekit.integrations.lightning import TracekitCallback


class Tiny(L.LightningModule):
    """A two-layer MLP regressing random targets: its gradients are what DDP all-reduces every step."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def trainer(steps: int, **kw: object) -> L.Trainer:
    return L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=steps, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, **kw)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="where the traces go (default $TRACEKIT_RUN_DIR, else ./tracekit-traces)")
    p.add_argument("--steps", type=int, default=6, help="training steps (the callback profiles steps 3-5)")
    p.add_argument("--tracker", help="log the answer to wandb, mlflow or tensorboard")
    p.add_argument("--tracker-dir", help="the folder the tracker writes under")
    p.add_argument("--pytorch-profiler", metavar="DIR", help="first profile a run with Lightning's PyTorchProfiler")
    a = p.parse_args()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(256, 64), torch.randn(256, 8))
    if a.pytorch_profiler:  # Lightning's own profiler: a training and a validation trace per rank
        from lightning.pytorch.profilers import PyTorchProfiler

        prof = PyTorchProfiler(dirpath=a.pytorch_profiler, filename="prof", record_shapes=True)
        trainer(8, profiler=prof, limit_val_batches=4, val_check_interval=8).fit(
            Tiny(), DataLoader(data, batch_size=8), DataLoader(data, batch_size=8))
    callback = TracekitCallback(a.out, log=a.tracker, log_dir=a.tracker_dir)
    trainer(a.steps, callbacks=[callback], limit_val_batches=0).fit(Tiny(), DataLoader(data, batch_size=8))


if __name__ == "__main__":
    main()
