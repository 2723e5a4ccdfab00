"""One answer to "what sets this job's pace?" (DESIGN.md "Verdict"), derived from the replays and the critical path,
so that no headline can contradict the what-if.

Three replays of the job's dependency graph (:mod:`tracekit.analysis.graph.whatif`) say what each suspect costs: with
communication free, the link's cost; with every rank's work brought down to the median rank's
(:mod:`tracekit.analysis.balance`), the stragglers' cost; and at full utilisation of the line rate, whether the link or
its use is to blame. What is left when neither costs much is read off the measured critical path: device compute, or
the host (CPU operators, launches, input). The classes:

``link-bound``       communication free saves at least :data:`SIGNIFICANT` of each iteration, and more than removing the
                     stragglers' excess does
``straggler-bound``  removing the stragglers' excess saves at least :data:`SIGNIFICANT`, more than free communication
``mixed``            both save at least :data:`MIXED` and within a factor :data:`COMPARABLE` of each other (two
                     causes of a tenth each are a fifth together); or neither names the class and the path is split
                     between compute and host
``compute-bound``    neither saves much, and device compute (on CPU-only ranks: their operators) outweighs the host on
                     the path (of what is neither transfer nor waiting: by more than :data:`EVEN` of an even split)
``host-bound``       neither saves much, and CPU work, launches and the host's gaps outweigh compute on the path
``hung``, ``desync`` the job's Flight Recorder dumps (or NCCL's watchdog) show it stuck, or ranks calling different
                     collectives at the same position: this comes first (:func:`from_hang`;
                     tracekit/analysis/hang/stuck.py)
``input-bound``      what sets the pace is a data loader the trace shows directly (its ``enumerate(DataLoader)``
                     spans): the stragglers whose excess removing saves the most are all waiting for their batches, or,
                     where neither replay names the class, ranks waiting for their data loader are at least
                     :data:`SIGNIFICANT` of the critical path (:mod:`tracekit.analysis.loader`) — a class of its own,
                     not host-bound, because the fix is the input pipeline, whether one rank's or every rank's
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.analysis import loader, ranges
from tracekit.analysis.bottleneck import Bottleneck
from tracekit.analysis.graph import critical_path
from tracekit.analysis.graph.whatif import RECORD_SHAPES_HINT, Model, Scenario, predict_many, schedule, self_check
from tracekit.analysis.link_classes import sentence as link_sentence
from tracekit.analysis.waited import WaitedOn
from tracekit.model.units import count, format_duration, format_rate

KINDS = ("link-bound", "straggler-bound", "input-bound", "host-bound", "compute-bound", "mixed", "none", "hung",
         "desync")
#: a replay that saves at least this share of the iteration time names the job's one cause: less is a cause beside
#: what the critical path is made of (a job whose link costs 12 % is bound by its compute or its host, and the
#: headline says what free communication would still give)
SIGNIFICANT = 0.15
#: two replays that each save at least this share (and are comparable) make the job mixed
MIXED = 0.10
#: two causes both significant and within this factor of each other: mixed
COMPARABLE = 2.0
#: when no replay saves much, the larger of compute and host (their shares of the path that is neither transfer nor
#: waiting, which the replays say cost little) names the class, unless the two are within this of an even split
EVEN = 0.05
#: removing every rank's excess must save at least this share of the iteration for a rank measured against its peers
#: to be named (:mod:`tracekit.analysis.balance`), and twice that for a rank that has none (whose "excess" may be
#: other work than its fellows', not slower work) ...
NAMED_SAVES = 0.02
#: ... a rank is named a straggler when its excess is at least this share of the largest rank's excess ...
NAMED_SHARE = 0.5
#: ... and at most this many are named (a host whose ranks all stall is named as the host)
NAMED_MOST = 3
#: the free-communication replay's path resting this much on unexplained gaps gets a caveat
CAVEAT_SHARE = 0.10


@dataclass(frozen=True)
class Straggler:
    """A rank whose excess over the median rank's work the ``stragglers removed`` replay took away (per iteration),
    and what it was doing: ``device`` compute, ``host`` work (``input`` when the data loader is most of it), or
    ``untraced`` gaps on its threads; ``top`` the activity with the most excess. For ``input``, ``input_ns`` is its
    data loader's time per iteration as the trace shows it and ``input_excess_ns`` that beyond the median rank's."""

    rank: int
    host: str | None
    excess_ns: int
    device_excess_ns: int
    host_excess_ns: int
    doing: str
    top: str | None = None
    input_ns: int | None = None
    input_excess_ns: int | None = None

    @property
    def what(self) -> str:
        """What its excess was spent on, as the verb of a sentence ("its device computes")."""
        return {"device": "its device computes", "host": "its host works", "input": "its input pipeline takes",
                "untraced": "its threads sit in gaps the profiler does not explain for"}[self.doing]

    def loader(self) -> str:
        """Its data loader's time as the trace shows it: "its enumerate(DataLoader)#… spans 50.4 ms per iteration,
        50 ms more than the median rank's"."""
        return (f"its {_short(self.top)} spans {_ms(self.input_ns or 0)} per iteration, "
                f"{_ms(self.input_excess_ns or 0)} more than the median rank's")

    def describe(self) -> str:
        if self.doing == "input" and self.input_ns is not None:
            return f"rank {self.rank} ({self.loader()})"
        s = f"rank {self.rank} ({self.what} {_ms(self.excess_ns)} more per iteration than the median rank's"
        if self.top:
            s += f"; most in {_short(self.top)}"
        return s + ")"


