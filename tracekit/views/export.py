"""Parquet export of analysis tables, written atomically and never over existing files without force."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from tracekit.loading.atomic import atomic_write
from tracekit.model.diagnostics import TraceError

__all__ = ["atomic_write", "export", "write_parquet"]


class Batches(Protocol):
    """A table too big to hold: its schema and a stream of its batches."""

    schema: pa.Schema

    def batches(self) -> Iterator[pa.RecordBatch]: ...


def write_parquet(table: pa.Table | Batches, path: str | os.PathLike) -> None:
    """Write one table as Parquet (zstd), atomically; a stream of batches is written batch by batch."""
    if isinstance(table, pa.Table):
        atomic_write(path, lambda tmp: pq.write_table(table, tmp, compression="zstd"))
        return

    def stream(tmp: str) -> None:
        with pq.ParquetWriter(tmp, table.schema, compression="zstd") as writer:
            for b in table.batches():
                writer.write_batch(b)

    atomic_write(path, stream)


def export(tables: Mapping[str, pa.Table | Batches], out: str, *, force: bool = False, table: str | None = None
           ) -> list[str]:
    """Write ``tables`` to ``out``: one Parquet file (``*.parquet``: the ``table`` chosen, breakdown by
    default) or a directory with one ``<name>.parquet`` per table. Returns the paths written."""
    if out.endswith(".parquet"):
        name = table or "breakdown"
        if name not in tables:
            raise TraceError(None, f"no table {name!r} to export (have: {', '.join(sorted(tables))})")
        parent = Path(out).parent
        if not parent.is_dir():
            raise TraceError(out, f"directory {str(parent)!r} does not exist")
        if os.path.exists(out) and not force:
            raise TraceError(out, "already exists (use --force to overwrite)")
        write_parquet(tables[name], out)
        return [out]
    selected = {table: tables[table]} if table else tables
    if table and table not in tables:
        raise TraceError(None, f"no table {table!r} to export (have: {', '.join(sorted(tables))})")
    directory = Path(out)
    if directory.exists() and not directory.is_dir():
        raise TraceError(out, "exists and is not a directory")
    targets = {name: directory / f"{name}.parquet" for name in selected}
    clashes = [str(p) for p in targets.values() if p.exists()]
    if clashes and not force:
        raise TraceError(clashes[0], "already exists (use --force to overwrite)")
    directory.mkdir(parents=True, exist_ok=True)
    for name, path in targets.items():
        write_parquet(selected[name], path)
    return [str(p) for p in targets.values()]
