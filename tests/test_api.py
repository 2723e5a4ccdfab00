"""The Python API (tracekit/api.py): tracekit.load → Job, its tables and methods give what the command line
prints; the documentation's worked example runs; ``import tracekit`` stays light."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tests import kineto_traces as kt
from tracekit.cli import main
from tracekit.model.diagnostics import TraceError

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "ddp-gloo"


@pytest.fixture(scope="module")
def job() -> tracekit.Job:
    return tracekit.load(SAMPLE, link_bw="500mbit", cache=False)


@pytest.fixture
def gpu(tmp_path: Path) -> Path:
    return kt.write_gpu_job(tmp_path / "gpu", [0, 3_700_000], straggler=1, late=800_000)


def test_import_is_light_and_names_are_lazy() -> None:
    code = ("import sys, tracekit; assert 'polars' not in sys.modules and 'pyarrow' not in sys.modules, "
            "sorted(m for m in sys.modules if m.startswith(('polars', 'pyarrow')))[:3];"
            "from tracekit.cli import build_parser; build_parser();"
            "assert 'polars' not in sys.modules;"  # (--help's choices: tracekit.views.report, which has pyarrow)
            "assert callable(tracekit.load) and 'polars' in sys.modules; print(tracekit.Job.__name__)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "Job"
    with pytest.raises(AttributeError):
        tracekit.nothing_here  # noqa: B018
    assert {"load", "Job", "Verdict", "diff", "Diff"} <= set(dir(tracekit))


def test_tables_are_polars_with_the_public_schema(job: tracekit.Job) -> None:
    assert isinstance(job, tracekit.Job) and job.in_memory
    assert job.n_ranks == 2 and job.n_iterations == 5 and job.line_rate_bps == 500e6
    for name in ("ranks", "iterations", "breakdown", "collectives", "collective_instances", "collective_members",
                 "top_ops", "idle_breakdown", "critical_path_summary"):
        assert isinstance(getattr(job, name), pl.DataFrame), name
    assert isinstance(job.events, pl.DataFrame) and isinstance(job.scan_events(), pl.LazyFrame)
    b = job.breakdown
    assert b.height == 10
    assert (b["compute_ns"] + b["overlapped_ns"] + b["exposed_comm_ns"] + b["memory_ns"] + b["idle_ns"]
            == b["wall_ns"]).all()
    assert job.idle_breakdown["host_bound_ns"].null_count() == 10  # CPU-only ranks: not applicable
    assert set(job.top_ops["class"]) <= {"compute", "overlapped", "exposed_comm", "memory"}
    tables = job.tables()
    assert {"events", "breakdown", "top_ops", "idle_breakdown", "critical_path"} <= set(tables)


def test_summary_is_what_summary_json_prints(job: tracekit.Job, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", str(SAMPLE), "--link-bw", "500mbit", "--json", "--no-cache"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert json.loads(json.dumps(job.summary(), default=str)) == printed
    assert {"top_ops", "idle", "idle_breakdown"} <= set(printed)
    assert printed["idle"]["job"]["host_bound_ns"] is None and printed["idle"]["job"]["idle_ns"] > 0
    assert printed["top_ops"][0]["class"] == "compute"


def test_whatif_and_verdict_are_the_cli_s(job: tracekit.Job, capsys: pytest.CaptureFixture[str]) -> None:
    rows = job.whatif(bandwidth=["500mbit", "1gbit", 10e9], compression=[1, 4], stragglers_removed=True)
    assert rows.height == 7 and rows.columns[:3] == ["bandwidth_bps", "compression", "workers"]
    # the last row: the job as it ran with every rank's excess removed, the number behind "straggler-bound"
    assert rows["stragglers_removed"].to_list() == [False] * 6 + [True]
    assert rows["iteration_ns"][-1] == job.verdict.answer.replays["stragglers_removed"]
    assert main(["whatif", str(SAMPLE), "--link-bw", "500mbit", "--bandwidth", "500mbit,1gbit,10gbit",
                 "--compression", "1,4", "--json", "--no-cache"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert rows.to_dicts() == printed["rows"]
    v = job.verdict
    assert isinstance(v, tracekit.Verdict) and str(v) == v.text == printed["verdict"]
    assert v.kind == "link-bound" and v.bottleneck is not None and v.scaling_factor == v.bottleneck.scaling_measured
    # one verdict: the headline is the text's first sentence, and the replay behind it says the same
    assert v.text.startswith(v.headline) and v.answer is not None and v.answer.kind == v.kind
    assert v.answer.replays["free_communication"] == v.bottleneck.free_ns
    assert v.answer.shares["link"] >= 0.10 and v.answer.shares["link"] >= v.answer.shares["stragglers"]
    assert "Communication-bound" not in v.text and "waiting for other ranks" in v.text
    assert "Links were busy" in v.links
    # per-link rates, dicts and latency; errors are one-line TraceErrors
    assert job.whatif(bandwidth={"default": "1gbit"}).height == 1
    assert job.whatif(bandwidth="1gbit", latency="1ms")["iteration_ns"][0] > \
        job.whatif(bandwidth="1gbit")["iteration_ns"][0]
    with pytest.raises(TraceError, match="compression='-1': must be positive"):
        job.whatif(compression=[-1])
    with pytest.raises(TraceError, match="at most 1"):
        job.whatif(efficiency=2)


def test_critical_path(job: tracekit.Job, capsys: pytest.CaptureFixture[str]) -> None:
    segs = job.critical_path(iteration=3)
    assert set(segs["iteration"]) == {3}
    summ = job.critical_path_summary
    assert int(segs["dur_ns"].sum()) == summ.filter(pl.col("iteration") == 3)["path_ns"][0]
    assert job.critical_path().height > segs.height
    assert main(["critical-path", str(SAMPLE), "--iteration", "3", "--json", "--no-cache"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["segments"] == json.loads(json.dumps(segs.to_dicts(), default=str))
    assert job.slowest_iteration() == summ.sort("path_ns", descending=True)["iteration"][0]
    with pytest.raises(TraceError, match=r"no iteration 99 \(have: 2, 3, 4, 5, 6\)"):
        job.critical_path(iteration=99)


def test_export_and_chrome(job: tracekit.Job, tmp_path: Path) -> None:
    written = job.export(tmp_path / "out")
    names = sorted(Path(p).name for p in written)
    assert "top_ops.parquet" in names and "idle_breakdown.parquet" in names and "events.parquet" in names
    assert pl.read_parquet(tmp_path / "out" / "breakdown.parquet").equals(job.breakdown)
    with pytest.raises(TraceError, match="already exists"):
        job.export(tmp_path / "out")
    assert job.export(tmp_path / "out", force=True) == written
    assert job.export(tmp_path / "one.parquet", table="top_ops") == [str(tmp_path / "one.parquet")]
    n = job.to_chrome(tmp_path / "merged.json")
    assert n > 1000 and json.loads((tmp_path / "merged.json").read_text())["traceEvents"]
    with pytest.raises(TraceError, match="already exists"):
        job.to_chrome(tmp_path / "merged.json")


def test_reprs(job: tracekit.Job) -> None:
    text = repr(job)
    assert text.startswith(f"tracekit.Job {SAMPLE}: 2 ranks · 5 iterations")
    # a repr replays nothing: measurements until the verdict is computed, then the verdict
    job.analysis.__dict__.pop("verdict", None)
    text = repr(job)
    assert "exposed" in text and "Exposed communication is" in text and "job.verdict replays" in text
    job.verdict  # noqa: B018
    assert "Link-bound" in repr(job)
    html = job._repr_html_()
    assert html.startswith("<div class='tracekit-job'>") and "<table>" in html and "<td" in html


def test_gpu_job_and_errors(gpu: Path, tmp_path: Path) -> None:
    j = tracekit.load([gpu], cache=False, link_bw=100e9)
    assert j.idle_breakdown["device"].all() and j.idle_breakdown["host_bound_ns"].null_count() == 0
    assert j.verdict.bottleneck is not None
    with pytest.raises(TraceError, match="no such file"):
        tracekit.load(tmp_path / "nope")
    with pytest.raises(TraceError, match="link_bw='fast'"):
        tracekit.load(gpu, link_bw="fast")
    with pytest.raises(TraceError, match="jobs=0"):
        tracekit.load(gpu, jobs=0)


def test_rank_by_rank_events_are_lazy(gpu: Path, tmp_path: Path) -> None:
    with tracekit.load(gpu, dataset=tmp_path / "ds", link_bw="100gbit") as j:
        assert not j.in_memory and isinstance(j.events, pl.LazyFrame)
        assert j.events.select(pl.len()).collect().item() > 0
        whole = tracekit.load(gpu, cache=False, link_bw="100gbit")
        assert j.breakdown.equals(whole.breakdown)
        assert j.top_ops.equals(whole.top_ops) and j.idle_breakdown.equals(whole.idle_breakdown)
        # the critical path and what-if on the ranks' compact graphs: the same as in memory
        assert j.critical_path_summary.equals(whole.critical_path_summary)
        assert j.whatif(bandwidth=["10gbit"]).equals(whole.whatif(bandwidth=["10gbit"]))
        with pytest.raises(TraceError, match="needs every event in memory"):
            j.to_chrome(tmp_path / "x.json")
        assert "rank by rank" in repr(j)


def _api_example() -> str:
    """The worked example of the Python API: the python block after ``<!-- api-example -->`` in README.md or a page
    of docs/ (exactly one)."""
    found = [m.group(1) for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
             for m in re.finditer(r"<!-- api-example -->\s*```python\n(.*?)```", page.read_text(), re.S)]
    assert len(found) == 1, f"{len(found)} <!-- api-example --> python blocks in README.md and docs/ (one, please)"
    return found[0]


def test_the_python_api_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The worked example (docs/python-api.md), run as written against samples/ddp-gloo (from a copy of the
    repository root: the example's relative paths, its exports in a temporary directory)."""
    (tmp_path / "samples").symlink_to(ROOT / "samples")
    monkeypatch.chdir(tmp_path)
    code = _api_example()
    exec(compile(code, "docs/python-api.md", "exec"), {"__name__": "__api_example__"})
    out = capsys.readouterr().out
    assert "tracekit.Job samples/ddp-gloo: 2 ranks" in out and "Link-bound" in out
    assert (tmp_path / "tracekit-export" / "breakdown.parquet").exists()
    assert not (ROOT / "tracekit-export").exists() and not (ROOT / "samples" / "tracekit-export").exists()


