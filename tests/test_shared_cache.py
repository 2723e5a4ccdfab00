"""Many users, one cache: processes loading the same traces at once, a cache directory that is read-only,
full, shared by a group of users or holding links planted in it, and a trace rewritten while it is read.
Nothing is corrupted, nothing crashes: every run gets the right answer (with a one-line warning when the
cache cannot be used) or a clear one-line reason.

Tests that mount file systems or switch users need root (and mount rights); they skip cleanly elsewhere.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from tests.tmpfs_mounts import needs_mount, tmpfs
from tracekit import results_cache
from tracekit.loading import atomic, cache
from tracekit.parsers import detect

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "ddp-gloo"

#: runs the CLI in a fresh process; "pool" forces the process-pool parse (the sample is below its threshold)
CLI = textwrap.dedent("""
    import sys
    from tracekit.loading import traceset
    if sys.argv[1] == "pool":
        traceset.PARALLEL_MIN_BYTES = 0
    from tracekit.cli import main
    sys.exit(main(sys.argv[2:]))
""")

#: the inspect command's loading, all five phases (results cache, critical path, graph), without a screen
INSPECT = textwrap.dedent("""
    import json, sys
    from tracekit.tui.data import LoadCallbacks, LoadOptions, load_job
    data = load_job(sys.argv[1:], LoadOptions(cache_dir=None), LoadCallbacks())
    print(json.dumps({"job": data.job, "per_rank": data.per_rank, "paths": data.paths_ready,
                      "whatif": data.whatif_ready}, default=str))
""")

MODES = {"memory": [], "pool": ["-j", "2"], "dataset": ["--engine", "local"]}


def _env(cache_dir: Path | str) -> dict[str, str]:
    return {**os.environ, "TRACEKIT_CACHE_DIR": str(cache_dir), "COLUMNS": "200"}


def start(mode: str, paths: list[str], cache_dir: Path | str, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-c", CLI, "pool" if mode == "pool" else "-", "summary", *paths, "--json",
           *MODES[mode], *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(cache_dir),
                            cwd=ROOT)


def finish(p: subprocess.Popen, timeout: float = 180) -> tuple[int, dict | None, str]:
    out, err = p.communicate(timeout=timeout)
    return p.returncode, json.loads(out) if p.returncode == 0 else None, err


def answer(doc: dict | None) -> dict:
    """A summary's figures without its warnings (which say what happened to the cache)."""
    assert doc is not None
    return {k: v for k, v in doc.items() if k != "diagnostics"}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """The sample's summary per mode, without any cache (the process pool reads what memory reads); in this
    process, through the CLI's own code."""
    import io

    from tracekit.cli import main

    out = {}
    for mode in ("memory", "dataset"):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
            assert main(["summary", str(SAMPLE), "--json", "--no-cache", *MODES[mode]]) == 0
        out[mode] = answer(json.loads(buf.getvalue()))
    out["pool"] = out["memory"]
    return out


def run_all(runs: list[tuple[str, list[str], Path | str, tuple[str, ...]]]) -> list[tuple[int, dict | None, str]]:
    """Start every ``(mode, paths, cache, extra)`` at once; their outcomes in order."""
    procs = [start(mode, paths, c, *extra) for mode, paths, c, extra in runs]
    return [finish(p) for p in procs]


