"""Sniffing and reading one Flight Recorder dump (the package docstring is the format's contract)."""

from __future__ import annotations

import os
import pickle
import re
import struct
from collections import Counter
from typing import Any

import msgspec

from tracekit.model import schema
from tracekit.model.diagnostics import Diagnostic, TraceError
from tracekit.model.schema import ParsedFile

from ..source import iter_blocks
from . import tables, unpickle

FORMAT = "flight-recorder"
PARSER_VERSION = "1"
#: a dump bigger than this is not read (PyTorch's default buffer of 2 000 entries with stacks is a few MB)
MAX_BYTES = 1 << 30
_PICKLE_PROTOCOLS = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")
#: suffixes a dump's name may end in after its rank
_SUFFIXES = re.compile(r"(?:\.(?:json|pkl|pickle|pt|bin|gz|dump))+$", re.IGNORECASE)
_RANK = re.compile(r"(\d{1,9})$")


def sniff(head: bytes) -> bool:
    """A Flight Recorder dump: a pickled or JSON dict with the dump's keys (``entries`` with ``profiling_name``, or
    ``version`` with ``pg_config``); never a Kineto trace."""
    text = head.lstrip()
    if text[:2] in _PICKLE_PROTOCOLS:
        return (b"version" in head and (b"pg_config" in head or b"entries" in head)) or \
            (b"entries" in head and b"profiling_name" in head)
    if text.startswith(b"{") and b'"traceEvents"' not in head:
        return b'"entries"' in head and any(k in head for k in (b'"profiling_name"', b'"pg_config"', b'"pg_status"',
                                                                 b'"collective_seq_id"'))
    return False


def rank_from_name(path: str) -> int | None:
    """The rank PyTorch puts at the end of a dump's name (``<TORCH_FR_DUMP_TEMP_FILE><rank>``, ``...rank_3.json``)."""
    m = _RANK.search(_SUFFIXES.sub("", os.path.basename(path)))
    return int(m.group(1)) if m else None


def _read(path: str) -> bytes:
    """The whole (decompressed) file, within :data:`MAX_BYTES`."""
    parts, size = [], 0
    for _, block in iter_blocks(path):
        size += len(block)
        if size > MAX_BYTES:
            raise TraceError(path, f"a Flight Recorder dump of more than {MAX_BYTES >> 20} MiB: not read")
        parts.append(block)
    return b"".join(parts)


def _decode(path: str, data: bytes) -> tuple[dict[str, Any], str]:
    """The dump's top-level dict and its form (``pickle`` or ``json``)."""
    if data.lstrip()[:1] == b"{":
        try:  # bad UTF-8 is replaced, as in the other formats' names
            obj = msgspec.json.decode(data.decode("utf-8", "replace"))
        except (msgspec.DecodeError, RecursionError, MemoryError, ValueError) as exc:
            raise TraceError(path, f"not a readable Flight Recorder dump (JSON: {exc})") from None
        form = "json"
    else:
        try:
            obj = unpickle.loads(data)
        except unpickle.RefusedPickle as exc:
            raise TraceError(path, f"not a Flight Recorder dump: {exc}") from None
        except (pickle.UnpicklingError, EOFError, struct.error) as exc:
            what = "truncated" if isinstance(exc, EOFError | struct.error) or "truncated" in str(exc) or \
                "exhausted" in str(exc) else f"damaged ({str(exc)[:120]})"
            raise TraceError(path, f"the pickled Flight Recorder dump is {what}: nothing read") from None
        except Exception as exc:  # whatever the unpickler trips on in damaged bytes is damage
            raise TraceError(path, f"the pickled Flight Recorder dump is damaged ({type(exc).__name__}: "
                             f"{str(exc)[:120]}): nothing read") from None
        form = "pickle"
    if not isinstance(obj, dict):
        raise TraceError(path, f"not a Flight Recorder dump (its top level is a {type(obj).__name__}, not a dict)")
    return obj, form


def _backend(names: Any) -> str | None:
    """The backend the entries name most (``nccl:all_reduce`` → ``nccl``)."""
    counts = Counter(n.split(":", 1)[0] for n in names if isinstance(n, str) and ":" in n)
    return counts.most_common(1)[0][0] if counts else None


def parse(path: str) -> ParsedFile:
    """One dump → a :class:`ParsedFile` with the tables ``fr_dumps``, ``fr_entries``, ``fr_pg_config`` and
    ``fr_pg_status`` (no events, no collectives: the dump is read beside the traces, not as one)."""
    data = _read(path)
    if not data.strip():
        raise TraceError(path, "empty file")
    obj, form = _decode(path, data)
    rank = rank_from_name(path)
    r = tables._Reader(tables._Budget(path, len(data)))
    if "entries" not in obj and "version" not in obj:
        raise TraceError(path, "not a Flight Recorder dump (neither entries nor version in it)")
    version = r.text(obj.get("version"), "version")
    entries = tables.entries(obj.get("entries"), rank, path, r)
    config = tables.pg_config(obj.get("pg_config"), rank, path, r)
    status = tables.pg_status(obj.get("pg_status"), rank, path, r)
    listed = [x for ranks in config.column("ranks").to_pylist() if ranks for x in ranks]
    world_min = max(listed) + 1 if listed and max(listed) < (1 << 31) - 1 else None
    backend = _backend(entries.column("profiling_name").to_pylist())
    frames = entries.column("frames")
    dump = schema.table(schema.FR_DUMPS, {
        "path": [path], "rank": [rank], "form": [form], "version": [version], "backend": [backend],
        "comm_lib_version": [r.text(obj.get("comm_lib_version", obj.get("nccl_version")), "comm_lib_version")],
        "entries": [entries.num_rows], "with_stacks": [entries.num_rows > 0 and frames.null_count < len(frames)],
        "world_size_min": [world_min]})
    diags = []
    if rank is None:
        diags.append(Diagnostic(path, "no rank at the end of the dump's name (PyTorch names it <prefix><rank>): "
                                "its rank is given by the order of the inputs"))
    if r.bad:
        what = ", ".join(f"{n} ({k})" for n, k in sorted(r.bad.items()))
        diags.append(Diagnostic(path, f"values of the wrong type read as unknown: {what}"))
    if "entries" not in obj:
        diags.append(Diagnostic(path, "the dump has no entries (dumped with includeCollectives=False)", level="info"))
    meta = {"rank": rank, "format_version": version, "backend": backend, "form": form,
            "world_size": world_min}
    return ParsedFile(path=path, format=FORMAT, tables={"fr_dumps": dump, "fr_entries": entries,
                                                        "fr_pg_config": config, "fr_pg_status": status},
                      meta=meta, diagnostics=diags)
