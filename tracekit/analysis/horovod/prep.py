"""Horovod timelines made ready for the analysis pipeline (:func:`prepare`; :mod:`tracekit.analysis.horovod.windows`
explains what and why): each timeline's clock set against rank 0's trace (same epoch clock, or aligned on its
kernels: :mod:`tracekit.analysis.horovod.align`), whether it joins rank 0's attribution, its collectives and
iterations renumbered after rank 0's own; then, in :class:`Prep`, Horovod's iterations where rank 0 has no
steps and rank 0's breakdown recomputed with the merged timeline.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.analysis import attribution
from tracekit.analysis.horovod.align import align
from tracekit.analysis.links import bus_bytes_expr
from tracekit.loading.traceset import TraceSet
from tracekit.model import schema
from tracekit.model.diagnostics import Diagnostic, TraceError
from tracekit.model.schema import ParsedFile

FORMAT = "horovod"
#: event category of every Horovod row (the parser's)
CAT = "horovod"


@dataclass
class Timeline:
    """One Horovod timeline file and how it joins the job."""

    index: int  # in time order
    path: str
    clock: str  # the parser's meta["clock"]: epoch or relative_unknown
    offset_ns: int  # added to the file's times (0 on the epoch clock)
    merged: bool  # whether its phases join rank 0's attribution
    how: str  # one line: how the clock was set, or why it was not merged
    iteration_base: int  # added to the file's iteration numbers
    method: str  # the parser's iteration method
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Prep:
    """The Horovod part of a job, ready for the pipeline (:func:`prepare`)."""

    timelines: list[Timeline]
    events: pa.Table  # every Horovod phase of every timeline (EVENTS schema), offsets applied
    timeline_of_row: np.ndarray
    trusted: np.ndarray  # False: closed by the parser (truncated) or negative duration
    instances: pa.Table
    ticks: pa.Table
    iterations: pa.Table  # ITERATIONS schema, rank 0, iterations renumbered across timelines
    cycles: pa.Table
    collectives: pa.Table  # the job's collectives, Horovod rows shifted like their timeline
    traced: bool  # the job has profiler traces
    rank0_traced: bool
    diagnostics: list[Diagnostic] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    world_size: int | None = None
    #: rows of the events table attribution may use (set by :meth:`use_iterations`: the rows it appends
    #: after them are the Horovod phases left out of rank 0's analysis)
    n_attribution_rows: int | None = None

    @property
    def only(self) -> bool:
        """A timeline-only job: no profiler trace to attribute compute from."""
        return not self.traced

    @property
    def merged(self) -> bool:
        return any(t.merged for t in self.timelines)

    def _merged_rows(self) -> np.ndarray:
        ok = np.zeros(len(self.timeline_of_row), dtype=bool)
        for t in self.timelines:
            if t.merged:
                ok |= self.timeline_of_row == t.index
        return ok & self.trusted

    def base_events(self, events: pa.Table) -> pa.Table:
        """``events`` (a TraceSet's) without its Horovod rows, plus the merged, trusted Horovod rows:
        what iteration assignment and attribution look at."""
        others = events.filter(pa.array(~_is_horovod(events)))
        mine = self.events.filter(pa.array(self._merged_rows()))
        return _concat([others, mine])

    def use_iterations(self, events: pa.Table, iters: pa.Table) -> tuple[pa.Table, pa.Table]:
        """Horovod's iterations where rank 0 has no step markers (:mod:`tracekit.analysis.horovod.windows`), and every
        Horovod row appended that :meth:`base_events` left out, so the events table holds them all."""
        steps_on_0 = iters.num_rows > 0 and bool(pc.any(pc.and_(
            pc.equal(iters.column("rank"), 0),
            pc.invert(pc.equal(iters.column("method"), "whole-trace")))).as_py())
        hv = pl.from_arrow(self.iterations)
        assert isinstance(hv, pl.DataFrame)
        use_hvd = hv.height > 0 and not steps_on_0 and (self.only or self.merged)
        if use_hvd:
            keep = iters.filter(pc.not_equal(iters.column("rank"), 0)) if iters.num_rows else iters
            iters = pa.concat_tables([schema.conform(keep, schema.ITERATIONS),
                                      schema.conform(self.iterations, schema.ITERATIONS)])
            # rank 0's trace events (not Horovod's: they keep the parser's instance-based numbers) by time
            events = _iteration_by_window(events, hv, ~_is_horovod(events))
            events = _set_horovod_iterations(events, self)
        self.n_attribution_rows = events.num_rows
        out = ~self._merged_rows()
        left_out = self.events.filter(pa.array(out))
        if left_out.num_rows:
            if not use_hvd:
                # phases of a merged timeline that are not trusted: by time in rank 0's windows like the
                # others; phases of a timeline that was not merged keep its own iteration numbers
                of_merged = np.zeros(int(out.sum()), dtype=bool)
                tl = self.timeline_of_row[out]
                for t in self.timelines:
                    if t.merged:
                        of_merged |= tl == t.index
                w = pl.from_arrow(iters.filter(pc.equal(iters.column("rank"), 0))) if iters.num_rows else None
                if of_merged.any() and isinstance(w, pl.DataFrame) and w.height:
                    left_out = _iteration_by_window(left_out, w, of_merged)
            events = _concat([events, left_out])
        return events, iters

    def attribution_events(self, events: pa.Table) -> pa.Table:
        """The rows of ``events`` (from :meth:`use_iterations`) that attribution may use."""
        n = self.n_attribution_rows
        return events if n is None or n >= events.num_rows else events.slice(0, n)

    def attribute(self, breakdown: pa.Table, events: pa.Table, iters: pa.Table, collectives: pa.Table,
                  split: pl.DataFrame | None) -> pa.Table:
        """``breakdown`` with rank 0's rows recomputed from its trace and the merged timeline (module
        docstring); empty for a timeline-only job (without compute there is nothing to attribute)."""
        if self.only:
            return schema.empty(schema.BREAKDOWN)
        if not self.merged or breakdown.num_rows == 0:
            return breakdown
        w0 = iters.filter(pc.equal(iters.column("rank"), 0))
        if w0.num_rows == 0:
            return breakdown
        ev0 = self.attribution_events(events)
        ev0 = ev0.filter(pc.fill_null(pc.equal(ev0.column("rank"), 0), False))
        comm = _flags(ev0.column("kind"), lambda v: v == "comm")
        start = ev0.column("start_ns").to_numpy(zero_copy_only=False)
        end = start + ev0.column("dur_ns").to_numpy(zero_copy_only=False)
        hv = _is_horovod(ev0)
        parts = []
        if split is not None:
            s0 = split.filter(pl.col("rank") == 0).with_columns(
                pl.when(pl.col("cls") == attribution.UNSPLIT).then(pl.lit(attribution.TRANSFER))
                .otherwise(pl.col("cls")).cast(pl.Int64).alias("cls"))
            parts.append(s0.select(["rank", "start_ns", "end_ns", "cls"]))
            # Horovod's transfer phases are unmatched collectives there (UNSPLIT -> TRANSFER above)
        else:
            parts.append(_intervals(start[comm], end[comm], attribution.TRANSFER))
        neg = hv & _flags(ev0.column("name"), lambda v: v.startswith("NEGOTIATE_"))
        parts.append(_intervals(start[neg], end[neg], attribution.WAIT))
        split0 = pl.concat([p.with_columns(pl.col("rank").cast(pl.Int32), pl.col("cls").cast(pl.Int64))
                            for p in parts], how="vertical_relaxed")
        coll0 = collectives.filter(pc.equal(collectives.column("rank"), 0)) if collectives.num_rows else None
        b0 = attribution.breakdown(ev0, w0, coll0, comm_split=split0)
        rest = breakdown.filter(pc.not_equal(breakdown.column("rank"), 0))
        out = pa.concat_tables([schema.conform(rest, schema.BREAKDOWN), schema.conform(b0, schema.BREAKDOWN)])
        return out.sort_by([("rank", "ascending"), ("start_ns", "ascending")])

    def windows(self, iters: pa.Table) -> pl.DataFrame:
        """The windows of ``horovod_breakdown``: rank 0's when the timeline joins rank 0's analysis (or is
        alone), else Horovod's own iterations."""
        use_rank0 = (self.only or self.merged) and iters.num_rows > 0
        src = iters.filter(pc.equal(iters.column("rank"), 0)) if use_rank0 else self.iterations
        if src.num_rows == 0:
            src = self.iterations
        w = pl.from_arrow(src.select(["iteration", "start_ns", "end_ns"]))
        assert isinstance(w, pl.DataFrame)
        return w.sort("start_ns")


