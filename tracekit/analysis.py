"""The analysis pipeline: a TraceSet in, every result table out. Pure functions of the tables; the CLI,
the exporters and the TUI only read an :class:`Analysis`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa

from tracekit import attribution, iterations, schema
from tracekit.diagnostics import Diagnostic
from tracekit.traceset import TraceSet

if TYPE_CHECKING:
    from tracekit.dataset import Dataset


class Result(Protocol):
    """What the views (CLI, exporters) read: the breakdown, notes, input diagnostics and every table."""

    @property
    def breakdown(self) -> pa.Table: ...

    @property
    def notes(self) -> list[str]: ...

    @property
    def diagnostics(self) -> list[Diagnostic]: ...

    def tables(self) -> dict[str, pa.Table | EventBatches]: ...


@dataclass
class Analysis:
    """Results of analysing one job. Table column names are a public contract (DESIGN.md)."""

    traces: TraceSet
    events: pa.Table  # with the iteration column filled
    iterations: pa.Table
    breakdown: pa.Table
    notes: list[str] = field(default_factory=list)

    @property
    def diagnostics(self) -> list[Diagnostic]:
        return self.traces.diagnostics

    def tables(self) -> dict[str, pa.Table | EventBatches]:
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


@dataclass
class EventBatches:
    """The events of every rank as a stream of batches (for exports that must not hold them all)."""

    dataset: Dataset
    schema: pa.Schema = schema.EVENTS

    def batches(self) -> Iterator[pa.RecordBatch]:
        return self.dataset.event_batches()


@dataclass
class DatasetAnalysis:
    """Results of a job analysed as a per-rank dataset (:mod:`tracekit.dataset`): the small tables are
    read whole, the events stay on disk (``dataset.scan("events")`` for lazy queries)."""

    dataset: Dataset

    @property
    def breakdown(self) -> pa.Table:
        return self.dataset.table("breakdown")

    @property
    def iterations(self) -> pa.Table:
        return self.dataset.table("iterations")

    @property
    def collectives(self) -> pa.Table:
        return self.dataset.table("collectives")

    @property
    def notes(self) -> list[str]:
        return self.dataset.notes

    @property
    def diagnostics(self) -> list[Diagnostic]:
        return self.dataset.diagnostics

    def tables(self) -> dict[str, pa.Table | EventBatches]:
        out: dict[str, pa.Table | EventBatches] = {
            "ranks": self.dataset.ranks,
            "events": EventBatches(self.dataset),
            "iterations": self.iterations,
            "breakdown": self.breakdown,
            "collectives": self.collectives,
        }
        topology = self.dataset.table("topology")
        if topology.num_rows:
            out["topology"] = topology
        return out