def test_exporting_one_table_computes_no_other(gpu: Path, tmp_path: Path) -> None:
    j = tracekit.load(gpu, cache=False)
    assert j.export(tmp_path / "b.parquet") == [str(tmp_path / "b.parquet")]
    computed = set(j.analysis.__dict__)
    assert not computed & {"graph", "critical_path", "top_ops", "idle_breakdown"}
    assert sorted(j.analysis.tables())[:3] == ["breakdown", "collective_instances", "collective_members"]
    assert "graph" not in j.analysis.__dict__  # listing the names computes nothing either


def test_prefetch_computes_side_by_side_what_one_at_a_time_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    """``summary`` computes the verdict, top ops and idle split in threads: the same tables as one after the other;
    an analysis that fails in its thread raises where it is used, not in the prefetch."""
    one = tracekit.load(SAMPLE, link_bw="500mbit", cache=False).analysis
    both = tracekit.load(SAMPLE, link_bw="500mbit", cache=False).analysis
    one.top_ops, one.idle_breakdown, one.bottleneck  # noqa: B018
    both.prefetch("bottleneck", "top_ops", "idle_breakdown")
    assert {"bottleneck", "top_ops", "idle_breakdown"} <= set(both.__dict__)
    assert both.top_ops.equals(one.top_ops) and both.idle_breakdown.equals(one.idle_breakdown)
    assert both.bottleneck == one.bottleneck
    failing = tracekit.load(SAMPLE, link_bw="500mbit", cache=False).analysis
    from tracekit.analysis import top_ops

    def broken(*_a: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(top_ops, "table", broken)
    failing.prefetch("bottleneck", "top_ops")
    assert "bottleneck" in failing.__dict__ and "top_ops" not in failing.__dict__
    with pytest.raises(RuntimeError, match="boom"):
        failing.top_ops  # noqa: B018
