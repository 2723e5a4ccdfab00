"""Dependencies PyTorch guarantees that the trace does not draw, inferred from its shape (docs/dependencies.md):
the hand-off between the thread that calls ``backward()`` and the autograd engine's thread, and whether a kernel was
told to wait for a transfer. :mod:`tracekit.analysis.graph.dag` adds them to the graph; each rule, what it rests on and
in which PyTorch eras, is written down in docs/dependencies.md."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

#: runtime calls that make a stream wait for an event recorded on another
STREAM_WAIT_CALL = r"^(?:cuda|hip)StreamWaitEvent|^cuStreamWaitEvent"


def caller_lanes(act: pl.DataFrame, events: pa.Table) -> pl.LazyFrame:
    """``rank, lane``: per rank, the CPU thread that drives the training loop — the one carrying its
    ``ProfilerStep#`` annotations (the thread that calls ``profiler.step()`` also calls ``backward()``), else the
    thread with the most top-level operators outside the autograd engine (a lazy query: :func:`handoff_edges` collects
    it with its own)."""
    ev = pl.from_arrow(events.select(["rank", "lane", "kind", "name", "device"]))
    assert isinstance(ev, pl.DataFrame)
    steps = (ev.lazy().filter((pl.col("kind") == "annotation") & pl.col("device").is_null())
             .filter(pl.col("name").cast(pl.String).str.starts_with("ProfilerStep#"))
             .group_by(["rank", pl.col("lane").cast(pl.String)]).len()
             .sort(["rank", "len", "lane"], descending=[False, True, False]).unique("rank", keep="first")
             .select(["rank", "lane"]))
    ops = (act.lazy().filter(pl.col("device").is_null() & (pl.col("kind") == "cpu_op")
                             & ~pl.col("name").cast(pl.String).str.starts_with(AUTOGRAD_OP))
           .group_by(["rank", "lane"]).len().sort(["rank", "len", "lane"], descending=[False, True, False])
           .unique("rank", keep="first").select(["rank", "lane"]))
    return pl.concat([steps.with_columns(pl.col("rank").cast(act.schema["rank"])), ops]).unique(
        "rank", keep="first", maintain_order=True)


#: the autograd engine's operators: one per backward function it evaluates (PyTorch >= 1.8)
AUTOGRAD_OP = "autograd::engine::evaluate_function"


def handoff_edges(add, act: pl.DataFrame, events: pa.Table) -> None:
    """PyTorch's hand-off to the autograd engine and back, which the trace does not draw (docs/dependencies.md).

    ``backward()`` on a GPU job runs the backward functions on the engine's device thread while the calling thread
    blocks. Each maximal group of top-level activities of an engine thread that lies inside one idle gap of its
    rank's calling thread (:func:`caller_lanes`) is one backward pass: its first activity starts after the caller's
    activity before the gap (the last forward operation), and the caller's activity after the gap starts after the
    pass's last activity. Without these edges the engine thread's idle time between passes is measured slack on its
    program order, which pins every backward launch to the measured period whatever the link."""
    name = pl.col("name").cast(pl.String)
    cpu = act.filter(pl.col("device").is_null())
    engine_lanes = (cpu.filter(name.str.starts_with(AUTOGRAD_OP)).select(["rank", "lane"]).unique())
    if engine_lanes.height == 0:
        return
    # the rest as one lazy query, collected once (its ~25 steps cost more in hand-offs to polars' pool than in work
    # on one rank's few hundred activities); a step that matches nothing leaves no passes
    cpu_lazy = cpu.lazy()
    callers = caller_lanes(act, events)
    engine_lanes = engine_lanes.lazy().join(callers, on=["rank", "lane"], how="anti")
    caller = (cpu_lazy.join(callers, on=["rank", "lane"], how="semi").select(["a", "rank", "start", "end"])
              .sort(["rank", "start"]).with_columns(pl.int_range(pl.len()).alias("k")))
    engine = cpu_lazy.join(engine_lanes, on=["rank", "lane"], how="semi").select(["a", "rank", "lane", "start", "end"])
    # the caller's activity that ended last before each engine activity starts, and the first one to start after
    # it ends: the activity lies in that gap when they are consecutive (top-level activities of a lane never overlap)
    before = caller.select(["rank", pl.col("end").alias("_t"), pl.col("a").alias("p"), pl.col("k").alias("kp")])
    after = caller.select(["rank", pl.col("start").alias("_t"), pl.col("a").alias("q"), pl.col("k").alias("kq")])
    e = engine.sort("start").join_asof(before.sort("_t"), left_on="start", right_on="_t", by="rank",
                                       strategy="backward", check_sortedness=False).drop("_t")
    e = e.sort("end").join_asof(after.sort("_t"), left_on="end", right_on="_t", by="rank",
                                strategy="forward", check_sortedness=False).drop("_t")
    e = e.filter(pl.col("p").is_not_null() & (pl.col("kq").is_null() | (pl.col("kq") == pl.col("kp") + 1)))
    # in a fixed order (a hash group-by's is not): the edges' order breaks ties between binding edges, and a rank's
    # stored graph must be the same bytes however often it is built (a Dask task run again after a lost worker)
    passes = e.group_by(["rank", "lane", "p"]).agg(
        pl.col("a").sort_by("start").first().alias("first"), pl.col("a").sort_by("end").last().alias("last"),
        pl.col("q").first()).sort(["rank", "p", "first"]).collect(engine="in-memory")
    if passes.height == 0:
        return
    add(2 * passes.get_column("p").to_numpy() + 1, 2 * passes.get_column("first").to_numpy(), 0, "handoff")
    back = passes.filter(pl.col("q").is_not_null())
    add(2 * back.get_column("last").to_numpy() + 1, 2 * back.get_column("q").to_numpy(), 0, "handoff")


def told_to_wait(waits: pl.DataFrame, rank: np.ndarray, comm_launch: np.ndarray, cand_launch: np.ndarray,
                  comm_ranks: np.ndarray, comm_launches: np.ndarray) -> np.ndarray:
    """Per (communication, candidate consumer) pair of one rank: whether the rank's last stream-wait call before the
    consumer's launch came after the communication's launch with no communication launched since (see
    :func:`tracekit.analysis.graph.dag._stream_edges`). Ranks without any traced stream-wait call pass (the timing alone
    decides there)."""
    waits = waits.drop_nulls()
    out = np.ones(rank.size, dtype=bool)
    if waits.height == 0 or rank.size == 0:
        return out
    w_rank = waits.get_column("rank").cast(pl.Int64).to_numpy()
    w_time = waits.get_column("l_start").to_numpy()
    valid = np.isin(rank, np.unique(w_rank))  # a rank without any traced wait (or a missing rank) passes
    if not valid.any():
        return out
    c_ok = np.isin(comm_ranks, np.unique(w_rank))
    comm_ranks, comm_launches = comm_ranks[c_ok], comm_launches[c_ok]
    rank, comm_launch, cand_launch = rank[valid], comm_launch[valid], cand_launch[valid]
    lo = int(min(w_time.min(), comm_launches.min(), cand_launch.min()))
    hi = int(max(w_time.max(), comm_launches.max(), cand_launch.max()))
    span = hi - lo + 2
    base = int(w_rank.min())
    wk = np.sort((w_rank - base) * span + (w_time - lo))
    # the last wait call of the rank at or before the consumer's launch
    key = (rank - base) * span + (cand_launch - lo)
    pos = np.searchsorted(wk, key, side="right") - 1
    ok_pos = pos >= 0
    last = np.where(ok_pos, wk[np.maximum(pos, 0)], -1)
    same_rank = ok_pos & ((last // span) == (rank - base))
    last_t = last % span + lo
    after_comm = same_rank & (last_t > comm_launch)
    # no communication launched on the rank between that call and the consumer's launch
    ck = np.sort((comm_ranks - base) * span + (comm_launches - lo))
    between = (np.searchsorted(ck, key, side="left")
               - np.searchsorted(ck, (rank - base) * span + (last_t - lo), side="right"))
    out[valid] = after_comm & (between == 0)
    return out
