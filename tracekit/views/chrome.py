"""Chrome-trace export: every rank of a job in one JSON file on one aligned clock, for Perfetto UI
(ui.perfetto.dev) and chrome://tracing.

Each rank is a process (``pid`` = rank, named ``rank N`` and sorted by rank); each lane is a thread of
it (``tid`` = 1, 2, … in timeline order, named after the lane: ``gpu0/stream7``, ``cpu/tid 4711``), and
an ``iterations`` thread (``tid`` 0) holds one slice per iteration window. Every event is a complete
event (``ph: "X"``) with its kind as ``cat`` and its ids, bytes and iteration in ``args``. Times are
rank times plus ``ranks.clock_offset_ns``, minus the job's first instant, written in µs with exact
nanosecond decimals (integer arithmetic, never a float).

:class:`Flow` arrows (``ph: "s"`` / ``"f"`` pairs bound to the enclosing slices) are written for
whatever the caller passes; :func:`critical_path_flows` gives the critical path's hand-overs between
lanes and ranks (what ``tracekit export --chrome`` and the app's export draw).

Formatting is columnar (polars string expressions) and streamed in chunks, so a multi-million-event
job exports in seconds without holding the file's text in memory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, Any

import polars as pl
import pyarrow as pa

from tracekit import __version__
from tracekit.model.diagnostics import TraceError
from tracekit.views.export import atomic_write

if TYPE_CHECKING:
    from tracekit.analysis.pipeline import Analysis

ITERATIONS_TID = 0


@dataclass(frozen=True)
class Flow:
    """An arrow from one instant on a lane to another (job-clock ns, lanes as in the events table)."""

    id: int
    name: str
    from_rank: int
    from_lane: str
    from_ns: int
    to_rank: int
    to_lane: str
    to_ns: int
    cat: str = "flow"


def critical_path_flows(analysis: Analysis) -> list[Flow]:
    """One arrow per hand-over of the critical path: wherever two consecutive segments of an iteration's
    path lie on different lanes or ranks, from the first's last nanosecond to the second's start. A
    viewer binds an arrow's ends to the slices around them, so an end that falls outside its segment's
    own activity (an idle or waiting gap before it) is moved to the nearest instant of that activity.
    Builds the critical path if it was not yet; none for a Horovod timeline alone (it has no path)."""
    if analysis.horovod_only:
        return []
    segs = analysis.critical_path
    if segs.height < 2:
        return []
    ev = pl.from_arrow(analysis.events.select(["rank", "start_ns", "dur_ns"]))
    off = pl.from_arrow(analysis.ranks.select(["rank", "clock_offset_ns"]))
    assert isinstance(ev, pl.DataFrame) and isinstance(off, pl.DataFrame)
    # each activity's extent on the job clock, [ev_lo, ev_hi]: where an arrow end can bind
    extent = (ev.with_row_index("event_row").join(off, on="rank", how="left", maintain_order="left")
              .select(pl.col("event_row").cast(pl.Int64),
                      (pl.col("start_ns") + pl.col("clock_offset_ns").fill_null(0)).alias("ev_lo"),
                      (pl.col("start_ns") + pl.col("clock_offset_ns").fill_null(0)
                       + (pl.col("dur_ns").fill_null(0) - 1).clip(0, None)).alias("ev_hi")))
    what = pl.when(pl.col("label") == "waiting").then(
        pl.concat_str(pl.lit("waiting on rank "), pl.col("waiting_on").cast(pl.String))).otherwise(pl.col("label"))
    cols = ("rank", "lane", "start_ns", "end_ns", "what", "ev_lo", "ev_hi")
    prev = [pl.col(c).shift(1).over("iteration", order_by="start_ns").alias(f"prev_{c}") for c in cols]
    hand = (segs.join(extent, on="event_row", how="left").sort(["iteration", "start_ns"])
            .with_columns(what.alias("what")).with_columns(prev)
            .filter(pl.col("prev_rank").is_not_null()
                    & ((pl.col("rank") != pl.col("prev_rank")) | (pl.col("lane") != pl.col("prev_lane")))))

    def inside(t: int, lo: int | None, hi: int | None) -> int:
        return t if lo is None or hi is None else min(max(t, lo), hi)

    flows = []
    for i, row in enumerate(hand.iter_rows(named=True)):
        flows.append(Flow(id=i + 1, name=f"critical path: {row['prev_what']} → {row['what']}",
                          from_rank=int(row["prev_rank"]), from_lane=str(row["prev_lane"]),
                          from_ns=inside(int(row["prev_end_ns"]) - 1, row["prev_ev_lo"], row["prev_ev_hi"]),
                          to_rank=int(row["rank"]), to_lane=str(row["lane"]),
                          to_ns=inside(int(row["start_ns"]), row["ev_lo"], row["ev_hi"]), cat="critical_path"))
    return flows


def _us(ns: pl.Expr) -> pl.Expr:
    """Exact µs text of an int64 ns expression: ``1234567`` → ``1234.567``."""
    whole = ns.floordiv(1000)
    frac = (ns - whole * 1000).cast(pl.String).str.zfill(3)
    return pl.concat_str([whole.cast(pl.String), pl.lit("."), frac])


def _json_str(values: list[Any]) -> list[str]:
    return [json.dumps("" if v is None else str(v)) for v in values]


def _lanes(events: pl.DataFrame) -> pl.DataFrame:
    """``rank, lane, tid``: lanes numbered 1.. per rank, device streams first (the timeline's order)."""
    from tracekit.views.timeline import lane_sort_key

    pairs = events.select(["rank", "lane"]).unique().drop_nulls().rows()
    pairs.sort(key=lambda p: (p[0], lane_sort_key(str(p[1]))))
    tids: dict[int, int] = {}
    rows = []
    for rank, lane in pairs:
        tids[rank] = tids.get(rank, 0) + 1
        rows.append((rank, lane, tids[rank]))
    return pl.DataFrame(rows, schema={"rank": pl.Int32, "lane": pl.String, "tid": pl.Int64}, orient="row")


@dataclass
class _Job:
    """The tables of an export, on the job clock."""

    ranks: pl.DataFrame
    events: pl.DataFrame
    iterations: pl.DataFrame
    lanes: pl.DataFrame
    t0: int


def _prepare(analysis: Analysis) -> _Job:
    ranks = pl.from_arrow(analysis.ranks.select(["rank", "host", "clock_offset_ns"]))
    assert isinstance(ranks, pl.DataFrame)
    ranks = ranks.with_columns(pl.col("clock_offset_ns").fill_null(0))
    ev = pl.from_arrow(analysis.events.select(["rank", "lane", "kind", "name", "start_ns", "dur_ns", "correlation",
                                               "external_id", "bytes", "iteration", "collective_id"]))
    assert isinstance(ev, pl.DataFrame)
    ev = (ev.with_columns(pl.col("lane").cast(pl.String), pl.col("kind").cast(pl.String),
                          pl.col("name").cast(pl.String))
          .filter(pl.col("rank").is_not_null() & pl.col("start_ns").is_not_null())
          .join(ranks.select(["rank", "clock_offset_ns"]), on="rank", how="left")
          .with_columns((pl.col("start_ns") + pl.col("clock_offset_ns").fill_null(0)).alias("t"),
                        pl.col("dur_ns").fill_null(0).clip(0, None).alias("d")))
    it = pl.from_arrow(analysis.iterations.select(["rank", "iteration", "start_ns", "end_ns", "method"]))
    assert isinstance(it, pl.DataFrame)
    it = it.join(ranks.select(["rank", "clock_offset_ns"]), on="rank", how="left").with_columns(
        (pl.col("start_ns") + pl.col("clock_offset_ns").fill_null(0)).alias("t"),
        (pl.col("end_ns") - pl.col("start_ns")).alias("d"))
    firsts = [int(x) for x in (ev.get_column("t").min(), it.get_column("t").min()) if x is not None]  # type: ignore[arg-type]
    return _Job(ranks, ev, it, _lanes(ev), min(firsts) if firsts else 0)


def _metadata(job: _Job) -> list[str]:
    """Process and thread names and sort orders."""
    lines = []
    ranks, it = job.ranks, job.iterations
    all_ranks = sorted(set(ranks.get_column("rank").to_list()) | set(job.events.get_column("rank").unique().to_list()))
    hosts = dict(zip(ranks.get_column("rank").to_list(), ranks.get_column("host").to_list(), strict=True))
    with_iterations = set(it.get_column("rank").unique().to_list())
    for r in all_ranks:
        name = f"rank {r}" + (f" ({hosts[r]})" if hosts.get(r) else "")
        lines.append(json.dumps({"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": name}}))
        lines.append(json.dumps({"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0,
                                 "args": {"sort_index": r}}))
        if r in with_iterations:
            lines.append(json.dumps({"ph": "M", "name": "thread_name", "pid": r, "tid": ITERATIONS_TID,
                                     "args": {"name": "iterations"}}))
    for r, lane, tid in job.lanes.rows():
        lines.append(json.dumps({"ph": "M", "name": "thread_name", "pid": r, "tid": tid, "args": {"name": lane}}))
        lines.append(json.dumps({"ph": "M", "name": "thread_sort_index", "pid": r, "tid": tid,
                                 "args": {"sort_index": tid}}))
    return lines


