"""Record real GPU training jobs under torch.profiler on a machine with one CUDA GPU, for tests/data/gpu/.

Five cases, each in its own folder under ``--out``:

``nccl-1rank``
    One process, the NCCL backend (a world of one rank): a 4-layer transformer encoder (d=1024, bf16 autocast,
    AdamW) under DistributedDataParallel (25 MB buckets), plus one explicit ``all_gather``, ``reduce_scatter`` and
    ``broadcast`` per step. Writes the rank's Kineto trace (CPU and CUDA activities, ``record_shapes``), NCCL's own
    debug log (``NCCL_DEBUG=INFO``, subsystems INIT and COLL), and two Flight Recorder dumps (pickle and JSON, with
    CUDA timing): one taken while an ``all_reduce`` waits behind a long kernel (``inflight/``), one at the end
    (``final/``).
``gloo-2rank`` (and ``gloo-2rank-straggler``: rank 1 sleeps 40 ms on the CPU in every step before its forward;
``gloo-4rank``, ``gloo-4rank-straggler``: the same with four processes)
    Two processes on the same GPU, the gloo backend (gloo copies CUDA tensors to the host and back): the same model
    under DDP. NCCL refuses two ranks on one GPU, so this is the only real multi-rank job one GPU can run; the
    ranks' kernels share the GPU (time-sliced), their collectives wait for each other for real.

Every case writes ``run.json``: the machine (GPU, CUDA, NCCL and torch versions), the model, the profiler's
schedule and each step's wall time per rank (``torch.cuda.synchronize`` then ``time.perf_counter``: the truth).
Needs torch with CUDA; ``--cpu`` runs the same code on the CPU with gloo for a dry run of the script itself.

    python samples/record_gpu.py --out /tmp/gpu            # every case
    python samples/record_gpu.py --out /tmp/gpu --case gloo-2rank --steps 5
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

CASES = ("nccl-1rank", "gloo-2rank", "gloo-2rank-straggler", "gloo-4rank", "gloo-4rank-straggler")
#: the straggler case: this rank sleeps this long on the CPU in every step, before its forward pass (untraced)
STRAGGLER = (1, 40.0)
MODEL = {"kind": "TransformerEncoder", "layers": 4, "d_model": 1024, "heads": 16, "ffn": 4096,
         "batch": 8, "seq": 512, "autocast": "bfloat16", "optimizer": "AdamW(lr=1e-4)"}
#: the dry run's model (``--cpu``): small enough for a 2-core machine
DRY_MODEL = {**MODEL, "d_model": 64, "heads": 4, "ffn": 256, "batch": 4, "seq": 32}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _machine(torch: Any, device: str) -> dict[str, Any]:
    info: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(),
                            "host_cpus": os.cpu_count()}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    multiprocessors=props.multi_processor_count, cuda=torch.version.cuda,
                    nccl=".".join(map(str, torch.cuda.nccl.version())))
    return info


def _model(torch: Any, device: str, m: dict[str, Any]) -> Any:
    layer = torch.nn.TransformerEncoderLayer(m["d_model"], m["heads"], m["ffn"], batch_first=True)
    return torch.nn.TransformerEncoder(layer, m["layers"], enable_nested_tensor=False).to(device)


def _dump_fr(torch: Any, out: Path, label: str) -> str:
    """Write this process's Flight Recorder dump in both forms under ``out/label``; the function names used."""
    c10d = torch._C._distributed_c10d
    for pickled, as_json in (("_dump_nccl_trace", "_dump_nccl_trace_json"), ("_dump_fr_trace", "_dump_fr_trace_json")):
        if hasattr(c10d, pickled) and hasattr(c10d, as_json):
            (out / label).mkdir(parents=True, exist_ok=True)
            (out / label / "fr_trace_rank_0").write_bytes(getattr(c10d, pickled)())
            text = getattr(c10d, as_json)()
            (out / label / "fr_trace_rank_0.json").write_bytes(text if isinstance(text, bytes) else text.encode())
            return f"{pickled}, {as_json}"
    raise RuntimeError("this torch has no Flight Recorder dump function")


def _flight_recorder(torch: Any, dist: Any, device: str, side: Any, folder: Path, extra: dict[str, Any]) -> None:
    """Dump while an all_reduce waits behind a long kernel (scheduled, not started), then again once it is done."""
    if device == "cuda":
        torch.cuda._sleep(int(2e9))
    work = dist.all_reduce(side, async_op=True)
    extra["inflight_dump"] = _dump_fr(torch, folder / "fr", "inflight")
    work.wait()
    if device == "cuda":
        torch.cuda.synchronize()
    time.sleep(2.0)  # the watchdog marks the last entries completed
    extra["final_dump"] = _dump_fr(torch, folder / "fr", "final")