# ---------------------------------------------------------------------------------------------------
# helpers


def _flags(col: pa.ChunkedArray | pa.Array, predicate: Any) -> np.ndarray:
    """``predicate`` of a (dictionary) string column, evaluated once per distinct value and mapped to every
    row by its dictionary index (nulls are False): no Python work per row."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_encode()
    flags = np.array([v is not None and bool(predicate(v)) for v in arr.dictionary.to_pylist()] + [False], bool)
    return flags[pc.fill_null(arr.indices, len(flags) - 1).to_numpy(zero_copy_only=False)]


def _is_horovod(events: pa.Table) -> np.ndarray:
    """Rows written by the Horovod parser (category ``horovod``)."""
    if events.num_rows == 0:
        return np.zeros(0, dtype=bool)
    return _flags(events.column("cat"), lambda v: v == CAT)


def without_timeline(events: pa.Table) -> pa.Table:
    """``events`` without the Horovod timelines' rows."""
    hv = _is_horovod(events)
    return events.filter(pa.array(~hv)) if hv.any() else events


def _concat(tables: list[pa.Table]) -> pa.Table:
    tables = [schema.conform(t, schema.EVENTS) for t in tables if t.num_rows]
    if not tables:
        return schema.empty(schema.EVENTS)
    return pa.concat_tables(tables).unify_dictionaries()


