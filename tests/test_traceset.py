"""Loading many files: ranks, the cache, parallel parsing."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl

from tests import kineto_traces as kt
from tracekit.loading import cache, traceset


def test_rank_sources(tmp_path: Path) -> None:
    kt.write(tmp_path / "a.json", kt.gpu_job(1), rank=3)
    kt.write(tmp_path / "worker5.json", kt.gpu_job(1), rank=None)
    kt.write(tmp_path / "zzz.json", kt.gpu_job(1), rank=None)
    ts = traceset.load([str(tmp_path)])
    r = pl.from_arrow(ts.ranks).sort("rank")
    assert r.select(["rank", "rank_source"]).rows() == [(0, "order"), (3, "distributedInfo"), (5, "file name")]
    assert set(pl.from_arrow(ts.events)["rank"].unique().to_list()) == {0, 3, 5}


def test_cache_is_reused_and_invalidated(tmp_path: Path, _isolated_cache: Path) -> None:
    p = kt.write(tmp_path / "rank0.json", kt.gpu_job(2))
    ts1 = traceset.load([str(p)])
    entries = cache.entries(_isolated_cache)
    assert len(entries) == 1 and (entries[0] / "events.arrow").exists()
    ts2 = traceset.load([str(p)])
    assert ts2.events.equals(ts1.events)
    # a changed file misses the cache
    kt.write(p, kt.gpu_job(3))
    os.utime(p, ns=(1, 1))
    ts3 = traceset.load([str(p)])
    assert ts3.events.num_rows > ts1.events.num_rows
    assert len(cache.entries(_isolated_cache)) == 2


def test_corrupt_cache_entry_is_rebuilt(tmp_path: Path, _isolated_cache: Path) -> None:
    p = kt.write(tmp_path / "rank0.json", kt.gpu_job(2))
    n = traceset.load([str(p)]).events.num_rows
    entry = cache.entries(_isolated_cache)[0]
    (entry / "events.arrow").write_bytes(b"garbage")
    assert cache.load(entry) is None
    assert traceset.load([str(p)]).events.num_rows == n


def test_no_cache_writes_nothing(tmp_path: Path, _isolated_cache: Path) -> None:
    p = kt.write(tmp_path / "rank0.json", kt.gpu_job(1))
    traceset.load([str(p)], use_cache=False)
    assert list(_isolated_cache.iterdir()) == []


def test_parallel_and_serial_agree(tmp_path: Path, monkeypatch) -> None:
    for r in range(3):
        kt.write(tmp_path / f"rank{r}.json", kt.gpu_job(2), rank=r)
    serial = traceset.load([str(tmp_path)], jobs=1, use_cache=False)
    monkeypatch.setattr(traceset, "PARALLEL_MIN_BYTES", 0)
    parallel = traceset.load([str(tmp_path)], jobs=2, use_cache=False)
    assert parallel.events.sort_by([("rank", "ascending"), ("start_ns", "ascending")]).equals(
        serial.events.sort_by([("rank", "ascending"), ("start_ns", "ascending")]))
