"""Whether the traces given are one job (DESIGN.md "Verdict": the verdict says what the trace cannot tell, traces
that are not one job among it). Files of different runs — single-GPU traces of unrelated jobs in one folder — would
otherwise be read as the ranks of one job, and a cross-rank verdict ("the job waits on rank 3") made of them. They
are not one job when their ranks report different world sizes, a process group has a different size in different
traces, ranks that communicate share no collective call, or their traces cover times that do not overlap."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

import polars as pl
import pyarrow as pa


@dataclass(frozen=True)
class OneJob:
    """``one``: whether the traces can be one job; ``reasons`` why not (sentences); ``files``: ``(rank, file names,
    iterations)`` of every rank, so that each file stays visible."""

    one: bool
    reasons: tuple[str, ...] = ()
    files: tuple[tuple[int, tuple[str, ...], int], ...] = field(default=())

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def headline(self) -> str:
        """The verdict of traces that are not one job: why, and that there is none across them."""
        return ("These traces are not one job (" + "; ".join(self.reasons) + "): no verdict across their ranks. "
                "Give one job's traces, or analyse each file alone (tracekit summary FILE).")

    def listing(self) -> str:
        """Every rank with its files and how many iterations were found in them."""
        return "; ".join(f"rank {r}: {', '.join(names) or '?'} ({n} iteration{'s' if n != 1 else ''})"
                         for r, names, n in self.files)


def _spans(iterations: pa.Table, ranks: pa.Table) -> pl.DataFrame:
    """``rank, start, end`` of each rank's iteration windows together, on the job clock (a few rows per rank: no
    event is read again)."""
    df = pl.from_arrow(iterations.select(["rank", "start_ns", "end_ns"]))
    assert isinstance(df, pl.DataFrame)
    df = df.group_by("rank").agg(pl.col("start_ns").min().alias("start"), pl.col("end_ns").max().alias("end"))
    if "clock_offset_ns" in ranks.column_names:
        off = pl.from_arrow(ranks.select(["rank", "clock_offset_ns"]))
        assert isinstance(off, pl.DataFrame)
        df = df.join(off.with_columns(pl.col("rank").cast(df.schema["rank"])).unique("rank"), on="rank", how="left")
        df = df.with_columns(pl.col("start") + pl.col("clock_offset_ns").fill_null(0),
                             pl.col("end") + pl.col("clock_offset_ns").fill_null(0))
    return df.drop_nulls(["start", "end"])


def check(ranks: pa.Table, collectives: pa.Table, instances: pa.Table, iterations: pa.Table) -> OneJob:
    """Whether the ranks of ``ranks`` can be one job (module docstring)."""
    r = pl.from_arrow(ranks.select(["rank", "world_size", "source_files"]))
    assert isinstance(r, pl.DataFrame)
    its = pl.from_arrow(iterations.select(["rank", "iteration"]))
    assert isinstance(its, pl.DataFrame)
    per = dict(its.group_by("rank").agg(pl.col("iteration").n_unique()).iter_rows())
    files = tuple((int(rank), tuple(os.path.basename(f) for f in (src or [])), int(per.get(rank, 0)))
                  for rank, src in r.select(["rank", "source_files"]).sort("rank").iter_rows())
    if r.height < 2:
        return OneJob(True, files=files)
    reasons: list[str] = []
    sizes = sorted(set(r.get_column("world_size").drop_nulls().to_list()))
    if len(sizes) > 1:
        reasons.append("their ranks report world sizes " + ", ".join(map(str, sizes)))
    c = pl.from_arrow(collectives.select(["rank", "pg", "nranks"]))
    assert isinstance(c, pl.DataFrame)
    groups = (c.drop_nulls(["pg", "nranks"]).group_by("pg").agg(pl.col("nranks").unique().sort())
              .filter(pl.col("nranks").list.len() > 1).sort("pg"))
    for pg, n in groups.head(3).iter_rows():
        reasons.append(f"process group {pg} has {' or '.join(map(str, n))} members in different traces")
    talking = c.get_column("rank").n_unique()
    matched = 0
    if instances.num_rows:
        m = pl.from_arrow(instances.select(["ranks"]))
        assert isinstance(m, pl.DataFrame)
        matched = int((m.get_column("ranks").list.len() >= 2).sum())
    if talking >= 2 and matched == 0:
        reasons.append(f"the {talking} ranks that communicate share no collective call")
    spans = _spans(iterations, ranks)
    if spans.height >= 2 and spans.get_column("start").max() >= spans.get_column("end").min():  # type: ignore[operator]
        reasons.append("their traces cover times that do not overlap" + (
            ", and none holds a collective" if c.height == 0 else ""))
    return OneJob(not reasons, tuple(reasons), files)
