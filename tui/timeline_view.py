"""Timeline: one row per lane (each rank's attribution classes, then its device streams and CPU threads),
coloured by kind, with zoom, pan, a cursor, jumps (next communication, critical-path segment or search
hit), search, the critical path drawn over the lanes, and a details panel for the event under the cursor
(with the collective instance it belongs to on every rank). ``g`` goes to a rank; ``F`` keeps the ranks of a
host, a process group or a range (a job read rank by rank reads each rank's events when it is drawn:
:class:`tracekit.views.ranked_timeline.RankedTimeline`).

The canvas and its drawing are in :mod:`tracekit.tui.timeline_canvas`; this module is the tab around it:
the details panel, the status line and the search box.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import Input, Static

from tracekit.tui.data import PATH_MARKS, JobData
from tracekit.tui.timeline_canvas import MARK_GLYPHS, MARK_STYLES, TimelineCanvas, fmt_time
from tracekit.tui.views import View
from tracekit.views.report import CLASS_LABELS, CLASS_STYLES, KIND_STYLES, fmt_bytes, fmt_ns
from tracekit.views.timeline import TimelineModel


class TimelineView(View):
    """The third tab: the canvas, a details panel and a status line, and the search box."""

    VIEW_ID = "timeline"
    TITLE = "Timeline"
    KEY = "3"
    REQUIRES = ("events",)
    NEEDS_TIMELINE = True
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "search", "Search", key_display="/"),
        Binding("g", "ask('goto')", "Go to rank", show=False),
        Binding("F", "ask('filter')", "Filter ranks (host, group, range)", show=False),
        Binding("escape", "clear_search", "Clear search", show=False),
    ]
    #: what the input box asks for, by mode
    PROMPTS: ClassVar[dict[str, str]] = {
        "search": "search event names (regular expression; enter: find, escape: cancel)",
        "goto": "go to rank (a number; enter: go, escape: cancel)",
        "filter": "show only: host NAME · group NAME (a process group's name, or its description: the cursor's "
                  "group of that kind) · ranks 0-7,12 · empty: every rank",
    }

    def __init__(self, data: JobData | None = None, **kwargs: Any) -> None:
        super().__init__(data, **kwargs)
        self._data: JobData | None = None
        self._search: str | None = None
        self._asking = "search"
        self._filter: str | None = None

    def compose(self) -> ComposeResult:
        yield Static("building the timeline…", id="timeline-wait", classes="hint")
        yield TimelineCanvas(id="timeline-canvas")
        yield Static(id="timeline-details")
        yield Static(id="timeline-status")
        yield Input(placeholder="search event names (regular expression; enter: find, escape: cancel)",
                    id="timeline-search")

    def on_mount(self) -> None:
        self.query_one("#timeline-search", Input).display = False
        self.query_one(TimelineCanvas).display = False
        self.query_one("#timeline-details", Static).border_title = "Details"

    @property
    def canvas(self) -> TimelineCanvas:
        return self.query_one(TimelineCanvas)

    def focus_main(self) -> None:
        self.canvas.focus()

    def show_data(self, data: JobData) -> None:
        """Show the timeline model once it exists, and the critical path over it once that does."""
        self._data = data
        if data.timeline is None:
            return
        canvas = self.canvas
        if canvas.model is None or (canvas.model is not data.timeline and self._filter is None):
            self.query_one("#timeline-wait", Static).display = False
            canvas.display = True
            canvas.set_model(data.timeline)
        if data.path_marks is not None and self._filter is None and canvas.marks.get(PATH_MARKS) is not \
                data.path_marks:
            canvas.set_marks(PATH_MARKS, data.path_marks)
        elif data.path_marks is not None and self._filter is not None and PATH_MARKS not in canvas.marks:
            self._filtered_path()

    def show(self, rank: int, start_ns: int, end_ns: int, lane: str | None, cursor_ns: int | None = None) -> bool:
        """Show a span given on ``rank``'s own clock (the cursor at ``cursor_ns``, default the start);
        False when the timeline is not ready."""
        model = self.canvas.model
        if model is None:
            return False
        if not model.lanes_of_rank(rank) and self._filter is not None:  # filtered out: show every rank again
            self.filter("")
            model = self.canvas.model
            assert model is not None
        off = model.clock_offsets.get(rank, 0)
        li = model.lane_index(rank, lane) if lane is not None else None
        li = li if li is not None else model.lane_index(rank, "classes")
        if li is None:
            lanes = model.lanes_of_rank(rank)
            li = lanes[0] if lanes else 0
        self.canvas.show_span(li, start_ns + off, end_ns + off, None if cursor_ns is None else cursor_ns + off)
        return True

    # ----------------------------------------------------------------- search

    def action_search(self) -> None:
        self.action_ask("search")

    def action_ask(self, what: str) -> None:
        """Open the input box for a search, a rank to go to or a filter."""
        box = self.query_one("#timeline-search", Input)
        self._asking = what
        box.placeholder = self.PROMPTS[what]
        box.display = True
        box.value = {"search": self._search, "filter": self._filter}.get(what) or ""
        box.focus()

    def action_clear_search(self) -> None:
        box = self.query_one("#timeline-search", Input)
        if box.display:
            box.display = False
            self.canvas.focus()
            return
        if self._search is not None:
            self._search = None
            self.canvas.set_marks("search", None)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        box = event.input
        box.display = False
        self.canvas.focus()
        if self._asking == "goto":
            self.goto(event.value)
        elif self._asking == "filter":
            self.filter(event.value)
        else:
            self.search(event.value)

    # ----------------------------------------------------------------- many ranks: go to one, keep some

    def goto(self, text: str) -> bool:
        """Put the cursor on the first lane of rank ``text``, keeping the time in view; False if there is none."""
        model = self.canvas.model
        try:
            rank = int(text.strip().removeprefix("rank").strip())
        except ValueError:
            self.notify(f"not a rank: {text.strip()!r}", timeout=3, markup=False)
            return False
        if model is None:
            return False
        if not model.lanes_of_rank(rank) and self._filter is not None:
            self.filter("")
            model = self.canvas.model
            assert model is not None
        lanes = model.lanes_of_rank(rank)
        if not lanes:
            self.notify(f"no rank {rank} in this job", timeout=3)
            return False
        canvas = self.canvas
        canvas.cursor_lane = lanes[0]
        canvas.top_lane = lanes[0]
        canvas._keep_cursor_visible()
        canvas._changed()
        return True

    def filter(self, text: str) -> int:
        """Show only the ranks ``text`` names (module docstring; empty: every rank); returns how many are shown.
        Only a job read rank by rank has a timeline that can leave ranks out."""
        from tracekit.views.ranked_timeline import RankedTimeline

        data, canvas = self._data, self.canvas
        base = data.timeline if data is not None else None
        if not isinstance(base, RankedTimeline):
            self.notify("the rank filter is for jobs read rank by rank (g goes to a rank)", timeout=3)
            return 0
        text = text.strip()
        ranks = None if not text else self._ranks_of(text)
        if ranks is not None and not ranks:
            self.notify(f"no rank matches {text!r}", timeout=3, markup=False)
            return 0
        rank = canvas.model.lanes[canvas.cursor_lane].rank if canvas.model is not None and canvas.model.lanes else None
        model = base if ranks is None else base.subset(sorted(ranks))
        zoom, first, t = canvas.zoom, canvas.first_cell, canvas.cursor_t
        canvas.set_model(model)
        canvas.zoom, canvas.first_cell, canvas.cursor_t = zoom, first, t
        self._filter = text or None
        canvas.set_marks("search", None)
        self._search = None
        canvas.marks.pop(PATH_MARKS, None)
        self._filtered_path()
        if rank is not None and model.lanes_of_rank(rank):
            canvas.cursor_lane = model.lanes_of_rank(rank)[0]
        canvas._keep_cursor_visible()
        canvas._changed()
        return len(model.shown)

    def _filtered_path(self) -> None:
        """The critical path's marks on the filtered timeline (its lanes are numbered anew)."""
        data, canvas = self._data, self.canvas
        if data is None or data.analysis is None or not data.paths_ready or canvas.model is None:
            return
        if self._filter is None:
            if data.path_marks is not None:
                canvas.set_marks(PATH_MARKS, data.path_marks)
            return
        from tracekit.tui.data import critical_path_marks

        canvas.set_marks(PATH_MARKS, critical_path_marks(canvas.model, data.analysis.critical_path))

    def _ranks_of(self, text: str) -> set[int]:
        """The ranks a filter names: ``host NAME``, ``group NAME`` or ``ranks 0-7,12``."""
        data = self._data
        assert data is not None
        word, _, rest = text.partition(" ")
        rest = rest.strip()
        ranks_t = data.analysis.ranks if data.analysis is not None else data.ranks
        all_ranks = [int(r) for r in ranks_t.column("rank").to_pylist() if r is not None]
        if word == "host":
            hosts = ranks_t.column("host").to_pylist()
            return {int(r) for r, h in zip(ranks_t.column("rank").to_pylist(), hosts, strict=True)
                    if r is not None and h is not None and (h == rest or str(h).startswith(rest))}
        if word == "group":
            return self._group(rest)
        if word == "ranks" or word[:1].isdigit():
            spec = rest if word == "ranks" else text
            out: set[int] = set()
            for part in filter(None, (p.strip() for p in spec.replace(" ", ",").split(","))):
                a, _, b = part.partition("-")
                try:
                    lo, hi = int(a), int(b or a)
                except ValueError:
                    return set()
                out.update(r for r in all_ranks if lo <= r <= hi)
            return out
        return set()

    def _group(self, name: str) -> set[int]:
        """The ranks of the process group ``name``; for a description (``dp``), the cursor's rank's group of it."""
        from tracekit.analysis import collectives

        data, canvas = self._data, self.canvas
        assert data is not None and data.analysis is not None
        a = data.analysis
        metas = [s.get("meta") or {} for s in a.dataset.summaries] if a.dataset is not None else \
            [f.meta for f in a.traces.files]
        groups = collectives.groups_from_meta(metas)
        if name in groups:
            return set(groups[name])
        descs = collectives.group_descs(metas)
        rank = canvas.model.lanes[canvas.cursor_lane].rank if canvas.model is not None and canvas.model.lanes else None
        mine = [g for g, d in descs.items() if (d == name or d.endswith("_" + name)) and g in groups]
        for g in mine:
            if rank in groups[g]:
                return set(groups[g])
        return set(groups[mine[0]]) if mine else set()

    def search(self, pattern: str) -> int:
        """Highlight the events whose names match ``pattern`` and jump to the first hit after the cursor;
        returns the number of hits."""
        model = self.canvas.model
        if model is None or not pattern.strip():
            return 0
        marks = model.search(pattern)
        self._search = pattern
        self.canvas.set_marks("search", marks)
        if len(marks):
            self.canvas.action_jump_mark("search", 1)
        else:
            self.notify(f"no event name matches {pattern!r}", timeout=3, markup=False)
        return len(marks)

    # ----------------------------------------------------------------- details and status

    def on_timeline_canvas_cursor_moved(self, event: TimelineCanvas.CursorMoved) -> None:
        event.stop()
        self._update_details()

    def _update_details(self) -> None:
        canvas = self.canvas
        model = canvas.model
        if model is None or self._data is None:
            return
        lane = model.lanes[canvas.cursor_lane]
        c0 = model.t0 + canvas.cursor_cell * canvas.cell
        c1 = c0 + canvas.cell
        details = self.query_one("#timeline-details", Static)
        if lane.is_classes:
            text = self._classes_details(model, canvas, lane.index, c0)
        else:
            i = model.event_at(lane.index, c0, c1)
            text = self._event_details(model, i, lane.rank, lane.name, c0)
        path = self._on_path(canvas, lane.index, c0, c1)
        if path is not None:  # at the end of the first line
            lines = text.split("\n", allow_blank=True)
            lines[0].append_text(path)
            text = Text("\n").join(lines)
        details.update(text)
        self.query_one("#timeline-status", Static).update(self._status(model, canvas))

    @staticmethod
    def _on_path(canvas: TimelineCanvas, lane: int, c0: int, c1: int) -> Text | None:
        """"on the critical path …" when the cursor's cell holds a critical-path segment."""
        marks = canvas.marks.get(PATH_MARKS)
        if marks is None or marks.label is None:
            return None
        i = marks.at(lane, c0, c1)
        if i is None:
            return None
        return Text.assemble("   ◆ on the critical path ", (str(marks.label[i]), "bold"), " (p/P: next/previous)")

    def _status(self, model: TimelineModel, canvas: TimelineCanvas) -> Text:
        v0 = canvas.first_cell * canvas.cell
        v1 = v0 + canvas.track_width * canvas.cell
        t = Text()
        t.append(f"{fmt_ns(canvas.cell)}/cell", style="bold")
        t.append(f"  view {fmt_time(v0, canvas.cell)} … {fmt_time(v1, canvas.cell)}")
        t.append(f"  cursor {fmt_time(canvas.cursor_t - model.t0, canvas.cell)}")
        if self._search is not None:
            n = len(canvas.marks.get("search", []))
            t.append(f"  search {self._search!r}: {n:,} hits (n/N)", style="black on bright_white")
        if self._filter is not None:
            t.append(f"  ranks: {self._filter} (F)", style="bold")
        if PATH_MARKS in canvas.marks:
            t.append("  ")
            shown = PATH_MARKS not in canvas.hidden_marks
            t.append(f"{MARK_GLYPHS[PATH_MARKS] * 2} critical path", style=MARK_STYLES[PATH_MARKS] if shown else "dim")
            t.append(" (p/P" + (", u: hide)" if shown else "; hidden, u: show)"))
        t.append("   ")
        for k in ("compute", "comm", "memory", "cpu_op", "runtime"):
            t.append("■", style=KIND_STYLES[k])
            t.append(f" {k} ")
        return t

    def _classes_details(self, model: TimelineModel, canvas: TimelineCanvas, lane: int, c0: int) -> Text:
        ln = model.lanes[lane]
        cov = model.coverage(lane, canvas.zoom, canvas.cursor_cell, 1)[0]
        t = Text(f"rank {ln.rank}", style="bold")
        # the iterations the cell overlaps, not the one at its start: a cell can begin before the first window
        its = model.iterations_in(ln.rank, c0, c0 + canvas.cell)
        window = int(cov[-1])  # the part of the cell inside iteration windows: the classes cover that part only
        if not its or not window:
            t.append(" · outside the iteration windows")
        else:
            t.append(f" · iteration #{its[0]}" if len(its) == 1 else f" · iterations #{its[0]}–#{its[-1]}")
        t.append(f" · cell {fmt_time(c0 - model.t0, canvas.cell)} (+{fmt_ns(canvas.cell)})")
        if its and window and window < canvas.cell:
            t.append(f" · {100 * window / canvas.cell:.0f} % of it in iteration windows, shares of that part")
        t.append("\n")
        if not its or not window:
            t.append("no attribution outside the iteration windows (every class is measured inside them)",
                     style="dim")
            return t
        for k, name in enumerate(ln.kinds):
            t.append("■ ", style=CLASS_STYLES[name])
            t.append(f"{CLASS_LABELS[name]} {100 * cov[k] / window:.0f} %   ")
        it = its[0] if len(its) == 1 else None
        if it is not None and self._data is not None:
            t.append("\n")
            t.append_text(self._window_line(ln.rank, it))
        return t

    def _window_line(self, rank: int, iteration: int) -> Text:
        assert self._data is not None
        b = self._data.breakdown
        mask = np.asarray(b.column("rank").to_numpy() == rank) & np.asarray(b.column("iteration").to_numpy()
                                                                            == iteration)
        hit = np.flatnonzero(mask)
        if not hit.size:
            return Text()
        row = b.slice(int(hit[0]), 1).to_pylist()[0]
        t = Text(f"iteration #{iteration} on rank {rank}: {fmt_ns(row['wall_ns'])} — ", style="dim")
        for c in ("compute", "overlapped", "exposed_comm", "memory", "idle"):
            t.append(f"{CLASS_LABELS[c]} {fmt_ns(row[f'{c}_ns'])}  ", style=CLASS_STYLES[c])
        return t

    def _event_details(self, model: TimelineModel, i: int | None, rank: int, lane: str, c0: int) -> Text:
        if i is None:
            return Text(f"rank {rank} · {lane} · idle at {fmt_time(c0 - model.t0)}", style="dim")
        assert self._data is not None and self._data.analysis is not None
        record = getattr(model, "record", None)  # a job read rank by rank: the row of the rank's events
        row = record(i) if record is not None else \
            self._data.analysis.events.slice(int(model.ev_row[i]), 1).to_pylist()[0]
        start = int(model.ev_start[i]) - model.t0
        dur = int(model.ev_end[i] - model.ev_start[i])
        t = Text(str(row["name"]), style="bold")
        t.append("\n")
        t.append(f"{row['kind']}", style=KIND_STYLES.get(str(row["kind"]), ""))
        t.append(f" · rank {rank} · {lane} · iteration {row['iteration'] if row['iteration'] is not None else '–'}")
        t.append(f"\nstart {fmt_time(start, 1000)} · duration {fmt_ns(dur)} · end {fmt_time(start + dur, 1000)}")
        extra = []
        for key, label in (("bytes", "bytes"), ("correlation", "correlation"), ("external_id", "external id"),
                           ("cat", "category")):
            v = row.get(key)
            if v is not None:
                extra.append(f"{label} {fmt_bytes(v) if key == 'bytes' else v}")
        if extra:
            t.append("\n" + " · ".join(extra))
        if row.get("collective_id") is not None:
            t.append("\n")
            t.append_text(self._collective(rank, int(row["collective_id"])))
        return t

    def _collective(self, rank: int, collective_id: int) -> Text:
        """This rank's collective call, and the instance it was matched into across ranks when the
        ``collective_members`` / ``collective_instances`` tables have it."""
        assert self._data is not None
        tables = self._data.tables()
        colls = tables.get("collectives")
        if colls is None or colls.num_rows == 0:
            return Text()
        mask = (np.asarray(colls.column("rank").to_numpy(zero_copy_only=False)) == rank) & \
            (np.asarray(colls.column("collective_id").to_numpy(zero_copy_only=False)) == collective_id)
        hit = np.flatnonzero(mask)
        if not hit.size:
            return Text()
        c = colls.slice(int(hit[0]), 1).to_pylist()[0]
        t = Text("collective: ", style="bold")
        parts = [str(c["op"] or "?")]
        if c["bytes"] is not None:
            parts.append(fmt_bytes(c["bytes"]))
        for key in ("dtype", "nranks", "pg", "seq", "algorithm", "protocol", "source"):
            if c.get(key) is not None:
                parts.append(f"{key} {c[key]}")
        t.append(" · ".join(parts))
        members, instances = tables.get("collective_members"), tables.get("collective_instances")
        if members is not None and instances is not None:
            t.append_text(matched_instance(members, instances, rank, collective_id))
        return t


