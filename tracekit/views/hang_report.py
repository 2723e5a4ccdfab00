"""A hang as people read it (``tracekit summary``'s first section, the TUI's Hang tab): every rank's position in each
process group as a row of cells, stuck ranks first, then who the job waits for and why
(:mod:`tracekit.analysis.hang.stuck`).

A row's cells are the group's last collectives, one per position: ``█`` finished (completed, or retired where the
backend says no more; never past the collective the group is stuck in, which cannot have completed), ``▓`` entered
and not finished, ``✗`` the stuck collective a rank never entered, ``≠`` a call that differs from the other members'
(desync), ``·`` not entered, ``?`` no dump.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tracekit.analysis.hang.stuck import Hang
from tracekit.model.diagnostics import printable

#: cells of a group's picture (its last positions)
WIDTH = 24
CELL_STYLES = {"█": "green", "▓": "yellow", "✗": "bold red", "≠": "bold red", "·": "dim", "?": "magenta"}
LEGEND = "█ finished  ▓ entered, not finished  ✗ never entered  ≠ called differently  · not entered  ? no dump"
STATE_ORDER = {"behind": 0, "not started": 1, "no dump": 2, "waiting": 3, "in flight": 4, "done": 5}
KIND_STYLES = {"hung": "bold red", "desync": "bold red", "none": "bold green"}


@dataclass(frozen=True)
class Row:
    """One member of a group: its cells, its state, and what to say about it."""

    rank: int
    cells: str
    state: str
    note: str
    cause: bool


@dataclass(frozen=True)
class Picture:
    """One process group: the positions its cells cover and its members' rows, stuck ranks first."""

    pg: str
    label: str
    first: int
    last: int
    stuck_seq: int | None
    rows: tuple[Row, ...]
    knock_on: bool = False


def label(pg: str, desc: str | None) -> str:
    return f"pg {pg} ({desc})" if desc and desc != "undefined" else f"pg {pg}"


def _cells(first: int, last: int, entered: int | None, done: int | None, stuck: int | None, state: str,
           odd: int | None = None) -> str:
    if state == "no dump":
        return "?" * (last - first + 1)
    entered = entered or 0
    done = done or 0
    if stuck is not None:
        done = min(done, stuck - 1)
    out = []
    for k in range(first, last + 1):
        if k == odd:
            out.append("≠")
        elif k <= done:
            out.append("█")
        elif k <= entered:
            out.append("▓")
        elif stuck is not None and k == stuck and state == "behind":
            out.append("✗")
        else:
            out.append("·")
    return "".join(out)


def _note(p: dict, op: str | None) -> str:
    state = p["state"]
    if state == "waiting":
        return f"waits in {op or p['entered_op']} #{p['stuck_seq']}"
    if state == "not started":
        return f"entered {op or p['entered_op']} #{p['stuck_seq']}; its GPU never started it"
    if state == "behind":
        where = f", held in {p['blocked_in']}" if p["blocked_in"] else ""
        return f"never entered #{p['stuck_seq']} (last entered #{p['entered_seq']}){where}"
    if state == "no dump":
        return "no dump"
    if state == "in flight":
        return f"in {p['entered_op']} #{p['entered_seq']}, not finished"
    return f"done up to #{p['entered_seq']}" if p["entered_seq"] else "no call in its dump"


def pictures(hang: Hang, width: int = WIDTH) -> list[Picture]:
    """Every group's picture: stuck groups first (the cause's own before its knock-ons), then by name."""
    pos = hang.positions.to_pylist()
    by_pg: dict[str, list[dict]] = {}
    for p in pos:
        by_pg.setdefault(p["pg"], []).append(p)
    ops = {s.pg: s.op for s in hang.stuck}
    knock = {s.pg: s.knock_on for s in hang.stuck}
    odd = {(d.pg, r): (d.seq, d.calls[r]) for d in hang.desyncs for r in d.odd}
    out = []
    for pg, rows in by_pg.items():
        stuck = rows[0]["stuck_seq"]
        last = max([r["entered_seq"] or 0 for r in rows] + [stuck or 0, 1])
        first = max(1, last - width + 1)
        made = []
        for r in rows:
            seq, call = odd.get((pg, r["rank"]), (None, None))
            note = f"called {call} at #{seq}" if call else _note(r, ops.get(pg))
            made.append(Row(r["rank"], _cells(first, last, r["entered_seq"], r["completed_seq"] if r["completed_seq"]
                                              is not None else r["retired_seq"], stuck, r["state"], seq),
                            r["state"], note, bool(r["cause"]) and (seq is not None or r["state"] != "done")))
        made.sort(key=lambda r: (not r.cause, STATE_ORDER.get(r.state, 9), r.rank))
        out.append(Picture(pg, label(pg, rows[0]["pg_desc"]), first, last, stuck, tuple(made), knock.get(pg, False)))
    out.sort(key=lambda p: (p.stuck_seq is None, knock.get(p.pg, False), len(p.pg), p.pg))
    return out


def cell_text(cells: str) -> Text:
    """A row's cells with their colours."""
    t = Text()
    for c in cells:
        t.append(c, CELL_STYLES.get(c, ""))
    return t


def header(hang: Hang) -> Text:
    """What the hang rests on: ``hang · 3 Flight Recorder dumps (gloo) · world size 3``."""
    src = "NCCL watchdog lines" if hang.source == "nccl-log" else \
        f"{len(hang.ranks)} Flight Recorder dump{'s' if len(hang.ranks) != 1 else ''}"
    extra = f" ({hang.backend})" if hang.backend else ""
    world = f" · world size {hang.world_size}" if hang.world_size else ""
    return Text.assemble(("hang", "bold"), f" · {src}{extra}{world}")


def tables(hang: Hang) -> list[Table]:
    """One table per process group: every member's cells and state, the causes first (:func:`pictures`)."""
    out = []
    for pic in pictures(hang):
        title = f"{pic.label} · #{pic.first} … #{pic.last}" + (" · knock-on" if pic.knock_on else "")
        table = Table(title=title, title_justify="left", box=None, show_header=False, pad_edge=False)
        table.add_column("rank", justify="right", no_wrap=True)
        table.add_column("cells", no_wrap=True)
        table.add_column("state", no_wrap=False)
        for row in pic.rows:
            note = Text(row.note, style="bold" if row.cause else "")
            if row.cause:
                note.append("  ← cause", style="bold red")
            table.add_row(f"rank {row.rank}", cell_text(row.cells), note)
        out.append(table)
    return out


def footer(hang: Hang) -> list[Text]:
    """The legend, the sentences behind the headline, and the notes on what the dumps cannot say."""
    out = [Text(LEGEND, style="dim")]
    out += [Text(printable(s)) for s in hang.support]
    out += [Text(f"note: {printable(n)}", style="dim") for n in hang.notes]
    return out


def render(console: Console, hang: Hang, *, verdict_line: bool = False) -> None:
    """The hang section of ``tracekit summary``: the verdict's line, the pictures, then what the headline rests on."""
    if verdict_line:
        console.print(Text.assemble(("verdict: ", "bold"), (hang.headline, KIND_STYLES.get(hang.kind, "bold"))))
        console.print()
    console.print(header(hang))
    for t in tables(hang):
        console.print(t)
    for line in footer(hang):
        console.print(line, highlight=False)
