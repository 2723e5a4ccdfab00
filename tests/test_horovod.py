"""Horovod timeline parser: real files, generated timelines of both writer eras with known truth, every
cut, unsorted records, fusion, odd names, rewrites and bad input."""

from __future__ import annotations

import gzip
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tracekit.model.diagnostics import TraceError
from tracekit.model.schema import COLLECTIVES, EVENTS, ITERATIONS, KINDS, ParsedFile
from tracekit.parsers import horovod
from tracekit.parsers.horovod import reader

from .horovod_timelines import Timeline, loads_records, make_timeline, reference

HOROVOD_FILES = {
    "01": "01_smdebug_horovod_timeline_small_original_2020-05-13.json",
    "02": "02_smdebug_horovod_timeline_small_trimmed_2020-05-28.json",
    "03": "03_smdebug_rewritten_1593673051472361_horovod_timeline.json",
    "04": "04_smdebug_rewritten_1593673051473228_horovod_timeline.json",
}
RECORDED = Path(__file__).parent / "data" / "horovod"


# ---------------------------------------------------------------------------------------------------
# helpers


def write(tmp_path: Path, data: bytes, name: str = "timeline.json") -> str:
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


def parse_bytes(tmp_path: Path, data: bytes, name: str = "timeline.json") -> ParsedFile:
    return horovod.parse(write(tmp_path, data, name))


def observed(pf: ParsedFile) -> dict[str, Any]:
    """The parser's output reduced to comparable Python values."""
    ev = pf.events.to_pydict()
    flags = set(pf.tables["horovod_flags"].column("row").to_pylist())
    inst = pf.tables["horovod_instances"].to_pydict()
    tk = pf.tables["horovod_ticks"].to_pydict()
    return {
        "events": Counter((ev["pid"][i], ev["name"][i], ev["start_ns"][i],
                           ev["start_ns"][i] + ev["dur_ns"][i], i in flags, ev["collective_id"][i])
                          for i in range(len(ev["pid"]))),
        "instances": list(zip(inst["pid"], inst["seq"], inst["phase"], strict=True)),
        "ticks": Counter(zip(tk["tensor"], tk["instance"], tk["rank"], tk["ts_ns"], strict=True)),
        "collective_of": inst["collective_id"],
    }


def expected(records: list[dict[str, Any]], collective_of: list[int | None]) -> dict[str, Any]:
    """What the plain reference reading of ``records`` says, keyed like :func:`observed`."""
    ref = reference(records)
    coll = list(collective_of) + [None] * max(0, len(ref.instances) - len(collective_of))
    return {
        "events": Counter((p, n, s, e, t, coll[i]) for p, n, s, e, t, i in ref.events),
        "instances": ref.instances,
        "ticks": Counter((ref.tensors.get(p), i, r, ts) for p, i, r, ts in ref.ticks),
    }


def assert_matches_reference(pf: ParsedFile, records: list[dict[str, Any]]) -> None:
    got = observed(pf)
    want = expected(records, got["collective_of"])
    assert got["instances"] == want["instances"]
    assert got["events"] == want["events"]
    assert got["ticks"] == want["ticks"]


def assert_schemas(pf: ParsedFile) -> None:
    assert pf.events.schema.equals(EVENTS)
    assert pf.collectives.schema.equals(COLLECTIVES)
    assert pf.tables["horovod_iterations"].schema.equals(ITERATIONS)
    kinds = set(pf.events.column("kind").to_pylist())
    assert kinds <= set(KINDS)


