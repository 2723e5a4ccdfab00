"""What-if: the job replayed with another line rate, compression ratio, number of workers or link
efficiency (:mod:`tracekit.analysis.graph.whatif`, as ``tracekit whatif`` does). The predicted iteration time, speed-up
and scaling factor follow the inputs as they change, with a sweep of line rates around the chosen one
and the bottleneck verdict.

Below, Zhang et al.'s curves — the scaling factor against the line rate and against the compression ratio, at
the measured efficiency and at full utilisation, with the job as measured marked — as ``tracekit report`` draws
them: the points come from :func:`tracekit.views.figures.whatif_curves`, here only plotted (textual-plotext).

The what-if model and the verdict were built by the loading worker (phase 5, ``tui/data.py``); each new
prediction runs :func:`tracekit.analysis.graph.whatif.predict` in a thread worker (exclusive, after a short pause in the
typing), because one replay takes milliseconds on a small job and up to a second on a big one; the curves
(some forty replays) are computed once per job in a thread worker of their own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

from rich import box
from rich.table import Table
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.timer import Timer
from textual.widgets import Input, Label, RadioButton, RadioSet, Static
from textual.worker import get_current_worker
from textual_plotext import PlotextPlot

from tracekit.model.diagnostics import TraceError
from tracekit.model.options import as_flags
from tracekit.tui.data import JobData
from tracekit.tui.views import View
from tracekit.views.report import VERDICT_STYLES, fmt_ns

if TYPE_CHECKING:
    import polars as pl

    from tracekit.analysis.graph.whatif import Model, Scenario
    from tracekit.analysis.ranges import Range, Uncertainty
    from tracekit.views.figures import Curves

#: line rates of the sweep, as multiples of the chosen one
SWEEP = (0.5, 1.0, 2.0, 4.0, 10.0)
#: seconds of quiet typing before a prediction starts
DEBOUNCE_S = 0.25
#: the curves' colours by efficiency (as in the HTML report), and the measured point's
CURVE_COLOURS = {"measured": (214, 39, 40), "full": (31, 119, 180)}
CURVE_LABELS = {"measured": "link as measured", "full": "at full rate"}
POINT_COLOUR = "white"
POINT_MARKER = "◆"
TARGET_COLOUR = (44, 160, 44)


@dataclass(frozen=True)
class Inputs:
    """The what-if inputs as typed."""

    rate: str = ""
    compression: str = "1"
    workers: str = ""
    efficiency: str = "measured"  # or "full"


def scenario(inputs: Inputs, line_rate_bps: float | None) -> Scenario:
    """The :class:`tracekit.analysis.graph.whatif.Scenario` of ``inputs`` for a job that ran on ``line_rate_bps`` (None
    if unknown); raises ValueError with the message to show under the inputs."""
    from tracekit.analysis.graph.whatif import Scenario
    from tracekit.model.units import parse_rate

    rate = None
    if inputs.rate.strip():
        try:
            rate = parse_rate(inputs.rate, option="line rate")
        except TraceError as exc:
            raise ValueError(str(exc)) from None
    try:
        compression = float(inputs.compression) if inputs.compression.strip() else 1.0
    except ValueError:
        raise ValueError(f"compression {inputs.compression!r}: a ratio such as 1 (none) or 4") from None
    if not math.isfinite(compression) or compression < 1:
        raise ValueError(f"compression {inputs.compression!r}: a ratio of at least 1 (1 = none, 4 = a quarter "
                         "of the bytes)")
    workers = None
    if inputs.workers.strip():
        try:
            workers = int(inputs.workers)
        except ValueError:
            raise ValueError(f"workers {inputs.workers!r}: a whole number such as 8") from None
        if workers < 2:
            raise ValueError(f"workers {inputs.workers!r}: at least 2 (a single worker communicates nothing)")
    if inputs.efficiency == "measured" and rate is not None and line_rate_bps is None:
        raise ValueError("measured efficiency scales the bandwidth this job achieved with the line rate, so it "
                         "needs the rate the job ran on: start tracekit inspect with --link-bw, or choose full")
    if inputs.efficiency == "full" and rate is None and line_rate_bps is None:
        raise ValueError("full utilisation of which link? type a line rate (e.g. 10gbit)")
    return Scenario(bandwidth_bps=rate, compression=compression, workers=workers, efficiency=inputs.efficiency)


@dataclass
class Prediction:
    """What one set of inputs predicts (ns; the sweep's rows are ``(rate, iteration_ns)``)."""

    scenario: Scenario
    iteration_ns: int
    measured_ns: int  # the measured iteration
    replayed_ns: int  # the job replayed as measured: what speed-ups are against (the model's error cancels)
    free_ns: int
    sweep: list[tuple[float, int]]
    base_rate: float | None  # the rate the sweep multiplies (None: no sweep)
    #: the prediction's range (:mod:`tracekit.analysis.ranges`; None where the job's uncertainty is not at hand)
    range: Range | None = None

    @property
    def speedup(self) -> float:
        return self.replayed_ns / self.iteration_ns if self.iteration_ns else math.inf

    def scaling(self, iteration_ns: int) -> float:
        """Iteration time with free communication over ``iteration_ns`` (1.0 = communication is free)."""
        return self.free_ns / iteration_ns if iteration_ns else 1.0


def predict_all(model: Model, sc: Scenario, free_ns: int, line_rate_bps: float | None,
                cancelled: Any = lambda: False, uncertainty: Uncertainty | None = None) -> Prediction | None:
    """The prediction for ``sc`` (with its range, given the job's ``uncertainty``) and its sweep of line rates (None
    if ``cancelled()`` turned true)."""
    from tracekit.analysis import ranges
    from tracekit.analysis.graph.whatif import predict

    rng = ranges.predict(uncertainty, [sc])[0] if uncertainty is not None and uncertainty.model is model else None
    t = rng.point if rng is not None else predict(model, sc)
    base = sc.bandwidth_bps or line_rate_bps
    sweep: list[tuple[float, int]] = []
    if base is not None:
        for m in SWEEP:
            if cancelled():
                return None
            sweep.append((base * m, t if m == 1.0 else predict(model, replace(sc, bandwidth_bps=base * m))))
    return Prediction(sc, t, model.measured_iteration_ns, model.replayed_iteration_ns, free_ns, sweep, base, rng)


class WhatIfView(View, can_focus=True):
    """The sixth tab."""

    VIEW_ID = "whatif"
    TITLE = "What-if"
    KEY = "6"
    REQUIRES = ("collective_instances",)  # communication; available() also wants the model (phase 5)
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("r", "edit('rate')", "Line rate"),
        Binding("c", "edit('compression')", "Compression"),
        Binding("w", "edit('workers')", "Workers"),
        Binding("f", "toggle_efficiency", "Efficiency full/measured"),
        Binding("escape", "leave_input", "Back from an input", show=False),
    ]

    def __init__(self, data: JobData | None = None, **kwargs: Any) -> None:
        super().__init__(data, **kwargs)
        self._data: JobData | None = None
        self._shown: int | None = None
        self._timer: Timer | None = None
        self._asked = 0  # inputs changed this many times
        self._answered = 0  # the prediction for this change is shown
        self._curves_for: int | None = None  # id of the analysis whose curves are being computed or shown
        self._curves_pending = False
        self.curves: Curves | None = None
        self.prediction: Prediction | None = None
        self.error: str | None = None

    @classmethod
    def available(cls, data: JobData) -> bool:
        """The job has communication to re-cost and phase 5 has built the what-if model."""
        return (super().available(data) and data.whatif_ready and data.analysis is not None
                and not data.analysis.horovod_only and data.analysis.whatif.comm.height > 0)

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            with Horizontal(id="wi-inputs", classes="card"):
                yield Label("line rate", classes="wi-label")
                yield Input(placeholder="as the job ran", id="wi-rate", compact=True)
                yield Label("compression", classes="wi-label")
                yield Input("1", id="wi-compression", restrict=r"[0-9.eE+]*", compact=True)
                yield Label("workers", classes="wi-label")
                yield Input(id="wi-workers", restrict=r"[0-9]*", compact=True)
                yield Label("efficiency", classes="wi-label")
                with RadioSet(id="wi-efficiency", compact=True):
                    yield RadioButton("measured", value=True, id="wi-measured", compact=True)
                    yield RadioButton("full", id="wi-full", compact=True)
            yield Static(id="wi-error")
            yield Static(id="wi-prediction", classes="card")
            yield Static(id="wi-sweep", classes="card")
            with Horizontal(id="wi-curves"):
                with Vertical(id="wi-curve-rate-box", classes="card wi-curve"):
                    yield PlotextPlot(id="wi-curve-rate")
                with Vertical(id="wi-curve-compression-box", classes="card wi-curve"):
                    yield PlotextPlot(id="wi-curve-compression")
            yield Static(id="wi-verdict", classes="card")
            yield Static(id="wi-help", classes="hint")

    def on_mount(self) -> None:  # View.on_mount then shows the data
        for wid, title in (("wi-inputs", "What if …"), ("wi-prediction", "Predicted"),
                           ("wi-sweep", "Line rates around it"), ("wi-verdict", "Verdict"),
                           ("wi-curve-rate-box", "Scaling factor against the line rate"),
                           ("wi-curve-compression-box", "Scaling factor against compression")):
            self.query_one(f"#{wid}").border_title = title
        self._plot_message("computing the curves …")
        self.query_one("#wi-help", Static).update(Text(
            "r, c, w: edit the line rate, compression, workers (enter or escape: back) · f: full ↔ measured "
            "efficiency · tab: next input. Line rates as 10gbit, 25GB/s or 1e9 (bits/s); measured efficiency keeps "
            "what this job achieved on its link (scaled with the rate), full assumes the whole line rate; workers "
            "change the bus bytes of each op with the per-worker work unchanged; compression costs 0.15 ns per "
            "byte to encode and decode.", style="dim"))

    def focus_main(self) -> None:
        self.focus()  # not an input: the digits keep switching views

    @property
    def busy(self) -> bool:
        return self._answered != self._asked or self._curves_pending

    # ----------------------------------------------------------------- data

    def show_data(self, data: JobData) -> None:
        self._data = data
        if not self.available(data) or data.analysis is None or self._shown == id(data.analysis):
            return
        self._shown = id(data.analysis)
        from tracekit.model.units import format_rate

        analysis = data.analysis
        rate = analysis.line_rate_bps
        box = self.query_one("#wi-rate", Input)
        with box.prevent(Input.Changed):
            box.value = "" if rate is None else format_rate(rate).replace(" ", "")
        workers = self.query_one("#wi-workers", Input)
        with workers.prevent(Input.Changed):
            workers.value = str(analysis.whatif.workers)
        if data.verdict is not None:  # the job's one verdict, as the overview and the CLI say it
            verdict = Text(data.verdict.headline, style=VERDICT_STYLES.get(data.verdict.kind, "bold"))
            verdict.append(" " + " ".join([*data.verdict.support, *([data.verdict.caveat] if data.verdict.caveat
                                                                       else [])]))
        else:
            verdict = Text(data.bottleneck.text) if data.bottleneck is not None else Text("–")
        self.query_one("#wi-verdict", Static).update(verdict)
        self._changed(at_once=True)
        if self._curves_for != id(analysis):
            self._curves_for = id(analysis)
            self._curves_pending = True
            self._compute_curves(data)

    @work(thread=True, exclusive=True, group="whatif-curves")
    def _compute_curves(self, data: JobData) -> None:
        """The what-if curves of the job (:func:`tracekit.views.figures.whatif_curves`), off the UI thread."""
        from tracekit.views.figures import Cancelled, whatif_curves

        assert data.analysis is not None
        worker = get_current_worker()
        try:
            curves = whatif_curves(data.analysis.whatif, data.bottleneck, cancelled=lambda: worker.is_cancelled)
        except Cancelled:
            return
        if not worker.is_cancelled:
            self.app.call_from_thread(self._show_curves, curves, id(data.analysis))

    def inputs(self) -> Inputs:
        """The inputs as they are typed now."""
        return Inputs(rate=self.query_one("#wi-rate", Input).value,
                      compression=self.query_one("#wi-compression", Input).value,
                      workers=self.query_one("#wi-workers", Input).value,
                      efficiency="full" if self.query_one("#wi-full", RadioButton).value else "measured")

    def _changed(self, at_once: bool = False) -> None:
        """Inputs changed: show a mistake now, predict after a pause in the typing."""
        data = self._data
        if data is None or data.analysis is None:
            return
        self._asked += 1
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        try:
            sc = scenario(self.inputs(), data.analysis.line_rate_bps)
        except ValueError as exc:
            self._say_error(as_flags(str(exc)))
            self._show(None)
            self._answered = self._asked
            return
        self._say_error(None)
        asked = self._asked
        if at_once:
            self._predict(sc, asked)
        else:
            self._timer = self.set_timer(DEBOUNCE_S, lambda: self._predict(sc, asked))

    @work(thread=True, exclusive=True, group="whatif")
    def _predict(self, sc: Scenario, asked: int) -> None:
        data = self._data
        assert data is not None and data.analysis is not None
        worker = get_current_worker()
        model = data.analysis.whatif
        free = data.bottleneck.free_ns if data.bottleneck is not None else None
        if free is None:
            from tracekit.analysis.graph.whatif import Scenario, predict

            free = predict(model, Scenario(free=True))
        try:
            unc = data.analysis.__dict__.get("uncertainty")  # found with the verdict, by the loading worker
            result = predict_all(model, sc, free, data.analysis.line_rate_bps,
                                 cancelled=lambda: worker.is_cancelled or asked != self._asked, uncertainty=unc)
        except ValueError as exc:  # a scenario tracekit.analysis.graph.whatif refuses
            self.app.call_from_thread(self._refused, as_flags(str(exc)), asked)
            return
        if result is not None and not worker.is_cancelled:
            self.app.call_from_thread(self._answer, result, asked)

    def _refused(self, message: str, asked: int) -> None:
        if asked == self._asked:
            self._say_error(message)
            self._show(None)
            self._answered = asked

    def _answer(self, result: Prediction, asked: int) -> None:
        if asked != self._asked:
            return  # the inputs changed meanwhile; their own prediction follows
        self._show(result)
        self._answered = asked

    # ----------------------------------------------------------------- display

    def _say_error(self, message: str | None) -> None:
        """Show what is wrong with the inputs right under them (or nothing)."""
        self.error = message
        box = self.query_one("#wi-error", Static)
        box.update(Text(f"✗ {message}", style="bold red") if message else "")
        box.display = message is not None

    def _show(self, p: Prediction | None) -> None:
        from tracekit.model.units import format_rate

        self.prediction = p
        pred = self.query_one("#wi-prediction", Static)
        sweep = self.query_one("#wi-sweep", Static)
        if p is None:
            pred.update(Text("fix the inputs above to predict", style="dim"))
            sweep.update("")
            return
        sc = p.scenario
        table = Table(box=None, show_header=False, pad_edge=False)
        table.add_column("what", style="bold", no_wrap=True)
        table.add_column("value", justify="right", no_wrap=True)
        table.add_column("note", style="dim")
        table.add_row("iteration time", Text(p.range.text() if p.range else fmt_ns(p.iteration_ns), style="bold"),
                      f"measured {fmt_ns(p.measured_ns)}, replayed as measured {fmt_ns(p.replayed_ns)}; with free "
                      f"communication {fmt_ns(p.free_ns)}")
        if p.range is not None and p.range.sources:
            from tracekit.analysis.ranges import sources_text

            table.add_row("range", "", f"9 times in 10 the truth; made of {sources_text(p.range.sources)}")
        table.add_row("speed-up", Text(f"{p.speedup:.2f}x", style="bold green" if p.speedup > 1.005 else
                                       "bold red" if p.speedup < 0.995 else "bold"), "replayed as measured / predicted")
        sf = p.scaling(p.iteration_ns)
        table.add_row("scaling factor", Text(f"{sf:.2f}", style="bold green" if sf >= 0.9 else "bold yellow"),
                      "free communication / predicted (1.00: communication costs nothing)")
        rate = format_rate(sc.bandwidth_bps) if sc.bandwidth_bps else "the job's own link"
        workers = sc.workers or (self._data.analysis.whatif.workers if self._data and self._data.analysis else "?")
        table.add_row("scenario", "", f"{rate} · {sc.compression:g}x compression · {workers} workers · "
                                      f"{sc.efficiency} efficiency")
        pred.update(table)
        if not p.sweep:
            sweep.update(Text("a sweep of line rates needs one: type a line rate, or start tracekit inspect with "
                              "--link-bw (the rate the job ran on)", style="dim"))
            return
        st = Table(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False, show_edge=False)
        for col in ("line rate", "×", "iteration", "speed-up", "scaling"):
            st.add_column(col, justify="right")
        for (r, t), m in zip(p.sweep, SWEEP, strict=True):
            style = "bold reverse" if m == 1.0 else ""
            st.add_row(format_rate(r), f"{m:g}", fmt_ns(t), f"{p.replayed_ns / t:.2f}x" if t else "–",
                       f"{p.scaling(t):.2f}", style=style)
        sweep.update(st)

    def _show_curves(self, curves: Curves, for_analysis: int) -> None:
        if for_analysis != self._curves_for:
            return  # another job's data arrived meanwhile; its own curves follow
        self.curves = curves
        self._curves_pending = False
        rate = curves.by_rate
        if rate.height and not rate.get_column("bandwidth_bps").is_nan().any():
            point = (curves.line_rate_bps, curves.measured_scaling) if curves.line_rate_bps else None
            draw_curve(self.query_one("#wi-curve-rate", PlotextPlot), rate, "bandwidth_bps", point, curves.target,
                       rate_tick)
        elif rate.height:
            draw_curve(self.query_one("#wi-curve-rate", PlotextPlot), rate, "scale", (1.0, curves.measured_scaling),
                       curves.target, lambda m: f"{m:g}x")
        else:
            self._plot_message(_why(curves, "line-rate"), "rate")
        if curves.by_compression.height:
            draw_curve(self.query_one("#wi-curve-compression", PlotextPlot), curves.by_compression, "compression",
                       (1.0, curves.measured_scaling), curves.target, lambda c: f"{c:g}x")
        else:
            self._plot_message(_why(curves, "compression"), "compression")

    def _plot_message(self, message: str, which: str | None = None) -> None:
        """An empty plot titled ``message`` (both plots, or the ``rate`` / ``compression`` one)."""
        for name in ("rate", "compression") if which is None else (which,):
            plot = self.query_one(f"#wi-curve-{name}", PlotextPlot)
            self.query_one(f"#wi-curve-{name}-box").border_subtitle = ""
            plot.plt.clear_figure()
            plot.plt.title(message)
            plot.refresh()

    # ----------------------------------------------------------------- input events

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self._changed()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.focus()

    def on_radio_set_changed(self, event: RadioSet.Changed) -> None:
        event.stop()
        self._changed()

    def action_edit(self, which: str) -> None:
        self.query_one(f"#wi-{which}", Input).focus()

    def action_leave_input(self) -> None:
        self.focus()

    def action_toggle_efficiency(self) -> None:
        full = self.query_one("#wi-full", RadioButton)
        target = self.query_one("#wi-measured", RadioButton) if full.value else full
        target.value = True