def _iteration_lines(job: _Job) -> list[str]:
    if not job.iterations.height:
        return []
    its = job.iterations.with_columns((pl.col("t") - job.t0).alias("rel")).select(pl.concat_str([
        pl.lit('{"ph":"X","cat":"iteration","name":"iteration #'), pl.col("iteration").cast(pl.String),
        pl.lit('","pid":'), pl.col("rank").cast(pl.String), pl.lit(f',"tid":{ITERATIONS_TID},"ts":'),
        _us(pl.col("rel")), pl.lit(',"dur":'), _us(pl.col("d")), pl.lit(',"args":{"method":'),
        pl.col("method").map_elements(json.dumps, return_dtype=pl.String), pl.lit("}}")]).alias("j"))
    return its.get_column("j").to_list()


def _event_chunks(job: _Job, rows: int = 1 << 18) -> Iterator[list[str]]:
    """The events' JSON, ``rows`` at a time (so memory holds one chunk of text, not the whole file)."""
    ev = job.events
    if not ev.height:
        return
    names = ev.get_column("name").unique().to_list()
    escaped = pl.DataFrame({"name": names, "name_json": _json_str(names)},
                           schema={"name": pl.String, "name_json": pl.String})

    def arg(col: str) -> pl.Expr:
        return pl.when(pl.col(col).is_not_null()).then(
            pl.concat_str([pl.lit(f'"{col}":'), pl.col(col).cast(pl.String)]))

    args = pl.concat_str([arg(c) for c in ("correlation", "external_id", "bytes", "iteration", "collective_id")],
                         separator=",", ignore_nulls=True)
    text = pl.concat_str([
        pl.lit('{"ph":"X","cat":"'), pl.col("kind").fill_null("unknown"), pl.lit('","name":'),
        pl.col("name_json").fill_null('""'), pl.lit(',"pid":'), pl.col("rank").cast(pl.String),
        pl.lit(',"tid":'), pl.col("tid").fill_null(0).cast(pl.String), pl.lit(',"ts":'),
        _us(pl.col("t") - job.t0), pl.lit(',"dur":'), _us(pl.col("d")), pl.lit(',"args":{'), args.fill_null(""),
        pl.lit("}}")]).alias("j")
    for offset in range(0, ev.height, rows):
        part = (ev.slice(offset, rows).join(job.lanes, on=["rank", "lane"], how="left", maintain_order="left")
                .join(escaped, on="name", how="left", nulls_equal=True, maintain_order="left"))
        yield part.select(text).get_column("j").to_list()


