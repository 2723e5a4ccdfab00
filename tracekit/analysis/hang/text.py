"""The words of a hang (:mod:`tracekit.analysis.hang.stuck`): its headline, which names the ranks and the collective,
the sentences behind it, and what the backend's dumps cannot say (gloo records less than NCCL)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracekit.model.units import format_duration

if TYPE_CHECKING:
    from tracekit.analysis.hang.dumps import Dumps
    from tracekit.analysis.hang.result import Cause, Hang, Stuck


def ranks_text(ranks: list[int] | tuple[int, ...]) -> str:
    """``rank 1``, ``ranks 0 and 2``, ``ranks 0, 2 and 5``."""
    rs = sorted(ranks)
    if not rs:
        return "no rank"
    if len(rs) == 1:
        return f"rank {rs[0]}"
    shown = [str(r) for r in rs[:8]]
    more = f" and {len(rs) - 8} more" if len(rs) > 8 else ""
    return f"ranks {', '.join(shown[:-1])} and {shown[-1]}{more}" if not more else f"ranks {', '.join(shown)}{more}"


def short_frame(frame: str) -> str:
    """``train at /a/b/record.py:138`` → ``train at record.py:138``."""
    name, sep, where = frame.partition(" at ")
    return f"{name}{sep}{where.rsplit('/', 1)[-1]}" if sep else frame


def _verb(ranks: list[int] | tuple[int, ...], one: str, many: str) -> str:
    return one if len(ranks) == 1 else many


def _where(c: Cause, d: Dumps) -> str:
    return f"{c.op} #{c.seq} of {d.label(c.pg)}" if c.pg is not None else "?"


def _stuck_clause(s: Stuck) -> str:
    """``ranks 0 and 2 wait in all_reduce #9 of pg 0 (default_pg)``."""
    return f"{ranks_text(s.waiting)} {_verb(s.waiting, 'waits', 'wait')} in {s.op} #{s.seq} of {s.label}"


def _headline(h: Hang, d: Dumps) -> str:
    if h.kind == "desync":
        ds = h.desyncs[0]
        odd = list(ds.odd)
        at = f"#{ds.seq} of {d.label(ds.pg)}"
        if ds.majority is not None:
            rest = sorted(r for r in ds.calls if r not in ds.odd)
            return (f"Desync at {at}: {ranks_text(odd)} called {ds.calls[odd[0]]} where {ranks_text(rest)} called "
                    f"{ds.majority} ({_WHAT[ds.what]}).")
        calls = "; ".join(f"rank {r}: {t}" for r, t in sorted(ds.calls.items()))
        return f"Desync at {at}: the ranks called different collectives ({_WHAT[ds.what]}; {calls})."
    if h.kind == "none":
        return "No hang: every rank's dump shows each collective of its groups entered by all members."
    by_why: dict[str, list[Cause]] = {}
    for c in h.causes:
        by_why.setdefault(c.why, []).append(c)
    origin = next((s for s in h.stuck if not s.knock_on), h.stuck[0] if h.stuck else None)
    if "never entered" in by_why and origin is not None:
        cs = by_why["never entered"]
        ranks = [c.rank for c in cs]
        return (f"Hung: {ranks_text(ranks)} never entered {_where(cs[0], d)}, where "
                f"{ranks_text(_stuck_of(h, cs[0]).waiting)} {_verb(_stuck_of(h, cs[0]).waiting, 'waits', 'wait')}.")
    if "not started" in by_why and origin is not None:
        cs = by_why["not started"]
        s = _stuck_of(h, cs[0])
        started = [r for r in s.waiting if r not in s.unstarted]
        who, gpu = ranks_text([c.rank for c in cs]), "its GPU" if len(cs) == 1 else "their GPUs"
        return (f"Hung: {who} entered {_where(cs[0], d)} but {gpu} never started it, where {ranks_text(started)} "
                f"started it and {_verb(started, 'waits', 'wait')} — GPU work queued before it on {who} does not "
                "finish (a kernel that never ends, a wait on another stream), not the network.")
    if "skipped" in by_why:
        c = by_why["skipped"][0]
        elsewhere = next((s for s in h.stuck if c.rank in s.waiting), None)
        then = f" and went on to {elsewhere.op} #{elsewhere.seq} of {elsewhere.label}" if elsewhere else ""
        return (f"Hung: rank {c.rank} skipped {_where(c, d)}{then}, where it waits for ranks that wait for it "
                "(a cycle).")
    if "no dump" in by_why:
        ranks = [c.rank for c in by_why["no dump"]]
        return (f"Hung: {ranks_text(ranks)} left no dump (killed, or aborted inside the backend); the other ranks' "
                "dumps show nothing else wrong.")
    if "stopped first" in by_why:
        return f"Hung: {ranks_text([c.rank for c in by_why['stopped first']])} stopped first (NCCL's watchdog)."
    s = h.stuck[0]
    if s.unstarted and len(s.unstarted) == len(s.waiting):
        return (f"Hung before {s.op} #{s.seq} of {s.label} started: every member entered it and no member's GPU "
                "started it — GPU work queued before it does not finish (a kernel that never ends, a wait on another "
                "stream), not the network.")
    return (f"Hung inside {s.op} #{s.seq} of {s.label}: every member entered it and none completed it — the "
            "collective itself (network, NCCL), not a rank that fell behind.")


