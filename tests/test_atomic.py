"""Nothing is lost: caches carry a version and checksums and are rebuilt when stale or corrupt; exports and
cache entries are written atomically, and a process killed mid-write leaves the previous file intact
(tested by killing one)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests import kineto_traces as kt
from tracekit.loading import atomic, cache, traceset
from tracekit.parsers import kineto

ROOT = Path(__file__).resolve().parents[1]


def _entry(tmp_path: Path, cache_dir: Path) -> tuple[Path, int]:
    p = kt.write(tmp_path / "rank0.json", kt.gpu_job(2))
    n = traceset.load([str(p)], cache_dir=cache_dir).events.num_rows
    (entry,) = cache.entries(cache_dir)
    return entry, n


@pytest.mark.parametrize("damage", ["flip", "truncate", "manifest", "version", "missing", "extra-bytes"])
def test_damaged_cache_entries_are_detected_and_rebuilt(tmp_path: Path, damage: str) -> None:
    cdir = tmp_path / "cache"
    entry, n = _entry(tmp_path, cdir)
    events = entry / "events.arrow"
    data = bytearray(events.read_bytes())
    if damage == "flip":  # one bit in the middle of a data buffer: only a checksum notices
        data[len(data) // 2] ^= 0x10
        events.write_bytes(bytes(data))
    elif damage == "truncate":
        events.write_bytes(bytes(data[: len(data) - 100]))
    elif damage == "extra-bytes":
        events.write_bytes(bytes(data) + b"\0" * 8)
    elif damage == "missing":
        events.unlink()
    else:
        manifest = json.loads((entry / "manifest.json").read_text())
        if damage == "manifest":
            manifest["bytes_lost"] = 12345  # edited without resealing
        else:
            manifest["version"] = "0"
            (entry / "manifest.json").write_text(cache.seal(manifest))
            assert cache.load(entry) is None
            return
        (entry / "manifest.json").write_text(json.dumps(manifest))
    assert cache.load(entry) is None
    ts = traceset.load([str(tmp_path / "rank0.json")], cache_dir=cdir)
    assert ts.events.num_rows == n
    assert cache.load(cache.entries(cdir)[0]) is not None  # rebuilt in place


def test_size_only_verification_skips_reading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entry, _ = _entry(tmp_path, tmp_path / "cache")
    monkeypatch.setenv("TRACEKIT_CACHE_VERIFY", "size")
    monkeypatch.setattr(cache, "file_crc32", lambda p: pytest.fail("read the file"))
    assert cache.load(entry) is not None


def test_cache_holds_only_arrow_and_json(tmp_path: Path) -> None:
    entry, _ = _entry(tmp_path, tmp_path / "cache")
    names = {p.suffix for p in entry.iterdir()}
    assert names == {".arrow", ".json"}  # nothing pickled, nothing to evaluate


def test_stale_leftovers_of_killed_writers_are_swept(tmp_path: Path) -> None:
    cdir = tmp_path / "cache"
    entry, _ = _entry(tmp_path, cdir)
    orphan = cdir / ".data-deadbeef.abc"
    orphan.mkdir()
    (orphan / "events.arrow").write_bytes(b"half")
    tmp_file = cdir / ".tmp-link-x"
    tmp_file.write_bytes(b"")
    old = time.time() - 2 * atomic.STALE_SECONDS
    for p in (orphan, tmp_file):
        os.utime(p, (old, old), follow_symlinks=False)
    atomic.sweep_stale(cdir, once=False)  # the store above swept it once already
    assert not orphan.exists() and not tmp_file.exists()
    assert cache.load(entry) is not None  # the live entry and its data stay


# --- killing writers -----------------------------------------------------------------------------------

EXPORT_CHILD = """
import sys
import numpy as np, pyarrow as pa
from tracekit.views.export import write_parquet
rng = np.random.default_rng(0)
t = pa.table({f"c{i}": rng.integers(0, 1 << 60, 6_000_000) for i in range(6)})
print("writing", flush=True)
write_parquet(t, sys.argv[1])
print("done", flush=True)
"""


def _wait_for(pred, timeout: float = 60.0) -> None:
    t = time.monotonic()
    while not pred():
        if time.monotonic() - t > timeout:
            raise AssertionError("timed out")
        time.sleep(0.002)


def test_killed_export_leaves_the_previous_file_intact(tmp_path: Path) -> None:
    out = tmp_path / "breakdown.parquet"
    job = tmp_path / "job"
    job.mkdir()
    kt.write(job / "rank0.json", kt.gpu_job(2))
    from tracekit.cli import main

    assert main(["export", str(job), "-o", str(out)]) == 0
    before = out.read_bytes()
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(EXPORT_CHILD), str(out)], cwd=ROOT,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "writing"

        def tmp_growing() -> bool:
            return any(p.name.startswith(f".tmp-{out.name}.") and p.stat().st_size > 0 for p in tmp_path.iterdir())

        _wait_for(tmp_growing)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == -signal.SIGKILL  # it really was killed mid-write
    assert out.read_bytes() == before
    assert pq.read_table(out).num_rows == 2


CACHE_CHILD = """
import sys
from pathlib import Path
import numpy as np, pyarrow as pa
from tracekit.loading import cache
from tracekit.model import schema
from tracekit.model.schema import ParsedFile

def parsed(n):
    ev = schema.table(schema.EVENTS, {"start_ns": np.arange(n, dtype=np.int64), "dur_ns": np.ones(n, np.int64),
                                       "rank": np.zeros(n, np.int32)})
    return ParsedFile(path="x", format="kineto", events=ev, meta={"n": n})

a, b = parsed(int(sys.argv[2])), parsed(int(sys.argv[3]))
entry = Path(sys.argv[1])
print("looping", flush=True)
while True:
    cache.store(a, entry)
    cache.store(b, entry)
"""


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.13, 0.31])
def test_killed_cache_writer_leaves_a_whole_entry(tmp_path: Path, delay: float) -> None:
    entry = tmp_path / "cache" / "entry"
    na, nb = 2_000_000, 3_000_000
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(CACHE_CHILD), str(entry), str(na), str(nb)],
                             cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "looping"
        _wait_for(lambda: cache.load(entry) is not None)  # the first entry is published
        time.sleep(delay + random.random() * 0.02)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    loaded = cache.load(entry)
    assert loaded is not None, "the entry must survive the kill"
    assert loaded.events.num_rows in (na, nb) and loaded.meta["n"] == loaded.events.num_rows


def test_an_interrupted_parse_cache_never_serves_a_partial_parse(tmp_path: Path) -> None:
    # the cache written for a file is exactly its parse: reopening gives equal tables
    p = kt.write(tmp_path / "rank0.json", kt.gpu_job(3))
    fresh = kineto.parse(str(p))
    cdir = tmp_path / "cache"
    traceset.load([str(p)], cache_dir=cdir)
    reopened = cache.load(cache.entries(cdir)[0])
    assert reopened is not None and reopened.events.equals(fresh.events)
