"""The analysis of a job analysed rank by rank (:mod:`tracekit.scale.dataset`): what needs every rank but not
every event, from the per-rank parts' small tables, and exposed communication split into waiting and transfer
one rank at a time."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

from tracekit.allocators import release_memory
from tracekit.analysis import attribution, collectives, links, missing, pipeline
from tracekit.analysis.intervals import Grouped
from tracekit.analysis.nccl import join as nccl_join
from tracekit.analysis.pipeline import Analysis, _ranks_text
from tracekit.loading.traceset import TraceSet
from tracekit.model import schema
from tracekit.model.units import memory_budget
from tracekit.scale.dataset import Dataset
from tracekit.scale.graphs import RankGraphs

#: the most the ranks split together may take (their attribution intervals, :data:`pipeline.SPLIT_BYTES_PER_EVENT` per
#: row): the client's memory then stays the same however many ranks there are (a batch of the whole budget, 1 GiB by
#: default, held +785 MB at 512 generated GPU ranks; 256 MB, +200 MB, the 128-rank job's peak; 64 MB, +60 MB), at the
#: cost of more, smaller sweeps (the 128-rank job's split 0.6 s either way; the 512-rank job's 2.6 -> 2.9 s)
SPLIT_BATCH_BYTES = 64 << 20
#: how a job analysed rank by rank (--engine/--dataset, or too big for memory) was read
DATASET_NOTE = ("analysed rank by rank from a per-rank dataset (the critical path and what-if on the ranks' compact "
                "dependency graphs)")


def analyse_dataset(ds: Dataset, *, link_bw_bps: float | None = None, align_clocks: bool = True,
                    memory_budget: str | int | None = None, line_rates: dict[str, float] | None = None,
                    rank_graphs: RankGraphs | None = None) -> Analysis:
    """The results of a job whose ranks were parsed and attributed one by one (:mod:`tracekit.scale.dataset`): the
    per-rank breakdowns as written, then what needs every rank but not every event — collectives matched across
    ranks (clocks, skew, stragglers; an instance's iteration from the events' ``collective_id`` column only) and
    link figures — and, one rank at a time, exposed communication split into waiting and transfer.
    ``memory_budget`` (bytes; default :func:`tracekit.scale.dataset.memory_budget`) bounds the rank held at once: a
    rank with more events keeps its split unknown, and a note says so. ``rank_graphs`` gives the critical path and
    what-if the ranks' compact graphs (default: those of ``ds``, built on first use where missing)."""
    colls, join_notes = nccl_join.join(ds.table("collectives"))
    comm_events = (ds.scan("events").filter(pl.col("collective_id").is_not_null())
                   .select(["rank", "collective_id", "iteration"]).collect().to_arrow())
    groups = collectives.groups_from_meta(s.get("meta") or {} for s in ds.summaries)
    ranks = ds.ranks
    matching = collectives.match(colls, ranks, groups=groups, events=comm_events, align=align_clocks)
    colls = collectives.fill_sizes(colls, matching)
    topology = ds.table("topology")
    rate, rate_source = links.line_rate(link_bw_bps, topology)
    breakdown, unsplit = _split_rank_by_rank(ds, colls, matching, memory_budget) if matching.matched else \
        (ds.table("breakdown"), [])
    breakdown = links.window_links(breakdown, colls, rate)
    instances = links.instance_links(matching.instances, rate)
    gone = missing.missing_ranks(ranks, groups)
    gone_note = [n for n in [missing.note(gone, ranks, groups, instances)] if n is not None]
    gone_note += missing.truncated(ranks, ds.table("iterations"))
    ranks = collectives.apply_clocks(ranks, matching.clocks)
    logs = ds.log_files()  # the NCCL logs' communicators, network and problems
    extra: dict[str, list[pa.Table]] = {}
    for f in logs:
        for k, t in f.tables.items():
            extra.setdefault(k, []).append(t)
    release_memory()
    traces = TraceSet(ranks=ranks, events=schema.empty(schema.EVENTS), collectives=colls, topology=topology,
                      tables={k: pa.concat_tables(v, promote_options="permissive") for k, v in extra.items()},
                      files=logs, diagnostics=ds.diagnostics)
    return Analysis(traces=traces, events=traces.events, iterations=ds.table("iterations"), breakdown=breakdown,
                    ranks=ranks, collectives=colls, instances=instances, members=matching.members,
                    line_rate_bps=rate, line_rate_source=rate_source, matched=matching.matched,
                    line_rates=dict(line_rates or {}), notes=[*ds.notes, DATASET_NOTE, *unsplit],
                    diagnostics=[*ds.diagnostics, *gone_note, *join_notes, *matching.diagnostics], dataset=ds,
                    missing_ranks=gone,
                    memory_budget=memory_budget,
                    rank_graphs=rank_graphs if rank_graphs is not None else RankGraphs(ds, budget=memory_budget))