def _intervals(start: np.ndarray, end: np.ndarray, cls: int) -> pl.DataFrame:
    return pl.DataFrame({"rank": np.zeros(len(start), np.int32), "start_ns": start.astype(np.int64),
                         "end_ns": end.astype(np.int64), "cls": np.full(len(start), cls, np.int64)})


def _window_index(t: np.ndarray, w_start: np.ndarray, w_end: np.ndarray) -> np.ndarray:
    """Index of the window (sorted, non-overlapping) containing each time, or -1."""
    if w_start.size == 0:
        return np.full(t.size, -1, dtype=np.int64)
    i = np.searchsorted(w_start, t, side="right") - 1
    ok = (i >= 0) & (t < w_end[np.maximum(i, 0)])
    return np.where(ok, i, -1)


def _set_iteration(events: pa.Table, values: np.ndarray, valid: np.ndarray) -> pa.Table:
    idx = events.schema.get_field_index("iteration")
    return events.set_column(idx, schema.EVENTS.field("iteration"), pa.array(values, type=pa.int64(), mask=~valid))


def _iteration_by_window(events: pa.Table, windows: pl.DataFrame, rows: np.ndarray) -> pa.Table:
    """Give the selected rank-0 ``rows`` the iteration of the window containing their start."""
    w = windows.sort("start_ns")
    ws, we = w.get_column("start_ns").to_numpy(), w.get_column("end_ns").to_numpy()
    wit = w.get_column("iteration").to_numpy()
    start = events.column("start_ns").to_numpy(zero_copy_only=False)
    rank = pc.fill_null(events.column("rank"), -1).to_numpy(zero_copy_only=False)
    cur = events.column("iteration")
    it = pc.fill_null(cur, 0).to_numpy(zero_copy_only=False).astype(np.int64)
    valid = pc.is_valid(cur).to_numpy(zero_copy_only=False)
    sel = rows & (rank == 0)
    j = _window_index(start[sel], ws, we)
    it[sel] = np.where(j >= 0, wit[np.maximum(j, 0)], 0)
    valid[sel] = j >= 0
    return _set_iteration(events, it, valid)


