"""The analysis pipeline: a TraceSet in, every result table out. Pure functions of the tables; the CLI,
the exporters and the TUI only read an :class:`Analysis`."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import polars as pl
import pyarrow as pa

from tracekit import attribution, collectives, critical_path, dag, iterations, links, nccl_join, whatif
from tracekit.diagnostics import Diagnostic
from tracekit.traceset import TraceSet


@dataclass
class Analysis:
    """Results of analysing one job. Table column names are a public contract (DESIGN.md)."""

    traces: TraceSet
    events: pa.Table  # with the iteration column filled
    iterations: pa.Table
    breakdown: pa.Table
    ranks: pa.Table  # the TraceSet's ranks with the clock columns filled
    collectives: pa.Table  # the TraceSet's, with NCCL-log facts joined into the trace rows
    instances: pa.Table  # collective_instances
    members: pa.Table  # collective_members: one row per (instance, rank)
    line_rate_bps: float | None = None
    line_rate_source: str | None = None  # "given", "topology" or None
    matched: bool = False  # whether collectives were matched across ranks (wait/transfer known)
    notes: list[str] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)  # the inputs' and the analysis' warnings

    @cached_property
    def graph(self) -> dag.Graph:
        """The dependency graph of the whole job (built on first use)."""
        return dag.build(self.events, self.ranks, whatif.consistent_members(self.members, self.instances))

    @cached_property
    def critical_path(self) -> pl.DataFrame:
        """Critical-path segments of every iteration (:mod:`tracekit.critical_path`)."""
        return critical_path.paths(self.graph, self.iterations, self.ranks)

    @cached_property
    def critical_path_summary(self) -> pl.DataFrame:
        """Per iteration: path length, share of each label, ranks crossed, most waited-on rank."""
        return critical_path.summary(self.critical_path, self.iterations, self.ranks)

    @cached_property
    def whatif(self) -> whatif.Model:
        """The what-if model of the job (its graph with re-costable transfers)."""
        return whatif.build(self.events, self.collectives, self.ranks, self.members, self.instances,
                            line_rate_bps=self.line_rate_bps, graph=self.graph)

    @cached_property
    def bottleneck(self) -> whatif.Bottleneck | None:
        """Is the network the bottleneck? None when the job has no communication."""
        if self.whatif.comm.height == 0:
            return None
        return whatif.bottleneck(self.whatif)

    def tables(self) -> dict[str, pa.Table]:
        """Every exportable table by name."""
        out = {
            "ranks": self.ranks,
            "events": self.events,
            "iterations": self.iterations,
            "breakdown": self.breakdown,
            "collectives": self.collectives,
            "collective_instances": self.instances,
            "collective_members": self.members,
        }
        if self.traces.topology.num_rows:
            out["topology"] = self.traces.topology
        out["critical_path"] = self.critical_path.to_arrow()
        out["critical_path_summary"] = self.critical_path_summary.to_arrow()
        return out


def analyse(traces: TraceSet, *, step_marker: str | None = None, link_bw_bps: float | None = None,
            align_clocks: bool = True) -> Analysis:
    """Iterations, cross-rank matching and clocks, attribution (with wait/transfer where matched) and link
    figures for every rank of ``traces``. ``link_bw_bps`` is the line rate (bits/s) to compare with."""
    events, iters = iterations.assign(traces.events, step_marker)
    colls, join_notes = nccl_join.join(traces.collectives)
    groups = collectives.groups_from_meta(f.meta for f in traces.files)
    matching = collectives.match(colls, traces.ranks, groups=groups, events=events, align=align_clocks)
    split = collectives.comm_split(events, matching) if matching.matched else None
    breakdown = attribution.breakdown(events, iters, colls, comm_split=split)
    rate, rate_source = links.line_rate(link_bw_bps, traces.topology)
    breakdown = links.window_links(breakdown, colls, rate)
    instances = links.instance_links(matching.instances, rate)
    ranks = collectives.apply_clocks(traces.ranks, matching.clocks)
    notes = []
    methods = sorted(set(iters.column("method").to_pylist())) if iters.num_rows else []
    if methods:
        notes.append("iterations from " + ", ".join(methods))
    return Analysis(traces=traces, events=events, iterations=iters, breakdown=breakdown, ranks=ranks,
                    collectives=colls, instances=instances, members=matching.members, line_rate_bps=rate,
                    line_rate_source=rate_source, matched=matching.matched, notes=notes,
                    diagnostics=[*traces.diagnostics, *join_notes, *matching.diagnostics])
