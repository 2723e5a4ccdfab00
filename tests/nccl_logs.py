"""Synthetic NCCL debug logs with known truth, one grammar per NCCL era of FORMATS.md section 2.

:func:`make_job` describes a small multi-rank job (processes, communicators, the calls each comm
makes, transports, tuning choices); :func:`render` writes what NCCL ``version`` would have logged for
it (``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,COLL,TUNING,NET,GRAPH``), optionally behind a launcher prefix,
with 2.26 timestamps, interleaved between processes, with damage; :func:`expected_collectives` /
:func:`expected_topology` give the rows the parser must recover.

The formats follow FORMATS.md 2.2-2.6 (the NCCL sources they cite); hosts, pids, pointers and sizes
are invented. Everything is deterministic for a given seed.
"""

from __future__ import annotations

import gzip
import random
from dataclasses import dataclass, field
from pathlib import Path

from tracekit.parsers.nccl import DTYPES, split_comm_id

#: one version per grammar era (FORMATS.md 2.3 tables), oldest first
ERAS = ("2.4.8", "2.5.6", "2.7.8", "2.8.4", "2.12.12", "2.14.3", "2.16.5", "2.18.5", "2.20.5",
        "2.21.5", "2.23.4", "2.24.3", "2.26.2", "2.27.3", "2.28.3", "2.29.1")
LAUNCHERS = (None, "torchrun", "openmpi", "srun", "pdsh", "ray", "quote", "wrapper")

ALGO_NAMES = ("TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT")
PROTO_NAMES = ("LL", "LL128", "SIMPLE")
NCCL_ALGO_STR = ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT")
NCCL_PROTO_STR = ("LL", "LL128", "Simple")


def V(v: str) -> tuple[int, int, int]:
    a, b, c = v.split(".")
    return int(a), int(b), int(c)


@dataclass
class Proc:
    g: int  # global rank
    host: str
    ip: str
    pid: int
    dev: int
    bus: str
    nvml: int


@dataclass
class Comm:
    name: str
    members: list[int]  # global ranks in comm-rank order
    comm_id: int | None  # the printed commId (None: not printed in this era)
    ptrs: dict[int, str]  # global rank -> comm pointer
    parent: Comm | None = None
    color: int | None = None
    split_count: int | None = None
    pg: str | None = None  # what the parser must report as pg

    def rank_of(self, g: int) -> int:
        return self.members.index(g)


@dataclass
class Entry:
    """One COLL line of one rank: op as NCCL prints it, count, datatype id, root (comm rank)."""

    op: str
    count: int
    dtype: int
    root: int = 0
    redop: int = 0


@dataclass
class Step:
    """A group of calls on a comm (one ncclGroupStart/End), the same on every member up to p2p peers."""

    comm: Comm
    entries: dict[int, list[Entry]]  # global rank -> entries
    tuned: bool = True


@dataclass
class Job:
    version: str
    procs: list[Proc]
    comms: list[Comm]
    steps: list[Step]  # in program order (same on every rank)
    network: str = "IB"
    lazy_comm: str | None = None  # comm whose connections are made at its first call (2.21+)
    destroyed: list[Comm] = field(default_factory=list)

    @property
    def v(self) -> tuple[int, int, int]:
        return V(self.version)


def _size(dtype: int) -> int:
    return DTYPES[dtype][1]


def S(op: str, count: int, dtype: int, n: int) -> int:
    """FORMATS.md section 4: full-buffer size."""
    full = op in ("AllGather", "ReduceScatter", "AlltoAll", "Gather", "Scatter")
    return count * _size(dtype) * (n if full else 1)


def choose(op: str, nbytes: int) -> tuple[int, int]:
    """The (algo id, proto id) rank 0 'chooses' for a call (deterministic, for the truth)."""
    return (1, 2) if nbytes >= 65536 else (0, 0)


