"""Record the Flight Recorder dumps of tests/data/flight_recorder/<case>/ on this machine (README.md there).

Each case is a tiny data-parallel training job of 3 or 4 gloo processes on localhost (torch.multiprocessing), with
``TORCH_FR_BUFFER_SIZE`` set so that PyTorch's Flight Recorder records every collective. Gloo has no watchdog that
dumps on a timeout, so every rank dumps itself: from the exception handler when a collective fails (a process-group
timeout, a peer gone), else from a timer thread at a deadline all ranks share, while the collective hangs. Each rank
writes the pickle form (``torch._C._distributed_c10d._dump_fr_trace()``) to ``$TORCH_FR_DUMP_TEMP_FILE<rank>`` and
the JSON form (``_dump_fr_trace_json()``) beside it in ``json/``, and ``job.json`` says what the case did.

    python tests/data/flight_recorder/record.py CASE [--out DIR]      # CASE: see CASES, or "all"
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import threading
import time

#: case -> (world size, process-group timeout in s or None, what it does); the fault happens at step FAULT_STEP
CASES = {
    "healthy": (3, None, "every rank runs every step; dumps at the end"),
    "hang-skip": (3, None, "rank 1 never calls step 3's collectives (stuck in its data loader); no process-group "
                  "timeout: every rank dumps from a timer while ranks 0 and 2 wait; profiler traces of steps 1-2"),
    "hang-timeout": (3, 5, "rank 1 never calls step 3's collectives; a 5 s process-group timeout: ranks 0 and 2 "
                     "dump in the timeout's exception handler, rank 1 from a timer"),
    "delayed": (3, None, "rank 2 sleeps 2.5 s before step 3's gradient all_reduce, then the job completes"),
    "desync-shape": (3, None, "rank 1 all-reduces its gradients as [16, 17] where the others send [272]: same "
                     "element count, gloo completes it"),
    "desync-dtype": (3, None, "rank 1 all-reduces step 3's loss as int32 where the others send float32: same byte "
                     "count, gloo completes it"),
    "desync-op": (3, 5, "rank 1 calls broadcast where the others call all_reduce at step 3; 5 s timeout"),
    "desync-size": (4, 5, "rank 1 all-reduces 288 gradient elements where the others send 272; gloo aborts the "
                    "process that receives the odd size (no dump from it); 5 s timeout"),
    "no-dump": (3, 5, "rank 2 is killed (SIGKILL, as by the OOM killer) before step 3's collectives: it leaves "
                "no dump; ranks 0 and 1 dump when their peer is gone"),
    "subgroup-stuck": (4, None, "two tensor-parallel groups [0, 1] and [2, 3], then a data-parallel all_reduce in "
                       "the default group each step; rank 1 stops before step 3's group [0, 1] all_reduce: rank 0 "
                       "waits in that group, ranks 2 and 3 in the default group (the knock-on)"),
    "subgroup-skip": (4, None, "as subgroup-stuck, but rank 1 skips step 3's group [0, 1] all_reduce and goes on to "
                      "the default group's: a wait cycle between ranks 0 and 1"),
}
FAULT_STEP = 3
STEPS = 5
#: a rank that waits dumps this long after the last step all ranks finished together
DEADLINE_S = 8.0


def _dump(out: str, rank: int, why: str) -> None:
    """Write this rank's dump in both forms (whole bytes first: a process that dies mid-write leaves no half file)."""
    from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json

    data, text = _dump_fr_trace(), _dump_fr_trace_json()
    prefix = os.environ["TORCH_FR_DUMP_TEMP_FILE"]
    for path, blob in ((f"{prefix}{rank}", data), (os.path.join(out, "json", f"fr_trace_rank_{rank}.json"), text)):
        with open(path + ".tmp", "wb") as fh:
            fh.write(blob)
        os.replace(path + ".tmp", path)
    with open(os.path.join(out, f".done{rank}"), "w") as fh:
        fh.write(why)


def _finish(out: str, rank: int, world: int, why: str, code: int) -> None:
    """Dump, wait (up to 20 s) for the other ranks that will dump, then leave without running gloo's teardown."""
    _dump(out, rank, why)
    end = time.time() + 20
    while time.time() < end and sum(os.path.exists(os.path.join(out, f".done{r}")) for r in range(world)) < \
            world - (1 if CASE in ("no-dump", "desync-size") else 0):
        time.sleep(0.1)
    os._exit(code)


def load_batch(step: int, rank: int, case: str) -> None:
    """The data loader: where a stuck or slow rank spends its time."""
    if step == FAULT_STEP and rank == 1 and case in ("hang-skip", "hang-timeout", "subgroup-stuck"):
        time.sleep(3600)
    if step == FAULT_STEP and rank == 2 and case == "delayed":
        time.sleep(2.5)
    if step == FAULT_STEP and rank == 2 and case == "no-dump":
        os.kill(os.getpid(), signal.SIGKILL)


