"""A decoded Flight Recorder dump (plain dicts and lists, from the pickle or the JSON form) → the FR_* tables.

Every field is read by name with its type checked, so that every schema version reads (a field a version lacks is
null) and a damaged value is null and counted, never an exception. Work is bounded by the dump's size: a pickle can
repeat one reference many times (a list of a million references to one list of a million frames is a few bytes),
so every element read counts against a budget proportional to the file's bytes.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from tracekit.model import schema
from tracekit.model.diagnostics import TraceError
from tracekit.model.schema import normalise_op

from ..ints import int_in

INT64_MIN, INT64_END = -(1 << 63), 1 << 63
#: elements read per byte of the dump (and a floor): more means references repeated on purpose
BUDGET_PER_BYTE = 64
BUDGET_MIN = 1 << 20
_P2P = re.compile(r"(?:^|:)(?:send|recv)\b")
#: a group's members as 2.x writes them: ``[0, 1, 2]``
_RANKS_TEXT = re.compile(r"\s*\[\s*(?:\d{1,10}\s*(?:,\s*\d{1,10}\s*)*,?)?\s*\]\s*")


class _Budget:
    """Counts the elements read; past the limit the dump is refused (it repeats references to blow up)."""

    def __init__(self, path: str, nbytes: int) -> None:
        self.path = path
        self.left = max(BUDGET_MIN, BUDGET_PER_BYTE * nbytes)

    def take(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise TraceError(self.path, "the dump holds far more elements than its bytes can (references repeated "
                             "to blow it up): refused")


@dataclass
class _Reader:
    """Typed reads of one dump's values, counting the ones that are not what the format says."""

    budget: _Budget
    bad: Counter[str] = field(default_factory=Counter)
    #: text of each frame dict, by identity: the pickle shares one dict per distinct frame among the entries
    _frames: dict[int, tuple[Any, str]] = field(default_factory=dict)

    def int64(self, v: Any, name: str) -> int | None:
        if v is None:
            return None
        if isinstance(v, str) and re.fullmatch(r"-?\d{1,19}", v.strip()):  # the JSON form's pg_status
            v = int(v)
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        out = int_in(v, INT64_MIN, INT64_END)
        if out is None:
            self.bad[name] += 1
        return out

    def text(self, v: Any, name: str) -> str | None:
        if v is None or isinstance(v, str):
            return schema.clean_text(v)
        if isinstance(v, bytes | bytearray):
            return bytes(v).decode("utf-8", "replace")
        if isinstance(v, int) and not isinstance(v, bool):
            return str(v)
        self.bad[name] += 1
        return None

    def flag(self, v: Any, name: str) -> bool | None:
        if v is None or isinstance(v, bool):
            return v
        if isinstance(v, int) and v in (0, 1):
            return bool(v)
        if isinstance(v, str) and v.lower() in ("true", "false"):
            return v.lower() == "true"
        self.bad[name] += 1
        return None

    def sizes(self, v: Any, name: str) -> list[list[int]] | None:
        """A list of shapes (each a list of ints), or None."""
        if v is None:
            return None
        if not isinstance(v, list | tuple):
            self.bad[name] += 1
            return None
        self.budget.take(len(v))
        out = []
        for shape in v:
            if not isinstance(shape, list | tuple):
                self.bad[name] += 1
                return None
            self.budget.take(len(shape))
            dims = [int_in(d, INT64_MIN, INT64_END) for d in shape]
            if any(d is None for d in dims):
                self.bad[name] += 1
                return None
            out.append(dims)
        return out

    def names(self, v: Any, name: str) -> list[str] | None:
        if v is None:
            return None
        if not isinstance(v, list | tuple):
            self.bad[name] += 1
            return None
        self.budget.take(len(v))
        out = [self.text(x, name) for x in v]
        return None if any(x is None for x in out) else out  # type: ignore[return-value]

    def frames(self, v: Any) -> str | None:
        """The call stack as text, innermost first: ``function at file:line`` a line (PyTorch's ``fr_trace`` form)."""
        if v is None:
            return None
        if not isinstance(v, list | tuple):
            self.bad["frames"] += 1
            return None
        self.budget.take(len(v))
        lines = []
        for f in v:
            if not isinstance(f, dict):
                self.bad["frames"] += 1
                continue
            self.budget.take(3)
            known = self._frames.get(id(f))
            if known is None or known[0] is not f:
                known = (f, f"{self.text(f.get('name'), 'frames') or '?'} at "
                            f"{self.text(f.get('filename'), 'frames') or '?'}:{self.int64(f.get('line'), 'frames')}")
                self._frames[id(f)] = known
            lines.append(known[1])
        return "\n".join(lines) if lines else None


