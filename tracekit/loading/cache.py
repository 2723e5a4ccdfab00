"""The parse cache: each input file's tables as Arrow IPC files, memory-mapped on reopen.

An entry is keyed by the input's absolute path, size, mtime and the parser's version, so any change
to the file or the parser misses. Entries are written to a temporary directory and renamed into
place (:mod:`tracekit.loading.atomic`), so a crash or a kill never leaves a half-written entry under the final
name: readers see the previous entry or the new one.

Every entry carries a version and checksums: the manifest records each table file's size and CRC-32
and a CRC-32 of itself. Reopening verifies all of them (CRC-32 through ISA-L runs at several GB/s, so a
300 MB trace's ~150 MB of tables cost ~20-40 ms of the 0.2 s reopen budget when the page cache is warm,
and one sequential read when it is cold); anything stale, truncated or corrupt is ignored and rebuilt.
``TRACEKIT_CACHE_VERIFY=size`` checks sizes and the manifest only (no file read at all) for caches on
slow network disks, at the cost of not noticing bit flips inside table files. Only Arrow IPC and JSON are
ever read back: nothing in a cache is evaluated or unpickled.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
from isal import isal_zlib

from tracekit.loading.atomic import data_dir, new_data_dir, publish_dir, sweep_stale
from tracekit.model.diagnostics import Diagnostic
from tracekit.model.schema import ParsedFile

#: bump when the layout of an entry or the data model changes
CACHE_VERSION = "2"


def os_error(exc: OSError) -> tuple[int | None, str]:
    """``(errno, reason in words)`` of an OSError, also of the ones pyarrow raises (errno only in the text:
    ``Error writing bytes to file. Detail: [errno 28] No space left on device``)."""
    code = exc.errno
    if code is None:
        m = re.search(r"\[errno (\d+)\]", str(exc))
        code = int(m.group(1)) if m else None
    return code, (os.strerror(code) if code else (exc.strerror or str(exc)))


def entries(root: Path) -> list[Path]:
    """The published entries under ``root`` (not the hidden data and temporary directories)."""
    try:
        return sorted(p for p in root.iterdir() if not p.name.startswith("."))
    except OSError:
        return []


def default_dir() -> Path:
    """``$TRACEKIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/tracekit``, else ``~/.cache/tracekit``."""
    if os.environ.get("TRACEKIT_CACHE_DIR"):
        return Path(os.environ["TRACEKIT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tracekit"


def entry_key(path: str, parser_version: str, st: os.stat_result | None = None) -> str:
    """Cache key of an input file: changes whenever the file or the parser does (``st``: the file's stat,
    when the caller took it before reading the file)."""
    st = st or os.stat(path)
    ident = "\0".join([os.path.abspath(path), str(st.st_size), str(st.st_mtime_ns), parser_version,
                       CACHE_VERSION])
    return hashlib.sha256(ident.encode()).hexdigest()[:32]


def file_crc32(path: str | os.PathLike) -> int:
    """CRC-32 of a file's bytes (ISA-L: several GB/s)."""
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            crc = isal_zlib.crc32(chunk, crc)
    return crc


def seal(manifest: dict[str, Any]) -> str:
    """The manifest as JSON with a CRC-32 of its own content under ``"checksum"``."""
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    text = json.dumps(body, sort_keys=True, default=str)
    return json.dumps({**body, "checksum": isal_zlib.crc32(text.encode())}, sort_keys=True, default=str)


def unseal(text: str) -> dict[str, Any] | None:
    """The manifest if its checksum matches its content, else None."""
    try:
        manifest = json.loads(text)
    except ValueError:
        return None
    if not isinstance(manifest, dict) or "checksum" not in manifest:
        return None
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    if isal_zlib.crc32(json.dumps(body, sort_keys=True, default=str).encode()) != manifest["checksum"]:
        return None
    return manifest


