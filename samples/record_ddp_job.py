"""The training job of ``samples/record_ddp.py``: what every rank runs under torchrun (``record_ddp.py
--worker-config FILE`` calls :func:`train_worker`), and :class:`RecordConfig`, the settings the launcher
hands every rank as that file.

The model (:func:`build_model`: an MLP or a CNN) is spread over the ranks as ``--parallel`` says
(:func:`build_job`: DDP, FSDP2, a GPipe pipeline or tensor-parallel pairs with DDP across them), trained on
the CPU over gloo under ``tracekit.torch.profile``. torch is imported inside the functions only, so the
launcher (and the tests) import this module without it.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: how the model is spread over the ranks (see ``build_job``)
PARALLEL = ("ddp", "fsdp", "pipeline", "dp-tp")


@dataclass
class RecordConfig:
    """Everything that defines a recording. JSON-able; handed to every rank as a file."""

    out: str
    nproc: int = 2
    steps: int = 5
    wait: int = 1
    warmup: int = 1
    model: str = "mlp"
    hidden: int = 512
    layers: int = 8
    batch: int = 512
    image: int = 32
    bucket_mb: float = 1.0
    link_rate_bps: int | None = None
    link_delay_us: int | None = None
    check_link: bool = True
    gzip: bool = True
    seed: int = 0
    threads: int = 1
    record_shapes: bool = True
    parallel: str = "ddp"
    accumulate: int = 1
    microbatches: int = 4
    nodes: int | None = None
    force: bool = False
    timeout_s: float = 900.0
    #: the link's rate per block of ``block_steps`` profiled steps, changed while the job runs (bits/s; the
    #: first also shapes the wait and warm-up steps); empty: one rate throughout
    rate_schedule: list[int] = field(default_factory=list)
    block_steps: int = 0
    #: a straggler: rank ``sleep_rank`` sleeps ``sleep_ms`` in every step, before its forward pass
    sleep_rank: int | None = None
    sleep_ms: float = 0.0
    #: a slow data loader: every rank's batches come through a torch DataLoader taking ``loader_ms`` per batch
    loader_ms: float = 0.0
    #: nice level of the ranks (negative: before other work on the machine; needs root)
    nice: int = 0
    #: real-time (SCHED_RR) priority of the ranks, 0 = the normal scheduler (needs root)
    realtime: int = 0

    def validate(self) -> None:
        """Raise ValueError for settings that cannot make a recording."""
        if self.rate_schedule:
            if self.block_steps < 1:
                raise ValueError("--rate-schedule needs --block-steps >= 1")
            if self.steps != len(self.rate_schedule) * self.block_steps:
                raise ValueError("with --rate-schedule the profiled steps are blocks x --block-steps")
            if self.link_delay_us is not None:
                raise ValueError("--rate-schedule changes a tbf rate: it cannot go with --link-delay")
        if self.nproc < 2:
            raise ValueError("--nproc must be at least 2 (a distributed job)")
        if self.steps < 1 or self.wait < 0 or self.warmup < 0:
            raise ValueError("--steps must be >= 1 and --wait/--warmup >= 0")
        if self.model not in ("mlp", "cnn"):
            raise ValueError(f"unknown --model {self.model!r} (mlp or cnn)")
        for name in ("hidden", "layers", "batch", "threads", "image"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1")
        if self.bucket_mb <= 0:
            raise ValueError("--bucket-mb must be > 0")
        if self.parallel not in PARALLEL:
            raise ValueError(f"unknown --parallel {self.parallel!r} ({', '.join(PARALLEL)})")
        if self.accumulate < 1 or self.microbatches < 1:
            raise ValueError("--accumulate and --microbatches must be >= 1")
        if self.parallel == "pipeline" and self.accumulate != 1:
            raise ValueError("--accumulate applies to ddp, fsdp and dp-tp (a pipeline has --microbatches)")
        if self.parallel == "pipeline" and self.layers < self.nproc:
            raise ValueError("a pipeline needs at least one layer per stage (--layers >= --nproc)")
        if self.parallel == "dp-tp" and (self.nproc % 2 or self.nproc < 4):
            raise ValueError("dp-tp needs an even --nproc of at least 4 (tensor-parallel pairs)")
        if self.parallel == "dp-tp" and self.model != "mlp":
            raise ValueError("dp-tp shards MLP layers: use --model mlp")
        if self.hosts < 2 or self.nproc % self.hosts:
            raise ValueError("--nodes must be >= 2 and divide --nproc")
        if self.sleep_rank is not None and not 0 <= self.sleep_rank < self.nproc:
            raise ValueError("--sleep-rank must be a rank of the job (0 .. --nproc - 1)")
        if not 0 <= self.realtime <= 99:
            raise ValueError("--realtime must be a priority 1..99 (0: the normal scheduler)")
        if self.sleep_ms < 0 or self.loader_ms < 0:
            raise ValueError("--sleep-ms and --loader-ms must be >= 0")

    def block_of(self, step: int) -> int | None:
        """The block of the rate schedule that step ``step`` (0-based, wait and warm-up counted) runs in; None
        before the profiled steps or without a schedule."""
        k = step - self.wait - self.warmup
        if not self.rate_schedule or k < 0:
            return None
        return k // self.block_steps

    @property
    def hosts(self) -> int:
        """Namespaces ("hosts") of a shaped run: one per rank unless --nodes says otherwise."""
        return self.nodes or (self.nproc // 2 if self.parallel == "dp-tp" else self.nproc)

    @property
    def shaped(self) -> bool:
        """Whether ranks run in namespaces behind a shaped link."""
        return self.link_rate_bps is not None or self.link_delay_us is not None or bool(self.rate_schedule)

    def trace_name(self, rank: int) -> str:
        """File name of rank ``rank``'s trace in the output directory."""
        return f"rank{rank}.pt.trace.json" + (".gz" if self.gzip else "")