def make_job(version: str = "2.21.5", nranks: int = 4, gpus_per_host: int = 2, network: str = "IB",
             seed: int = 0) -> Job:
    """A job of ``nranks`` processes on ``nranks/gpus_per_host`` hosts: a world comm, two split comms
    (color = rank % 2), calls of every op the era knows, and a sub comm destroyed and re-created at the
    same pointers (pointer reuse)."""
    rng = random.Random(seed)
    v = V(version)
    procs = []
    for g in range(nranks):
        h = g // gpus_per_host
        procs.append(Proc(g, f"gpu-node-{h + 1:02d}", f"10.8.0.{21 + h}", 48000 + 13 * g + rng.randrange(7),
                          g % gpus_per_host, f"{0x1b + 0x20 * (g % gpus_per_host):x}000", g % gpus_per_host))
    has_id = v >= (2, 16, 0)

    def ptr(g: int, k: int) -> str:
        return f"0x55b07c{(0x1e9f30 + 0x1000 * k + 0x40 * g):06x}"

    world = Comm("world", list(range(nranks)), 0x5D2E9A0C4471B3F8 if has_id else None,
                 {g: ptr(g, 0) for g in range(nranks)})
    subs = []
    for color in (0, 1):
        members = [g for g in range(nranks) if g % 2 == color]
        cid = (0x1111000000000000 + color) if has_id else None
        c = Comm(f"sub{color}", members, cid, {g: ptr(g, 1) for g in members}, parent=world, color=color,
                 split_count=1)
        if v >= (2, 27, 0):
            c.comm_id = None
        subs.append(c)
    again = []
    for color in (0, 1):  # same pointers, after the subs are destroyed
        members = [g for g in range(nranks) if g % 2 == color]
        cid = (0x2222000000000000 + color) if has_id else None
        c = Comm(f"again{color}", members, cid, {g: ptr(g, 1) for g in members}, parent=world, color=color,
                 split_count=2)
        if v >= (2, 27, 0):
            c.comm_id = None
        again.append(c)
    comms = [world, *subs, *again]
    # pg truth
    for c in comms:
        if c.comm_id is not None:
            c.pg = f"0x{c.comm_id:x}"
        elif v >= (2, 27, 0) and c.parent is not None:
            c.pg = split_comm_id(c.parent.pg or "", c.split_count or 0, c.color or 0)
        else:
            c.pg = None
    if not has_id:  # synthetic ids: k-th comm of that size in the process
        world.pg = f"synthetic-n{nranks}-0"
        for c in subs:
            c.pg = f"synthetic-n{len(c.members)}-0"
        for c in again:
            c.pg = f"synthetic-n{len(c.members)}-1"
    bf16 = 9 if v >= (2, 10, 0) else 6
    steps: list[Step] = []

    def same(comm: Comm, entries: list[Entry], tuned: bool = True) -> Step:
        return Step(comm, {g: list(entries) for g in comm.members}, tuned)

    n = nranks
    steps.append(same(world, [Entry("AllReduce", 1048576, 7)]))
    steps.append(same(world, [Entry("AllReduce", 262144, bf16), Entry("AllReduce", 1000, 7, redop=2)]))
    steps.append(same(world, [Entry("AllGather", 4096, bf16)]))
    steps.append(same(world, [Entry("ReduceScatter", 8192, 6)]))
    steps.append(same(world, [Entry("Broadcast", 100, 4, root=1)]))
    steps.append(same(world, [Entry("Reduce", 77, 8, root=2)]))
    for s in subs:
        steps.append(same(s, [Entry("AllReduce", 2048, 7)]))
        steps.append(same(s, [Entry("Broadcast", 5000, 1, root=1)]))
    # p2p ring shift: each rank sends to the next and receives from the previous
    steps.append(Step(world, {g: [Entry("Send", 512, 0, root=(g + 1) % n),
                                  Entry("Recv", 512, 0, root=(g - 1) % n)] for g in range(n)}, tuned=False))
    if v >= (2, 24, 0):
        steps.append(same(world, [Entry("AllReduce", 3000, 10), Entry("AllReduce", 3000, 11)]))
    else:
        steps.append(same(world, [Entry("AllReduce", 3000, 2), Entry("AllReduce", 3000, 3)]))
    steps.append(same(world, [Entry("AllGather", 10, 5), Entry("Broadcast", 20, 0, root=0)]))
    if v >= (2, 28, 0):
        steps.append(same(world, [Entry("AlltoAll", 64, 7)]))
        steps.append(same(world, [Entry("Gather", 32, 7, root=0)]))
        steps.append(same(world, [Entry("Scatter", 16, 7, root=3 % n)]))
    for s in again:
        steps.append(same(s, [Entry("AllReduce", 4096, bf16)]))
    steps.append(same(world, [Entry("AllReduce", 1, 7)]))
    job = Job(version, procs, comms, steps, network=network,
              lazy_comm="sub1" if v >= (2, 21, 0) else None)
    return job


