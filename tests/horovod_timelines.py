"""Horovod timelines written by the test suite, with their truth, and a plain reference parser.

:func:`make_timeline` simulates what Horovod's coordinator writes for a few training iterations
(``horovod/common/timeline.cc`` byte for byte: key order, spacing, the ``},\\n`` of the <= 0.20.0 writer
and the one-line ``,{...}]`` layout of >= 0.20.1) and returns the file bytes together with the truth it
was built from: every op instance with its ticks, phases, dtype/shape/bytes and fusion group, and the
byte offset where each record ends (for cutting the file at every boundary).

:func:`reference` is an obviously-correct, per-record Python reading of a list of records (a stack per
pid). The tests compare the vectorised parser against it on every prefix of a timeline.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from typing import Any

DTYPE_SIZE = {"uint8": 1, "int8": 1, "uint16": 2, "int16": 2, "int32": 4, "int64": 8, "float16": 2,
              "float32": 4, "float64": 8, "bool": 1}
OPS = {"ALLREDUCE": "allreduce", "ALLGATHER": "allgather", "BROADCAST": "broadcast",
       "REDUCESCATTER": "reduce_scatter", "ALLTOALL": "all_to_all", "ADASUM": "adasum", "JOIN": "join",
       "BARRIER": "barrier"}


@dataclass
class Instance:
    """One op instance of one tensor, as the simulated job ran it (times in µs on the file's clock)."""

    pid: int
    tensor: str
    seq: int
    op: str  # raw top-level name, e.g. ALLREDUCE
    dtype: str
    shape: list[int]
    negotiate: tuple[int, int]
    ticks: list[tuple[int, int]]  # (rank, ts)
    op_span: tuple[int, int]
    phases: list[tuple[str, int, int]]
    response: int  # fused response id
    iteration: int

    @property
    def count(self) -> int:
        return math.prod(self.shape)

    @property
    def bytes(self) -> int | None:
        size = DTYPE_SIZE.get(self.dtype)
        return None if size is None else self.count * size

    @property
    def transfer(self) -> tuple[int, int] | None:
        spans = [(s, e) for n, s, e in self.phases if n.startswith(("NCCL_", "MPI_", "GLOO_", "CCL_"))]
        if not spans:
            return None
        return min(s for s, _ in spans), max(e for _, e in spans)


@dataclass
class Timeline:
    data: bytes
    records: list[dict[str, Any]]  # in file order, as Python values (names unescaped)
    ends: list[int]  # byte offset just after each record's closing brace
    starts: list[int]  # byte offset of each record's opening brace
    instances: list[Instance]
    cycles: list[int]
    epoch_us: int | None
    era: str
    ranks: int
    tensors: dict[int, str] = field(default_factory=dict)


def _record_text(r: dict[str, Any]) -> str:
    """A record exactly as Horovod's writer prints it (names not escaped)."""
    if r["ph"] == "M":
        if "start_time_since_epoch_in_micros" in r["args"]:
            return ('{"name": "process_name", "ph": "M", "pid": 0, '
                    '"args": {"start_time_since_epoch_in_micros":'
                    f'{r["args"]["start_time_since_epoch_in_micros"]}}}}}')
        if r["name"] == "process_sort_index":
            return (f'{{"name": "process_sort_index", "ph": "M", "pid": {r["pid"]}, "args": {{"sort_index": '
                    f'{r["args"]["sort_index"]}}}}}')
        name = r["args"]["name"]  # raw, as Horovod writes it
        return f'{{"name": "process_name", "ph": "M", "pid": {r["pid"]}, "args": {{"name": "{name}"}}}}'
    if r["ph"] == "i":
        return f'{{"ph": "i", "name": "{r["name"]}", "ts": {r["ts"]}, "s": "g"}}'
    s = f'{{"ph": "{r["ph"]}"'
    if r["ph"] != "E":
        s += f', "name": "{r["name"]}"'
    s += f', "ts": {r["ts"]}, "pid": {r["pid"]}'
    if r["ph"] == "X":
        s += f', "dur": {r.get("dur", 0)}'
    if "args" in r:
        s += f', "args": {{"dtype": "{r["args"]["dtype"]}", "shape": "{r["args"]["shape"]}"}}'
    return s + "}"


def _phases_for(op: str, backend: str) -> list[str]:
    if op in ("JOIN", "BARRIER"):
        return []
    if op == "ALLREDUCE":
        return ["QUEUE", "MEMCPY_IN_FUSION_BUFFER", f"{backend}_ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"]
    if op == "ALLGATHER":
        return ["ALLOCATE_OUTPUT", f"{backend}_ALLGATHER"]
    if op == "BROADCAST":
        return [f"{backend}_BCAST"]
    if op == "REDUCESCATTER":
        return ["QUEUE", f"{backend}_REDUCESCATTER"]
    if op == "ALLTOALL":
        return [f"{backend}_ALLTOALL"]
    return [f"{backend}_ALLREDUCE"]


def make_timeline(*, era: str = "new", iterations: int = 3, ranks: int = 2, tensors: list[str] | None = None,
                  ops: list[str] | None = None, dtypes: list[str] | None = None, fuse: int = 2,
                  cycles: bool = True, cache_hits: bool = True, interleave_seed: int | None = None,
                  backend: str = "NCCL", close: bool = True, epoch_us: int = 1719912345678901,
                  start_us: int = 1000, activity_gap: int = 3) -> Timeline:
    """Simulate ``iterations`` steps of a job reducing ``tensors`` and write its timeline.

    ``era``: ``"new"`` (>= 0.20.1 layout, epoch header) or ``"old"`` (<= 0.20.0, unterminated).
    ``fuse``: tensors per fused response. ``cache_hits``: iterations after the first negotiate without
    rank ticks (Horovod's response cache). ``interleave_seed``: merge the per-tensor record streams in a
    random order (per-tensor order kept), so the file is far from time order; None keeps time order.
    ``close``: for the new era, end with ``]`` as the writer does after every record.
    """
    rng = random.Random(1234)
    tensors = tensors or ["allreduce.fc1.weight", "allreduce.fc1.bias", "allreduce.fc2.weight",
                          "allreduce.fc2.bias", "allreduce.conv1.weight"]
    ops = ops or ["ALLREDUCE"] * len(tensors)
    dtypes = dtypes or ["float32", "float16", "float32", "int64", "float64"][: len(tensors)]
    dtypes = [dtypes[i % len(dtypes)] for i in range(len(tensors))]
    shapes = [[rng.randint(1, 64), rng.randint(1, 32)] if i % 3 else [rng.randint(1, 100)]
              for i in range(len(tensors))]
    pid_of = {t: i + 1 for i, t in enumerate(tensors)}

    # per-pid record streams with timestamps (µs)
    streams: dict[int, list[dict[str, Any]]] = {p: [] for p in pid_of.values()}
    instances: list[Instance] = []
    markers: list[dict[str, Any]] = []
    t = start_us
    response = 0
    seqs = dict.fromkeys(pid_of.values(), 0)
    for it in range(iterations):
        if cycles:
            markers.append({"ph": "i", "name": "CYCLE_START", "ts": t - 1})
        neg: dict[int, tuple[int, int, list[tuple[int, int]]]] = {}
        order = list(range(len(tensors)))
        for j in order:
            pid = j + 1
            b = t + 2 * j
            ticks: list[tuple[int, int]] = []
            if not (cache_hits and it > 0):
                rank_order = list(range(ranks))
                rng.shuffle(rank_order)
                ticks = [(r, b + 1 + k * 5) for k, r in enumerate(rank_order)]
            e = (ticks[-1][1] + 2) if ticks else b + 3
            neg[pid] = (b, e, ticks)
        t = max(e for _, e, _ in neg.values()) + 10
        # responses: consecutive tensors with the same op fused, `fuse` at a time
        groups: list[list[int]] = []
        for j in order:
            fusable = ops[j] not in ("JOIN", "BARRIER")
            if groups and len(groups[-1]) < fuse and ops[groups[-1][0]] == ops[j] and fusable:
                groups[-1].append(j)
            else:
                groups.append([j])
        for grp in groups:
            op = ops[grp[0]]
            op_b = {j: t + k for k, j in enumerate(grp)}
            cur = t + len(grp) + activity_gap
            phase_spans: dict[int, list[tuple[str, int, int]]] = {j: [] for j in grp}
            for ph in _phases_for(op, backend):
                dur = 7 + 3 * len(grp)
                for k, j in enumerate(grp):
                    phase_spans[j].append((ph, cur + k, cur + dur + k))
                cur += dur + len(grp) + activity_gap
            op_e = {j: cur + k for k, j in enumerate(grp)}
            for j in grp:
                pid = j + 1
                b, e, ticks = neg[pid]
                inst = Instance(pid, tensors[j], seqs[pid], op, dtypes[j], shapes[j], (b, e), ticks,
                                (op_b[j], op_e[j]), phase_spans[j], response, it)
                seqs[pid] += 1
                instances.append(inst)
                s = streams[pid]
                s.append({"ph": "B", "name": f"NEGOTIATE_{op}", "ts": b, "pid": pid})
                for r, ts in ticks:
                    s.append({"ph": "X", "name": str(r), "ts": ts, "pid": pid, "dur": 0})
                s.append({"ph": "E", "ts": e, "pid": pid})
                s.append({"ph": "B", "name": op, "ts": op_b[j], "pid": pid})
                for name, ps, pe in phase_spans[j]:
                    s.append({"ph": "B", "name": name, "ts": ps, "pid": pid})
                    s.append({"ph": "E", "ts": pe, "pid": pid})
                s.append({"ph": "E", "ts": op_e[j], "pid": pid,
                          "args": {"dtype": dtypes[j], "shape": "[" + ", ".join(map(str, shapes[j])) + "]"}})
            response += 1
            t = cur + len(grp) + 50
        t += 500  # forward pass of the next iteration

    # merge streams into one file order
    if interleave_seed is None:
        pool = [r for s in streams.values() for r in s] + markers
        pool.sort(key=lambda r: (r["ts"], r.get("pid", 0)))
        # keep per-pid order exactly (equal ts within a pid keep their stream order)
        per = {p: iter(s) for p, s in streams.items()}
        merged = [r if "pid" not in r else next(per[r["pid"]]) for r in pool]
    else:
        rr = random.Random(interleave_seed)
        heads = {p: 0 for p in streams}
        merged = []
        mk = list(markers)
        while heads:
            if mk and rr.random() < 0.05:
                merged.append(mk.pop(0))
            p = rr.choice(sorted(heads))
            merged.append(streams[p][heads[p]])
            heads[p] += 1
            if heads[p] == len(streams[p]):
                del heads[p]
        merged.extend(mk)

    # add the tensor rows at first appearance, then lay out the bytes
    records: list[dict[str, Any]] = []
    if era == "new":
        records.append({"name": "process_name", "ph": "M", "pid": 0,
                        "args": {"start_time_since_epoch_in_micros": epoch_us}})
        records.append({"name": "process_sort_index", "ph": "M", "pid": 0, "args": {"sort_index": 0}})
    seen: set[int] = set()
    for r in merged:
        pid = r.get("pid")
        if pid is not None and pid not in seen:
            seen.add(pid)
            records.append({"name": "process_name", "ph": "M", "pid": pid,
                            "args": {"name": tensors[pid - 1]}})
            records.append({"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}})
        records.append(r)

    out = bytearray(b"[\n")
    starts: list[int] = []
    ends: list[int] = []
    for i, r in enumerate(records):
        text = _record_text(r).encode()
        if era == "old":
            starts.append(len(out))
            out += text
            ends.append(len(out))
            out += b",\n"
            continue
        if r["ph"] == "M":
            if i and records[i - 1]["ph"] != "M":
                out += b","
            starts.append(len(out))
            out += text
            ends.append(len(out))
            out += b",\n"
        else:
            if i and records[i - 1]["ph"] != "M":
                out += b","
            starts.append(len(out))
            out += text
            ends.append(len(out))
    if era == "new" and close:
        out += b"]"
    return Timeline(bytes(out), records, ends, starts, instances, [m["ts"] for m in markers],
                    epoch_us if era == "new" else None, era, ranks, {v: k for k, v in pid_of.items()})


# ---------------------------------------------------------------------------------------------------


@dataclass
class Reference:
    """What a timeline says, read record by record (times in ns on the file's clock incl. epoch)."""

    events: list[tuple[int, str, int, int, bool, int]]  # pid, name, start, end, truncated, instance
    instances: list[tuple[int, int, str | None]]  # pid, seq, top-level op name
    ticks: list[tuple[int, int | None, int, int]]  # pid, instance or None, rank, ts
    args: dict[int, tuple[str, str]]  # instance -> (dtype, shape)
    cycles: list[int]
    e_without_b: int
    x_without_b: int
    tensors: dict[int, str]


def reference(records: list[dict[str, Any]]) -> Reference:
    """The plain per-record reading of ``records`` (see the parser's docstring for the rules)."""
    epoch = 0
    for r in records:
        if r.get("ph") == "M" and "start_time_since_epoch_in_micros" in r.get("args", {}):
            epoch = r["args"]["start_time_since_epoch_in_micros"]
            break
    stacks: dict[int, list[tuple[str, int, int]]] = {}
    last0_neg: dict[int, bool] = {}
    cur: dict[int, int] = {}
    seqs: dict[int, int] = {}
    events: list[tuple[int, str, int, int, bool, int]] = []
    instances: list[tuple[int, int, str | None]] = []
    ticks: list[tuple[int, int | None, int, int]] = []
    args: dict[int, tuple[str, str]] = {}
    cycles: list[int] = []
    tensors: dict[int, str] = {}
    e_wo = x_wo = 0
    max_ts = None
    for r in records:
        ph = r.get("ph")
        if ph == "M":
            if r.get("name") == "process_name" and "name" in r.get("args", {}):
                tensors.setdefault(r["pid"], r["args"]["name"])
            continue
        if ph == "i":
            if r.get("name") == "CYCLE_START":
                cycles.append((epoch + r["ts"]) * 1000)
            continue
        pid, ts = r["pid"], (epoch + r["ts"]) * 1000
        max_ts = ts if max_ts is None else max(max_ts, ts)
        st = stacks.setdefault(pid, [])
        if ph == "B":
            name = r["name"]
            if not st:
                neg = name.startswith("NEGOTIATE_")
                if neg or not last0_neg.get(pid, False):
                    cur[pid] = len(instances)
                    instances.append((pid, seqs.get(pid, 0), None))
                    seqs[pid] = seqs.get(pid, 0) + 1
                last0_neg[pid] = neg
                if not neg:
                    p, s, _ = instances[cur[pid]]
                    instances[cur[pid]] = (p, s, name)
                inst = cur[pid]
            else:
                inst = st[0][2]
            st.append((name, ts, inst))
        elif ph == "E":
            if not st:
                e_wo += 1
                continue
            name, start, inst = st.pop()
            events.append((pid, name, start, ts, False, inst))
            if not st and not name.startswith("NEGOTIATE_") and "args" in r:
                args[inst] = (r["args"]["dtype"], r["args"]["shape"])
        elif ph == "X":
            if st and st[0][0].startswith("NEGOTIATE_"):
                ticks.append((pid, st[0][2], int(r["name"]), ts))
            else:
                x_wo += 1
                ticks.append((pid, None, int(r["name"]), ts))
    for pid, st in stacks.items():
        for name, start, inst in st:
            events.append((pid, name, start, max_ts, True, inst))
    return Reference(events, instances, ticks, args, cycles, e_wo, x_wo, tensors)


def loads_records(text: str) -> list[dict[str, Any]]:
    """Records of a timeline with well-formed JSON (closing an unterminated array first)."""
    s = text.strip()
    if not s.endswith("]"):
        s = s.rstrip().rstrip(",") + "]"
    return json.loads(s)