def _numel(sizes: list[list[int]] | None) -> int | None:
    """Elements over all tensors of ``sizes`` (None when unknown or beyond int64)."""
    if sizes is None:
        return None
    total = 0
    for shape in sizes:
        n = 1
        for d in shape:
            n *= d
            if abs(n) >= INT64_END:
                return None
        total += n
    return total if -INT64_END < total < INT64_END else None


def _ns_or_null(v: int | None) -> int | None:
    """A discovered time: the JSON form writes 0 where the pickle has None."""
    return v if v else None


def _ms_to_ns(v: Any) -> int | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or v != v or abs(v) > 9e12:
        return None
    return round(v * 1e6)


def entries(raw: Any, rank: int | None, path: str, r: _Reader) -> pa.Table:
    """FR_ENTRIES of a dump's ``entries`` (every version: 1.x ``seq_id``, 2.x ``collective_seq_id``...)."""
    if raw is None:
        return schema.empty(schema.FR_ENTRIES)
    if not isinstance(raw, list | tuple):
        raise TraceError(path, f"the dump's entries are a {type(raw).__name__}, not a list")
    r.budget.take(len(raw))
    cols: dict[str, list[Any]] = {n: [] for n in schema.FR_ENTRIES.names}
    for e in raw:
        if not isinstance(e, dict):
            r.bad["entries"] += 1
            continue
        r.budget.take(len(e))
        name = r.text(e.get("profiling_name"), "profiling_name")
        pg = e.get("process_group")
        pg_id = r.int64(e.get("pg_id"), "pg_id")
        if isinstance(pg, list | tuple) and len(pg) == 2:
            pg_name, pg_desc = r.text(pg[0], "process_group"), r.text(pg[1], "process_group")
        else:
            if pg is not None:
                r.bad["process_group"] += 1
            pg_name, pg_desc = (None if pg_id is None else str(pg_id)), None
        is_p2p = r.flag(e.get("is_p2p"), "is_p2p")
        if is_p2p is None and name is not None:
            is_p2p = bool(_P2P.search(name))
        coll_seq = r.int64(e.get("collective_seq_id"), "collective_seq_id")
        p2p_seq = r.int64(e.get("p2p_seq_id"), "p2p_seq_id")
        if "seq_id" in e and "collective_seq_id" not in e:  # 1.x: one counter for every call
            seq = r.int64(e.get("seq_id"), "seq_id")
            coll_seq, p2p_seq = (None, seq) if is_p2p else (seq, None)
        ins, outs = r.sizes(e.get("input_sizes"), "input_sizes"), r.sizes(e.get("output_sizes"), "output_sizes")
        row = {
            "rank": rank, "path": path, "record_id": r.int64(e.get("record_id"), "record_id"), "pg_id": pg_id,
            "pg": pg_name, "pg_desc": pg_desc, "collective_seq_id": coll_seq, "p2p_seq_id": p2p_seq,
            "op_id": r.int64(e.get("op_id"), "op_id"), "is_p2p": is_p2p, "profiling_name": name,
            "op": normalise_op(name.split(" ")[0]) if name else None,
            "input_sizes": ins, "output_sizes": outs,
            "input_dtypes": r.names(e.get("input_dtypes"), "input_dtypes"),
            "output_dtypes": r.names(e.get("output_dtypes"), "output_dtypes"),
            "input_numel": _numel(ins), "output_numel": _numel(outs),
            "state": r.text(e.get("state"), "state"),
            "time_created_ns": r.int64(e.get("time_created_ns"), "time_created_ns"),
            "time_started_ns": _ns_or_null(r.int64(e.get("time_discovered_started_ns"), "time_discovered_started_ns")),
            "time_completed_ns": _ns_or_null(r.int64(e.get("time_discovered_completed_ns"),
                                                     "time_discovered_completed_ns")),
            "duration_ns": _ms_to_ns(e.get("duration_ms")),
            "retired": r.flag(e.get("retired"), "retired"),
            "timeout_ns": _ms_to_ns(e.get("timeout_ms")),
            "thread_id": r.text(e.get("thread_id"), "thread_id"),
            "thread_name": r.text(e.get("thread_name"), "thread_name"),
            "frames": r.frames(e.get("frames")),
        }
        for k, v in row.items():
            cols[k].append(v)
    return schema.table(schema.FR_ENTRIES, cols)