# ---------------------------------------------------------------------------------------------------
# rendering


@dataclass
class Line:
    g: int | None  # process (None: bare line)
    body: str
    level: str = "INFO"
    loc: str | None = None
    blank_before: bool = False


def _init_line(job: Job, c: Comm, g: int, what: str) -> str:
    v = job.v
    p = job.procs[g]
    r, n, ptr = c.rank_of(g), len(c.members), c.ptrs[g]
    if v < (2, 5, 0):
        return f"comm {ptr} rank {r} nranks {n} cudaDev {p.dev} nvmlDev {p.nvml} - Init COMPLETE"
    if v < (2, 16, 0):
        return f"comm {ptr} rank {r} nranks {n} cudaDev {p.dev} busId {p.bus} - Init COMPLETE"
    idtxt = f" commId 0x{c.comm_id:x}" if c.comm_id is not None else ""
    if v < (2, 18, 3):
        return f"comm {ptr} rank {r} nranks {n} cudaDev {p.dev} busId {p.bus}{idtxt} - Init COMPLETE"
    core = f"comm {ptr} rank {r} nranks {n} cudaDev {p.dev} nvmlDev {p.nvml} busId {p.bus}"
    if v < (2, 21, 0):
        return f"{core}{idtxt} - {what}"
    split = c.parent is not None
    api = "ncclCommSplit" if split else "ncclCommInitRank"
    if split and v >= (2, 27, 0):
        cnt = "childCount" if v >= (2, 29, 0) else "splitCount"
        tail = (f" parent {c.parent.ptrs[g]} {cnt} {c.split_count} color {c.color} key {g}")
        sep = "" if what == "Init START" else " "
        pre = f"[Rank {r}] " if what == "Init START" and v >= (2, 29, 0) else ""
        return f"{pre}{api} {core}{tail}{sep}- {what}"
    tail = f" parent {c.parent.ptrs[g]} color {c.color} key {g}" if split else ""
    return f"{api} {core}{tail}{idtxt} - {what}"


def _dest_line(job: Job, c: Comm, g: int) -> str:
    p = job.procs[g]
    r, n = c.rank_of(g), len(c.members)
    if job.v >= (2, 27, 0):
        return (f"comm {c.ptrs[g]} rank {r} nranks {n} cudaDev {p.dev} busId {p.bus} commId {c.pg} "
                "- Destroy COMPLETE")
    return f"comm {c.ptrs[g]} rank {r} nRanks {n} cudaDev {p.dev} busId {p.bus} - Destroy COMPLETE"


def _via(job: Job, p: Proc, q: Proc, sub: bool) -> tuple[str, str]:
    """(transport family, via text) from p to q in this era."""
    v = job.v
    if p.host != q.host:
        net = job.network
        if v < (2, 5, 0):
            return f"NET/{net}", f"NET/{net}/0"
        return f"NET/{net}", f"NET/{net}/{p.dev}/GDRDMA" if net == "IB" else f"NET/{net}/{p.dev}"
    if sub and v >= (2, 14, 0):
        return "SHM", "SHM/direct/direct"
    if sub and v >= (2, 7, 0):
        return "SHM", "direct shared memory"
    if v < (2, 7, 0):
        return "P2P", "P2P/IPC"
    if v >= (2, 19, 0):
        return "P2P", "P2P/CUMEM/read"
    return "P2P", "P2P/IPC/read"


def _bracket(job: Job, p: Proc) -> str:
    v = job.v
    if v < (2, 5, 0):
        return f"[{p.dev}]"
    if v < (2, 18, 3):
        return f"[{p.bus}]"
    return f"[{p.nvml}]"


