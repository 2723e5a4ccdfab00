"""The data loader's time as the trace shows it: each rank's ``enumerate(DataLoader)#…__next__`` spans on the job
clock, and how much of the critical path the ranks spent waiting in them (what the verdict's *input-bound* rests on,
docs/verdict.md). The profiler writes the loader's ``__next__`` as an annotation, so the wait is no operator's own
time: it shows as a gap on the thread that waited for its batch."""

from __future__ import annotations

import re

import polars as pl
import pyarrow as pa

from tracekit.analysis.graph.contention import coverage

#: the profiler's annotation of a data loader's ``__next__``
LOADER = "enumerate(DataLoader)"
#: the kinds of event a loader's ``__next__`` is written as (an annotation since PyTorch 1.8 or so; an operator in
#: traces that record it as one)
KINDS = ("annotation", "cpu_op")
#: critical-path labels that are a host waiting (a device's compute or a transfer is never a wait for input)
HOST_LABELS = ("idle", "CPU", "launch")


def events(frame: pl.LazyFrame | pa.Table) -> pa.Table:
    """``rank, kind, name, start_ns, dur_ns`` of every data-loader ``__next__`` among the events ``frame`` (a table in
    memory, or a lazy scan of a job's per-rank dataset: only the rows asked for are collected)."""
    if isinstance(frame, pl.LazyFrame):
        lf = frame
    else:  # the few candidate rows picked on the dictionaries first: a job's names are not cast to text row by row
        import numpy as np

        from tracekit.model.schema import dict_in, dict_match

        hit = dict_in(frame.column("kind"), KINDS) & dict_match(frame.column("name"), "^" + re.escape(LOADER))
        rows = pa.array(np.flatnonzero(hit), pa.int64())
        sub = frame.select(["rank", "kind", "name", "start_ns", "dur_ns"]).take(rows)
        lf = pl.from_arrow(sub).lazy()  # type: ignore[union-attr]
    return (lf.select(["rank", pl.col("kind").cast(pl.String), pl.col("name").cast(pl.String), "start_ns", "dur_ns"])
            .filter(pl.col("kind").is_in(KINDS) & pl.col("name").str.starts_with(LOADER)).collect().to_arrow())


def spans(events: pa.Table, ranks: pa.Table | None = None) -> pl.DataFrame:
    """``rank, name, start, end``: every data-loader ``__next__`` annotation, on the job clock (``ranks``'
    ``clock_offset_ns``)."""
    ev = pl.from_arrow(events.select(["rank", "kind", "name", "start_ns", "dur_ns"]))
    assert isinstance(ev, pl.DataFrame)
    ev = (ev.filter(pl.col("kind").is_in(KINDS)).filter(pl.col("name").cast(pl.String).str.starts_with(LOADER))
          .select(["rank", pl.col("name").cast(pl.String), "start_ns", "dur_ns"]))
    if ranks is not None and ranks.num_rows and "clock_offset_ns" in ranks.column_names:
        off = pl.from_arrow(ranks.select(["rank", "clock_offset_ns"]))
        assert isinstance(off, pl.DataFrame)
        ev = ev.join(off.with_columns(pl.col("rank").cast(ev.schema["rank"])).unique("rank"), on="rank", how="left")
    else:
        ev = ev.with_columns(pl.lit(0, dtype=pl.Int64).alias("clock_offset_ns"))
    start = pl.col("start_ns") + pl.col("clock_offset_ns").fill_null(0)
    return ev.select(["rank", "name", start.alias("start"), (start + pl.col("dur_ns")).alias("end")])


def on_path(segments: pl.DataFrame | None, loader: pl.DataFrame | None) -> float:
    """The share of the critical path (``segments``) that is a host waiting while its data loader ran: host segments
    (:data:`HOST_LABELS`) under the same rank's loader spans (``loader``: :func:`spans`)."""
    if segments is None or segments.height == 0 or loader is None or loader.height == 0:
        return 0.0
    total = int(segments.get_column("dur_ns").sum())
    host = segments.filter(pl.col("label").is_in(HOST_LABELS) & (pl.col("dur_ns") > 0))
    if host.height == 0 or total <= 0:
        return 0.0
    share = coverage(host.get_column("start_ns").to_numpy(), host.get_column("end_ns").to_numpy(),
                     host.get_column("rank").fill_null(-1).to_numpy(), loader.get_column("start").to_numpy(),
                     loader.get_column("end").to_numpy(), loader.get_column("rank").fill_null(-1).to_numpy())
    return float((share * host.get_column("dur_ns").to_numpy()).sum()) / total