def _set_horovod_iterations(events: pa.Table, prep: Prep) -> pa.Table:
    """Horovod rows get back their timeline's (instance-based) iteration numbers: a phase belongs to the
    iteration its tensor's negotiation started in, even when it ends in the next one. The rows in
    ``events`` are exactly the merged, trusted ones of ``prep``, so they are swapped for those."""
    hv = _is_horovod(events)
    if not hv.any():
        return events
    return _concat([events.filter(pa.array(~hv)), prep.events.filter(pa.array(prep._merged_rows()))])


# ---------------------------------------------------------------------------------------------------
# preparing the timelines


def _shift_columns(t: pa.Table, offset: int, it_base: int, timeline: int, id_base: int = 0) -> pa.Table:
    """Apply a clock offset to every time column (``*start_ns``, ``*end_ns``, ``*tick_ns``, ``ts_ns``),
    renumber ``iteration`` and ``collective_id`` and add the ``timeline`` column."""
    for name in list(t.column_names):
        col = t.column(name)
        is_time = name in ("start_ns", "end_ns", "ts_ns") or name.endswith(("_start_ns", "_end_ns", "_tick_ns"))
        shift = offset if is_time else it_base if name == "iteration" else id_base if name == "collective_id" \
            else 0
        if shift and pa.types.is_integer(col.type):
            t = t.set_column(t.schema.get_field_index(name), t.schema.field(name), pc.add(col, shift))
    return t.append_column("timeline", pa.array(np.full(t.num_rows, timeline, dtype=np.int32)))


def _responses(pf: ParsedFile) -> pl.DataFrame:
    """Fused responses of a timeline: ``rs, re`` (union extent of their transfer phases), ``it``."""
    inst = pl.from_arrow(pf.tables["horovod_instances"].select(
        ["fusion_group", "transfer_start_ns", "transfer_end_ns", "iteration"]))
    assert isinstance(inst, pl.DataFrame)
    return (inst.filter(pl.col("fusion_group").is_not_null() & pl.col("transfer_start_ns").is_not_null())
            .group_by("fusion_group").agg(pl.col("transfer_start_ns").min().alias("rs"),
                                          pl.col("transfer_end_ns").max().alias("re"),
                                          pl.col("iteration").min().alias("it"))
            .sort("rs"))


