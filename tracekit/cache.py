"""The parse cache: each input file's tables as Arrow IPC files, memory-mapped on reopen.

An entry is keyed by the input's absolute path, size, mtime and the parser's version, so any change
to the file or the parser misses. Entries are written to a temporary directory and renamed into
place, so a crash never leaves a half-written entry; a corrupt or stale entry is ignored and rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa

from tracekit.diagnostics import Diagnostic
from tracekit.schema import ParsedFile

#: bump when the layout of an entry or the data model changes
CACHE_VERSION = "1"
_CORE_TABLES = ("events", "collectives", "topology")


def default_dir() -> Path:
    """``$TRACEKIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/tracekit``, else ``~/.cache/tracekit``."""
    if os.environ.get("TRACEKIT_CACHE_DIR"):
        return Path(os.environ["TRACEKIT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tracekit"


def entry_key(path: str, parser_version: str) -> str:
    """Cache key of an input file: changes whenever the file or the parser does."""
    st = os.stat(path)
    ident = "\0".join([os.path.abspath(path), str(st.st_size), str(st.st_mtime_ns), parser_version,
                       CACHE_VERSION])
    return hashlib.sha256(ident.encode()).hexdigest()[:32]


def _write_table(table: pa.Table, path: Path) -> str:
    """Write an uncompressed IPC file (mmap-able) and return a checksum of its bytes."""
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=1 << 20)
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def store(parsed: ParsedFile, entry: Path) -> None:
    """Write ``parsed`` as the cache entry directory ``entry`` (atomically)."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=entry.parent))
    try:
        tables = {"events": parsed.events, "collectives": parsed.collectives, "topology": parsed.topology,
                  **{f"extra.{k}": v for k, v in parsed.tables.items()}}
        sums = {name: _write_table(t, tmp / f"{name}.arrow") for name, t in tables.items()}
        manifest: dict[str, Any] = {
            "version": CACHE_VERSION, "path": parsed.path, "format": parsed.format, "meta": parsed.meta,
            "diagnostics": [d.__dict__ for d in parsed.diagnostics], "bytes_lost": parsed.bytes_lost,
            "complete": parsed.complete, "tables": sums,
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, default=str))
        if entry.exists():
            shutil.rmtree(entry, ignore_errors=True)
        os.replace(tmp, entry)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _read_table(path: Path) -> pa.Table:
    return pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()


def load(entry: Path) -> ParsedFile | None:
    """Reopen a cache entry (memory-mapped, zero-copy), or None if absent, stale or damaged."""
    manifest_path = entry / "manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("version") != CACHE_VERSION:
            return None
        tables = {}
        for name in manifest["tables"]:
            tables[name] = _read_table(entry / f"{name}.arrow")
    except (OSError, ValueError, KeyError, pa.ArrowInvalid):
        return None
    diags = [Diagnostic(**d) for d in manifest.get("diagnostics", [])]
    return ParsedFile(
        path=manifest["path"], format=manifest["format"], events=tables["events"],
        collectives=tables["collectives"], topology=tables["topology"],
        tables={k.removeprefix("extra."): v for k, v in tables.items() if k.startswith("extra.")},
        meta=manifest.get("meta", {}), diagnostics=diags, bytes_lost=manifest.get("bytes_lost", 0),
        complete=manifest.get("complete", True))
