"""Consistent multi-rank GPU training jobs of known truth, written as PyTorch 2.x profiler traces.

A job is simulated, then written: every rank runs the same steps (data loader, host-to-device copy, forward on the
main thread, backward on the autograd engine's thread or on the main thread, DDP bucket all-reduces or FSDP
all-gathers and reduce-scatters on NCCL streams, optimizer, ``.item()`` at the step's end), and every collective
ends on all members together, when the last member arrived plus the transfer its bus bytes take on the link
(``latency + bus bytes / (efficiency · line rate)``; intra-node or inter-node by the members' hosts), one transfer
at a time on the group's link (an all-gather and a reduce-scatter in flight together queue on it). The
dependencies are PyTorch's own: a kernel starts after its launch and the previous kernel of its stream; an NCCL
kernel after the work its stream was made to wait for (the last kernel launched on the compute stream before it,
as ProcessGroupNCCL's stream wait does); a compute kernel that waits on communication (FSDP's unsharded
parameters, DDP's finalize before the optimizer) after it; the step's ``.item()`` blocks the main thread until the
device is done; the autograd thread starts after the forward and the main thread resumes after it.

Because the generator knows what it simulated, a job carries its truth (:class:`Truth`): iteration time, who
straggles, which link binds, and — by simulating the same job again with one thing changed (free communication,
another line rate, a straggler removed) — what tracekit's what-if should predict.

Meshes (``tp``, ``pp`` > 1): the ranks form a DP × TP × PP mesh (Megatron's order: tensor-parallel ranks next to each
other inside a host, then data-parallel, then pipeline stages), each process group with its own ``pg_config`` entry
(descriptions ``tp``, ``dp``, ``pp``) and its own link: tensor-parallel all-reduces after every layer's kernel, forward
and backward, on the intra-node link; activations and gradients between pipeline stages as NCCL send/recv (GPipe:
``microbatches`` forward passes, then as many backward passes); data-parallel gradient all-reduces in buckets after
the last backward, across hosts. Every group's link carries one transfer at a time, and a transfer takes
``latency + bus bytes / (efficiency · line rate)`` on its group's link class (``intra`` when every member is on one
host, else ``inter``); ``free_links`` makes one class free (what that link costs: :attr:`Truth.link_cost_ns`).

Ranks are simulated together, vectorised over ranks, to find each collective's end (pass 1, cheap even for
thousands of ranks); each rank's file is then written alone from those ends (pass 2), so a job of any size is
written one rank at a time and in parallel (``python benchmarks/jobgen.py OUT --ranks 256 --size-mb 100``: about
100 MB per rank, padded with nested operators; see ``--help`` for meshes).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

#: baseTimeNanoseconds of every generated trace (timestamps are relative fractional µs after it, as 2.x writes)
BASE_NS = 1_730_000_000_000_000_000
#: the profiler's main-thread pid of rank r is PID0 + r; its autograd engine thread is that + AUTOGRAD_TID
PID0 = 40_000
AUTOGRAD_TID = 1_523
COMPUTE_STREAM, COMM_STREAM, RS_STREAM, TP_STREAM, PP_STREAM = 7, 20, 24, 28, 32
US = 1_000
MS = 1_000_000
#: between the launches of a layer's kernels when it has several (``JobSpec.kernels``)
KERNEL_GAP = 6 * US

#: NCCL kernel names by era (FORMATS.md §2, kernel names): {func}, {op} and {ty} are filled in
KERNEL_ERAS = {
    "2.7": "nccl{func}RingLLKernel_{op}_{ty}(ncclColl)",
    "2.10": "ncclKernel_{func}_RING_LL_{Op}_{cty}(ncclWorkElem)",
    "2.18": "ncclKernel_{func}_RING_LL_{Op}_{cty}(ncclDevComm*, unsigned long, ncclWork*)",
    "2.21": "ncclDevKernel_{func}{opty}_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
}
_FUNC = {"allreduce": "AllReduce", "allgather": "AllGather", "reduce_scatter": "ReduceScatter", "send": "SendRecv",
         "recv": "SendRecv"}
_ANNOT = {"allreduce": "nccl:all_reduce", "allgather": "nccl:_all_gather_base",
          "reduce_scatter": "nccl:_reduce_scatter_base", "send": "nccl:send", "recv": "nccl:recv"}
#: point-to-point kernels by era (FORMATS.md §2)
SENDRECV_ERAS = {"2.7": "ncclSendRecvKernel_copy_i8(ncclColl)",
                 "2.10": "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)",
                 "2.18": "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
                 "2.21": "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)"}


@dataclass(frozen=True)
class JobSpec:
    """One job. Times are ns, rates bit/s, sizes bytes. ``stragglers`` maps a rank to how much slower its kernels
    run (1.3 = 30 % slower); ``stalls`` a host to extra data-loading time per step; ``host_offsets_ns`` (or, if
    empty, ``clock_skew_ns``) sets how far each host's clock is from the job clock."""

    ranks: int = 16
    gpus_per_host: int = 8
    steps: int = 6
    parallel: str = "ddp"  # "ddp" or "fsdp"
    layers: int = 24
    fwd_ns: int = 1_200_000  # mean forward kernel per layer; backward is twice that
    param_bytes: int = 4 << 20  # per layer (bf16)
    bucket_bytes: int = 25 << 20  # DDP's bucket_cap_mb
    inter_bps: float = 10e9
    intra_bps: float = 2.4e12
    efficiency: float = 0.95
    latency_ns: int = 20_000
    autograd_thread: bool = True
    stragglers: tuple[tuple[int, float], ...] = ()
    stalls: tuple[tuple[int, int], ...] = ()
    loader_ns: int = 400_000
    cpu_op_ns: int = 30_000  # a forward operator on the CPU (launch included)
    jitter: float = 0.01
    clock_skew_ns: int = 2_000_000
    host_offsets_ns: tuple[int, ...] = ()
    era: str = "2.21"
    pad: int = 0  # nested calls inside each operator (trace size without changing the schedule)
    comm_free: bool = False  # every transfer takes no time (the reference for the scaling factor)
    seed: int = 0
    tp: int = 1  # tensor-parallel group size (inside a host)
    pp: int = 1  # pipeline stages
    microbatches: int = 1  # per step, through the pipeline (GPipe)
    act_bytes: int = 8 << 20  # activations of one microbatch (tensor-parallel all-reduces, pipeline sends)
    free_links: tuple[str, ...] = ()  # link classes ("intra", "inter") whose transfers take no time
    #: each layer's forward and backward kernel split into this many back-to-back kernels (same total time), each
    #: launched by its operator: short kernels start on their stream as the previous one ends, whatever else ended
    kernels: int = 1
    wait_calls: bool = True  # the trace records the cudaStreamWaitEvent calls (a trace without them says less)
    #: each rank's layer kernels of a step run up to this much slower or faster together (a per-rank, per-step factor:
    #: a slow step of one rank, which then arrives last at its collectives)
    step_jitter: float = 0.0
    #: layer kernels run this many times slower while a transfer of their rank is in flight (1: no contention;
    #: plain DDP and FSDP jobs, not meshes)
    contention: float = 1.0
    #: ranks that enter the first traced step this late (ns): what delayed them happened before the trace began
    late: tuple[tuple[int, int], ...] = ()

    @property
    def hosts(self) -> int:
        return math.ceil(self.ranks / self.gpus_per_host)

    def host_of(self, rank: int) -> int:
        return rank // self.gpus_per_host

    @property
    def mesh(self) -> bool:
        return self.tp > 1 or self.pp > 1

    @property
    def dp(self) -> int:
        return self.ranks // (self.tp * self.pp)

    def coords(self, rank: Any) -> tuple[Any, Any, Any]:
        """``(stage, dp index, tp index)`` of a rank (or an array of ranks)."""
        return rank // (self.dp * self.tp), (rank // self.tp) % self.dp, rank % self.tp

    def groups(self) -> list[dict[str, Any]]:
        """Every process group of the job: ``pg_name``, ``pg_desc``, ``ranks`` (the default group first)."""
        out = [{"pg_name": "0", "pg_desc": "default_pg", "ranks": list(range(self.ranks))}]
        if not self.mesh:
            return out
        r = np.arange(self.ranks)
        stage, dpi, tpi = self.coords(r)
        n = 1
        for desc, key in (("tp", stage * self.dp + dpi), ("dp", stage * self.tp + tpi), ("pp", dpi * self.tp + tpi)):
            size = {"tp": self.tp, "dp": self.dp, "pp": self.pp}[desc]
            if size < 2:
                continue
            for k in range(int(key.max()) + 1):
                out.append({"pg_name": str(n), "pg_desc": desc, "ranks": r[key == k].tolist()})
                n += 1
        return out

    def check(self) -> None:
        if self.ranks % (self.tp * self.pp):
            raise ValueError(f"{self.ranks} ranks do not split into tp={self.tp} x pp={self.pp}")
        if self.tp > 1 and self.gpus_per_host % self.tp:
            raise ValueError("tensor-parallel groups must fit in a host (gpus_per_host a multiple of tp)")
        if self.layers % self.pp:
            raise ValueError(f"{self.layers} layers do not split into {self.pp} stages")

    def host_offset(self, host: int) -> int:
        """How far this host's clock reads ahead of the job clock."""
        if self.host_offsets_ns:
            return self.host_offsets_ns[host % len(self.host_offsets_ns)]
        if host == 0 or not self.clock_skew_ns:
            return 0
        return round(float(_unit(self.seed, host, 0, 999)) * self.clock_skew_ns)