def _member_list(v: Any, r: _Reader) -> tuple[list[int] | None, str | None]:
    """A group's members: 2.x writes them as text (``'[0, 1, 2]'``), 1.x as a list of ints."""
    text = v if isinstance(v, str) else None
    if isinstance(v, str):
        if not _RANKS_TEXT.fullmatch(v):
            r.bad["pg_config"] += 1
            return None, v[:200]
        v = [int(x) for x in re.findall(r"\d+", v)]
    if isinstance(v, list | tuple):
        r.budget.take(len(v))
        ranks = [int_in(x, 0) for x in v]
        if all(x is not None for x in ranks):
            return ranks, text if text is not None else str(list(v))  # type: ignore[return-value]
    r.bad["pg_config"] += 1
    return None, text


def pg_config(raw: Any, rank: int | None, path: str, r: _Reader) -> pa.Table:
    """FR_PG_CONFIG: ``{name: {name, desc, ranks}}`` (2.x) or ``{pg_id: [ranks]}`` (1.x)."""
    if not isinstance(raw, dict):
        if raw is not None:
            r.bad["pg_config"] += 1
        return schema.empty(schema.FR_PG_CONFIG)
    r.budget.take(len(raw))
    rows = []
    for key, info in raw.items():
        if isinstance(info, dict):
            members, text = _member_list(info.get("ranks"), r)
            name = r.text(info.get("name", key), "pg_config")
            rows.append({"pg": name, "pg_desc": r.text(info.get("desc"), "pg_config"), "ranks": members,
                         "ranks_text": text})
        else:
            members, text = _member_list(info, r)
            rows.append({"pg": r.text(key, "pg_config"), "pg_desc": None, "ranks": members, "ranks_text": text})
    return schema.table(schema.FR_PG_CONFIG, {"rank": [rank] * len(rows), "path": [path] * len(rows),
                                              **{k: [row[k] for row in rows] for k in rows[0]}} if rows else {})


def pg_status(raw: Any, rank: int | None, path: str, r: _Reader) -> pa.Table:
    """FR_PG_STATUS: ``{pg_id: {last_enqueued_collective, last_started_collective, last_completed_collective}}``."""
    if not isinstance(raw, dict):
        if raw is not None:
            r.bad["pg_status"] += 1
        return schema.empty(schema.FR_PG_STATUS)
    r.budget.take(len(raw))
    rows = []
    for key, info in raw.items():
        if not isinstance(info, dict):
            r.bad["pg_status"] += 1
            continue
        rows.append({"pg_id": r.text(key, "pg_status"),
                     "last_enqueued": r.int64(info.get("last_enqueued_collective"), "pg_status"),
                     "last_started": r.int64(info.get("last_started_collective"), "pg_status"),
                     "last_completed": r.int64(info.get("last_completed_collective"), "pg_status")})
    if not rows:
        return schema.empty(schema.FR_PG_STATUS)
    return schema.table(schema.FR_PG_STATUS, {"rank": [rank] * len(rows), "path": [path] * len(rows),
                                              **{k: [row[k] for row in rows] for k in rows[0]}})
