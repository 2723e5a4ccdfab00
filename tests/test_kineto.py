"""The Kineto parser on every era, on damage, and on the real traces of other projects."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import kineto_traces as kt
from tracekit.model.diagnostics import TraceError
from tracekit.parsers import detect, kineto, parse
from tracekit.parsers.kineto import comms as kineto_comms
from tracekit.parsers.kineto import reader
from tracekit.parsers.kineto.tables import _collective_ids


def _events(parsed) -> pl.DataFrame:
    df = pl.from_arrow(parsed.events)
    return df.with_columns(pl.col("name").cast(pl.String), pl.col("kind").cast(pl.String),
                           pl.col("lane").cast(pl.String))


@pytest.mark.parametrize("era", kt.ERAS)
def test_every_era_gives_back_the_nanoseconds(tmp_path: Path, era: str) -> None:
    evs = kt.gpu_job(2, t0=kt.EPOCH_NS + 123)  # odd ns to catch float round-trips
    path = kt.write(tmp_path / f"{era}.json", evs, era=era)
    parsed = kineto.parse(str(path))
    df = _events(parsed).sort(["start_ns", "name"])
    expect = sorted(((e.start if era not in ("int-us", "2021", "1.9", "legacy-list") else e.start // 1000 * 1000),
                     e.name) for e in evs)
    assert sorted(zip(df["start_ns"].to_list(), df["name"].to_list(), strict=True)) == expect
    kinds = dict(zip(df["name"].to_list(), df["kind"].to_list(), strict=False))
    assert kinds["sgemm_kernel"] == "compute"
    assert kinds["Memcpy DtoH (Device -> Pageable)"] == "memory"
    if era != "legacy-list":  # the legacy list has no categories: CPU entries are all operators
        assert kinds["cudaLaunchKernel"] == "runtime"
    assert kinds["aten::mm"] == "cpu_op"
    assert kinds["ProfilerStep#1"] == "annotation"
    assert "comm" in df["kind"].to_list()
    lanes = set(df["lane"].to_list())
    assert {"gpu0/stream7", "gpu0/stream13"} <= lanes
    assert any(lane.startswith("cpu/tid") for lane in lanes)


def test_fractional_ns_survive_epoch_magnitudes(tmp_path: Path) -> None:
    # near 1.7e15 µs a float64 step is 0.25 µs: every ns here would be lost by a float round-trip
    evs = [kt.Ev(f"op{i}", "cpu_op", kt.EPOCH_NS + i * 1_000_001 + i % 1000, 1001 + i) for i in range(1000)]
    parsed = kineto.parse(str(kt.write(tmp_path / "t.json", evs, era="fraction")))
    df = _events(parsed).sort("start_ns")
    assert df["start_ns"].to_list() == sorted(e.start for e in evs)
    assert df["dur_ns"].to_list() == [e.dur for e in sorted(evs, key=lambda e: e.start)]


def test_base_time_before_and_after_events_agree(tmp_path: Path) -> None:
    evs = kt.gpu_job(1)
    a = kineto.parse(str(kt.write(tmp_path / "a.json", evs, era="relative-before")))
    b = kineto.parse(str(kt.write(tmp_path / "b.json", evs, era="relative-after")))
    assert a.events.column("start_ns").to_pylist() == b.events.column("start_ns").to_pylist()
    assert "before traceEvents" in a.meta["format_version"]
    assert "after traceEvents" in b.meta["format_version"]


@pytest.mark.parametrize("name", [
    "ncclAllReduceRingLLKernel_sum_f16(ncclColl)",
    "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)",
    "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
    "void ncclDevKernel_AllReduce_Sum_bf16_TREE_LL(ncclDevKernelArgsStorage<4096ul>)",
])
def test_nccl_kernels_of_every_naming_era_are_communication(tmp_path: Path, name: str) -> None:
    parsed = kineto.parse(str(kt.write(tmp_path / "t.json", kt.gpu_job(1, nccl_name=name))))
    df = _events(parsed)
    assert df.filter(pl.col("name") == name)["kind"].to_list() == ["comm"]
    coll = pl.from_arrow(parsed.collectives)
    assert coll["op"].to_list() == ["allreduce"]
    assert coll["bytes"].to_list() == [(1 << 20) * 4]


def test_collective_sizes_come_from_the_launching_op_when_kernels_have_no_args(tmp_path: Path) -> None:
    evs = kt.gpu_job(2, with_kernel_args=False,
                     nccl_name="ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)")
    parsed = kineto.parse(str(kt.write(tmp_path / "t.json", evs, era="int-us")))
    coll = pl.from_arrow(parsed.collectives)
    assert coll["op"].to_list() == ["allreduce", "allreduce"]
    assert coll["bytes"].to_list() == [(1 << 20) * 4] * 2
    assert coll["nranks"].to_list() == [2, 2]
    assert coll["pg"].to_list() == ["0", "0"]
    assert coll["count"].to_list() == [1 << 20] * 2
    ev = pl.from_arrow(parsed.events)
    assert ev.filter(pl.col("collective_id").is_not_null()).height == 2


@pytest.mark.parametrize("op,cpu,in_n,out_n,expect_s,expect_count", [
    ("allgather", "nccl:_all_gather_base", 1024, 4096, 4096 * 2, 1024),
    ("reduce_scatter", "nccl:_reduce_scatter_base", 4096, 1024, 4096 * 2, 1024),
    ("broadcast", "nccl:broadcast", 1000, 1000, 2000, 1000),
    ("all_to_all", "nccl:all_to_all", 4096, 4096, 4096 * 2, 1024),
])
def test_bytes_follow_the_nccl_tests_convention(tmp_path: Path, op: str, cpu: str, in_n: int, out_n: int,
                                                expect_s: int, expect_count: int) -> None:
    ms = 1_000_000
    t0 = kt.EPOCH_NS
    evs = [
        kt.Ev("record_param_comms", "cpu_op", t0, ms, args={
            "Collective name": op, "In msg nelems": in_n, "Out msg nelems": out_n, "Group size": 4,
            "dtype": "BFloat16", "Process Group Name": "7"}),
        kt.Ev(cpu, "user_annotation", t0 + 1000, ms // 2),
        kt.Ev("cudaLaunchKernel", "cuda_runtime", t0 + 2000, 1000, args={"correlation": 5}),
        kt.Ev("ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)", "kernel", t0 + ms, ms,
              device=0, stream=20, args={"correlation": 5}),
    ]
    parsed = kineto.parse(str(kt.write(tmp_path / "t.json", evs)))
    row = pl.from_arrow(parsed.collectives).row(0, named=True)
    assert (row["op"], row["bytes"], row["count"], row["nranks"], row["pg"], row["dtype"]) == \
        (op, expect_s, expect_count, 4, "7", "BFloat16")


def test_gloo_work_is_communication_with_sizes_from_input_dims(tmp_path: Path) -> None:
    ms = 1_000_000
    t0 = kt.EPOCH_NS
    evs = [
        kt.Ev("ProfilerStep#3", "user_annotation", t0, 20 * ms, tid=100),
        kt.Ev("aten::mm", "cpu_op", t0 + ms, 5 * ms, tid=100),
        kt.Ev("c10d::allreduce_", "cpu_op", t0 + 6 * ms, ms // 10, tid=100,
              args={"Input Dims": [[[1000]], [], []], "Input type": ["TensorList", "", ""]}),
        kt.Ev("gloo:all_reduce", "user_annotation", t0 + 6 * ms + 500, 8 * ms, tid=101,
              args={"Input Dims": [[1059850]], "Input type": ["float"]}),
        kt.Ev("aten::add_", "cpu_op", t0 + 15 * ms, 2 * ms, tid=100),
    ]
    parsed = kineto.parse(str(kt.write(tmp_path / "t.json", evs, backend="gloo")))
    df = _events(parsed)
    assert df.filter(pl.col("name") == "gloo:all_reduce")["kind"].to_list() == ["comm"]
    coll = pl.from_arrow(parsed.collectives).row(0, named=True)
    assert (coll["op"], coll["bytes"], coll["source"]) == ("allreduce", 1059850 * 4, "gloo")


def test_string_tids_and_pids(tmp_path: Path) -> None:
    evs = kt.gpu_job(1)
    parsed = kineto.parse(str(kt.write(tmp_path / "t.json", evs, era="2021")))
    df = _events(parsed)
    assert df.filter(pl.col("name") == "sgemm_kernel")["lane"].to_list() == ["gpu0/stream7"]
    assert df.filter(pl.col("name") == "aten::mm")["lane"].to_list() == ["cpu/tid 1"]
    # the span's string pid becomes its own lane, not a crash
    extra = [{"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",
              "ts": kt.RawNumber(str(kt.EPOCH_NS // 1000)), "dur": 5}]
    parsed = kineto.parse(str(kt.write(tmp_path / "u.json", evs, era="int-us", extra_events=extra)))
    assert "trace" in _events(parsed)["lane"].to_list()


def test_gzip_is_sniffed_by_content(tmp_path: Path) -> None:
    path = kt.write(tmp_path / "trace.json", kt.gpu_job(1), gz=True)  # gzip without .gz in the name
    assert detect(str(path)).name == "kineto"
    assert kineto.parse(str(path)).events.num_rows == len(kt.gpu_job(1))


def _doc(tmp_path: Path, **kw) -> bytes:
    return kt.write(tmp_path / "full.json", kt.gpu_job(3), **kw).read_bytes()


def test_truncated_trace_keeps_every_complete_event(tmp_path: Path) -> None:
    full = _doc(tmp_path)
    n_full = kineto.parse(str(tmp_path / "full.json")).events.num_rows
    cut = full[: len(full) * 2 // 3]
    p = tmp_path / "cut.json.tmp"
    p.write_bytes(cut)
    parsed = kineto.parse(str(p))
    assert 0 < parsed.events.num_rows < n_full
    assert not parsed.complete
    assert parsed.bytes_lost > 0
    msg = " ".join(str(d) for d in parsed.diagnostics)
    assert "truncated" in msg and str(p) in msg


def test_every_prefix_parses_or_raises_trace_error(tmp_path: Path) -> None:
    full = kt.write(tmp_path / "full.json", kt.gpu_job(1)).read_bytes()
    names_full = sorted(_events(kineto.parse(str(tmp_path / "full.json")))["name"].to_list())
    p = tmp_path / "prefix.json"
    for cut in range(0, len(full), 7):
        p.write_bytes(full[:cut])
        try:
            parsed = kineto.parse(str(p))
        except TraceError as exc:
            assert str(p) in str(exc)
            continue
        names = _events(parsed)["name"].to_list()
        # nothing invented: a prefix yields a sub-multiset of the full events
        for n in set(names):
            assert names.count(n) <= names_full.count(n)


def test_truncated_gzip_keeps_what_inflated(tmp_path: Path) -> None:
    data = gzip.compress(_doc(tmp_path, pretty=True) * 1)
    p = tmp_path / "cut.json.gz"
    p.write_bytes(data[: len(data) * 3 // 4])
    parsed = kineto.parse(str(p))
    assert parsed.events.num_rows > 0
    assert not parsed.complete


@pytest.mark.parametrize("content,message", [
    (b"", "empty"),
    (b"   \n", "empty"),
    (b"hello world", "not a trace"),
    (b'{"foo": 1}', "no traceEvents"),
    (gzip.compress(b"", mtime=0)[:10] + b"garbage garbage", "gzip"),
])
def test_bad_input_is_one_clear_error(tmp_path: Path, content: bytes, message: str) -> None:
    p = tmp_path / "bad.json"
    p.write_bytes(content)
    with pytest.raises(TraceError) as info:
        if content.strip() and content.startswith(b"{"):
            kineto.parse(str(p))
        else:
            parse(str(p))
    text = str(info.value)
    assert str(p) in text and message in text
    assert "\n" not in text


def test_non_finite_numbers_and_unknown_categories(tmp_path: Path) -> None:
    evs = kt.gpu_job(1)
    path = kt.write(tmp_path / "t.json", evs, extra_events=[
        {"ph": "X", "cat": "mystery_cat", "name": "thing", "pid": 1, "tid": 1,
         "ts": kt.RawNumber(str((kt.EPOCH_NS - kt.BASE_NS) // 1000)), "dur": 1}])
    text = path.read_text().replace('"bytes": 4096', '"bytes": 4096, "memory bandwidth (GB/s)": inf')
    text = text.replace('"dur": 500.000', '"dur": nan', 1)
    path.write_text(text)
    parsed = kineto.parse(str(path))
    assert parsed.events.num_rows == len(evs) + 1
    msgs = " ".join(str(d) for d in parsed.diagnostics)
    assert "non-finite" in msgs and "mystery_cat" in msgs


def test_unescaped_quotes_in_names_are_repaired(tmp_path: Path) -> None:
    evs = kt.gpu_job(1)
    path = kt.write(tmp_path / "t.json", evs)
    text = path.read_text().replace('"name": "aten::add"', '"name": "aten::add "quoted" op"')
    path.write_text(text)
    parsed = kineto.parse(str(path))
    names = _events(parsed)["name"].to_list()
    assert 'aten::add "quoted" op' in names
    assert parsed.events.num_rows == len(evs)


def test_legacy_b_e_pairs_are_accepted(tmp_path: Path) -> None:
    t = kt.RawNumber
    extra = [{"ph": "B", "name": "phase", "pid": 4242, "tid": 1, "ts": t("100.5"), "cat": "user_annotation"},
             {"ph": "E", "pid": 4242, "tid": 1, "ts": t("200.5")}]
    parsed = kineto.parse(str(kt.write(tmp_path / "t.json", kt.gpu_job(1), extra_events=extra)))
    row = _events(parsed).filter(pl.col("name") == "phase").row(0, named=True)
    assert row["dur_ns"] == 100_000 and row["start_ns"] == kt.BASE_NS + 100_500


# --- the real traces other projects' jobs wrote -------------------------------------------------


REAL_KINETO = [
    "hta/df_index_resolver/df_index_resolver.json.gz",
    "hta/nccl_parser_config/nccl_data.json.gz",
    "hta/negative_queue_length_values_check/rank0.json.gz",
    "hta/trace_diff/control/control.json.gz",
    "hta/trace_diff/test/test.json.gz",
    "hta/trace_filter/sampled_rank-0.json.gz",
    "hta/trace_filter/sampled_rank-1.json.gz",
    "kineto-legacy/hta_critical_path__cuda_event_sync.json.gz",
    "kineto-legacy/hta_trace_file_list__inference_rank_1.json.gz",
    "kineto-legacy/hta_triton_example.json.gz",
    "kineto-legacy/kineto_tb_plugin_resnet50_worker0_2021-02.pt.trace.json.gz",
]


@pytest.mark.parametrize("rel", REAL_KINETO)
def test_real_traces_parse_and_match_a_plain_json_reading(shared_data: Path, rel: str) -> None:
    path = shared_data / rel
    if not path.exists():
        pytest.skip(f"{rel} absent")
    parsed = kineto.parse(str(path))
    doc = json.loads(gzip.decompress(path.read_bytes()))
    raw = doc["traceEvents"] if isinstance(doc, dict) else doc
    xs = [e for e in raw if e.get("ph") == "X"]
    assert parsed.events.num_rows == len(xs)
    # comm kernels are found in every era's names
    n_nccl = sum(1 for e in xs if e.get("cat") in ("kernel", "Kernel") and "nccl" in e["name"].lower())
    df = _events(parsed)
    assert df.filter(pl.col("kind") == "comm").height == n_nccl + sum(
        1 for e in xs if e.get("cat") in ("user_annotation", "User") and e["name"].startswith("gloo:"))
    # timestamps agree with the text to the microsecond (and exactly for integer files)
    base = doc.get("baseTimeNanoseconds", 0) if isinstance(doc, dict) else 0
    expect = np.sort(np.array([round(float(e["ts"]) * 1000) + base for e in xs], dtype=np.int64))
    got = np.sort(df["start_ns"].to_numpy())
    assert np.abs(got - expect).max() <= 1000


def test_real_collective_metadata(shared_data: Path) -> None:
    parsed = kineto.parse(str(shared_data / "hta/nccl_parser_config/nccl_data.json.gz"))
    coll = pl.from_arrow(parsed.collectives)
    assert coll.height == 21
    assert sorted(set(coll["op"].to_list())) == ["allreduce", "broadcast"]
    assert coll["bytes"].null_count() == 0 and coll["nranks"].to_list() == [2] * 21
    assert parsed.meta["rank"] == 0 and parsed.meta["world_size"] == 2
    assert parsed.meta["format_version"].startswith("relative")


def _split_trace(path: Path, steps: int = 2000) -> Path:
    return kt.write(path, kt.gpu_job(steps), pretty=True)


@pytest.mark.parametrize("workers", [2, 3])
def test_a_big_file_split_across_processes_gives_the_same_tables(tmp_path: Path, workers: int,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    path = _split_trace(tmp_path / "big.json", 1500 * workers)  # parts well over 3 batches each
    monkeypatch.setattr(reader, "SPLIT_MIN_BYTES", path.stat().st_size // 4)
    split = []
    real = reader._parse_split
    monkeypatch.setattr(reader, "_parse_split", lambda *a: split.append(real(*a)) or split[-1])
    one, parts = kineto.parse(str(path)), kineto.parse(str(path), workers=workers, threads=0)
    assert split[0] is not None  # it was split
    for name in ("events", "collectives"):
        assert getattr(parts, name).to_pylist() == getattr(one, name).to_pylist()
        assert getattr(parts, name).schema == getattr(one, name).schema
    assert parts.meta == one.meta
    assert [str(d) for d in parts.diagnostics] == [str(d) for d in one.diagnostics]


@pytest.mark.parametrize("damage", ["cut-in-string", "bad-record", "truncated", "negative-tid"])
def test_a_split_file_that_is_not_clean_is_read_in_one_pass(tmp_path: Path, damage: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = _split_trace(tmp_path / "big.json")
    data = path.read_bytes()
    mid = len(data) // 2
    if damage == "cut-in-string":  # a name around the middle looks like record boundaries throughout
        at = data.index(b'"name": "', mid - 10_000) + 9
        data = data[:at] + b"}, {" * 10_000 + data[at:]
    elif damage == "bad-record":
        at = data.index(b'"ts": ', mid + 1000) + 6
        data = data[:at] + b"nope" + data[at:]
    elif damage == "truncated":
        data = data[: len(data) - 500]
    else:
        data = data.replace(b'"tid": 1,', b'"tid": -1,')
    path.write_bytes(data)
    monkeypatch.setattr(reader, "SPLIT_MIN_BYTES", len(data) // 4)
    monkeypatch.setattr(reader, "SPLIT_START_BYTES", 0)  # the cut falls in the middle, on the damage
    split = []
    real = reader._parse_split
    monkeypatch.setattr(reader, "_parse_split", lambda *a: split.append(real(*a)) or split[-1])
    one, parts = kineto.parse(str(path)), kineto.parse(str(path), workers=2, threads=0)
    assert split == [None]  # fell back to one pass
    assert parts.events.to_pylist() == one.events.to_pylist()
    assert [str(d) for d in parts.diagnostics] == [str(d) for d in one.diagnostics]


@pytest.mark.parametrize("extension", ["0", "1"])
def test_collective_metadata_beyond_a_double_does_not_stop_the_parse(tmp_path: Path, monkeypatch,
                                                                      extension: str) -> None:
    """A number msgspec cannot hold (``1e400``) in the shapes of an event that may carry collective metadata sent
    ``parse`` out with an internal error (the typed path read the shapes after it had taken the batch); now such a
    batch goes the exact way, which reads the number as infinity, and keeps every event."""
    monkeypatch.setenv("TRACEKIT_NO_EXTENSION", extension)
    path = tmp_path / "t.json"
    path.write_text('{"traceEvents":[{"ph":"X","cat":"cpu_op","name":"record_param_comms","pid":1,"tid":1,"ts":1,'
                    '"dur":2,"args":{"Collective name":"allreduce","Input Dims":[[1e400]]}},'
                    '{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":2,"dur":1,'
                    '"args":{"device":0,"stream":7,"correlation":3}}]}')
    parsed = kineto.parse(str(path))
    assert sorted(_events(parsed)["name"].to_list()) == ["k", "record_param_comms"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 60), max_size=40, unique=True), st.booleans(),
       st.lists(st.tuples(st.integers(0, 60), st.integers(0, 999)), min_size=1, max_size=10))
def test_collective_ids_are_those_a_search_per_row_finds(rows: list[int], in_order: bool,
                                                          named: list[tuple[int, int]]) -> None:
    """The events' ``collective_id`` column: one search per collective among rows in file order (as parsed), the
    same as one search per row among the collectives (rows out of order, a position named twice: the first id)."""
    idx = np.array(sorted(rows) if in_order else rows, dtype=np.int64)
    named.sort(key=lambda p: p[0])
    coll_index = np.array([p for p, _ in named], dtype=np.int64)
    coll_ids = np.array([i for _, i in named], dtype=np.int64)
    got = _collective_ids(idx, coll_index, coll_ids)
    got.validate(full=True)
    first = {p: i for p, i in reversed(named)}
    assert got.to_pylist() == [first.get(int(r)) for r in idx]
    assert got.type == pa.int64()


_ARG = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([1.0, 2.5, "1", "2", "x"]),
                 st.lists(st.integers(1, 3), max_size=3))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.fixed_dictionaries({k: _ARG for k in ("collective", "dtype", "in_nelems", "group_size",
                                                          "input_dims", "seq", "dst_rank")}), max_size=12))
def test_collective_args_normalised_once_per_distinct_args_are_normalised_per_row(args: list[dict]) -> None:
    """A job's collectives repeat a few sets of args: normalising each set once gives every row's own fields
    (``True`` and ``1``, ``1`` and ``1.0`` stay apart; unhashable shapes are done per row; ``seq`` is each row's)."""
    def twin_of(v: object) -> object:  # an equal value of another type
        if isinstance(v, bool):
            return int(v)
        if isinstance(v, int) and v in (0, 1):
            return bool(v)
        return int(v) if isinstance(v, float) and v.is_integer() else v

    rows = args + [{k: twin_of(v) for k, v in a.items()} for a in args]
    assert kineto_comms._rows_fields(rows) == [kineto_comms._row_fields(r) for r in rows]