@dataclass(frozen=True)
class Answer:
    """The job's verdict. ``kind`` is one of :data:`KINDS`; ``headline`` its first sentence; ``shares`` what each
    replay saves of the job replayed as measured (``link``, ``stragglers``) and the measured path's split
    (``compute``, ``host``, ``transfer``, ``waiting``, ``unexplained``); ``replays`` the iteration times behind them
    (ns; ``as_measured`` the job replayed as it ran, which every speed-up is against; ``full`` None without a line
    rate); ``measured_ns`` the measured iteration (the one figure every view gives), from which ``as_measured`` may
    differ — the model's self-check, never a speed-up; ``support`` the sentences that back it; ``caveat`` where the
    answer rests on gaps no dependency explains."""

    kind: str
    headline: str
    shares: dict[str, float] = field(default_factory=dict)
    replays: dict[str, int | None] = field(default_factory=dict)
    stragglers: tuple[Straggler, ...] = ()
    support: tuple[str, ...] = ()
    caveat: str | None = None
    source: str = "replay"  # "replay", "attribution" where no replay could run, or "hang" (:func:`from_hang`)
    measured_ns: int | None = None
    waited_on: WaitedOn | None = None  # the rank everyone waited on most (:mod:`tracekit.analysis.waited`)
    #: per replay of ``replays``: its range (:class:`tracekit.analysis.ranges.Range`); per share of a replay
    #: (``link``, ``stragglers``) its ``(low, high)``; the scaling factors (``measured``, ``full``) as
    #: ``(point, low, high)``
    ranges: dict[str, ranges.Range] = field(default_factory=dict)
    share_ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    scaling: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    #: the other classes the ranges leave open (the deciding comparison straddles a class boundary), and what would
    #: decide between them
    alternatives: tuple[str, ...] = ()
    decide: str | None = None

    @property
    def text(self) -> str:
        """The headline, its support and its caveat, as one paragraph."""
        return " ".join([self.headline, *self.support, *([self.caveat] if self.caveat else [])])

    @property
    def kinds(self) -> tuple[str, ...]:
        """The class, then the others its ranges leave open."""
        return (self.kind, *self.alternatives)

    def as_dict(self) -> dict[str, Any]:
        replayed = self.replays.get("as_measured")
        replay_ranges = {k: {"iteration_ns": r.point, "iteration_ns_low": r.low, "iteration_ns_high": r.high,
                             "sources": {n: list(v) for n, v in r.sources.items()}} for k, r in self.ranges.items()}
        return {"kind": self.kind, "alternatives": list(self.alternatives), "headline": self.headline,
                "measured_iteration_ns": self.measured_ns, "replayed_iteration_ns": replayed,
                "self_check": self_check(self.measured_ns, replayed) if replayed else None,
                "shares": self.shares, "share_ranges": {k: list(v) for k, v in self.share_ranges.items()},
                "replays": self.replays, "replay_ranges": replay_ranges,
                "scaling_factor": {k: {"point": v[0], "low": v[1], "high": v[2]} for k, v in self.scaling.items()},
                "waited_on": self.waited_on.as_dict() if self.waited_on is not None else None,
                "stragglers": [s.__dict__ for s in self.stragglers], "support": list(self.support),
                "caveat": self.caveat, "decide": self.decide, "source": self.source, "text": self.text}


def _ms(ns: float) -> str:
    return format_duration(int(ns))


def _pct(x: float) -> str:
    """``0.42`` → ``42 %``; one decimal below 1 % (``0.5 %``), so that a small share never reads as none."""
    return f"{100 * x:.0f} %" if x >= 0.01 or x <= 0 else f"{100 * x:.1f} %"


def exposed_sentence(breakdown: pa.Table) -> str | None:
    """Exposed communication with its split into waiting and transfer (never "communication-bound" without it)."""
    wall = pc.sum(breakdown.column("wall_ns")).as_py() or 0
    if wall <= 0:
        return None
    exposed = pc.sum(breakdown.column("exposed_comm_ns")).as_py() or 0
    if exposed <= 0:
        return "No communication is exposed: compute hides all of it."
    s = f"Exposed communication is {_pct(exposed / wall)} of the iteration time"
    known = pc.is_valid(breakdown.column("wait_ns"))
    split = pc.sum(pc.filter(breakdown.column("exposed_comm_ns"), known)).as_py() or 0
    wait = pc.sum(breakdown.column("wait_ns")).as_py() or 0
    if breakdown.column("wait_ns").null_count == 0:
        s += (f": {_pct(wait / exposed)} of it waiting for other ranks to arrive, {_pct(1 - wait / exposed)} "
              "moving data.")
    elif split > 0:  # the same story as the links paragraph (tracekit.views.verdict): the split where it is known
        s += (f": where its collectives were matched on all their ranks ({_pct(split / exposed)} of it), "
              f"{_pct(wait / split)} is waiting for other ranks to arrive, the rest moving data; elsewhere waiting "
              "and transfer cannot be told apart.")
    else:
        s += " (waiting and transfer cannot be told apart: no collective was matched on all of its ranks)."
    return s


