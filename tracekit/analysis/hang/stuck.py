"""The hang, named: where each rank stands in each process group, the collective the others wait in, the ranks
that never entered it and what they did last, desync, and the cause told from its knock-on (DESIGN.md "Hangs").

From the Flight Recorder dumps of a job (:mod:`tracekit.analysis.hang.dumps`), per process group and member:

* **position** — the last collective it entered (``collective_seq_id``), the last started and completed (NCCL's
  ``state``; gloo leaves every entry ``scheduled``) and the last retired (completed, or failed or timed out: gloo
  and NCCL retire both);
* **stuck collective** — members entered a collective that others never entered: the lowest such position. Those
  that entered it *wait* in it, those that did not are *behind*; a member without a dump is behind for all we know.
  A collective that a member never entered cannot have completed, whatever ``retired`` says;
* **not started** — NCCL's host enqueues a collective and goes on; its kernel starts when the GPU work queued before
  it on the stream is done. Where a rank's dump records starts (``time_discovered_started_ns``: CUDA timing on), a
  collective every member entered and none completed is told apart: the members whose GPU never started it are the
  cause (work before it on their GPU does not finish) and those that started it wait inside it for them; where no
  member started it, every GPU is held before it, not the network;
* **cause and knock-on** — a rank behind in one group may itself wait in another (a tensor-parallel group's hang
  keeps its members out of the data-parallel collective, whose other members then wait too): it is a knock-on, and
  the group's hang is blamed on the ranks it waits for. A rank behind that waits nowhere (its last call finished:
  it is stuck outside communication) is a cause. Where the waits form a cycle (a rank skipped one group's collective
  and went on to the next group's, where it waits for a rank stuck in the one it skipped), the rank that broke its
  own order is the cause: each rank's calls alternate between its groups in a fixed pattern (the last call of group
  X before each call of group Y is a fixed number of positions behind), and the skipper's last call of Y came with
  one call of X fewer than its pattern. Without that evidence, the earliest stuck collective's missing ranks are
  named;
* **desync** — members that called different operations, sizes or dtypes at the same position
  (:mod:`tracekit.analysis.hang.desync`); their odd ones out are causes before any other;
* **no dump** — members of a group (the default group: every rank of the job) that left no dump are named when
  nothing else explains the dumps: a process killed or aborted inside the backend writes none;
* **late arrival** — where nothing hangs, the collective whose members arrived furthest apart (``time_created_ns``,
  the ranks' wall clocks) and who came last, when that is at least :data:`LATE_NS`.

NCCL's watchdog lines (:mod:`tracekit.analysis.nccl.problems`: ``stopped-first``, ``hung-collective``) name the
rank that stopped first without any dump; with dumps they are evidence beside the cause. The last events of a
cause's profiler trace say what it was doing last before the traced window closed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import polars as pl
import pyarrow as pa

from tracekit.analysis.hang import desync as desync_mod
from tracekit.analysis.hang import text as hang_text
from tracekit.analysis.hang.dumps import Dumps, collect
from tracekit.analysis.hang.result import KINDS, Cause, Hang, Late, Stuck
from tracekit.model import schema
from tracekit.model.units import format_duration

#: a collective whose members arrived at least this far apart (and nothing hangs) is reported
LATE_NS = 1_000_000_000
#: last events of a cause's profiler trace shown
TRACE_TAIL = 3
#: the parser's tables of the dumps, exported as they are
FR_TABLES = ("fr_dumps", "fr_entries", "fr_pg_config", "fr_pg_status")
_LIBRARY = ("/torch/", "/multiprocessing/", "/threading.py", "<string>", "/site-packages/", "/dist-packages/")


# ------------------------------------------------------------------------------------------- positions


def _collectives(d: Dumps) -> pl.DataFrame:
    """The dumps' collective calls (no point-to-point), one per (rank, group, position)."""
    e = d.entries.filter(~pl.col("is_p2p").fill_null(False) & pl.col("collective_seq_id").is_not_null()
                         & pl.col("pg").is_not_null())
    return e.unique(["rank", "pg", "collective_seq_id"], keep="last", maintain_order=True)


def _done() -> pl.Expr:
    """A call finished as its dump tells: completed (NCCL's state), else retired."""
    return (pl.col("state") == "completed") | pl.col("retired").fill_null(False)


