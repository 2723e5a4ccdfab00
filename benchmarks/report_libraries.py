"""Which plotting library for ``tracekit report``: the same three charts of the bundled sample (the per-rank
stacked breakdown, the link heat map, the what-if curves on log axes) as one self-contained HTML page each with
plotly (``include_plotlyjs=True``) and with altair / Vega-Lite (``inline=True``, the Vega bundle from
vl-convert-python), then the file size and the time a headless Chromium takes from navigation to every chart
drawn (median of ``--repeat`` loads, a fresh tab each).

    pip install plotly altair vl-convert-python   # plotly only for this comparison
    python benchmarks/report_libraries.py [--repeat 7]

Build times include importing the library and, for altair, vl-convert-python making its JavaScript bundle
(~2 s, once per process).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import headless  # noqa: E402
from tracekit.analysis.pipeline import analyse  # noqa: E402
from tracekit.loading import traceset  # noqa: E402
from tracekit.views import figures  # noqa: E402


def plotly_figures(data: figures.ReportData) -> list:
    """The three charts as plotly figures (what tracekit drew with plotly before choosing Vega-Lite)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    rb = data.rank_breakdown
    bars = go.Figure()
    for cls, colour in figures.CLASS_COLOURS.items():
        part = rb.filter(rb.get_column("cls") == cls)
        bars.add_trace(go.Bar(y=[f"rank {r}" for r in part.get_column("rank").to_list()],
                              x=(part.get_column("share") * 100).to_list(), name=cls, orientation="h",
                              marker_color=colour))
    bars.update_layout(barmode="stack", height=180, template="plotly_white")
    la = data.link_activity
    ranks = sorted(set(la.get_column("rank").to_list()))
    first = la.filter(la.get_column("rank") == ranks[0])
    heat = go.Figure(go.Heatmap(z=[(la.filter(la.get_column("rank") == r).get_column("busy_share") * 100).to_list()
                                   for r in ranks],
                                x=((first.get_column("start_ns") + first.get_column("end_ns")) / 2e6).to_list(),
                                y=[f"rank {r}" for r in ranks], zmin=0, zmax=100,
                                colorscale=[[0, "#f4f4f4"], [1, figures.COMM_COLOUR]]))
    heat.update_layout(height=200, template="plotly_white")
    cv = data.curves
    assert cv is not None
    curves = make_subplots(rows=1, cols=2)
    for eff in ("measured", "full"):
        part = cv.by_rate.filter(cv.by_rate.get_column("efficiency") == eff)
        curves.add_trace(go.Scatter(x=(part.get_column("bandwidth_bps") / 1e9).to_list(),
                                    y=part.get_column("scaling_factor").to_list(), mode="lines+markers", name=eff),
                         row=1, col=1)
        part = cv.by_compression.filter(cv.by_compression.get_column("efficiency") == eff)
        curves.add_trace(go.Scatter(x=part.get_column("compression").to_list(),
                                    y=part.get_column("scaling_factor").to_list(), mode="lines+markers", name=eff),
                         row=1, col=2)
    curves.add_trace(go.Scatter(x=[(cv.line_rate_bps or 1) / 1e9], y=[cv.measured_scaling], mode="markers",
                                marker={"symbol": "star", "size": 14}), row=1, col=1)
    curves.update_xaxes(type="log")
    curves.update_layout(height=400, template="plotly_white")
    return [bars, heat, curves]


def plotly_page(data: figures.ReportData) -> str:
    """Three charts with plotly, its JavaScript inline once."""
    import plotly.io as pio

    divs = [f'<div class="chart">{pio.to_html(fig, full_html=False, include_plotlyjs=i == 0)}</div>'
            for i, fig in enumerate(plotly_figures(data))]
    return "<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>" + "".join(divs) + "</body></html>"


