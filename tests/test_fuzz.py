"""Hardening: every parser survives mutated input (a CI-sized fuzz budget), adversarial input costs time
linear in its size, decompression is bounded, and every bug the fuzzer found stays fixed.

The long run is ``python benchmarks/fuzz.py --cases N``; both use the registry in ``tests/fuzzing.py``.
"""

from __future__ import annotations

import gzip
import json
import pickle
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import fuzzing
from tests import kineto_traces as kt
from tracekit.analysis.pipeline import analyse
from tracekit.loading.traceset import assemble
from tracekit.model.diagnostics import TraceError
from tracekit.parsers import json_stream, kineto, parse, source
from tracekit.parsers.kineto import reader

ROOT = Path(__file__).resolve().parents[1]
#: hypothesis examples per registered target in CI (the whole module stays well under 30 s)
EXAMPLES = 60


@pytest.mark.parametrize("name", sorted(fuzzing.TARGETS))
def test_mutated_inputs_parse_or_fail_cleanly(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    target = fuzzing.TARGETS[name]
    corpus = target.corpus()
    d = tmp_path_factory.mktemp("fuzz")

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.integers(0, len(corpus) - 1), st.randoms(use_true_random=False))
    def case(i: int, rng) -> None:
        what, data = fuzzing.mutate(corpus[i], rng, target.json_seeds)
        finding = fuzzing.check(target, data, d / "case.json", what)
        assert finding is None, finding.summary() + "\n" + finding.detail

    case()


def test_the_cli_never_shows_a_traceback_on_mutated_input(tmp_path: Path) -> None:
    cases, findings = fuzzing.run(12, seed=7, targets=["any-format"], workdir=tmp_path, analyse=False, cli=True)
    assert cases == 12 and not findings, [f.summary() for f in findings]


# --- bounded time: adversarial shapes cost time linear in their size --------------------------------

_EV = b'{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1.5, "dur": 1}'


