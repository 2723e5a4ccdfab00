"""Deterministic Kineto traces for tests: every writer era of FORMATS.md §1, with known truth.

A trace is described by :class:`Ev` records in integer nanoseconds; :func:`write` renders them the way
a given era's writer would (categories, tid spelling, timestamp form, where ``baseTimeNanoseconds``
goes), so tests can check that parsing gives back exactly the nanoseconds that went in.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EPOCH_NS = 1_716_423_322_000_000_000  # 2024-05-23, an absolute epoch in ns
BASE_NS = 1_711_964_646_000_000_000  # a baseTimeNanoseconds value (floored to a quarter)

ERAS = ("legacy-list", "2021", "1.9", "int-us", "fraction", "relative-after", "relative-before")

_LEGACY_CATS = {"cpu_op": "Operator", "cuda_runtime": "Runtime", "kernel": "Kernel", "gpu_memcpy": "Memcpy",
                "gpu_memset": "Memset", "user_annotation": "User"}


@dataclass
class Ev:
    """One complete event. ``device``/``stream`` make it a device activity; otherwise ``tid`` is the thread."""

    name: str
    cat: str
    start: int  # ns
    dur: int  # ns
    tid: int = 1
    pid: int = 4242
    device: int | None = None
    stream: int | None = None
    args: dict[str, Any] = field(default_factory=dict)


def _us(ns: int, era: str) -> Any:
    """Render ns as the era's µs number (a JSON number, returned as a Python value or raw text)."""
    if era in ("int-us", "2021", "1.9", "legacy-list"):
        return RawNumber(str(ns // 1000))
    whole, frac = divmod(ns, 1000)
    return RawNumber(f"{whole}.{frac:03d}")


class RawNumber(str):
    """A number written verbatim into the JSON text."""


def _encode(obj: Any) -> str:
    if isinstance(obj, RawNumber):
        return str(obj)
    if isinstance(obj, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {_encode(v)}" for k, v in obj.items()) + "}"
    if isinstance(obj, list):
        return "[" + ", ".join(_encode(v) for v in obj) + "]"
    return json.dumps(obj)


def render_event(e: Ev, era: str, base_ns: int) -> dict[str, Any]:
    """The JSON object an era's writer would emit for ``e``."""
    start = e.start - base_ns if era.startswith("relative") else e.start
    dur_ns = e.dur if era not in ("int-us", "2021", "1.9", "legacy-list") else e.dur - e.dur % 1000
    cat = _LEGACY_CATS.get(e.cat, e.cat) if era in ("2021", "1.9") else e.cat
    on_device = e.device is not None
    pid: Any = e.device if on_device else e.pid
    tid: Any = e.stream if on_device else e.tid
    if era == "2021":
        tid = f"stream {tid}" if on_device else str(tid)
    args = dict(e.args)
    if on_device:
        args.setdefault("device", e.device)
        args.setdefault("stream", e.stream)
    if era in ("2021", "1.9") and "External id" in args:
        args["external id"] = args.pop("External id")
    if era == "legacy-list":
        pid = "CUDA functions" if on_device else "CPU functions"
    d: dict[str, Any] = {"ph": "X", "cat": cat, "name": e.name, "pid": pid, "tid": tid,
                         "ts": _us(start, era), "dur": RawNumber(_dur_text(dur_ns, era))}
    if era == "legacy-list":
        d.pop("cat")
    if args:
        d["args"] = args
    return d


def _dur_text(ns: int, era: str) -> str:
    if era in ("int-us", "2021", "1.9", "legacy-list"):
        return str(ns // 1000)
    whole, frac = divmod(ns, 1000)
    return f"{whole}.{frac:03d}"


def write(path: str | Path, events: list[Ev], *, era: str = "relative-before", rank: int | None = 0,
          world_size: int = 2, backend: str = "nccl", gz: bool | None = None, extra_events: list[dict] | None
          = None, finalised: bool = True, pretty: bool = False, base_ns: int = BASE_NS,
          pg_config: list[dict[str, Any]] | None = None) -> Path:
    """Write a Kineto trace of ``events`` as ``era`` writes it (``pg_config``: the process groups of its
    ``distributedInfo``); returns the path."""
    path = Path(path)
    rendered = [render_event(e, era, base_ns) for e in events] + list(extra_events or [])
    if finalised and era != "legacy-list":
        end = max((e.start + e.dur for e in events), default=0)
        rendered.append({"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "",
                         "ts": _us(end - base_ns if era.startswith("relative") else end, era)})
    sep = ",\n  " if not pretty else ",\n"
    body = sep.join(_encode(r) if not pretty else json.dumps(json.loads(_encode(r)), indent=4) for r in rendered)
    if era == "legacy-list":
        text = "[" + body + "]"
    else:
        head: list[str] = ['"schemaVersion": 1']
        if rank is not None:
            info: dict[str, Any] = {"backend": backend, "rank": rank, "world_size": world_size}
            if pg_config is not None:
                info["pg_count"], info["pg_config"] = len(pg_config), pg_config
            head.append('"distributedInfo": ' + json.dumps(info))
        if era == "relative-before":
            head.append(f'"baseTimeNanoseconds": {base_ns}')
        tail: list[str] = []
        if era == "relative-after":
            tail.append(f'"baseTimeNanoseconds": {base_ns}')
        if finalised:
            tail.append('"traceName": "test.json"')
        text = "{\n  " + ",\n  ".join(head) + ',\n  "traceEvents": [\n  ' + body + "\n  ]" + \
            "".join(",\n  " + t for t in tail) + "\n}"
    data = text.encode()
    if gz or (gz is None and path.name.endswith(".gz")):
        data = gzip.compress(data)
    path.write_bytes(data)
    return path


def gpu_iteration(step: int, t0: int, *, nccl_name: str = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
                                                           "(ncclDevComm*, unsigned long, ncclWork*)",
                  nelems: int = 1 << 20, corr0: int = 1000, with_kernel_args: bool = True) -> list[Ev]:
    """One training iteration of a GPU rank with known attribution (times relative to ``t0``, ns).

    CPU: ProfilerStep [0, 10) ms; launches at 1, 2, 7 ms; record_param_comms ⊃ nccl:all_reduce ⊃ the
    NCCL launch at 4 ms. GPU stream 7: compute [2, 6) and [8, 9) ms, memcpy [9, 9.5) ms; stream 13: NCCL
    [5, 8) ms. The window runs from the first device activity (2 ms) to the next iteration's (12 ms):
    compute 4 ms ([2,5) + [8,9)), overlapped 1 ms ([5,6)), exposed 2 ms ([6,8)), memory 0.5 ms, idle
    2.5 ms; the last iteration's window ends at 9.5 ms, without the idle tail.
    """
    ms = 1_000_000
    c = corr0
    kargs = {"Collective name": "allreduce", "In msg nelems": nelems, "Out msg nelems": nelems,
             "Group size": 2, "dtype": "Float", "Process Group Name": "0"} if with_kernel_args else {}
    return [
        Ev(f"ProfilerStep#{step}", "user_annotation", t0, 10 * ms, tid=1),
        Ev("aten::mm", "cpu_op", t0 + 1 * ms, ms // 2, tid=1, args={"External id": c}),
        Ev("cudaLaunchKernel", "cuda_runtime", t0 + 1 * ms + 100, 5000, tid=1,
           args={"correlation": c, "External id": c}),
        Ev("aten::add", "cpu_op", t0 + 2 * ms, ms // 2, tid=1, args={"External id": c + 1}),
        Ev("cudaLaunchKernel", "cuda_runtime", t0 + 2 * ms + 100, 5000, tid=1,
           args={"correlation": c + 1, "External id": c + 1}),
        Ev("record_param_comms", "cpu_op", t0 + 4 * ms, 300_000, tid=1,
           args={"External id": c + 2, "Collective name": "allreduce", "In msg nelems": nelems,
                 "Out msg nelems": nelems, "Group size": 2, "dtype": "Float", "Process Group Name": "0"}),
        Ev("nccl:all_reduce", "user_annotation", t0 + 4 * ms + 10_000, 200_000, tid=1,
           args={"Input Dims": [[nelems]], "Input type": ["float"]}),
        Ev("cudaLaunchKernelExC", "cuda_runtime", t0 + 4 * ms + 50_000, 5000, tid=1,
           args={"correlation": c + 2, "External id": c + 2}),
        Ev("cudaMemcpyAsync", "cuda_runtime", t0 + 7 * ms, 5000, tid=1, args={"correlation": c + 3}),
        Ev("sgemm_kernel", "kernel", t0 + 2 * ms, 4 * ms, device=0, stream=7, args={"correlation": c}),
        Ev(nccl_name, "kernel", t0 + 5 * ms, 3 * ms, device=0, stream=13,
           args={"correlation": c + 2, **kargs}),
        Ev("add_kernel", "kernel", t0 + 8 * ms, 1 * ms, device=0, stream=7, args={"correlation": c + 1}),
        Ev("Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", t0 + 9 * ms, ms // 2, device=0, stream=7,
           args={"correlation": c + 3, "bytes": 4096}),
    ]


def gpu_job(steps: int = 3, t0: int = EPOCH_NS, **kw: Any) -> list[Ev]:
    """``steps`` iterations of :func:`gpu_iteration`, 10 ms apart."""
    out: list[Ev] = []
    for i in range(steps):
        out += gpu_iteration(i + 1, t0 + i * 10_000_000, corr0=1000 + 10 * i, **kw)
    return out


def gloo_job(ranks: int = 4, steps: int = 2, *, loader_ns: dict[int, int] | None = None, compute_ns: int = 10_000_000,
             transfer_ns: int = 4_000_000, nelems: int = 1_000_000, t0: int = EPOCH_NS) -> dict[int, list[Ev]]:
    """A CPU-only DDP-style job with one all-reduce per step, whose truth is known by construction.

    Per rank and step: ``ProfilerStep#k``; a data-loader op (``loader_ns[rank]``, default 1 ms); forward
    and backward ops (``compute_ns`` each); ``c10d::allreduce_`` enqueues the bucket at the end of backward;
    the ``gloo:all_reduce`` work on thread 2 starts then (the rank's arrival) and ends ``transfer_ns`` after
    the LAST rank arrived; the optimizer op starts 50 µs after the work ends. Steps start together on
    all ranks (they all leave the previous all-reduce at the same time).
    """
    loader_ns = loader_ns or {}
    out: dict[int, list[Ev]] = {r: [] for r in range(ranks)}
    t = t0
    for step in range(steps):
        arrive = {r: t + loader_ns.get(r, 1_000_000) + 2 * compute_ns + 100_000 for r in range(ranks)}
        done = max(arrive.values()) + transfer_ns
        opt = 2_000_000
        end = done + 50_000 + opt
        for r in range(ranks):
            ld = loader_ns.get(r, 1_000_000)
            ev = out[r]
            ev.append(Ev(f"ProfilerStep#{step}", "user_annotation", t, end - t, tid=1, pid=100 + r))
            ev.append(Ev("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", "cpu_op", t, ld, tid=1,
                         pid=100 + r))
            ev.append(Ev("aten::linear", "cpu_op", t + ld, compute_ns, tid=1, pid=100 + r))
            ev.append(Ev("autograd::engine::evaluate_function: AddmmBackward0", "cpu_op", t + ld + compute_ns,
                         compute_ns, tid=1, pid=100 + r))
            ev.append(Ev("c10d::allreduce_", "cpu_op", t + ld + 2 * compute_ns, 100_000, tid=1, pid=100 + r,
                         args={"Input Dims": [[[nelems]]], "Input type": ["TensorList"]}))
            ev.append(Ev("gloo:all_reduce", "user_annotation", arrive[r], done - arrive[r], tid=2, pid=100 + r,
                         args={"Input Dims": [[nelems]], "Input type": ["float"]}))
            ev.append(Ev("Optimizer.step#SGD.step", "cpu_op", done + 50_000, opt, tid=1, pid=100 + r))
        t = end + 10_000
    return out


# --- multi-rank jobs with known clocks, arrivals and ends -------------------------------------------

MS = 1_000_000
BIG = 1 << 20  # elements of the big all-reduce (4 MiB of float)
SMALL = 1 << 16  # elements of the small all-reduce (256 KiB)


def _jitter(rank: int, k: int, amplitude: int) -> int:
    """Deterministic pseudo-random offset in [-amplitude, amplitude] ns."""
    if amplitude == 0:
        return 0
    return ((rank * 7919 + k * 104729) % (2 * amplitude + 1)) - amplitude


def gpu_rank_events(rank: int, steps: int, *, shift: int = 0, late: int = 0, end_jitter: int = 0,
                    t0: int = EPOCH_NS, sizes: dict[int, int] | None = None, seq: bool = False,
                    skip_calls: tuple[int, ...] = (), world: int = 2) -> list[Ev]:
    """One GPU rank of a data-parallel job whose truth is known (times relative to each 10 ms step, ns).

    Per step k: compute [2, 5 + late) ms on stream 7, the big all-reduce on stream 13 from 5 ms + late to
    8 ms (the same true end on every rank), the small all-reduce [8.5, 9) ms, compute [9, 9.5) ms.
    ``shift`` is added to every timestamp (this rank's clock runs ``shift`` ns ahead of true time);
    ``end_jitter`` moves each collective's end by a deterministic amount in ±end_jitter ns; ``sizes``
    overrides the big call's element count per call index; ``seq`` writes ``Seq`` args (Kineto 2026);
    ``skip_calls`` drops collectives by call index (a sampled or cut trace).
    """
    evs: list[Ev] = []
    call = 0
    for k in range(steps):
        base = t0 + k * 10 * MS + shift
        c = 1000 + 20 * k
        evs.append(Ev(f"ProfilerStep#{k + 1}", "user_annotation", base, 10 * MS, tid=1))
        plan = [  # (name, start, end, nelems)
            ("big", 5 * MS + late, 8 * MS, (sizes or {}).get(call, BIG)),
            ("small", 8 * MS + MS // 2, 9 * MS, SMALL),
        ]
        evs += [
            Ev("aten::mm", "cpu_op", base + MS, 1000, tid=1, args={"External id": c}),
            Ev("cudaLaunchKernel", "cuda_runtime", base + MS + 100, 1000, tid=1, args={"correlation": c}),
            Ev("sgemm_kernel", "kernel", base + 2 * MS, 3 * MS + late, device=rank, stream=7,
               args={"correlation": c}),
            Ev("cudaLaunchKernel", "cuda_runtime", base + MS + 300, 1000, tid=1, args={"correlation": c + 1}),
            Ev("add_kernel", "kernel", base + 9 * MS, MS // 2, device=rank, stream=7, args={"correlation": c + 1}),
        ]
        for j, (_, s, e, n) in enumerate(plan):
            idx = call
            call += 1
            if idx in skip_calls:
                continue
            corr = c + 2 + j
            e += _jitter(rank, idx, end_jitter)
            args: dict[str, Any] = {"correlation": corr, "Collective name": "allreduce", "In msg nelems": n,
                                    "Out msg nelems": n, "Group size": world, "dtype": "Float",
                                    "Process Group Name": "0"}
            if seq:
                args["Seq"] = idx
            evs.append(Ev("cudaLaunchKernel", "cuda_runtime", base + MS + 500 + 100 * j, 1000, tid=1,
                          args={"correlation": corr}))
            evs.append(Ev("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
                          "kernel", base + s, e - s, device=rank, stream=13, args=args))
    return evs


def write_gpu_job(directory: Path, shifts: list[int], *, steps: int = 3, straggler: int | None = None,
                  late: int = 0, end_jitter: int = 0, sizes: dict[int, dict[int, int]] | None = None,
                  skip: dict[int, tuple[int, ...]] | None = None, seq: bool = False) -> Path:
    """Write one trace per rank of :func:`gpu_rank_events` into ``directory`` (``rank{r}.json``); ``sizes``
    and ``skip`` are per rank."""
    directory.mkdir(parents=True, exist_ok=True)
    n = len(shifts)
    for r, shift in enumerate(shifts):
        evs = gpu_rank_events(r, steps, shift=shift, late=late if r == straggler else 0, end_jitter=end_jitter,
                              sizes=(sizes or {}).get(r), skip_calls=(skip or {}).get(r, ()), seq=seq, world=n)
        write(directory / f"rank{r}.json", evs, rank=r, world_size=n)
    return directory


def gloo_rank_events(rank: int, steps: int, threads: list[str], *, elems: int = 262144,
                     t0: int = EPOCH_NS) -> list[Ev]:
    """A CPU-only gloo rank: per 40 ms step, compute [0, 10) ms on the main thread, then four equal-size
    bucket all-reduces on two worker threads (tid 11 = "A", 12 = "B", in the order ``threads`` gives for
    this rank). Bucket b starts at (10 + 5b) ms + 0.3 ms × rank and ends at (20 + 5b) ms on every rank."""
    tid = {"A": 11, "B": 12}
    evs: list[Ev] = []
    for k in range(steps):
        base = t0 + k * 40 * MS
        evs.append(Ev(f"ProfilerStep#{k + 1}", "user_annotation", base, 40 * MS, tid=10))
        evs.append(Ev("aten::mm", "cpu_op", base, 10 * MS, tid=10))
        for b in range(4):
            s = base + (10 + 5 * b) * MS + 300_000 * rank
            e = base + (20 + 5 * b) * MS
            evs.append(Ev("gloo:all_reduce", "user_annotation", s, e - s, tid=tid[threads[(4 * k + b) % len(threads)]],
                          args={"Input Dims": [[elems]], "Input type": ["float"]}))
    return evs


def resnet50_v100_job(rank: int, *, steps: int = 3, rate_bps: float = 100e9, buckets_mb: float = 25.0,
                      grad_bytes: int = 102_000_000, backward_ns: int = 64_800_000,
                      iteration_ns: int = 128_100_000, t0: int = EPOCH_NS) -> list[Ev]:
    """Zhang et al.'s ResNet-50 on a V100, as a 2-rank PyTorch/NCCL trace: forward, then backward that
    makes gradient buckets ready in turn, each all-reduced on the NCCL stream (FIFO) at ``rate_bps``
    (full utilisation, 2 ranks: bus bytes = S), the next forward waiting for the last all-reduce."""
    nccl = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
    forward = iteration_ns - backward_ns
    sizes = []
    left = grad_bytes
    while left > 0:
        sizes.append(min(int(buckets_mb * 1e6), left))
        left -= sizes[-1]
    ev: list[Ev] = []
    t = t0
    corr = 1
    ready_gpu = t  # when the compute stream is free
    comm_free = t
    for step in range(steps):
        ev.append(Ev(f"ProfilerStep#{step}", "user_annotation", t, 1_000, tid=1))
        # CPU launches run ahead of the GPU
        k_start = max(ready_gpu, comm_free)  # the forward waits for the previous step's last all-reduce
        ev.append(Ev("cudaLaunchKernel", "cuda_runtime", t + 10_000, 5_000, tid=1, args={"correlation": corr}))
        ev.append(Ev("forward", "kernel", k_start, forward, device=0, stream=7, args={"correlation": corr}))
        corr += 1
        g = k_start + forward
        for i, size in enumerate(sizes):
            chunk = backward_ns * size // grad_bytes
            ev.append(Ev("cudaLaunchKernel", "cuda_runtime", t + 20_000 + 2 * i * 1000, 2_000, tid=1,
                         args={"correlation": corr}))
            ev.append(Ev(f"backward{i}", "kernel", g, chunk, device=0, stream=7, args={"correlation": corr}))
            corr += 1
            g += chunk
            n = size // 4
            dur = int(size * 8 / rate_bps * 1e9)
            c_start = max(g, comm_free)
            ev.append(Ev("record_param_comms", "cpu_op", t + 21_000 + 2 * i * 1000, 500, tid=1, args={
                "Collective name": "allreduce", "In msg nelems": n, "Out msg nelems": n, "Group size": 2,
                "dtype": "Float", "Process Group Name": "0"}))
            ev.append(Ev("cudaLaunchKernel", "cuda_runtime", t + 21_100 + 2 * i * 1000, 300, tid=1,
                         args={"correlation": corr}))
            ev.append(Ev(nccl, "kernel", c_start, dur, device=0, stream=13, args={
                "correlation": corr, "Collective name": "allreduce", "In msg nelems": n, "Out msg nelems": n,
                "Group size": 2, "dtype": "Float", "Process Group Name": "0"}))
            corr += 1
            comm_free = c_start + dur
        ready_gpu = g
        nxt = max(g, comm_free) - 2_000_000  # the CPU starts the next step a little before the GPU is free
        step_ev = next(e for e in ev if e.name == f"ProfilerStep#{step}")
        step_ev.dur = nxt - t
        t = nxt
    return ev