def _split_rank_by_rank(ds: Dataset, colls: pa.Table, matching: collectives.Matching,
                        budget: str | int | None) -> tuple[pa.Table, list[str]]:
    """The breakdown again, rank by rank, with exposed communication split into waiting and transfer (the
    split needs the cross-rank matching, which the per-rank units ran before); returns it and a note naming
    the ranks left unsplit because what the split holds of them exceeds ``budget``.

    Where a rank's unit kept its attribution intervals (``activity``), ranks are split together, as many at once as
    :data:`SPLIT_BATCH_BYTES` (at most the budget) holds (one sweep each; no event read again); the others are split
    one at a time from their events."""
    budget = memory_budget(budget)
    written = ds.table("breakdown")
    iters = pl.from_arrow(ds.table("iterations"))
    coll = pl.from_arrow(colls)
    mem = pl.from_arrow(matching.members)
    assert isinstance(iters, pl.DataFrame) and isinstance(coll, pl.DataFrame) and isinstance(mem, pl.DataFrame)
    # each table's rows of a rank looked up, not filtered from the job's every row per batch (quadratic in ranks)
    by_rank = [(t, Grouped.by(t.get_column("rank").fill_null(-1).to_numpy())) for t in (iters, coll, mem)]

    def tables(ranks: list[int]) -> tuple[pa.Table, pa.Table, collectives.Matching]:
        """The iterations and calls of ``ranks``, and the matching with their members only."""
        it, cl, mine = (t[np.concatenate([rows.of(r) for r in ranks])].to_arrow() for t, rows in by_rank)
        return it, cl, collectives.Matching(matching.instances, mine, matching.clocks)

    parts: list[pa.Table] = []
    done: list[int] = []
    too_big: list[int] = []
    stored = ds.ranks_with("activity")
    rows = {int(r): int(s.get("activity_rows") or 0) for r, s in _summaries_by_rank(ds).items()}
    batch: list[int] = []
    held = 0

    def split(ranks: list[int]) -> None:
        act = pl.from_arrow(ds.ranks_table("activity", ranks))
        assert isinstance(act, pl.DataFrame)
        comm = act.filter(pl.col("cls") == attribution.TRANSFER)
        events = schema.table(schema.EVENTS, {
            "rank": comm.get_column("rank").to_arrow(), "kind": ["comm"] * comm.height,
            "start_ns": comm.get_column("start_ns").to_arrow(),
            "dur_ns": (comm.get_column("end_ns") - comm.get_column("start_ns")).to_arrow(),
            "collective_id": comm.get_column("collective_id").to_arrow()})
        it, cl, mine = tables(ranks)
        parts.append(attribution.breakdown(events, it, cl, comm_split=collectives.comm_split(events, mine),
                                           act=act.drop("collective_id").with_row_index("row")))
        done.extend(ranks)

    for rank, n in sorted(ds.rank_event_counts().items()):
        if rank in stored:
            need = rows.get(rank, 0) * pipeline.SPLIT_BYTES_PER_EVENT
            if need > budget:
                too_big.append(rank)
                continue
            if batch and held + need > min(budget, SPLIT_BATCH_BYTES):
                split(batch)
                batch, held = [], 0
            batch.append(rank)
            held += need
            continue
        if n * pipeline.SPLIT_BYTES_PER_EVENT > budget:
            too_big.append(rank)
            continue
        events = ds.rank_events(rank)
        it, cl, mine = tables([rank])
        parts.append(attribution.breakdown(events, it, cl, comm_split=collectives.comm_split(events, mine)))
        done.append(rank)
        del events
    if batch:
        split(batch)
    kept = pl.from_arrow(written)
    assert isinstance(kept, pl.DataFrame)
    parts.append(kept.filter(~pl.col("rank").is_in(done)).to_arrow())
    out = pa.concat_tables([schema.conform(p, schema.BREAKDOWN) for p in parts])
    out = out.sort_by([("rank", "ascending"), ("start_ns", "ascending")]) if out.num_rows else out
    notes = [f"exposed communication of rank{'s' if len(too_big) > 1 else ''} {_ranks_text(too_big)} not split "
             "into waiting and transfer: its events exceed the memory budget (--memory-budget)"] if too_big else []
    return out, notes


def _summaries_by_rank(ds: Dataset) -> dict[int, dict]:
    """Each per-rank part's unit summary, by rank."""
    rank_of_path = {p.get("path"): p.get("rank") for p in ds.manifest["parts"] if p.get("rank") is not None}
    return {int(rank_of_path[s["path"]]): s for s in ds.summaries if s.get("path") in rank_of_path}
