"""Horovod timelines in the analysis (issue 4): iterations, the timeline's own per-iteration table, the
per-tensor table, and merging the timeline into rank 0's five-way attribution.

A Horovod timeline (:mod:`tracekit.parsers.horovod`) is written by the coordinator, rank 0, only. Its rows
are tensors, not threads, and it holds no compute at all. What each phase means here:

* **transfer** — the backend phases (``NCCL_*``, ``MPI_*``, ``GLOO_*``, ``CCL_*``; event kind ``comm``):
  data moving between ranks. Every tensor of a fused response repeats the same phases a few µs apart:
  they are one transfer, so time is always the **union** over tensors, never a sum.
* **negotiation** — ``NEGOTIATE_*`` (kind ``wait``): from the first rank's request for a tensor to the
  moment every rank had asked for it, as rank 0 saw it: waiting for other ranks. The rank whose tick
  came last is that tensor's straggler (ticks exist only where the response cache missed).
* **queue** — ``QUEUE``: behind earlier work on the communication stream; **memcpy** — ``MEMCPY_*`` and
  ``COPY_ALLGATHER_OUTPUT`` (fusion-buffer copies); **wait for data** — ``WAIT_FOR_*``: waiting for this
  rank's own framework to produce the tensor (unfinished compute).

**Iterations.** Horovod's iterations come from *tensor repetition* (the k-th negotiation of the tensors
negotiated most often opens iteration k; the parser's ``horovod_iterations``), method ``horovod
tensor-repetition`` (``horovod whole-trace`` when no tensor repeats). ``CYCLE_START`` markers are not used:
they mark Horovod's background-loop cycles (~1 ms), many per training step. They are used when rank 0
has no step markers (ProfilerStep#N or ``--step-marker``): in a timeline-only job, and for rank 0's
trace when it has none. When rank 0's trace has steps, the steps win and Horovod phases join the step
that contains their start (ordinary assignment by time).

**Clocks and merging.** A timeline is merged into rank 0's attribution only when a profiler trace of
rank 0 is there and both are on one clock. Horovod >= 0.20.1 writes an epoch header (absolute time =
``start_time_since_epoch_in_micros`` + ``ts``) and Kineto's times are ``baseTimeNanoseconds`` + ``ts``:
both are the wall clock of the same process, so nothing is shifted (the spans must overlap, or the files
are from different runs and are not merged). Horovod <= 0.20.0 timestamps count from an unknown origin
(boot or timeline start): such a timeline is aligned on rank 0's communication kernels (FORMATS.md
§5.4): every transfer phase of a fused response must contain the NCCL kernel that carried it, so the
offset is searched for that puts the most kernels inside a response (:func:`align`). Shifts by whole
iterations fit a periodic job equally well; they are told apart by requiring ProfilerStep#k's kernels
to sit in Horovod's iteration k (true when profiling and the timeline both began at the first step),
else the timeline is not merged and a warning says why. A trace with no communication kernels (a CPU
job whose Gloo work runs inside Horovod, invisible to the profiler) cannot be aligned to the precision
attribution needs (the step structure leaves milliseconds of freedom): it is refused, with a warning.

**Merged attribution (rank 0).** Rank 0's five-way breakdown uses the trace's compute and Horovod's
phases: transfer phases are communication of class TRANSFER, ``NEGOTIATE_*`` is communication of
class WAIT (waiting for other ranks), memcpy phases are MEMORY; queue and wait-for-data phases are left
out (they are neither transfer nor waiting for other ranks). So an instant of negotiation with no
compute and no transfer is exposed *waiting*; negotiation under compute is overlapped; and a
window's ``wait_ns + transfer_ns = exposed_comm_ns``. Communication the trace itself has on rank 0
keeps its cross-rank split where collectives were matched, and is TRANSFER otherwise (Horovod's
negotiation already accounts for waiting on the other ranks). Other ranks keep their own attribution.
Phases the parser closed itself (never ended: ``truncated``) and phases with a negative duration (a
damaged or rewritten file) are flagged and never used.

Tables (int64 ns, ``*_share`` ratios, Gbit/s bandwidths, as everywhere in tracekit):

``horovod_breakdown``, one row per window: rank 0's windows when the timeline is merged or alone (then
they are Horovod's own iterations), Horovod's own iterations otherwise. ``iteration, start_ns, end_ns,
wall_ns``; ``transfer_ns`` (union of the transfer phases of every tensor: fused tensors count once);
``link_idle_ns = wall_ns - transfer_ns``; ``negotiation_ns`` (union of ``NEGOTIATE_*``), ``queue_ns``,
``memcpy_ns``, ``wait_for_data_ns`` (each the union of its phases, independently, so they may overlap
each other and the transfer); ``transfer_share``, ``negotiation_share`` (of ``wall_ns``);
``instances`` (tensor op instances whose transfer starts in the window), ``responses`` (fused responses
among them), ``bytes`` (payload S of those instances, dtype × shape), ``bus_bytes`` (nccl-tests bus
factor of the op and world size), ``busbw_gbps = 8 bus_bytes / transfer_ns`` and, with a line rate R,
``link_utilisation = bus_bytes / (R · wall_ns)``. **Idle, for a timeline without compute:**
``link_idle_ns`` is the time the link moved no Horovod data. It is *not* time the job was idle: the
framework was computing (forward, backward, optimizer), negotiating or copying then, and a timeline
cannot tell which; merge it with rank 0's trace for that.

``horovod_tensors``, one row per tensor name (over every timeline): ``tensor, op, dtype, shape, count``
(most frequent), ``bytes`` (dtype × shape of one instance), ``instances``, ``bytes_total``,
``bus_bytes`` (total), ``negotiate_ns`` / ``negotiate_median_ns`` (total / median length of its
``NEGOTIATE_*`` phases), ``negotiation_wait_ns`` (sum of last tick − first tick where both ranks' ticks
were logged) and ``ticked`` (instances with ≥ 2 ticks), ``transfer_ns`` / ``transfer_median_ns``,
``busbw_gbps``, ``link_utilisation``, ``fusion_size_median`` / ``fusion_size_max``, ``last_ticks`` (list:
element r = how often rank r ticked last), ``straggler_rank`` (the rank that ticked last most often) and
``truncated`` (instances the parser had to close; their negotiation figures are left out).
**Fused tensors:** a tensor's transfer time is the whole transfer of the response(s) it travelled in
(the union of the group's transfer phases), because it was on the wire for all of it; so the rows'
``transfer_ns`` must never be added up: :func:`tensor_totals` takes the union over the job instead.
``busbw_gbps`` is the bus bandwidth of those responses (their bus bytes over their transfer time).

``horovod_instances``, ``horovod_ticks``, ``horovod_iterations``, ``horovod_cycles``: the parser's tables
with the clock offset applied, iterations renumbered across timelines, a ``timeline`` column (index of
the file, in time order) and, on instances, ``payload_bytes`` (S), ``nranks`` and ``bus_bytes``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from tracekit import attribution, schema
from tracekit.diagnostics import Diagnostic, TraceError
from tracekit.intervals import sweep, union_length
from tracekit.links import bus_bytes_expr
from tracekit.schema import ParsedFile
from tracekit.traceset import TraceSet

FORMAT = "horovod"
#: event category of every Horovod row (the parser's)
CAT = "horovod"
#: a kernel may start or end this much outside the transfer phase Horovod logged around it
ALIGN_SLACK_NS = 20_000
#: share of rank 0's communication kernels that must fall inside a Horovod transfer phase
ALIGN_MIN_SHARE = 0.6
#: kernels sampled to score candidate offsets, and candidates scored per batch
_ALIGN_SAMPLE = 256
_ALIGN_BATCH = 2048

# classes of the timeline's own sweep
_TR, _NEG, _QUEUE, _MEMCPY, _WFD = 0, 1, 2, 3, 4

BREAKDOWN_COLUMNS = ["iteration", "start_ns", "end_ns", "wall_ns", "transfer_ns", "link_idle_ns",
                     "negotiation_ns", "queue_ns", "memcpy_ns", "wait_for_data_ns", "transfer_share",
                     "negotiation_share", "instances", "responses", "bytes", "bus_bytes", "busbw_gbps",
                     "link_utilisation"]


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
class Alignment:
    """Result of :func:`align`: the offset (None when refused) and a one-line account."""

    offset_ns: int | None
    text: str
    matched: int = 0
    uncertainty_ns: int | None = None


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
        """Horovod's iterations where rank 0 has no step markers (module docstring), and every Horovod row
        appended that :meth:`base_events` left out, so the events table holds them all."""
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


@dataclass
class Result:
    """Horovod results of one analysis (every table is also exported)."""

    timelines: list[Timeline]
    breakdown: pa.Table  # horovod_breakdown
    tensors: pa.Table  # horovod_tensors
    totals: dict[str, Any]
    instances: pa.Table
    ticks: pa.Table
    iterations: pa.Table
    cycles: pa.Table
    only: bool
    merged: bool
    method: str
    world_size: int | None

    def tables(self) -> dict[str, pa.Table]:
        return {"horovod_breakdown": self.breakdown, "horovod_tensors": self.tensors,
                "horovod_instances": self.instances, "horovod_ticks": self.ticks,
                "horovod_iterations": self.iterations, "horovod_cycles": self.cycles}


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


def align(rs: np.ndarray, re: np.ndarray, ks: np.ndarray, ke: np.ndarray, *,
          r_it: np.ndarray | None = None, k_it: np.ndarray | None = None) -> Alignment:
    """The offset d (ns) that puts the kernels ``[ks, ke)`` inside the Horovod transfer phases ``[rs, re)``
    shifted by d (``rs + d <= ks`` and ``ke <= re + d``, within :data:`ALIGN_SLACK_NS`).

    Candidates come from pairing up to three anchor kernels with every response long enough to hold them
    (the middle of the interval of offsets that fits the pair); each is scored by how many of up to
    :data:`_ALIGN_SAMPLE` kernels it puts inside a response (vectorised: one searchsorted per batch of
    candidates). Best-scoring candidates further apart than a response are *different* alignments: a
    periodic job fits shifts by whole iterations equally. Then the iteration numbers decide, when given
    (``r_it`` per response, ``k_it`` per kernel): the alignment where kernels of step k sit in Horovod's
    iteration k wins; otherwise the result is refused. The chosen offset is refined to the middle of the
    interval every matched pair allows, whose half-width is the uncertainty.
    """
    rs, re = np.asarray(rs, np.int64), np.asarray(re, np.int64)
    ks, ke = np.asarray(ks, np.int64), np.asarray(ke, np.int64)
    if rs.size == 0:
        return Alignment(None, "the timeline has no transfer phase to align")
    if ks.size < 3:
        return Alignment(None, "rank 0's trace has no communication kernels to align the timeline on")
    o = np.argsort(rs, kind="stable")
    rs, re = rs[o], re[o]
    r_it = None if r_it is None else np.asarray(r_it)[o]
    ko = np.argsort(ks, kind="stable")
    ks, ke = ks[ko], ke[ko]
    k_it = None if k_it is None else np.asarray(k_it)[ko]
    sample = np.unique(np.linspace(0, ks.size - 1, min(ks.size, _ALIGN_SAMPLE)).round().astype(np.int64))
    sks, ske = ks[sample], ke[sample]
    rlen = re - rs
    cands = []
    for a in np.unique(np.array([0, ks.size // 2, ks.size - 1])):
        klen = ke[a] - ks[a]
        ok = rlen >= klen - 2 * ALIGN_SLACK_NS
        cands.append(((ks[a] - rs[ok]) + (ke[a] - re[ok])) // 2)
    cand = np.unique(np.concatenate(cands))
    if cand.size == 0:
        return Alignment(None, "no Horovod transfer phase is long enough to hold rank 0's communication kernels")
    scores = np.empty(cand.size, dtype=np.int64)
    for lo in range(0, cand.size, _ALIGN_BATCH):
        d = cand[lo:lo + _ALIGN_BATCH, None]
        scores[lo:lo + _ALIGN_BATCH] = _contained(rs, re, sks[None, :] - d, ske[None, :] - d).sum(axis=1)
    best = int(scores.max())
    need = max(3, int(np.ceil(ALIGN_MIN_SHARE * sample.size)))
    if best < need:
        return Alignment(None, f"at best {best} of {sample.size} communication kernels of rank 0's trace fall "
                               "inside a Horovod transfer phase, whatever the offset")
    tie = max(1, sample.size // 50)
    good = np.sort(cand[scores >= best - tie])
    gap = int(np.median(rlen)) + 2 * ALIGN_SLACK_NS
    cluster_starts = np.r_[0, np.flatnonzero(np.diff(good) > gap) + 1]
    reps = [int(np.median(c)) for c in np.split(good, cluster_starts[1:])]
    note = ""
    if len(reps) > 1:
        if r_it is None or k_it is None:
            return Alignment(None, f"{len(reps)} offsets (shifts by whole iterations) fit rank 0's kernels "
                                   "equally well")
        agree = []
        for d in reps:
            j = _container(rs, re, ks - d, ke - d)
            m = (j >= 0) & (k_it >= 0)
            agree.append(float(np.mean(k_it[m] == r_it[j[m]])) if m.any() else 0.0)
        winners = [d for d, a in zip(reps, agree, strict=True) if a >= 0.8]
        if len(winners) != 1:
            return Alignment(None, f"{len(reps)} offsets (shifts by whole iterations) fit rank 0's kernels equally "
                                   "well, and the step numbers do not single one out")
        reps = winners
        note = "; of the shifts by whole iterations, the one where ProfilerStep#k holds Horovod's iteration k"
    d0 = reps[0]
    j = _container(rs, re, ks - d0, ke - d0)
    m = j >= 0
    lower = int((ke[m] - re[j[m]]).max())
    upper = int((ks[m] - rs[j[m]]).min())
    if lower <= upper:
        d, unc = (lower + upper) // 2, (upper - lower) // 2
    else:
        d = int(np.median(((ks[m] - rs[j[m]]) + (ke[m] - re[j[m]])) // 2))
        unc = (lower - upper) // 2
    return Alignment(d, f"aligned on {int(m.sum())} of {ks.size} communication kernels of rank 0's trace "
                        f"(±{unc / 1000:.0f} µs){note}", matched=int(m.sum()), uncertainty_ns=unc)


def _contained(rs: np.ndarray, re: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Whether each interval [s, e) lies inside the response that starts last at or before s (+ slack)."""
    i = np.searchsorted(rs, s + ALIGN_SLACK_NS, side="right") - 1
    return (i >= 0) & (e <= re[np.maximum(i, 0)] + ALIGN_SLACK_NS)