def _adversarial(kind: str, n: int) -> bytes:
    """Documents of about ``n`` bytes that once cost quadratic time or unbounded memory."""
    return {
        "leading-whitespace": b" " * n + b'{"traceEvents": [' + _EV + b"]}",
        "huge-element": b'{"traceEvents": [' + _EV[:-1] + b', "x": "' + b"a" * n + b'"}, ' + _EV + b"]}",
        "whitespace-in-array": b'{"traceEvents": [' + b" " * n + _EV + b"]}",
        "tiny-elements": b'{"traceEvents": [' + b"1," * (n // 2) + _EV + b"]}",
        "empty-objects": b'{"traceEvents": [' + b"{}," * (n // 3) + _EV + b"]}",
        "backslashes": b'{"traceEvents": [' + _EV[:-1] + b', "x": "' + b"\\\\" * (n // 2) + b'"}, ' + _EV + b"]}",
        "huge-member": b'{"deviceProperties": "' + b"b" * n + b'", "traceEvents": [' + _EV + b"]}",
        "deep-nesting": b'{"traceEvents": [' + b"[" * (n // 2) + b"]" * (n // 2) + b", " + _EV + b"]}",
        "member-nesting": b'{"x": ' + b"[" * (n // 2) + b"]" * (n // 2) + b', "traceEvents": [' + _EV + b"]}",
    }[kind]


def _cpu_seconds(path: Path) -> float:
    t = time.process_time()
    try:
        parsed = kineto.parse(str(path))
        assert parsed.events.num_rows >= 1
    except TraceError as exc:
        assert str(path) in str(exc)
    return time.process_time() - t


@pytest.mark.parametrize("kind", ["leading-whitespace", "huge-element", "whitespace-in-array", "tiny-elements",
                                  "empty-objects", "backslashes", "huge-member", "deep-nesting", "member-nesting"])
def test_adversarial_input_costs_linear_time(tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # small blocks and batches so that 1 and 4 MiB inputs span many of them (the quadratic cases
    # re-scanned the whole buffer once per block)
    monkeypatch.setattr(source, "BLOCK", 64 << 10)
    monkeypatch.setattr(reader, "Blocks", lambda p: source.Blocks(p, block_size=64 << 10))
    small, big = tmp_path / "small.json", tmp_path / "big.json"
    small.write_bytes(_adversarial(kind, 1 << 20))
    big.write_bytes(_adversarial(kind, 4 << 20))
    _cpu_seconds(small)  # warm-up (imports, caches)
    t_small = max(_cpu_seconds(small), 0.02)
    t_big = _cpu_seconds(big)
    # linear: 4x the input, ~4x the time; quadratic would be 16x. Also an absolute bound per MB.
    assert t_big < 9 * t_small + 0.2, (kind, t_small, t_big)
    assert t_big / 4 < 1.0, (kind, t_big)


def test_records_larger_than_the_limit_are_skipped_not_buffered(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_stream, "MAX_RECORD_BYTES", 1 << 20)
    p = tmp_path / "t.json"
    p.write_bytes(b'{"big": "' + b"m" * (8 << 20) + b'", "traceEvents": [' + _EV + b", " + _EV[:-1]
                  + b', "x": "' + b"e" * (8 << 20) + b'"}, ' + _EV + b"]}")
    parsed = kineto.parse(str(p))
    assert parsed.events.num_rows == 2
    msg = " ".join(str(d) for d in parsed.diagnostics)
    assert "2 records larger than" in msg and str(p) in msg


# --- bounded decompression ---------------------------------------------------------------------------

BOMB = """
import gzip, resource, sys
from tracekit.parsers import kineto, parse, source
from tracekit.model.diagnostics import TraceError
source.MIN_BOUND = 64 << 20
try:
    (kineto.parse if sys.argv[2] == "kineto" else parse)(sys.argv[1])
    print("PARSED")
except TraceError as exc:
    print("ERROR", exc)
# VmHWM, not ru_maxrss: a child spawned (vfork + exec) from a big pytest process inherits its maxrss
try:
    hwm = [line for line in open("/proc/self/status") if line.startswith("VmHWM")][0].split()[1]
except OSError:
    hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print("RSS", int(hwm) // 1024)
"""


@pytest.mark.parametrize("body", ["array", "whitespace", "zeros"])
def test_a_gzip_bomb_is_refused_in_bounded_memory(tmp_path: Path, body: str) -> None:
    # ~300 MB of content in a ~300 KB file (1000x): members of 16 MiB each, beyond the 64 MiB bound
    filler = {"array": b" ", "whitespace": b" ", "zeros": b"\x00"}[body]
    member = gzip.compress(filler * (16 << 20), compresslevel=9)
    head = gzip.compress(b'{"traceEvents": [' if body == "array" else b"")
    p = tmp_path / "bomb.json.gz"
    p.write_bytes(head + member * 20)
    assert p.stat().st_size < 400_000
    # the whitespace bomb goes to the Kineto parser directly: sniffing refuses it at once otherwise
    entry = "kineto" if body == "whitespace" else "any"
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(BOMB), str(p), entry], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    lines = dict(line.split(" ", 1) for line in r.stdout.strip().splitlines())
    assert "ERROR" in lines and str(p) in lines["ERROR"], r.stdout
    if body != "zeros":  # zeros are refused at once as not JSON; the others inflate up to the bound
        assert "refusing to inflate further" in lines["ERROR"]
    assert int(lines["RSS"]) < 450, r.stdout  # MB: the interpreter and libraries take ~200 of it


# --- regressions: one per bug the fuzzer found ---------------------------------------------------------


def _doc(tmp_path: Path, name: str = "t.json", **kw) -> Path:
    return kt.write(tmp_path / name, kt.gpu_job(2), **kw)


def _parse_and_analyse(path: Path):
    parsed = parse(str(path))
    analyse(assemble([parsed]))
    return parsed


def test_invalid_utf8_in_names_is_replaced(tmp_path: Path) -> None:
    p = _doc(tmp_path)
    p.write_bytes(p.read_bytes().replace(b'"aten::mm"', b'"aten::\xc0\xafmm"', 1))
    parsed = _parse_and_analyse(p)
    assert parsed.events.num_rows == len(kt.gpu_job(2))
    assert any("invalid UTF-8" in str(d) for d in parsed.diagnostics)
    assert "aten::\ufffd\ufffdmm" in parsed.events.column("name").to_pylist()


def test_invalid_utf8_in_comm_args_and_members(tmp_path: Path) -> None:
    p = _doc(tmp_path)
    data = p.read_bytes().replace(b'"Process Group Name": "0"', b'"Process Group Name": "\xff0"', 1)
    data = data.replace(b'"backend": "nccl"', b'"backend": "nc\xfecl"')
    p.write_bytes(data)
    parsed = _parse_and_analyse(p)
    assert parsed.collectives.num_rows == 2


def test_lone_surrogate_escapes(tmp_path: Path) -> None:
    p = _doc(tmp_path, extra_events=[{"ph": "B", "name": "\ud800", "pid": 1, "tid": 1, "ts": kt.RawNumber("5")},
                                     {"ph": "E", "pid": 1, "tid": 1, "ts": kt.RawNumber("6")}])
    text = p.read_text()
    assert "\\ud800" in text
    p.write_text(text.replace('"aten::add"', '"aten::add\\udc00"', 1))
    parsed = _parse_and_analyse(p)
    assert parsed.events.num_rows == len(kt.gpu_job(2)) + 1


@pytest.mark.parametrize("where", ["event", "member", "args"])
def test_deep_nesting_is_no_recursion_error(tmp_path: Path, where: str) -> None:
    nest = "[" * 100_000 + "]" * 100_000
    p = _doc(tmp_path)
    text = p.read_text()
    if where == "member":
        text = text.replace('"traceEvents"', f'"deep": {nest}, "traceEvents"', 1)
    elif where == "args":
        text = text.replace('"args": {', f'"args": {{"deep": {nest}, ', 1)
    else:
        text = text.replace('"traceEvents": [', f'"traceEvents": [{nest}, ', 1)
    p.write_text(text)
    parsed = _parse_and_analyse(p)
    assert parsed.events.num_rows >= len(kt.gpu_job(2)) - 1


@pytest.mark.parametrize("field,value", [
    ("ts", "9300000000000000000"),  # fits decimal128(24,3) but not int64 ns: used to wrap silently
    ("ts", "1e400"), ("ts", "1716423E22011000"), ("dur", str(2**100)), ("dur", "1e308"), ("pid", str(2**100)),
    ("tid", "-" + str(2**70)), ("correlation", str(2**64)), ("In msg nelems", str(2**100)),
    ("Group size", str(2**40)), ("baseTimeNanoseconds", str(2**100)), ("rank", str(2**40)),
    ("world_size", "2.5"), ("world_size", str(2**100)),
])
def test_huge_numbers(tmp_path: Path, field: str, value: str) -> None:
    p = _doc(tmp_path)
    text = p.read_text()
    key = f'"{field}": '
    i = text.index(key) + len(key)
    j = i
    while text[j] not in ",}\n":
        j += 1
    p.write_text(text[:i] + value + text[j:])
    parsed = _parse_and_analyse(p)
    start = parsed.events.column("start_ns").to_numpy()
    assert (abs(start) <= reader.MAX_NS).all()
    if field == "ts" and value == "9300000000000000000":
        assert parsed.events.num_rows == len(kt.gpu_job(2)) - 1
        assert any("without a readable timestamp" in str(d) for d in parsed.diagnostics)


@pytest.mark.parametrize("field,value", [
    ("Collective name", 7), ("Collective name", ["allreduce"]), ("Input Dims", [[2**62, 2**62]]),
    ("Input Dims", [[True, 3]]), ("Process Group Name", {"a": 1}), ("dtype", 5), ("Src Rank", 2**40),
])
def test_wrong_types_in_collective_args(tmp_path: Path, field: str, value) -> None:
    evs = kt.gpu_job(2)
    for e in evs:
        if e.name == "record_param_comms":
            e.args[field] = value
    parsed = _parse_and_analyse(kt.write(tmp_path / "t.json", evs))
    assert parsed.collectives.num_rows == 2


@pytest.mark.parametrize("info", [{"rank": "3"}, {"rank": -1}, {"rank": 2**100}, {"rank": True},
                                  {"world_size": [8]}, {"world_size": 1.5}, {"backend": 3},
                                  {"nccl_version": {"x": 1}}, {"pg_count": "many"}])
def test_wrong_types_in_distributed_info(tmp_path: Path, info: dict) -> None:
    p = _doc(tmp_path)
    doc = json.loads(p.read_text())
    doc["distributedInfo"].update(info)
    p.write_text(json.dumps(doc))
    parsed = _parse_and_analyse(p)
    assert parsed.meta["rank"] in (None, 0)


def test_trace_error_survives_pickling() -> None:
    # worker processes (local pool, Dask) send errors back pickled; this used to fail with TypeError
    err = pickle.loads(pickle.dumps(TraceError("a.json", "bad thing", offset=12)))
    assert isinstance(err, TraceError) and str(err) == "a.json: byte 12: bad thing"
    assert (err.path, err.message, err.offset, err.line) == ("a.json", "bad thing", 12, None)


def test_lone_surrogate_in_collective_args(tmp_path: Path) -> None:
    # found by benchmarks/fuzz.py (20 000 cases): polars refused the string when building collectives
    p = _doc(tmp_path)
    p.write_text(p.read_text().replace('"Process Group Name": "0"', '"Process Group Name": "\\ud800"'))
    parsed = _parse_and_analyse(p)
    assert parsed.collectives.column("pg").to_pylist() == ["?", "?"]


def test_records_without_a_comma_between_them(tmp_path: Path) -> None:
    # found by benchmarks/fuzz.py: Arrow read `{...} {...}` as two rows of one line, so rows and lines no
    # longer lined up when fetching a record's collective metadata (IndexError, or another record's args)
    ev = '{"ph": "X", "cat": "cpu_op", "name": "%s", "pid": 1, "tid": 1, "ts": %d, "dur": 1%s}'
    rpc = ev % ("record_param_comms", 3, ', "args": {"Collective name": "allreduce"}')
    p = tmp_path / "t.json"
    p.write_text('{"traceEvents": [' + ev % ("a", 1, "") + " " + ev % ("b", 2, "") + ", " + rpc + "]}")
    parsed = kineto.parse(str(p))
    assert parsed.events.column("name").to_pylist() == ["record_param_comms"]
    assert any("1 unreadable records skipped" in str(d) for d in parsed.diagnostics)


# --- Horovod timelines (found when the Horovod parser joined the registry) ---------------------------


def _horovod_timeline() -> bytes:
    from tests.horovod_timelines import make_timeline

    return make_timeline(era="new", iterations=2, tensors=["a", "b", "c"]).data


def test_horovod_invalid_utf8_is_repaired_and_counted(tmp_path: Path) -> None:
    # a flipped byte inside a tensor name raised UnicodeDecodeError out of the record-by-record decoder
    data = _horovod_timeline()
    i = data.index(b'"name": "') + len(b'"name": "')
    p = tmp_path / "timeline.json"
    p.write_bytes(data[:i] + b"\xaa" + data[i:])
    parsed = parse(str(p))
    assert parsed.format == "horovod" and parsed.events.num_rows > 0
    assert any("invalid UTF-8" in str(d) for d in parsed.diagnostics)


def test_horovod_deep_nesting_is_no_recursion_error(tmp_path: Path) -> None:
    data = _horovod_timeline()
    i = data.index(b"{", 1)
    p = tmp_path / "timeline.json"
    p.write_bytes(data[:i] + b"[" * 100_000 + b"]" * 100_000 + b", " + data[i:])
    try:
        parsed = parse(str(p))
    except TraceError as exc:
        assert str(p) in str(exc)
    else:
        assert parsed.events.num_rows > 0


@pytest.mark.parametrize("value", [str(2**63), str(2**64 + 5), str(-(2**63) - 1)])
def test_horovod_timestamps_beyond_int64(tmp_path: Path, value: str) -> None:
    # the typed decoder gave Python ints that numpy could not hold (OverflowError)
    data = _horovod_timeline().decode()
    i = data.index('"ts": ', data.index('"ph": "B"')) + len('"ts": ')
    j = i + len(data[i:].split(",", 1)[0].split("}", 1)[0])
    p = tmp_path / "timeline.json"
    p.write_text(data[:i] + value + data[j:])
    parsed = parse(str(p))
    assert parsed.format == "horovod"
    assert any("without a usable ts" in str(d) for d in parsed.diagnostics)


@pytest.mark.parametrize("parent", [
    "h:1:1 [0] NCCL INFO comm 0x10 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0\n",  # inferred id
    "h:1:1 [0] NCCL INFO comm 0x10 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE\n",  # synthetic id
])
def test_nccl_split_of_a_parent_without_commid(tmp_path: Path, parent: str) -> None:
    # a spliced 2.27+ split Init line whose parent has no printed commId (a synthetic or inferred id):
    # hashing that id as hex raised ValueError; the child now gets an id of its own kind
    p = tmp_path / "nccl.log"
    p.write_text(parent + "h:1:1 [0] NCCL INFO ncclCommSplit comm 0x20 rank 0 nranks 1 cudaDev 0 nvmlDev 0 busId 1000 "
                 "parent 0x10 splitCount 1 color 0 key 0 - Init COMPLETE\n"
                 "h:1:1 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x1 recvbuff 0x1 count 4 datatype 7 op 0 root 0 "
                 "comm 0x20 [nranks=1] stream 0x3\n")
    parsed = parse(str(p))
    assert parsed.collectives.column("pg").to_pylist() == ["synthetic-n1-0"]
# --- found by the coverage-guided run (benchmarks/fuzz.py with Atheris) --------------------------------


@pytest.mark.parametrize("pg_config", [
    1.5, "0", {"pg_name": "0"}, [1, "a", None],
    [{"pg_name": "0", "ranks": [2**100, True]}, {"pg_name": "1", "ranks": [0, 1]}],
    [{"pg_name": [1], "ranks": [0, 1]}, {"pg_name": "1", "ranks": "0,1"}, {"pg_name": "2", "ranks": [0]}],
])
def test_wrong_types_in_pg_config(tmp_path: Path, pg_config) -> None:
    # distributedInfo.pg_config of 1.5 raised TypeError ('float' object is not iterable) where gloo work is
    # given its process group (parsers/kineto_comms._gloo_groups)
    paths = []
    for r, evs in kt.gloo_job(ranks=2).items():
        p = kt.write(tmp_path / f"rank{r}.json", evs, rank=r, backend="gloo")
        doc = json.loads(p.read_text())
        doc["distributedInfo"]["pg_config"] = pg_config
        p.write_text(json.dumps(doc))
        paths.append(str(p))
    parsed = [parse(p) for p in paths]
    assert all(f.collectives.num_rows == 2 for f in parsed)
    analyse(assemble(parsed))


def _nccl_log(era: str | None, nranks: int, launcher: str | None = None) -> str:
    """A generated NCCL debug log (``era`` None: the newest grammar)."""
    from tests import nccl_logs as nl

    return nl.render(nl.make_job(era or nl.ERAS[-1], nranks=nranks, seed=1), launcher=launcher, timestamps=None,
                     seed=1)


def test_nccl_launcher_prefix_with_multibyte_characters(tmp_path: Path) -> None:
    # nccl-log target: the glued launcher prefix ('[default0]:host:pid:tid') was measured in characters and
    # cut out of the bytes: a multi-byte character cut it short, or mid-character (UnicodeDecodeError in the
    # columnar path; polars panicked on the invalid string later: PanicException, not even an Exception)
    p = tmp_path / "nccl.log"
    p.write_text(_nccl_log("2.12.12", 2, "torchrun").replace("[default", "[日本"))
    parsed = _parse_and_analyse(p)
    assert sorted(parsed.tables["nccl_calls"].column("prefix").unique().to_pylist()) == ["[日本0]:", "[日本1]:"]


def test_nccl_split_of_a_communicator_without_a_logged_id(tmp_path: Path) -> None:
    # nccl-log target: a ncclCommSplit child's id is derived from its parent's commId; a parent without a
    # logged one (a synthetic id) raised ValueError: invalid literal for int() with base 16: 'synthetic-n4-0'
    import re

    p = tmp_path / "nccl.log"
    text = re.sub(r" commId 0x[0-9a-f]+", "", _nccl_log(None, 4))
    assert "ncclCommSplit" in text and "commId" not in text
    p.write_text(text)
    parsed = _parse_and_analyse(p)
    assert set(parsed.tables["nccl_comms"].column("comm_id_source").to_pylist()) == {"synthetic"}


def test_a_rust_panic_is_a_one_line_internal_error(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    # pyo3's PanicException (polars) derives from BaseException: `except Exception` let it through as a
    # Python traceback; the CLI reports it as the internal error it is, in one line
    from tracekit import cli

    class PanicException(BaseException):  # what pyo3_runtime.PanicException is, by name and base
        pass

    def panic(args) -> int:
        raise PanicException("PyObject pointer is null")

    monkeypatch.setattr(cli, "cmd_summary", panic)
    assert cli.main(["summary", str(ROOT / "samples" / "ddp-gloo")]) == cli.EXIT_INTERNAL
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["tracekit: internal error: PanicException: PyObject pointer is null (set TRACEKIT_DEBUG=1 for "
                   "the traceback)"]
    monkeypatch.setattr(cli, "cmd_summary", lambda args: (_ for _ in ()).throw(KeyboardInterrupt()))
    assert cli.main(["summary", str(ROOT / "samples" / "ddp-gloo")]) == 130  # still an interrupt


@pytest.mark.parametrize("field,value", [
    ("nranks 4", "nranks 22222000000000000"), ("rank 1 nranks", "rank 99999999999 nranks"),
    ("localRanks 2", "localRanks 4294967296"),
    (": 3[1] -> 0[0] [send]", ": 77918935315962500[1] -> 0[0] [send]"),  # a transport line's rank
    ("gpu-node-01:48001:48001 [0] NCCL INFO Channel 00/02", "gpu-node-01:" + "4800" + "8" * 70 + ":48001 [0] NCCL "
     "INFO Channel 00/02"),  # an anchor's pid
    ("gpu-node-01:48001:48001 [0] NCCL INFO Channel 00/02", "#  Rank  0 Group  0 Pid  " + "9" * 30 + " on gpu-node-01 "
     "device  0 [0x1b] NVIDIA\ngpu-node-01:48001:48001 [0] NCCL INFO Channel 00/02"),  # nccl-tests' header
])
def test_nccl_numbers_beyond_their_columns(tmp_path: Path, field: str, value: str) -> None:
    # nccl-log target: 'nranks 22222000000000000' (a digit flipped in) reached an int32 column of the
    # nccl_comms table: ArrowInvalid 'too large to fit in C integer type'; likewise a 17-digit rank in a
    # transport line (topology) and a 70-digit pid in an anchor (OverflowError from polars). Such a number
    # is unknown (null), or the line is not an NCCL line
    text = _nccl_log(None, 4)
    assert field in text
    p = tmp_path / "nccl.log"
    p.write_text(text.replace(field, value, 1))
    parsed = _parse_and_analyse(p)
    assert parsed.tables["nccl_comms"].num_rows > 0


def test_horovod_epoch_header_beyond_int64_nanoseconds(tmp_path: Path) -> None:
    # horovod target (Atheris run): an epoch header of 9.5e15 µs is 9.5e18 ns, beyond int64: shifting the
    # timestamps by it raised OverflowError; the header is now ignored with a warning (the clock stays relative)
    p = tmp_path / "timeline.json"
    p.write_bytes(b'[{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": '
                  b'9521860687560103}}, {"name": "process_sort_index", "ph": "M", "pid": 0, "args": {"sort_index": '
                  b'0}}, {"name": "CYCLE_START", \x00\x00"pid": 1, "ph": "i", "ts": 0, "s": "g"}]')
    parsed = _parse_and_analyse(p)
    assert any("epoch header" in str(d) for d in parsed.diagnostics)