#: the profiler's annotation of a data loader's ``__next__`` (a ``user_annotation``: the time inside is no operator's
#: own, so it shows as a gap on the thread that waited for the batch)
LOADER = loader.LOADER


def input_time(events: pa.Table) -> pl.DataFrame:
    """``rank, name, dur_ns``: each rank's time in its data loader's ``__next__`` (:data:`LOADER`: an annotation, or
    an operator in older traces)."""
    ev = pl.from_arrow(events.select(["rank", "kind", "name", "dur_ns"]))
    assert isinstance(ev, pl.DataFrame)
    return (ev.filter(pl.col("kind").is_in(loader.KINDS))
            .filter(pl.col("name").cast(pl.String).str.starts_with(LOADER))
            .group_by(["rank", pl.col("name").cast(pl.String)]).agg(pl.col("dur_ns").sum()))


def _input_excess(inputs: pl.DataFrame | None, rank: int, iterations: int) -> tuple[str | None, int, int]:
    """A rank's data-loader annotation with the most time, its time per iteration and that beyond the median rank's:
    (name, ns, ns)."""
    if inputs is None or inputs.height == 0:
        return None, 0, 0
    per = inputs.group_by("rank").agg(pl.col("dur_ns").sum(), pl.col("name").sort_by("dur_ns").last())
    v = per.get_column("dur_ns").sort().to_list()
    median = v[(len(v) - 1) // 2]
    row = per.filter(pl.col("rank") == rank)
    if row.height == 0:
        return None, 0, 0
    own = int(row.get_column("dur_ns")[0])
    n = max(iterations, 1)
    return row.get_column("name")[0], own // n, (own - median) // n


def _stragglers(model: Model, ranks: pa.Table | None, inputs: pl.DataFrame | None = None) -> tuple[Straggler, ...]:
    """The ranks whose excess the ``balanced`` replay removed, largest first (see :data:`NAMED_SHARE`)."""
    ex = model.balance.excess()
    if ex.height == 0:
        return ()
    top = int(ex.get_column("excess_ns")[0])
    ex = ex.filter(pl.col("excess_ns") >= NAMED_SHARE * top)
    hosts: dict[int, str | None] = {}
    if ranks is not None and ranks.num_rows:
        hosts = dict(zip(ranks.column("rank").to_pylist(), ranks.column("host").to_pylist(), strict=True))
    tops = _top_excess(model, ex.get_column("rank").to_list())
    out = []
    for row in ex.iter_rows(named=True):
        r = row["rank"]
        name, gap = tops.get(r, (None, 0))
        loader_name, loader_ns, loader_excess = _input_excess(inputs, r, model.balance.iterations)
        if row["device_excess_ns"] >= row["host_excess_ns"]:
            doing = "device"
        elif loader_name is not None and loader_excess >= 0.5 * row["host_excess_ns"]:
            doing, name = "input", loader_name  # its gaps are the waits for its batches
        elif gap > 0.5 * row["host_excess_ns"] * max(model.balance.iterations, 1):
            doing, name = "untraced", None
        elif name and "DataLoader" in name:
            doing = "input"
        else:
            doing = "host"
        seen = doing == "input" and name == loader_name  # the stall as the trace shows it, at its size
        out.append(Straggler(rank=r, host=hosts.get(r), excess_ns=row["excess_ns"],
                             device_excess_ns=row["device_excess_ns"], host_excess_ns=row["host_excess_ns"],
                             doing=doing, top=name, input_ns=loader_ns if seen else None,
                             input_excess_ns=loader_excess if seen else None))
    return tuple(out)


def _top_excess(model: Model, ranks: list[int]) -> dict[int, tuple[str | None, int]]:
    """Per rank: the activity name whose own time exceeds its median peer's the most (:mod:`tracekit.analysis.
    balance`), and the rank's unexplained gap time beyond its median peer's."""
    b = model.balance
    best = (b.tops.filter(pl.col("rank").is_in(ranks)).with_columns((pl.col("own") - pl.col("median")).alias("d"))
            .sort("d", descending=True).group_by("rank", maintain_order=True).first())
    excess_gap = b.gap_ns - b.median_gap_ns
    at = {int(r): i for i, r in enumerate(b.ranks.tolist())}
    return {int(r): (n if d and d > 0 else None, int(excess_gap[at[int(r)]]))
            for r, n, d in best.select(["rank", "label", "d"]).iter_rows()}


def _path_shares(summary: pl.DataFrame) -> dict[str, float]:
    """The measured critical path's split over all iterations: compute (device or CPU-only compute, copies), host
    (CPU, launch, idle the host's threads could not explain), transfer, waiting, and of the idle the unexplained."""
    if summary.height == 0:
        return {}
    total = float(summary.get_column("path_ns").sum())

    def part(*labels: str) -> float:
        return float(sum((summary.get_column(f"{lab}_share") * summary.get_column("path_ns")).sum()
                         for lab in labels)) / total

    return {"compute": part("compute", "memory"), "host": part("CPU", "launch", "idle"),
            "transfer": part("transfer"), "waiting": part("waiting"),
            "unexplained": float((summary.get_column("unexplained_share") * summary.get_column("path_ns")).sum())
            / total if "unexplained_share" in summary.columns else 0.0}


def replay_unexplained(model: Model, sc: Scenario, iterations: pa.Table, ranks: pa.Table | None) -> float | None:
    """The share of the replay's critical path (its middle iteration) that rests on gaps no dependency explains."""
    if model.remote is not None:  # the ranks' graphs held apart: the path is followed where they are
        return model.remote.unexplained(model, sc, iterations, ranks)
    s = schedule(model, sc)
    spans = critical_path.schedule_spans(model.iteration_of, s.times)
    if spans.height == 0:
        return None
    it = int(spans.get_column("iteration")[spans.height // 2])
    g = critical_path.of_schedule(model.graph, s.times, s.weight, s.extra)
    segs = critical_path.paths(g, iterations, ranks, iteration=it, spans=spans)
    summ = critical_path.summary(segs, iterations, ranks, spans=spans)
    return float(summ.get_column("unexplained_share")[0]) if summ.height else None


def _one_host(stragglers: tuple[Straggler, ...]) -> str | None:
    """The host every named straggler is on, when there are several and they share one."""
    hosts = {s.host for s in stragglers}
    return hosts.pop() if len(stragglers) > 1 and len(hosts) == 1 and None not in hosts else None


def _who(stragglers: tuple[Straggler, ...]) -> str:
    """"rank 7", "ranks 3 and 5", or the host when every named rank is on one host."""
    ranks = sorted(s.rank for s in stragglers)
    host = _one_host(stragglers)
    if host is not None:
        return f"host {host} ({count(len(ranks), 'rank')}: {_rank_list(ranks)})"
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + _rank_list(ranks)


def _rank_list(ranks: list[int]) -> str:
    """``3, 5 and 9``; ``8–15`` for a run; the first :data:`NAMED_MOST` and a count beyond."""
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}–{ranks[-1]}"
    shown = ranks[:NAMED_MOST]
    out = ", ".join(map(str, shown[:-1])) + (f" and {shown[-1]}" if len(shown) > 1 else str(shown[-1]))
    return out + (f" (and {len(ranks) - NAMED_MOST} more)" if len(ranks) > NAMED_MOST else "")


def _detail(stragglers: tuple[Straggler, ...]) -> str:
    """What the named stragglers were doing: once for a host whose ranks all did the same, else rank by rank."""
    host = _one_host(stragglers)
    if host is not None and len({(s.doing, s.top) for s in stragglers}) == 1 and all(
            s.input_ns is not None for s in stragglers) and stragglers[0].doing == "input":
        return (f"Stragglers: on host {host}, {_each_loader(stragglers)}" + ".")
    if host is not None and len({(s.doing, s.top) for s in stragglers}) == 1:
        s = stragglers[0]
        lo, hi = min(x.excess_ns for x in stragglers), max(x.excess_ns for x in stragglers)
        amount = _ms(lo) if _ms(lo) == _ms(hi) else f"{_ms(lo)}–{_ms(hi)}"
        return (f"Stragglers: on host {host}, {s.what} {amount} more per iteration than the median rank's on each "
                f"of its {count(len(stragglers), 'rank')}" + (f"; most in {_short(s.top)}" if s.top else "") + ".")
    return "Stragglers: " + "; ".join(s.describe() for s in stragglers[:NAMED_MOST]) + \
        (f"; and {len(stragglers) - NAMED_MOST} more ranks" if len(stragglers) > NAMED_MOST else "") + "."


def _each_loader(stragglers: tuple[Straggler, ...]) -> str:
    """The data loaders of several ranks of one host, as the trace shows them ("each of its 2 ranks' enumerate(…)
    spans 40.4 ms per iteration, 40 ms more than the median rank's"; ranges where they differ)."""
    def span(values: list[int]) -> str:
        lo, hi = _ms(min(values)), _ms(max(values))
        return lo if lo == hi else f"{lo}–{hi}"

    s = stragglers[0]
    return (f"each of its {len(stragglers)} ranks' {_short(s.top)} spans "
            f"{span([x.input_ns or 0 for x in stragglers])} per iteration, "
            f"{span([x.input_excess_ns or 0 for x in stragglers])} more than the median rank's")


def _input_stragglers(stragglers: tuple[Straggler, ...]) -> bool:
    """Whether every named straggler waits for its data loader, as the trace shows it."""
    return bool(stragglers) and all(s.doing == "input" and s.input_ns is not None for s in stragglers)


def _short(name: str | None, most: int = 60) -> str:
    return "" if name is None else name if len(name) <= most else name[:most - 1] + "…"


def _loader_share(inputs: pl.DataFrame | None, n_ranks: int, iterations: int, iteration_ns: int) -> float:
    """The mean rank's time in its data loader, as a share of the iteration time."""
    if inputs is None or inputs.height == 0 or iteration_ns <= 0:
        return 0.0
    return float(inputs.get_column("dur_ns").sum()) / max(n_ranks, 1) / max(iterations, 1) / iteration_ns


def _top_on_path(segments: pl.DataFrame | None, labels: tuple[str, ...]) -> str | None:
    """The activity with the most time on the measured critical path among segments of ``labels``, and its share
    of the path: "aten::linear on rank 0's cpu/tid 12 (41 % of the path)"."""
    if segments is None or segments.height == 0:
        return None
    total = int(segments.get_column("dur_ns").sum())
    top = (segments.filter(pl.col("label").is_in(labels) & pl.col("name").is_not_null())
           .group_by(["name", "rank", "lane"]).agg(pl.col("dur_ns").sum()).sort("dur_ns", descending=True).head(1))
    if top.height == 0 or total <= 0:
        return None
    name, rank, lane, dur = top.row(0)
    return f"{_short(name)} on rank {rank}'s {lane} ({_pct(dur / total)} of the path)"


def kind_of(link: float, strag: float, path: dict[str, float], input_stragglers: bool = False,
            waiting_input: float = 0.0) -> str:
    """The class from what free communication (``link``) and removing the stragglers' excess (``strag``) save of each
    iteration, the measured path's split (``path``: :func:`_path_shares`), whether the stragglers named wait for their
    data loaders and the share of the path ranks spend waiting for theirs; the rules of the module docstring."""
    if link >= MIXED and strag >= MIXED and max(link, strag) <= COMPARABLE * min(link, strag):
        return "mixed"
    if link >= SIGNIFICANT and link >= strag:
        return "link-bound"
    if strag >= SIGNIFICANT:
        return "input-bound" if input_stragglers else "straggler-bound"
    if waiting_input >= SIGNIFICANT:
        return "input-bound"
    compute, host = path.get("compute", 0.0), path.get("host", 0.0)
    compute_part = compute / (compute + host) if compute + host > 0 else 0.5
    if compute_part >= 0.5 + EVEN:
        return "compute-bound"
    if compute_part <= 0.5 - EVEN:
        return "host-bound"
    return "mixed"


#: points per side of the grid over the shares' ranges on which :func:`open_kinds` looks for another class
GRID = 5


def open_kinds(kind: str, link: tuple[float, float], strag: tuple[float, float], path: dict[str, float],
               input_stragglers: bool = False, waiting_input: float = 0.0) -> tuple[str, ...]:
    """The classes other than ``kind`` that the shares' ranges (``(low, high)`` each) leave open."""
    out: list[str] = []
    for x in np.linspace(link[0], link[1], GRID):
        for y in np.linspace(strag[0], strag[1], GRID):
            k = kind_of(max(float(x), 0.0), max(float(y), 0.0), path, input_stragglers, waiting_input)
            if k != kind and k not in out:
                out.append(k)
    return tuple(out)


def _decider(kind: str, others: tuple[str, ...], rng: dict[str, ranges.Range]) -> str:
    """What would decide between the classes the ranges leave open: what narrows the sources that widen the replays
    the classes turn on (free communication for a link, stragglers removed for stragglers)."""
    turns = {"link-bound": "free_communication", "straggler-bound": "stragglers_removed",
             "input-bound": "stragglers_removed"}
    names = {turns.get(k) for k in (kind, *others)} - {None} or {"free_communication"}
    weight: dict[str, float] = {}
    for n in names:
        for src, (lo, hi) in rng[n].sources.items() if n in rng else ():
            weight[src] = max(weight.get(src, 0.0), -lo, hi)
    how: list[str] = []
    for src in sorted(weight, key=lambda k: -weight[k]):
        narrow = ranges.NARROWS[src]
        if narrow is not None and narrow not in how:
            how.append(narrow)
    return "; ".join(how[:2]) or "trace more steps"


def _ranged(ns: int | None, rng: ranges.Range | None) -> str:
    """A replay's time with its range: ``129 ms (103–152)``."""
    if ns is None:
        return "–"
    return rng.text() if rng is not None else _ms(ns)


#: the scenario behind each of the verdict's replays
_SCEN = {"free_communication": Scenario(free=True), "as_measured": Scenario(),
         "stragglers_removed": Scenario(balanced=True), "full_utilisation": Scenario(efficiency="full")}


def point_scenarios(model: Model) -> list[Scenario]:
    """The replays every verdict of ``model`` reads (full utilisation where the line rate is known): where each
    replay costs a round trip per collective (:attr:`Model.remote`), asked in one batch before the others."""
    return [_SCEN["free_communication"], _SCEN["as_measured"], _SCEN["stragglers_removed"],
            *([_SCEN["full_utilisation"]] if model.line_rate_known else [])]


def _capped(r: tuple[float, float, float]) -> tuple[float, float, float]:
    """A scaling factor's range kept within (0, 1]: communication never makes a job faster."""
    return (min(r[0], 1.0), min(r[1], 1.0), min(r[2], 1.0))


def classify(model: Model, bottleneck: Bottleneck | None, path_summary: pl.DataFrame, breakdown: pa.Table,
             iterations: pa.Table, ranks: pa.Table | None, segments: pl.DataFrame | None = None,
             link_rows: list[dict[str, Any]] | None = None, inputs: pl.DataFrame | None = None,
             loader_spans: pl.DataFrame | None = None, waited_on: WaitedOn | None = None,
             uncertainty: ranges.Uncertainty | None = None) -> Answer:
    """The verdict of a job from its what-if model, its answer to "is the link the bottleneck?" (``bottleneck``:
    :func:`tracekit.analysis.bottleneck.bottleneck`, None when it could not run), its measured critical path
    (``segments`` and their summary), its breakdown, how busy each link class was (``link_rows``: rows of
    :func:`tracekit.analysis.link_classes.busy`, which name the class that binds) and each rank's time in its data
    loader (``inputs``: :func:`input_time`; ``loader_spans``: :func:`tracekit.analysis.loader.spans`); ``waited_on``
    the rank everyone waited on (:func:`tracekit.analysis.waited.most_waited_on`), which the answer accounts for.
    With ``uncertainty`` (:func:`tracekit.analysis.ranges.measure`) every replay gets its range, and where the ranges of
    the deciding shares straddle a class boundary the verdict names both classes and what would decide."""
    full_known = bottleneck is not None and bottleneck.scaling_full is not None
    rng: dict[str, ranges.Range] = {}
    alts: dict[str, dict[str, tuple[int, int]]] = {}
    per: dict[str, np.ndarray] = {}
    if uncertainty is not None:
        names = ["free_communication", "as_measured", "stragglers_removed",
                 *(["full_utilisation"] if full_known else [])]
        rr = ranges.replay_all(uncertainty, [_SCEN[n] for n in names])
        for n, p, a, it in zip(names, rr.points, rr.alternatives, rr.per_iteration, strict=True):
            rng[n] = ranges.combine(p, ranges.iteration_sources(uncertainty, _SCEN[n], p, a, it))
            alts[n], per[n] = a, it
        free, measured, balanced = rr.points[:3]
    elif bottleneck is not None:
        measured, free = bottleneck.measured_ns, bottleneck.free_ns
        (balanced,) = predict_many(model, [Scenario(balanced=True)])
    else:
        free, measured, balanced = predict_many(model, [Scenario(free=True), Scenario(), Scenario(balanced=True)])
    now = model.measured_iteration_ns
    if measured <= 0:
        return Answer("none", "No iteration time to explain: the replay found no iteration.", source="replay",
                      measured_ns=now or None)
    link = max(0.0, 1 - free / measured)
    strag = max(0.0, 1 - balanced / measured)
    path = _path_shares(path_summary)
    full = None
    if "full_utilisation" in rng:
        full = rng["full_utilisation"].point
    elif full_known:
        full = round(bottleneck.free_ns / bottleneck.scaling_full)  # type: ignore[union-attr, operator]
    replays: dict[str, int | None] = {"as_measured": measured, "free_communication": free,
                                      "stragglers_removed": balanced, "full_utilisation": full}
    shares = {"link": link, "stragglers": strag, **path}
    share_ranges: dict[str, tuple[float, float]] = {}
    scaling: dict[str, tuple[float, float, float]] = {}
    if uncertainty is not None:
        def ratio(num: str, den: str) -> tuple[float, float, float]:
            return ranges.ratio_range(uncertainty, (_SCEN[num], replays[num], alts[num], per[num]),  # type: ignore
                                      (_SCEN[den], replays[den], alts[den], per[den]))

        _, lo, hi = ratio("free_communication", "as_measured")
        share_ranges["link"] = (max(0.0, 1 - hi), max(0.0, 1 - lo))
        _, lo, hi = ratio("stragglers_removed", "as_measured")
        share_ranges["stragglers"] = (max(0.0, 1 - hi), max(0.0, 1 - lo))
        scaling["measured"] = _capped(ratio("free_communication", "as_measured"))
        if "full_utilisation" in rng:
            scaling["full"] = _capped(ratio("free_communication", "full_utilisation"))
    waiting_input = loader.on_path(segments, loader_spans)  # ranks waiting for their data loader, on the path
    shares["input"] = waiting_input
    stragglers = _stragglers(model, ranks, inputs) if strag >= NAMED_SAVES else ()
    if strag < 2 * NAMED_SAVES:
        stragglers = tuple(s for s in stragglers if model.balance.has_peers(s.rank))
    x_free = measured / free if free else float("inf")
    x_bal = measured / balanced if balanced else float("inf")
    several = model.balance.ranks.size > 1
    replay_line = (f"Replays, against the job replayed as measured: communication free "
                   f"{_ranged(free, rng.get('free_communication'))} ({x_free:.2f}x faster)" + (
                       f"; every rank's excess over the median rank's work removed "
                       f"{_ranged(balanced, rng.get('stragglers_removed'))} ({x_bal:.2f}x)." if several else "."))
    support: list[str] = [self_check(now, measured), replay_line]
    if stragglers:
        support.append(_detail(stragglers))
    exposed = exposed_sentence(breakdown)
    if exposed:
        support.append(exposed)

    if link >= MIXED and strag >= MIXED and max(link, strag) <= COMPARABLE * min(link, strag):
        kind = "mixed"
        who = f"{_who(stragglers)}'s excess" if stragglers else "the stragglers' excess"
        headline = (f"Mixed: the link costs {_pct(link)} of each iteration and {who} {_pct(strag)} — a faster link "
                    "alone or a balanced job alone would not be enough.")
    elif link >= SIGNIFICANT and link >= strag:
        kind = "link-bound"
        headline = (f"Link-bound: communication costs {_pct(link)} of each iteration — with free communication it "
                    f"would take {_ms(free)}, {x_free:.2f}x faster than the job replayed as measured.")
    elif strag >= SIGNIFICANT and _input_stragglers(stragglers):
        kind = "input-bound"  # what the user must fix is the stragglers' input pipeline
        s0 = stragglers[0]
        host = _one_host(stragglers)
        whose = (f"the data loaders of host {host} ({_each_loader(stragglers)})" if host is not None
                 and len(stragglers) > 1 else f"{_who(stragglers)}'s data loader ({s0.loader()})"
                 if len(stragglers) == 1 else "the data loaders of " + _who(stragglers))
        headline = (f"Input-bound: the job waits on {whose}; removing that excess makes each iteration {x_bal:.2f}x "
                    f"faster, while free communication gives only {x_free:.2f}x.")
    elif strag >= SIGNIFICANT:
        kind = "straggler-bound"
        who = _who(stragglers) if stragglers else "the slowest ranks"
        headline = (f"Straggler-bound: the job waits on {who}; removing its excess over the median rank's work makes "
                    f"each iteration {x_bal:.2f}x faster, while free communication gives only {x_free:.2f}x.")
    else:
        compute, host = path.get("compute", 0.0), path.get("host", 0.0)
        rest = f"free communication gives only {x_free:.2f}x" + (
            f" and removing stragglers {x_bal:.2f}x" if several else "")
        compute_part = compute / (compute + host) if compute + host > 0 else 0.5
        if waiting_input >= SIGNIFICANT:
            kind = "input-bound"
            loading = _loader_share(inputs, model.balance.ranks.size, model.balance.iterations, measured)
            headline = (f"Input-bound: {_pct(waiting_input)} of the critical path is ranks waiting for their data "
                        f"loader ({LOADER}: {_pct(loading)} of the mean rank's iteration); {rest}.")
        elif compute_part >= 0.5 + EVEN:
            kind = "compute-bound"
            top = _top_on_path(segments, ("compute", "memory"))
            headline = (f"Compute-bound: {_pct(compute)} of the critical path is compute"
                        + (f", most of it {top}" if top else "") + f"; {rest}.")
        elif compute_part <= 0.5 - EVEN:
            kind = "host-bound"
            top = _top_on_path(segments, ("CPU", "launch"))
            loading = _loader_share(inputs, model.balance.ranks.size, model.balance.iterations, measured)
            if loading >= 0.5 * host:  # the host's gaps are its ranks waiting for their batches
                top = f"the data loader ({LOADER}: {_pct(loading)} of each rank's iteration)"
            headline = (f"Host-bound: {_pct(host)} of the critical path is CPU work, launches and host gaps, not "
                        f"device compute or communication" + (f" — most of it {top}" if top else "") + f"; {rest}.")
        else:
            kind = "mixed"
            headline = (f"Mixed: the critical path is {_pct(compute)} compute, {_pct(host)} host, "
                        f"{_pct(path.get('transfer', 0.0))} transfer and {_pct(path.get('waiting', 0.0))} waiting; "
                        f"{rest}.")
    if kind == "input-bound" and stragglers:  # the headline has said what the stragglers' loaders do
        support = [x for x in support if not x.startswith("Stragglers: ")]
    others: tuple[str, ...] = ()
    decide = None
    if share_ranges:
        others = open_kinds(kind, share_ranges["link"], share_ranges["stragglers"], path,
                            _input_stragglers(stragglers) if stragglers else False, waiting_input)
    if others:
        both = " or ".join([kind, *others])
        headline = both[0].upper() + both[1:] + headline[headline.index(":"):]
        decide = _decider(kind, others, rng)
        lo, hi = share_ranges["link"]
        s_lo, s_hi = share_ranges["stragglers"]
        support.insert(0, f"The ranges leave {both} open: communication free saves {_pct(lo)}–{_pct(hi)} of each "
                          f"iteration and removing the stragglers' excess {_pct(s_lo)}–{_pct(s_hi)} (the line between "
                          f"classes is {_pct(SIGNIFICANT)}); to decide, {decide}.")
    at = 2 + bool(others)
    if bottleneck is not None:
        link_detail = _link_detail(bottleneck, kind, scaling)
        if link_detail:
            support.insert(at, link_detail)
    if kind in ("link-bound", "mixed"):
        by_class = link_sentence(link_rows or [])
        if by_class:  # which link class binds: the busiest, with the transport the NCCL log names
            support.insert(at, by_class + ".")
    if model.contention.measured and model.contention.slowdown > 1.0:
        support.insert(at + 1, model.contention.sentence())
    if uncertainty is not None and uncertainty.notes:
        support.append("What this trace cannot tell: " + "; ".join(uncertainty.notes) + ".")
    if waited_on is not None and waited_on.rank not in {x.rank for x in stragglers}:
        support.insert(0, waited_on.sentence())  # the rank everyone waited on, which no straggler named accounts for
    caveat = None
    u = replay_unexplained(model, Scenario(free=True), iterations, ranks) if link >= MIXED / 2 or \
        kind in ("host-bound", "mixed") else None
    if u is not None and u >= CAVEAT_SHARE:
        caveat = (f"Caveat: {_pct(u)} of the free-communication replay's critical path is time no recorded or "
                  "inferred dependency explains, which every replay keeps as measured (tracekit critical-path shows "
                  "where; docs/dependencies.md lists what tracekit infers).")
        shares["free_path_unexplained"] = u
    return Answer(kind=kind, headline=headline, shares=shares, replays=replays, stragglers=stragglers,
                  support=tuple(support), caveat=caveat, measured_ns=now or None, waited_on=waited_on, ranges=rng,
                  share_ranges=share_ranges, scaling=scaling, alternatives=others, decide=decide)


def _sf(point: float, rng: tuple[float, float, float] | None) -> str:
    """A scaling factor, with its range where known: ``0.70 (0.57–0.84)``."""
    return ranges.ratio_text(*rng) if rng is not None else f"{point:.2f}"


def _link_detail(b: Bottleneck, kind: str, scaling: dict[str, tuple[float, float, float]] | None = None
                 ) -> str | None:
    """What a faster link or compression buys, from the bottleneck replays (the sentence after its first); the
    scaling factors with their ranges (``scaling``: :attr:`Answer.scaling`) where known."""
    scaling = scaling or {}
    rate = format_rate(b.line_rate_bps) if b.line_rate_bps else None
    if kind not in ("link-bound", "mixed"):
        return None
    if b.scaling_full is None:  # no line rate or sizes: what to give instead
        if (b.sizes or {}).get("unknown"):
            return ("What a faster link or compression would buy cannot be told: the transfer sizes are not in the "
                    "traces (profiled without record_shapes?) and no line rate was given. Pass --link-bw (the line "
                    f"rate the job ran on) for an estimate from transfer times, or {RECORD_SHAPES_HINT}.")
        return "Pass --link-bw (the line rate the job ran on) to learn what a faster link or compression would buy."
    on = f"the {rate} link" if rate else "each link's line rate"
    full, now = _sf(b.scaling_full, scaling.get("full")), _sf(b.scaling_measured, scaling.get("measured"))
    if b.scaling_full >= b.target:
        return f"At full utilisation of {on} it would scale at {full} instead of {now}: the link is fast enough, its " \
               "use is not."
    wants = []
    if b.compression_needed:
        wants.append(f"≥ {b.compression_needed:g}x compression")
    if b.bandwidth_needed_bps:
        wants.append(f"≥ {format_rate(b.bandwidth_needed_bps)}")
    elif b.bandwidth_needed_factor:
        wants.append(f"≥ {b.bandwidth_needed_factor:g}x the bandwidth")
    want = " or ".join(wants) or "more than 100x compression or 1000x the bandwidth"
    s = f"Even at full utilisation of {on} it would scale at {full}, against {now} now; it needs {want} to reach " \
        f"{b.target:g}."
    if b.assumption:
        s += " " + b.assumption
    return s


def from_attribution(breakdown: pa.Table, stragglers: pl.DataFrame, why: str) -> Answer:
    """A verdict where no replay can run (``why``): from the breakdown and the collectives' stragglers alone, and
    saying so."""
    wall = pc.sum(breakdown.column("wall_ns")).as_py() or 0 if breakdown.num_rows else 0
    if wall <= 0:
        return Answer("none", "No iterations found: nothing to attribute.", source="attribution")

    def share(col: str) -> float:
        return (pc.sum(breakdown.column(col)).as_py() or 0) / wall

    exposed, idle, compute = share("exposed_comm_ns"), share("idle_ns"), share("compute_ns") + share("overlapped_ns")
    wait = share("wait_ns") if breakdown.column("wait_ns").null_count == 0 else None
    top = stragglers.row(0, named=True) if stragglers.height else None
    if exposed >= 0.25 and wait is not None and wait >= 0.5 * exposed and top and (top["wait_share"] or 0) > 2 / 3:
        kind, head = "straggler-bound", (f"Straggler-bound: {_pct(wait)} of the iteration time is waiting, "
                                         f"{_pct(top['wait_share'])} of it for rank {top['rank']}.")
    elif exposed >= 0.25:
        kind, head = "link-bound", f"Link-bound: {_pct(exposed)} of the iteration time is exposed communication."
    elif idle >= 0.25:
        kind, head = "host-bound", f"Host-bound: ranks sit idle {_pct(idle)} of the time, neither computing nor " \
                                   "communicating."
    else:
        kind, head = "compute-bound", f"Compute-bound: {_pct(compute)} of the iteration time is compute."
    support = tuple(s for s in [exposed_sentence(breakdown)] if s)
    return Answer(kind, head, shares={"exposed": exposed, "idle": idle, "compute": compute},
                  support=support, caveat=f"From the attribution alone: {why}.", source="attribution")


def from_hang(hang: Any) -> Answer:
    """The verdict of a job that hangs or desyncs (or of Flight Recorder dumps alone): ``hung`` or ``desync`` naming
    the ranks and the collective (:class:`tracekit.analysis.hang.stuck.Hang`), before anything a replay could say."""
    return Answer(hang.kind, hang.headline, support=tuple(hang.support), source="hang")