_WHAT = {"operation": "a different operation", "shape": "a different shape of the same element count",
         "size": "a different size", "dtype": "a different dtype"}


def _stuck_of(h: Hang, c: Cause) -> Stuck:
    return next(s for s in h.stuck if s.pg == c.pg and s.seq == c.seq)


def _cause_sentences(c: Cause) -> list[str]:
    out = []
    if c.last:
        at = f", called from {short_frame(c.where)}" if c.where else ""
        what = "call" if c.why == "desync" else "last finished call"
        out.append(f"Rank {c.rank}'s {what}: {c.last}{at}.")
    if c.trace:
        out.append(f"Its profiler trace ends with {', '.join(c.trace)}.")
    for line in c.nccl[:1]:
        out.append(f"NCCL log: {line}.")
    return out


def sentences(h: Hang, d: Dumps) -> tuple[str, list[str]]:
    """The headline and the sentences behind it."""
    support: list[str] = []
    for s in h.stuck:
        if s.knock_on:
            held = "; ".join(f"rank {r} waits in {w}" for r, w in sorted(s.blocked.items()))
            support.append(f"Knock-on: {_stuck_clause(s)} for {ranks_text(s.behind)} ({held}).")
        elif not any(c.pg == s.pg and c.seq == s.seq for c in h.causes) and s.behind:
            support.append(f"Also stuck: {_stuck_clause(s)} for {ranks_text(s.behind)}.")
        if s.retired:
            who = ranks_text(s.retired).capitalize()
            support.append(f"{who} {_verb(s.retired, 'marks', 'mark')} {s.op} #{s.seq} retired "
                           f"though {ranks_text(s.behind or s.no_dump)} never entered it: it failed or timed out "
                           "(retired does not mean completed).")
    for c in h.causes:
        support += _cause_sentences(c)
    if any(c.why == "no dump" for c in h.causes):
        support += _last_of_the_others(h)
    if h.no_dump and any(c.why != "no dump" for c in h.causes):
        support.append(f"{ranks_text(h.no_dump).capitalize()} left no dump (killed, or aborted inside the backend"
                       + (": gloo aborts a process that receives the wrong size" if h.kind == "desync" else "")
                       + ").")
    if h.late is not None:
        lt = h.late
        support.append(f"Slowest arrival: rank {lt.rank} entered {lt.op} #{lt.seq} of {lt.label} "
                       f"{format_duration(lt.skew_ns)} after the first member.")
    return _headline(h, d), support


def backend_notes(d: Dumps, stuck: list[Stuck]) -> list[str]:
    """What the dumps cannot say, by backend."""
    notes = []
    if d.backend == "gloo":
        notes.append("gloo's dumps record no start or completion (every entry stays 'scheduled'): a rank's progress "
                     "is read from the collectives it entered and from 'retired', which a failed or timed-out "
                     "collective gets too")
        if d.pg_config.filter(d.pg_config.get_column("pg") == "").height:
            notes.append("gloo's pg_config names no group: members are taken from the ranks' entries (and the "
                         "profiler traces' pg_config where given)")
    forms = set(d.dumps.get_column("form").to_list())
    if forms == {"json"}:
        notes.append("JSON dumps carry no call stacks (the pickle form does)")
    return notes


def _last_of_the_others(h: Hang) -> list[str]:
    """Where the ranks that did dump stand, in the biggest group: the last collective they entered and whether their
    dumps mark it retired (which the backend does for a failed call too)."""
    pos = h.positions.to_pylist()
    sizes: dict[str, int] = {}
    for p in pos:
        sizes[p["pg"]] = sizes.get(p["pg"], 0) + 1
    if not sizes:
        return []
    pg = max(sizes, key=lambda g: (sizes[g], g == "0"))
    mine = [p for p in pos if p["pg"] == pg and p["dumped"] and p["entered_seq"]]
    if not mine:
        return []
    last = max(p["entered_seq"] for p in mine)
    at = [p for p in mine if p["entered_seq"] == last]
    done = all(max(p["retired_seq"] or 0, p["completed_seq"] or 0) >= last for p in at)
    desc = at[0]["pg_desc"]
    where = f"pg {pg} ({desc})" if desc and desc != "undefined" else f"pg {pg}"
    state = (" and mark it retired (completed, or failed: a collective whose member died is retired too)" if done
             else ", not finished")
    who = ranks_text([p["rank"] for p in at]).capitalize()
    return [f"{who} last entered {at[0]['entered_op']} #{last} of {where}{state}."]
