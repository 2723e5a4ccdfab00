"""The ``tracekit inspect`` app: loads a job in a background worker (with progress; from the caches when
warm), adds each view as soon as the tables it needs exist, and routes jumps to the timeline.

Errors in the inputs end as one clear message on the screen (``q`` quits with status 1), never a
traceback; set ``TRACEKIT_DEBUG=1`` to let tracekit's own bugs raise.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Header, Label, ProgressBar, Static, TabbedContent, TabPane
from textual.worker import get_current_worker

from tracekit.model.diagnostics import TraceError
from tracekit.model.options import as_flags
from tracekit.tui.data import JobData, LoadCallbacks, LoadOptions, cached_summary, complete, load_job
from tracekit.tui.dialogs import ExportScreen, HelpScreen
from tracekit.tui.tabs import view_classes
from tracekit.tui.timeline_canvas import TimelineCanvas
from tracekit.tui.timeline_view import TimelineView
from tracekit.tui.views import ShowInTimeline, View

#: the phase after which loading is over (tui/data.py)
LAST_PHASE = "whatif"
#: ... when the job is compared with another run (``--diff``)
DIFF_PHASE = "diff"
MOUSE_HELP = [("click", "move the cursor there"), ("wheel", "zoom in / out around the pointer"),
              ("shift+wheel, horizontal wheel", "pan"), ("drag", "pan"),
              ("wheel over the lane names", "scroll lanes")]


def _start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker now, while ``sys.stderr`` is the real one: once Textual
    runs, stderr is a capture without a file descriptor, and a process pool started from the loading
    thread (parallel parsing) would fail to launch the tracker."""
    from multiprocessing import resource_tracker

    with contextlib.suppress(OSError, ValueError):
        resource_tracker.ensure_running()


class ViewTabs(TabbedContent):
    """The views' tabs, switched only by their keys, the tab bar and jumps to the timeline.

    Textual's TabbedContent also shows the pane of any widget that takes focus, but it learns of the focus
    from a message that comes later: a view key pressed meanwhile (``4`` then ``5`` typed quickly) was
    undone, and the app went back to the view before it. Every focus here is in the pane just shown.
    """

    def on_tab_pane_focused(self, event: TabPane.Focused) -> None:
        event.stop()
        event.prevent_default()  # not TabbedContent's own handler, which would show that pane again