def _why(curves: Curves, which: str) -> str:
    """Why the ``which`` curve has no point."""
    note = next((n for n in curves.notes if n.startswith(f"no {which} curve")), None)
    return note or f"no {which} curve"


def rate_tick(bps: float) -> str:
    """A line rate as a short axis label: ``500M``, ``4G``."""
    from tracekit.model.units import format_rate

    return format_rate(bps).replace(" ", "").replace("bit/s", "")


def legend(df: pl.DataFrame, point: tuple[float, float] | None, target: float) -> str:
    """The key of a curve plot (markup for its card's subtitle: a legend inside would hide the curves)."""
    effs = set(df.get_column("efficiency").to_list())
    parts = [f"[rgb{CURVE_COLOURS[e]}]━━[/] {CURVE_LABELS[e]}" for e in CURVE_COLOURS if e in effs]
    if point is not None and point[0]:
        parts.append(f"[{POINT_COLOUR}]{POINT_MARKER}[/] now {point[1]:.2f}")
    parts.append(f"[rgb{TARGET_COLOUR}]──[/] target {target:g}")
    return "  ".join(parts)


def draw_curve(plot: PlotextPlot, df: pl.DataFrame, x: str, point: tuple[float, float] | None, target: float,
               tick: Any) -> None:
    """Plot ``scaling_factor`` against ``x`` (log scale) per efficiency, the target and the measured point —
    the rows of one of :class:`tracekit.views.figures.Curves`' tables, drawn as they are; the key goes to the
    subtitle of the plot's parent card."""
    if plot.parent is not None:
        plot.parent.border_subtitle = legend(df, point, target)
    plt = plot.plt
    plt.clear_figure()
    xs_all = sorted(set(df.get_column(x).to_list()))
    for eff, colour in CURVE_COLOURS.items():
        part = df.filter(df.get_column("efficiency") == eff)
        if part.height:
            plt.plot([math.log10(v) for v in part.get_column(x).to_list()], part.get_column("scaling_factor").to_list(),
                     marker="hd", color=colour)
    plt.hline(target, TARGET_COLOUR)
    if point is not None and point[0]:
        plt.scatter([math.log10(point[0])], [point[1]], marker=POINT_MARKER, color=POINT_COLOUR)
    shown = xs_all[::2] if len(xs_all) > 8 else xs_all  # every other tick when they would crowd
    plt.xticks([math.log10(v) for v in shown], [tick(v) for v in shown])
    plt.ylim(0, 1.05)
    plt.yticks([0, 0.25, 0.5, 0.75, target, 1.0], ["0", ".25", ".5", ".75", f"{target:g}", "1"])
    plot.refresh()
