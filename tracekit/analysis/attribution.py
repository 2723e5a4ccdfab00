"""Five-way attribution of every iteration window of every rank (DESIGN.md "Attribution").

Inside a window every instant is exactly one of compute, overlapped (compute and communication at
once), exposed_comm, memory (only copies/sets) or idle; lanes are unioned, so concurrent kernels
count once, and the five add up to the window length to the nanosecond. Exposed communication is
split into waiting for other ranks and transfer when the caller knows, per communication interval,
when its last member arrived (:mod:`tracekit.analysis.collectives`).
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

from tracekit.analysis.intervals import sweep
from tracekit.model import schema

#: interval classes of the sweep. Communication is TRANSFER without a split; with one (matched
#: collectives) it is WAIT, TRANSFER, or UNSPLIT for communication whose split is unknown.
COMPUTE, TRANSFER, WAIT, MEMORY, UNSPLIT = 0, 1, 2, 3, 4
_BIT = {c: 1 << c for c in (COMPUTE, TRANSFER, WAIT, MEMORY, UNSPLIT)}


def activity(events: pa.Table) -> pl.DataFrame:
    """The intervals attribution looks at: ``rank, start_ns, end_ns, cls, row``.

    Compute is device kernels on ranks that have device activity, and CPU operators on threads that
    do no communication on CPU-only ranks (gloo jobs). Communication is every ``comm`` event;
    memory every ``memory`` event. Annotations, runtime calls and Python frames never count.
    """
    df = pl.from_arrow(events.select(["rank", "lane", "kind", "start_ns", "dur_ns", "device"]))
    assert isinstance(df, pl.DataFrame)
    # lane and kind stay categorical: comparing and joining their codes is what a job's millions of rows need
    df = df.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias("row"))
    on_device = pl.col("device").is_not_null()
    gpu_ranks = df.filter(on_device & pl.col("kind").is_in(["compute", "comm", "memory"])) \
        .get_column("rank").unique().implode()
    comm_lanes = df.filter(pl.col("kind") == "comm").select(["rank", "lane"]).unique()
    cpu_compute = (df.filter(~pl.col("rank").is_in(gpu_ranks) & (pl.col("kind") == "cpu_op"))
                   .join(comm_lanes, on=["rank", "lane"], how="anti"))
    gpu_compute = df.filter(pl.col("rank").is_in(gpu_ranks) & on_device & (pl.col("kind") == "compute"))
    parts = [
        gpu_compute.with_columns(pl.lit(COMPUTE).alias("cls")),
        cpu_compute.with_columns(pl.lit(COMPUTE).alias("cls")),
        df.filter(pl.col("kind") == "comm").with_columns(pl.lit(TRANSFER).alias("cls")),
        df.filter(pl.col("kind") == "memory").with_columns(pl.lit(MEMORY).alias("cls")),
    ]
    out = pl.concat([p.select(["rank", "start_ns", (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"),
                               pl.col("cls").cast(pl.Int64), "row"]) for p in parts])
    return out


def breakdown(events: pa.Table, iterations: pa.Table, collectives: pa.Table | None = None,
              comm_split: pl.DataFrame | None = None, act: pl.DataFrame | None = None) -> pa.Table:
    """The ``breakdown`` table: one row per (rank, iteration) window.

    ``comm_split`` (optional, :func:`tracekit.analysis.collectives.comm_split`) replaces every communication
    interval by ``rank, start_ns, end_ns, cls`` rows of class WAIT, TRANSFER or UNSPLIT. A window's
    ``wait_ns``/``transfer_ns`` are known (and add up to ``exposed_comm_ns``) when none of its
    communication is UNSPLIT; otherwise, and without ``comm_split``, they are null. Where one interval
    waits while a concurrent one transfers, the instant counts as transfer (the link is moving data).

    ``link_active_ns`` is the union of communication time not known to be waiting: the union of TRANSFER
    time when the window's split is known, of all communication otherwise. The other link columns are
    left null here (:func:`tracekit.analysis.links.window_links` fills them). ``act``: :func:`activity` of
    ``events``, when the caller has it already.
    """
    if iterations.num_rows == 0:
        return schema.empty(schema.BREAKDOWN)
    act = activity(events) if act is None else act
    if comm_split is not None:
        act = pl.concat([act.filter(pl.col("cls") != TRANSFER).drop("row"),
                         comm_split.select(["rank", "start_ns", "end_ns", pl.col("cls").cast(pl.Int64)])],
                        how="vertical_relaxed")
    win = sorted_windows(iterations)
    totals = window_totals(act.get_column("rank").to_numpy().astype(np.int64), act.get_column("start_ns").to_numpy(),
                           act.get_column("end_ns").to_numpy(), act.get_column("cls").to_numpy(),
                           win.get_column("rank").to_numpy().astype(np.int64), win.get_column("start_ns").to_numpy(),
                           win.get_column("end_ns").to_numpy())
    return table(win, totals, collectives, split=comm_split is not None)


def sorted_windows(iterations: pa.Table) -> pl.DataFrame:
    """The iteration windows in the order of the breakdown rows (rank, then start)."""
    win = pl.from_arrow(iterations)
    assert isinstance(win, pl.DataFrame)
    return win.sort(["rank", "start_ns"])


#: the per-window sums :func:`window_totals` returns
TOTALS = ("compute", "overlapped", "exposed", "memory", "transfer", "unsplit", "link_active")


def window_totals(rank: np.ndarray, start: np.ndarray, end: np.ndarray, cls: np.ndarray, w_rank: np.ndarray,
                  w_start: np.ndarray, w_end: np.ndarray) -> dict[str, np.ndarray]:
    """Time per class in each window (one sweep over the intervals): compute, overlapped, exposed, memory,
    the transfer part of exposed, UNSPLIT communication, and the link's active time. Only intervals
    overlapping a window matter, so windows can be swept in groups with just the intervals that reach
    them (:mod:`tracekit.scale.bounded`)."""
    s = sweep(rank, start, end, cls, 5, w_rank, w_start, w_end)
    m = len(w_start)
    c = (s.state & _BIT[COMPUTE]) != 0
    t = (s.state & _BIT[TRANSFER]) != 0
    wt = (s.state & _BIT[WAIT]) != 0
    u = (s.state & _BIT[UNSPLIT]) != 0
    comm = t | wt | u
    mem = (s.state & _BIT[MEMORY]) != 0
    return {"compute": s.total(m, c & ~comm), "overlapped": s.total(m, c & comm),
            "exposed": s.total(m, ~c & comm), "memory": s.total(m, ~c & ~comm & mem),
            "transfer": s.total(m, ~c & (t | u)), "unsplit": s.total(m, u), "link_active": s.total(m, t | u)}


def table(win: pl.DataFrame, totals: dict[str, np.ndarray], collectives: pa.Table | None, *,
          split: bool | None = None) -> pa.Table:
    """The breakdown table from the sorted windows and their totals."""
    w_rank = win.get_column("rank").to_numpy().astype(np.int64)
    w_start = win.get_column("start_ns").to_numpy()
    w_end = win.get_column("end_ns").to_numpy()
    m = len(w_start)
    compute, overlapped, exposed, memory = (totals[k] for k in ("compute", "overlapped", "exposed", "memory"))
    wall = w_end - w_start
    idle = wall - compute - overlapped - exposed - memory
    if split:
        transfer = totals["transfer"]
        unknown = totals["unsplit"] > 0
        wait_arr, transfer_arr = pa.array(exposed - transfer, mask=unknown), pa.array(transfer, mask=unknown)
    else:
        wait_arr = transfer_arr = pa.nulls(m, pa.int64())
    comm_bytes = bytes_per_window(collectives, w_rank, w_start, w_end)
    return schema.table(schema.BREAKDOWN, {
        "rank": win.get_column("rank").to_arrow(), "iteration": win.get_column("iteration").to_arrow(),
        "start_ns": w_start, "end_ns": w_end, "wall_ns": wall, "compute_ns": compute,
        "overlapped_ns": overlapped, "exposed_comm_ns": exposed, "memory_ns": memory, "idle_ns": idle,
        "wait_ns": wait_arr, "transfer_ns": transfer_arr, "comm_ns": overlapped + exposed,
        "comm_bytes": comm_bytes, "link_active_ns": totals["link_active"],
    })


def bytes_per_window(collectives: pa.Table | pl.DataFrame | None, w_rank: np.ndarray, w_start: np.ndarray,
                     w_end: np.ndarray, column: str = "bytes") -> pa.Array:
    """Sum of ``column`` (payload bytes S by default) over the collectives that start inside each window;
    null for a window with a collective of unknown size (an unknown is never counted as zero: a partial sum
    would understate the traffic and every figure built on it)."""
    m = len(w_start)
    if collectives is None or (collectives.num_rows if isinstance(collectives, pa.Table)
                               else collectives.height) == 0:
        return pa.array(np.zeros(m, dtype=np.int64))
    names = collectives.column_names if isinstance(collectives, pa.Table) else collectives.columns
    cols = ["rank", "start_ns", column, *(["op"] if "op" in names and column != "op" else [])]
    c = pl.from_arrow(collectives.select(cols)) if isinstance(collectives, pa.Table) else collectives.select(cols)
    assert isinstance(c, pl.DataFrame)
    c = c.rename({column: "bytes"}).filter(pl.col("start_ns").is_not_null())
    if "op" in c.columns:  # a barrier moves no payload, whatever its (unknown) size
        c = c.with_columns(pl.when(pl.col("op") == "barrier").then(pl.lit(0, pl.Int64)).otherwise("bytes")
                           .alias("bytes"))
    win = pl.DataFrame({"rank": w_rank.astype(np.int32), "w_start": w_start, "w_end": w_end,
                        "w": np.arange(m)}).sort("w_start")
    j = (c.with_columns(pl.col("rank").cast(pl.Int32)).sort("start_ns")
         .join_asof(win, left_on="start_ns", right_on="w_start", by="rank", strategy="backward",
                    check_sortedness=False)
         .filter(pl.col("start_ns") < pl.col("w_end")))
    agg = j.group_by("w").agg(pl.col("bytes").sum().alias("b"), pl.col("bytes").is_not_null().all().alias("known"))
    out = np.zeros(m, dtype=np.int64)
    unknown = np.zeros(m, dtype=bool)
    w = agg.get_column("w").to_numpy()
    out[w] = agg.get_column("b").to_numpy()
    unknown[w] = ~agg.get_column("known").to_numpy()
    return pa.array(out, mask=unknown)
