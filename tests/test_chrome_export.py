"""``tracekit export --chrome``: one valid Chrome-trace JSON file (the format Perfetto UI and
chrome://tracing open) with every rank as a process, every lane as a named thread, all on one clock."""

from __future__ import annotations

import dataclasses
import json
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

from tracekit.analysis import Analysis, analyse
from tracekit.chrome import Flow, lane_table, write_chrome_trace
from tracekit.cli import main
from tracekit.traceset import load

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = str(ROOT / "samples" / "ddp-gloo")


@pytest.fixture(scope="module")
def sample() -> Analysis:
    return analyse(load([SAMPLE], use_cache=False))


def _read(path: Path) -> dict:
    doc = json.loads(path.read_text(), parse_float=Decimal)
    assert isinstance(doc["traceEvents"], list)
    return doc


def test_cli_writes_a_valid_chrome_trace(tmp_path: Path, sample: Analysis) -> None:
    out = tmp_path / "merged.json"
    assert main(["export", SAMPLE, "--chrome", str(out)]) == 0
    doc = _read(out)
    events = doc["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    meta = [e for e in events if e["ph"] == "M"]
    for e in complete:
        assert {"name", "cat", "pid", "tid", "ts", "dur"} <= set(e)
        assert e["ts"] >= 0 and e["dur"] >= 0
    slices = [e for e in complete if e["cat"] != "iteration"]
    assert len(slices) == sample.events.num_rows
    assert len([e for e in complete if e["cat"] == "iteration"]) == sample.iterations.num_rows
    assert {e["pid"] for e in complete} == {0, 1}
    names = {(e["pid"], e["args"]["name"]) for e in meta if e["name"] == "process_name"}
    assert names == {(0, "rank 0 (vm)"), (1, "rank 1 (vm)")}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    lanes = lane_table(sample).to_pylist()
    for row in lanes:
        assert threads[(row["rank"], row["tid"])] == row["lane"]
    assert threads[(0, 0)] == "iterations"
    # one aligned clock, exact to the nanosecond: ts = start - t0 in µs
    t0 = doc["otherData"]["t0_ns"]
    assert min(e["ts"] for e in complete) == 0
    first = sample.events.slice(0, 1).to_pylist()[0]
    tid = next(r["tid"] for r in lanes if r["rank"] == first["rank"] and r["lane"] == first["lane"])
    ts = Decimal(first["start_ns"] - t0) / 1000
    match = [e for e in slices if e["pid"] == first["rank"] and e["tid"] == tid and e["ts"] == ts]
    assert match and match[0]["name"] == first["name"]
    assert main(["export", SAMPLE, "--chrome", str(out)]) == 1  # never over an existing file
    assert main(["export", SAMPLE, "--chrome", str(out), "--force"]) == 0


def test_clock_offsets_align_ranks(tmp_path: Path, sample: Analysis) -> None:
    ranks = sample.ranks
    i = ranks.schema.get_field_index("clock_offset_ns")
    shifted = ranks.set_column(i, ranks.schema.field(i), pa.array([0, 1_000_000_000], pa.int64()))
    moved = dataclasses.replace(sample, ranks=shifted)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_chrome_trace(sample, a)
    write_chrome_trace(moved, b)
    ea = [e for e in _read(a)["traceEvents"] if e["ph"] == "X" and e["pid"] == 1]
    eb = [e for e in _read(b)["traceEvents"] if e["ph"] == "X" and e["pid"] == 1]
    ta = _read(a)["otherData"]["t0_ns"]
    tb = _read(b)["otherData"]["t0_ns"]
    # on the job clock, every event of rank 1 moved by exactly its offset
    assert [e["ts"] * 1000 + ta + 1_000_000_000 for e in ea] == [e["ts"] * 1000 + tb for e in eb]


def test_flows_become_arrow_pairs(tmp_path: Path, sample: Analysis) -> None:
    ev = sample.events.slice(0, 1).to_pylist()[0]
    flows = [Flow(7, "critical path", 0, str(ev["lane"]), ev["start_ns"], 1, "cpu/tid 9659", ev["start_ns"] + 5_000)]
    out = tmp_path / "flows.json"
    write_chrome_trace(sample, out, flows=flows)
    arrows = [e for e in _read(out)["traceEvents"] if e["ph"] in ("s", "f")]
    assert [e["ph"] for e in arrows] == ["s", "f"]
    assert arrows[0]["id"] == arrows[1]["id"] == 7 and arrows[1]["bp"] == "e"
    assert arrows[1]["ts"] - arrows[0]["ts"] == 5
    assert arrows[1]["pid"] == 1


def test_export_needs_an_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", SAMPLE]) == 1
    assert "-o OUT" in capsys.readouterr().err
