"""Beyond one machine: the per-rank unit runs in local processes or on Dask with identical results, equal to
the whole-job in-memory analysis; the dataset is Hive-partitioned Parquet that polars scans lazily; it is
reused while the inputs are unchanged and survives a killed build."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pytest

from tests import kineto_traces as kt
from tracekit.analysis import pipeline as analysis
from tracekit.analysis.pipeline import analyse
from tracekit.cli import main
from tracekit.loading import traceset
from tracekit.model import schema
from tracekit.model.diagnostics import TraceError
from tracekit.scale import dataset, engine
from tracekit.scale.analyse import DATASET_NOTE, analyse_dataset

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples" / "ddp-gloo"


@pytest.fixture
def job(tmp_path: Path) -> Path:
    """Four ranks of different shapes: GPU with steps, a truncated GPU rank, a CPU-only gloo rank (the
    bundled sample's rank 1), and a rank known only from its file name."""
    d = tmp_path / "job"
    d.mkdir()
    kt.write(d / "a.json", kt.gpu_job(3), rank=0)
    raw = kt.write(d / "b.json", kt.gpu_job(4, t0=kt.EPOCH_NS + 77), rank=2).read_bytes()
    (d / "b.json").write_bytes(raw[: len(raw) * 3 // 4])
    (d / "gloo.json.gz").write_bytes((SAMPLES / "rank1.pt.trace.json.gz").read_bytes())
    kt.write(d / "worker7.json", kt.gpu_job(2, t0=kt.EPOCH_NS + 5_000), rank=None, era="int-us")
    return d


def _sorted(t: pa.Table, keys: list[str]) -> pa.Table:
    return t.sort_by([(k, "ascending") for k in keys])


def _reference(paths: list[str]):
    return analyse(traceset.load(paths, use_cache=False))


def _assert_same_as_reference(ds: dataset.Dataset, paths: list[str]) -> None:
    ref = _reference(paths)
    res = analyse_dataset(ds)
    # rank by rank, the breakdown is the whole job's, waiting and transfer included
    assert _sorted(res.breakdown, ["rank", "start_ns"]).equals(_sorted(ref.breakdown, ["rank", "start_ns"]))
    assert ref.breakdown.column("transfer_ns").null_count < ref.breakdown.num_rows  # the reference did split
    assert res.instances.num_rows == ref.instances.num_rows
    assert res.members.equals(ref.members) and res.ranks.equals(ref.ranks)  # matching and clocks as in memory
    assert _sorted(res.iterations, ["rank", "start_ns"]).equals(_sorted(ref.iterations, ["rank", "start_ns"]))
    keys = ["rank", "collective_id"]
    assert _sorted(res.collectives, keys).equals(_sorted(schema.conform(ref.traces.collectives, schema.COLLECTIVES),
                                                         keys))
    assert _sorted(ds.ranks, ["rank"]).equals(_sorted(ref.traces.ranks, ["rank"]))
    # events: the same rows (dictionary encodings differ per file, so compare as plain values)
    ev = pa.Table.from_batches(list(ds.event_batches()), schema=schema.EVENTS)
    cols = ["rank", "lane", "kind", "name", "start_ns", "dur_ns", "correlation", "iteration", "collective_id"]

    def frame(t: pa.Table) -> pl.DataFrame:
        df = pl.from_arrow(t.select(cols))
        assert isinstance(df, pl.DataFrame)
        return df.with_columns(pl.col(c).cast(pl.String) for c in ("lane", "kind", "name")).sort(cols,
                                                                                               nulls_last=True)

    assert frame(ev).equals(frame(ref.events))
    assert sorted(res.notes) == sorted([*ref.notes, DATASET_NOTE])


def test_local_engine_equals_the_whole_job_analysis(job: Path, tmp_path: Path) -> None:
    ds = dataset.build([str(job)], out=tmp_path / "ds", engine=engine.LocalEngine(jobs=1))
    _assert_same_as_reference(ds, [str(job)])
    assert {p.name for p in (tmp_path / "ds" / "current").iterdir()} >= {"manifest.json", "ranks.parquet", "rank=0",
                                                                          "rank=1", "rank=2", "rank=7"}
    rank_sources = dict(zip(ds.ranks.column("rank").to_pylist(), ds.ranks.column("rank_source").to_pylist(),
                            strict=True))
    assert rank_sources == {0: "distributedInfo", 2: "distributedInfo", 1: "distributedInfo", 7: "file name"}


def test_pool_workers_share_the_cores_among_their_polars_pools(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers that fill the cores get a polars pool of their share each, unless the user chose its size."""
    from tests import unit_hooks

    monkeypatch.delenv("POLARS_MAX_THREADS", raising=False)
    for cores, share in ((2, 1), (6, 3)):  # the cores are counted in this process; polars would count the machine's
        monkeypatch.setattr(os, "cpu_count", lambda cores=cores: cores)
        assert dict(engine.LocalEngine(jobs=2).map(unit_hooks.polars_threads, [0, 1])) == {0: share, 1: share}
    assert engine.threads_per_worker(7) == 1 and engine.threads_per_worker(1) == 6
    monkeypatch.setenv("POLARS_MAX_THREADS", "5")
    assert dict(engine.LocalEngine(jobs=2).map(unit_hooks.polars_threads, [0, 1])) == {0: 5, 1: 5}


def test_a_process_started_with_a_thread_count_imports_its_entry_after_setting_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The rank hosts' way (:func:`engine.run_with_threads`): the entry named, not passed, so polars is imported after
    its pool's size is set."""
    from multiprocessing import get_context

    monkeypatch.delenv("POLARS_MAX_THREADS", raising=False)
    ctx = get_context("spawn")
    a, b = ctx.Pipe()
    p = ctx.Process(target=engine.run_with_threads, args=(3, "tests.unit_hooks:send_polars_threads", b))
    p.start()
    b.close()
    assert a.recv() == 3
    p.join(timeout=30)


def test_pool_workers_start_from_a_program_read_on_stdin() -> None:
    """``python -`` (a script fed on stdin) runs units on worker processes: spawn would have each run ``<stdin>`` again
    and die (``worker processes died 3 times``), as the rank hosts did (tests/test_rank_paths.py)."""
    import subprocess
    import sys

    code = ("from tracekit.scale import engine\n"
            "from tests import unit_hooks\n"
            "got = dict(engine.LocalEngine(jobs=2).map(unit_hooks.polars_threads, [0, 1]))\n"
            "assert sorted(got) == [0, 1], got\n"
            "import __main__\n"
            "assert __main__.__file__ == '<stdin>'\n"  # (given back)
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-"], input=code, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_the_split_skips_only_the_ranks_over_the_budget(job: Path, tmp_path: Path) -> None:
    # units read in bounded memory keep no attribution intervals: the split reads each rank's events again
    ds = dataset.build([str(job)], out=tmp_path / "ds", engine=engine.LocalEngine(jobs=1), budget=1)
    assert not ds.ranks_with("activity")
    counts = ds.rank_event_counts()
    biggest = max(counts, key=counts.__getitem__)
    budget = (counts[biggest] - 1) * analysis.SPLIT_BYTES_PER_EVENT  # every rank fits but the biggest
    assert all(n < counts[biggest] for r, n in counts.items() if r != biggest)
    res = analyse_dataset(ds, memory_budget=budget)
    ref = _reference([str(job)])
    bd, want = pl.from_arrow(res.breakdown), pl.from_arrow(ref.breakdown)
    assert isinstance(bd, pl.DataFrame) and isinstance(want, pl.DataFrame)
    skipped = bd.filter(pl.col("rank") == biggest)
    assert skipped.height and skipped.get_column("transfer_ns").null_count() == skipped.height
    split = want.filter(pl.col("transfer_ns").is_not_null()).get_column("rank").unique().to_list()
    assert set(split) - {biggest}
    for r in set(split) - {biggest}:  # the others split exactly as in memory
        cols = ["start_ns", "wait_ns", "transfer_ns", "exposed_comm_ns"]
        assert bd.filter(pl.col("rank") == r).select(cols).equals(want.filter(pl.col("rank") == r).select(cols))
    assert any(f"rank {biggest} not split into waiting and transfer" in n for n in res.notes)


def test_ranks_split_one_batch_each_as_all_at_once(job: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The exposed-communication split in batches of one rank (each batch takes its ranks' iterations, calls and
    members only) gives the breakdown of one batch of every rank, and of the job in memory."""
    from tracekit.scale import analyse as rank_analyse

    ds = dataset.build([str(job)], out=tmp_path / "ds", engine=engine.LocalEngine(jobs=1))
    assert len(ds.ranks_with("activity")) >= 3  # (split together from their stored intervals)
    whole = analyse_dataset(ds).breakdown
    monkeypatch.setattr(rank_analyse, "SPLIT_BATCH_BYTES", 1)
    one_each = analyse_dataset(ds).breakdown
    assert one_each.equals(whole)
    _assert_same_as_reference(ds, [str(job)])


def test_dask_local_cluster_gives_identical_results(job: Path, tmp_path: Path) -> None:
    local = dataset.build([str(job)], out=tmp_path / "local", engine=engine.LocalEngine(jobs=1))
    dask_engine = engine.DaskEngine(jobs=2, processes=False)
    on_dask = dataset.build([str(job)], out=tmp_path / "dask", engine=dask_engine)
    assert on_dask.manifest["engine"] == "dask" and local.manifest["engine"] == "local"
    for name in ("breakdown", "iterations", "collectives", "topology"):
        assert on_dask.table(name).equals(local.table(name)), name
    assert on_dask.ranks.equals(local.ranks)
    assert on_dask.parts == local.parts
    a = pa.Table.from_batches(list(local.event_batches()))
    b = pa.Table.from_batches(list(on_dask.event_batches()))
    assert a.equals(b)
    _assert_same_as_reference(on_dask, [str(job)])


def test_cli_dask_engine_with_worker_processes(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # what `--engine dask` starts without a scheduler: a LocalCluster of single-threaded worker processes
    assert main(["summary", str(job), "--json", "--engine", "dask", "-j", "1", "--no-cache"]) == 0
    on_dask = json.loads(capsys.readouterr().out)
    assert main(["summary", str(job), "--json", "--engine", "local", "--no-cache"]) == 0
    assert on_dask == json.loads(capsys.readouterr().out)
    assert any("rank by rank" in n for n in on_dask["notes"])
    assert on_dask["bottleneck"] is None  # rank by rank, summary does not replay (whatif and critical-path do)
    assert main(["summary", str(job), "--json", "--no-cache"]) == 0
    in_memory = json.loads(capsys.readouterr().out)
    assert not any("rank by rank" in n for n in in_memory["notes"])
    assert on_dask["collectives"] == in_memory["collectives"] and on_dask["clocks"] == in_memory["clocks"]


def test_bounded_units_give_the_same_dataset(job: Path, tmp_path: Path) -> None:
    ds = dataset.build([str(job)], out=tmp_path / "ds", engine=engine.LocalEngine(jobs=1), budget=1)
    assert all(s["spilled"] for s in ds.summaries if s["format"] == "kineto")
    _assert_same_as_reference(ds, [str(job)])


def test_lazy_scans_and_other_readers(job: Path, tmp_path: Path) -> None:
    ds = dataset.build([str(job)], out=tmp_path / "ds", engine=engine.LocalEngine(jobs=1))
    lf = ds.scan("events")
    assert isinstance(lf, pl.LazyFrame)
    per_rank = lf.group_by("rank").agg(pl.len().alias("n")).sort("rank").collect()
    ranks = pl.from_arrow(ds.ranks.select(["rank", "events"])).sort("rank")
    assert per_rank["n"].to_list() == ranks["events"].to_list()
    assert ds.scan("events").select(schema.EVENTS.names).collect_schema().names() == schema.EVENTS.names
    # DuckDB and pyarrow.dataset read the Hive layout as is
    root = tmp_path / "ds" / "current"
    n = duckdb.sql(f"select count(*) from read_parquet('{root}/rank=*/breakdown.parquet', hive_partitioning=true)"
                   ).fetchall()[0][0]
    assert n == ds.table("breakdown").num_rows
    import pyarrow.dataset as pads

    coll = pads.dataset(str(root), format="parquet", partitioning="hive",
                        exclude_invalid_files=True).to_table(filter=None, columns=["rank"])
    assert coll.num_rows > 0


def test_reused_while_unchanged_rebuilt_when_changed(job: Path, tmp_path: Path, _isolated_cache: Path) -> None:
    first = dataset.build([str(job)], engine=engine.LocalEngine(jobs=1))
    assert not first.reused and first.home is not None and first.home.parent == _isolated_cache / "datasets"
    again = dataset.build([str(job)], engine=engine.LocalEngine(jobs=1))
    assert again.reused and again.root == first.root
    kt.write(job / "a.json", kt.gpu_job(5), rank=0)
    os.utime(job / "a.json", ns=(1, 1))
    changed = dataset.build([str(job)], engine=engine.LocalEngine(jobs=1))
    assert not changed.reused and changed.root != first.root
    assert analyse_dataset(changed).breakdown.num_rows > analyse_dataset(first).breakdown.num_rows
    # a damaged file of a dataset means a rebuild, not a wrong answer
    p = changed.root / "rank=0" / "breakdown.parquet"
    p.write_bytes(p.read_bytes()[:-10] + b"0123456789")
    again = dataset.build([str(job)], engine=engine.LocalEngine(jobs=1))
    assert not again.reused and again.verify()


def test_an_explicit_dataset_is_not_replaced_by_other_inputs(job: Path, tmp_path: Path) -> None:
    out = tmp_path / "ds"
    dataset.build([str(job / "a.json")], out=out, engine=engine.LocalEngine(jobs=1))
    with pytest.raises(TraceError, match="other inputs"):
        dataset.build([str(job)], out=out, engine=engine.LocalEngine(jobs=1))
    ds = dataset.build([str(job)], out=out, engine=engine.LocalEngine(jobs=1), force=True)
    assert ds.ranks.num_rows == 4
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(TraceError, match="not a tracekit dataset"):
        dataset.build([str(job)], out=tmp_path / "mine", engine=engine.LocalEngine(jobs=1))


def test_errors_from_units_name_the_file_on_every_engine(tmp_path: Path) -> None:
    d = tmp_path / "j"
    d.mkdir()
    kt.write(d / "rank0.json", kt.gpu_job(1))
    bad = d / "rank1.json"
    bad.write_bytes(b"hello, not a trace")
    for eng in (engine.LocalEngine(jobs=1), engine.DaskEngine(jobs=1, processes=False)):
        # among other inputs, an unreadable file costs a warning naming it; alone, it is the error
        ds = dataset.build([str(d / "rank0.json"), str(bad)], out=tmp_path / f"o-{eng.name}", engine=eng)
        assert ds.ranks.num_rows == 1
        assert any(d.path == str(bad) and "left out" in d.message for d in ds.diagnostics)
        with pytest.raises(TraceError) as info:
            dataset.build([str(bad)], out=tmp_path / f"p-{eng.name}", engine=eng)
        assert str(bad) in str(info.value)
        assert not (tmp_path / f"p-{eng.name}").exists()


def test_step_marker_and_mixed_ranks(tmp_path: Path) -> None:
    d = tmp_path / "j"
    d.mkdir()
    kt.write(d / "r0.json", kt.gpu_job(2), rank=0)
    kt.write(d / "r1.json", [e for e in kt.gpu_job(2) if not e.name.startswith("ProfilerStep")], rank=1)
    ds = dataset.build([str(d)], out=tmp_path / "a", engine=engine.LocalEngine(jobs=1))
    _assert_same_as_reference(ds, [str(d)])  # rank 1 has no windows, as in the whole-job analysis
    assert set(ds.table("breakdown").column("rank").to_pylist()) == {0}
    ds = dataset.build([str(d)], out=tmp_path / "b", engine=engine.LocalEngine(jobs=1), step_marker="aten::(mm)")
    assert ds.table("iterations").num_rows > 0
    with pytest.raises(TraceError, match="matches no annotation"):
        dataset.build([str(d)], out=tmp_path / "c", engine=engine.LocalEngine(jobs=1), step_marker="nope")


def test_cli_on_a_dask_scheduler(job: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from dask.distributed import LocalCluster

    monkeypatch.setattr(engine, "CONNECT_TIMEOUT", "2s")
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, protocol="tcp",
                      dashboard_address=None) as cluster:
        assert main(["summary", str(job), "--json", "--scheduler", cluster.scheduler_address,
                     "--dataset", str(tmp_path / "ds")]) == 0
    on_dask = json.loads(capsys.readouterr().out)
    assert main(["summary", str(job), "--json", "--engine", "local", "--no-cache"]) == 0
    local = json.loads(capsys.readouterr().out)
    assert on_dask["breakdown"] == local["breakdown"] and on_dask["job"] == local["job"]
    assert main(["summary", str(job), "--scheduler", "tcp://127.0.0.1:1", "--no-cache"]) == 1
    assert "cannot reach the Dask scheduler" in capsys.readouterr().err


def test_no_cache_leaves_no_dataset(job: Path, _isolated_cache: Path, capsys: pytest.CaptureFixture[str],
                                    tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # other tests' temporaries (xdist) are not ours
    before = set(os.listdir(tempfile.gettempdir()))
    assert main(["summary", str(job), "--no-cache"]) == 0
    assert not (_isolated_cache / "datasets").exists()
    leftovers = {n for n in set(os.listdir(tempfile.gettempdir())) - before if n.startswith("tracekit-dataset-")}
    assert not leftovers


BUILD_CHILD = """
import sys
from tracekit.scale import dataset, engine
dataset.build([sys.argv[1]], out=sys.argv[2], engine=engine.LocalEngine(jobs=1), force=True)
"""


def test_killed_build_leaves_the_previous_dataset(tmp_path: Path) -> None:
    d = tmp_path / "j"
    d.mkdir()
    for r in range(6):
        kt.write(d / f"r{r}.json", kt.gpu_job(40), rank=r)
    out = tmp_path / "ds"
    dataset.build([str(d / "r0.json")], out=out, engine=engine.LocalEngine(jobs=1))
    before = dataset.Dataset.open(out)
    assert before is not None
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(BUILD_CHILD), str(d), str(out)], cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while not any((p / ".staging").is_dir() and any((p / ".staging").iterdir())
                      for p in out.glob(".version-*")):
            assert time.monotonic() < deadline and child.poll() is None
            time.sleep(0.005)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    after = dataset.Dataset.open(out)
    assert after is not None and after.verify()
    assert after.manifest["key"] == before.manifest["key"]


def test_sizes_budgets_and_engines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert dataset.parse_size("1G") == 1 << 30 and dataset.parse_size("512MiB") == 512 << 20
    assert dataset.parse_size("2048") == 2048 and dataset.parse_size("1.5k") == 1536
    for bad in ("lots", "-1G", "0"):
        with pytest.raises(TraceError, match="not a size"):
            dataset.parse_size(bad)
    monkeypatch.setenv("TRACEKIT_MEMORY_BUDGET", "3M")
    assert dataset.memory_budget() == 3 << 20 and dataset.memory_budget("1K") == 1024
    p = kt.write(tmp_path / "t.json.gz", kt.gpu_job(2))
    assert dataset.json_bytes(str(p)) == len(kt.write(tmp_path / "t.json", kt.gpu_job(2)).read_bytes())
    assert isinstance(engine.make("dask", jobs=1), engine.DaskEngine)
    assert isinstance(engine.make("local", scheduler="tcp://x:1"), engine.DaskEngine)
    with pytest.raises(TraceError, match="unknown engine"):
        engine.make("spark")


def test_cli_memory_budget_reads_in_bounded_memory(job: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["summary", str(job), "--json", "--memory-budget", "1K", "--dataset", str(tmp_path / "b")]) == 0
    bounded_run = json.loads(capsys.readouterr().out)
    ds = dataset.Dataset.open(tmp_path / "b")
    assert ds is not None and all(s["spilled"] for s in ds.summaries if s["format"] == "kineto")
    # no rank fits 1 KiB: exposed communication stays unsplit, and the notes say which ranks
    assert all(w["wait_ns"] is None and w["transfer_ns"] is None for w in bounded_run["breakdown"])
    assert any("not split into waiting and transfer" in n for n in bounded_run["notes"])
    # the same job read whole, with the split also left out, gives the same figures; its units held each rank's
    # events, so they computed its top ops and idle split there (the bounded ones could not, and say so)
    monkeypatch.setattr(analysis, "SPLIT_BYTES_PER_EVENT", 1 << 40)
    assert main(["summary", str(job), "--json", "--engine", "local", "--no-cache"]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert whole["idle"]["ranks"] and not bounded_run["idle"]["ranks"]
    assert any("top ops and idle split of rank" in n for n in bounded_run["notes"])
    for key in ("top_ops", "idle", "idle_breakdown", "notes"):
        bounded_run.pop(key), whole.pop(key)
    assert bounded_run == whole
    # the export streams every rank's events into one file with the events schema
    out = tmp_path / "ev.parquet"
    assert main(["export", str(job), "--dataset", str(tmp_path / "b"), "-o", str(out), "--table", "events"]) == 0
    import pyarrow.parquet as pq

    t = pq.read_table(out)
    assert t.schema.names == schema.EVENTS.names and t.num_rows == ds.manifest["events"]


def test_a_job_too_big_for_memory_is_analysed_rank_by_rank(job: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    assert dataset.in_memory_need([str(p) for p in job.iterdir()]) > dataset.IN_MEMORY_BASE
    monkeypatch.setattr(dataset, "available_memory", lambda: 1 << 20)
    assert main(["summary", str(job), "--json", "--no-cache"]) == 0
    captured = capsys.readouterr()
    assert "rank by rank" in captured.err and "GiB is available" in captured.err
    assert any("rank by rank" in n for n in json.loads(captured.out)["notes"])
    # the critical path and what-if go rank by rank by themselves too (on the ranks' compact graphs); a Chrome trace
    # needs every event at once and says so
    assert main(["critical-path", str(job), "--json", "--no-cache"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["summary"] and "rank by rank" in captured.err
    assert main(["whatif", str(job), "--json", "--no-cache", "--link-bw", "100gbit"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"]
    out = tmp_path / "merged.json"
    assert main(["export", str(job), "--dataset", str(tmp_path / "ds"), "--chrome", str(out)]) == 1
    assert "Chrome trace needs every event in memory" in capsys.readouterr().err and not out.exists()
