"""``tracekit report``: one self-contained HTML file (Vega's JavaScript inline, no external resource), written
atomically, never over an existing file without ``--force``, every mistake one line; and the same report in a
real headless Chromium (Debian's ``chromium``): no console error, no network request, every chart drawn."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests import headless
from tracekit.analysis.pipeline import analyse
from tracekit.cli import main
from tracekit.loading import traceset
from tracekit.views import figures, html_report

pytest.importorskip("altair")
pytest.importorskip("vl_convert")

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "ddp-gloo"
CHARTS = [sid for sid, *_ in html_report.SECTIONS]


@pytest.fixture(scope="module")
def data() -> figures.ReportData:
    return figures.collect(analyse(traceset.load([str(SAMPLE)]), link_bw_bps=500e6))


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample's report, written by the command."""
    out = tmp_path_factory.mktemp("report") / "report.html"
    assert main(["report", str(SAMPLE), "--link-bw", "500mbit", "-o", str(out), "-q"]) == 0
    return out


def test_the_report_is_self_contained(report: Path) -> None:
    text = report.read_text()
    assert text.startswith("<!DOCTYPE html>")
    assert re.findall(r'data-chart="([^"]+)"', text) == CHARTS
    # the Vega bundle once, inline; nothing loaded from elsewhere, no address outside the bundle itself
    scripts = [(m.start(), m.end()) for m in re.finditer(r"<script.*?</script>", text, re.S)]
    bundle = max(scripts, key=lambda se: se[1] - se[0])
    assert text.count("window.vegaEmbed=") == 1 and "window.vegaEmbed=" in text[bundle[0]:bundle[1]]
    rest = text[:bundle[0]] + text[bundle[1]:]
    assert not re.search(r"<script[^>]+src=", text) and not re.search(r"<link[^>]+href=", text)
    assert not re.search(r"https?://", rest)
    assert 500_000 < report.stat().st_size < 2_000_000  # the bundle is most of it


def test_the_report_says_the_verdict(report: Path, data: figures.ReportData) -> None:
    import html

    text = html.unescape(report.read_text())
    assert data.verdicts["headline"] and data.verdicts["headline"] in text
    assert data.verdicts["answer"] and data.verdicts["answer"] in text
    assert "Link-bound" in text and "Communication-bound" not in text
    assert data.verdicts["paragraph"] and data.verdicts["paragraph"] in text
    assert "500 Mbit/s" in text and "samples/ddp-gloo" in text


def _layers(spec: dict) -> list[dict]:
    """Every single view of a (layered, concatenated) Vega-Lite specification."""
    out = []
    for key in ("layer", "hconcat", "vconcat"):
        for sub in spec.get(key, []):
            out += _layers(sub)
    return out or [spec]


def test_every_chart_draws_the_figures(data: figures.ReportData) -> None:
    spec = html_report.breakdown_chart(data).to_dict()  # type: ignore[union-attr]
    scale = spec["encoding"]["color"]["scale"]
    assert scale["domain"] == ["compute", "overlapped", "exposed comm", "memory", "idle"]
    assert scale["range"] == list(figures.CLASS_COLOURS.values())  # tracekit's colours
    rows = spec["datasets"][spec["data"]["name"]]
    assert len(rows) == 10 and sum(r["pct"] for r in rows if r["rank"] == "rank 0") == pytest.approx(100)
    spec = html_report.iteration_chart(data).to_dict()  # type: ignore[union-attr]
    assert len(spec["datasets"][spec["data"]["name"]]) == 10
    spec = html_report.link_chart(data).to_dict()  # type: ignore[union-attr]
    assert len(spec["datasets"][spec["data"]["name"]]) == 2 * figures.LINK_BINS
    spec = html_report.collectives_chart(data).to_dict()  # type: ignore[union-attr]
    rule = [v for v in _layers(spec) if v["mark"]["type"] == "rule"]
    assert [spec["datasets"][v["data"]["name"]][0]["rate"] for v in rule] == [500.0]  # the line rate, Mbit/s
    spec = html_report.whatif_chart(data).to_dict()  # type: ignore[union-attr]
    assert len(spec["hconcat"]) == 2
    stars = [v for v in _layers(spec) if v["mark"]["type"] == "point"]
    points = [spec["datasets"][v["data"]["name"]][0] for v in stars]
    cv = data.curves
    assert cv is not None
    label = f"measured: {cv.measured_scaling:.2f}"
    assert points == [{"x": 0.5, "y": pytest.approx(cv.measured_scaling), "what": label},  # at 500 Mbit/s
                      {"x": 1.0, "y": pytest.approx(cv.measured_scaling), "what": label}]  # no compression
    lines = [v for v in _layers(spec) if v["mark"]["type"] == "line"]
    assert [len(spec["datasets"][v["data"]["name"]]) for v in lines] == [22, 20]  # 2 efficiencies x 11 rates, x 10


