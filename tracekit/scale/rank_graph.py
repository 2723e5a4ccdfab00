"""One rank's compact dependency graph, built by the rank's unit where its events are (a local process or a Dask
worker) and written beside its part of the dataset (:mod:`tracekit.scale.dataset`); :mod:`tracekit.scale.graphs`
combines them."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa

from tracekit.analysis.graph import compact, dag
from tracekit.analysis.graph.compute_leaves import compute_leaves
from tracekit.loading.cache import file_crc32
from tracekit.scale import parquet

#: the files of a rank's graph, in its partition
FILES = ("graph.act.parquet", "graph.edges.parquet", "graph.leaves.parquet")
#: memory one event takes while its rank's graph is built (the events, the activities' frame and the build's
#: temporaries); a rank whose events would take more than the memory budget gets no graph
GRAPH_BYTES_PER_EVENT = 700
def rank_graph(events: pa.Table) -> dict[str, pa.Table]:
    """One rank's graph tables (:data:`FILES`) from its events (iteration filled; any rank number, its own clock)."""
    g = dag.build(events)
    act, edges = compact.to_tables(compact.compact(g))
    leaves = compute_leaves(events, g) if g.act.height else None
    lv = compact.leaves_table(leaves) if leaves is not None and leaves.height else \
        pa.schema([("rank", pa.int32()), ("iteration", pa.int64()), ("name", pa.string()), ("start", pa.int64()),
                   ("end", pa.int64())]).empty_table()
    return {"graph.act.parquet": act, "graph.edges.parquet": edges, "graph.leaves.parquet": lv}


def write_rank_graph(events: pa.Table, directory: Path) -> dict[str, dict[str, int]]:
    """Write one rank's graph tables into ``directory``; returns their sizes and CRC-32s."""
    import pyarrow.parquet as pq

    out = {}
    for name, table in rank_graph(events).items():
        p = directory / name
        tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
        pq.write_table(table, str(tmp), **parquet.options(table.schema))
        os.replace(tmp, p)
        out[name] = {"size": p.stat().st_size, "crc32": file_crc32(p)}
    return out


def fits(events: int, budget: int) -> bool:
    """Whether a rank of ``events`` events may have its graph built within ``budget`` bytes."""
    return events * GRAPH_BYTES_PER_EVENT <= budget