def check_truth(pf: ParsedFile, tl: Timeline) -> None:
    """Compare a parse of an intact generated timeline with what the simulated job did."""
    ns = (tl.epoch_us or 0) * 1000
    inst = pf.tables["horovod_instances"].to_pylist()
    assert len(inst) == len(tl.instances)
    by_key = {(r["pid"], r["seq"]): r for r in inst}
    coll = pf.collectives.to_pylist()
    for t in tl.instances:
        r = by_key[(t.pid, t.seq)]
        assert r["tensor"] == t.tensor
        assert r["lane"] == f"horovod/{t.tensor}"
        assert r["phase"] == t.op
        assert r["op"] == {"REDUCESCATTER": "reduce_scatter",
                           "ALLTOALL": "all_to_all"}.get(t.op, t.op.lower())
        assert r["negotiate_start_ns"] == ns + t.negotiate[0] * 1000
        assert r["negotiate_end_ns"] == ns + t.negotiate[1] * 1000
        assert r["ticks"] == len(t.ticks)
        if len(t.ticks) >= 2:
            assert r["straggler_rank"] == t.ticks[-1][0]
            assert r["negotiation_wait_ns"] == (t.ticks[-1][1] - t.ticks[0][1]) * 1000
            assert r["first_tick_ns"] == ns + t.ticks[0][1] * 1000
            assert r["last_tick_ns"] == ns + t.ticks[-1][1] * 1000
        else:
            assert r["straggler_rank"] is None
        assert r["op_start_ns"] == ns + t.op_span[0] * 1000
        assert r["op_end_ns"] == ns + t.op_span[1] * 1000
        assert r["dtype"] == t.dtype
        assert r["count"] == t.count
        assert r["bytes"] == t.bytes
        assert r["iteration"] == t.iteration
        assert r["truncated"] is False
        tr = t.transfer
        if tr is None:
            assert r["transfer_start_ns"] is None and r["fusion_group"] is None
        else:
            assert (r["transfer_start_ns"], r["transfer_end_ns"]) == (ns + tr[0] * 1000, ns + tr[1] * 1000)
        c = coll[r["collective_id"]]
        assert (c["lane"], c["seq"], c["op"], c["dtype"], c["count"]) == \
            (r["lane"], t.seq, r["op"], t.dtype, t.count)
        assert c["pg"] == "horovod" and c["source"] == "horovod" and c["rank"] == 0
        assert c["nranks"] == tl.ranks
        if t.op == "REDUCESCATTER":
            assert c["bytes"] == (t.bytes * tl.ranks if t.bytes is not None else None)
        else:
            assert c["bytes"] == t.bytes
        want = (ns + tr[0] * 1000, ns + tr[1] * 1000) if tr else (None, None)
        assert (c["start_ns"], c["end_ns"]) == want
    # fused responses share a fusion group, different responses do not
    groups: dict[int, set[int]] = {}
    for t in tl.instances:
        if t.transfer is not None:
            groups.setdefault(t.response, set()).add(by_key[(t.pid, t.seq)]["fusion_group"])
    assert all(len(g) == 1 for g in groups.values())
    assert len({next(iter(g)) for g in groups.values()}) == len(groups)
    # iterations: the k-th round of negotiations starts iteration k
    its = pf.tables["horovod_iterations"].to_pylist()
    n_it = max(t.iteration for t in tl.instances) + 1
    assert [r["iteration"] for r in its] == list(range(n_it))
    for k, r in enumerate(its):
        assert r["start_ns"] == ns + min(t.negotiate[0] for t in tl.instances if t.iteration == k) * 1000
        assert r["method"] == "tensor-repetition"
    assert pf.meta["iteration_method"] == "tensor-repetition"
    assert pf.meta["cycles"] == len(tl.cycles)
    cycles = pf.tables["horovod_cycles"].column("start_ns").to_pylist()
    assert cycles == sorted(ns + c * 1000 for c in tl.cycles)
    # ticks
    seq_of = {r["instance"]: r["seq"] for r in inst}
    tk = Counter((r["tensor"], seq_of[r["instance"]], r["rank"], r["ts_ns"])
                 for r in pf.tables["horovod_ticks"].to_pylist())
    assert tk == Counter((t.tensor, t.seq, rank, ns + ts * 1000)
                         for t in tl.instances for rank, ts in t.ticks)
    # events: every phase once, kinds and bytes
    ev = pf.events.to_pylist()
    assert len(ev) == sum(2 + len(t.phases) for t in tl.instances)
    want = Counter()
    for t in tl.instances:
        want[(f"horovod/{t.tensor}", f"NEGOTIATE_{t.op}", ns + t.negotiate[0] * 1000, "wait", None)] += 1
        want[(f"horovod/{t.tensor}", t.op, ns + t.op_span[0] * 1000, "annotation", t.bytes)] += 1
        for name, s, _ in t.phases:
            kind = horovod.phase_kind(name)
            want[(f"horovod/{t.tensor}", name, ns + s * 1000, kind, t.bytes if kind == "comm" else None)] += 1
    assert Counter((r["lane"], r["name"], r["start_ns"], r["kind"], r["bytes"]) for r in ev) == want
    assert all(r["rank"] == 0 and r["cat"] == "horovod" for r in ev)
    # rows come in batch chunks, each in time order (the table is not sorted as a whole)
    for chunk in pf.events.column("start_ns").chunks:
        starts = chunk.to_pylist()
        assert starts == sorted(starts)


# ---------------------------------------------------------------------------------------------------
# sniffing and vocabulary


def test_sniff_generated_and_foreign() -> None:
    for era in ("new", "old"):
        assert horovod.sniff(make_timeline(era=era).data[:65536])
    assert horovod.sniff(b"[")
    assert horovod.sniff(b"[\n  ")
    assert not horovod.sniff(b"")
    assert not horovod.sniff(b'{"traceEvents": [{"ph": "X", "cat": "kernel"}]}')
    legacy_kineto = b'[{"name": "aten::addmm", "ph": "X", "ts": 1, "dur": 2, "tid": 1, "pid": "CPU"}]'
    assert not horovod.sniff(legacy_kineto)
    assert not horovod.sniff(b'[{"ph": "X", "cat": "cpu_op", "name": "NEGOTIATE_ALLREDUCE"}]')
    assert not horovod.sniff(b"NCCL INFO hello")


