"""Join the collective calls of NCCL debug logs to the communication kernels of the traces.

NCCL logs know what a call was — its communicator (commId, equal on all ranks), its index in that
communicator, element type and count, and from the TUNING lines the algorithm and protocol — but not
when it ran. Traces know when, and often little else (kernels before PyTorch 2.2 carry no sizes).

Per rank, the calls of one trace lane (an NCCL stream, one per communicator in PyTorch) are found
inside one communicator's logged call sequence: the trace covers a window of the run, the log all of
it, so the trace's sequence of ops must appear contiguously in the log's, with equal sizes wherever the
trace knows them (FORMATS.md §2.4 "Cross-rank join": the k-th COLL line of a commId is the same call on
every rank). The trace's rows then get the log's ``pg`` (commId) and ``seq`` — so instances match across
ranks by ``(pg, seq)`` — and its dtype, count, bytes, group size, algorithm and protocol where they
were missing. A periodic training loop repeats itself, so a window fits many places: the first is used
when every fitting place says the same about the calls (every rank profiles the same steps, so every
rank chooses the same place); when they disagree the rows are not joined, with a warning.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.model import schema
from tracekit.model.diagnostics import Diagnostic

#: collectives the join handles; grouped point-to-point calls show as one SendRecv kernel but as many
#: Send/Recv lines, so they are not joined one to one
JOINABLE = ("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "gather", "scatter")
_FILL = ("dtype", "count", "bytes", "nranks", "algorithm", "protocol")


def join(collectives: pa.Table) -> tuple[pa.Table, list[Diagnostic]]:
    """Enrich the trace rows of ``collectives`` from the NCCL-log rows of the same rank."""
    if not pc.any(pc.equal(collectives.column("source"), "nccl-log")).as_py():
        return collectives, []  # (asked of the Arrow column: a job's calls are not copied to learn it has no log)
    c = pl.from_arrow(collectives)
    assert isinstance(c, pl.DataFrame)
    c = c.with_row_index("_row")
    logs = c.filter((pl.col("source") == "nccl-log") & pl.col("rank").is_not_null())
    traces = c.filter(pl.col("source").is_in(["kineto-kernel"]) & pl.col("start_ns").is_not_null())
    diags: list[Diagnostic] = []
    updates: list[pl.DataFrame] = []
    log_ranks = set(logs.get_column("rank").unique().to_list())
    trace_ranks = set(traces.get_column("rank").unique().to_list())
    for r in sorted(log_ranks - trace_ranks):
        diags.append(Diagnostic("", f"the NCCL log of rank {r} matches no trace (no profiler trace of rank {r})",
                                level="info"))
    for r in sorted(log_ranks & trace_ranks):
        lr = logs.filter(pl.col("rank") == r).sort(["pg", "seq"])
        tr = traces.filter((pl.col("rank") == r) & pl.col("op").is_in(JOINABLE)).sort("start_ns")
        seqs = {pg: g for (pg,), g in lr.group_by(["pg"], maintain_order=True)}
        for (lane,), g in tr.group_by(["lane"], maintain_order=True):
            hit = _locate(g, seqs)
            if hit == "ambiguous":
                diags.append(Diagnostic("", f"rank {r}: the {g.height} calls on {lane} carry no sizes and fit several "
                                        "places of the NCCL log with different sizes: not joined (a guess would be "
                                        "a wrong answer)"))
                continue
            if hit is None:
                ops = ", ".join(g.get_column("op").head(4).to_list())
                diags.append(Diagnostic("", f"rank {r}: the {g.height} calls on {lane} ({ops}, …) are not a run of any "
                                        "communicator's calls in the NCCL log: not joined (a log of another run?)"))
                continue
            assert isinstance(hit, tuple)
            pg, start = hit
            log = seqs[pg].slice(start, g.height)
            upd = g.select("_row").with_columns(
                log.get_column("pg").alias("pg_log"), log.get_column("seq").alias("seq_log"),
                *[log.get_column(f).alias(f"{f}_log") for f in _FILL])
            updates.append(upd)
    if not updates:
        return collectives, diags
    u = pl.concat(updates)
    out = c.join(u, on="_row", how="left").with_columns(
        pl.when(pl.col("bytes").is_null() & pl.col("bytes_log").is_not_null()).then(pl.lit("nccl-log"))
        .otherwise(pl.col("size_source")).alias("size_source"),
        pl.coalesce("pg_log", "pg").alias("pg"),
        pl.coalesce("seq_log", "seq").alias("seq"),
        *[pl.coalesce(f, f"{f}_log").alias(f) for f in _FILL],
    ).drop(["_row", "pg_log", "seq_log", *[f"{f}_log" for f in _FILL]])
    joined = u.height
    diags.append(Diagnostic("", f"{joined} trace collectives joined to their NCCL-log calls (commId, call index, "
                            "sizes, algorithm)", level="info"))
    return schema.conform(out.to_arrow(), schema.COLLECTIVES), diags


def _locate(trace: pl.DataFrame, logs: dict[str, pl.DataFrame]) -> tuple[str, int] | str | None:
    """Where the trace's calls sit contiguously in the log: same op at every position, same bytes wherever
    the trace knows them. Returns (communicator, offset) of the first fit; ``"ambiguous"`` when fits
    disagree on what the calls were (sizes, types), so joining would guess; None when nothing fits."""
    codes: dict[str, int] = {}

    def text(ops: list[str]) -> str:
        return "".join(chr(0x100 + codes.setdefault(o, len(codes))) for o in ops)

    needle = text(trace.get_column("op").to_list())
    t_bytes = trace.get_column("bytes").fill_null(-1).to_numpy()
    known = t_bytes >= 0
    first: tuple[str, int] | None = None
    facts: tuple | None = None
    for pg, log in logs.items():
        hay = text(log.get_column("op").fill_null("?").to_list())
        l_bytes = log.get_column("bytes").fill_null(-1).to_numpy()
        l_dtype = log.get_column("dtype").fill_null("").to_list()
        pos = hay.find(needle)
        while pos >= 0:
            window = l_bytes[pos : pos + len(needle)]
            if np.array_equal(window[known], t_bytes[known]):
                these = (tuple(window.tolist()), tuple(l_dtype[pos : pos + len(needle)]))
                if first is None:
                    first, facts = (pg, pos), these
                elif these != facts:
                    return "ambiguous"
            pos = hay.find(needle, pos + 1)
    return first