def _conn_lines(job: Job, c: Comm, g: int) -> list[str]:
    """Transport lines of process g for comm c: its send to the ring successor on 2 channels, and
    the receive half of NET connections from its predecessor."""
    v = job.v
    out = []
    n = len(c.members)
    r = c.rank_of(g)
    nxt, prv = c.members[(r + 1) % n], c.members[(r - 1) % n]
    p, q, o = job.procs[g], job.procs[nxt], job.procs[prv]
    sub = c.parent is not None
    for ch in range(2):
        fam, via = _via(job, p, q, sub)
        # the connection index: on NET lines from 2.12, on P2P lines from 2.14, never on SHM lines
        if v < (2, 7, 0):
            head = f"Ring {ch:02d}"
        elif fam == "SHM" or v < ((2, 12, 0) if fam.startswith("NET") else (2, 14, 0)):
            head = f"Channel {ch:02d}"
        else:
            head = f"Channel {ch:02d}/0"
        sb = _bracket(job, p) if not (v < (2, 5, 0) and fam.startswith("NET")) else ""
        db = _bracket(job, q) if not (v < (2, 5, 0) and fam.startswith("NET")) else ""
        d = " [send]" if fam.startswith("NET") else ""
        out.append(f"{head} : {r}{sb} -> {(r + 1) % n}{db}{d} via {via}")
        fam2, via2 = _via(job, o, p, sub)
        if fam2.startswith("NET"):
            head = (f"Ring {ch:02d}" if v < (2, 7, 0) else f"Channel {ch:02d}" if v < (2, 12, 0)
                    else f"Channel {ch:02d}/0")
            sb = _bracket(job, o) if v >= (2, 5, 0) else ""
            db = _bracket(job, p) if v >= (2, 5, 0) else ""
            out.append(f"{head} : {(r - 1) % n}{sb} -> {r}{db} [receive] via {via2}")
    return out


def _ring_lines(job: Job, c: Comm) -> list[str]:
    order = "".join(f" {i:3d}" for i in range(len(c.members)))
    if job.v < (2, 7, 0):
        return [f"Ring {ch:02d} :{order}" for ch in range(2)]
    return [f"Channel {ch:02d}/02 :{order}" for ch in range(2)]


def expected_topology(job: Job, procs: list[int] | None = None) -> list[tuple]:
    """(comm pg, rank, nranks, channel, peer, direction, family, detail, host) rows."""
    rows = []
    for c in job.comms:
        for g in c.members:
            if procs is not None and g not in procs:
                continue
            n, r = len(c.members), c.rank_of(g)
            nxt, prv = c.members[(r + 1) % n], c.members[(r - 1) % n]
            p = job.procs[g]
            for ch in range(2):
                fam, via = _via(job, p, job.procs[nxt], c.parent is not None)
                rows.append((c.pg, r, n, ch, (r + 1) % n, "send" if fam.startswith("NET") else None, fam, via,
                             p.host))
                fam2, via2 = _via(job, job.procs[prv], p, c.parent is not None)
                if fam2.startswith("NET"):
                    rows.append((c.pg, r, n, ch, (r - 1) % n, "receive", fam2, via2, p.host))
    return sorted(rows, key=lambda t: tuple("" if x is None else str(x) for x in t))


def _tuning_line(job: Job, e: Entry, n: int) -> str | None:
    v = job.v
    nbytes = S(e.op, e.count, e.dtype, n)
    a, p = choose(e.op, nbytes)
    if v < (2, 20, 0):
        return None
    if v < (2, 23, 0):
        return f"{nbytes:10d} Bytes -> Algo {a} proto {p} time {nbytes / 1e4 + 5:.6f}"
    if v < (2, 24, 0):
        return f"{e.op}: {nbytes} Bytes -> Algo {a} proto {p} time {nbytes / 1e4 + 5:.6f}"
    return (f"{e.op}: {e.count * _size(e.dtype)} Bytes -> Algo {NCCL_ALGO_STR[a]} proto {NCCL_PROTO_STR[p]} "
            "channel{Lo..Hi}={0..1}")