def test_phase_kinds() -> None:
    k = horovod.phase_kind
    for name in ("NCCL_ALLREDUCE", "MPI_ADASUM_ALLREDUCE", "GLOO_BCAST", "CCL_ALLTOALL", "NCCL_REDUCE"):
        assert k(name) == "comm"
    for name in ("NEGOTIATE_ALLREDUCE", "WAIT_FOR_DATA", "WAIT_FOR_OTHER_TENSOR_DATA"):
        assert k(name) == "wait"
    assert k("QUEUE") == "queue"
    for name in ("MEMCPY_IN_FUSION_BUFFER", "MEMCPY_OUT_HOST_BUFFER", "COPY_ALLGATHER_OUTPUT"):
        assert k(name) == "memory"
    for name in ("ALLREDUCE", "INIT_NCCL", "INIT_FUSION_BUFFER", "ALLOCATE_OUTPUT", "SOMETHING_NEW"):
        assert k(name) == "annotation"


def test_registered() -> None:
    pytest.importorskip("tracekit.parsers.kineto")  # formats() imports the Kineto parser too
    from tracekit import parsers

    names = [f.name for f in parsers.formats()]
    assert "horovod" in names


# ---------------------------------------------------------------------------------------------------
# real files from ../shared/data/horovod


@pytest.fixture
def real(shared_data: Path) -> Path:
    root = shared_data / "horovod"
    if not root.is_dir():
        pytest.skip("no horovod folder in shared data")
    return root


@pytest.mark.parametrize("key", sorted(HOROVOD_FILES))
def test_real_files_match_reference(real: Path, key: str) -> None:
    path = real / HOROVOD_FILES[key]
    assert horovod.sniff(path.read_bytes()[:65536])
    pf = horovod.parse(str(path))
    assert pf.format == "horovod"
    assert_schemas(pf)
    records = json.loads(path.read_text())
    assert pf.meta["records"] == len(records)
    assert_matches_reference(pf, records)


def test_real_original(real: Path) -> None:
    pf = horovod.parse(str(real / HOROVOD_FILES["01"]))
    m = pf.meta
    assert (m["clock"], m["format_version"], m["tensors"], m["cycles"], m["world_size"]) == \
        ("relative_unknown", "<=0.20.0", 90, 11, 8)
    assert m["dangling"] == 0 and m["e_without_b"] == 0 and pf.complete and pf.bytes_lost == 0
    assert pf.events.num_rows == 108  # 90 negotiations + 2 x (ALLREDUCE + 8 activities)
    coll = pf.collectives.to_pylist()
    assert [(c["op"], c["dtype"], c["count"], c["bytes"]) for c in coll] == \
        [("allreduce", "float32", 10, 40), ("allreduce", "float32", 2560, 10240)]
    # the two tensors were fused into one NCCL_ALLREDUCE
    inst = pf.tables["horovod_instances"].to_pylist()
    assert inst[0]["fusion_group"] == inst[1]["fusion_group"] == 0 and inst[0]["fusion_size"] == 2
    # pid 1: rank 5 was the last of its three ticks (4, 2, 5), 340.901 ms after the first
    assert (inst[0]["ticks"], inst[0]["straggler_rank"]) == (3, 5)
    assert inst[0]["negotiation_wait_ns"] == 340_901_000
    assert inst[0]["first_tick_ns"] == 77575718043_000
    # records are not in time order; no row is invented and times are µs * 1000
    ev = pf.events.to_pylist()
    nccl = [r for r in ev if r["name"] == "NCCL_ALLREDUCE"]
    assert [(r["start_ns"], r["dur_ns"], r["bytes"]) for r in nccl] == \
        [(77576573040_000, 6_000, 40), (77576573041_000, 39_000, 10240)]
    wait = [r["name"] for r in ev if r["kind"] == "wait" and not r["name"].startswith("NEGOTIATE")]
    assert sorted(set(wait)) == ["WAIT_FOR_DATA", "WAIT_FOR_OTHER_TENSOR_DATA"]
    assert pf.meta["iteration_method"] == "whole-trace"  # every tensor negotiated once


