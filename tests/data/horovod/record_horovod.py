#!/usr/bin/env python3
"""Small PyTorch + Horovod training job used to record real Horovod timelines
(and optionally PyTorch-profiler / Kineto traces of the same run) as test data
for tracekit's Horovod timeline parser.

Run it under horovodrun, e.g.

    horovodrun -np 2 -H localhost:2 --gloo \
        --timeline-filename /tmp/tl.json --timeline-mark-cycles \
        python record_horovod.py --steps 20

Options:
  --steps N          training steps (default 20)
  --profile-dir DIR  wrap the loop in torch.profiler.profile(CPU,
                     record_shapes=True, schedule(wait=1, warmup=1, active=N-2))
                     and export DIR/rank{r}.pt.trace.json per rank
  --fusion-mb MB     sets HOROVOD_FUSION_THRESHOLD (MB -> bytes) before hvd.init()
  --odd-name         also allreduce one tensor per step named
                     'grad "quoted" \\ path' (Horovod writes names unescaped)
"""
import argparse
import os


def parse_args():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--profile-dir", default=None)
    p.add_argument("--fusion-mb", type=float, default=None)
    p.add_argument("--odd-name", action="store_true")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args()


def main():
    args = parse_args()
    if args.fusion_mb is not None:
        # Must be set before hvd.init(); Horovod reads it at background-thread start.
        os.environ["HOROVOD_FUSION_THRESHOLD"] = str(int(args.fusion_mb * 1024 * 1024))

    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import horovod.torch as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(args.seed + rank)
    torch.set_num_threads(1)

    class SmallCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
            self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
            self.fc1 = nn.Linear(16 * 7 * 7, 64)
            self.fc2 = nn.Linear(64, 10)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.conv1(x)), 2)
            x = F.max_pool2d(F.relu(self.conv2(x)), 2)
            x = x.flatten(1)
            x = F.relu(self.fc1(x))
            return self.fc2(x)

    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * size, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)

    # Fixed random "dataset" (MNIST-shaped).
    n_batches = 8
    data = [(torch.randn(args.batch_size, 1, 28, 28),
             torch.randint(0, 10, (args.batch_size,))) for _ in range(n_batches)]
    odd = torch.ones(16) * (rank + 1)
    odd_name = 'grad "quoted" \\ path'

    def train_step(step):
        x, y = data[step % n_batches]
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if args.odd_name:
            hvd.allreduce(odd, name=odd_name)
        return loss

    if args.profile_dir:
        from torch.profiler import profile, schedule, ProfilerActivity
        os.makedirs(args.profile_dir, exist_ok=True)
        active = max(1, args.steps - 2)
        out = os.path.join(args.profile_dir, "rank%d.pt.trace.json" % rank)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                     schedule=schedule(wait=1, warmup=1, active=active),
                     on_trace_ready=lambda p: p.export_chrome_trace(out)) as prof:
            for step in range(args.steps):
                loss = train_step(step)
                prof.step()
    else:
        for step in range(args.steps):
            loss = train_step(step)

    avg = hvd.allreduce(loss.detach(), name="avg_loss")
    if rank == 0:
        print("done: steps=%d size=%d final avg loss=%.4f" % (args.steps, size, avg.item()),
              flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