# ---------------------------------------------------------------------------------------------------
# The training job (runs in every rank's process)
# ---------------------------------------------------------------------------------------------------


def build_model(cfg: RecordConfig) -> Any:
    """The model: ``mlp`` = ``layers`` Linear(hidden, hidden)+ReLU and a 10-way head; ``cnn`` = ``layers``
    3x3 conv blocks of ``hidden`` channels (stride 2 every other block) on ``image``-pixel RGB inputs."""
    from torch import nn

    if cfg.model == "mlp":
        mods: list[nn.Module] = []
        for _ in range(cfg.layers):
            mods += [nn.Linear(cfg.hidden, cfg.hidden), nn.ReLU()]
        return nn.Sequential(*mods, nn.Linear(cfg.hidden, 10))
    mods = []
    c_in = 3
    for i in range(cfg.layers):
        mods += [nn.Conv2d(c_in, cfg.hidden, 3, stride=2 if i % 2 else 1, padding=1), nn.ReLU()]
        c_in = cfg.hidden
    return nn.Sequential(*mods, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cfg.hidden, 10))


def input_shape(cfg: RecordConfig) -> tuple[int, ...]:
    """Shape of one input batch."""
    if cfg.model == "mlp":
        return (cfg.batch, cfg.hidden)
    return (cfg.batch, 3, cfg.image, cfg.image)