def test_never_overwrites_without_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.html"
    out.write_text("mine")
    assert main(["report", str(SAMPLE), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already exists (use --force" in err
    assert out.read_text() == "mine"
    assert main(["report", str(SAMPLE), "-o", str(out), "--force", "-q"]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]  # no temporary file left


def test_the_javascript_bundle_is_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import vl_convert

    first = html_report.javascript(tmp_path)
    [kept] = (tmp_path / "report").iterdir()
    assert kept.read_text() == first and html_report.BUNDLE_MARK in first

    def never(**_: object) -> str:
        raise AssertionError("made again")

    monkeypatch.setattr(vl_convert, "javascript_bundle", never)
    assert html_report.javascript(tmp_path) == first  # read back
    kept.write_text(first[: len(first) // 3])  # a damaged one is made again
    monkeypatch.undo()
    assert html_report.javascript(tmp_path) == first and kept.read_text() == first


def test_a_failed_write_leaves_the_old_file(tmp_path: Path, data: figures.ReportData,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "r.html"
    out.write_text("old")

    def boom(*_: object) -> str:
        raise OSError("disk full")

    monkeypatch.setattr(html_report, "render", boom)
    with pytest.raises(OSError):
        html_report.write(data, out, force=True)
    assert out.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["r.html"]


@pytest.mark.parametrize(("args", "words"), [
    ([], "say where to write the report: -o report.html"),
    (["-o", "/nonexistent-dir/r.html"], "no directory"),
    (["-o", "{tmp}"], "is a directory"),
])
def test_mistakes_are_one_line(args: list[str], words: str, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    code = main(["report", str(SAMPLE), *args, *(["--force"] if str(tmp_path) in args else [])])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and words in err, err


def test_without_plotly_it_says_how_to_install(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(html_report, "available", lambda: False)
    assert main(["report", str(SAMPLE), "-o", str(tmp_path / "r.html")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'tracekit[report]'" in err
    assert not (tmp_path / "r.html").exists()


@pytest.fixture(scope="module")
def no_rate_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample's report without --link-bw."""
    out = tmp_path_factory.mktemp("report") / "no-rate.html"
    assert main(["report", str(SAMPLE), "-o", str(out), "-q"]) == 0
    return out


def test_a_job_without_line_rate_still_reports(no_rate_report: Path) -> None:
    text = no_rate_report.read_text()
    assert re.findall(r'data-chart="([^"]+)"', text) == CHARTS
    assert "unknown (give --link-bw)" in text
    assert "the rate curve assumes full utilisation of each rate" in text  # the note under the what-if


# ----------------------------------------------------------------------------- in a real browser

CHART_DRAWN = """(() => [...document.querySelectorAll('div.chart')].map(c => ({
  id: c.dataset.chart,
  svg: c.querySelectorAll('svg.marks').length,
  marks: c.querySelectorAll('.mark-rect path, .mark-symbol path, .mark-line path, .mark-rule line').length,
  width: c.querySelector('svg.marks') ? c.querySelector('svg.marks').getBoundingClientRect().width : 0,
})))()"""


def test_the_report_renders_in_headless_chromium(report: Path, no_rate_report: Path) -> None:
    if headless.executable() is None:
        if os.environ.get("TRACEKIT_REQUIRE_BROWSER"):  # .ci/run installed it: its absence is a failure
            pytest.fail("chromium is required (TRACEKIT_REQUIRE_BROWSER) but not installed")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    with headless.Chromium() as browser:
        for path in (report, no_rate_report):
            page = browser.open(path.as_uri(), width=1280, height=1000)
            n = len(CHARTS)
            page.wait_for(f"document.body.dataset.charts === '{n}'")
            page.settle(0.5)
            drawn = page.evaluate(CHART_DRAWN)
            assert [c["id"] for c in drawn] == CHARTS
            for chart in drawn:
                assert chart["svg"] >= 1 and chart["marks"] >= 1 and chart["width"] > 600, chart
            assert page.evaluate("typeof vegaEmbed") == "function"
            assert "is the network the bottleneck" in page.evaluate("document.body.innerText").lower()
            assert page.errors == [], page.errors
            outside = [u for u in page.requests if not u.startswith(("file:", "data:", "blob:", "about:"))]
            assert outside == [], outside