def inspect_loader(cache_dir: Path | str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", INSPECT, str(SAMPLE)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(cache_dir))


def cache_is_sound(root: Path, entries: bool = True) -> None:
    """Every published entry under ``root`` names a whole data directory (and, with ``entries``, loads as a
    parse-cache entry); no data directory is unreferenced, no temporary is left."""
    names = os.listdir(root)
    links = [n for n in names if not n.startswith(".") and os.path.islink(root / n)
             and n not in ("datasets", "results")]  # a planted link in their place is not an entry
    for n in links:
        assert atomic.data_dir(root / n) is not None, n
        if entries:
            assert cache.load(root / n) is not None, n
    data = {n for n in names if n.startswith(atomic.DATA_PREFIX)}
    assert data == {os.readlink(root / n) for n in links}, "orphaned or missing data directories"
    assert not [n for n in names if n.startswith(atomic.TMP_PREFIX)]


# --- processes at once -------------------------------------------------------------------------------------


def test_processes_loading_the_same_traces_at_once(tmp_path: Path, reference: dict) -> None:
    # on a cold cache at once: two inspect loaders (all five phases: results cache, critical path, graph),
    # two summaries, one through the process pool, two rank by rank (the per-rank dataset in the cache);
    # then the same kinds on the warm cache. Every one right, the cache sound and whole afterwards.
    cache_dir = tmp_path / "cache"
    for modes in (["memory", "memory", "pool", "dataset", "dataset"], ["memory", "dataset"]):
        loaders = [inspect_loader(cache_dir) for _ in range(2 if len(modes) > 2 else 1)]
        outcomes = run_all([(m, [str(SAMPLE)], cache_dir, ()) for m in modes])
        for (rc, doc, err), m in zip(outcomes, modes, strict=True):
            assert rc == 0, err
            assert answer(doc) == reference[m], m
            assert "warning" not in err, err
        loaded = []
        for p in loaders:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, err[-2000:]
            loaded.append(json.loads(out))
        assert all(x == loaded[0] for x in loaded) and loaded[0]["paths"] and loaded[0]["whatif"]
        cache_is_sound(cache_dir)
        cache_is_sound(cache_dir / "datasets", entries=False)
        cache_is_sound(cache_dir / "results", entries=False)
    # one results entry, whole: a later launch paints from it, with the critical path and the graph
    key = results_cache.key([str(SAMPLE)], None)
    assert key is not None
    hit = results_cache.load(cache_dir / "results", key)
    assert hit is not None and hit.critical_path is not None and hit.graph_dir is not None
    assert hit.figures is not None and hit.figures["job"] == loaded[0]["job"]


PUBLISHER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from tracekit import results_cache
    from tracekit.loading import cache
    from tracekit.analysis.pipeline import analyse
    from tracekit.loading.traceset import load
    traces = load([sys.argv[1]], use_cache=False)
    parsed, analysis, entry, root = traces.files[0], analyse(traces), Path(sys.argv[2]), Path(sys.argv[3])
    rows, hits, end = parsed.events.num_rows, 0, time.monotonic() + float(sys.argv[4])
    while time.monotonic() < end:
        cache.store(parsed, entry)
        got = cache.load(entry)
        assert got is None or got.events.num_rows == rows, "a torn parse-cache entry"
        hits += got is not None
        results_cache.store(root, "key", analysis)
        res = results_cache.load(root, "key")
        assert res is None or res.breakdown.equals(analysis.breakdown), "a torn results entry"
        hits += res is not None
    print(hits)
""")


def test_publishers_and_readers_of_one_entry_race(tmp_path: Path) -> None:
    # three processes publish and read the same parse-cache and results entries as fast as they can: a
    # reader gets the entry whole or a miss, never a mix, never an error
    trace = tmp_path / "rank0.pt.trace.json.gz"
    shutil.copy(SAMPLE / "rank0.pt.trace.json.gz", trace)
    entry, root = tmp_path / "cache" / "entry", tmp_path / "cache" / "results"
    procs = [subprocess.Popen([sys.executable, "-c", PUBLISHER, str(trace), str(entry), str(root), "1.5"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=180) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    assert sum(int(o[0]) for o in outs) > 0
    cache_is_sound(tmp_path / "cache")


# --- caches that cannot be written ---------------------------------------------------------------------------


def _warned_cache_unusable(err: str, why: str) -> None:
    warnings = [line for line in err.splitlines() if line.startswith("warning")]
    assert warnings and all(why in w for w in warnings), err
    assert len(warnings) == 1, err  # one line, not one per file


def test_a_cache_on_an_unwritable_path(tmp_path: Path, reference: dict) -> None:
    # below a regular file: unwritable for root too, no mount needed
    (tmp_path / "file").write_text("")
    outcomes = run_all([(m, [str(SAMPLE)], tmp_path / "file" / "cache", ()) for m in MODES])
    for (rc, doc, err), mode in zip(outcomes, MODES, strict=True):
        assert rc == 0, err
        assert answer(doc) == reference[mode]
        _warned_cache_unusable(err, "Not a directory")


def _fill(cache_dir: Path) -> None:
    """The sample's parse-cache entries and per-rank dataset in ``cache_dir`` (in this process)."""
    from tracekit.loading import traceset
    from tracekit.scale import dataset

    traceset.load([str(SAMPLE)], cache_dir=cache_dir)
    dataset.build([str(SAMPLE)], cache_dir=cache_dir).cleanup()


@needs_mount
def test_a_cache_on_a_read_only_file_system(reference: dict) -> None:
    modes = ["memory", "dataset"]  # the process pool's fallback is the unwritable path's test
    with tmpfs("size=16m") as d:
        # cold: nothing cached, nothing can be; the answer, and one warning
        subprocess.run(["mount", "-o", "remount,ro", str(d)], check=True)
        for (rc, doc, err), mode in zip(run_all([(m, [str(SAMPLE)], d, ()) for m in modes]), modes, strict=True):
            assert rc == 0, err
            assert answer(doc) == reference[mode]
            _warned_cache_unusable(err, "Read-only file system")
        # warm: filled while writable, then read-only: the entries serve, silently
        subprocess.run(["mount", "-o", "remount,rw", str(d)], check=True)
        _fill(d)
        subprocess.run(["mount", "-o", "remount,ro", str(d)], check=True)
        for (rc, doc, err), mode in zip(run_all([(m, [str(SAMPLE)], d, ()) for m in modes]), modes, strict=True):
            assert rc == 0, err
            assert answer(doc) == reference[mode]
            assert "warning" not in err, err


@needs_mount
def test_a_cache_on_a_full_file_system(reference: dict) -> None:
    from tracekit.model.diagnostics import TraceError
    from tracekit.scale import dataset

    modes = ["memory", "dataset"]
    with tmpfs("size=64k") as d:
        for (rc, doc, err), mode in zip(run_all([(m, [str(SAMPLE)], d, ()) for m in modes]), modes, strict=True):
            assert rc == 0, err
            assert answer(doc) == reference[mode]
            _warned_cache_unusable(err, "No space left on device")
        # nothing half-written is left behind, and the space is free again
        left = [p for p in d.rglob("*") if not p.is_dir() and p.name != atomic.LOCK_NAME]
        assert not left, left
        assert shutil.disk_usage(d).used <= 16 << 10
        # --dataset on the full disk: one line naming it
        with pytest.raises(TraceError) as err:
            dataset.build([str(SAMPLE)], out=d / "ds")
        assert str(err.value) == f"{d / 'ds'}: cannot write the dataset here: No space left on device"
        assert not (d / "ds").exists()


# --- a cache shared by a group of users ----------------------------------------------------------------------

#: a fresh root process reads everything once (imports, lazy modules), then becomes the user and loads the
#: job again through the shared cache: this interpreter lives under /root, which other users cannot read
AS_USER = textwrap.dedent("""
    import json, os, sys
    uid, gid, cache_dir, warm_cache, paths = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
    from tracekit.loading import traceset
    from tracekit.analysis.pipeline import analyse
    from tracekit.scale.dataset import build
    from tracekit.views.summary import job
    def run(cache):
        a = analyse(traceset.load(paths, cache_dir=cache))
        ds = build(paths, cache_dir=cache)
        return job(a.breakdown), ds.manifest["events"], [str(d) for d in a.diagnostics if d.level != "info"]
    run(warm_cache)                       # as root: everything imported
    os.setgroups([gid]); os.setgid(gid); os.setuid(uid); os.umask(0o022)
    shares, events, warnings = run(cache_dir)
    print(json.dumps({"job": shares, "events": events, "warnings": warnings}, default=str))
""")


def _as_user(uid: int, gid: int, cache_dir: Path, paths: list[str], warm: Path) -> dict:
    r = subprocess.run([sys.executable, "-c", AS_USER, str(uid), str(gid), str(cache_dir), str(warm), *paths],
                       capture_output=True, text=True, timeout=300, cwd="/")
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def _tree(root: Path) -> dict[str, tuple[int, int, int]]:
    out = {}
    for top, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(top, n)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (st.st_uid, st.st_gid, st.st_mode)
    return out


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other users")
def test_a_cache_shared_by_a_group(tmp_path: Path) -> None:
    gid, alice, bob = 42400, 42401, 42402
    shared = Path(tempfile.mkdtemp(prefix="tracekit-shared-"))
    try:
        shared.chmod(0o755)
        job = shared / "job"
        shutil.copytree(SAMPLE, job)
        for p in [job, *job.iterdir()]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        cache_dir = shared / "cache"
        cache_dir.mkdir()
        os.chown(cache_dir, 0, gid)
        cache_dir.chmod(0o2775)  # the usual shared directory: group-writable, set-group-ID
        first = _as_user(alice, gid, cache_dir, [str(job)], tmp_path / "warm-a")
        assert not first["warnings"], first
        tree = _tree(cache_dir)
        assert tree and all(uid == alice and g == gid for uid, g, _ in tree.values())
        for rel, (_, _, mode) in tree.items():
            if stat.S_ISLNK(mode):
                continue  # a link's own mode means nothing
            assert not mode & stat.S_IWOTH, rel  # nothing world-writable
            if stat.S_ISDIR(mode):
                assert mode & 0o2070 == 0o2070, (rel, oct(mode))  # the group may replace and remove entries
            elif stat.S_ISREG(mode):
                assert mode & 0o777 == 0o644, (rel, oct(mode))  # readable, never modified in place
        # bob reads alice's entries as they are
        second = _as_user(bob, gid, cache_dir, [str(job)], tmp_path / "warm-b")
        assert second == first
        assert _tree(cache_dir) == tree  # nothing was rewritten: every entry was a hit
        # alice's parse-cache entry damaged: bob replaces it, and alice's old data goes (group-writable)
        victim = next(p for p in sorted(cache_dir.iterdir()) if p.is_symlink())  # a parse-cache entry
        data = atomic.data_dir(victim)
        assert data is not None
        with open(data / "events.arrow", "r+b") as f:
            f.seek(200)
            f.write(b"\xff\xff\xff\xff")
        third = _as_user(bob, gid, cache_dir, [str(job)], tmp_path / "warm-c")
        assert third == first
        assert not data.exists()
        assert os.lstat(atomic.data_dir(victim)).st_uid == bob
        cache_is_sound(cache_dir)
    finally:
        shutil.rmtree(shared, ignore_errors=True)


# --- links planted in the cache --------------------------------------------------------------------------------


def test_links_planted_in_the_cache_are_never_followed(tmp_path: Path, reference: dict) -> None:
    # someone with write access to a shared cache plants links under the names tracekit will use: an
    # entry's name, results/ and datasets/, all pointing at a directory of the victim's
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "thesis.tex").write_text("years of work")
    (victim / "manifest.json").write_text("{}")
    before = sorted((p.name, p.read_bytes()) for p in victim.iterdir())
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    for trace in SAMPLE.glob("*.gz"):
        fmt = detect(str(trace))
        assert fmt is not None
        os.symlink(victim, cache_dir / cache.entry_key(str(trace), fmt.version))
    os.symlink(victim, cache_dir / "results")
    os.symlink(victim, cache_dir / "datasets")
    loader = inspect_loader(cache_dir)
    modes = ["memory", "dataset"]
    for (rc, doc, err), mode in zip(run_all([(m, [str(SAMPLE)], cache_dir, ()) for m in modes]), modes, strict=True):
        assert rc == 0, err
        assert answer(doc) == reference[mode]
    _, err = loader.communicate(timeout=300)
    assert loader.returncode == 0, err[-2000:]
    assert sorted((p.name, p.read_bytes()) for p in victim.iterdir()) == before  # untouched, nothing added
    assert (cache_dir / "results").is_symlink() and (cache_dir / "datasets").is_symlink()  # left alone
    cache_is_sound(cache_dir)  # the planted entry names now name real entries