def test_real_trimmed_counts_orphans(real: Path) -> None:
    pf = horovod.parse(str(real / HOROVOD_FILES["02"]))
    ref = reference(json.loads((real / HOROVOD_FILES["02"]).read_text()))
    assert pf.meta["x_without_b"] == ref.x_without_b > 0
    assert pf.meta["dangling"] == sum(1 for e in ref.events if e[4]) > 0
    flagged = pf.tables["horovod_flags"].column("row").to_pylist()
    assert len(flagged) == pf.meta["dangling"]
    ends = {r["start_ns"] + r["dur_ns"] for i, r in enumerate(pf.events.to_pylist()) if i in flagged}
    records = json.loads((real / HOROVOD_FILES["02"]).read_text())
    assert ends == {max(r["ts"] for r in records if "ts" in r and r["ph"] != "i") * 1000}
    assert any("outside a NEGOTIATE" in str(d) for d in pf.diagnostics)


def test_real_rewrites(real: Path) -> None:
    pf3 = horovod.parse(str(real / HOROVOD_FILES["03"]))
    assert pf3.meta["clock"] == "epoch" and pf3.meta["start_time_since_epoch_us"] == 1592860687560103
    # a CYCLE_START with a pid (rewrite) is still a cycle marker
    assert pf3.tables["horovod_cycles"].column("start_ns").to_pylist() == [1592860687560103_000]
    assert pf3.events.num_rows == 0
    pf4 = horovod.parse(str(real / HOROVOD_FILES["04"]))
    tk = pf4.tables["horovod_ticks"].to_pylist()
    assert tk and all(t["dur_ignored"] for t in tk)  # bogus durations flagged ...
    assert pf4.meta["bogus_dur"] == len(tk)
    assert any("non-zero dur" in str(d) for d in pf4.diagnostics)
    # ... and never used: a negotiation ends at its E, ticks are instants
    ev = pf4.events.to_pylist()
    assert max(r["dur_ns"] for r in ev) < 10**12
    assert min(r["start_ns"] for r in ev) > 1592860687560103_000
    assert pf4.meta["e_without_b"] == 2


def test_real_cut_mid_record(real: Path, tmp_path: Path) -> None:
    data = (real / HOROVOD_FILES["01"]).read_bytes()
    records = json.loads(data)
    rng = random.Random(5)
    for cut in sorted(rng.sample(range(10, len(data) - 2), 12)):
        pf = parse_bytes(tmp_path, data[:cut])
        text = data[:cut].decode()
        last = text.rfind("}") if text.rstrip().endswith("}") else text.rfind("},")
        complete = text[: last + 1]
        kept = loads_records(complete) if complete.strip("[ \n") else []
        assert pf.meta["records"] == len(kept)
        assert_matches_reference(pf, records[: len(kept)])


# ---------------------------------------------------------------------------------------------------
# generated timelines with known truth


@pytest.mark.parametrize("era", ["new", "old"])
@pytest.mark.parametrize("seed", [None, 3, 11])
def test_generated_truth(tmp_path: Path, era: str, seed: int | None) -> None:
    tl = make_timeline(era=era, interleave_seed=seed, iterations=4, ranks=3)
    pf = parse_bytes(tmp_path, tl.data)
    assert_schemas(pf)
    check_truth(pf, tl)
    assert_matches_reference(pf, tl.records)
    assert pf.complete and pf.bytes_lost == 0 and not pf.diagnostics
    assert pf.meta["clock"] == ("epoch" if era == "new" else "relative_unknown")
    assert pf.meta["format_version"] == (">=0.20.1" if era == "new" else "<=0.20.0")
    assert pf.meta["world_size"] == 3


