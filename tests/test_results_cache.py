"""The results cache: a hit gives back exactly what was analysed; any change to the inputs misses; a
damaged entry is a miss, never an error."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tracekit import results_cache
from tracekit.analysis.pipeline import analyse
from tracekit.loading.traceset import load

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "ddp-gloo"


def _job(tmp_path: Path) -> Path:
    job = tmp_path / "job"
    shutil.copytree(SAMPLE, job)
    return job


def test_hit_returns_what_was_stored(tmp_path: Path) -> None:
    job = _job(tmp_path)
    analysis = analyse(load([str(job)], use_cache=False))
    key = results_cache.key([str(job)], None)
    assert key is not None
    results_cache.store(tmp_path / "results", key, analysis)
    hit = results_cache.load(tmp_path / "results", key)
    assert hit is not None
    assert hit.breakdown.equals(analysis.breakdown) and hit.iterations.equals(analysis.iterations)
    assert hit.figures is not None and hit.figures["job"]["ranks"] == 2
    assert hit.files == [f.path for f in analysis.traces.files]
    rebuilt = results_cache.analysis_from(analysis.traces, hit)
    assert rebuilt is not None and rebuilt.events.column("iteration").equals(analysis.events.column("iteration"))


def test_any_change_to_the_inputs_misses(tmp_path: Path) -> None:
    job = _job(tmp_path)
    key = results_cache.key([str(job)], None)
    assert key == results_cache.key([str(job)], None)
    assert key != results_cache.key([str(job)], "ProfilerStep#(\\d+)")  # options that change results
    trace = next(job.glob("rank0*"))
    st = trace.stat()
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000))
    touched = results_cache.key([str(job)], None)
    assert touched != key
    (job / "rank2.pt.trace.json").write_text("{}")
    assert results_cache.key([str(job)], None) != touched
    assert results_cache.key([str(job / "missing")], None) is None


def test_damaged_entries_are_misses(tmp_path: Path) -> None:
    job = _job(tmp_path)
    analysis = analyse(load([str(job)], use_cache=False))
    key = results_cache.key([str(job)], None)
    assert key is not None
    root = tmp_path / "results"
    results_cache.store(root, key, analysis)
    (root / key / "breakdown.arrow").write_bytes(b"not arrow")
    assert results_cache.load(root, key) is None
    results_cache.store(root, key, analysis)
    (root / key / "manifest.json").write_text("{")
    assert results_cache.load(root, key) is None
    assert results_cache.load(root, "no-such-entry") is None


def test_critical_path_tables_join_the_entry(tmp_path: Path) -> None:
    job = _job(tmp_path)
    analysis = analyse(load([str(job)], use_cache=False))
    key = results_cache.key([str(job)], None)
    assert key is not None
    root = tmp_path / "results"
    results_cache.store_paths(root, key, analysis)  # no entry yet: nothing written
    assert not (root / key).exists() and "graph" not in analysis.__dict__
    results_cache.store(root, key, analysis)
    hit = results_cache.load(root, key)
    assert hit is not None and hit.critical_path is None  # not computed by any session yet
    results_cache.store_paths(root, key, analysis)
    hit = results_cache.load(root, key)
    assert hit is not None and hit.critical_path is not None
    rebuilt = results_cache.analysis_from(load([str(job)], use_cache=False), hit)
    assert rebuilt is not None
    assert rebuilt.critical_path.equals(analysis.critical_path)
    assert rebuilt.critical_path_summary.equals(analysis.critical_path_summary)
    assert "graph" not in rebuilt.__dict__  # the path came from the entry: no graph was built
    # a damaged path file is a miss of the path alone: the entry still serves the rest
    (root / key / "critical_path.arrow").write_bytes(b"not arrow")
    hit = results_cache.load(root, key)
    assert hit is not None and hit.critical_path is None and hit.breakdown.equals(analysis.breakdown)
    assert not [p.name for p in (root / key).iterdir() if p.name.endswith(".tmp")]


def test_the_graph_joins_the_entry_and_replays_the_same(tmp_path: Path) -> None:
    import numpy as np

    from tracekit.analysis.graph import whatif

    job = _job(tmp_path)
    analysis = analyse(load([str(job)], use_cache=False), link_bw_bps=500e6)
    key = results_cache.key([str(job)], None, 500e6)
    assert key is not None
    root = tmp_path / "results"
    results_cache.store(root, key, analysis)
    results_cache.store_graph(root, key, analysis.graph)
    results_cache.store_graph(root, key, analysis.graph)  # already there: left alone
    hit = results_cache.load(root, key)
    assert hit is not None and hit.graph_dir is not None
    rebuilt = results_cache.analysis_from(load([str(job)], use_cache=False), hit)
    assert rebuilt is not None and "graph" in rebuilt.__dict__
    g, h = analysis.graph, rebuilt.graph
    assert g.act.equals(h.act) and g.violated == h.violated
    for name in ("src", "dst", "lag", "etype", "slack", "node_time", "binding"):
        a, b = getattr(g, name), getattr(h, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    # what-if from the stored graph predicts exactly what the built one does
    sc = [whatif.Scenario(bandwidth_bps=r) for r in (100e6, 1e9, 10e9)]
    assert whatif.sweep(rebuilt.whatif, sc).equals(whatif.sweep(analysis.whatif, sc))
    assert rebuilt.critical_path.equals(analysis.critical_path)
    # a damaged graph is rebuilt, never an error
    (root / key / "graph" / "edges.arrow").write_bytes(b"not arrow")
    hit = results_cache.load(root, key)
    assert hit is not None
    again = results_cache.analysis_from(load([str(job)], use_cache=False), hit)
    assert again is not None and "graph" not in again.__dict__
    assert again.critical_path.equals(analysis.critical_path)