def test_a_link_planted_inside_an_entry_is_not_read_through(tmp_path: Path) -> None:
    trace = tmp_path / "rank0.pt.trace.json.gz"
    shutil.copy(SAMPLE / "rank0.pt.trace.json.gz", trace)
    from tracekit.loading import traceset

    n = traceset.load([str(trace)], cache_dir=tmp_path / "cache").events.num_rows
    (entry,) = cache.entries(tmp_path / "cache")
    data = atomic.data_dir(entry)
    assert data is not None
    elsewhere = tmp_path / "elsewhere.arrow"
    shutil.copy(data / "events.arrow", elsewhere)  # same bytes: only the link gives it away
    (data / "events.arrow").unlink()
    os.symlink(elsewhere, data / "events.arrow")
    assert cache.load(entry) is None
    assert traceset.load([str(trace)], cache_dir=tmp_path / "cache").events.num_rows == n
    assert elsewhere.exists()


# --- a trace rewritten while it is read ------------------------------------------------------------------------

WRITER = textwrap.dedent("""
    import os, sys, time
    path, seconds = sys.argv[1], float(sys.argv[4])
    a, b = open(sys.argv[2], "rb").read(), open(sys.argv[3], "rb").read()
    end, i = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        data = (a, b)[i % 2]
        with open(path, "r+b" if os.path.exists(path) else "wb") as f:   # in place, in pieces
            f.truncate(0)
            for k in range(0, len(data), 1 << 16):
                f.write(data[k:k + (1 << 16)])
                f.flush()
                time.sleep(0.002)
        i += 1
    with open(path, "wb") as f:
        f.write(b)
""")