#: members listed by name in the details panel; beyond this, this rank, the first and the last to arrive
MEMBERS_LISTED = 4


def matched_instance(members: pa.Table, instances: pa.Table, rank: int, collective_id: int) -> Text:
    """The instance that ``rank``'s collective call ``collective_id`` was matched into (through
    ``collective_members``), and when each member arrived, ended and waited, relative to the first
    arrival (member times are on the job clock, so ranks compare directly). Empty if it was not matched."""
    m_rank = np.asarray(members.column("rank").to_numpy(zero_copy_only=False))
    m_cid = np.asarray(members.column("collective_id").to_numpy(zero_copy_only=False))
    hit = np.flatnonzero((m_rank == rank) & (m_cid == collective_id))
    if not hit.size:
        return Text()
    instance = int(members.column("instance")[int(hit[0])].as_py())
    i_id = np.asarray(instances.column("instance").to_numpy(zero_copy_only=False))
    row_i = np.flatnonzero(i_id == instance)
    if not row_i.size:
        return Text()
    r = instances.slice(int(row_i[0]), 1).to_pylist()[0]
    rows = members.take(pa.array(np.flatnonzero(np.asarray(members.column("instance").to_numpy(
        zero_copy_only=False)) == instance))).to_pylist()
    rows.sort(key=lambda m: (m["start_ns"], m["rank"]))
    t = Text(f"\nmatched instance #{instance}", style="bold")
    seen = len(r.get("ranks") or [])
    t.append(f" ({r.get('matched_by')}) on {seen}/{r.get('nranks') or '?'} ranks · skew {fmt_ns(r.get('skew_ns'))}"
             f" · transfer {fmt_ns(r.get('transfer_ns'))}")
    if r.get("straggler_rank") is not None:
        t.append(f" · straggler rank {r['straggler_rank']}", style="red")
    flags = [say for say, bad in (("partial", r.get("partial")), ("inconsistent", r.get("consistent") is False),
                                  ("sizes differ", r.get("sizes_agree") is False)) if bad]
    if flags:
        t.append(" · " + ", ".join(flags), style="yellow")
    first = rows[0]["start_ns"]
    shown = rows
    if len(rows) > MEMBERS_LISTED:
        shown = [m for k, m in enumerate(rows) if k == 0 or m["straggler"] or m["rank"] == rank]
    t.append("\n")
    for k, m in enumerate(shown):
        if k:
            t.append(" · ")
        who = f"rank {m['rank']}" + (" (here)" if m["rank"] == rank else "")
        t.append(who, style="bold" if m["rank"] == rank else "")
        t.append(f" +{fmt_ns(m['start_ns'] - first)}→+{fmt_ns(m['end_ns'] - first)}")
        if m["wait_ns"]:
            t.append(f" waited {fmt_ns(m['wait_ns'])}")
        if m["straggler"]:
            t.append(" last", style="red")
    if len(shown) < len(rows):
        t.append(f" · {len(rows) - len(shown)} more", style="dim")
    return t
