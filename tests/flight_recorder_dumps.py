"""Synthetic Flight Recorder dumps of NCCL jobs, **completed from the format in PyTorch's source** (the ``dump()`` /
``dump_json()`` of ``NCCLUtils.hpp``/``TraceUtils.h`` (1.x) and ``FlightRecorder.hpp`` (2.x): the keys of each schema
version, NCCL's states ``scheduled``/``started``/``completed`` with their discovered times, ``pg_config`` by group
name with ranks as text). The CPU machine this project records on has no NCCL: these stand in for what a GPU job's
watchdog writes, and only for what the recorded gloo dumps (``tests/data/flight_recorder``) cannot show.

:func:`job` makes every rank's dump of a data-parallel job: ``steps`` all_reduces on the default group, then at
the last one the ``fault``: ``stopped`` (the ``culprit`` never enqueues it; the others have it ``started``),
``inside`` (every rank started it and none completed it), ``not-started`` (every rank enqueued it; the culprit's
GPU never started it, the others' did), ``queued`` (every rank enqueued it, no GPU started it) or ``None``.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

T0 = 1_700_000_000_000_000_000
FRAMES = [{"name": "all_reduce", "filename": "/opt/torch/distributed/distributed_c10d.py", "line": 2501},
          {"name": "train_step", "filename": "/job/train.py", "line": 88},
          {"name": "<module>", "filename": "/job/train.py", "line": 120}]


def _entry(version: str, rank: int, seq: int, state: str, world: int, numel: int = 1024) -> dict[str, Any]:
    major = int(version.split(".")[0])
    minor = int(version.split(".")[1])
    created = T0 + seq * 10_000_000 + rank * 1000
    e: dict[str, Any] = {"pg_id": 0, "profiling_name": "nccl:all_reduce", "time_created_ns": created,
                         "input_sizes": [[numel]], "output_sizes": [[numel]], "state": state,
                         "time_discovered_started_ns": created + 1000 if state != "scheduled" else None,
                         "time_discovered_completed_ns": created + 5000 if state == "completed" else None,
                         "retired": state == "completed", "frames": FRAMES}
    if state == "completed":
        e["duration_ms"] = 0.004
    if major == 1:
        e["seq_id"] = seq
        if minor >= 2:
            e.update(record_id=seq - 1, op_id=seq)
        return e
    e.update(record_id=seq - 1, process_group=("0", "default_pg"), collective_seq_id=seq, p2p_seq_id=0, op_id=seq,
             input_dtypes=["Float"], output_dtypes=["Float"], timeout_ms=600000, is_p2p=False)
    if (major, minor) >= (2, 10):
        e.update(thread_id="140001", thread_name="pt_main_thread")
    return e


def job(version: str = "2.10", world: int = 4, steps: int = 6, fault: str | None = "stopped",
        culprit: int = 2) -> dict[int, dict[str, Any]]:
    """Each rank's dump (a dict as PyTorch pickles it) of ``steps`` all_reduces with ``fault`` at the last."""
    major, minor = (int(x) for x in version.split("."))
    out = {}
    for rank in range(world):
        entries = []
        for seq in range(1, steps + 1):
            last = seq == steps
            if last and fault == "stopped" and rank == culprit:
                break
            state = ("completed" if not last or fault is None else
                     "scheduled" if fault == "queued" or (fault == "not-started" and rank == culprit) else "started")
            entries.append(_entry(version, rank, seq, state, world))
        dump: dict[str, Any] = {"entries": entries, "version": version}
        if (major, minor) >= (1, 2):
            dump["pg_config"] = ({0: list(range(world))} if major == 1 else
                                 {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))}})
        if (major, minor) >= (2, 3):
            done = max((e["collective_seq_id"] for e in entries if e["state"] == "completed"), default=-1)
            dump["pg_status"] = {"0": {"last_enqueued_collective": len(entries), "last_started_collective":
                                       len(entries), "last_completed_collective": done}}
        if (2, 7) <= (major, minor) < (2, 10):
            dump["nccl_version"] = "2.21.5"
        if (major, minor) >= (2, 10):
            dump["comm_lib_version"] = "2.21.5"
        out[rank] = dump
    return out


def as_json(dump: dict[str, Any]) -> bytes:
    """The JSON form of a dump: no frames, discovered times 0 for none, pg_status values as text."""
    d = json.loads(json.dumps({**dump, "entries": [{k: v for k, v in e.items() if k != "frames"}
                                                   for e in dump["entries"]]}))
    for e in d["entries"]:
        for k in ("time_discovered_started_ns", "time_discovered_completed_ns"):
            e[k] = e.get(k) or 0
    for st in d.get("pg_status", {}).values():
        for k in st:
            st[k] = str(st[k])
    d.setdefault("nccl_comm_state", {})
    return json.dumps(d, sort_keys=True).encode()


def write(dumps: dict[int, dict[str, Any]], directory: Path, form: str = "pickle") -> list[Path]:
    """Write each rank's dump as ``nccl_trace_rank_<rank>`` (PyTorch's default name), pickled (protocol 2, as torch
    writes it) or as JSON."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank, dump in dumps.items():
        p = directory / (f"nccl_trace_rank_{rank}" + (".json" if form == "json" else ""))
        p.write_bytes(pickle.dumps(dump, protocol=2) if form == "pickle" else as_json(dump))
        paths.append(p)
    return paths