def test_a_trace_rewritten_while_it_is_read(tmp_path: Path) -> None:
    # rank1 is rewritten in place over and over, alternating a whole trace and its first half, while summaries
    # read the job through one cache; each gets an answer or a one-line error, and once the writer is done
    # the cache gives exactly the final file's answer (nothing was cached under the wrong version)
    job = tmp_path / "job"
    shutil.copytree(SAMPLE, job)
    import gzip

    whole = gzip.decompress((SAMPLE / "rank1.pt.trace.json.gz").read_bytes())
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_bytes(whole)
    b.write_bytes(whole[: len(whole) // 2])
    (job / "rank1.pt.trace.json.gz").unlink()
    target = job / "rank1.pt.trace.json"
    target.write_bytes(whole)
    cache_dir = tmp_path / "cache"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(target), str(a), str(b), "3"])
    try:
        deadline = time.monotonic() + 3
        runs = 0
        while time.monotonic() < deadline or runs < 2:
            rc, doc, err = finish(start("memory", [str(job)], cache_dir))
            runs += 1
            if rc == 0:
                assert doc is not None and doc["ranks"]
            else:
                lines = err.strip().splitlines()
                assert rc == 1 and len(lines) == 1 and str(job) in lines[0], err
    finally:
        writer.wait(timeout=60)
    assert writer.returncode == 0
    rc, doc, err = finish(start("memory", [str(job)], cache_dir))
    rc_ref, ref, err_ref = finish(start("memory", [str(job)], cache_dir, "--no-cache"))
    assert rc == rc_ref == 0, (err, err_ref)
    assert doc == ref