@dataclass
class Truth:
    """What the generator knows about the job it wrote (job clock, ns)."""

    spec: dict[str, Any]
    iteration_ns: int  # median time between consecutive iteration starts (tracekit's definition)
    step_starts: list[list[int]]  # per rank, per step: its first device activity (the window start)
    collectives: int  # per rank
    straggler_ranks: list[int] = field(default_factory=list)
    stalled_hosts: list[int] = field(default_factory=list)
    link: str = "inter"  # the link class the DP collectives ran on
    #: per link class, how much shorter an iteration is when its transfers take no time (mesh jobs)
    link_cost_ns: dict[str, int] = field(default_factory=dict)
    #: the link class whose transfers cost the most (mesh jobs; else ``link``)
    binding_link: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)


# --- deterministic noise: a counter-based hash, so any subset of ranks draws the same numbers ---------------------


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays."""
    x = x.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


def _unit(seed: int, a: Any, b: Any, c: Any) -> Any:
    """A number in [-1, 1) for each (seed, a, b, c): the same for a rank whichever ranks are simulated with it."""
    with np.errstate(over="ignore"):
        key = (np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15) + np.asarray(a, dtype=np.uint64) * np.uint64(1_000_003)
               + np.asarray(b, dtype=np.uint64) * np.uint64(7_919) + np.asarray(c, dtype=np.uint64))
    u = (_mix(np.asarray(key)) >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    return 2.0 * u - 1.0


# --- the schedule ------------------------------------------------------------------------------------------------


def buckets(spec: JobSpec) -> list[list[int]]:
    """DDP's buckets: layers in backward order, filled up to ``bucket_bytes`` (the last layer's bucket first)."""
    out: list[list[int]] = [[]]
    size = 0
    for layer in reversed(range(spec.layers)):
        if size and size + spec.param_bytes > spec.bucket_bytes:
            out.append([])
            size = 0
        out[-1].append(layer)
        size += spec.param_bytes
    return out


def _bus_bytes(op: str, nbytes: int, n: int) -> float:
    return (2 * (n - 1) / n if op == "allreduce" else (n - 1) / n) * nbytes if n > 1 else 0.0


def transfer_ns(spec: JobSpec, op: str, nbytes: int, n: int | None = None, link: str | None = None) -> int:
    """How long a collective moves its data once every member has arrived: of the DP group (every rank) unless the
    group size ``n`` and link class ``link`` say otherwise."""
    link = link or ("inter" if spec.hosts > 1 else "intra")
    if spec.comm_free or link in spec.free_links:
        return 0
    rate = spec.inter_bps if link == "inter" else spec.intra_bps
    bus = float(nbytes) if op in ("send", "recv") else _bus_bytes(op, nbytes, n or spec.ranks)
    return round(spec.latency_ns + bus * 8e9 / (spec.efficiency * rate))


class _Writer:
    """Collects one rank's events as JSON text (or nothing, when only the schedule is wanted)."""

    def __init__(self, spec: JobSpec, rank: int, out: Callable[[str], None] | None):
        self.spec, self.rank, self.out = spec, rank, out
        self.pid = PID0 + rank
        self.device = rank % spec.gpus_per_host
        self.offset = spec.host_offset(spec.host_of(rank))
        self.corr = 1
        self.ext = 1
        self.seq = 0
        self.seqs: dict[str, int] = {}  # per process group (meshes)
        self.buf: list[str] = []

    def _ts(self, ns: int) -> str:
        whole, frac = divmod(int(ns) + self.offset - BASE_NS, 1000)
        return f"{whole}.{frac:03d}"

    @staticmethod
    def _dur(ns: int) -> str:
        whole, frac = divmod(int(ns), 1000)
        return f"{whole}.{frac:03d}"

    def _x(self, cat: str, name: str, pid: int, tid: int, start: int, dur: int, args: str) -> None:
        self.buf.append(f'{{"ph":"X","cat":"{cat}","name":"{name}","pid":{pid},"tid":{tid},'
                        f'"ts":{self._ts(start)},"dur":{self._dur(dur)},"args":{{{args}}}}}')

    def cpu(self, name: str, start: int, dur: int, tid: int | None = None, extra: str = "", cat: str = "cpu_op"
            ) -> int:
        """A CPU operator (and ``pad`` nested calls inside it); returns its External id."""
        if self.out is None:
            return 0
        ext = self.ext
        self.ext += 1
        self._x(cat, name, self.pid, tid or self.pid, start, dur, f'"External id":{ext}{extra}')
        if self.spec.pad and dur > 4 * US and cat == "cpu_op":
            # the nested calls written in one go (most of a padded trace's bytes): the same text _x writes
            pad = self.spec.pad
            step = max((dur - 2 * US) // (pad + 1), 1)
            head = f'{{"ph":"X","cat":"cpu_op","name":"aten::view","pid":{self.pid},"tid":{tid or self.pid},"ts":'
            tail = f',"dur":{self._dur(max(step // 2, 1))},"args":{{"External id":'
            t0 = int(start) + US + self.offset - BASE_NS
            e0 = self.ext
            self.buf.extend([f"{head}{t // 1000}.{t % 1000:03d}{tail}{e}}}}}"
                             for t, e in zip(range(t0, t0 + pad * step, step), range(e0, e0 + pad), strict=True)])
            self.ext += pad
        return ext

    def runtime(self, name: str, start: int, dur: int, tid: int | None = None, corr: int | None = None) -> None:
        if self.out is None:
            return
        if corr is None:  # CUPTI gives every runtime call a correlation id
            corr = self.corr
            self.corr += 1
        if name == "cudaStreamWaitEvent" and not self.spec.wait_calls:
            return
        args = f'"External id":{self.ext},"cbid":211,"correlation":{corr}'
        self._x("cuda_runtime", name, self.pid, tid or self.pid, start, dur, args)

    def launch(self, start: int, tid: int | None = None, name: str = "cudaLaunchKernel") -> int:
        """A launch call at ``start``; returns its correlation id."""
        corr = self.corr
        self.corr += 1
        self.runtime(name, start, 5 * US, tid, corr)
        return corr

    def kernel(self, name: str, stream: int, start: int, dur: int, corr: int, extra: str = "",
               cat: str = "kernel", ext: int | None = None) -> None:
        if self.out is None:
            return
        self._x(cat, name, self.device, stream, start, dur,
                f'"External id":{self.ext if ext is None else ext},"device":{self.device},"stream":{stream},'
                f'"correlation":{corr}{extra}')

    def annotation(self, name: str, start: int, dur: int) -> None:
        if self.out is None:
            return
        self._x("user_annotation", name, self.pid, self.pid, start, dur, f'"External id":{self.ext}')
        self.ext += 1

    def flush(self) -> None:
        if self.out is not None and self.buf:
            self.out(",\n".join(self.buf) + ",\n")
            self.buf.clear()


def _comm_args(spec: JobSpec, op: str, nbytes: int, seq: int | None, rank: int,
               group: dict[str, Any] | None = None, peer: int | None = None) -> str:
    members = group["ranks"] if group else list(range(spec.ranks))
    size = len(members)
    n = nbytes // 2  # bf16
    ranks = "[" + ", ".join(map(str, members)) + "]" if size <= 30 else \
        "[" + ", ".join(map(str, members[:29])) + f", ..., {members[-1]}]"
    n_in = n if op != "allgather" else n // size
    n_out = n if op != "reduce_scatter" else n // size
    name, desc = (group["pg_name"], group["pg_desc"]) if group else ("0", "default_pg")
    out = (f',"Collective name":"{op}","dtype":"BFloat16","In msg nelems":{n_in},'
           f'"Out msg nelems":{n_out},"Group size":{size},'
           f'"Process Group Name":"{name}","Process Group Description":"{desc}","Process Group Ranks":"{ranks}"')
    if peer is not None:
        out += f',"{"Dst" if op == "send" else "Src"} Rank":{peer}'
    if seq is not None:
        out += f',"Rank":{rank},"Seq":{seq}'
    return out


def kernel_name(spec: JobSpec, op: str) -> str:
    """The NCCL kernel of ``op`` as the job's NCCL era names it."""
    if op in ("send", "recv"):
        return SENDRECV_ERAS[spec.era]
    func = _FUNC[op]
    reduces = op != "allgather"
    if spec.era == "2.7":
        return f"nccl{func}RingLLKernel_{'sum_f16' if reduces else 'copy_i8'}(ncclColl)"
    fmt = KERNEL_ERAS[spec.era]
    return fmt.format(func=func, Op="Sum", cty="__nv_bfloat16" if reduces else "int8_t",
                      opty="_Sum_bf16" if reduces else "")


class Schedule:
    """The job simulated for a set of ranks (vectorised over them). With ``ends`` (per collective of a step, the end
    found with every member simulated) the ranks need not be all of a group's members."""

    def __init__(self, spec: JobSpec, ranks: np.ndarray, ends: dict[tuple[int, int], int] | None = None,
                 writers: list[_Writer] | None = None):
        self.spec = spec
        self.ranks = ranks
        self.ends = ends
        self.found: dict[tuple[int, int], int] = {}
        self.writers = writers
        self.slow = np.ones(ranks.size)
        for r, f in spec.stragglers:
            self.slow[ranks == r] = f
        host = ranks // spec.gpus_per_host
        self.stall = np.zeros(ranks.size, dtype=np.int64)
        for h, extra in spec.stalls:
            self.stall[host == h] = extra
        self.step_starts = np.zeros((ranks.size, spec.steps), dtype=np.int64)
        t0 = BASE_NS + 10 * MS
        self.main = np.full(ranks.size, t0, dtype=np.int64)
        for r, ns in spec.late:
            self.main[ranks == r] += ns
        self.bwd = np.full(ranks.size, t0, dtype=np.int64)
        self.gpu = np.full(ranks.size, t0, dtype=np.int64)
        self.comm = np.full(ranks.size, t0, dtype=np.int64)
        self.rs = np.full(ranks.size, t0, dtype=np.int64)
        self.last_launched = np.full(ranks.size, t0, dtype=np.int64)  # end of the last compute kernel launched
        self.n_coll = 0
        self.link_free = t0
        self.transfers: list[tuple[int, int]] = []  # (begin, end) of the recent transfers (every rank's link alike)
        if spec.mesh:
            spec.check()
            self.tp_s = np.full(ranks.size, t0, dtype=np.int64)  # the tensor-parallel NCCL stream
            self.pp_s = np.full(ranks.size, t0, dtype=np.int64)  # the pipeline's send/recv stream
            stage, dpi, tpi = spec.coords(ranks)
            self.stage = stage
            #: per rank, its group of each kind (an index into that kind's groups)
            self.gid = {"tp": stage * spec.dp + dpi, "dp": stage * spec.tp + tpi, "pp": dpi * spec.tp + tpi}
            groups = spec.groups()
            self.group_list: dict[str, list[dict[str, Any]]] = {k: [g for g in groups if g["pg_desc"] == k]
                                                                for k in ("tp", "dp", "pp")}
            self.group_link = {k: np.array(["intra" if len({r // spec.gpus_per_host for r in g["ranks"]}) == 1
                                            else "inter" for g in v] or ["intra"]) for k, v in self.group_list.items()}
            self.mesh_free = {k: np.full(max(len(v), 1), t0, dtype=np.int64) for k, v in self.group_list.items()}
            self.pending: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}

    # noise per (rank, step, slot): a multiplicative jitter of +-spec.jitter
    def _jit(self, step: int, slot: int) -> np.ndarray:
        return 1.0 + self.spec.jitter * _unit(self.spec.seed, self.ranks, step, slot)

    def _steps(self, step: int) -> np.ndarray:
        """Each rank's speed in ``step`` (``spec.step_jitter``): 1 for every rank and step without it."""
        return 1.0 + self.spec.step_jitter * _unit(self.spec.seed, self.ranks, step, 7_777)

    def _each(self, fn: Callable[[_Writer, int], None]) -> None:
        if self.writers is not None:
            for i, w in enumerate(self.writers):
                fn(w, i)

    def _kernel(self, launch_end: np.ndarray, dur: np.ndarray, after: np.ndarray | None = None) -> np.ndarray:
        """A compute kernel launched at ``launch_end``: starts when the stream is free (and after ``after``)."""
        start = np.maximum(self.gpu, launch_end + 3 * US)
        if after is not None:
            start = np.maximum(start, after)
        self.gpu = start + dur
        self.last_launched = self.gpu.copy()
        return start

    def _pieces(self, launch: np.ndarray, dur: np.ndarray, after: np.ndarray | None
                ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """A layer's kernel as ``spec.kernels`` back-to-back kernels: (launch, start, duration) of each, the first
        launched at ``launch`` (and after ``after``), the others :data:`KERNEL_GAP` apart; each slowed by the
        transfers in flight while it runs (``spec.contention``)."""
        n = self.spec.kernels
        out = []
        for j in range(n):
            part = dur // n + (dur % n if j == n - 1 else 0)
            at = launch + j * KERNEL_GAP
            start = self._kernel(at + 5 * US, part, after if j == 0 else None)
            if self.spec.contention != 1.0:
                part = self._contended(start, part)
                self.gpu = start + part
                self.last_launched = self.gpu.copy()
            out.append((at, start, part))
        return out

    def _contended(self, start: np.ndarray, work: np.ndarray) -> np.ndarray:
        """How long kernels starting at ``start`` with ``work`` ns of work take when they run ``spec.contention``
        times slower while a transfer is in flight (the group's transfers, one at a time: ``self.transfers``)."""
        slow = self.spec.contention
        t = start.astype(np.float64)
        rem = work.astype(np.float64)
        done = np.zeros(t.size, dtype=bool)
        out = np.zeros(t.size)
        for b, e in self.transfers:
            gap = np.clip(b - t, 0, None)  # alone until the transfer begins
            fin = ~done & (rem <= gap)
            out[fin] = t[fin] + rem[fin]
            done |= fin
            rem = np.where(done, rem, rem - gap)
            t = np.where(done, t, np.maximum(t, b))
            cap = np.clip(e - t, 0, None) / slow  # the work done while it is in flight
            fin = ~done & (rem <= cap)
            out[fin] = t[fin] + rem[fin] * slow
            done |= fin
            rem = np.where(done, rem, rem - cap)
            t = np.where(done, t, np.maximum(t, e))
        out[~done] = t[~done] + rem[~done]
        return np.rint(out).astype(np.int64) - start

    def _collective(self, step: int, op: str, nbytes: int, launch_end: np.ndarray, stream_free: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
        """An NCCL kernel launched at ``launch_end``: (start, end) per rank; every member ends together."""
        k = self.n_coll
        self.n_coll += 1
        start = np.maximum(np.maximum(stream_free, launch_end + 3 * US), self.last_launched)
        if self.ends is not None:
            end = np.full(self.ranks.size, self.ends[(step, k)], dtype=np.int64)
        else:  # the group's link carries one transfer at a time (all-gathers and reduce-scatters share it)
            begin = max(int(start.max()), self.link_free)
            end = np.full(self.ranks.size, begin + transfer_ns(self.spec, op, nbytes), dtype=np.int64)
        self.link_free = int(end[0])
        self.found[(step, k)] = int(end[0])
        self.transfers = [(b, e) for b, e in self.transfers if e > int(self.gpu.min())]
        self.transfers.append((int(end[0]) - transfer_ns(self.spec, op, nbytes), int(end[0])))
        return start, end

    def run(self) -> None:
        for step in range(self.spec.steps):
            self.n_coll = 0
            if self.spec.mesh:
                self._step_mesh(step)
            else:
                self._step(step)
            if self.writers is not None:
                for w in self.writers:
                    w.flush()

    def _comm_call(self, step: int, op: str, nbytes: int, at: np.ndarray, tid: int | None, stream: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """record_param_comms ⊃ nccl:* ⊃ the NCCL launch on the calling thread at ``at``; returns (start, end,
        the call's end on the CPU)."""
        spec = self.spec
        launch_end = at + 28 * US
        free = self.comm if stream == COMM_STREAM else self.rs
        start, end = self._collective(step, op, nbytes, launch_end, free)
        if stream == COMM_STREAM:
            self.comm = end
        else:
            self.rs = end
        name = kernel_name(spec, op)

        def emit(w: _Writer, i: int) -> None:
            a = int(at[i])
            tid_ = self._tid(w, tid)
            w.seq += 1
            w.cpu("record_param_comms", a, 40 * US, tid_, _comm_args(spec, op, nbytes, w.seq, w.rank))
            w.cpu(_ANNOT[op], a + 3 * US, 32 * US, tid_, cat="cpu_op")
            w.runtime("cudaEventRecord", a + 8 * US, 3 * US, tid_)
            w.runtime("cudaStreamWaitEvent", a + 13 * US, 3 * US, tid_)
            corr = w.launch(a + 20 * US, tid_, "cudaLaunchKernelExC")
            w.kernel(name, stream, int(start[i]), int(end[i] - start[i]), corr,
                     _comm_args(spec, op, nbytes, None, w.rank))

        self._each(emit)
        return start, end, at + 40 * US

    def _step(self, step: int) -> None:
        spec = self.spec
        L = spec.layers
        fwd = np.array([spec.fwd_ns * (0.6 + 0.8 * ((7 * layer) % L) / max(L - 1, 1)) for layer in range(L)])
        t = self.main.copy()
        step_start = t.copy()
        # data loader (a stalled host's input pipeline takes longer)
        load = (spec.loader_ns * self._jit(step, 1)).astype(np.int64) + self.stall
        # the profiler writes the loader's __next__ as a user annotation (a record_function): no operator's own time
        self._each(lambda w, i: w.annotation("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
                                             int(t[i]), int(load[i])))
        t = t + load + 10 * US
        # input to the device
        h2d = np.full(self.ranks.size, 150 * US, dtype=np.int64)
        m_start = self._kernel(t + 13 * US, h2d)
        first_dev = m_start.copy()

        def emit_h2d(w: _Writer, i: int) -> None:
            a = int(t[i])
            w.cpu("aten::to", a, 25 * US)
            w.cpu("aten::copy_", a + 2 * US, 21 * US)
            corr = w.launch(a + 8 * US, name="cudaMemcpyAsync")
            w.kernel("Memcpy HtoD (Pinned -> Device)", COMPUTE_STREAM, int(m_start[i]), int(h2d[i]), corr,
                     ',"bytes":12582912,"memory bandwidth (GB/s)":84.0', cat="gpu_memcpy")

        self._each(emit_h2d)
        t = t + 35 * US
        fsdp = spec.parallel == "fsdp"
        ag_end: dict[int, np.ndarray] = {}
        cpu_op = spec.cpu_op_ns

        def all_gather(layer: int, at: np.ndarray, tid: int | None) -> np.ndarray:
            _, end, cpu_end = self._comm_call(step, "allgather", spec.param_bytes, at, tid, COMM_STREAM)
            ag_end[layer] = end
            return cpu_end + 5 * US

        # forward on the main thread
        if fsdp:
            t = all_gather(0, t, None)
        for layer in range(L):
            if fsdp and layer + 1 < L:  # prefetch the next layer's parameters
                t = all_gather(layer + 1, t, None)
            dur = (fwd[layer] * self.slow * self._steps(step) * self._jit(step, 10 + layer)).astype(np.int64)
            launch = t + cpu_op // 2
            op_ns = cpu_op + (spec.kernels - 1) * KERNEL_GAP
            pieces = self._pieces(launch, dur, ag_end.get(layer) if fsdp else None)

            def emit_fwd(w: _Writer, i: int, t=t, launch=launch, pieces=pieces, layer=layer, op_ns=op_ns) -> None:
                a = int(t[i])
                if fsdp:
                    w.runtime("cudaStreamWaitEvent", int(launch[i]) - 4 * US, 3 * US)
                w.cpu("aten::linear", a, op_ns, extra=f',"Sequence number":{1000 * step + layer}')
                w.cpu("aten::addmm", a + 3 * US, op_ns - 6 * US)
                for at, k_start, k_dur in pieces:
                    corr = w.launch(int(at[i]))
                    w.kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_"
                             "execute_segment_k_off_kernel__5x_cublas", COMPUTE_STREAM, int(k_start[i]), int(k_dur[i]),
                             corr)

            self._each(emit_fwd)
            t = t + op_ns + 5 * US
        # the loss
        loss = np.full(self.ranks.size, 40 * US, dtype=np.int64)
        l_start = self._kernel(t + 10 * US, loss)

        def emit_loss(w: _Writer, i: int) -> None:
            w.cpu("aten::cross_entropy_loss", int(t[i]), 20 * US)
            corr = w.launch(int(t[i]) + 8 * US)
            w.kernel("void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, "
                     "long>(float*, float*, float const*, long const*, float const*, bool, long, long, long, long)",
                     COMPUTE_STREAM, int(l_start[i]), int(loss[i]), corr)

        self._each(emit_loss)
        t = t + 25 * US
        # backward: on the autograd engine's thread (GPU) or the caller's (CPU-style); the caller waits
        tid = self.pid_of_autograd() if spec.autograd_thread else None
        a = np.maximum(self.bwd, t + 30 * US) if spec.autograd_thread else t
        bucket_of = {b[-1]: (j, len(b)) for j, b in enumerate(buckets(spec))}
        last_end: np.ndarray | None = None
        bop = 40 * US + (spec.kernels - 1) * KERNEL_GAP  # a backward operator on the CPU
        for layer in reversed(range(L)):
            if fsdp and layer == L - 1:
                a = all_gather(layer, a, tid)
            if fsdp and layer > 0:
                a = all_gather(layer - 1, a, tid)
            dur = (2 * fwd[layer] * self.slow * self._steps(step) * self._jit(step, 100 + layer)).astype(np.int64)
            launch = a + 20 * US
            pieces = self._pieces(launch, dur, ag_end.get(layer) if fsdp else None)

            def emit_bwd(w: _Writer, i: int, a=a, launch=launch, pieces=pieces, layer=layer, bop=bop) -> None:
                x = int(a[i])
                seq = 1000 * step + layer
                w.cpu("autograd::engine::evaluate_function: AddmmBackward0", x, bop, self._tid(w, tid),
                      f',"Fwd thread id":1,"Sequence number":{seq}')
                w.cpu("AddmmBackward0", x + 2 * US, bop - 4 * US, self._tid(w, tid),
                      f',"Fwd thread id":1,"Sequence number":{seq}')
                w.cpu("aten::mm", x + 5 * US, bop - 10 * US, self._tid(w, tid))
                if fsdp:
                    w.runtime("cudaStreamWaitEvent", int(launch[i]) - 4 * US, 3 * US, self._tid(w, tid))
                for at, k_start, k_dur in pieces:
                    corr = w.launch(int(at[i]), self._tid(w, tid))
                    w.kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize128x256x64_warpgroupsize2x1x1_"
                             "execute_segment_k_off_kernel__5x_cublas", COMPUTE_STREAM, int(k_start[i]), int(k_dur[i]),
                             corr)
                w.cpu("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", x + bop + 2 * US,
                      8 * US, self._tid(w, tid))

            self._each(emit_bwd)
            a = a + bop + 12 * US
            if fsdp:
                _, end, cpu_end = self._comm_call(step, "reduce_scatter", spec.param_bytes, a, tid, RS_STREAM)
                last_end = end
                a = cpu_end + 5 * US
            elif layer in bucket_of:
                _, n = bucket_of[layer]
                _, end, cpu_end = self._comm_call(step, "allreduce", n * spec.param_bytes, a, tid, COMM_STREAM)
                last_end = end
                a = cpu_end + 5 * US
        # DDP's finalize / FSDP's post-backward callback: the compute stream waits for the gradients' communication
        self._each(lambda w, i: w.runtime("cudaStreamWaitEvent", int(a[i]), 3 * US, self._tid(w, tid)))
        a = a + 5 * US
        if spec.autograd_thread:
            self.bwd = a
            t = np.maximum(t, a + 30 * US)  # the caller resumes once the engine is done
        else:
            t = a
        # optimizer: its kernel waits for the last gradient's communication (DDP's finalize, FSDP's post-backward)
        opt = (np.full(self.ranks.size, 200 * US) * self._jit(step, 2)).astype(np.int64)
        launch = t + 15 * US
        o_start = self._kernel(launch + 5 * US, opt, last_end)

        def emit_opt(w: _Writer, i: int) -> None:
            x = int(t[i])
            w.cpu("Optimizer.step#AdamW.step", x, 50 * US)
            w.cpu("aten::_foreach_add_", x + 5 * US, 30 * US)
            corr = w.launch(int(launch[i]))
            w.kernel("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
                     "namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor"
                     "<float, 4> >(at::native::(anonymous namespace)::TensorListMetadata<4>)",
                     COMPUTE_STREAM, int(o_start[i]), int(opt[i]), corr)

        self._each(emit_opt)
        t = t + 55 * US
        # loss.item(): a copy to the host, and the main thread blocks until it is done
        d2h = np.full(self.ranks.size, 3 * US, dtype=np.int64)
        c_start = self._kernel(t + 13 * US, d2h)
        sync_end = np.maximum(t + 20 * US, c_start + d2h + 4 * US)

        def emit_item(w: _Writer, i: int) -> None:
            x = int(t[i])
            e = int(sync_end[i])
            w.cpu("aten::item", x, e + 2 * US - x)
            w.cpu("aten::_local_scalar_dense", x + 2 * US, e - x)
            corr = w.launch(x + 8 * US, name="cudaMemcpyAsync")
            w.kernel("Memcpy DtoH (Device -> Pageable)", COMPUTE_STREAM, int(c_start[i]), int(d2h[i]), corr,
                     ',"bytes":4,"memory bandwidth (GB/s)":0.002', cat="gpu_memcpy")
            w.runtime("cudaStreamSynchronize", x + 14 * US, e - x - 14 * US)

        self._each(emit_item)
        t = sync_end + 20 * US
        self._each(lambda w, i: w.annotation(f"ProfilerStep#{step}", int(step_start[i]),
                                             int(t[i] - step_start[i]) - US))
        self.step_starts[:, step] = first_dev
        self.main = t

    # --- meshes: DP x TP x PP ------------------------------------------------------------------------------------

    def _each_at(self, idx: np.ndarray, fn: Callable[[_Writer, int], None]) -> None:
        if self.writers is not None:
            for i in idx.tolist():
                fn(self.writers[i], i)

    def _found(self, key: tuple, idx: np.ndarray, end: np.ndarray) -> None:
        if self.ends is None:
            arr = self.found.setdefault(key, np.full(self.spec.ranks, -1, dtype=np.int64))  # type: ignore[arg-type]
            arr[self.ranks[idx]] = end  # type: ignore[index]

    def _mesh_emit(self, idx: np.ndarray, at: np.ndarray, tid: int | None, op: str, nbytes: int, kind: str,
                   stream: int, start: np.ndarray, end: np.ndarray, peer: np.ndarray | None = None) -> None:
        spec = self.spec
        name = kernel_name(spec, op)

        def emit(w: _Writer, i: int) -> None:
            a = int(at[i])
            tid_ = self._tid(w, tid)
            group = self.group_list[kind][int(self.gid[kind][i])] if self.group_list.get(kind) else None
            pg = group["pg_name"] if group else "0"
            seq = None
            if op not in ("send", "recv"):
                w.seqs[pg] = seq = w.seqs.get(pg, 0) + 1
            p = None if peer is None else int(peer[i])
            ext = w.cpu("record_param_comms", a, 40 * US, tid_, _comm_args(spec, op, nbytes, seq, w.rank, group, p))
            w.cpu(_ANNOT[op], a + 3 * US, 32 * US, tid_, cat="cpu_op")
            w.runtime("cudaEventRecord", a + 8 * US, 3 * US, tid_)
            w.runtime("cudaStreamWaitEvent", a + 13 * US, 3 * US, tid_)
            corr = w.launch(a + 20 * US, tid_, "cudaLaunchKernelExC")
            w.kernel(name, stream, int(start[i]), int(end[i] - start[i]), corr,
                     _comm_args(spec, op, nbytes, None, w.rank, group, p), ext=ext)

        self._each_at(idx, emit)

    def _mesh_coll(self, key: tuple, kind: str, op: str, nbytes: int, idx: np.ndarray, at: np.ndarray,
                   tid: int | None, stream: int, free: np.ndarray) -> np.ndarray:
        """A collective of each rank's group of ``kind`` (ranks ``idx``, called at ``at``) on ``stream`` (``free``:
        that stream's state, updated): every member ends together, one transfer at a time on each group's link.
        Returns the ends (full arrays; only ``idx`` set)."""
        spec = self.spec
        start = np.zeros(self.ranks.size, dtype=np.int64)
        end = np.zeros(self.ranks.size, dtype=np.int64)
        start[idx] = np.maximum(np.maximum(free[idx], at[idx] + 31 * US), self.last_launched[idx])
        if self.ends is not None:
            end[idx] = self.ends[key][self.ranks[idx]]  # type: ignore[index]
        else:
            g = self.gid[kind][idx]
            latest = np.full(self.mesh_free[kind].size, np.iinfo(np.int64).min, dtype=np.int64)
            np.maximum.at(latest, g, start[idx])
            size = {"tp": spec.tp, "dp": spec.dp, "pp": spec.pp}[kind]
            cost = {c: transfer_ns(spec, op, nbytes, size, c) for c in ("intra", "inter")}
            used = np.unique(g)
            begin = np.maximum(latest[used], self.mesh_free[kind][used])
            t = np.array([cost[str(c)] for c in self.group_link[kind][used]], dtype=np.int64)
            self.mesh_free[kind][used] = begin + t
            end[idx] = self.mesh_free[kind][g]
            self._found(key, idx, end[idx])
        free[idx] = end[idx]
        self._mesh_emit(idx, at, tid, op, nbytes, kind, stream, start, end)
        return end

    def _send(self, key: tuple, idx: np.ndarray, at: np.ndarray, tid: int | None, delta: int, nbytes: int) -> None:
        """A pipeline send from ranks ``idx`` to the ranks ``delta`` away; its end is found with the matching
        receive (:meth:`_recv`)."""
        start = np.zeros(self.ranks.size, dtype=np.int64)
        start[idx] = np.maximum(np.maximum(self.pp_s[idx], at[idx] + 31 * US), self.last_launched[idx])
        if self.ends is None:
            self.pending[key] = (idx, start[idx])
            self.pp_s[idx] = start[idx]  # until the receive says when it ended
            return
        end = np.zeros(self.ranks.size, dtype=np.int64)
        end[idx] = self.ends[key][self.ranks[idx]]  # type: ignore[index]
        self.pp_s[idx] = end[idx]
        self._mesh_emit(idx, at, tid, "send", nbytes, "pp", PP_STREAM, start, end, self.ranks + delta)

    def _recv(self, key: tuple, idx: np.ndarray, at: np.ndarray, tid: int | None, delta: int, nbytes: int
              ) -> np.ndarray:
        """The receive of ranks ``idx`` from the ranks ``delta`` away: both sides end together, when both are posted
        and the pipeline group's link is free, plus the transfer. Returns the ends (full arrays)."""
        spec = self.spec
        start = np.zeros(self.ranks.size, dtype=np.int64)
        end = np.zeros(self.ranks.size, dtype=np.int64)
        start[idx] = np.maximum(np.maximum(self.pp_s[idx], at[idx] + 31 * US), self.last_launched[idx])
        if self.ends is not None:
            end[idx] = self.ends[key][self.ranks[idx]]  # type: ignore[index]
        else:
            s_idx, s_start = self.pending.pop(key)
            # senders and receivers of one pipeline chain pair up in rank order (the peer is ``delta`` away)
            assert np.array_equal(self.ranks[s_idx] + delta, self.ranks[idx])
            chain = self.gid["pp"][idx]
            begin = np.maximum(np.maximum(s_start, start[idx]), self.mesh_free["pp"][chain])
            host_r = self.ranks[idx] // spec.gpus_per_host
            host_s = self.ranks[s_idx] // spec.gpus_per_host
            t = np.array([transfer_ns(spec, "send", nbytes, 2, "intra" if a == b else "inter")
                          for a, b in zip(host_r.tolist(), host_s.tolist(), strict=True)], dtype=np.int64)
            e = begin + t
            self.mesh_free["pp"][chain] = e
            end[idx] = e
            self.pp_s[s_idx] = e
            self._found(key, idx, e)
            self._found(key, s_idx, e)
        self.pp_s[idx] = end[idx]
        self._mesh_emit(idx, at, tid, "recv", nbytes, "pp", PP_STREAM, start, end, self.ranks - delta)
        return end

    def _layer(self, idx: np.ndarray, t: np.ndarray, tid: int | None, dur: np.ndarray, after: np.ndarray | None,
               name: str, kernel: str, seq: int, backward: bool) -> None:
        """One layer's operator and kernel on the ranks ``idx`` (CPU at ``t``, updated), the kernel after ``after``."""
        cpu_op = 40 * US if backward else self.spec.cpu_op_ns
        launch = t + cpu_op // 2
        start = np.maximum(self.gpu[idx], launch[idx] + 8 * US)
        if after is not None:
            start = np.maximum(start, after[idx])
        k_start = np.zeros(self.ranks.size, dtype=np.int64)
        k_start[idx] = start
        self.gpu[idx] = start + dur[idx]
        self.last_launched[idx] = self.gpu[idx]

        def emit(w: _Writer, i: int) -> None:
            a = int(t[i])
            tid_ = self._tid(w, tid)
            if after is not None:  # the compute stream waits for the communication it needs
                w.runtime("cudaStreamWaitEvent", int(launch[i]) - 4 * US, 3 * US, tid_)
            if backward:
                w.cpu("autograd::engine::evaluate_function: AddmmBackward0", a, cpu_op, tid_,
                      f',"Fwd thread id":1,"Sequence number":{seq}')
                w.cpu("AddmmBackward0", a + 2 * US, cpu_op - 4 * US, tid_,
                      f',"Fwd thread id":1,"Sequence number":{seq}')
            else:
                w.cpu(name, a, cpu_op, tid_, extra=f',"Sequence number":{seq}')
            corr = w.launch(int(launch[i]), tid_)
            w.kernel(kernel, COMPUTE_STREAM, int(k_start[i]), int(dur[i]), corr)

        self._each_at(idx, emit)
        t[idx] = t[idx] + cpu_op + 5 * US

    def _step_mesh(self, step: int) -> None:
        """One GPipe step of a DP x TP x PP mesh (module docstring), every stage's ranks in turn."""
        spec = self.spec
        S, M, L = spec.pp, spec.microbatches, spec.layers
        Ls = L // S
        span = spec.dp * spec.tp  # ranks per stage: the peer of a pipeline send is this far away
        fwd = np.array([spec.fwd_ns * (0.6 + 0.8 * ((7 * layer) % L) / max(L - 1, 1)) for layer in range(L)])
        everyone = np.arange(self.ranks.size)
        t = self.main.copy()
        step_start = t.copy()
        load = (spec.loader_ns * self._jit(step, 1)).astype(np.int64) + self.stall
        self._each(lambda w, i: w.cpu("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", int(t[i]),
                                      int(load[i])))
        t = t + load + 10 * US
        h2d = np.full(self.ranks.size, 150 * US, dtype=np.int64)
        m_start = self._kernel(t + 13 * US, h2d)
        first_dev = m_start.copy()

        def emit_h2d(w: _Writer, i: int) -> None:
            a = int(t[i])
            w.cpu("aten::to", a, 25 * US)
            corr = w.launch(a + 8 * US, name="cudaMemcpyAsync")
            w.kernel("Memcpy HtoD (Pinned -> Device)", COMPUTE_STREAM, int(m_start[i]), int(h2d[i]), corr,
                     ',"bytes":12582912,"memory bandwidth (GB/s)":84.0', cat="gpu_memcpy")

        self._each(emit_h2d)
        t = t + 35 * US
        gemm_f = ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_"
                  "off_kernel__5x_cublas")
        gemm_b = ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_"
                  "off_kernel__5x_cublas")
        # forward: microbatch by microbatch, stage by stage (a stage's receive pairs with the send just made)
        for m in range(M):
            for s in range(S):
                idx = everyone[self.stage == s]
                after = None
                if s > 0:
                    after = self._recv(("pp-f", step, m, s - 1), idx, t, None, span, spec.act_bytes)
                    t[idx] = t[idx] + 45 * US
                for j in range(Ls):
                    layer = s * Ls + j
                    dur = (fwd[layer] * self.slow * self._jit(step, 10 + 97 * m + layer)).astype(np.int64)
                    self._layer(idx, t, None, dur, after, "aten::linear", gemm_f, 1000 * step + layer, False)
                    after = None
                    if spec.tp > 1:
                        after = self._mesh_coll(("tp-f", step, m, layer), "tp", "allreduce", spec.act_bytes, idx, t,
                                                None, TP_STREAM, self.tp_s)
                        t[idx] = t[idx] + 45 * US
                if s < S - 1:
                    if after is not None:  # the send waits for the last all-reduce of the stage's output
                        self.last_launched[idx] = np.maximum(self.last_launched[idx], after[idx])
                    self._send(("pp-f", step, m, s), idx, t, None, span, spec.act_bytes)
                    t[idx] = t[idx] + 45 * US
                else:
                    loss = np.full(self.ranks.size, 40 * US, dtype=np.int64)
                    self._layer(idx, t, None, loss, after, "aten::cross_entropy_loss",
                                "void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, "
                                "float, long>(float*, float*, float const*, long const*, float const*, bool, long, "
                                "long, long, long)", 1000 * step + 999, False)
        # backward on the autograd engine's thread (the caller waits), microbatch by microbatch, last stage first
        tid = self.pid_of_autograd() if spec.autograd_thread else None
        a = np.maximum(self.bwd, t + 30 * US) if spec.autograd_thread else t.copy()
        for m in range(M):
            for s in reversed(range(S)):
                idx = everyone[self.stage == s]
                after = None
                if s < S - 1:
                    after = self._recv(("pp-b", step, m, s + 1), idx, a, tid, -span, spec.act_bytes)
                    a[idx] = a[idx] + 45 * US
                for j in reversed(range(Ls)):
                    layer = s * Ls + j
                    dur = (2 * fwd[layer] * self.slow * self._jit(step, 5000 + 97 * m + layer)).astype(np.int64)
                    self._layer(idx, a, tid, dur, after, "", gemm_b, 1000 * step + layer, True)
                    after = None
                    if spec.tp > 1:
                        after = self._mesh_coll(("tp-b", step, m, layer), "tp", "allreduce", spec.act_bytes, idx, a,
                                                tid, TP_STREAM, self.tp_s)
                        a[idx] = a[idx] + 45 * US
                if s > 0:
                    if after is not None:
                        self.last_launched[idx] = np.maximum(self.last_launched[idx], after[idx])
                    self._send(("pp-b", step, m, s), idx, a, tid, -span, spec.act_bytes)
                    a[idx] = a[idx] + 45 * US
        # data-parallel gradient all-reduces of each stage's layers, in buckets, after the last backward
        last_end = None
        if spec.dp > 1:
            stage_layers = [list(range(s * Ls, (s + 1) * Ls)) for s in range(S)]
            per = max(1, spec.bucket_bytes // max(spec.param_bytes, 1))
            n_buckets = -(-Ls // per)
            for b in range(n_buckets):
                n = min(per, Ls - b * per)
                last_end = self._mesh_coll(("dp", step, b), "dp", "allreduce", n * spec.param_bytes, everyone, a, tid,
                                           COMM_STREAM, self.comm)
                a = a + 45 * US
            del stage_layers
        self._each(lambda w, i: w.runtime("cudaStreamWaitEvent", int(a[i]), 3 * US, self._tid(w, tid)))
        a = a + 5 * US
        if spec.autograd_thread:
            self.bwd = a
            t = np.maximum(t, a + 30 * US)
        else:
            t = a
        opt = (np.full(self.ranks.size, 200 * US) * self._jit(step, 2)).astype(np.int64)
        launch = t + 15 * US
        o_start = self._kernel(launch + 5 * US, opt, last_end)

        def emit_opt(w: _Writer, i: int) -> None:
            x = int(t[i])
            w.cpu("Optimizer.step#AdamW.step", x, 50 * US)
            corr = w.launch(int(launch[i]))
            w.kernel("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
                     "namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor"
                     "<float, 4> >(at::native::(anonymous namespace)::TensorListMetadata<4>)",
                     COMPUTE_STREAM, int(o_start[i]), int(opt[i]), corr)

        self._each(emit_opt)
        t = t + 55 * US
        d2h = np.full(self.ranks.size, 3 * US, dtype=np.int64)
        c_start = self._kernel(t + 13 * US, d2h)
        sync_end = np.maximum(t + 20 * US, c_start + d2h + 4 * US)

        def emit_item(w: _Writer, i: int) -> None:
            x = int(t[i])
            e = int(sync_end[i])
            w.cpu("aten::item", x, e + 2 * US - x)
            corr = w.launch(x + 8 * US, name="cudaMemcpyAsync")
            w.kernel("Memcpy DtoH (Device -> Pageable)", COMPUTE_STREAM, int(c_start[i]), int(d2h[i]), corr,
                     ',"bytes":4,"memory bandwidth (GB/s)":0.002', cat="gpu_memcpy")
            w.runtime("cudaStreamSynchronize", x + 14 * US, e - x - 14 * US)

        self._each(emit_item)
        t = sync_end + 20 * US
        self._each(lambda w, i: w.annotation(f"ProfilerStep#{step}", int(step_start[i]),
                                             int(t[i] - step_start[i]) - US))
        self.step_starts[:, step] = first_dev
        self.main = t

    def pid_of_autograd(self) -> int:
        return AUTOGRAD_TID  # an offset: each writer adds its pid

    def _tid(self, w: _Writer, tid: int | None) -> int | None:
        return None if tid is None else w.pid + tid


def simulate(spec: JobSpec) -> Schedule:
    """Pass 1: every rank at once (no text), for the collectives' ends and the truth."""
    s = Schedule(spec, np.arange(spec.ranks))
    s.run()
    return s


def truth(spec: JobSpec, sched: Schedule | None = None) -> Truth:
    """The job's truth, from its simulation (run here unless given)."""
    s = sched or simulate(spec)
    first = s.step_starts.min(axis=0)
    gaps = np.diff(first)
    n = s.n_coll if not spec.mesh else sum(1 for k in s.found if k[1] == spec.steps - 1)
    return Truth(spec=asdict(spec), iteration_ns=int(np.median(gaps)) if gaps.size else 0,
                 step_starts=s.step_starts.tolist(), collectives=n,
                 straggler_ranks=[r for r, f in spec.stragglers if f > 1.0],
                 stalled_hosts=[h for h, x in spec.stalls if x > 0],
                 link="inter" if spec.hosts > 1 else "intra")


def link_costs(spec: JobSpec, measured: int | None = None) -> dict[str, int]:
    """Per link class, how much shorter an iteration is when that class's transfers take no time."""
    base = measured if measured is not None else iteration_ns(spec)
    return {c: base - iteration_ns(replace(spec, free_links=(*spec.free_links, c))) for c in ("intra", "inter")}


def iteration_ns(spec: JobSpec) -> int:
    """The true iteration time of ``spec`` (a what-if's answer: change the spec, ask again)."""
    return truth(spec).iteration_ns


def _header(spec: JobSpec, rank: int) -> str:
    mine = [{**g, "pg_size": len(g["ranks"])} for g in spec.groups() if rank in g["ranks"]]
    info = {"backend": "nccl", "rank": rank, "world_size": spec.ranks, "pg_count": len(mine),
            "pg_config": [{"pg_name": g["pg_name"], "pg_desc": g["pg_desc"], "pg_size": g["pg_size"],
                           "ranks": g["ranks"]} for g in mine], "nccl_version": "2.21.5"}
    device = rank % spec.gpus_per_host
    return ('{\n  "schemaVersion": 1,\n'
            f'  "deviceProperties": [{{"id": {device}, "name": "NVIDIA H100 80GB HBM3"}}],\n'
            f'  "distributedInfo": {json.dumps(info)},\n  "host_name": "node{spec.host_of(rank):03d}",\n'
            f'  "displayTimeUnit": "ms",\n  "baseTimeNanoseconds": {BASE_NS},\n  "traceEvents": [\n')


def file_name(spec: JobSpec, rank: int) -> str:
    """The profiler's default name: ``{host}_{pid}.{ms}.pt.trace.json``."""
    return f"node{spec.host_of(rank):03d}_{PID0 + rank}.1730000000123.pt.trace.json"


def write_rank(spec: JobSpec, rank: int, ends: dict[tuple[int, int], int], directory: str | os.PathLike,
               gz: bool = False) -> Path:
    """Pass 2: one rank's trace, from the collectives' ends found in pass 1 (atomically: temp file, rename)."""
    path = Path(directory) / (file_name(spec, rank) + (".gz" if gz else ""))
    tmp = path.with_name(path.name + ".tmp")
    opener: Any = gzip.open if gz else open
    with opener(tmp, "wt") as f:
        f.write(_header(spec, rank))
        w = _Writer(spec, rank, f.write)
        s = Schedule(spec, np.array([rank]), ends=ends, writers=[w])
        s.run()
        w.flush()
        f.write(f'  {{"ph":"i","s":"g","name":"Record Window End","pid":"","tid":"","ts":{w._ts(int(s.main[0]))}}}\n'
                f'  ],\n  "traceName": "{path.name}"\n}}\n')
    os.replace(tmp, path)
    return path


def _write_one(args: tuple[JobSpec, int, dict[tuple[int, int], int], str, bool]) -> str:
    return str(write_rank(*args))


def write_job(directory: str | os.PathLike, spec: JobSpec, *, gz: bool = False, workers: int = 1,
              ranks: list[int] | None = None) -> Truth:
    """Write every rank's trace (or ``ranks`` only) into ``directory`` and ``truth.json`` beside them."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    s = simulate(spec)
    ends = s.found
    todo = [(spec, r, ends, str(d), gz) for r in (ranks if ranks is not None else range(spec.ranks))]
    if workers > 1 and len(todo) > 1:
        with ProcessPoolExecutor(workers) as pool:
            list(pool.map(_write_one, todo, chunksize=max(1, len(todo) // (8 * workers))))
    else:
        for job in todo:
            _write_one(job)
    t = truth(spec, s)
    t.link_cost_ns = link_costs(spec, t.iteration_ns)
    t.binding_link = max(t.link_cost_ns, key=lambda c: t.link_cost_ns[c]) if any(t.link_cost_ns.values()) else None
    (d / "truth.json").write_text(t.to_json())
    return t


def pad_for(spec: JobSpec, size_mb: float) -> JobSpec:
    """``spec`` with ``pad`` chosen so that each rank's trace is about ``size_mb`` MB."""
    probe = replace(spec, steps=2)
    sizes = []
    for pad in (0, 8):
        out: list[str] = []
        w = _Writer(replace(probe, pad=pad), 0, out.append)
        Schedule(replace(probe, pad=pad), np.array([0]), ends=simulate(probe).found, writers=[w]).run()
        sizes.append(sum(map(len, out)) / probe.steps)
    per_pad = (sizes[1] - sizes[0]) / 8
    want = size_mb * 1e6 / spec.steps
    return replace(spec, pad=max(0, round((want - sizes[0]) / max(per_pad, 1.0))))


def _pairs(text: str, kind: Callable[[str], Any]) -> tuple[tuple[int, Any], ...]:
    out = []
    for part in filter(None, text.split(",")):
        k, v = part.split("=")
        out.append((int(k), kind(v)))
    return tuple(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="directory for the traces and truth.json")
    p.add_argument("--ranks", type=int, default=16)
    p.add_argument("--gpus-per-host", type=int, default=8)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--parallel", choices=["ddp", "fsdp"], default="ddp")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel group size (inside a host)")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages")
    p.add_argument("--microbatches", type=int, default=1, help="microbatches per step through the pipeline")
    p.add_argument("--intra-gbit", type=float, default=2400.0, help="intra-node line rate (Gbit/s)")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--inter-gbit", type=float, default=10.0)
    p.add_argument("--main-thread-backward", action="store_true", help="backward on the main thread (CPU-style)")
    p.add_argument("--straggler", default="", help="RANK=FACTOR,... (kernels FACTOR times slower)")
    p.add_argument("--stall", default="", help="HOST=MS,... (extra data loading per step)")
    p.add_argument("--era", choices=sorted(KERNEL_ERAS), default="2.21")
    p.add_argument("--size-mb", type=float, help="about this many MB per rank (pads operators with nested calls)")
    p.add_argument("--gz", action="store_true")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    spec = JobSpec(ranks=a.ranks, gpus_per_host=a.gpus_per_host, steps=a.steps, parallel=a.parallel, layers=a.layers,
                   inter_bps=a.inter_gbit * 1e9, intra_bps=a.intra_gbit * 1e9, tp=a.tp, pp=a.pp,
                   microbatches=a.microbatches, autograd_thread=not a.main_thread_backward,
                   stragglers=_pairs(a.straggler, float), stalls=_pairs(a.stall, lambda v: int(float(v) * MS)),
                   era=a.era, seed=a.seed)
    if a.size_mb:
        spec = pad_for(spec, a.size_mb)
    t = write_job(a.out, spec, gz=a.gz, workers=a.workers)
    free = iteration_ns(replace(spec, comm_free=True))
    print(f"{spec.ranks} ranks in {a.out}: iteration {t.iteration_ns / 1e6:.3f} ms, communication free "
          f"{free / 1e6:.3f} ms (scaling factor {free / t.iteration_ns:.4f})")
    return 0


def iter_specs(base: JobSpec, **axes: list[Any]) -> Iterator[JobSpec]:
    """Every combination of the given fields' values on top of ``base``."""
    import itertools

    keys = list(axes)
    for values in itertools.product(*(axes[k] for k in keys)):
        yield replace(base, **dict(zip(keys, values, strict=True)))


if __name__ == "__main__":
    sys.exit(main())