def _coll_line(job: Job, c: Comm, g: int, e: Entry, opcount: int, k: int) -> str:
    v = job.v
    buf = 0x7F2D10000000 + 0x1000000 * k
    send, recv = f"0x{buf:x}", f"0x{buf + 0x800000:x}"
    if e.op == "AllReduce" and k % 3 == 0:
        recv = send  # in place
    if e.op == "Recv" or (e.op == "Send" and v >= (2, 12, 0)):
        send = "(nil)"
        recv = f"0x{buf:x}"
    root = e.root if e.op in ("Broadcast", "Reduce", "Send", "Recv", "Gather", "Scatter") else 0
    return (f"{e.op}: opCount {opcount:x} sendbuff {send} recvbuff {recv} count {e.count} datatype {e.dtype} "
            f"op {e.redop} root {root} comm {c.ptrs[g]} [nranks={len(c.members)}] "
            f"stream 0x55b07a2c{0x4e10 + 0x100 * job.procs[g].dev:04x}")


def process_lines(job: Job, g: int, *, warn: bool = True) -> list[Line]:
    """Everything process g logs, in order."""
    v = job.v
    p = job.procs[g]
    out: list[Line] = []

    def add(body: str, **kw) -> None:
        out.append(Line(g, body, **kw))

    if v >= (2, 23, 0):
        add(f"NCCL version {job.version}+cuda12.4")
    elif g == 0:
        out.append(Line(None, f"NCCL version {job.version}+cuda12.4"))
    add(f"NET/{job.network} : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE ; OOB eth0:{p.ip}<0>"
        if job.network == "IB" else f"NET/Socket : Using [0]eth0:{p.ip}<0>")
    add(f"Using network {job.network}")
    opcount: dict[str, int] = {}
    calls_done: dict[str, int] = {}

    def init(c: Comm) -> None:
        if g not in c.members:
            return
        start = v >= (2, 18, 3)
        if start:
            add(_init_line(job, c, g, "Init START"))
        if v >= (2, 20, 0):
            add(f"comm {c.ptrs[g]} rank {c.rank_of(g)} nRanks {len(c.members)} nNodes "
                f"{len({job.procs[m].host for m in c.members})} localRanks "
                f"{sum(job.procs[m].host == p.host for m in c.members)} localRank "
                f"{[m for m in c.members if job.procs[m].host == p.host].index(g)} MNNVL 0")
        if c.rank_of(g) == 0:
            for body in _ring_lines(job, c):
                add(body)
        if v >= (2, 7, 0):
            n = len(c.members)
            r = c.rank_of(g)
            if v >= (2, 19, 0):  # per-rank ring neighbours and trees (GRAPH), the same trees as below
                for ch in range(2):
                    add(f"Ring {ch:02d} : {(r - 1) % n} -> {r} -> {(r + 1) % n}")
                add(f"Tree 0 : {(r - 1) if r else -1} -> {r} -> {(r + 1) % n if r == 0 else -1}/-1/-1")
                add(f"Tree 1 : {(r + 1) % n} -> {r} -> -1/-1/-1")
            add(f"Trees [0] {(r + 1) % n if r == 0 else -1}/-1/-1->{r}->{(r - 1) if r else -1} "
                f"[1] -1/-1/-1->{r}->{(r + 1) % n}")
            if v >= (2, 19, 0):
                add("P2P Chunksize set to 131072")
        if c.name != job.lazy_comm and c.name != "again1":
            for body in _conn_lines(job, c, g):
                add(body)
        if v >= (2, 20, 0):
            add("2 coll channels, 2 collnet channels, 0 nvls channels, 2 p2p channels, "
                "2 p2p channels per peer")
        add(_init_line(job, c, g, "Init COMPLETE"))
        opcount[c.name] = 0
        calls_done[c.name] = 0

    for c in job.comms[:3]:
        init(c)
    again_done = False
    k = 0
    for st in job.steps:
        c = st.comm
        if c.name.startswith("again") and not again_done:
            for old in job.comms[1:3]:
                if g in old.members and v >= (2, 5, 0):
                    add(_dest_line(job, old, g))
            for nc in job.comms[3:5]:
                init(nc)
            again_done = True
        if g not in c.members:
            continue
        entries = st.entries[g]
        n = len(c.members)
        for e in entries:
            if v < (2, 8, 0):
                oc = opcount[c.name]
                opcount[c.name] += 1
            elif v < (2, 9, 0):
                oc = 0
            else:
                oc = opcount[c.name]
            add(_coll_line(job, c, g, e, oc, k))
            k += 1
        if v >= (2, 9, 0):
            opcount[c.name] += 1
        first = calls_done[c.name] == 0
        calls_done[c.name] += len(entries)
        if first and c.name in (job.lazy_comm, "again1"):
            for body in _conn_lines(job, c, g):
                add(body)
        if st.tuned and c.rank_of(g) == 0:
            for e in entries:
                t = _tuning_line(job, e, n)
                if t:
                    add(t)
    if warn and g == 1:
        fn = " (ncclIbCompletion)" if v >= (2, 30, 7) else ""
        add(f"NET/IB : Got completion from peer {job.procs[0].ip}<45678> with error 12, opcode 0, len 0, "
            "vendor err 129 (Recv)", level="WARN", loc=f"transport/net_ib.cc:1102{fn}", blank_before=True)
        add("transport/net.cc:1034 -> 6")
    return out