def train(rank: int, world: int, out: str, case: str) -> None:
    """One rank of the job: broadcast the parameters, then per step forward, backward, (tensor-parallel all_reduce,)
    gradient all_reduce and loss all_reduce; a barrier at the end."""
    import torch
    import torch.distributed as dist

    global CASE
    CASE = case
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["FR_RECORD_PORT"])
    timeout = CASES[case][1]
    kw = {"timeout": datetime.timedelta(seconds=timeout)} if timeout else {}
    dist.init_process_group("gloo", rank=rank, world_size=world, **kw)
    tp = None
    if case.startswith("subgroup"):
        groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        tp = groups[rank // 2]
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 16)
    for p in model.parameters():
        dist.broadcast(p.data, 0)
    profiler = None
    if case == "hang-skip":
        import tracekit.torch

        profiler = tracekit.torch.profile(os.path.join(out, "traces"), wait=0, warmup=1, active=2, rank=rank)
        profiler.__enter__()
    try:
        for step in range(STEPS):
            if step == FAULT_STEP:  # every rank got through the step before together: a shared deadline
                deadline = time.time() + DEADLINE_S
                threading.Thread(target=lambda: (time.sleep(max(0.0, deadline - time.time())),
                                                 _finish(out, rank, world, "timer", 0)), daemon=True).start()
            load_batch(step, rank, case)
            x = torch.randn(8, 16, generator=torch.Generator().manual_seed(step * 10 + rank))
            y = model(x)
            if tp is not None and not (case == "subgroup-skip" and step == FAULT_STEP and rank == 1):
                dist.all_reduce(y.detach().clone(), group=tp)
            loss = y.square().mean()
            model.zero_grad()
            loss.backward()
            flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            bad = step == FAULT_STEP and rank == 1
            if bad and case == "desync-shape":
                dist.all_reduce(flat.reshape(16, 17))
            elif bad and case == "desync-op":
                dist.broadcast(flat, 0)
            elif bad and case == "desync-size":
                dist.all_reduce(torch.cat([flat, flat[:16]]))
            else:
                dist.all_reduce(flat)
            lt = loss.detach().reshape(1)
            dist.all_reduce(lt.to(torch.int32) if bad and case == "desync-dtype" else lt)
            if profiler is not None:
                profiler.step()
            if profiler is not None and step == FAULT_STEP - 1:
                profiler.__exit__(None, None, None)
                profiler = None
        dist.barrier()
    except Exception as exc:  # a collective that failed: the timeout's or a lost peer's exception
        print(f"rank {rank}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}", flush=True)
        _finish(out, rank, world, "exception", 1)
    _finish(out, rank, world, "end", 0)


def record(case: str, out: str) -> None:
    """Run ``case`` into ``out`` (replaced): pickle/, json/, job.json (and traces/ for hang-skip)."""
    import torch.multiprocessing as mp

    world, timeout, what = CASES[case]
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(os.path.join(out, "pickle"))
    os.makedirs(os.path.join(out, "json"))
    os.environ["TORCH_FR_BUFFER_SIZE"] = "64"
    os.environ["TORCH_FR_DUMP_TEMP_FILE"] = os.path.join(out, "pickle", "fr_trace_rank_")
    os.environ["FR_RECORD_PORT"] = str(29400 + sorted(CASES).index(case))
    ctx = mp.spawn(train, args=(world, out, case), nprocs=world, join=False)
    for p in ctx.processes:
        p.join(120)
    for name in os.listdir(out):
        if name.startswith(".done"):
            os.remove(os.path.join(out, name))
    groups = {"0": list(range(world))}
    if case.startswith("subgroup"):
        groups.update({"1": [0, 1], "2": [2, 3]})
    job = {"case": case, "world_size": world, "pg_timeout_s": timeout, "what": what, "fault_step": FAULT_STEP,
           "groups": groups, "torch": __import__("torch").__version__,
           "exit_codes": {str(r): p.exitcode for r, p in enumerate(ctx.processes)}}
    with open(os.path.join(out, "job.json"), "w") as fh:
        json.dump(job, fh, indent=1)
        fh.write("\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", choices=[*CASES, "all"])
    parser.add_argument("--out", help="output directory (default: beside this script, named after the case)")
    args = parser.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    for case in CASES if args.case == "all" else [args.case]:
        out = args.out if args.out and args.case != "all" else os.path.join(args.out or here, case)
        t0 = time.time()
        record(case, out)
        print(f"{case}: {sorted(os.listdir(os.path.join(out, 'pickle')))} in {time.time() - t0:.0f} s", flush=True)


CASE = ""

if __name__ == "__main__":
    main()
