"""What the hang analysis finds (:mod:`tracekit.analysis.hang.stuck`), as plain results: the stuck groups, the causes, a
late arrival, and the :class:`Hang` that holds them with its headline and every rank's position."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from tracekit.analysis.hang.desync import Desync
from tracekit.model import schema

KINDS = ("hung", "desync", "none")


@dataclass(frozen=True)
class Stuck:
    """A process group stuck in collective ``seq`` (``op``): ``waiting`` entered it, ``behind`` never did
    (``blocked``: those of them that wait in another group, ``group -> seq``), ``no_dump`` left no dump; ``retired``
    the waiting ranks whose dump marks it retired anyway (failed or timed out); ``knock_on`` when every rank it waits
    for is blocked elsewhere (the group is a victim, not the cause); ``unstarted`` the waiting ranks whose GPU never
    started it, where their dumps record starts (NCCL with CUDA timing)."""

    pg: str
    label: str
    seq: int
    op: str
    call: str
    waiting: tuple[int, ...]
    behind: tuple[int, ...]
    no_dump: tuple[int, ...]
    blocked: dict[int, str]
    retired: tuple[int, ...]
    knock_on: bool
    since_ns: int | None
    unstarted: tuple[int, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"pg": self.pg, "label": self.label, "seq": self.seq, "op": self.op, "call": self.call,
                "waiting_ranks": list(self.waiting), "behind_ranks": list(self.behind),
                "no_dump_ranks": list(self.no_dump), "blocked_in": {str(k): v for k, v in self.blocked.items()},
                "retired_anyway": list(self.retired), "knock_on": self.knock_on, "since_ns": self.since_ns,
                "not_started_ranks": list(self.unstarted)}


@dataclass(frozen=True)
class Cause:
    """A rank named as a cause: ``why`` is ``desync``, ``never entered``, ``not started`` (entered, but its GPU never
    started the collective the others started), ``skipped`` (broke its own order between groups), ``no dump`` or
    ``stopped first`` (NCCL watchdog); where (``pg``, ``seq``, ``op``); what it did last
    (``last``: its last finished call, ``stack``: where it was called, ``trace``: its profiler trace's last events,
    ``nccl``: NCCL log lines about it)."""

    rank: int
    why: str
    pg: str | None = None
    seq: int | None = None
    op: str | None = None
    last: str | None = None
    stack: str | None = None
    where: str | None = None
    trace: tuple[str, ...] = ()
    nccl: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "why": self.why, "pg": self.pg, "seq": self.seq, "op": self.op,
                "last": self.last, "where": self.where, "stack": self.stack, "trace_tail": list(self.trace),
                "nccl": list(self.nccl)}


@dataclass(frozen=True)
class Late:
    """The collective whose members arrived furthest apart, with the last arriver."""

    pg: str
    label: str
    seq: int
    op: str
    rank: int
    skew_ns: int

    def as_dict(self) -> dict[str, Any]:
        return {"pg": self.pg, "label": self.label, "seq": self.seq, "op": self.op, "rank": self.rank,
                "skew_ns": self.skew_ns}


@dataclass
class Hang:
    """What the dumps (or NCCL's watchdog) say about a stuck job: ``kind`` (:data:`KINDS`), the headline and its
    support, the causes, the stuck groups, the desyncs, the ranks without a dump, a late arrival, and every rank's
    position in every group (HANG_POSITIONS)."""

    kind: str
    headline: str
    support: list[str] = field(default_factory=list)
    causes: list[Cause] = field(default_factory=list)
    stuck: list[Stuck] = field(default_factory=list)
    desyncs: list[Desync] = field(default_factory=list)
    no_dump: list[int] = field(default_factory=list)
    late: Late | None = None
    notes: list[str] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    world_size: int | None = None
    backend: str | None = None
    source: str = "flight-recorder"
    positions: pa.Table = field(default_factory=lambda: schema.empty(schema.HANG_POSITIONS))

    @property
    def cause_ranks(self) -> list[int]:
        return sorted({c.rank for c in self.causes})

    @property
    def text(self) -> str:
        return " ".join([self.headline, *self.support])

    def as_dict(self) -> dict[str, Any]:
        """The ``hang`` object of ``summary --json``."""
        return {"kind": self.kind, "headline": self.headline, "support": self.support, "text": self.text,
                "cause_ranks": self.cause_ranks, "causes": [c.as_dict() for c in self.causes],
                "stuck": [s.as_dict() for s in self.stuck], "desync": [d.as_dict() for d in self.desyncs],
                "no_dump_ranks": self.no_dump, "late": self.late.as_dict() if self.late else None,
                "notes": self.notes, "dump_ranks": self.ranks, "world_size": self.world_size,
                "backend": self.backend, "source": self.source, "positions": self.positions.to_pylist()}
