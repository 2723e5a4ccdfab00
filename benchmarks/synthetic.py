"""Realistic synthetic Kineto GPU traces of any size, written the way PyTorch 2.4+ writes them.

Each training step is a mix like a real transformer step: CPU operators with shapes, runtime launches,
kernels with their full argument sets, ``ac2g`` flows, memcpys, and bucketed NCCL all-reduces with
``record_param_comms`` metadata, on relative fractional-µs timestamps with ``baseTimeNanoseconds``.
"""

from __future__ import annotations

import gzip
import os
import random
from pathlib import Path

BASE_NS = 1_711_964_646_000_000_000

_CPU = ('  {{\n    "ph": "X", "cat": "cpu_op", "name": "{name}", "pid": {pid}, "tid": {tid},\n'
        '    "ts": {ts}, "dur": {dur},\n    "args": {{\n      "External id": {ext},"Record function id": 0, '
        '"Concrete Inputs": ["", ""], "Input type": ["c10::BFloat16", "c10::BFloat16"], "Input Strides": '
        '[[4096, 1], [4096, 1]], "Input Dims": [[8, 4096], [4096, 4096]], "Ev Idx": {ext}\n    }}\n  }}')
_LAUNCH = ('  {{\n    "ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": {pid}, "tid": {tid},\n'
           '    "ts": {ts}, "dur": {dur},\n    "args": {{\n      "External id": {ext}, "cbid": 211, '
           '"correlation": {corr}\n    }}\n  }}')
_KERNEL = ('  {{\n    "ph": "X", "cat": "kernel", "name": "{name}", "pid": 0, "tid": {stream},\n'
           '    "ts": {ts}, "dur": {dur},\n    "args": {{\n      "External id": {ext}, "queued": 0, "device": 0, '
           '"context": 1, "stream": {stream}, "correlation": {corr}, "registers per thread": 128, '
           '"shared memory": 98304, "blocks per SM": 1.5, "warps per SM": 12, "grid": [132, 1, 1], '
           '"block": [256, 1, 1], "est. achieved occupancy %": 19{extra}\n    }}\n  }}')
_FLOW = ('  {{\n    "ph": "{ph}", "id": {corr}, "pid": {pid}, "tid": {tid}, "ts": {ts},\n'
         '    "cat": "ac2g", "name": "ac2g"{bp}\n  }}')
_RPC = ('  {{\n    "ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": {pid}, "tid": {tid},\n'
        '    "ts": {ts}, "dur": {dur},\n    "args": {{\n      "External id": {ext},"Record function id": 0, '
        '"Collective name": "allreduce", "dtype": "BFloat16", "In msg nelems": {n}, "Out msg nelems": {n}, '
        '"Group size": {world}, "Process Group Name": "0", "Process Group Description": "default_pg", '
        '"Process Group Ranks": "[0, 1, 2, 3, 4, 5, 6, 7]", "Rank": {rank}, "Ev Idx": {ext}\n    }}\n  }}')
_STEP = ('  {{\n    "ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{step}", "pid": {pid}, "tid": {tid},\n'
         '    "ts": {ts}, "dur": {dur},\n    "args": {{\n      "External id": {ext},"Record function id": 0, '
         '"Ev Idx": {ext}\n    }}\n  }}')
_KERNELS = ["void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>"
            "(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8::Params)",
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
            "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, "
            "at::detail::Array<char*, 3>)",
            "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>"
            "(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, "
            "c10::BFloat16*)",
            "flash_fwd_kernel"]
_OPS = ["aten::linear", "aten::add", "aten::layer_norm", "aten::_flash_attention_forward", "aten::mm",
        "aten::gelu"]
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def _us(ns: int) -> str:
    whole, frac = divmod(ns - BASE_NS, 1000)
    return f"{whole}.{frac:03d}"