class InspectApp(App[int]):
    """Browse one job: overview, iterations and timeline (and any view whose analysis exists)."""

    CSS_PATH = "app.tcss"
    TITLE = "tracekit inspect"
    BINDINGS: ClassVar[list[BindingType]] = [
        # the tabs show their keys already ("1 Overview"): the footer keeps its room for the view's own keys
        *[Binding(v.KEY, f"show_view('{v.VIEW_ID}')", v.TITLE, show=False) for v in view_classes()],
        Binding("question_mark", "help", "Keys", key_display="?"),
        Binding("e", "export_parquet", "Export"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, paths: Iterable[str] = (), options: LoadOptions | None = None, *,
                 data: JobData | None = None) -> None:
        super().__init__()
        self.paths = [str(p) for p in paths]
        self.options = options or LoadOptions()
        self.data: JobData | None = None
        self._preloaded = data
        # a warm results cache gives the first screen before anything else is read
        self._start = cached_summary(self.paths, self.options) if data is None and self.paths else None
        if data is None and self.paths and self._start is None:
            _start_resource_tracker()
        elif self.options.jobs is None:
            # parsing in worker processes needs the tracker; with cached results the traces are cached
            # too, and a rare miss parses in this process rather than delay the first screen
            self.options = replace(self.options, jobs=1)
        self._pending_jump: ShowInTimeline | None = None
        self.error: str | None = None
        #: set once each phase has been displayed (tests and the benchmark wait on these)
        self.phases: set[str] = set()
        #: the views shown so far, by id
        self.views: dict[str, View] = {}
        self._painted = threading.Event()  # set once the first views are on the screen
        #: the loading step under way whose progress is not known: its label, what it is, since when
        self._busy: tuple[Label, str, float] | None = None
        names = ", ".join(Path(p).name or p for p in self.paths)
        self.sub_title = names if len(names) < 60 else names[:57] + "…"

    # ----------------------------------------------------------------- layout

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False, icon="◆")
        with Vertical(id="loading"):
            yield Label("starting", id="loading-what")
            yield ProgressBar(total=1.0, show_eta=False, id="loading-bar")
        with ViewTabs(id="views"):
            if self._start is not None:  # the views of the cached results, in the very first frame
                data = self._start[0]
                for cls in view_classes():
                    if cls.available(data):
                        view = self.views[cls.VIEW_ID] = cls(data, id=f"view-{cls.VIEW_ID}")
                        yield TabPane(f"{cls.KEY} {cls.TITLE}", view, id=cls.VIEW_ID)
        with Horizontal(id="statusbar"):
            yield Label("", id="status-what")
            yield ProgressBar(total=1.0, show_eta=False, show_percentage=False, id="status-bar")
        yield Footer()

    def on_mount(self) -> None:
        self.set_interval(1.0, self._tick)
        self.query_one("#views").display = False
        self.query_one("#statusbar").display = False
        if self._preloaded is not None:
            self._load_preloaded(self._preloaded)
            return
        if self._start is not None:
            self._phase("summary", self._start[0])
        self._load()

    # ----------------------------------------------------------------- loading

    def _ui(self, callback: Any, *args: Any) -> None:
        """Run ``callback`` on the UI thread, unless the app has stopped meanwhile."""
        with contextlib.suppress(RuntimeError):  # the app is no longer running
            self.call_from_thread(callback, *args)

    @work(thread=True, exclusive=True, group="load")
    def _load(self) -> None:
        if self._start is not None:
            self._painted.wait(timeout=5.0)  # the cached results first, then the heavy loading
        callbacks = LoadCallbacks(
            progress=lambda what, frac: self._ui(self._progress, what, frac),
            summary=self._summary_from_thread,
            analysis=lambda data: self._ui(self._phase, "analysis", data),
            **self._later_phases(),
        )
        try:
            load_job(self.paths, self.options, callbacks, start=self._start)
        except TraceError as exc:  # named as the command line's flags, which the user typed
            self._ui(self._failed, as_flags(str(exc)))
        except OSError as exc:
            where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
            self._ui(self._failed, f"{where}{exc.strerror or exc}")
        except Exception as exc:  # tracekit's own bug: one line, unless debugging
            if os.environ.get("TRACEKIT_DEBUG"):
                raise
            self._ui(self._failed, f"internal error: {type(exc).__name__}: {exc} "
                                   "(set TRACEKIT_DEBUG=1 for the traceback)")

    def _summary_from_thread(self, data: JobData) -> None:
        """Show the first results, then hold the loading thread until they are painted: the rest of
        the loading is heavy Python work that would otherwise starve the first paint of the GIL."""
        self._ui(self._phase, "summary", data)
        self._painted.wait(timeout=5.0)

    def on_view_shown(self, message: View.Shown) -> None:
        if all(view._ready for view in self.views.values()) and "paint" not in self.phases:
            self.phases.add("paint")  # scheduled
            self.call_after_refresh(self._mark_painted)

    def _mark_painted(self) -> None:
        self.phases.add("painted")
        self._painted.set()

    def _later_phases(self) -> dict[str, Any]:
        """Callbacks of the phases after the analysis (timeline, critical path, what-if), to be made in a
        worker thread, which then stops at the next phase once the app is closing."""
        worker = get_current_worker()
        phases: dict[str, Any] = {phase: (lambda data, phase=phase: self._ui(self._phase, phase, data))
                                  for phase in ("timeline", "critical_path", "whatif", DIFF_PHASE)}
        return {**phases, "cancelled": lambda: worker.is_cancelled}

    @work(thread=True, exclusive=True, group="load")
    def _complete(self, data: JobData) -> None:
        """The phases a preloaded job has not been through yet (computed off the UI thread)."""
        callbacks = LoadCallbacks(progress=lambda what, frac: self._ui(self._progress, what, frac),
                                  **self._later_phases())
        complete(data, callbacks)

    def _load_preloaded(self, data: JobData) -> None:
        self._phase("summary", data)
        if data.analysis is not None:
            self._phase("analysis", data)
            self._complete(data)

    def _progress(self, what: str, fraction: float | None) -> None:
        """Say what the loading does: with its progress where known; where not, with the seconds it has taken so far
        (:meth:`_tick`), not an animated bar — whose frames took a second of CPU in 15 from the analysis beside it."""
        if not self.screen.query("#statusbar"):
            return  # the app is closing
        started = self.data is not None
        label = self.query_one("#status-what" if started else "#loading-what", Label)
        bar = self.query_one("#status-bar" if started else "#loading-bar", ProgressBar)
        label.update(Text(what))  # it names files: never markup
        bar.display = fraction is not None
        if fraction is not None:
            bar.update(total=1.0, progress=fraction)
        busy = self._busy
        self._busy = None if fraction is not None else (
            (label, what, busy[2]) if busy is not None and busy[1] == what else (label, what, time.monotonic()))

    def _tick(self) -> None:
        """Once a second: the seconds the loading step without a known progress has taken so far."""
        if self._busy is not None:
            label, what, since = self._busy
            label.update(Text(f"{what} · {time.monotonic() - since:.0f} s"))

    def _phase(self, phase: str, data: JobData) -> None:
        """A loading phase is done: show or refresh the views that can show something now."""
        first = self.data is None
        self.data = data
        if first:
            self.query_one("#loading").display = False
            self.query_one("#views").display = True
            self.query_one("#statusbar").display = True
        tabs = self.query_one("#views", TabbedContent)
        order = [cls.VIEW_ID for cls in view_classes()]
        for cls in view_classes():
            if not cls.available(data):
                continue
            view = self.views.get(cls.VIEW_ID)
            if view is None:
                view = self.views[cls.VIEW_ID] = cls(data, id=f"view-{cls.VIEW_ID}")
                # in key order, whichever phase brought the view: before the first later view shown
                later = next((v for v in order[order.index(cls.VIEW_ID) + 1:] if v in self.views), None)
                tabs.add_pane(TabPane(f"{cls.KEY} {cls.TITLE}", view, id=cls.VIEW_ID), before=later)
            else:
                view.update_data(data)
        if first:
            self.call_after_refresh(self._focus_active)
        if phase == self.last_phase:
            self.query_one("#statusbar").display = False
            self._busy = None
        if phase == "timeline" and self._pending_jump is not None:
            jump, self._pending_jump = self._pending_jump, None
            self.call_after_refresh(self.on_show_in_timeline, jump)
        self.phases.add(phase)

    @property
    def last_phase(self) -> str:
        """The phase after which loading is over: :data:`DIFF_PHASE` when comparing with another run."""
        options = self.data.options if self.data is not None and self.data.options is not None else self.options
        return DIFF_PHASE if options.diff_paths else LAST_PHASE

    def _failed(self, message: str) -> None:
        self.error = message
        self._busy = None  # (its label says what failed now)
        self.query_one("#loading").display = True  # above the views, if some were shown already
        self.query_one("#loading-what", Label).update(Text.assemble(("tracekit: ", "bold red"), message))
        self.query_one("#loading-bar").display = False
        self.query_one("#statusbar").display = False
        self.query_one("#loading").mount(Static(Text("press q to quit", style="dim")))
        self.phases.add("failed")

    # ----------------------------------------------------------------- navigation

    def _focus_active(self) -> None:
        tabs = self.query_one("#views", TabbedContent)
        pane = tabs.active_pane
        if pane is not None:
            for view in pane.query(View):
                view.focus_main()
                return

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        self.call_after_refresh(self._focus_active)

    def action_show_view(self, view_id: str) -> None:
        tabs = self.query_one("#views", TabbedContent)
        if self.data is None:
            return
        if view_id not in self.views:
            self.notify(f"{view_id} is not available for this job yet", timeout=3)
            return
        tabs.active = view_id
        self.call_after_refresh(self._focus_active)

    def on_show_in_timeline(self, message: ShowInTimeline) -> None:
        tabs = self.query_one("#views", TabbedContent)
        if "timeline" not in self.views:
            self._pending_jump = message
            self.notify("the timeline is still loading; it will open there when ready", timeout=3)
            return
        tabs.active = "timeline"
        view = self.query_one(TimelineView)
        if not view.show(message.rank, message.start_ns, message.end_ns, message.lane, message.cursor_ns):
            self._pending_jump = message
            self.notify("the timeline is still loading; it will open there when ready", timeout=3)
            return
        self.call_after_refresh(view.focus_main)

    # ----------------------------------------------------------------- actions

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            return
        keys = sorted(cls.KEY for cls in view_classes() if cls.KEY.isdigit())  # 0 (Topology) comes after 9 in the tabs
        views = Binding(f"{keys[0]}…{keys[-1]}", "", "the views (tab keys; ! is Hang)")
        everywhere = [views, *(b for b in self.BINDINGS
                               if isinstance(b, Binding) and not b.action.startswith("show_view"))]
        sections: list[tuple[str, Iterable[BindingType]]] = [("Everywhere", everywhere),
                                                            ("Command palette", [Binding("ctrl+p", "", "commands")])]
        for cls in view_classes():
            items = list(cls.BINDINGS)
            if cls is TimelineView:
                items = list(TimelineCanvas.BINDINGS) + items
            items += [Binding(key, "", what) for key, what in cls.HELP_KEYS]
            sections.append((cls.TITLE, items))
        self.push_screen(HelpScreen(sections, MOUSE_HELP))

    def action_export_parquet(self) -> None:
        self._ask_export("parquet")

    def action_export_chrome(self) -> None:
        self._ask_export("chrome")

    def _ask_export(self, kind: str) -> None:
        if self.data is None or self.data.analysis is None:
            self.notify("the job is still loading; export when it is ready", severity="warning", timeout=3)
            return
        if kind == "parquet":
            screen = ExportScreen("Export to Parquet", "tracekit-export",
                                  "A directory gets one Parquet file per table (ranks, events, iterations, "
                                  "breakdown, collectives, …); a name ending in .parquet gets the breakdown.")
        else:
            screen = ExportScreen("Export a Chrome trace", "merged.json",
                                  "One JSON file with every rank on one clock, for Perfetto UI or chrome://tracing.")
        self.push_screen(screen, lambda answer: self._export(kind, answer))

    def _export(self, kind: str, answer: tuple[str, bool] | None) -> None:
        if answer is not None:
            self._run_export(kind, answer[0], answer[1])

    @work(thread=True, group="export")
    def _run_export(self, kind: str, path: str, force: bool) -> None:
        data = self.data
        assert data is not None and data.analysis is not None
        target = str(Path(path).expanduser())
        try:
            if kind == "parquet":
                from tracekit.views.export import export

                written = export(data.analysis.tables(), target, force=force)
                message = f"wrote {len(written)} Parquet files to {target}" if len(written) > 1 else \
                    f"wrote {written[0]}"
            else:
                from tracekit.views.chrome import critical_path_flows, write_chrome_trace

                n = write_chrome_trace(data.analysis, target, force=force, flows=critical_path_flows(data.analysis))
                message = f"wrote {n:,} trace events to {target}"
        except (TraceError, OSError) as exc:
            self.call_from_thread(self.notify, f"export failed: {exc}", severity="error", timeout=6)
            return
        self.call_from_thread(self.notify, message, title="Export", timeout=6)

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        """The command palette (ctrl+p): tracekit's commands, then Textual's own."""
        for cls in view_classes():
            if cls.VIEW_ID in self.views:
                yield SystemCommand(f"Show {cls.TITLE}", f"switch to the {cls.TITLE} view ({cls.KEY})",
                                    lambda v=cls.VIEW_ID: self.action_show_view(v))
        yield SystemCommand("Export tables to Parquet", "write every result table as Parquet (e)",
                            self.action_export_parquet)
        yield SystemCommand("Export a Chrome trace", "all ranks on one clock, for Perfetto UI",
                            self.action_export_chrome)
        if "timeline" in self.views:
            yield SystemCommand("Search the timeline", "find events by name (/)", self._palette_search)
        yield SystemCommand("Keys", "every key binding (?)", self.action_help)
        yield from super().get_system_commands(screen)

    def _palette_search(self) -> None:
        self.action_show_view("timeline")
        self.call_after_refresh(self.query_one(TimelineView).action_search)

    async def action_quit(self) -> None:
        status = 1 if self.error else 0
        self.exit(status, return_code=status)