def positions(d: Dumps) -> pl.DataFrame:
    """Per process group and member: the last collective entered, started, completed and retired (HANG_POSITIONS
    columns up to ``retired_seq``; the state columns are filled by :func:`analyse`)."""
    c = _collectives(d)
    last = (c.sort("collective_seq_id").group_by("pg", "rank", maintain_order=True)
            .agg(pl.col("collective_seq_id").last().alias("entered_seq"),
                 pl.col("profiling_name").last().alias("entered_name"),
                 pl.col("time_created_ns").last().alias("entered_ns"),
                 pl.col("collective_seq_id").filter(pl.col("state").is_in(["started", "completed"])).max()
                 .alias("started_seq"),
                 pl.col("collective_seq_id").filter(pl.col("state") == "completed").max().alias("completed_seq"),
                 pl.col("collective_seq_id").filter(pl.col("retired").fill_null(False)).max().alias("retired_seq"),
                 pl.col("time_started_ns").is_not_null().any().alias("starts_known")))
    grid = pl.DataFrame([(pg, r) for pg, ms in d.members.items() for r in ms], schema={"pg": pl.String,
                                                                                       "rank": pl.Int32},
                        orient="row")
    dumped = set(d.ranks)
    out = grid.join(last, on=["pg", "rank"], how="left").with_columns(
        pl.col("rank").is_in(list(dumped)).alias("dumped"),
        pl.col("entered_name").map_elements(desync_mod.call_name, return_dtype=pl.String).alias("entered_op"),
        pl.col("pg").replace_strict(d.descs, default=None, return_dtype=pl.String).alias("pg_desc"))
    return out.with_columns(pl.when(pl.col("dumped")).then(pl.col("entered_seq").fill_null(0))
                            .alias("entered_seq")).sort(["pg", "rank"])


# ------------------------------------------------------------------------------------------- stuck groups


def _stuck_groups(d: Dumps, pos: pl.DataFrame, calls: pl.DataFrame) -> list[dict[str, Any]]:
    """Each group whose dumped members stand at different positions: the lowest position some entered and others
    did not, who waits there and who is behind; with NCCL's states, also the group whose last collective every member
    entered and none completed (stuck inside it: nobody is behind), with those of them whose GPU never started it
    where their dumps record starts (``unstarted``)."""
    states = calls.filter(pl.col("state").is_in(["started", "completed"])).height > 0
    out = []
    for pg in sorted(d.members, key=lambda p: (len(p), p)):
        g = pos.filter((pl.col("pg") == pg) & pl.col("dumped"))
        if g.height == 0:
            continue
        low, high = g.get_column("entered_seq").min(), g.get_column("entered_seq").max()
        if low is None or high is None or high == 0:
            continue
        unstarted: list[int] = []
        if low >= high:  # every member entered the last one: stuck inside it only if NCCL says none completed it
            if not states or g.filter(pl.col("completed_seq").fill_null(0) >= high).height:
                continue
            low = high - 1
            unstarted = sorted(g.filter(pl.col("starts_known").fill_null(False)
                                        & (pl.col("started_seq").fill_null(0) < high)).get_column("rank").to_list())
        seq = int(low) + 1
        waiting = sorted(g.filter(pl.col("entered_seq") >= seq).get_column("rank").to_list())
        behind = sorted(g.filter(pl.col("entered_seq") < seq).get_column("rank").to_list())
        at = calls.filter((pl.col("pg") == pg) & (pl.col("collective_seq_id") == seq)
                          & pl.col("rank").is_in(waiting))
        names = Counter(desync_mod.call_name(n) for n in at.get_column("profiling_name").to_list())
        first = at.sort("time_created_ns").row(0, named=True) if at.height else {}
        retired = sorted(at.filter(pl.col("retired").fill_null(False)).get_column("rank").to_list())
        out.append({"pg": pg, "seq": seq, "op": names.most_common(1)[0][0] if names else "?",
                    "call": desync_mod.describe(first) if first else "?", "waiting": waiting, "behind": behind,
                    "no_dump": sorted(set(d.members[pg]) - set(d.ranks)), "retired": retired, "unstarted": unstarted,
                    "since_ns": at.get_column("time_created_ns").min() if at.height else None})
    return out


