"""Hugging Face ``transformers.Trainer`` with tracekit's callback: a 1-layer GPT-2 built from a config (nothing is
downloaded) trained data-parallel on 2 CPU processes (gloo); at the end rank 0 prints the verdict and where the traces
are (docs/integrations/huggingface.md)::

    torchrun --standalone --nproc_per_node 2 samples/huggingface_train.py
    tracekit inspect hf-output/tracekit-traces

``--tracker wandb`` (or ``mlflow``, ``tensorboard``) logs the answer too; ``--accelerate-profile DIR`` first profiles a
few steps with Accelerate's ``ProfileKwargs`` into DIR, a folder tracekit reads as well (``tracekit summary DIR``).
The tests run this script (tests/test_huggingface.py).
"""

from __future__ import annotations

import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from tracekit.integrations.huggingface import TracekitCallback

CONFIG = GPT2Config(n_layer=1, n_head=2, n_embd=64, vocab_size=128, n_positions=32)


def model() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(CONFIG)


def data(n: int = 64) -> list[dict[str, torch.Tensor]]:
    """``n`` random sequences of 32 tokens, each its own label (language modelling)."""
    ids = torch.randint(0, CONFIG.vocab_size, (n, 32), generator=torch.Generator().manual_seed(1))
    return [{"input_ids": x, "labels": x} for x in ids]


def accelerate_profile(out: str, steps: int = 6) -> None:
    """A plain training loop under Accelerate's profiler (its schedule: 1 step skipped, 1 warming up, 3 recorded, so
    that the steps are marked): ``profile_<process index>.json`` in ``out``."""
    from accelerate import Accelerator
    from accelerate.utils import ProfileKwargs

    kw = ProfileKwargs(activities=["cpu"], record_shapes=True, output_trace_dir=out,
                       schedule_option={"wait": 1, "warmup": 1, "active": 3, "repeat": 1})
    acc = Accelerator(cpu=True, kwargs_handlers=[kw])
    net = model()
    net, opt = acc.prepare(net, torch.optim.SGD(net.parameters(), lr=0.01))
    batch = torch.stack([d["input_ids"] for d in data(8)])
    with acc.profile() as prof:
        for _ in range(steps):
            acc.backward(net(input_ids=batch, labels=batch).loss)
            opt.step()
            opt.zero_grad()
            prof.step()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output-dir", default="hf-output", help="the Trainer's output folder (default %(default)s)")
    p.add_argument("--steps", type=int, default=6, help="training steps (the callback profiles steps 3-5)")
    p.add_argument("--tracker", help="log the answer to wandb, mlflow or tensorboard")
    p.add_argument("--tracker-dir", help="the folder the tracker writes under")
    p.add_argument("--accelerate-profile", metavar="DIR", help="first profile a few steps with Accelerate")
    a = p.parse_args()
    if a.accelerate_profile:
        accelerate_profile(a.accelerate_profile)
    args = TrainingArguments(output_dir=a.output_dir, max_steps=a.steps, per_device_train_batch_size=4,
                             use_cpu=True, ddp_backend="gloo", report_to="none", save_strategy="no",
                             logging_strategy="no", dataloader_num_workers=0, disable_tqdm=True)
    callback = TracekitCallback(log=a.tracker, log_dir=a.tracker_dir)  # traces: <output_dir>/tracekit-traces
    Trainer(model=model(), args=args, train_dataset=data(), callbacks=[callback]).train()


if __name__ == "__main__":
    main()
