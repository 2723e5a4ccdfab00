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

Modules: :mod:`tracekit.analysis.horovod.prep` (:func:`prepare` and :class:`Prep`: clocks, merging, iterations, rank 0's
merged attribution), :mod:`tracekit.analysis.horovod.align` (:func:`align`) and this one (the tables, :func:`result`,
:func:`summary`); all of it is importable from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.analysis.horovod.align import ALIGN_MIN_SHARE, ALIGN_SLACK_NS, Alignment, align
from tracekit.analysis.horovod.prep import CAT, FORMAT, Prep, Timeline, _flags, _window_index, prepare, without_timeline
from tracekit.analysis.intervals import sweep, union_length

# classes of the timeline's own sweep
_TR, _NEG, _QUEUE, _MEMCPY, _WFD = 0, 1, 2, 3, 4

BREAKDOWN_COLUMNS = ["iteration", "start_ns", "end_ns", "wall_ns", "transfer_ns", "link_idle_ns",
                     "negotiation_ns", "queue_ns", "memcpy_ns", "wait_for_data_ns", "transfer_share",
                     "negotiation_share", "instances", "responses", "bytes", "bus_bytes", "busbw_gbps",
                     "link_utilisation"]


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


__all__ = ["ALIGN_MIN_SHARE", "ALIGN_SLACK_NS", "BREAKDOWN_COLUMNS", "CAT", "FORMAT", "Alignment", "Prep",
           "Result", "Timeline", "align", "breakdown", "prepare", "result", "summary", "tensor_totals", "tensors",
           "without_timeline"]
