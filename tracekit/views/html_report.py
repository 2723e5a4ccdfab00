"""The HTML report of ``tracekit report``: one self-contained file — the figures of :mod:`tracekit.views.figures` as
Vega-Lite charts (built with altair), with the Vega, Vega-Lite and vega-embed JavaScript embedded inline once
(the bundle vl-convert-python ships), so the page needs no network and no server.

Only drawing happens here: every number comes from :class:`tracekit.views.figures.ReportData`. altair and
vl-convert-python are optional dependencies (``pip install 'tracekit[report]'``); :func:`available` says whether
they are installed. (Chosen over plotly by measurement, ``benchmarks/report_libraries.py``: the same charts of the
sample in a 0.97 MB page drawn in ~0.6 s by headless Chromium, against 4.85 MB and ~1.8 s.)
"""

from __future__ import annotations

import contextlib
import html
import importlib.metadata
import importlib.util
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from tracekit.loading.atomic import atomic_write
from tracekit.model.diagnostics import TraceError
from tracekit.model.schema import CLASSES
from tracekit.views.figures import CLASS_COLOURS, COMM_COLOUR, PATH_COLOURS, ReportData
from tracekit.views.report import CLASS_LABELS

if TYPE_CHECKING:
    import altair as alt

#: how to get the plotting libraries, for the message when they are missing
INSTALL_HINT = "pip install 'tracekit[report]' (or pip install altair vl-convert-python)"
#: more ranks than this: the iteration-time chart shows their spread per iteration instead of one line each
MAX_RANK_LINES = 16
#: width of a chart, and of each of two side by side (CSS pixels)
WIDTH, HALF = 1000, 440
FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif"
PATH_LABELS = {"compute": "compute", "memory": "memory", "transfer": "transfer", "CPU": "CPU", "launch": "launch",
               "idle": "idle", "waiting": "waiting on a rank"}
EFFICIENCY_LABELS = {"measured": "link used as measured", "full": "link used at full rate"}
EFFICIENCY_COLOURS = {"measured": "#d62728", "full": "#1f77b4"}
#: the measured point's mark: a five-pointed star (an SVG path in a unit square)
STAR = ("M0,-1L0.225,-0.31L0.95,-0.31L0.36,0.12L0.59,0.81L0,0.38L-0.59,0.81L-0.36,0.12L-0.95,-0.31L-0.225,-0.31Z")
#: what every whole Vega bundle defines (a cached one without it is made again)
BUNDLE_MARK = "window.vegaEmbed="
#: vega-embed's options: SVG (crisp, countable), export menu only (no link to the online editor)
EMBED_OPTIONS = {"renderer": "svg", "actions": {"export": True, "source": False, "compiled": False, "editor": False}}


def available() -> bool:
    """Whether altair and vl-convert-python are installed."""
    return all(importlib.util.find_spec(m) is not None for m in ("altair", "vl_convert"))