def _container(rs: np.ndarray, re: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray:
    i = np.searchsorted(rs, s + ALIGN_SLACK_NS, side="right") - 1
    ok = (i >= 0) & (e <= re[np.maximum(i, 0)] + ALIGN_SLACK_NS)
    return np.where(ok, i, -1)


def _rank0_kernels(traces: TraceSet, step_marker: str | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rank 0's communication events in its trace: starts, ends, iteration (-1 unknown)."""
    from tracekit import iterations

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
    whether it joins rank 0's attribution (module docstring). None when the job has no timeline."""
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


# ---------------------------------------------------------------------------------------------------
# tables


def _phase_arrays(prep: Prep) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Start, end and class (-1: none) of every trusted Horovod phase."""
    e = prep.events
    kind, name = e.column("kind"), e.column("name")
    start = e.column("start_ns").to_numpy(zero_copy_only=False)
    end = start + e.column("dur_ns").to_numpy(zero_copy_only=False)
    cls = np.full(e.num_rows, -1, dtype=np.int64)
    cls[_flags(kind, lambda v: v == "comm")] = _TR
    cls[_flags(name, lambda v: v.startswith("NEGOTIATE_"))] = _NEG
    cls[_flags(kind, lambda v: v == "queue")] = _QUEUE
    cls[_flags(kind, lambda v: v == "memory")] = _MEMCPY
    cls[_flags(name, lambda v: v.startswith("WAIT_FOR_"))] = _WFD
    ok = prep.trusted & (cls >= 0)
    return start[ok], end[ok], cls[ok]


def breakdown(prep: Prep, windows: pl.DataFrame, rate_bps: float | None = None) -> pa.Table:
    """The ``horovod_breakdown`` table (module docstring): one vectorised sweep of every trusted phase of
    every timeline over the windows."""
    w = windows.sort("start_ns")
    ws, we = w.get_column("start_ns").to_numpy().astype(np.int64), w.get_column("end_ns").to_numpy().astype(np.int64)
    m = ws.size
    start, end, cls = _phase_arrays(prep)
    s = sweep(np.zeros(start.size, np.int64), start, end, cls, 5, np.zeros(m, np.int64), ws, we)
    tot = {c: s.total(m, (s.state & (1 << c)) != 0) for c in (_TR, _NEG, _QUEUE, _MEMCPY, _WFD)}
    wall = we - ws
    inst = pl.from_arrow(prep.instances.select(["timeline", "fusion_group", "transfer_start_ns", "payload_bytes",
                                                "bus_bytes"]))
    assert isinstance(inst, pl.DataFrame)
    inst = inst.filter(pl.col("transfer_start_ns").is_not_null())
    j = _window_index(inst.get_column("transfer_start_ns").to_numpy(), ws, we)
    inst = inst.with_columns(pl.Series("w", j)).filter(pl.col("w") >= 0)
    agg = inst.group_by("w").agg(
        pl.len().alias("instances"),
        pl.struct(["timeline", "fusion_group"]).n_unique().alias("responses"),
        pl.col("payload_bytes").sum().alias("bytes"), pl.col("payload_bytes").is_not_null().any().alias("_bk"),
        pl.col("bus_bytes").sum().alias("bus_bytes"), pl.col("bus_bytes").is_not_null().any().alias("_bbk"))
    per = pl.DataFrame({"w": np.arange(m, dtype=np.int64)}).join(
        agg.with_columns(pl.col("w").cast(pl.Int64)), on="w", how="left").sort("w")
    transfer = tot[_TR]
    out = pl.DataFrame({
        "iteration": w.get_column("iteration").cast(pl.Int64), "start_ns": ws, "end_ns": we, "wall_ns": wall,
        "transfer_ns": transfer, "link_idle_ns": wall - transfer, "negotiation_ns": tot[_NEG],
        "queue_ns": tot[_QUEUE], "memcpy_ns": tot[_MEMCPY], "wait_for_data_ns": tot[_WFD],
    }).with_columns(
        pl.when(pl.col("wall_ns") > 0).then(pl.col("transfer_ns") / pl.col("wall_ns")).alias("transfer_share"),
        pl.when(pl.col("wall_ns") > 0).then(pl.col("negotiation_ns") / pl.col("wall_ns")).alias("negotiation_share"),
        per.get_column("instances").fill_null(0).cast(pl.Int64).alias("instances"),
        per.get_column("responses").fill_null(0).cast(pl.Int64).alias("responses"),
        pl.when(per.get_column("_bk")).then(per.get_column("bytes")).cast(pl.Int64).alias("bytes"),
        pl.when(per.get_column("_bbk")).then(per.get_column("bus_bytes")).cast(pl.Int64).alias("bus_bytes"),
    )
    out = out.with_columns(
        pl.when(pl.col("transfer_ns") > 0).then(pl.col("bus_bytes") * 8 / pl.col("transfer_ns")).alias("busbw_gbps"),
        (pl.when(pl.col("wall_ns") > 0).then(pl.col("bus_bytes") * 8e9 / (rate_bps * pl.col("wall_ns")))
         if rate_bps else pl.lit(None, dtype=pl.Float64)).alias("link_utilisation"),
    )
    return out.select(BREAKDOWN_COLUMNS).to_arrow()


def _group_transfer(prep: Prep) -> pl.DataFrame:
    """Per fused response (``timeline, fusion_group``): the union of its tensors' transfer phases
    (``group_transfer_ns``) and its bus bytes; one sweep with the group as the sweep's "rank"."""
    inst = pl.from_arrow(prep.instances.select(["timeline", "collective_id", "fusion_group", "bus_bytes"]))
    assert isinstance(inst, pl.DataFrame)
    inst = inst.filter(pl.col("fusion_group").is_not_null())
    groups = inst.select(["timeline", "fusion_group"]).unique().sort(["timeline", "fusion_group"]) \
        .with_row_index("g").with_columns(pl.col("g").cast(pl.Int64))
    e = prep.events
    ok = _flags(e.column("kind"), lambda v: v == "comm") & prep.trusted
    ev = pl.DataFrame({
        "timeline": prep.timeline_of_row[ok],
        "collective_id": pc.fill_null(e.column("collective_id"), -1).to_numpy(zero_copy_only=False)[ok],
        "start_ns": e.column("start_ns").to_numpy(zero_copy_only=False)[ok],
        "end_ns": (e.column("start_ns").to_numpy(zero_copy_only=False)
                   + e.column("dur_ns").to_numpy(zero_copy_only=False))[ok],
    })
    ev = ev.join(inst.select(["timeline", "collective_id", "fusion_group"]).with_columns(
        pl.col("timeline").cast(pl.Int32)), on=["timeline", "collective_id"], how="inner")
    ev = ev.join(groups.with_columns(pl.col("timeline").cast(pl.Int32)), on=["timeline", "fusion_group"])
    ext = ev.group_by("g").agg(pl.col("start_ns").min().alias("gs"), pl.col("end_ns").max().alias("ge")).sort("g")
    union = union_length(ev.get_column("g").to_numpy(), ev.get_column("start_ns").to_numpy(),
                         ev.get_column("end_ns").to_numpy(), ext.get_column("g").to_numpy(),
                         ext.get_column("gs").to_numpy(), ext.get_column("ge").to_numpy() + 1)
    ext = ext.with_columns(pl.Series("group_transfer_ns", union))
    bus = inst.group_by(["timeline", "fusion_group"]).agg(
        pl.col("bus_bytes").sum().alias("group_bus_bytes"), pl.col("bus_bytes").is_not_null().all().alias("_known"))
    return (groups.join(ext.select(["g", "group_transfer_ns"]), on="g", how="left")
            .join(bus, on=["timeline", "fusion_group"], how="left")
            .with_columns(pl.when(pl.col("_known")).then(pl.col("group_bus_bytes")).alias("group_bus_bytes"))
            .drop(["g", "_known"]))


def tensors(prep: Prep, rate_bps: float | None = None) -> pa.Table:
    """The ``horovod_tensors`` table (module docstring), one row per tensor name, by total transfer time."""
    inst = pl.from_arrow(prep.instances.select(
        ["timeline", "tensor", "op", "dtype", "shape", "count", "bytes", "payload_bytes", "bus_bytes",
         "negotiate_ns", "ticks", "negotiation_wait_ns", "straggler_rank", "fusion_group", "fusion_size",
         "transfer_ns", "truncated"]))
    assert isinstance(inst, pl.DataFrame)
    inst = inst.with_columns(pl.col(c).cast(pl.String) for c in ("tensor", "op", "dtype", "shape"))
    inst = inst.join(_group_transfer(prep), on=["timeline", "fusion_group"], how="left")
    # an instance the parser had to close itself (never ended) has no trustworthy negotiation figures
    trunc = pl.col("truncated").fill_null(False)
    inst = inst.with_columns(pl.when(~trunc).then(pl.col("negotiate_ns")).alias("negotiate_ns"),
                             pl.when(~trunc).then(pl.col("negotiation_wait_ns")).alias("negotiation_wait_ns"),
                             pl.when(~trunc).then(pl.col("ticks")).otherwise(0).alias("ticks"))
    world = prep.world_size or 0
    top = inst.get_column("straggler_rank").max() if inst.height else None
    n_ranks = max(world, int(top) + 1) if top is not None else world  # type: ignore[arg-type]

    def mode(c: str) -> pl.Expr:
        return pl.col(c).drop_nulls().mode().sort().first().alias(c)

    timed = pl.col("group_transfer_ns").is_not_null() & pl.col("group_bus_bytes").is_not_null()
    agg = inst.group_by("tensor").agg(
        mode("op"), mode("dtype"), mode("shape"), mode("count"), mode("bytes"),
        pl.len().alias("instances"),
        pl.col("payload_bytes").sum().alias("bytes_total"),
        pl.col("bus_bytes").sum().alias("bus_bytes"),
        pl.col("negotiate_ns").sum().alias("negotiate_ns"),
        pl.col("negotiate_ns").median().round().cast(pl.Int64).alias("negotiate_median_ns"),
        pl.col("negotiation_wait_ns").filter(pl.col("ticks") >= 2).sum().alias("negotiation_wait_ns"),
        (pl.col("ticks") >= 2).sum().cast(pl.Int64).alias("ticked"),
        pl.col("group_transfer_ns").sum().alias("transfer_ns"),
        pl.col("group_transfer_ns").median().round().cast(pl.Int64).alias("transfer_median_ns"),
        (pl.col("group_bus_bytes").filter(timed).sum() * 8
         / pl.col("group_transfer_ns").filter(timed).sum()).alias("busbw_gbps"),
        pl.col("fusion_size").median().alias("fusion_size_median"),
        pl.col("fusion_size").max().alias("fusion_size_max"),
        *[(pl.col("straggler_rank") == r).sum().cast(pl.Int64).alias(f"_last{r}") for r in range(n_ranks)],
        pl.col("truncated").sum().cast(pl.Int64).alias("truncated"),
    )
    last_cols = [f"_last{r}" for r in range(n_ranks)]
    agg = agg.with_columns(
        pl.when(pl.col("busbw_gbps").is_finite()).then(pl.col("busbw_gbps")).alias("busbw_gbps"),
        (pl.concat_list(last_cols) if last_cols else pl.lit([], dtype=pl.List(pl.Int64))).alias("last_ticks"),
    )
    if last_cols:
        agg = agg.with_columns(
            pl.when(pl.max_horizontal(last_cols) > 0)
            .then(pl.col("last_ticks").list.arg_max().cast(pl.Int32)).alias("straggler_rank"))
    else:
        agg = agg.with_columns(pl.lit(None, dtype=pl.Int32).alias("straggler_rank"))
    agg = agg.with_columns(
        (pl.col("busbw_gbps") * 1e9 / rate_bps if rate_bps else pl.lit(None, dtype=pl.Float64))
        .alias("link_utilisation"),
        pl.when(pl.col("bytes_total") > 0).then(pl.col("bytes_total")).alias("bytes_total"),
        pl.when(pl.col("bus_bytes") > 0).then(pl.col("bus_bytes")).alias("bus_bytes"),
    )
    cols = ["tensor", "op", "dtype", "shape", "count", "bytes", "instances", "bytes_total", "bus_bytes",
            "negotiate_ns", "negotiate_median_ns", "negotiation_wait_ns", "ticked", "transfer_ns",
            "transfer_median_ns", "busbw_gbps", "link_utilisation", "fusion_size_median", "fusion_size_max",
            "last_ticks", "straggler_rank", "truncated"]
    return agg.select(cols).sort(["transfer_ns", "tensor"], descending=[True, False], nulls_last=True).to_arrow()


def tensor_totals(prep: Prep, tensors_table: pa.Table, rate_bps: float | None = None) -> dict[str, Any]:
    """Job totals of the tensor table. Times are unions over every timeline (a fused response counts once,
    concurrent negotiations once), never sums of the per-tensor rows."""
    start, end, cls = _phase_arrays(prep)
    lo = int(start.min()) if start.size else 0
    hi = int(end.max()) + 1 if end.size else 1
    s = sweep(np.zeros(start.size, np.int64), start, end, cls, 5, np.zeros(1, np.int64),
              np.array([lo]), np.array([hi]))
    transfer = int(s.total(1, (s.state & (1 << _TR)) != 0)[0])
    negotiation = int(s.total(1, (s.state & (1 << _NEG)) != 0)[0])
    t = pl.from_arrow(tensors_table)
    inst = pl.from_arrow(prep.instances.select(["straggler_rank", "timeline", "fusion_group", "bus_bytes"]))
    assert isinstance(t, pl.DataFrame) and isinstance(inst, pl.DataFrame)
    bus = int(inst.get_column("bus_bytes").sum() or 0)
    strag = inst.get_column("straggler_rank").drop_nulls().value_counts().sort("straggler_rank")
    last = {int(r): int(n) for r, n in strag.iter_rows()}
    busbw = bus * 8 / transfer if transfer and bus else None
    return {
        "tensors": t.height,
        "instances": int(t.get_column("instances").sum() or 0) if t.height else 0,
        "responses": inst.filter(pl.col("fusion_group").is_not_null())
        .select(["timeline", "fusion_group"]).unique().height,
        "bytes_total": int(t.get_column("bytes_total").sum() or 0) if t.height else 0,
        "bus_bytes": bus,
        "span_ns": hi - lo,
        "transfer_ns": transfer,
        "negotiation_ns": negotiation,
        "busbw_gbps": busbw,
        "link_utilisation": busbw * 1e9 / rate_bps if busbw is not None and rate_bps else None,
        "last_ticks": last,
        "judged": int(sum(last.values())),
    }


def result(prep: Prep, iters: pa.Table, rate_bps: float | None) -> Result:
    """Every Horovod table of the job, for the windows the analysis settled on."""
    hb = breakdown(prep, prep.windows(iters), rate_bps)
    tt = tensors(prep, rate_bps)
    methods = sorted({t.method for t in prep.timelines})
    return Result(timelines=prep.timelines, breakdown=hb, tensors=tt, totals=tensor_totals(prep, tt, rate_bps),
                  instances=prep.instances, ticks=prep.ticks, iterations=prep.iterations, cycles=prep.cycles,
                  only=prep.only, merged=prep.merged, method=", ".join(f"horovod {m}" for m in methods),
                  world_size=prep.world_size)


def summary(res: Result) -> dict[str, Any]:
    """Headline figures of ``horovod_breakdown``: sums over the windows and shares of their wall time."""
    b = pl.from_arrow(res.breakdown)
    assert isinstance(b, pl.DataFrame)
    out: dict[str, Any] = {"windows": b.height}
    if b.height == 0:
        return out
    wall = int(b.get_column("wall_ns").sum())
    for c in ("transfer_ns", "link_idle_ns", "negotiation_ns", "queue_ns", "memcpy_ns", "wait_for_data_ns"):
        v = int(b.get_column(c).sum())
        out[c] = v
        out[c.replace("_ns", "_share")] = v / wall if wall else None
    out["wall_ns"] = wall
    out["median_wall_ns"] = int(b.get_column("wall_ns").median())  # type: ignore[arg-type]
    bus = b.get_column("bus_bytes").drop_nulls()
    out["bus_bytes_per_window"] = int(bus.mean()) if bus.len() else None  # type: ignore[arg-type]
    known = b.filter(pl.col("bus_bytes").is_not_null())
    tr = int(known.get_column("transfer_ns").sum()) if known.height else 0
    out["busbw_gbps"] = int(known.get_column("bus_bytes").sum()) * 8 / tr if tr else None
    util = b.get_column("link_utilisation").drop_nulls()
    if util.len():
        kw = int(known.get_column("wall_ns").sum())
        out["link_utilisation"] = float((known.get_column("link_utilisation") * known.get_column("wall_ns")).sum()) \
            / kw if kw else None
    else:
        out["link_utilisation"] = None
    return out
