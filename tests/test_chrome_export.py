"""``tracekit export --chrome``: one valid Chrome-trace JSON file (the format Perfetto UI and
chrome://tracing open) with every rank as a process, every lane as a named thread, all on one clock."""

from __future__ import annotations

import dataclasses
import itertools
import json
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

from tracekit.analysis.pipeline import Analysis, analyse
from tracekit.cli import main
from tracekit.loading.traceset import load
from tracekit.views.chrome import Flow, lane_table, write_chrome_trace

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


def test_the_critical_path_becomes_flow_arrows_at_its_hand_overs(tmp_path: Path, sample: Analysis) -> None:
    """``export --chrome`` draws one arrow per hand-over of the critical path: from the last nanosecond of a
    segment to the start of the next one of the same iteration on another lane or rank; an end in a gap
    before its segment's activity (idle, waiting) moves into that activity, so that it binds to its slice."""
    out = tmp_path / "merged.json"
    assert main(["export", SAMPLE, "--chrome", str(out)]) == 0
    doc = _read(out)
    t0 = doc["otherData"]["t0_ns"]
    arrows = [e for e in doc["traceEvents"] if e["ph"] in ("s", "f")]
    starts = {e["id"]: e for e in arrows if e["ph"] == "s"}
    ends = {e["id"]: e for e in arrows if e["ph"] == "f"}
    assert starts and starts.keys() == ends.keys() and len(arrows) == 2 * len(starts)
    assert all(e["cat"] == "critical_path" and e["name"].startswith("critical path: ") for e in arrows)
    assert all(e["bp"] == "e" for e in ends.values())
    tids = {(r["rank"], r["lane"]): r["tid"] for r in lane_table(sample).to_pylist()}
    events = sample.events.select(["start_ns", "dur_ns"]).to_pylist()  # the sample's clock offsets are 0

    def clamp(t: int, row: int | None) -> int:
        if row is None:
            return t
        lo = events[row]["start_ns"]
        return min(max(t, lo), lo + max(events[row]["dur_ns"] - 1, 0))

    segs = sample.critical_path.sort(["iteration", "start_ns"]).to_dicts()
    expected = []
    for a, b in itertools.pairwise(segs):
        if a["iteration"] == b["iteration"] and (a["rank"], a["lane"]) != (b["rank"], b["lane"]):
            s_ns, f_ns = clamp(a["end_ns"] - 1, a["event_row"]), clamp(b["start_ns"], b["event_row"])
            expected.append(((a["rank"], tids[(a["rank"], a["lane"])], Decimal(s_ns - t0) / 1000),
                             (b["rank"], tids[(b["rank"], b["lane"])], Decimal(f_ns - t0) / 1000)))
    got = [((starts[i]["pid"], starts[i]["tid"], starts[i]["ts"]), (ends[i]["pid"], ends[i]["tid"], ends[i]["ts"]))
           for i in sorted(starts)]
    assert got == expected
    assert any(s[0] != f[0] for s, f in got)  # the path crosses ranks (at the all-reduces)
    # every end lies inside a slice of its thread, which is what a viewer binds the arrow to
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] != "iteration"]
    for end in (p for pair in got for p in pair):
        assert any(e["pid"] == end[0] and e["tid"] == end[1] and e["ts"] <= end[2] <= e["ts"] + e["dur"]
                   for e in slices), end