def worker(rank: int, world: int, case: str, out: str, port: int, steps: int, cpu: bool) -> None:
    """One rank: train under the profiler, write its trace and its step times (and, for NCCL, its dumps)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    device = "cpu" if cpu else "cuda"
    backend = "nccl" if case == "nccl-1rank" and not cpu else "gloo"
    folder = Path(out)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if device == "cuda":
        torch.cuda.set_device(0)
    dist.init_process_group(backend, rank=rank, world_size=world,
                            **({"device_id": torch.device("cuda", 0)} if backend == "nccl" else {}))
    torch.manual_seed(1234)
    m = DRY_MODEL if cpu else MODEL
    model = DDP(_model(torch, device, m), bucket_cap_mb=25)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator(device="cpu").manual_seed(rank)
    x = torch.randn(m["batch"], m["seq"], m["d_model"], generator=gen).to(device)
    side = torch.ones(1 << 20, device=device)
    wait, warmup = 2, 2
    walls: list[dict[str, Any]] = []
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if device == "cuda" else [])
    trace = folder / f"rank{rank}.pt.trace.json"
    with torch.profiler.profile(
        activities=acts, record_shapes=True,
        schedule=torch.profiler.schedule(wait=wait, warmup=warmup, active=steps, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(trace)),
    ) as prof:
        for step in range(wait + warmup + steps):
            if device == "cuda":
                torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            if case.endswith("-straggler") and rank == STRAGGLER[0]:
                time.sleep(STRAGGLER[1] / 1e3)
            with torch.autocast(device, dtype=torch.bfloat16):
                loss = model(x).float().pow(2).mean()
            loss.backward()
            if case == "nccl-1rank":
                gathered = torch.empty(world * side.numel(), device=device)
                dist.all_gather_into_tensor(gathered, side)
                shard = torch.empty(side.numel() // world, device=device)
                dist.reduce_scatter_tensor(shard, side)
                dist.broadcast(side, src=0)
            opt.step()
            if device == "cuda":
                torch.cuda.synchronize()
            phase = "wait" if step < wait else "warmup" if step < wait + warmup else "active"
            walls.append({"step": step, "phase": phase, "wall_s": time.perf_counter() - t0})
            prof.step()
    extra: dict[str, Any] = {}
    try:
        if case == "nccl-1rank":
            _flight_recorder(torch, dist, device, side, folder, extra)
    except Exception:
        extra["dump_error"] = traceback.format_exc()

    (folder / f"rank{rank}.steps.json").write_text(json.dumps(
        {"rank": rank, "pid": os.getpid(), "steps": walls, "backend": backend, **extra,
         "machine": _machine(torch, device)}))
    dist.destroy_process_group()
    with open(trace, "rb") as src, gzip.open(str(trace) + ".gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    trace.unlink()


def record(case: str, out: Path, steps: int, cpu: bool) -> dict[str, Any]:
    """Run one case into ``out`` (made fresh) and write its run.json."""
    import torch.multiprocessing as mp

    world = 1 if case == "nccl-1rank" else 4 if case.startswith("gloo-4rank") else 2
    out.mkdir(parents=True)
    env = {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_ENABLE_TIMING": "1"}
    if case == "nccl-1rank":
        env.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,COLL", NCCL_DEBUG_FILE=str(out / "nccl.%h.%p.log"))
    os.environ.update(env)
    env["NCCL_DEBUG_FILE"] = env.get("NCCL_DEBUG_FILE", "").replace(str(out) + os.sep, "") or None  # type: ignore[assignment]
    t0 = time.perf_counter()
    mp.spawn(worker, args=(world, case, str(out), _free_port(), steps, cpu), nprocs=world, join=True)
    job_s = time.perf_counter() - t0
    ranks = [json.loads((out / f"rank{r}.steps.json").read_text()) for r in range(world)]
    for r in range(world):
        (out / f"rank{r}.steps.json").unlink()
    run = {
        "case": case, "world_size": world, "backend": ranks[0]["backend"], "device": "cpu" if cpu else "cuda",
        "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "env": env,
        "machine": ranks[0]["machine"], "model": DRY_MODEL if cpu else MODEL, "ddp": {"bucket_cap_mb": 25},
        "profiler": {"activities": ["CPU"] + ([] if cpu else ["CUDA"]), "record_shapes": True,
                     "schedule": {"wait": 2, "warmup": 2, "active": steps, "repeat": 1},
                     "step_annotation": "ProfilerStep#N, N = step index"},
        "job_wall_s": job_s,
        "step_times": {"note": "perf_counter around zero_grad + forward + backward (+ collectives) + optimizer "
                               "step, after a cuda synchronize and a barrier; ends after a cuda synchronize",
                       "ranks": {str(x["rank"]): {"pid": x["pid"], "steps": x["steps"]} for x in ranks}},
        **{k: v for k, v in ranks[0].items() if k.endswith(("_dump", "_error"))},
        **({"straggler": {"rank": STRAGGLER[0], "sleep_ms": STRAGGLER[1]}} if case.endswith("-straggler") else {}),
        "files": sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()),
    }
    (out / "run.json").write_text(json.dumps(run, indent=1) + "\n")
    return run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder to create (one sub-folder per case)")
    p.add_argument("--case", choices=(*CASES, "all"), default="all")
    p.add_argument("--steps", type=int, default=4, help="profiled steps (after 2 wait + 2 warm-up; default 4)")
    p.add_argument("--cpu", action="store_true", help="dry run on the CPU with gloo (no GPU needed)")
    args = p.parse_args(argv)
    out = Path(args.out)
    if out.exists():
        print(f"record_gpu: {out} exists; choose a new folder", file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".record_gpu-", dir=out.parent))  # renamed into place at the end
    failed = 0
    for case in CASES if args.case == "all" else (args.case,):
        try:
            run = record(case, staging / case, args.steps, args.cpu)
            active = [s["wall_s"] for s in run["step_times"]["ranks"]["0"]["steps"] if s["phase"] == "active"]
            print(f"{case}: {len(run['files'])} files, active steps {[round(w * 1e3, 2) for w in active]} ms",
                  flush=True)
        except Exception:
            failed += 1
            traceback.print_exc()
    staging.rename(out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
