"""The view contract of ``tracekit inspect``: what every view is and how it plugs in (every view module imports
this one; :mod:`tracekit.tui.tabs` lists the views).

A view is a widget class derived from :class:`View` that declares, as class variables, its id, tab
title, the key that shows it, and the analysis tables it needs (``REQUIRES``, names as in
``Analysis.tables()``). The app shows a view only when all of its tables exist and have rows — a view
for an analysis that is not built yet never appears as an empty stub — and it adds views while the
job loads, as their tables arrive (a view may narrow :meth:`View.available` further, e.g. to a loading
phase being done). To add a screen:

1. write ``tui/<name>.py`` with ``class XView(View)`` setting ``VIEW_ID``, ``TITLE``, ``KEY``,
   ``REQUIRES`` and implementing :meth:`View.show_data` (called with the :class:`JobData` once the view
   is mounted, and again whenever more of the job has loaded);
2. add the class to :func:`tracekit.tui.tabs.view_classes` in display order.

A view that wants to show something on the timeline posts :class:`ShowInTimeline` (rank-clock times,
as the events and breakdown have them; :func:`rank_clock` converts the job-clock times of the
critical path and the collective instances); the app switches to the timeline and moves its cursor
there. Views that compute in the background say so with :attr:`View.busy` (tests and screenshots
wait until no view is busy).
"""

from __future__ import annotations

from typing import Any, ClassVar

from textual.message import Message
from textual.widget import Widget

from tracekit.tui.data import JobData


class View(Widget):
    """Base of every view (one tab of the app)."""

    VIEW_ID: ClassVar[str] = ""
    TITLE: ClassVar[str] = ""
    KEY: ClassVar[str] = ""
    #: result tables (by their public names) that must exist and have rows for the view to appear
    REQUIRES: ClassVar[tuple[str, ...]] = ()
    #: whether the view needs the timeline model (phase 3) to show anything but a progress line
    NEEDS_TIMELINE: ClassVar[bool] = False
    #: keys the view's widgets handle themselves (a table's enter), for the key list (``?``) only
    HELP_KEYS: ClassVar[tuple[tuple[str, str], ...]] = ()

    def __init__(self, data: JobData | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._latest = data
        self._ready = False

    def on_mount(self) -> None:
        """Show the latest data once the view's widgets exist."""
        self.call_after_refresh(self._first_show)

    def _first_show(self) -> None:
        self._ready = True
        if self._latest is not None:
            self.show_data(self._latest)
        self.post_message(self.Shown())

    class Shown(Message):
        """A view has shown its data for the first time."""

    def update_data(self, data: JobData) -> None:
        """The app's entry point: show ``data`` now, or as soon as the view is mounted."""
        self._latest = data
        if self._ready:
            self.show_data(data)

    @classmethod
    def available(cls, data: JobData) -> bool:
        """True when every table the view needs is there, with rows."""
        tables = data.tables()
        # a job read rank by rank keeps its events on disk (a stream of batches): they are there
        return all(name in tables and getattr(tables[name], "num_rows", 1) > 0 for name in cls.REQUIRES)

    def show_data(self, data: JobData) -> None:
        """Display ``data``; called again as phases complete (cheap when nothing changed)."""
        raise NotImplementedError

    def focus_main(self) -> None:
        """Give the keyboard to the view's main widget."""
        self.focus()

    @property
    def busy(self) -> bool:
        """True while the view computes something in the background (a prediction, say)."""
        return False


class DeferredView(View):
    """A view whose content is built when its tab is first shown, and again when shown with new data: a
    big job has thousands of rows, no reason to delay the first screen with them."""

    def __init__(self, data: JobData | None = None, **kwargs: Any) -> None:
        super().__init__(data, **kwargs)
        self._pending: JobData | None = None

    def show_data(self, data: JobData) -> None:
        self._pending = data
        if self.display and self.region.width:
            self._fill()

    def on_show(self) -> None:
        self._fill()

    def _fill(self) -> None:
        """Build the content from ``self._pending`` (cheap when it is already shown)."""
        raise NotImplementedError


class ShowInTimeline(Message):
    """Ask the app to show a span on the timeline: ``rank``'s time ``start_ns .. end_ns`` (the rank's
    own clock), on lane ``lane`` (a lane name of that rank, None for its classes lane), with the cursor
    at ``cursor_ns`` (default: the start)."""

    def __init__(self, rank: int, start_ns: int, end_ns: int, lane: str | None = None,
                 cursor_ns: int | None = None) -> None:
        super().__init__()
        self.rank = rank
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.lane = lane
        self.cursor_ns = cursor_ns


def rank_clock(data: JobData, rank: int, job_ns: int) -> int:
    """A job-clock time (critical path, collective instances) on ``rank``'s own clock, as
    :class:`ShowInTimeline` takes it: minus the rank's ``ranks.clock_offset_ns``."""
    ranks = data.analysis.ranks if data.analysis is not None else data.ranks
    for r, off in zip(ranks.column("rank").to_pylist(), ranks.column("clock_offset_ns").to_pylist(), strict=True):
        if r == rank:
            return job_ns - int(off or 0)
    return job_ns