def _anchor(job: Job, line: Line) -> str:
    p = job.procs[line.g]
    if line.level == "WARN":
        return f"{p.host}:{p.pid}:{p.pid} [{p.dev}] {line.loc} NCCL WARN "
    return f"{p.host}:{p.pid}:{p.pid} [{p.dev}] NCCL INFO "


def launcher_prefix(job: Job, g: int, launcher: str | None) -> str:
    p = job.procs[g]
    return {
        None: "", "torchrun": f"[default{g}]:", "openmpi": f"[1,{g}]<stdout>:", "srun": f"{g}: ",
        "pdsh": f"{p.ip}: ", "ray": f"(TrainWorker pid={p.pid}, ip={p.ip}) ", "quote": "> ",
        "wrapper": f"[{g}] ",
    }[launcher]


def render(job: Job, *, launcher: str | None = None, timestamps: str | None = None,
           procs: list[int] | None = None, interleave: bool = True, widows: int = 0, seed: int = 0,
           garbage: float = 0.0, ray_repeat: bool = False, warn: bool = True) -> str:
    """The log text. ``timestamps``: None (the era's default: WARN lines only from 2.26), ``"all"``
    (``NCCL_DEBUG_TIMESTAMP_LEVELS=ALL``) or ``"none"``. ``interleave``: merge processes in random
    chunks (else one process after the other). ``widows``: that many COLL/transport lines are split
    into a widowed prefix (followed by another process's line) and an orphan body on the next line
    (needs no launcher prefix: only processes sharing one pipe interleave like this). ``garbage``:
    fraction of extra non-NCCL lines."""
    rng = random.Random(seed)
    procs = list(range(len(job.procs))) if procs is None else procs
    streams = [process_lines(job, g, warn=warn) for g in procs]
    merged: list[Line] = []
    if interleave:
        pos = [0] * len(streams)
        while any(pos[i] < len(s) for i, s in enumerate(streams)):
            i = rng.choice([i for i, s in enumerate(streams) if pos[i] < len(s)])
            take = rng.randint(1, 4)
            merged.extend(streams[i][pos[i]:pos[i] + take])
            pos[i] += take
    else:
        for s in streams:
            merged.extend(s)
    v = job.v
    ts_all = timestamps == "all"
    ts_warn = timestamps is None and v >= (2, 26, 0)
    out: list[str] = []
    clock = 0

    def ts(line: Line) -> str:
        nonlocal clock
        clock += 1
        if (ts_all or (ts_warn and line.level == "WARN")) and line.g is not None:
            return f"[2025-03-01 12:{clock // 600 % 60:02d}:{clock // 10 % 60:02d}] "
        return ""

    def full(line: Line) -> str:
        if line.g is None:
            return line.body
        return launcher_prefix(job, line.g, launcher) + ts(line) + _anchor(job, line) + line.body

    split_at = set()
    if widows:
        cands = [i for i in range(len(merged) - 1)
                 if merged[i].g is not None and merged[i + 1].g is not None and merged[i + 1].g != merged[i].g
                 and (" opCount " in merged[i].body or " via " in merged[i].body)
                 and merged[i].level == "INFO" and merged[i + 1].level == "INFO"]
        rng.shuffle(cands)
        for i in sorted(cands):
            if len(split_at) >= widows:
                break
            if i - 1 not in split_at and i + 1 not in split_at:
                split_at.add(i)
    i = 0
    repeated_done = False
    while i < len(merged):
        line = merged[i]
        if line.blank_before:
            out.append("")
        if i in split_at:
            nxt = merged[i + 1]
            anchor_a = ts(line) + _anchor(job, line)
            out.append(anchor_a + full(nxt))
            out.append(line.body)
            i += 2
            continue
        text = full(line)
        if ray_repeat and launcher == "ray" and not repeated_done and " opCount " in line.body:
            text += " [repeated 3x across cluster]"
            repeated_done = True
        out.append(text)
        i += 1
    if garbage:
        n_garbage = int(len(out) * garbage / (1 - garbage))
        for _ in range(n_garbage):
            k = rng.randrange(len(out) + 1)
            out.insert(k, garbage_line(rng))
    return "\n".join(out) + "\n"


