"""A tiny DDP training script profiled with ``tracekit.torch.profile``: the example of "profile your job".

A small MLP on random data, data-parallel over gloo (CPU; NCCL when ``--backend nccl`` on GPUs). Run it
under ``tracekit record`` and read the result::

    tracekit record --out runs/ddp -- torchrun --standalone --nproc_per_node 2 samples/train_ddp.py --steps 6
    tracekit summary runs/ddp

Without torchrun it runs as a single process (world size 1). With the default schedule (1 wait + 1
warm-up + 3 active steps) ``--steps`` must be at least 5 for a full profiled window.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import tracekit.torch


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=6, help="training iterations (default %(default)s)")
    p.add_argument("--hidden", type=int, default=256, help="MLP width (default %(default)s)")
    p.add_argument("--layers", type=int, default=3, help="hidden layers (default %(default)s)")
    p.add_argument("--batch", type=int, default=64, help="per-rank batch size (default %(default)s)")
    p.add_argument("--backend", default="gloo", help="torch.distributed backend (default %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (default %(default)s)")
    p.add_argument("--out", default=None, help="trace directory (default $TRACEKIT_RUN_DIR)")
    return p


def _single_process_env() -> None:
    """Let the script run without a launcher: a world of one over a free local port."""
    if "RANK" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def main(argv: Sequence[str] | None = None) -> int:
    """Train ``--steps`` iterations under the profiler; rank 0 prints the mean step time."""
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    _single_process_env()
    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if args.backend == "nccl" else None
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.hidden, args.hidden), nn.ReLU()]
    model = DistributedDataParallel(nn.Sequential(*layers, nn.Linear(args.hidden, 10)).to(device))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(rank + 1)
    x = torch.randn(args.batch, args.hidden, generator=gen).to(device)
    y = torch.randint(0, 10, (args.batch,), generator=gen).to(device)

    walls = []
    with tracekit.torch.profile(args.out) as prof:
        for _ in range(args.steps):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            opt.step()
            walls.append(time.perf_counter() - t0)
            prof.step()
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print(f"rank 0: {args.steps} steps, mean {1e3 * sum(walls) / len(walls):.1f} ms; "
              f"traces: {', '.join(str(f) for f in prof.files) or 'none'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