def _frame(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` fit for JSON: NaN becomes null (JSON has no NaN)."""
    return df.with_columns(pl.col(c).fill_nan(None) for c, t in df.schema.items() if t.is_float())


def _rank_label(col: str = "rank") -> pl.Expr:
    return pl.concat_str(pl.lit("rank "), pl.col(col).cast(pl.String))


def breakdown_chart(data: ReportData) -> alt.TopLevelMixin | None:
    """Per rank, one bar stacked from the five attribution classes (share of its iteration time)."""
    import altair as alt

    rb = data.rank_breakdown
    if rb.height == 0:
        return None
    order = {c: i for i, c in enumerate(CLASSES)}
    df = rb.select(_rank_label().alias("rank"), pl.col("rank").alias("r"), "label",
                   (pl.col("share") * 100).alias("pct"), (pl.col("ns") / 1e6).alias("ms"),
                   pl.col("cls").replace_strict(order, return_dtype=pl.Int32).alias("o"))
    n = df.get_column("r").n_unique()
    colours = alt.Scale(domain=[CLASS_LABELS[c] for c in CLASSES], range=[CLASS_COLOURS[c] for c in CLASSES])
    return alt.Chart(_frame(df)).mark_bar().encode(
        y=alt.Y("rank:N", sort=alt.SortField("r"), title=None),
        x=alt.X("pct:Q", stack="zero", title="share of the rank's iteration time (%)",
                scale=alt.Scale(domain=[0, 100])),
        color=alt.Color("label:N", scale=colours, title=None, sort=[CLASS_LABELS[c] for c in CLASSES],
                        legend=alt.Legend(orient="bottom")),
        order=alt.Order("o:Q"),
        tooltip=[alt.Tooltip("rank:N"), alt.Tooltip("label:N", title="class"),
                 alt.Tooltip("pct:Q", title="%", format=".1f"), alt.Tooltip("ms:Q", title="ms", format=".1f")],
    ).properties(width=WIDTH, height=min(28 * n, 900))


def iteration_chart(data: ReportData) -> alt.TopLevelMixin | None:
    """Iteration times per rank: one line each, or their spread per iteration when there are many ranks."""
    import altair as alt

    it = data.iteration_times
    if it.height == 0:
        return None
    df = it.select(_rank_label().alias("rank"), "iteration", (pl.col("wall_ns") / 1e6).alias("ms"))
    x = alt.X("iteration:O", title="iteration", axis=alt.Axis(labelAngle=0))
    y = alt.Y("ms:Q", title="iteration time (ms)", scale=alt.Scale(zero=True))
    if it.get_column("rank").n_unique() > MAX_RANK_LINES:
        chart = alt.Chart(_frame(df)).mark_boxplot(color=CLASS_COLOURS["compute"]).encode(x=x, y=y)
    else:
        chart = alt.Chart(_frame(df)).mark_line(point=True).encode(
            x=x, y=y, color=alt.Color("rank:N", title=None, legend=alt.Legend(orient="bottom")),
            tooltip=["rank:N", "iteration:O", alt.Tooltip("ms:Q", format=".1f")])
    return chart.properties(width=WIDTH, height=280)


def link_chart(data: ReportData) -> alt.TopLevelMixin | None:
    """How busy each rank's link was over time: a heat map of time bins × ranks."""
    import altair as alt

    la = data.link_activity
    if la.height == 0:
        return None
    df = la.select(_rank_label().alias("rank"), pl.col("rank").alias("r"), (pl.col("start_ns") / 1e6).alias("t0"),
                   (pl.col("end_ns") / 1e6).alias("t1"), (pl.col("busy_share") * 100).alias("busy"))
    n = df.get_column("r").n_unique()
    return alt.Chart(_frame(df)).mark_rect(strokeWidth=0).encode(
        x=alt.X("t0:Q", title="time since the first iteration started (ms)"), x2="t1:Q",
        y=alt.Y("rank:N", sort=alt.SortField("r"), title=None),
        color=alt.Color("busy:Q", title="link busy %",
                        scale=alt.Scale(domain=[0, 100], range=["#f4f4f4", COMM_COLOUR])),
        tooltip=[alt.Tooltip("rank:N"), alt.Tooltip("t0:Q", title="from ms", format=".1f"),
                 alt.Tooltip("t1:Q", title="to ms", format=".1f"), alt.Tooltip("busy:Q", title="busy %", format=".0f")],
    ).properties(width=WIDTH, height=min(max(30 * n, 60), 900))


def path_chart(data: ReportData) -> alt.TopLevelMixin | None:
    """Per iteration, its critical path stacked by what it was spent on."""
    import altair as alt

    pc = data.path_composition
    if pc.height == 0:
        return None
    order = {lab: i for i, lab in enumerate(PATH_LABELS)}
    used = pc.group_by("label").agg(pl.col("ns").sum()).filter(pl.col("ns") > 0).get_column("label").to_list()
    labels = [lab for lab in PATH_LABELS if lab in used]
    df = pc.filter(pl.col("label").is_in(labels)).select(
        "iteration", pl.col("label").replace_strict(PATH_LABELS, return_dtype=pl.String).alias("what"),
        (pl.col("ns") / 1e6).alias("ms"), (pl.col("share") * 100).alias("pct"),
        pl.col("label").replace_strict(order, return_dtype=pl.Int32).alias("o"))
    colours = alt.Scale(domain=[PATH_LABELS[lab] for lab in labels], range=[PATH_COLOURS[lab] for lab in labels])
    return alt.Chart(_frame(df)).mark_bar().encode(
        x=alt.X("iteration:O", title="iteration", axis=alt.Axis(labelAngle=0)),
        y=alt.Y("ms:Q", stack="zero", title="critical path (ms) = iteration time"),
        color=alt.Color("what:N", scale=colours, title=None, sort=[PATH_LABELS[lab] for lab in labels],
                        legend=alt.Legend(orient="bottom")),
        order=alt.Order("o:Q"),
        tooltip=["iteration:O", "what:N", alt.Tooltip("ms:Q", format=".1f"), alt.Tooltip("pct:Q", title="%",
                                                                                        format=".1f")],
    ).properties(width=WIDTH, height=300)


def collectives_chart(data: ReportData) -> alt.TopLevelMixin | None:
    """Every collective instance over time: its arrival skew above, its bus bandwidth below."""
    import altair as alt

    c = data.collectives
    if c.height == 0:
        return None
    df = c.select("instance", "op", "iteration", (pl.col("t_ns") / 1e6).alias("t"),
                  (pl.col("skew_ns") / 1e6).alias("skew"), (pl.col("busbw_gbps") * 1000).alias("mbit"), "bytes",
                  pl.col("straggler_rank").alias("straggler"))
    base = alt.Chart(_frame(df)).mark_circle(size=45, opacity=0.85).encode(
        x=alt.X("t:Q", title="first arrival, since the first iteration started (ms)"),
        color=alt.Color("op:N", title="op", legend=alt.Legend(orient="bottom")),
        tooltip=["instance:Q", "op:N", "iteration:O", alt.Tooltip("t:Q", title="at ms", format=".1f"),
                 alt.Tooltip("skew:Q", title="skew ms", format=".2f"),
                 alt.Tooltip("mbit:Q", title="busbw Mbit/s", format=".0f"), "bytes:Q", "straggler:O"])
    skew = base.encode(y=alt.Y("skew:Q", title="arrival skew (ms)")).properties(width=WIDTH, height=200)
    bw = base.encode(y=alt.Y("mbit:Q", title="bus bandwidth (Mbit/s)", scale=alt.Scale(zero=True)))
    if data.line_rate_bps:
        from tracekit.model.units import format_rate

        line = alt.Chart(pl.DataFrame({"rate": [data.line_rate_bps / 1e6],
                                       "what": [f"line rate {format_rate(data.line_rate_bps)}"]}))
        rule = line.mark_rule(strokeDash=[6, 4], color="#555").encode(y="rate:Q", tooltip=["what:N"])
        text = line.mark_text(align="left", baseline="bottom", dx=4, dy=-2, color="#555").encode(
            y="rate:Q", x=alt.value(0), text="what:N")
        bw = alt.layer(bw, rule, text)
    return alt.vconcat(skew, bw.properties(width=WIDTH, height=200)).resolve_scale(x="shared")


def _curve(df: pl.DataFrame, x: str, title: str, panel: str, target: float, point: tuple[float, float] | None,
           label: str) -> alt.TopLevelMixin:
    """One what-if panel: scaling factor against ``x`` per efficiency, the target, and the measured point."""
    import altair as alt

    # one domain in every panel (a panel may lack a curve): no conflict between the panels' colour scales
    colours = alt.Scale(domain=list(EFFICIENCY_LABELS.values()), range=list(EFFICIENCY_COLOURS.values()))
    d = df.select(pl.col(x).alias("x"), pl.col("efficiency").replace_strict(EFFICIENCY_LABELS, return_dtype=pl.String)
                  .alias("link"), "scaling_factor", (pl.col("iteration_ns") / 1e6).alias("ms"))
    xs = alt.X("x:Q", title=title, scale=alt.Scale(type="log", nice=False, padding=12),
               axis=alt.Axis(values=df.get_column(x).unique().sort().to_list(), format="~g", grid=True))
    ys = alt.Y("scaling_factor:Q", title="scaling factor", scale=alt.Scale(domain=[0, 1.05]))
    lines = alt.Chart(_frame(d)).mark_line(point=True).encode(
        x=xs, y=ys, color=alt.Color("link:N", scale=colours, title=None, legend=alt.Legend(orient="bottom")),
        tooltip=[alt.Tooltip("x:Q", title=title, format=".3~g"), "link:N",
                 alt.Tooltip("scaling_factor:Q", title="scaling factor", format=".2f"),
                 alt.Tooltip("ms:Q", title="iteration ms", format=".1f")])
    goal = alt.Chart(pl.DataFrame({"y": [target]})).mark_rule(strokeDash=[2, 3], color="#2ca02c").encode(
        y="y:Q", tooltip=[alt.Tooltip("y:Q", title="target")])
    layers: list[Any] = [goal, lines]
    if point is not None:
        p = pl.DataFrame({"x": [point[0]], "y": [point[1]], "what": [label]})
        star = alt.Chart(p).mark_point(shape=STAR, size=260, filled=True, color="black").encode(
            x="x:Q", y="y:Q", tooltip=["what:N"])
        text = alt.Chart(p).mark_text(align="left", dx=10, dy=12, fontWeight="bold").encode(x="x:Q", y="y:Q",
                                                                                              text="what:N")
        layers += [star, text]
    return alt.layer(*layers).properties(width=HALF, height=300, title=panel)


def whatif_chart(data: ReportData) -> alt.TopLevelMixin | None:
    """Zhang et al.'s curves: scaling factor against the line rate (left) and the compression ratio (right), at
    the measured efficiency and at full utilisation, with the job as measured marked."""
    import altair as alt

    from tracekit.model.units import format_rate

    cv = data.curves
    if cv is None or cv.empty:
        return None
    label = f"measured: {cv.measured_scaling:.2f}"
    panels = []
    rate = cv.by_rate
    if rate.height:
        absolute = not rate.get_column("bandwidth_bps").is_nan().any()
        if absolute:
            rate = rate.with_columns((pl.col("bandwidth_bps") / 1e9).alias("gbit"))
            point = (cv.line_rate_bps / 1e9, cv.measured_scaling) if cv.line_rate_bps else None
            panels.append(_curve(rate, "gbit", "line rate (Gbit/s)", "against the line rate", cv.target, point,
                                 label))
        else:
            panels.append(_curve(rate, "scale", "line rate (× each link's)", "against the line rate", cv.target,
                                 (1.0, cv.measured_scaling), label))
    if cv.by_compression.height:
        at = f" (at {format_rate(cv.line_rate_bps)})" if cv.line_rate_bps else ""
        panels.append(_curve(cv.by_compression, "compression", "compression ratio", f"against compression{at}",
                             cv.target, (1.0, cv.measured_scaling), label))
    return alt.hconcat(*panels).resolve_scale(color="shared")


#: the report's sections: id, title, what the chart shows, the function that draws it
SECTIONS: tuple[tuple[str, str, str, Callable[[ReportData], Any]], ...] = (
    ("breakdown", "Where each rank's time went",
     "Every instant of every iteration of a rank is exactly one of compute, communication hidden under compute "
     "(overlapped), exposed communication, memory copies or idle; the five add up to the rank's time.",
     breakdown_chart),
    ("iterations", "Iteration times per rank",
     "The length of each iteration window of each rank (from its first activity to the next iteration's).",
     iteration_chart),
    ("links", "Link busy and idle over time",
     "The share of each time slice in which the rank's link moved data for a collective (transfer time; waiting "
     "for other ranks does not count); the rest of the slice the link was idle.", link_chart),
    ("critical-path", "Critical path of each iteration",
     "The chain of work across ranks that set each iteration's pace, by what it was spent on; its length is the "
     "iteration time. Communication hidden under compute never appears on it.", path_chart),
    ("collectives", "Collectives: arrival skew and bus bandwidth",
     "Each collective call matched across ranks: how much later the last member arrived than the first (skew), "
     "and the bus bandwidth it achieved once every member had arrived.", collectives_chart),
    ("whatif", "What-if: is the network the bottleneck?",
     "The job's dependency graph replayed with re-costed transfers (Zhang et al., NetAI 2020): the scaling factor "
     "(iteration time with free communication / predicted iteration time) against the line rate and against "
     "gradient compression (encode and decode costed), with the link used as efficiently as this job used it and "
     "at its full rate. The star is the job as measured; the dotted line the target.", whatif_chart),
)

CSS = """
body { font-family: %s; margin: 0 auto; max-width: 1140px; padding: 16px 28px 40px; color: #222; }
h1 { font-size: 1.45em; margin-bottom: 0.3em; word-break: break-all; }
h2 { font-size: 1.15em; margin: 1.6em 0 0.2em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
p.what { color: #555; margin: 0.2em 0 0.6em; max-width: 60em; }
table.facts { border-collapse: collapse; margin: 0.5em 0 1em; }
table.facts td { padding: 1px 14px 1px 0; vertical-align: top; }
table.facts td:first-child { color: #666; }
.verdict { border-left: 4px solid %s; background: #fafafa; padding: 8px 14px; margin: 0.6em 0; }
.verdict p { margin: 0.4em 0; }
.headline { font-weight: 600; }
.notes { color: #666; font-size: 0.92em; }
.missing { color: #888; font-style: italic; }
footer { color: #888; font-size: 0.85em; margin-top: 3em; }
"""

#: draws every chart once the Vega bundle has run: failures go to the console, the count to <body data-charts>
EMBED_JS = """
const ids = JSON.parse(document.getElementById('chart-ids').textContent);
const options = JSON.parse(document.getElementById('embed-options').textContent);
let drawn = 0;
for (const id of ids) {
  const spec = JSON.parse(document.getElementById('spec-' + id).textContent);
  window.vegaEmbed('#chart-' + id, spec, options)
    .then(() => { drawn += 1; document.body.dataset.charts = String(drawn); })
    .catch((e) => console.error('chart ' + id + ': ' + e));
}
"""


def _json_script(ident: str, value: Any) -> str:
    """``value`` as JSON in a ``<script type="application/json">`` (``</`` escaped: it cannot end the tag)."""
    text = json.dumps(value, separators=(",", ":"), allow_nan=False).replace("</", "<\\/").replace("<!--", "<\\!--")
    return f'<script type="application/json" id="{ident}">{text}</script>'


def _spec(chart: Any) -> dict[str, Any]:
    """The chart's Vega-Lite specification, with tracekit's font and no schema address (nothing to fetch)."""
    spec = chart.configure(font=FONT).configure_view(stroke=None).to_dict()
    spec.pop("$schema", None)
    return spec


def javascript(cache_dir: str | os.PathLike | None = None) -> str:
    """Vega, Vega-Lite and vega-embed in one script (vl-convert-python's bundle, for altair's Vega-Lite). Making it
    takes vl-convert ~2 s, so with ``cache_dir`` it is kept there (``report/``, named by the versions) and read back."""
    import altair as alt
    import vl_convert as vlc

    want = ".".join(alt.SCHEMA_VERSION.lstrip("v").split(".")[:2])
    version = want if want in vlc.get_vegalite_versions() else None
    cached = None
    if cache_dir is not None:
        tag = importlib.metadata.version("vl-convert-python")
        cached = Path(cache_dir) / "report" / f"vega-bundle-{tag}-vl{version or 'default'}.js"
        with contextlib.suppress(OSError, UnicodeDecodeError):
            text = cached.read_text(encoding="utf-8")
            if BUNDLE_MARK in text:  # a whole bundle (written atomically; never a torn one)
                return text
    text = vlc.javascript_bundle(vl_version=version)
    if cached is not None and BUNDLE_MARK in text:
        with contextlib.suppress(OSError):  # an unwritable cache only costs the time
            cached.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(cached, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return text


def render(data: ReportData, cache_dir: str | os.PathLike | None = None) -> str:
    """The whole report as one HTML document (the Vega JavaScript inline once, no external resource; its bundle
    kept in ``cache_dir`` when given: :func:`javascript`)."""
    from tracekit import __version__

    e = html.escape
    v = data.verdicts
    kind_colour = {"link-bound": CLASS_COLOURS["exposed_comm"], "straggler-bound": "#d98c00",
                   "input-bound": "#17a2b8", "host-bound": CLASS_COLOURS["idle"],
                   "compute-bound": CLASS_COLOURS["compute"], "mixed": "#9b59b6"}.get(v.get("kind") or "", "#888")
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{e(data.title)}</title>", f"<style>{CSS % (FONT, kind_colour)}</style></head><body>",
             f"<h1>{e(data.title)}</h1>", '<table class="facts">']
    parts += [f"<tr><td>{e(k)}</td><td>{e(val)}</td></tr>" for k, val in data.facts]
    parts.append("</table>")
    parts.append('<div class="verdict" id="verdict">')
    if v.get("headline"):
        parts.append(f'<p class="headline">{e(v["headline"] or "")}</p>')
    if v.get("answer"):
        parts.append(f'<p>{e(v["answer"] or "")}</p>')
    if v.get("paragraph"):
        parts.append(f"<p>{e(v['paragraph'] or '')}</p>")
    parts.append("</div>")
    if data.notes:
        parts.append(f'<p class="notes">{e("; ".join(data.notes))}</p>')
    ids: list[str] = []
    specs: list[str] = []
    for sid, title, what, draw in SECTIONS:
        parts.append(f'<section id="{sid}"><h2>{e(title)}</h2><p class="what">{e(what)}</p>')
        chart = draw(data)
        if chart is None:
            parts.append(f'<p class="missing">{e(_missing(sid, data))}</p></section>')
            continue
        ids.append(sid)
        specs.append(_json_script(f"spec-{sid}", _spec(chart)))
        parts.append(f'<div class="chart" id="chart-{sid}" data-chart="{sid}"></div>')
        if sid == "whatif" and data.curves is not None and data.curves.notes:
            parts.append(f'<p class="notes">{e("; ".join(data.curves.notes))}</p>')
        parts.append("</section>")
    parts.append(f'<footer>tracekit {e(__version__)} · {len(ids)} charts drawn with Vega-Lite, whose JavaScript is '
                 "embedded in this file: it needs no network.</footer>")
    parts += specs
    parts += [_json_script("chart-ids", ids), _json_script("embed-options", EMBED_OPTIONS)]
    if ids:
        parts.append(f'<script type="module">{javascript(cache_dir)}</script>')
        parts.append(f'<script type="module">{EMBED_JS}</script>')
    parts.append("</body></html>")
    return "\n".join(parts)


def _missing(section: str, data: ReportData) -> str:
    """Why a chart has nothing to show."""
    if section == "critical-path":
        return "No critical path: it needs profiler traces with activity in iterations."
    if section == "whatif":
        if data.curves is not None and data.curves.notes:
            return "No what-if curves: " + "; ".join(data.curves.notes)
        return "No what-if curves: the job has no communication to re-cost (or no profiler traces)."
    if section == "collectives":
        return "No collective matched across ranks."
    return "Nothing to show: no iteration with activity in the profiler traces."


def check_target(path: str | os.PathLike, force: bool = False) -> Path:
    """``path`` as the report's file, or a :class:`TraceError` saying why it cannot be (a directory, a file that
    exists without ``force``, a directory that does not exist)."""
    target = Path(path)
    if target.is_dir():
        raise TraceError(str(target), "is a directory; give a file name such as report.html")
    if target.exists() and not force:
        raise TraceError(str(target), "already exists (use --force to overwrite)")
    if not target.parent.exists():
        raise TraceError(str(target), f"no directory {str(target.parent)!r} to write into")
    return target


def write(data: ReportData, path: str | os.PathLike, *, force: bool = False,
          cache_dir: str | os.PathLike | None = None) -> int:
    """Write the report to ``path`` atomically (never over an existing file without ``force``); returns its
    size in bytes. ``cache_dir`` keeps the JavaScript bundle between runs (:func:`javascript`)."""
    target = check_target(path, force)
    text = render(data, cache_dir).encode("utf-8")

    def put(tmp: str) -> None:
        Path(tmp).write_bytes(text)
        os.chmod(tmp, 0o666 & ~_umask())  # a page to share, not a private temporary file

    atomic_write(target, put)
    return len(text)


def _umask() -> int:
    """The process's umask (read by setting it and back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
