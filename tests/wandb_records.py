"""Read back what W&B wrote offline (``run-<id>.wandb``): its records, as the tests check them.

The file is W&B's header (7 bytes) then a LevelDB-style log: 32 KiB blocks of records, each a 7-byte header (CRC32C,
length, type: 1 full, 2 first, 3 middle, 4 last piece) and its bytes; a record is a ``wandb_internal_pb2.Record``.
The wandb package ships the message classes but no reader for the file."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
HEADER = 7


def records(path: Path) -> list[Any]:
    """Every record of a ``.wandb`` file, in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    out, piece, pos = [], b"", HEADER
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # the block's tail is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        pos += HEADER
        if kind == 0 and length == 0:
            pos += left - HEADER
            continue
        if pos + length > len(data):  # still being written
            break
        chunk, pos = data[pos:pos + length], pos + length
        if kind in (1, 2):
            piece = chunk
        else:
            piece += chunk
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(piece)
            out.append(rec)
    return out


def finished(path: Path, timeout: float = 60) -> list[Any]:
    """The records of a run file once its ``exit`` record is written (W&B's service process may still be writing
    when ``run.finish()`` returns)."""
    deadline = time.monotonic() + timeout
    while True:
        recs = records(path)
        if any(r.WhichOneof("record_type") == "exit" for r in recs) or time.monotonic() > deadline:
            return recs
        time.sleep(0.1)


def summary_and_history(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The run's summary (last value of each key) and its history rows, values decoded from JSON (nested keys joined
    with ``/``, as W&B names them)."""
    summary: dict[str, Any] = {}
    history: list[dict[str, Any]] = []
    for rec in finished(path):
        kind = rec.WhichOneof("record_type")
        if kind == "summary":
            for item in rec.summary.update:
                summary[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        elif kind == "history":
            history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
    return summary, history