@pytest.mark.parametrize("era", ["new", "old"])
def test_tiny_batches_and_blocks(tmp_path: Path, era: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Open phases carried across many batches; names and records straddling block ends."""
    tl = make_timeline(era=era, interleave_seed=5, iterations=3, ranks=2,
                       tensors=['a "quoted" name', "b\\back", "plain.c", 'd "}', "e"])
    monkeypatch.setattr(reader, "_BATCH_BYTES", 300)
    monkeypatch.setattr(reader, "_BLOCK_BYTES", 97)
    pf = parse_bytes(tmp_path, tl.data)
    check_truth(pf, tl)
    assert_matches_reference(pf, tl.records)


def test_ops_and_dtypes(tmp_path: Path) -> None:
    ops = ["ALLREDUCE", "ALLGATHER", "BROADCAST", "REDUCESCATTER", "ALLTOALL", "ADASUM", "JOIN", "BARRIER"]
    tl = make_timeline(era="new", tensors=[f"t{i}" for i in range(len(ops))], ops=ops,
                       dtypes=["float32", "uint8", "int16", "float16", "int32", "float64", "int8", "bool"],
                       ranks=4, backend="MPI")
    pf = parse_bytes(tmp_path, tl.data)
    check_truth(pf, tl)
    ops_seen = {c["op"] for c in pf.collectives.to_pylist()}
    assert ops_seen == {"allreduce", "allgather", "broadcast", "reduce_scatter", "all_to_all", "adasum",
                        "join", "barrier"}


def test_cache_hits_have_no_ticks(tmp_path: Path) -> None:
    tl = make_timeline(era="new", iterations=3, cache_hits=True)
    pf = parse_bytes(tmp_path, tl.data)
    inst = pf.tables["horovod_instances"].to_pylist()
    later = [r for r in inst if r["seq"] > 0]
    assert later and all(r["ticks"] == 0 and r["straggler_rank"] is None for r in later)
    assert all(r["ticks"] == 2 for r in inst if r["seq"] == 0)


def test_unknown_dtype_and_failed_op(tmp_path: Path) -> None:
    recs = [
        '{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "bf"}}',
        '{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 10, "pid": 1}',
        '{"ph": "X", "name": "0", "ts": 11, "pid": 1, "dur": 0}',
        '{"ph": "E", "ts": 12, "pid": 1}',
        '{"ph": "B", "name": "ALLREDUCE", "ts": 13, "pid": 1}',
        '{"ph": "B", "name": "NCCL_ALLREDUCE", "ts": 14, "pid": 1}',
        '{"ph": "E", "ts": 20, "pid": 1}',
        '{"ph": "E", "ts": 21, "pid": 1, "args": {"dtype": "<unknown>", "shape": "[4, 4]"}}',
        '{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 30, "pid": 1}',
        '{"ph": "E", "ts": 31, "pid": 1}',
        '{"ph": "B", "name": "ALLREDUCE", "ts": 32, "pid": 1}',
        '{"ph": "E", "ts": 33, "pid": 1}',
        '{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 40, "pid": 1}',
        '{"ph": "E", "ts": 41, "pid": 1}',
        '{"ph": "B", "name": "ERROR", "ts": 42, "pid": 1}',
        '{"ph": "E", "ts": 43, "pid": 1}',
    ]
    pf = parse_bytes(tmp_path, ("[\n" + ",\n".join(recs) + ",\n").encode())
    inst = pf.tables["horovod_instances"].to_pylist()
    assert [(r["seq"], r["op"], r["dtype"], r["count"], r["bytes"]) for r in inst] == [
        (0, "allreduce", "<unknown>", 16, None),
        (1, "allreduce", None, None, None),
        (2, None, None, None, None),
    ]
    assert inst[2]["phase"] == "ERROR"
    assert pf.collectives.num_rows == 2  # no row for the ERROR response
    assert pf.meta["errors"] == 1
    assert [c["start_ns"] for c in pf.collectives.to_pylist()] == [14_000, None]
    assert pf.meta["iteration_method"] == "tensor-repetition"


# ---------------------------------------------------------------------------------------------------
# cuts at every record boundary and inside every record


def _kept_records(tl: Timeline, k: int) -> list[dict[str, Any]]:
    return tl.records[:k]


@pytest.mark.parametrize("era", ["new", "old"])
def test_cut_everywhere(tmp_path: Path, era: str, monkeypatch: pytest.MonkeyPatch) -> None:
    tl = make_timeline(era=era, interleave_seed=2, iterations=2, ranks=2,
                       tensors=["w1", 'odd "name"', "w3"], fuse=2)
    monkeypatch.setattr(reader, "_BATCH_BYTES", 512)
    data = tl.data
    n = len(tl.records)
    for k in range(n + 1):
        end = tl.ends[k - 1] if k else 2  # just after record k-1 ("[\n" before the first)
        cuts = [(end, 0)]
        if k < n:
            s, e = tl.starts[k], tl.ends[k]
            cuts += [(s + 1, 1), ((s + e) // 2, (s + e) // 2 - s), (e - 1, e - 1 - s)]
        for cut, lost in cuts:
            path = write(tmp_path, data[:cut])
            if k == 0:
                with pytest.raises(TraceError) as info:
                    horovod.parse(path)
                assert path in str(info.value)
                continue
            pf = horovod.parse(path)
            assert pf.meta["records"] == k, (k, cut)
            assert_matches_reference(pf, _kept_records(tl, k))
            assert pf.bytes_lost == lost
            if lost:
                assert not pf.complete
                d = [x for x in pf.diagnostics if "cut mid-record" in x.message]
                assert len(d) == 1 and d[0].offset == tl.starts[k]


def test_new_era_is_valid_json_after_every_record() -> None:
    """Sanity check of the generator: Horovod >= 0.20.1 leaves valid JSON after each record."""
    tl = make_timeline(era="new", iterations=1, tensors=["a", "b"])
    for k in range(1, len(tl.records) + 1):
        prefix = tl.data[: tl.ends[k - 1]] + b"]"
        assert len(json.loads(prefix)) == k


# ---------------------------------------------------------------------------------------------------
# names, lenient decoding, gzip


@pytest.mark.parametrize("era", ["new", "old"])
def test_odd_tensor_names(tmp_path: Path, era: str) -> None:
    names = ['grad "quoted" \\ path', "tab\there", "ünïcødé/层", "a}},{b", "x\\", 'end"', "sp ace, {brace}"]
    tl = make_timeline(era=era, tensors=names, interleave_seed=1)
    pf = parse_bytes(tmp_path, tl.data)
    check_truth(pf, tl)
    lanes = set(pf.events.column("lane").to_pylist())
    assert lanes == {f"horovod/{n}" for n in names}
    assert pf.meta["repaired_names"] == 4  # the quote, tab and backslash names; 'a}},{b' is valid JSON
    assert any(d.level == "info" and "escaping" in d.message for d in pf.diagnostics)


def test_escaped_names_from_rewriters_are_not_double_escaped(tmp_path: Path) -> None:
    # keys reordered by a JSON library, as in the sagemaker-debugger rewrites (04)
    recs = [{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": 'a "b" \\ c'}},
            {"name": "NEGOTIATE_ALLREDUCE", "pid": 1, "ph": "B", "ts": 1},
            {"name": "", "pid": 1, "ph": "E", "ts": 2}]
    pf = parse_bytes(tmp_path, json.dumps(recs).encode())
    assert pf.events.column("lane").to_pylist() == ['horovod/a "b" \\ c']
    assert pf.meta["repaired_names"] == 0


def test_lenient_records(tmp_path: Path) -> None:
    """Third-party rewrites: reordered keys, float ts, string pids, null names, missing fields."""
    recs = [
        {"args": {"name": "t"}, "pid": "1", "ph": "M", "name": "process_name"},
        {"ts": 100.5, "ph": "B", "pid": "1", "name": "NEGOTIATE_ALLREDUCE"},
        {"name": 0, "ph": "X", "ts": "101", "pid": 1, "dur": 123456789.0},
        {"ph": "E", "ts": 102, "pid": 1, "name": None},
        {"ph": "B", "name": "ALLREDUCE", "ts": 103, "pid": 1},
        {"ph": "B", "name": "GLOO_ALLREDUCE", "ts": 104, "pid": 1},
        {"ph": "E", "ts": 110.25, "pid": 1},
        {"ph": "E", "ts": 111, "pid": 1, "args": {"dtype": "float32", "shape": "[3]"}},
        {"ph": "B", "name": "QUEUE", "pid": 1},  # no ts: dropped and counted
        {"ph": "B", "name": "QUEUE", "ts": 5},  # no pid
        {"ph": "Z", "name": "weird", "ts": 5, "pid": 1},
        {"ph": "i", "name": "CYCLE_START", "ts": 99, "pid": 3, "s": "g"},
        {"ph": "i", "name": "OTHER", "ts": 99},
        7,
    ]
    pf = parse_bytes(tmp_path, json.dumps(recs).encode())
    ev = {r["name"]: r for r in pf.events.to_pylist()}
    assert ev["NEGOTIATE_ALLREDUCE"]["start_ns"] == 100_500
    assert ev["GLOO_ALLREDUCE"]["dur_ns"] == 6_250
    assert ev["GLOO_ALLREDUCE"]["bytes"] == 12 and ev["GLOO_ALLREDUCE"]["kind"] == "comm"
    tk = pf.tables["horovod_ticks"].to_pylist()
    assert [(t["rank"], t["ts_ns"], t["dur_ignored"], t["instance"]) for t in tk] == [(0, 101_000, True, 0)]
    m = pf.meta
    assert (m["no_ts"], m["no_pid"], m["unknown_ph"], m["unknown_instants"], m["cycles"]) == (1, 1, 1, 1, 1)
    assert m["skipped_records"] == 1


def test_bad_record_in_the_middle(tmp_path: Path) -> None:
    """A record that is not JSON is skipped and reported at its offset; the rest is parsed."""
    tl = make_timeline(era="old", iterations=1, tensors=["a", "b"])
    k = 9
    bad = b'{"ph": "B", "name": X}'
    data = tl.data[: tl.starts[k]] + bad + tl.data[tl.ends[k]:]
    pf = parse_bytes(tmp_path, data)
    assert pf.meta["skipped_records"] == 1
    d = [x for x in pf.diagnostics if "not a JSON object" in x.message]
    assert len(d) == 1 and d[0].offset == tl.starts[k]
    assert_matches_reference(pf, tl.records[:k] + tl.records[k + 1:])


def test_gzip(tmp_path: Path) -> None:
    tl = make_timeline(era="old", interleave_seed=4)
    pf = parse_bytes(tmp_path, gzip.compress(tl.data), "timeline.json.gz")
    check_truth(pf, tl)
    cut = gzip.compress(tl.data)
    pf2 = parse_bytes(tmp_path, cut[: len(cut) // 2], "cut.json.gz")
    assert pf2.meta["records"] < len(tl.records) and not pf2.complete
    assert any("gzip" in d.message for d in pf2.diagnostics)


# ---------------------------------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize("data, message", [
    (b"", "empty"),
    (b"   \n", "empty"),
    (b"[", "no records"),
    (b"[\n", "no records"),
    (b'[\n{"ph": "B", "name": "NEGOTI', "no complete"),
    (b'{"a": 1}', "not a Horovod timeline"),
    (b"hello world", "not a Horovod timeline"),
])
def test_bad_input_raises_trace_error(tmp_path: Path, data: bytes, message: str) -> None:
    path = write(tmp_path, data)
    with pytest.raises(TraceError) as info:
        horovod.parse(path)
    assert message in str(info.value) and path in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError):
        horovod.parse(str(tmp_path / "nope.json"))


def test_header_only_is_an_empty_result(tmp_path: Path) -> None:
    data = (b'[\n{"name": "process_name", "ph": "M", "pid": 0, '
            b'"args": {"start_time_since_epoch_in_micros":5}},\n'
            b'{"name": "process_sort_index", "ph": "M", "pid": 0, "args": {"sort_index": 0}},\n')
    pf = parse_bytes(tmp_path, data)
    assert pf.events.num_rows == 0 and pf.meta["clock"] == "epoch"
    assert pf.tables["horovod_iterations"].num_rows == 0


@pytest.mark.parametrize("era", ["new", "old"])
def test_fuzz_only_trace_errors(tmp_path: Path, era: str) -> None:
    """Random damage never escapes as anything but a TraceError, and never invents records."""
    tl = make_timeline(era=era, iterations=2, tensors=["a", "b", "c"], interleave_seed=9)
    rng = random.Random(42)
    alphabet = b'{}[],:"\\ 0123456789abcXEBM\n'
    for _ in range(300):
        data = bytearray(tl.data)
        for _ in range(rng.randint(1, 4)):
            op = rng.random()
            i = rng.randrange(len(data))
            if op < 0.4:
                data[i] = rng.choice(alphabet)
            elif op < 0.7:
                del data[i : i + rng.randint(1, 20)]
            else:
                data[i:i] = bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 5)))
        try:
            pf = parse_bytes(tmp_path, bytes(data))
        except TraceError:
            continue
        assert pf.meta["records"] <= len(tl.records) + 5
        assert_schemas(pf)


def test_events_table_is_compact(tmp_path: Path) -> None:
    """Null columns share lazily-zeroed buffers; the table still reads as nulls."""
    tl = make_timeline(era="new")
    pf = parse_bytes(tmp_path, tl.data)
    for name in ("tid", "device", "stream", "correlation", "external_id"):
        col = pf.events.column(name)
        assert col.null_count == pf.events.num_rows
    assert pa.Table.from_batches(pf.events.to_batches()).equals(pf.events)


# ---------------------------------------------------------------------------------------------------
# real recordings of Horovod 0.28.1 (committed under tests/data/horovod, see its README)


def _recorded(name: str) -> Path:
    path = RECORDED / name
    if not path.exists():
        pytest.skip(f"{path} missing")
    return path


def _recorded_records(path: Path) -> list[dict[str, Any]]:
    """The records of a recorded timeline; the one unescaped name is escaped the way the parser reads it."""
    text = gzip.decompress(path.read_bytes()).decode()
    odd = 'allreduce.grad "quoted" \\ path'
    text = text.replace(f'"name": "{odd}"}}}}', '"name": ' + json.dumps(odd) + "}}")
    return loads_records(text)


RECORDINGS = [f"timeline_{n}.json.gz" for n in ("gloo_2rank", "gloo_2rank_nocycles", "killed", "nocache",
                                                 "nofusion", "oddname", "with_kineto")]


@pytest.mark.parametrize("name", RECORDINGS)
def test_recorded_match_reference(name: str) -> None:
    path = _recorded(name)
    assert horovod.sniff(gzip.decompress(path.read_bytes())[:65536])
    pf = horovod.parse(str(path))
    assert_schemas(pf)
    records = _recorded_records(path)
    assert pf.meta["records"] == len(records)
    assert_matches_reference(pf, records)
    m = pf.meta
    assert (m["format_version"], m["clock"], m["world_size"]) == (">=0.20.1", "epoch", 2)
    assert m["array_closed"]
    assert pf.bytes_lost == 0 and pf.complete
    # every allreduce of float32 tensors has bytes = 4 x elements; broadcasts log no dtype/shape in 0.28.1
    for c in pf.collectives.to_pylist():
        if c["op"] == "allreduce":
            assert c["dtype"] == "float32" and c["bytes"] == 4 * c["count"]
            assert c["start_ns"] is not None and c["end_ns"] >= c["start_ns"]
        else:
            assert c["op"] == "broadcast" and c["bytes"] is None
    # a job of 20 steps has 20 iterations, found from the 8 gradients that repeat every step
    if name != "timeline_killed.json.gz":
        assert pf.tables["horovod_iterations"].num_rows == 20


@pytest.mark.parametrize("name", RECORDINGS)
def test_recorded_fusion_groups_are_the_fused_responses(name: str) -> None:
    """Horovod writes the transfer-phase B records of one fused response back to back: those runs are the
    fused responses, and fusion_group must find exactly them."""
    path = _recorded(name)
    runs: list[list[int]] = []
    cur: list[int] = []
    for r in _recorded_records(path):
        if r.get("ph") == "i":
            continue
        if r.get("ph") == "B" and r.get("name") == "GLOO_ALLREDUCE":
            cur.append(r["pid"])
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    pf = horovod.parse(str(path))
    sizes: Counter[int] = Counter()
    for r in pf.tables["horovod_instances"].to_pylist():
        if r["op"] == "allreduce" and r["fusion_group"] is not None:
            sizes[r["fusion_group"]] += 1
    assert sorted(Counter(sizes.values()).items()) == sorted(Counter(len(g) for g in runs).items())
    if name == "timeline_nofusion.json.gz":
        assert set(sizes.values()) == {1}


def test_recorded_stragglers_without_cache() -> None:
    """With the response cache off every negotiation has both ticks; the README counts the tick orders."""
    pf = horovod.parse(str(_recorded("timeline_nocache.json.gz")))
    inst = pf.tables["horovod_instances"].to_pylist()
    assert Counter(r["straggler_rank"] for r in inst) == {1: 146, 0: 33}
    assert all(r["ticks"] == 2 and r["negotiation_wait_ns"] >= 0 for r in inst)
    # with the cache on, only the first negotiation of each tensor has ticks
    pf2 = horovod.parse(str(_recorded("timeline_gloo_2rank.json.gz")))
    inst2 = pf2.tables["horovod_instances"].to_pylist()
    assert Counter(r["straggler_rank"] for r in inst2 if r["seq"] == 0) == {1: 11, 0: 16}
    assert all(r["ticks"] == 0 for r in inst2 if r["seq"] > 0)


def test_recorded_killed_and_unbalanced() -> None:
    pf = horovod.parse(str(_recorded("timeline_killed.json.gz")))
    assert pf.meta["dangling"] == 7 and pf.meta["tensors"] == 26
    flagged = set(pf.tables["horovod_flags"].column("row").to_pylist())
    ev = pf.events.to_pylist()
    open_ = [ev[i] for i in sorted(flagged)]
    assert {r["name"] for r in open_} == {"NEGOTIATE_ALLREDUCE"}
    assert {r["pid"] for r in open_} == set(range(19, 26))
    inst = pf.tables["horovod_instances"].to_pylist()
    assert sum(r["truncated"] for r in inst) == 7
    # a clean shutdown can leave a negotiation open too (Horovod drops queued records on shutdown)
    pf2 = horovod.parse(str(_recorded("timeline_with_kineto.json.gz")))
    assert pf2.meta["dangling"] == 1 and pf2.collectives.num_rows == 178


def test_recorded_odd_name() -> None:
    pf = horovod.parse(str(_recorded("timeline_oddname.json.gz")))
    assert pf.meta["repaired_names"] == 1 and pf.meta["tensors"] == 28
    odd = [r for r in pf.tables["horovod_instances"].to_pylist() if r["pid"] == 27]
    assert len(odd) == 20 and {r["tensor"] for r in odd} == {'allreduce.grad "quoted" \\ path'}
    assert {(r["dtype"], r["shape"], r["bytes"], r["fusion_size"]) for r in odd} == \
        {("float32", "[16]", 64, 1)}


def test_recorded_iterations_are_profiler_steps() -> None:
    """Iteration k from tensor repetition holds the allreduces of ProfilerStep#k in the Kineto trace of the
    same run (both clocks are epoch-based: Horovod's header and Kineto's baseTimeNanoseconds)."""
    pf = horovod.parse(str(_recorded("timeline_with_kineto.json.gz")))
    trace = json.loads(gzip.decompress(_recorded("timeline_with_kineto.rank0.pt.trace.json.gz").read_bytes()))
    base = trace["baseTimeNanoseconds"]
    steps = [(int(e["name"].split("#")[1]), base + round(e["ts"] * 1000),
              base + round((e["ts"] + e["dur"]) * 1000))
             for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")]
    assert len(steps) == 18
    ops = [(r["start_ns"], r["iteration"]) for r in pf.events.to_pylist() if r["name"] == "ALLREDUCE"]
    for n, start, end in steps:
        inside = [it for ts, it in ops if start <= ts < end]
        if n < 19:  # the last profiled step's allreduces may run past the step's end
            assert inside == [n] * 8, (n, inside)