def altair_page(data: figures.ReportData) -> str:
    """The same three charts with altair (Vega-Lite), the Vega JavaScript inline once."""
    import altair as alt
    import polars as pl

    rb = data.rank_breakdown.with_columns((pl.col("share") * 100).alias("pct"),
                                          pl.concat_str(pl.lit("rank "), pl.col("rank").cast(pl.String)).alias("r"))
    colours = alt.Scale(domain=list(figures.CLASS_COLOURS), range=list(figures.CLASS_COLOURS.values()))
    bars = alt.Chart(rb).mark_bar().encode(
        y="r:N", x=alt.X("pct:Q", stack="zero"), color=alt.Color("cls:N", scale=colours),
        tooltip=["cls", "pct", "ns"]).properties(width=1000, height=100)
    la = data.link_activity.with_columns((pl.col("start_ns") / 1e6).alias("ms"),
                                         (pl.col("busy_share") * 100).alias("busy"))
    heat = alt.Chart(la).mark_rect().encode(
        x=alt.X("bin:O", axis=None), y="rank:N",
        color=alt.Color("busy:Q", scale=alt.Scale(range=["#f4f4f4", figures.COMM_COLOUR])),
        tooltip=["ms", "busy"]).properties(width=1000, height=80)
    cv = data.curves
    assert cv is not None
    rate = cv.by_rate.with_columns((pl.col("bandwidth_bps") / 1e9).alias("gbit"))
    comp = cv.by_compression
    lines = alt.Chart(rate).mark_line(point=True).encode(
        x=alt.X("gbit:Q", scale=alt.Scale(type="log")), y="scaling_factor:Q", color="efficiency:N",
        tooltip=["gbit", "scaling_factor"]).properties(width=480, height=300)
    star = alt.Chart(pl.DataFrame({"gbit": [cv.line_rate_bps / 1e9], "sf": [cv.measured_scaling]})) \
        .mark_point(shape="diamond", size=200, color="black").encode(x="gbit:Q", y="sf:Q")
    comp_lines = alt.Chart(comp).mark_line(point=True).encode(
        x=alt.X("compression:Q", scale=alt.Scale(type="log")), y="scaling_factor:Q", color="efficiency:N",
        tooltip=["compression", "scaling_factor"]).properties(width=480, height=300)
    specs = [bars, heat, alt.hconcat(lines + star, comp_lines)]
    import json

    import vl_convert as vlc

    js = vlc.javascript_bundle()
    divs, calls = [], []
    for i, chart in enumerate(specs):
        divs.append(f'<div class="chart" id="c{i}"></div>')
        calls.append(f"vegaEmbed('#c{i}', {json.dumps(chart.to_dict())}, {{renderer: 'svg', actions: false}});")
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>" + "".join(divs)
            + f"<script type='module'>{js}\n{''.join(calls)}</script></body></html>")


DRAWN = {"plotly": "document.querySelectorAll('.chart .main-svg').length >= 3",
         "altair": "[...document.querySelectorAll('.chart')].every(c => c.querySelector('svg'))"}


def measure(path: Path, ready: str, repeat: int) -> tuple[list[float], list[str]]:
    """Seconds from navigation to every chart drawn, per load (a fresh tab each), and the errors seen."""
    times, errors = [], []
    with headless.Chromium() as browser:
        for _ in range(repeat):
            page = browser.open("about:blank")
            t0 = time.perf_counter()
            page.navigate(path.as_uri())
            page.wait_for(ready, timeout=60)
            times.append(time.perf_counter() - t0)
            errors += page.errors
    return times, errors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    data = figures.collect(analyse(traceset.load([str(ROOT / "samples" / "ddp-gloo")]), link_bw_bps=500e6))
    out = Path(tempfile.mkdtemp(prefix="tracekit-libs-"))
    for name, build in (("plotly", plotly_page), ("altair", altair_page)):
        t0 = time.perf_counter()
        text = build(data)
        build_s = time.perf_counter() - t0
        path = out / f"{name}.html"
        path.write_text(text)
        times, errors = measure(path, DRAWN[name], args.repeat)
        print(f"{name}: {path.stat().st_size / 1e6:.2f} MB, built in {build_s:.2f} s; navigation → 3 charts drawn: "
              f"median {1000 * statistics.median(times):.0f} ms (min {1000 * min(times):.0f}, max "
              f"{1000 * max(times):.0f}, {len(times)} loads); errors: {errors or 'none'}")


if __name__ == "__main__":
    main()