def read_text(path: Path) -> str:
    """A file's text, never through a symbolic link (OSError(ELOOP) for one): what a cache reads back
    must be the file written there, not one a link planted in a shared cache leads to."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, encoding="utf-8") as f:
        return f.read()


def _plain(st: os.stat_result) -> bool:
    """A regular file nobody but its owner and group could have rewritten (not world-writable)."""
    return stat.S_ISREG(st.st_mode) and not st.st_mode & stat.S_IWOTH


def verify_files(directory: Path, files: dict[str, Any], mode: str | None = None) -> bool:
    """True when every ``name -> {"size", "crc32"}`` of ``files`` under ``directory`` matches (regular
    files only: a symbolic link or a world-writable file in their place fails)."""
    mode = mode or os.environ.get("TRACEKIT_CACHE_VERIFY", "full")
    try:
        for name, info in files.items():
            p = directory / name
            st = p.lstat()
            if not _plain(st) or st.st_size != info["size"]:
                return False
            if mode != "size" and file_crc32(p) != info["crc32"]:
                return False
    except (OSError, KeyError, TypeError):
        return False
    return True


def _write_table(table: pa.Table, path: Path) -> dict[str, int]:
    """Write an uncompressed IPC file (mmap-able); return its size and CRC-32."""
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=1 << 20)
    return {"size": path.stat().st_size, "crc32": file_crc32(path)}


def store(parsed: ParsedFile, entry: Path) -> None:
    """Write ``parsed`` as the cache entry ``entry`` (atomically: see :func:`tracekit.loading.atomic.publish_dir`)."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale(entry.parent)
    tmp = new_data_dir(entry)
    try:
        tables = {"events": parsed.events, "collectives": parsed.collectives, "topology": parsed.topology,
                  **{f"extra.{k}": v for k, v in parsed.tables.items()}}
        files = {f"{name}.arrow": _write_table(t, tmp / f"{name}.arrow") for name, t in tables.items()}
        manifest: dict[str, Any] = {
            "version": CACHE_VERSION, "path": parsed.path, "format": parsed.format, "meta": parsed.meta,
            "diagnostics": [d.__dict__ for d in parsed.diagnostics], "bytes_lost": parsed.bytes_lost,
            "complete": parsed.complete, "tables": sorted(tables), "files": files,
        }
        (tmp / "manifest.json").write_text(seal(manifest))
        publish_dir(tmp, entry)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _read_table(path: Path) -> pa.Table:
    return pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()


def load(entry: Path) -> ParsedFile | None:
    """Reopen a cache entry (memory-mapped, zero-copy), or None if absent, stale or damaged.

    The entry's data directory is resolved once (:func:`tracekit.loading.atomic.data_dir`: a link planted in the
    cache is not followed) and everything is read from it; another process publishing the same entry
    meanwhile removes that directory, and the read is tried again on the new one."""
    for attempt in range(3):
        d = data_dir(entry)
        if d is None:
            return None
        try:
            return _load(d)
        except FileNotFoundError:  # replaced under us by another process's publish: read the new one
            time.sleep(0.01 * (attempt + 1))
    return None


def _load(entry: Path) -> ParsedFile | None:
    try:
        manifest = unseal(read_text(entry / "manifest.json"))
        if manifest is None or manifest.get("version") != CACHE_VERSION:
            return None
        if not verify_files(entry, manifest["files"]):
            if not entry.exists():
                raise FileNotFoundError(str(entry))
            return None
        tables = {name: _read_table(entry / f"{name}.arrow") for name in manifest["tables"]}
        diags = [Diagnostic(**d) for d in manifest.get("diagnostics", [])]
        return ParsedFile(
            path=manifest["path"], format=manifest["format"], events=tables["events"],
            collectives=tables["collectives"], topology=tables["topology"],
            tables={k.removeprefix("extra."): v for k, v in tables.items() if k.startswith("extra.")},
            meta=manifest.get("meta", {}), diagnostics=diags, bytes_lost=manifest.get("bytes_lost", 0),
            complete=manifest.get("complete", True))
    except FileNotFoundError:
        raise
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowInvalid):
        return None