def write_trace(path: str | os.PathLike, target_mb: float, *, rank: int | None = 0, world: int = 8, seed: int = 0,
                gz: bool = False, ops_per_step: int = 2000) -> int:
    """Write a trace of about ``target_mb`` MB of JSON text; returns the number of events.

    ``rank=None`` leaves ``rank`` out of ``distributedInfo`` (the reader then takes it from the file name,
    so one trace can be hard-linked as ``rank-0.json``, ``rank-1.json``, ... for many-rank benchmarks)."""
    rng = random.Random(seed)
    info_rank = "" if rank is None else f'"rank": {rank}, '
    rank = rank or 0
    pid, tid, comm_tid = 40917 + rank, 41102 + rank, 41200 + rank
    t = BASE_NS + 4_458_676_416_788_066 % 10**12 + rank * 1357
    ext = corr = 1
    n_events = 0
    target = int(target_mb * 1e6)
    written = 0
    opener = gzip.open if gz else open
    with opener(path, "wt") as f:
        head = ('{\n  "schemaVersion": 1,\n  "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],\n'
                f'  "distributedInfo": {{"backend": "nccl", {info_rank}"world_size": {world}, '
                '"nccl_version": "2.21.5"},\n  "displayTimeUnit": "ms",\n'
                f'  "baseTimeNanoseconds": {BASE_NS},\n  "traceEvents": [\n')
        f.write(head)
        written += len(head)
        step = 0
        first = True
        while written < target:
            chunk: list[str] = []
            step_start = t
            gpu_t = t + 40_000
            chunk.append(_STEP.format(step=step, pid=pid, tid=tid, ts=_us(t), dur="0.000", ext=ext))
            ext += 1
            for i in range(ops_per_step):
                dur = rng.randint(8_000, 40_000)
                name = _OPS[i % len(_OPS)]
                chunk.append(_CPU.format(name=name, pid=pid, tid=tid, ts=_us(t), dur=_us(BASE_NS + dur), ext=ext))
                lt = t + rng.randint(1_000, 5_000)
                chunk.append(_LAUNCH.format(pid=pid, tid=tid, ts=_us(lt), dur=_us(BASE_NS + 4_123), ext=ext, corr=corr))
                chunk.append(_FLOW.format(ph="s", corr=corr, pid=pid, tid=tid, ts=_us(lt), bp=""))
                kdur = rng.randint(4_000, 30_000)
                gpu_t = max(gpu_t, lt + 3_000)
                chunk.append(_KERNEL.format(name=_KERNELS[i % len(_KERNELS)], stream=7, ts=_us(gpu_t),
                                            dur=_us(BASE_NS + kdur), ext=ext, corr=corr, extra=""))
                chunk.append(_FLOW.format(ph="f", corr=corr, pid=0, tid=7, ts=_us(gpu_t), bp=', "bp": "e"'))
                gpu_t += kdur + rng.randint(500, 3_000)
                ext += 1
                corr += 1
                t += dur + rng.randint(500, 2_000)
                if i % 200 == 199:  # a gradient bucket is ready: all-reduce it on the NCCL stream
                    n = rng.choice([6_553_600, 13_107_200, 26_214_400])
                    chunk.append(_RPC.format(pid=pid, tid=comm_tid, ts=_us(t), dur=_us(BASE_NS + 30_000), ext=ext,
                                             n=n, world=world, rank=rank))
                    chunk.append(_LAUNCH.format(pid=pid, tid=comm_tid, ts=_us(t + 5_000), dur=_us(BASE_NS + 6_000),
                                                ext=ext, corr=corr))
                    kargs = (f', "Collective name": "allreduce", "In msg nelems": {n}, "Out msg nelems": {n}, '
                             f'"Group size": {world}, "dtype": "BFloat16", "Process Group Name": "0"')
                    chunk.append(_KERNEL.format(name=NCCL, stream=63, ts=_us(gpu_t - 20_000),
                                                dur=_us(BASE_NS + n // 20), ext=ext, corr=corr, extra=kargs))
                    ext += 1
                    corr += 1
            chunk[0] = chunk[0].replace('"dur": 0.000', f'"dur": {_us(BASE_NS + t - step_start)}')
            n_events += len(chunk)
            text = (",\n" if not first else "") + ",\n".join(chunk)
            first = False
            f.write(text)
            written += len(text)
            step += 1
            t += 200_000
        tail = '\n  ],\n  "traceName": "/tmp/libkineto_activities_40917.json"\n}\n'
        f.write(tail)
    return n_events


if __name__ == "__main__":
    import sys

    out = Path(sys.argv[1])
    print(write_trace(out, float(sys.argv[2]) if len(sys.argv) > 2 else 50))