def _skipped(calls: pl.DataFrame, rank: int, x_pg: str, y_pg: str, y_seq: int) -> bool:
    """Whether ``rank`` entered collective ``y_seq`` of group ``y_pg`` without the call of group ``x_pg`` its own order
    puts first (module docstring): the last ``x_pg`` position before each of its ``y_pg`` calls repeats with a period
    of ``p`` calls, advancing ``q`` positions; the pending call came with fewer than ``p`` calls back plus ``q``."""
    mine = calls.filter((pl.col("rank") == rank) & pl.col("pg").is_in([x_pg, y_pg])).sort("record_id")
    last_x: int | None = None
    before: dict[int, int] = {}  # y position -> last x position before it
    for pg, seq in mine.select("pg", "collective_seq_id").iter_rows():
        if pg == x_pg:
            last_x = seq
        elif last_x is not None:
            before[seq] = last_x
    now = before.pop(y_seq, None)
    if now is None:
        return False
    known = sorted(t for t in before if t < y_seq)
    for period in range(1, len(known) // 2 + 1):
        steps = {before[t] - before[t - period] for t in known if t - period in before}
        n = sum(1 for t in known if t - period in before)
        if n >= 2 and len(steps) == 1:
            back = before.get(y_seq - period)
            return back is not None and now < back + steps.pop()
    return False


# ------------------------------------------------------------------------------------------- evidence


def _user_frame(stack: str | None) -> str | None:
    """The innermost frame of the program's own code (not torch, not the interpreter's machinery)."""
    for line in (stack or "").splitlines():
        if not any(lib in line for lib in _LIBRARY):
            return line
    return None


def _evidence(d: Dumps, rank: int, calls: pl.DataFrame, at: tuple[str | None, int | None] | None = None
              ) -> tuple[str | None, str | None, str | None]:
    """What ``rank`` did, from its dump: its last finished call (or its call at ``at`` = (group, position), a desync's)
    as text, that call's stack and its innermost frame of user code."""
    if at is not None:
        mine = calls.filter((pl.col("rank") == rank) & (pl.col("pg") == at[0]) & (pl.col("collective_seq_id") == at[1]))
    else:
        mine = d.entries.filter((pl.col("rank") == rank) & _done()).sort("record_id")
    if d.entries.filter(pl.col("rank") == rank).height == 0:
        return None, None, None
    if mine.height == 0:
        return "no finished call in its dump", None, None
    row = mine.row(-1, named=True)
    seq = row["collective_seq_id"] if not row.get("is_p2p") else row["p2p_seq_id"]
    text = f"{desync_mod.describe(row)} #{seq} of {d.label(row['pg'])}"
    return text, row.get("frames"), _user_frame(row.get("frames"))


def trace_tails(events: pa.Table | None, ranks: list[int], n: int = TRACE_TAIL) -> dict[int, list[str]]:
    """The last ``n`` CPU operators (else any events) of each rank's profiler trace, by end time: what it was doing
    when its traced window closed."""
    if events is None or events.num_rows == 0 or not ranks:
        return {}
    ev = pl.from_arrow(events.select(["rank", "kind", "name", "start_ns", "dur_ns"]))
    assert isinstance(ev, pl.DataFrame)
    ev = ev.filter(pl.col("rank").is_in(ranks)).with_columns(
        pl.col("name").cast(pl.String), pl.col("kind").cast(pl.String),
        (pl.col("start_ns") + pl.col("dur_ns").fill_null(0)).alias("end_ns"))
    out: dict[int, list[str]] = {}
    for r in ranks:
        mine = ev.filter(pl.col("rank") == r)
        pick = mine.filter(pl.col("kind").is_in(["cpu_op", "comm", "compute"]))
        pick = (pick if pick.height else mine).sort("end_ns").tail(n)
        out[r] = [f"{name} ({format_duration(int(dur or 0))})" for name, dur in
                  pick.select("name", "dur_ns").iter_rows()]
    return out


def _nccl_lines(problems: pa.Table | None, rank: int) -> list[str]:
    if problems is None or problems.num_rows == 0:
        return []
    rows = [p for p in problems.to_pylist() if p.get("rank") == rank and p.get("kind") in
            ("stopped-first", "watchdog-timeout", "hung-collective", "warn")]
    return [f"{p['path']}:{p['line']}: {p['message']}" for p in rows[:3]]


# ------------------------------------------------------------------------------------------- the analysis


def analyse(tables: Mapping[str, pa.Table], *, groups: Mapping[str, list[int]] | None = None,
            world_size: int | None = None, events: pa.Table | None = None,
            problems: pa.Table | None = None) -> Hang | None:
    """The hang of a job from its Flight Recorder tables (``fr_*``), with the profiler traces' process groups and
    world size, their ``events`` (for what a cause did last) and the NCCL logs' ``problems``; from NCCL's watchdog
    lines alone where there is no dump (:func:`from_watchdog`). None with neither."""
    d = collect(tables, groups, world_size)
    if d is None:
        return from_watchdog(problems)
    calls = _collectives(d)
    pos = positions(d)
    groups_stuck = _stuck_groups(d, pos, calls)
    desyncs = desync_mod.find(d.entries)
    waits_in: dict[int, list[tuple[str, int]]] = {}
    for g in groups_stuck:
        for r in g["waiting"]:
            waits_in.setdefault(r, []).append((g["pg"], g["seq"]))
    causes: dict[int, Cause] = {}
    for ds in desyncs:
        for r in ds.odd:
            causes.setdefault(r, Cause(r, "desync", ds.pg, ds.seq, ds.calls.get(r)))

    def origin(r: int) -> dict[str, Any]:
        """The stuck group where ``r`` is first missed: one where no other missing rank waits elsewhere."""
        mine = [g for g in groups_stuck if r in g["behind"]]
        return next((g for g in mine if not any(b in waits_in for b in g["behind"])), mine[0])

    for g in groups_stuck:
        for r in g["behind"]:
            if r not in waits_in and r not in causes:
                o = origin(r)
                causes[r] = Cause(r, "never entered", o["pg"], o["seq"], o["op"])
    for g in groups_stuck:  # members whose GPU never started a collective the others started and wait inside
        if g["unstarted"] and len(g["unstarted"]) < len(g["waiting"]):
            for r in g["unstarted"]:
                causes.setdefault(r, Cause(r, "not started", g["pg"], g["seq"], g["op"]))
    if not causes:  # every rank behind waits elsewhere: a cycle; the rank that broke its own order
        for g in groups_stuck:
            for r in g["behind"]:
                for pg, seq in waits_in.get(r, []):
                    if pg != g["pg"] and r not in causes and _skipped(calls, r, g["pg"], pg, seq):
                        causes[r] = Cause(r, "skipped", g["pg"], g["seq"], g["op"])
    if not causes and groups_stuck:  # the earliest stuck collective's missing ranks
        first = min(groups_stuck, key=lambda g: (g["since_ns"] is None, g["since_ns"] or 0))
        for r in first["behind"]:
            causes.setdefault(r, Cause(r, "never entered", first["pg"], first["seq"], first["op"]))
    no_dump = sorted(set(range(d.world_size)) - set(d.ranks))
    if not causes and not groups_stuck:
        for r in no_dump:
            causes[r] = Cause(r, "no dump")
    here = {(c.pg, c.rank) for c in causes.values()}
    stuck = [Stuck(g["pg"], d.label(g["pg"]), g["seq"], g["op"], g["call"], tuple(g["waiting"]),
                   tuple(g["behind"]), tuple(g["no_dump"]),
                   {r: f"{d.label(w[0][0])} #{w[0][1]}" for r in g["behind"] if (w := waits_in.get(r))},
                   tuple(g["retired"]),
                   any(b in waits_in and (g["pg"], b) not in here for b in g["behind"]), g["since_ns"],
                   tuple(g["unstarted"]))
             for g in groups_stuck]
    tails = trace_tails(events, sorted(causes))
    named = []
    for c in causes.values():
        r = c.rank
        last, stack, where = _evidence(d, r, calls, (c.pg, c.seq) if c.why == "desync" else None)
        named.append(Cause(c.rank, c.why, c.pg, c.seq, c.op, last, stack, where, tuple(tails.get(r, ())),
                           tuple(_nccl_lines(problems, r))))
    kind = "desync" if desyncs else "hung" if named or stuck else "none"
    late = None if kind != "none" else _late(d, calls)
    pos_table = _position_table(pos, stuck, waits_in, d, set(causes))
    hang = Hang(kind=kind, headline="", causes=named, stuck=stuck, desyncs=desyncs, no_dump=no_dump, late=late,
                notes=list(d.notes), ranks=d.ranks, world_size=d.world_size, backend=d.backend, positions=pos_table)
    hang.notes += hang_text.backend_notes(d, stuck)
    hang.headline, hang.support = hang_text.sentences(hang, d)
    return hang


def _late(d: Dumps, calls: pl.DataFrame) -> Late | None:
    """The collective entered by all its members whose arrivals spread most, if by :data:`LATE_NS` or more."""
    sizes = pl.DataFrame({"pg": list(d.members), "n": [len(m) for m in d.members.values()]},
                         schema={"pg": pl.String, "n": pl.UInt32})
    spread = (calls.group_by("pg", "collective_seq_id")
              .agg(pl.len().alias("k"), (pl.col("time_created_ns").max() - pl.col("time_created_ns").min())
                   .alias("skew"), pl.col("rank").sort_by("time_created_ns").last().alias("last"),
                   pl.col("profiling_name").first())
              .join(sizes, on="pg").filter(pl.col("k") == pl.col("n")).sort("skew", descending=True, nulls_last=True))
    if spread.height == 0:
        return None
    top = spread.row(0, named=True)
    if top["skew"] is None or top["skew"] < LATE_NS:
        return None
    return Late(top["pg"], d.label(top["pg"]), int(top["collective_seq_id"]),
                desync_mod.call_name(top["profiling_name"]), int(top["last"]), int(top["skew"]))


def _position_table(pos: pl.DataFrame, stuck: list[Stuck], waits_in: dict[int, list[tuple[str, int]]], d: Dumps,
                    causes: set[int]) -> pa.Table:
    """HANG_POSITIONS: the positions with each member's state in its group."""
    by_pg = {s.pg: s for s in stuck}
    states, stuck_seq, blocked = [], [], []
    for pg, rank, dumped, entered, done in pos.select(
            "pg", "rank", "dumped", "entered_seq", pl.coalesce("completed_seq", "retired_seq")).iter_rows():
        s = by_pg.get(pg)
        stuck_seq.append(s.seq if s else None)
        blocked.append(s.blocked.get(rank) if s else None)
        if not dumped:
            states.append("no dump")
        elif s is not None:
            states.append("not started" if rank in s.unstarted else "waiting" if rank in s.waiting else "behind")
        else:
            states.append("done" if entered == 0 or (done is not None and done >= entered) else "in flight")
    out = pos.with_columns(pl.Series("state", states, dtype=pl.String), pl.Series("stuck_seq", stuck_seq,
                                                                                  dtype=pl.Int64),
                           pl.Series("blocked_in", blocked, dtype=pl.String),
                           pl.col("rank").is_in(list(causes)).alias("cause"))
    return schema.conform(out.to_arrow(), schema.HANG_POSITIONS)


def from_watchdog(problems: pa.Table | None) -> Hang | None:
    """A hang from NCCL's watchdog lines alone (no dump): the ranks that stopped first, or a collective every rank
    entered and none completed; None when the logs say neither."""
    if problems is None or problems.num_rows == 0:
        return None
    rows = problems.to_pylist()
    first = [p for p in rows if p["kind"] == "stopped-first" and p.get("rank") is not None]
    hung = [p for p in rows if p["kind"] == "hung-collective"]
    if not first and not hung:
        return None
    causes = [Cause(p["rank"], "stopped first", nccl=(f"{p['path']}:{p['line']}: {p['message']}",)) for p in first]
    if causes:
        ranks = sorted({c.rank for c in causes})
        head = (f"Hung: rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} stopped first — "
                "NCCL's watchdog shows the others waiting in a collective it never enqueued.")
    else:
        head = "Hung: every rank that reports its work enqueued the same collective and none completed it."
    support = [f"{p['path']}:{p['line']}: {p['message']}" for p in (first or hung)[:3]]
    return Hang(kind="hung", headline=head, support=support, causes=causes, source="nccl-log")


__all__ = ["FR_TABLES", "KINDS", "LATE_NS", "Cause", "Hang", "Late", "Stuck", "analyse", "from_watchdog", "positions",
           "trace_tails"]
