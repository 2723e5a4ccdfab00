"""The analysis pipeline: a TraceSet in, every result table out. Pure functions of the tables; the CLI,
the exporters and the TUI only read an :class:`Analysis`."""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from tracekit import attribution, iterations
from tracekit.traceset import TraceSet


@dataclass
class Analysis:
    """Results of analysing one job. Table column names are a public contract (DESIGN.md)."""

    traces: TraceSet
    events: pa.Table  # with the iteration column filled
    iterations: pa.Table
    breakdown: pa.Table
    notes: list[str] = field(default_factory=list)

    def tables(self) -> dict[str, pa.Table]:
        """Every exportable table by name."""
        out = {
            "ranks": self.traces.ranks,
            "events": self.events,
            "iterations": self.iterations,
            "breakdown": self.breakdown,
            "collectives": self.traces.collectives,
        }
        if self.traces.topology.num_rows:
            out["topology"] = self.traces.topology
        return out


def analyse(traces: TraceSet, *, step_marker: str | None = None) -> Analysis:
    """Iterations and attribution for every rank of ``traces``."""
    events, iters = iterations.assign(traces.events, step_marker)
    breakdown = attribution.breakdown(events, iters, traces.collectives)
    notes = []
    methods = sorted(set(iters.column("method").to_pylist())) if iters.num_rows else []
    if methods:
        notes.append("iterations from " + ", ".join(methods))
    return Analysis(traces=traces, events=events, iterations=iters, breakdown=breakdown, notes=notes)