def garbage_line(rng: random.Random) -> str:
    """A line of training-script output or noise: never an NCCL anchor, COLL, Init or transport body."""
    kind = rng.randrange(4)
    if kind == 0:
        return f"Epoch {rng.randrange(100)} step {rng.randrange(10000)} loss {rng.random():.4f}"
    if kind == 1:
        alphabet = "abcdefghij KLMNOP0123456789-_=+,.;'"
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(5, 120)))
    if kind == 2:
        return f"Traceback (most recent call last): File \"train.py\", line {rng.randrange(999)}"
    return "x" * rng.randrange(1, 50) + " NCCL is great " + str(rng.random())


def write(path: Path, text: str, *, gz: bool = False) -> Path:
    data = text.encode()
    if gz:
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


# ---------------------------------------------------------------------------------------------------
# truth


def expected_collectives(job: Job, procs: list[int] | None = None, *,
                         peers_global: bool = True) -> list[tuple]:
    """Sorted (rank, pg, seq, op, dtype, count, bytes, nranks, peer, algorithm, protocol) rows.

    ``peers_global``: the peer of a call on a non-world comm is a global rank (the member's Init line is
    in the log), else the rank in the comm."""
    ops = {"AllReduce": "allreduce", "AllGather": "allgather", "ReduceScatter": "reduce_scatter",
           "Broadcast": "broadcast", "Reduce": "reduce", "Send": "send", "Recv": "recv",
           "AlltoAll": "all_to_all", "Gather": "gather", "Scatter": "scatter"}
    v = job.v
    rows = []
    procs = list(range(len(job.procs))) if procs is None else procs
    for g in procs:
        seq: dict[str, int] = {}
        for st in job.steps:
            c = st.comm
            if g not in c.members:
                continue
            n = len(c.members)
            for e in st.entries[g]:
                s = seq.get(c.name, 0)
                seq[c.name] = s + 1
                nbytes = S(e.op, e.count, e.dtype, n)
                peer = None
                if e.op in ("Broadcast", "Reduce", "Send", "Recv", "Gather", "Scatter"):
                    # before 2.16 the two sub comms share a synthetic id: their members are ambiguous;
                    # otherwise the peer's global rank is known when its Init line is in the log
                    known = c.name == "world" or (
                        v >= (2, 16, 0) and (peers_global or c.members[e.root] in procs))
                    peer = c.members[e.root] if known else e.root
                algo = proto = None
                if st.tuned and v >= (2, 20, 0) and c.members[0] in procs:
                    a, p = choose(e.op, nbytes)
                    algo, proto = ALGO_NAMES[a], PROTO_NAMES[p]
                rows.append((g, c.pg, s, ops[e.op], DTYPES[e.dtype][0], e.count, nbytes, n, peer,
                             algo, proto))
    return sorted(rows, key=_key)


def _key(t: tuple) -> tuple:
    return tuple("" if x is None else (f"{x:012d}" if isinstance(x, int) else str(x)) for x in t)
