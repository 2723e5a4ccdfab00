"""Bounded memory for one huge file: the spilling parser and the batch-by-batch analysis give exactly the
tables of the in-memory path (small blocks, batches and sweep slabs make every test file span many)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tests import kineto_traces as kt
from tracekit.analysis import attribution, iterations
from tracekit.loading import traceset
from tracekit.model.diagnostics import TraceError
from tracekit.parsers import json_stream, kineto, source
from tracekit.parsers.kineto import reader
from tracekit.scale import bounded

REAL = ["hta/df_index_resolver/df_index_resolver.json.gz", "hta/nccl_parser_config/nccl_data.json.gz",
        "hta/trace_diff/control/control.json.gz", "kineto-legacy/hta_triton_example.json.gz",
        "kineto-legacy/kineto_tb_plugin_resnet50_worker0_2021-02.pt.trace.json.gz"]
SAMPLES = Path(__file__).resolve().parents[1] / "samples" / "ddp-gloo"


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_stream, "BATCH_BYTES", 2 << 10)
    monkeypatch.setattr(reader, "Blocks", lambda p: source.Blocks(p, block_size=4 << 10))
    monkeypatch.setattr(bounded, "SLAB", 5)


def _both(path: Path, tmp_path: Path, step_marker: str | None = None):
    mem = kineto.parse(str(path))
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir(exist_ok=True)
    spilled = kineto.parse(str(path), spill_dir=str(spill_dir))
    assert spilled.events_file and Path(spilled.events_file).exists()
    assert not (spill_dir / "raw.arrow").exists()  # the raw spill is gone once the events are built
    ts = traceset.assemble([mem])
    rank = ts.ranks.column("rank")[0].as_py()
    ev, it = iterations.assign(ts.events, step_marker)
    bd = attribution.breakdown(ev, it, ts.collectives)
    got: list[pa.RecordBatch] = []
    it2, bd2 = bounded.analyse(spilled.events_file, rank, ts.collectives, step_marker, got.append)
    return mem, spilled, (ev, it, bd), (pa.Table.from_batches(got, schema=ev.schema), it2, bd2)


def _check(path: Path, tmp_path: Path, step_marker: str | None = None) -> None:
    mem, spilled, (ev, it, bd), (ev2, it2, bd2) = _both(path, tmp_path, step_marker)
    assert spilled.events.equals(mem.events)
    assert spilled.collectives.equals(mem.collectives)
    assert spilled.meta == mem.meta and [str(d) for d in spilled.diagnostics] == [str(d) for d in mem.diagnostics]
    assert it2.equals(it) and bd2.equals(bd) and ev2.equals(ev)


@pytest.mark.parametrize("era", kt.ERAS)
def test_spilled_and_bounded_equal_in_memory_for_every_era(tmp_path: Path, era: str, small_pieces) -> None:
    _check(kt.write(tmp_path / "t.json", kt.gpu_job(4), era=era), tmp_path)


def test_cpu_only_gloo_rank_and_damage(tmp_path: Path, small_pieces) -> None:
    for p in sorted(SAMPLES.glob("*.json.gz")):
        _check(p, tmp_path)
    raw = kt.write(tmp_path / "full.json", kt.gpu_job(5)).read_bytes()
    cut = tmp_path / "cut.json.tmp"
    cut.write_bytes(raw[: len(raw) * 2 // 3])
    _check(cut, tmp_path)


def test_no_steps_and_step_marker(tmp_path: Path, small_pieces) -> None:
    evs = [e for e in kt.gpu_job(3) if not e.name.startswith("ProfilerStep")]
    _check(kt.write(tmp_path / "nosteps.json", evs), tmp_path)  # one whole-trace window
    _check(kt.write(tmp_path / "marker.json", kt.gpu_job(3)), tmp_path, step_marker=r"aten::(mm)")
    with pytest.raises(TraceError, match="matches no annotation"):
        _both(kt.write(tmp_path / "m2.json", kt.gpu_job(1)), tmp_path, step_marker="nothing-like-this")


def test_begin_end_pairs_and_base_range(tmp_path: Path, small_pieces) -> None:
    t = kt.RawNumber
    extra = [{"ph": "B", "name": "phase", "pid": 4242, "tid": 1, "ts": t("100.5"), "cat": "user_annotation"},
             {"ph": "E", "pid": 4242, "tid": 1, "ts": t("200.5")},
             {"ph": "X", "cat": "cpu_op", "name": "far", "pid": 1, "tid": 1, "ts": t("4611686018427387"),
              "dur": 1}]
    _check(kt.write(tmp_path / "t.json", kt.gpu_job(2), extra_events=extra), tmp_path)


@pytest.mark.parametrize("rel", REAL)
def test_real_traces(shared_data: Path, tmp_path: Path, rel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_stream, "BATCH_BYTES", 256 << 10)
    monkeypatch.setattr(reader, "Blocks", lambda p: source.Blocks(p, block_size=256 << 10))
    monkeypatch.setattr(bounded, "SLAB", 97)
    _check(shared_data / rel, tmp_path)


@pytest.mark.parametrize("slab", [1, 2, 3, 50, 10_000])
def test_sweep_in_slabs_equals_one_sweep(slab: int) -> None:
    rng = np.random.default_rng(slab)
    n = 2000
    start = rng.integers(0, 1_000_000, n)
    end = start + rng.integers(0, 50_000, n)
    end[:5] = start[:5] + 900_000  # a few long intervals reaching across many windows
    cls = rng.integers(0, 4, n)
    edges = np.unique(rng.integers(0, 1_100_000, 40))
    w_start, w_end = edges[:-1], edges[1:]
    whole = attribution.window_totals(np.zeros(n, np.int64), start, end, cls, np.zeros(len(w_start), np.int64),
                                      w_start, w_end)
    got = bounded.sweep_in_slabs(start, end, cls, w_start, w_end, slab=slab)
    for k in ("compute", "overlapped", "exposed", "memory"):
        assert np.array_equal(got[k], whole[k]), k