def _flow_lines(job: _Job, flows: Iterable[Flow]) -> list[str]:
    tid_of = {(r, lane): tid for r, lane, tid in job.lanes.rows()}
    lines = []
    for f in flows:
        for ph, rank, lane, t in (("s", f.from_rank, f.from_lane, f.from_ns), ("f", f.to_rank, f.to_lane, f.to_ns)):
            ev_json: dict[str, Any] = {"ph": ph, "id": f.id, "cat": f.cat, "name": f.name, "pid": rank,
                                       "tid": tid_of.get((rank, lane), ITERATIONS_TID)}
            if ph == "f":
                ev_json["bp"] = "e"
            text = json.dumps(ev_json)
            lines.append(text[:-1] + f', "ts": {_us_text(t - job.t0)}}}')
    return lines


def _us_text(ns: int) -> str:
    whole, frac = divmod(int(ns), 1000)
    return f"{whole}.{frac:03d}"


def write_chrome_trace(analysis: Analysis, path: str | os.PathLike, *, force: bool = False,
                       flows: Iterable[Flow] = ()) -> int:
    """Write ``analysis`` as one Chrome-trace JSON file (atomically, never over a file without
    ``force``); returns the number of trace events written."""
    target = str(path)
    parent = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(parent):
        raise TraceError(target, f"directory {parent!r} does not exist")
    if os.path.exists(target) and not force:
        raise TraceError(target, "already exists (use --force to overwrite)")
    job = _prepare(analysis)
    other = {"tracekit": __version__, "t0_ns": job.t0,
             "clock": "ts = rank time + ranks.clock_offset_ns - t0_ns, in µs; one process per rank"}
    written = 0

    def write(tmp: str) -> None:
        nonlocal written
        chunks = chain([_metadata(job), _iteration_lines(job)], _event_chunks(job), [_flow_lines(job, flows)])
        with open(tmp, "w", encoding="utf-8") as f:
            f.write('{"displayTimeUnit": "ms", "otherData": ' + json.dumps(other) + ',\n"traceEvents": [\n')
            for chunk in chunks:
                if chunk:
                    f.write((",\n" if written else "") + ",\n".join(chunk))
                    written += len(chunk)
            f.write("\n]}\n")

    atomic_write(target, write)
    return written


def lane_table(analysis: Analysis) -> pa.Table:
    """``rank, lane, tid`` of the export (which thread of which process each lane became)."""
    ev = pl.from_arrow(analysis.events.select(["rank", "lane"]))
    assert isinstance(ev, pl.DataFrame)
    return _lanes(ev.with_columns(pl.col("lane").cast(pl.String))).to_arrow()