def _rank0_kernels(traces: TraceSet, step_marker: str | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rank 0's communication events in its trace: starts, ends, iteration (-1 unknown)."""
    from tracekit.analysis import iterations

    ev = traces.events
    sel = pc.and_(pc.equal(ev.column("rank"), 0), pa.array(~_is_horovod(ev)))
    ev0 = ev.filter(sel)
    if ev0.num_rows == 0:
        return (np.zeros(0, np.int64),) * 3
    with contextlib.suppress(TraceError):  # a bad --step-marker is reported by the main pipeline
        ev0, _ = iterations.assign(ev0, step_marker)
    comm = _flags(ev0.column("kind"), lambda v: v == "comm")
    start = ev0.column("start_ns").to_numpy(zero_copy_only=False)[comm]
    end = start + ev0.column("dur_ns").to_numpy(zero_copy_only=False)[comm]
    it = pc.fill_null(ev0.column("iteration"), -1).to_numpy(zero_copy_only=False)[comm]
    return start, end, it


def prepare(traces: TraceSet, step_marker: str | None = None) -> Prep | None:
    """Collect every Horovod timeline of ``traces``, set its clock against rank 0's trace, and decide
    whether it joins rank 0's attribution (:mod:`tracekit.analysis.horovod.windows`). None when the job has no
    timeline."""
    files = [f for f in traces.files if f.format == FORMAT]
    if not files:
        return None
    kineto = [f for f in traces.files if f.format == "kineto"]
    ranks = traces.ranks
    rank0_traced = bool(ranks.num_rows) and any(
        r["rank"] == 0 and r["format"] == "kineto" for r in ranks.select(["rank", "format"]).to_pylist())
    diags: list[Diagnostic] = []
    notes: list[str] = []
    # rank 0's trace: its extent (activity of any kind), and its kernels when a clock must be found
    ev = traces.events
    not_hvd = ~_is_horovod(ev)
    r0 = pc.fill_null(pc.equal(ev.column("rank"), 0), False).to_numpy(zero_copy_only=False) & not_hvd \
        if ev.num_rows else np.zeros(0, bool)
    if r0.any():
        s0 = ev.column("start_ns").to_numpy(zero_copy_only=False)[r0]
        e0 = s0 + ev.column("dur_ns").to_numpy(zero_copy_only=False)[r0]
        extent = (int(s0.min()), int(e0.max()))
    else:
        extent = None
    kernels: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    placed: list[tuple[ParsedFile, int, bool, str]] = []
    for pf in files:
        clock = pf.meta.get("clock", "relative_unknown")
        offset, merged = 0, False
        if not rank0_traced:
            how = ("not merged: no profiler trace of rank 0 (Horovod's coordinator) among the inputs" if kineto
                   else "timeline only")
        elif clock == "epoch":
            how = "same wall clock as rank 0's trace (Horovod's epoch header, Kineto's baseTimeNanoseconds)"
            merged = True
        else:
            if kernels is None:
                kernels = _rank0_kernels(traces, step_marker)
            resp = _responses(pf)
            a = align(resp.get_column("rs").to_numpy(), resp.get_column("re").to_numpy(), kernels[0], kernels[1],
                      r_it=resp.get_column("it").fill_null(-1).to_numpy(), k_it=kernels[2])
            if a.offset_ns is None:
                how = f"not merged: its clock has no absolute origin (Horovod <= 0.20.0) and {a.text}"
                diags.append(Diagnostic(pf.path, f"Horovod timeline {how}; rank 0's breakdown uses its trace "
                                                 "alone, the timeline's own table is on its own clock"))
            else:
                offset, merged, how = a.offset_ns, True, a.text
        if merged and extent is not None:
            ts = pf.events.column("start_ns").to_numpy(zero_copy_only=False) + offset
            te = ts + pf.events.column("dur_ns").to_numpy(zero_copy_only=False)
            if ts.size and (int(te.max()) < extent[0] or int(ts.min()) > extent[1]):
                merged = False
                how = "not merged: it does not overlap rank 0's trace in time (another run?)"
                diags.append(Diagnostic(pf.path, f"Horovod timeline {how}"))
        placed.append((pf, offset, merged, how))

    # time order of the timelines (for iteration numbering and the timeline index)
    def first(p: tuple[ParsedFile, int, bool, str]) -> int:
        s = p[0].events.column("start_ns")
        m = pc.min(s).as_py() if len(s) else None
        return (m if m is not None else 0) + p[1]

    placed.sort(key=first)
    # Horovod's collective ids continue after those of rank 0's other collectives (a trace's own calls
    # use the same per-rank id space), timeline after timeline
    coll = traces.collectives
    others = coll.filter(pc.fill_null(pc.not_equal(coll.column("source"), FORMAT), True)) if coll.num_rows else coll
    ids0 = others.filter(pc.equal(others.column("rank"), 0)).column("collective_id") if others.num_rows else None
    top = pc.max(ids0).as_py() if ids0 is not None and len(ids0) else None
    id_base = int(top) + 1 if top is not None else 0
    timelines: list[Timeline] = []
    ev_parts, tl_rows, trusted_parts = [], [], []
    inst_parts, tick_parts, it_parts, cyc_parts = [], [], [], []
    coll_parts = []
    base = 0
    world = None
    for idx, (pf, offset, merged, how) in enumerate(placed):
        iters = pf.tables.get("horovod_iterations", schema.empty(schema.ITERATIONS))
        tl = Timeline(idx, pf.path, pf.meta.get("clock", "relative_unknown"), offset, merged, how, base,
                      str(pf.meta.get("iteration_method", "whole-trace")), dict(pf.meta))
        timelines.append(tl)
        world = world or pf.meta.get("world_size")
        e = pf.events
        trusted = np.ones(e.num_rows, dtype=bool)
        flags = pf.tables.get("horovod_flags")
        if flags is not None and flags.num_rows:
            rows = flags.column("row").to_numpy(zero_copy_only=False)
            trusted[rows[(rows >= 0) & (rows < e.num_rows)]] = False
        dur = e.column("dur_ns").to_numpy(zero_copy_only=False)
        bad = dur < 0
        if bad.any():
            trusted &= ~bad
            diags.append(Diagnostic(pf.path, f"{int(bad.sum())} Horovod phase(s) end before they begin (bogus "
                                             "duration): flagged and left out of every figure"))
        e = _shift_columns(e, offset, base, idx, id_base)
        ev_parts.append(e.drop_columns(["timeline"]))
        tl_rows.append(np.full(e.num_rows, idx, dtype=np.int32))
        trusted_parts.append(trusted)
        inst = _with_bus_bytes(pf.tables["horovod_instances"], pf.collectives)
        inst_parts.append(_shift_columns(inst, offset, base, idx, id_base))
        tick_parts.append(_shift_columns(pf.tables["horovod_ticks"], offset, 0, idx))
        it_t = _shift_columns(iters, offset, base, idx)
        it_t = it_t.set_column(it_t.schema.get_field_index("method"), "method",
                               pa.array([f"horovod {tl.method}"] * it_t.num_rows, type=pa.string()))
        it_parts.append(it_t)
        cyc_parts.append(_shift_columns(pf.tables["horovod_cycles"], offset, 0, idx))
        coll_parts.append(_shift_columns(pf.collectives, offset, 0, idx, id_base).drop_columns(["timeline"]))
        base += iters.num_rows
        id_base += pf.collectives.num_rows
    if len(placed) > 1:
        spans = [(first(p), first(p) + 1) for p in placed]
        ends = []
        for p in placed:
            s = p[0].events.column("start_ns").to_numpy(zero_copy_only=False)
            d = p[0].events.column("dur_ns").to_numpy(zero_copy_only=False)
            ends.append(int((s + d).max()) + p[1] if s.size else spans[len(ends)][0])
        for i in range(1, len(placed)):
            if spans[i][0] < ends[i - 1]:
                diags.append(Diagnostic(placed[i][0].path, "this Horovod timeline overlaps another one in time: "
                                        "Horovod writes one per job (on rank 0), are they from different jobs?"))
    events = _concat(ev_parts)
    # collectives: the TraceSet's, with the Horovod rows replaced by the shifted, renumbered ones
    coll = pa.concat_tables([schema.conform(c, schema.COLLECTIVES) for c in (others, *coll_parts)])
    for tl in timelines:
        if tl.merged:
            notes.append(f"Horovod timeline merged into rank 0: {tl.how}")
        elif tl.how != "timeline only":
            notes.append(f"Horovod timeline {tl.how}")
    return Prep(timelines=timelines, events=events, timeline_of_row=np.concatenate(tl_rows),
                trusted=np.concatenate(trusted_parts), instances=_concat_any(inst_parts),
                ticks=_concat_any(tick_parts), iterations=schema.conform(_concat_any(it_parts), schema.ITERATIONS),
                cycles=_concat_any(cyc_parts), collectives=coll, traced=bool(kineto), rank0_traced=rank0_traced,
                diagnostics=diags, notes=notes, world_size=world)


def _concat_any(tables: list[pa.Table]) -> pa.Table:
    tables = [t for t in tables if t is not None]
    if len(tables) == 1:
        return tables[0]
    return pa.concat_tables(tables, promote_options="permissive").unify_dictionaries()


def _with_bus_bytes(inst: pa.Table, collectives: pa.Table) -> pa.Table:
    """Instances with ``payload_bytes`` (S), ``nranks`` and ``bus_bytes`` from their collectives row."""
    i = pl.from_arrow(inst.select(["collective_id"]))
    c = pl.from_arrow(collectives.select(["collective_id", "op", "bytes", "nranks"]))
    assert isinstance(i, pl.DataFrame) and isinstance(c, pl.DataFrame)
    c = c.with_columns(bus_bytes_expr("op", "bytes", "nranks").alias("bus_bytes"))
    j = i.with_row_index("_row").join(c, on="collective_id", how="left").sort("_row")
    return (inst.append_column("payload_bytes", j.get_column("bytes").to_arrow().cast(pa.int64()))
            .append_column("nranks", j.get_column("nranks").to_arrow().cast(pa.int32()))
            .append_column("bus_bytes", j.get_column("bus_bytes").to_arrow().cast(pa.int64())))
