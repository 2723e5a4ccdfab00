"""The timeline canvas (:class:`TimelineCanvas`): the lanes, a ruler and an iterations row, with zoom, pan, a
cursor, jumps (next communication, critical-path segment or search hit), mouse drag and scroll, and the
overlays (:class:`tracekit.views.timeline.Marks`) drawn over the lanes. :mod:`tracekit.tui.timeline_view` puts it
in the Timeline tab.

The canvas uses Textual's Line API: :meth:`TimelineCanvas.render_line` draws one row from
:meth:`tracekit.views.timeline.TimelineModel.cells` — as many cells as the row has, whatever the trace size —
and caches each rendered lane by (lane, zoom, offset, width), so moving the cursor redraws from the
cache and a zoom or pan costs one slice of a stored level per visible lane.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding, BindingType
from textual.cache import LRUCache
from textual.geometry import Size
from textual.message import Message
from textual.strip import Strip
from textual.widget import Widget

from tracekit.tui.data import PATH_MARKS
from tracekit.views.report import CLASS_STYLES, KIND_STYLES, fmt_ns
from tracekit.views.timeline import Marks, TimelineModel, cell_ns, ticks

GLYPHS = " ▁▂▃▄▅▆▇"
#: how marks of each overlay are highlighted: search hits get a white background; the critical path is a
#: bold white line through the cells it crosses (over their kind colour; names stay, in bold white)
MARK_STYLES = {"search": Style(bgcolor="bright_white"), PATH_MARKS: Style(color="bright_white", bold=True)}
#: the character an overlay draws in its cells (where no name is written); none: the cell's own
MARK_GLYPHS = {PATH_MARKS: "━"}
#: what to call each overlay in messages
MARK_NAMES = {"search": "search hit", PATH_MARKS: "critical-path segment"}
#: one key press (+/-) zooms by 2: all four zoom steps of a doubling (two, ×1.4 a press, left two presses at ×2,
#: which read as a key that did half its job); the wheel keeps one step (×1.19) for fine control
ZOOM_KEY_STEPS = 4


def fmt_time(t: int, step: int | None = None, *, unit_from_step: bool = False) -> str:
    """A time after the job start with the decimals that resolve ``step`` ns (default: 1 µs). The unit
    is the largest that ``t`` reaches, or (``unit_from_step``, for rulers) that ``step`` reaches."""
    step = max(step or 1000, 1)
    ref = step if unit_from_step else max(abs(t), step)
    unit, scale = "ns", 1
    for u, sc in (("s", 10**9), ("ms", 10**6), ("µs", 10**3)):
        if ref >= sc:
            unit, scale = u, sc
            break
    decimals = 0 if step % scale == 0 else min(max(0, math.ceil(-math.log10(step / scale))), 6)
    return f"{t / scale:.{decimals}f} {unit}"


class TimelineCanvas(Widget, can_focus=True):
    """The lanes, a ruler and an iterations row; all drawing is here."""

    LABEL_WIDTH = 18
    HEADER_ROWS = 2
    DEFAULT_CSS = """
    TimelineCanvas { height: 1fr; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left,h", "move(-1)", "Cursor left", show=False),
        Binding("right,l", "move(1)", "Cursor right", show=False),
        Binding("shift+left,H", "move(-8)", "Cursor 8 cells left", show=False),
        Binding("shift+right,L", "move(8)", "Cursor 8 cells right", show=False),
        Binding("up,k", "lane(-1)", "Lane up", show=False),
        Binding("down,j", "lane(1)", "Lane down", show=False),
        Binding("pageup", "lane(-10)", "10 lanes up", show=False),
        Binding("pagedown", "lane(10)", "10 lanes down", show=False),
        Binding("plus,equals_sign,i", "zoom(-1)", "Zoom in", key_display="+"),
        Binding("minus,o", "zoom(1)", "Zoom out", key_display="-"),
        Binding("left_square_bracket", "pan(-1)", "Pan left", key_display="["),
        Binding("right_square_bracket", "pan(1)", "Pan right", key_display="]"),
        Binding("f,0", "fit", "Fit job"),
        Binding("w", "fit_iteration", "Fit iteration"),
        Binding("home", "edge(0)", "Job start", show=False),
        Binding("end", "edge(1)", "Job end", show=False),
        Binding("c", "jump_kind('comm', 1)", "Next comm"),
        Binding("C", "jump_kind('comm', 0)", "Previous comm", show=False),
        Binding("n", "jump_mark('search', 1)", "Next search hit", show=False),
        Binding("N", "jump_mark('search', 0)", "Previous search hit", show=False),
        Binding("p", f"jump_mark('{PATH_MARKS}', 1)", "Next path segment"),
        Binding("P", f"jump_mark('{PATH_MARKS}', 0)", "Previous path segment", show=False),
        Binding("u", f"toggle_marks('{PATH_MARKS}')", "Critical path drawn / hidden", show=False),
    ]

    class CursorMoved(Message):
        """The cursor or the view changed: the details panel and status line follow."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.model: TimelineModel | None = None
        self.zoom = 0
        self.first_cell = 0  # first visible cell, counted from the job start (a view offset)
        self.cursor_lane = 0
        self.cursor_t = 0  # job-clock ns; the cursor is the cell that contains it
        self.top_lane = 0  # first visible lane
        self.marks: dict[str, Marks] = {}
        self.hidden_marks: set[str] = set()  # overlays not drawn (still jumped to)
        self._lines: LRUCache[tuple[int, int, int, int, Style], tuple[list[str], list[Style], Strip]] = \
            LRUCache(4096)
        self._drag: tuple[int, int] | None = None
        self._dragged = False
        self._pending: tuple[int, int, int, int | None] | None = None  # show_span's arguments, once sized
        self._fit_pending = False  # fit the job once the canvas has its size
        self._base: tuple[tuple[str, bool], Style] | None = None
        self._palettes: dict[tuple[bool, tuple[str, ...], Style], tuple[list[Style], list[Style]]] = {}

    # ----------------------------------------------------------------- state

    @property
    def track_width(self) -> int:
        return max(self.size.width - self.LABEL_WIDTH, 1)

    @property
    def lane_rows(self) -> int:
        return max(self.size.height - self.HEADER_ROWS, 1)

    @property
    def cell(self) -> int:
        return cell_ns(self.zoom)

    @property
    def cursor_cell(self) -> int:
        """The cursor's cell counted from the job start."""
        assert self.model is not None
        return (self.cursor_t - self.model.t0) // self.cell

    def set_model(self, model: TimelineModel) -> None:
        self.model = model
        self._lines.clear()
        self.cursor_lane = 0
        self.cursor_t = model.t0
        self.top_lane = 0
        if self.size.width > self.LABEL_WIDTH:
            self.action_fit()
        else:
            self._fit_pending = True

    def on_resize(self, event: events.Resize) -> None:
        if self.model is None or self.size.width <= self.LABEL_WIDTH:
            return
        if self._pending is not None:
            self._fit_pending = False
            self.show_span(*self._pending)
        elif self._fit_pending:
            self._fit_pending = False
            self.action_fit()
        else:
            self._keep_cursor_visible()
        self.refresh()

    def _changed(self) -> None:
        self.refresh()
        self.post_message(self.CursorMoved())

    def _clamp_offset(self) -> None:
        assert self.model is not None
        total = -(-self.model.span // self.cell)
        w = self.track_width
        self.first_cell = int(min(max(self.first_cell, -(w // 2)), max(total - w // 2, 0)))

    def _keep_cursor_visible(self) -> None:
        if self.model is None:
            return
        col = self.cursor_cell - self.first_cell
        w = self.track_width
        if col < 0:
            self.first_cell = self.cursor_cell - min(4, w // 4)
        elif col >= w:
            self.first_cell = self.cursor_cell - w + 1 + min(4, w // 4)
        self._clamp_offset()
        n = len(self.model.lanes)
        self.cursor_lane = min(max(self.cursor_lane, 0), n - 1)
        if self.cursor_lane < self.top_lane:
            self.top_lane = self.cursor_lane
        elif self.cursor_lane >= self.top_lane + self.lane_rows:
            self.top_lane = self.cursor_lane - self.lane_rows + 1
        self.top_lane = min(max(self.top_lane, 0), max(n - self.lane_rows, 0))

    def _set_cursor_cell(self, cell: int) -> None:
        assert self.model is not None
        cell = min(max(cell, 0), max((self.model.span - 1) // self.cell, 0))
        self.cursor_t = self.model.t0 + cell * self.cell

    def set_zoom(self, zoom: int, anchor_col: int | None = None) -> None:
        """Zoom so that the time at screen column ``anchor_col`` (default: the cursor's) stays put."""
        if self.model is None:
            return
        zoom = min(max(zoom, 0), self.model.max_zoom(self.track_width))
        col = self.cursor_cell - self.first_cell if anchor_col is None else anchor_col
        anchor_t = self.cursor_t if anchor_col is None else self.model.t0 + (self.first_cell + anchor_col) * self.cell
        self.zoom = zoom
        self.first_cell = (anchor_t - self.model.t0) // self.cell - col
        self._clamp_offset()
        if anchor_col is not None and not 0 <= self.cursor_cell - self.first_cell < self.track_width:
            self._set_cursor_cell(self.first_cell + anchor_col)
        self._keep_cursor_visible()
        self._changed()

    def show_span(self, lane: int, start: int, end: int, cursor: int | None = None) -> None:
        """Zoom to show job-clock ``start .. end`` on ``lane``, with the cursor at ``cursor`` (default
        ``start``)."""
        if self.model is None:
            return
        if self.size.width <= self.LABEL_WIDTH:
            self._pending = (lane, start, end, cursor)
            return
        self._pending = None
        w = self.track_width
        self.zoom = min(self.model.fit_zoom(max(w * 9 // 10, 1), max(end - start, 1)),
                        self.model.max_zoom(w))
        span_cells = -(-(end - start) // self.cell)
        self.first_cell = (start - self.model.t0) // self.cell - max((w - span_cells) // 2, 0)
        self._clamp_offset()
        self.cursor_lane = lane
        self.cursor_t = start if cursor is None else min(max(cursor, self.model.t0), self.model.t1 - 1)
        self.top_lane = lane - min(2, self.lane_rows // 2)
        self._keep_cursor_visible()
        self._changed()

    def jump_to_event(self, i: int) -> None:
        """Put the cursor on sorted event ``i``, scrolling (not zooming) to it."""
        assert self.model is not None
        self.cursor_lane = self.model.lane_of_event(i)
        self.cursor_t = int(self.model.ev_start[i])
        col = self.cursor_cell - self.first_cell
        if not 0 <= col < self.track_width:
            self.first_cell = self.cursor_cell - self.track_width // 3
        self._keep_cursor_visible()
        self._changed()

    def set_marks(self, name: str, marks: Marks | None) -> None:
        """Show (or, with None, remove) the overlay ``name``; :data:`MARK_STYLES` says how it looks."""
        if marks is None:
            self.marks.pop(name, None)
        else:
            self.marks[name] = marks
        self._changed()

    def action_toggle_marks(self, name: str) -> None:
        """Draw the overlay ``name`` or stop drawing it (its jump keys keep working)."""
        if name not in self.marks:
            self.notify(f"no {MARK_NAMES.get(name, name)}s to show", timeout=2)
            return
        self.hidden_marks ^= {name}
        self.notify(f"{MARK_NAMES.get(name, name)}s {'hidden' if name in self.hidden_marks else 'shown'}",
                    timeout=2)
        self._changed()

    # ----------------------------------------------------------------- actions

    def action_move(self, cells: int) -> None:
        if self.model is None:
            return
        self._set_cursor_cell(self.cursor_cell + cells)
        self._keep_cursor_visible()
        self._changed()

    def action_lane(self, step: int) -> None:
        if self.model is None:
            return
        self.cursor_lane = min(max(self.cursor_lane + step, 0), len(self.model.lanes) - 1)
        self._keep_cursor_visible()
        self._changed()

    def action_zoom(self, direction: int) -> None:
        self.set_zoom(self.zoom + direction * ZOOM_KEY_STEPS)

    def action_pan(self, direction: int) -> None:
        if self.model is None:
            return
        self.first_cell += direction * max(self.track_width // 2, 1)
        self._clamp_offset()
        col = self.cursor_cell - self.first_cell
        if not 0 <= col < self.track_width:
            self._set_cursor_cell(self.first_cell + min(max(col, 0), self.track_width - 1))
        self._keep_cursor_visible()
        self._changed()

    def action_fit(self) -> None:
        if self.model is None:
            return
        self.zoom = self.model.fit_zoom(self.track_width)
        self.first_cell = 0
        self._keep_cursor_visible()
        self._changed()

    def action_fit_iteration(self) -> None:
        if self.model is None:
            return
        lane = self.model.lanes[self.cursor_lane]
        it = self.model.iteration_at(lane.rank, self.cursor_t)
        window = self.model.window(lane.rank, it) if it is not None else None
        if window is not None:
            cursor = self.cursor_t
            self.show_span(self.cursor_lane, *window)
            self.cursor_t = cursor  # the cursor stays where it was, inside the window
            self._keep_cursor_visible()
            self._changed()

    def action_edge(self, end: int) -> None:
        if self.model is None:
            return
        self.cursor_t = self.model.t1 - 1 if end else self.model.t0
        self._keep_cursor_visible()
        self._changed()

    def action_jump_kind(self, kind: str, forward: int) -> None:
        """Next (previous) event of ``kind`` on the cursor's rank after (before) the cursor."""
        if self.model is None:
            return
        rank = self.model.lanes[self.cursor_lane].rank
        lanes = self.model.lanes_of_rank(rank)
        t = self.cursor_t + (self.cell - 1 if forward else 0)
        i = self.model.next_event(t, lanes, (kind,), forward=bool(forward))
        if i is None:
            self.notify(f"no {'next' if forward else 'previous'} {kind} event on rank {rank}", timeout=2)
            return
        self.jump_to_event(i)

    def action_jump_mark(self, name: str, forward: int) -> None:
        if self.model is None:
            return
        marks = self.marks.get(name)
        if marks is None or not len(marks):
            self.notify("nothing to jump to: search first (/)" if name == "search" else
                        f"no {MARK_NAMES.get(name, name)}s (yet)", timeout=2)
            return
        t = self.cursor_t + (self.cell - 1 if forward else 0)
        i = marks.next_after(t) if forward else marks.prev_before(self.cursor_t)
        if i is None:
            i = 0 if forward else len(marks) - 1  # wrap around
        ev = int(marks.event[i])
        if ev >= 0:
            self.jump_to_event(ev)
        else:
            self.cursor_lane = int(marks.lane[i])
            self.cursor_t = int(marks.start[i])
            self._keep_cursor_visible()
            self._changed()

    # ----------------------------------------------------------------- mouse

    def _cell_at(self, x: int, y: int) -> tuple[int, int] | None:
        if self.model is None or x < self.LABEL_WIDTH or y < self.HEADER_ROWS:
            return None
        lane = self.top_lane + y - self.HEADER_ROWS
        if lane >= len(self.model.lanes):
            return None
        return lane, x - self.LABEL_WIDTH

    def on_mouse_down(self, event: events.MouseDown) -> None:
        if self.model is not None and event.x >= self.LABEL_WIDTH:
            self._drag = (event.x, self.first_cell)
            self._dragged = False
            self.capture_mouse()

    def on_mouse_move(self, event: events.MouseMove) -> None:
        if self._drag is None or self.model is None:
            return
        x0, off0 = self._drag
        if event.x != x0:
            self._dragged = True
            self.first_cell = off0 - (event.x - x0)
            self._clamp_offset()
            self.refresh()

    def on_mouse_up(self, event: events.MouseUp) -> None:
        if self._drag is not None:
            self._drag = None
            self.release_mouse()
            if self._dragged:
                self._changed()

    def on_click(self, event: events.Click) -> None:
        self.focus()
        if self._dragged:
            self._dragged = False
            return
        hit = self._cell_at(event.x, event.y)
        if hit is not None:
            self.cursor_lane = hit[0]
            self._set_cursor_cell(self.first_cell + hit[1])
            self._keep_cursor_visible()
            self._changed()

    def on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        event.stop()
        if event.shift:
            self.action_pan(-1)
        elif event.x >= self.LABEL_WIDTH:
            self.set_zoom(self.zoom - 1, event.x - self.LABEL_WIDTH)
        else:
            self.action_lane(-1)

    def on_mouse_scroll_down(self, event: events.MouseScrollDown) -> None:
        event.stop()
        if event.shift:
            self.action_pan(1)
        elif event.x >= self.LABEL_WIDTH:
            self.set_zoom(self.zoom + 1, event.x - self.LABEL_WIDTH)
        else:
            self.action_lane(1)

    def on_mouse_scroll_left(self, event: events.MouseScrollLeft) -> None:
        event.stop()
        self.action_pan(-1)

    def on_mouse_scroll_right(self, event: events.MouseScrollRight) -> None:
        event.stop()
        self.action_pan(1)

    # ----------------------------------------------------------------- drawing

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return container.height

    def _base_style(self) -> Style:
        """The widget's own style (background), computed once per theme and focus state: asking
        Textual for it costs more than drawing a row."""
        key = (self.app.theme, self.has_focus)
        if self._base is None or self._base[0] != key:
            self._base = (key, self.rich_style)
        return self._base[1]

    def _palette(self, lane_is_classes: bool, kinds: tuple[str, ...], base: Style) -> tuple[list[Style], list[Style]]:
        """Styles of full and partly busy cells for each kind of a lane (cached)."""
        key = (lane_is_classes, kinds, base)
        got = self._palettes.get(key)
        if got is None:
            colours = CLASS_STYLES if lane_is_classes else KIND_STYLES
            got = ([base + Style(bgcolor=colours[k], color="black") for k in kinds],
                   [base + Style(color=colours[k]) for k in kinds])
            self._palettes[key] = got
        return got

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        base = self._base_style()
        if self.model is None:
            return Strip.blank(width, base)
        if y == 0:
            return self._ruler(base)
        if y == 1:
            return self._iteration_row(base)
        lane = self.top_lane + y - self.HEADER_ROWS
        if lane >= len(self.model.lanes):
            return Strip.blank(width, base)
        return Strip.join([self._label(lane, base), self._track(lane, base)])

    def _label(self, lane: int, base: Style) -> Strip:
        assert self.model is not None
        ln = self.model.lanes[lane]
        w = self.LABEL_WIDTH
        text = ln.label if ln.is_classes else "  " + ln.label
        text = (text if len(text) < w else text[: w - 2] + "…").ljust(w - 1) + " "
        style = base + Style(bold=ln.is_classes, dim=not ln.is_classes)
        if lane == self.cursor_lane:
            style = base + Style(reverse=True, bold=True)
        return Strip([Segment(text, style)], w)

    def _cells(self, lane: int, base: Style) -> tuple[list[str], list[Style], Strip]:
        """Characters and styles of one lane at the current zoom and offset (cached)."""
        assert self.model is not None
        key = (lane, self.zoom, self.first_cell, self.track_width, base)  # base: a theme change redraws
        got = self._lines.get(key)
        if got is not None:
            return got
        ln = self.model.lanes[lane]
        w = self.track_width
        cells = self.model.cells(lane, self.zoom, self.first_cell, w)
        full, part = self._palette(ln.is_classes, ln.kinds, base)
        # one code per cell (kind × eighths busy), then one step per run of equal cells
        eighths = np.minimum(np.ceil(cells.fill * 8).astype(np.int64), 8)
        code = np.where((cells.kind < 0) | (eighths <= 0), -1, cells.kind.astype(np.int64) * 9 + eighths)
        cuts = np.flatnonzero(np.diff(code)) + 1
        chars: list[str] = []
        styles: list[Style] = []
        for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), w], strict=True):
            c = int(code[a])
            k, n = divmod(c, 9)
            if c < 0:
                ch, st = " ", base
            elif n >= 8:
                ch, st = " ", full[k]
            else:
                ch, st = GLYPHS[n], part[k]
            chars.extend(ch * (b - a))
            styles.extend([st] * (b - a))
        kind = cells.kind
        for a, b, ki, name in self.model.labels(lane, self.zoom, self.first_cell, w):
            run = [c for c in range(a, b) if kind[c] == ki and chars[c] == " " and styles[c] is full[ki]]
            room = len(run) - 1  # a blank cell before the name
            if room < min(len(name), 5):
                continue
            text = name if len(name) <= room else name[: room - 1] + "…"
            for c, ch in zip(run[1:], text, strict=False):
                chars[c] = ch
        strip = _strip(chars, styles, w)
        self._lines[key] = (chars, styles, strip)
        return chars, styles, strip

    def _track(self, lane: int, base: Style) -> Strip:
        assert self.model is not None
        chars, styles, strip = self._cells(lane, base)
        overlays = []
        w = self.track_width
        if self.marks:
            edges = self.model.t0 + (np.arange(w + 1, dtype=np.int64) + self.first_cell) * self.cell
            for name, marks in self.marks.items():
                if name in self.hidden_marks:
                    continue
                iv = marks.on_lane(lane)
                if len(iv):
                    hit = np.flatnonzero(iv.coverage(edges) > 0)
                    if hit.size:
                        overlays.append((hit.tolist(), MARK_STYLES.get(name, Style(bgcolor="white")),
                                         MARK_GLYPHS.get(name)))
        col = self.cursor_cell - self.first_cell if lane == self.cursor_lane else -1
        if not overlays and not 0 <= col < w:
            return strip
        chars, styles = list(chars), list(styles)
        for cols, style, glyph in overlays:
            for c in cols:
                styles[c] = styles[c] + style  # Style's sum is cached: equal cells share one object
                if glyph is not None and chars[c] in GLYPHS:  # blank or a fill level, not a name
                    chars[c] = glyph
        if 0 <= col < w:
            styles[col] = styles[col] + Style(reverse=True, bold=True)
            if chars[col] == " ":
                chars[col] = "▏"
        return _strip(chars, styles, w)

    def _ruler(self, base: Style) -> Strip:
        assert self.model is not None
        w = self.track_width
        dim = base + Style(dim=True)
        head = Text(f"{fmt_ns(self.cell)}/cell".ljust(self.LABEL_WIDTH), style=dim)
        chars = [" "] * w
        t_view = self.first_cell * self.cell
        marks = ticks(t_view, self.zoom, w)
        step = marks[1][1] - marks[0][1] if len(marks) > 1 else None
        for cell, t in marks:
            label = "│" + fmt_time(t, step, unit_from_step=True)
            for i, ch in enumerate(label):
                if 0 <= cell + i < w:
                    chars[cell + i] = ch
        line = Strip([*head.render(self.app.console), Segment("".join(chars), dim)], self.size.width)
        return line.adjust_cell_length(self.size.width, base)

    def _iteration_row(self, base: Style) -> Strip:
        assert self.model is not None
        w = self.track_width
        rank = self.model.lanes[self.cursor_lane].rank
        label = Segment(f"rank {rank} steps".ljust(self.LABEL_WIDTH)[: self.LABEL_WIDTH], base + Style(dim=True))
        chars = [" "] * w
        shades = [base + Style(bgcolor="grey23"), base + Style(bgcolor="grey15")]
        styles = [base] * w
        win = self.model.iterations.get(rank)
        if win is not None:
            its, starts, ends = win
            v0 = self.model.t0 + self.first_cell * self.cell
            v1 = v0 + w * self.cell
            lo = int(np.searchsorted(ends, v0, side="right"))
            hi = int(np.searchsorted(starts, v1, side="left"))
            for i in range(lo, max(lo, hi)):
                a = max(int((starts[i] - v0) // self.cell), 0)
                b = min(int(-((v0 - ends[i]) // self.cell)), w)
                for c in range(a, b):
                    styles[c] = shades[i % 2]
                for j, ch in enumerate(f"#{its[i]}"[: max(b - a, 0)]):
                    chars[a + j] = ch
        col = self.cursor_cell - self.first_cell
        if 0 <= col < w:
            chars[col] = "▼"
            styles[col] = styles[col] + Style(bold=True)
        return Strip.join([Strip([label], self.LABEL_WIDTH), _strip(chars, styles, w)])


def _strip(chars: list[str], styles: list[Style], width: int) -> Strip:
    """Run-length encode per-cell characters and styles into a Strip."""
    segments = []
    start = 0
    for i in range(1, len(chars) + 1):
        if i == len(chars) or styles[i] is not styles[start]:  # styles are shared objects
            segments.append(Segment("".join(chars[start:i]), styles[start]))
            start = i
    return Strip(segments, width)