class _TensorParallelBlock:
    """Factory of a Megatron-style MLP block sharded over a tensor-parallel group (built lazily: torch is
    imported only in the workers)."""

    @staticmethod
    def make(hidden: int, tp: int, tp_rank: int, group: Any) -> Any:
        import torch
        import torch.distributed.nn.functional as dist_fn
        from torch import nn

        class Block(nn.Module):
            """Column-parallel Linear(h, h) + ReLU, row-parallel Linear(h, h), all-reduce over the group."""

            def __init__(self) -> None:
                super().__init__()
                self.up = nn.Linear(hidden, hidden // tp)
                self.down = nn.Linear(hidden // tp, hidden, bias=tp_rank == 0)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                out = self.down(torch.relu(self.up(x)))
                return torch.relu(dist_fn.all_reduce(out, group=group))

        return Block()


def build_job(cfg: RecordConfig, rank: int, world: int) -> tuple[Any, Any, Any]:
    """The model as ``cfg.parallel`` spreads it, its optimizer and one training iteration ``step(batches)``
    (``cfg.accumulate`` micro-steps, gradients synchronised on the last; a pipeline runs
    ``cfg.microbatches`` micro-batches through its stages). Returns (module, optimizer, step)."""
    import contextlib as ctx

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    loss_fn = nn.CrossEntropyLoss()
    if cfg.parallel == "pipeline":
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

        mods = list(build_model(cfg).children())
        blocks = [mods[i : i + 2] for i in range(0, 2 * cfg.layers, 2)]  # (layer, activation) pairs
        per = [len(b) for b in _split(blocks, world)]
        lo = sum(per[:rank])
        head = mods[2 * cfg.layers :] if rank == world - 1 else []
        stage_mods = [m for b in blocks[lo : lo + per[rank]] for m in b] + head
        module = nn.Sequential(*stage_mods)
        sched = ScheduleGPipe(PipelineStage(module, rank, world, torch.device("cpu")), n_microbatches=cfg.microbatches,
                              loss_fn=loss_fn)
        opt = torch.optim.SGD(module.parameters(), lr=0.01, momentum=0.9)

        def step(batches: list[tuple[Any, Any]]) -> float:
            x, y = batches[0]
            if rank == 0:
                sched.step(x)
                return 0.0
            if rank == world - 1:
                losses: list[Any] = []
                sched.step(target=y, losses=losses)
                return float(torch.stack(losses).mean())
            sched.step()
            return 0.0

        return module, opt, step
    if cfg.parallel == "dp-tp":
        tp = 2
        # every rank makes every group; pg_config then names them "tp" and "dp" (tracekit whatif --bandwidth dp=...)
        groups = [dist.new_group([a, a + 1], group_desc="tp") for a in range(0, world, tp)]
        dp_groups = [dist.new_group(list(range(k, world, tp)), group_desc="dp") for k in range(tp)]
        torch.manual_seed(cfg.seed * 7919 + rank % tp)  # a TP pair holds different shards
        blocks = [_TensorParallelBlock.make(cfg.hidden, tp, rank % tp, groups[rank // tp])
                  for _ in range(max(cfg.layers // 2, 1))]
        torch.manual_seed(cfg.seed)
        module = DDP(nn.Sequential(*blocks, nn.Linear(cfg.hidden, 10)), process_group=dp_groups[rank % tp],
                     bucket_cap_mb=cfg.bucket_mb)
        sync = module.no_sync
    elif cfg.parallel == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        module = build_model(cfg)
        mesh = init_device_mesh("cpu", (world,))
        for m in module.children():
            if isinstance(m, (nn.Linear, nn.Conv2d)):
                fully_shard(m, mesh=mesh)
        fully_shard(module, mesh=mesh)

        @ctx.contextmanager
        def sync() -> Iterator[None]:
            module.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                module.set_requires_gradient_sync(True)
    else:
        module = DDP(build_model(cfg), bucket_cap_mb=cfg.bucket_mb)
        sync = module.no_sync
    opt = torch.optim.SGD(module.parameters(), lr=0.01, momentum=0.9)

    def step(batches: list[tuple[Any, Any]]) -> float:
        loss = None
        for k in range(cfg.accumulate):
            x, y = batches[k % len(batches)]
            with sync() if k < cfg.accumulate - 1 else ctx.nullcontext():
                loss = loss_fn(module(x), y) / cfg.accumulate
                loss.backward()
        return float(loss) * cfg.accumulate

    return module, opt, step


def _split(items: list[Any], parts: int) -> list[list[Any]]:
    """``items`` in ``parts`` consecutive runs whose lengths differ by at most one."""
    q, r = divmod(len(items), parts)
    out, i = [], 0
    for k in range(parts):
        n = q + (k < r)
        out.append(items[i : i + n])
        i += n
    return out


def train_worker(cfg: RecordConfig, workdir: Path) -> None:
    """One rank of the job. Reads RANK/WORLD_SIZE/MASTER_* from the environment (env:// rendezvous),
    trains ``wait + warmup + steps`` iterations under torch.profiler and writes, into ``workdir``,
    ``rank{r}.pt.trace.json`` (uncompressed Kineto export) and ``rank{r}.steps.json`` (wall times)."""
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity

    import tracekit.torch

    torch.set_num_threads(cfg.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(cfg.seed)  # same initial weights on every rank (DDP broadcasts them anyway)
    model, opt, train_step = build_job(cfg, rank, world)
    # each data-parallel replica its own data shard (a tensor-parallel pair and a pipeline share theirs)
    shard = rank // 2 if cfg.parallel == "dp-tp" else 0 if cfg.parallel == "pipeline" else rank
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + shard + 1)
    batches = [
        (torch.randn(input_shape(cfg), generator=gen), torch.randint(0, 10, (cfg.batch,), generator=gen))
        for _ in range(2)
    ]

    loader = _slow_loader(batches, cfg.loader_ms) if cfg.loader_ms > 0 else None
    trace_tmp = workdir / f"rank{rank}.pt.trace.json"
    total = cfg.wait + cfg.warmup + cfg.steps
    phases = ["wait"] * cfg.wait + ["warmup"] * cfg.warmup + ["active"] * cfg.steps
    steps: list[dict[str, Any]] = []
    dist.barrier()
    # tracekit's profiler helper writes rank{r}.pt.trace.json (gzip=False: the launcher gzips reproducibly)
    with tracekit.torch.profile(
        workdir,
        wait=cfg.wait,
        warmup=cfg.warmup,
        active=cfg.steps,
        repeat=1,
        record_shapes=cfg.record_shapes,
        with_stack=False,
        activities=[ProfilerActivity.CPU],
        rank=rank,
        gzip=False,
    ) as prof:
        for i in range(total):
            block = cfg.block_of(i)
            if block and (i - cfg.wait - cfg.warmup) % cfg.block_steps == 0:
                # a new block of the rate schedule: wait (outside the timed step, before any traced op) while the
                # launcher changes the link's rate
                _block_barrier(workdir, rank, block, cfg.timeout_s)
            start_ns = time.time_ns()
            t0 = time.perf_counter()
            if rank == cfg.sleep_rank and cfg.sleep_ms > 0:
                time.sleep(cfg.sleep_ms / 1e3)  # a straggler: this rank's step starts late, untraced
            if loader is not None:
                step_batches = [next(loader) for _ in range(cfg.accumulate)]
            else:
                step_batches = batches[i % 2 :] + batches[: i % 2]
            opt.zero_grad(set_to_none=True)
            loss = train_step(step_batches)
            opt.step()
            wall = time.perf_counter() - t0
            steps.append(
                {
                    "step": i,
                    "phase": phases[i],
                    "start_unix_ns": start_ns,
                    "wall_s": wall,
                    "loss": loss,
                    **({"block": block, "rate_bps": cfg.rate_schedule[block]} if block is not None else {}),
                }
            )
            prof.step()
    ddp_info: dict[str, Any] = {}
    with contextlib.suppress(Exception):  # private, best-effort: bucket layout after the rebuild
        data = model._get_ddp_logging_data()
        ddp_info = {
            k: data[k]
            for k in (
                "bucket_sizes",
                "rebuilt_bucket_sizes",
                "has_rebuilt_buckets",
                "bucket_cap_bytes",
                "comm_hook",
            )
            if k in data
        }
    dist.barrier()
    dist.destroy_process_group()
    if not trace_tmp.exists():
        raise RuntimeError(f"rank {rank}: the profiler wrote no trace")
    info = {"rank": rank, "world_size": world, "pid": os.getpid(), "steps": steps, "ddp": ddp_info}
    (workdir / f"rank{rank}.steps.json").write_text(json.dumps(info))


def _block_barrier(workdir: Path, rank: int, block: int, timeout_s: float) -> None:
    """Tell the launcher this rank reached block ``block`` of the rate schedule (a file), then wait for its
    ``block{k}.go`` (the rate is changed) or ``block{k}.abort`` (it could not be)."""
    (workdir / f"block{block}.rank{rank}").touch()
    go, abort = workdir / f"block{block}.go", workdir / f"block{block}.abort"
    deadline = time.monotonic() + timeout_s
    while not go.exists():
        if abort.exists() or time.monotonic() > deadline:
            raise RuntimeError(f"rank {rank}: the link's rate for block {block} was not set")
        time.sleep(0.002)


def _slow_loader(batches: list[Any], loader_ms: float) -> Iterator[Any]:
    """An endless torch DataLoader over ``batches`` whose every batch takes ``loader_ms`` to load (a slow input
    pipeline: the profiler records its ``enumerate(DataLoader)`` calls, with nothing inside)."""
    import torch

    class Slow(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 1 << 30

        def __getitem__(self, i: int) -> Any:
            time.sleep(loader_ms / 1e3)
            return batches[i % len(batches)]

    return iter(torch.utils.data.DataLoader(Slow(), batch_size=None, num_workers=0))
