"""The C batch scanner of the Kineto parser (``parsers/kineto/scan.c``): whatever it takes, it reads exactly as the
typed msgspec path (:func:`_consume_typed`) does, and it declines whatever that path declines.

Differential: generated batches, valid and hostile, go through both paths from the same accumulator state; where
the scanner takes a batch the accumulators must be equal afterwards, where it declines its accumulator must be
untouched. Whole files: every trace parses to the same tables with and without the extension, with and without
the scanner threads. ``TRACEKIT_REQUIRE_EXTENSION=1`` (CI) makes a missing extension a failure, not a skip.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import json
import os
import random
import re
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import fuzzing
from tests import kineto_traces as kt
from tests.conftest import shared_data_dir
from tracekit.parsers import kineto
from tracekit.parsers.json_stream import Batch
from tracekit.parsers.kineto import columns as kc
from tracekit.parsers.kineto import reader
from tracekit.parsers.kineto.records import RAW, _Accumulator, native_scan

ROOT = Path(__file__).resolve().parents[1]


def test_the_extension_is_built() -> None:
    try:
        from tracekit.parsers.kineto import scan  # noqa: F401
    except ImportError as exc:
        if os.environ.get("TRACEKIT_REQUIRE_EXTENSION", "0") not in ("", "0"):
            pytest.fail(f"tracekit.parsers.kineto.scan is not built: {exc}")
        pytest.skip(f"the C extension is not built ({exc})")


@pytest.fixture(scope="module")
def scan():
    try:
        from tracekit.parsers.kineto import scan as native
    except ImportError:
        pytest.skip("the C extension is not built")
    return native.scan


def test_the_extension_can_be_turned_off(monkeypatch: pytest.MonkeyPatch, scan) -> None:
    assert native_scan() is scan
    assert _Accumulator("x").scan is scan
    monkeypatch.setenv("TRACEKIT_NO_EXTENSION", "1")
    assert native_scan() is None and _Accumulator("x").scan is None


# --- the differential check -------------------------------------------------------------------------------------

_PREFIX = (b'[{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": 10.5, "dur": 1, '
           b'"args": {"External id": 3}}, {"ph": "X", "cat": "kernel", "name": "nccl:all_reduce", "ts": 11, '
           b'"pid": 0, "tid": 7, "args": {"device": 0, "stream": 7, "correlation": 9}}]')


def _acc(state: int) -> _Accumulator:
    """A fresh accumulator (state 0), one that has read a batch already (1: dictionaries, records and a timestamp
    with a fraction; 2: the same, with has_fraction cleared again)."""
    acc = _Accumulator("test.json")
    acc.scan = None
    if state:
        assert kc._consume_typed(acc, Batch(0, _PREFIX))
        acc.has_fraction = state == 1
    return acc


def _state(acc: _Accumulator) -> tuple:
    table = pa.Table.from_batches(acc.batches, schema=RAW)
    return (table.to_pylist(), acc.cats.values, acc.names.values, acc.comm_rows, acc.meta_records, acc.window_end,
            acc.has_fraction, acc.dropped, acc.n, acc.n_bad, acc.repaired_utf8, acc.repaired_nonfinite, acc.consulted)


_ARROW_TAKES = kc.arrow_takes


@functools.lru_cache(maxsize=4096)
def _arrow_takes(data: bytes) -> bool:
    return _ARROW_TAKES("test.json", Batch(0, data))


def _arrow_takes_once(path: str, batch: Batch) -> bool:
    """:func:`kc.arrow_takes`, asked once per batch text: it reads the batch with Arrow's reader into an accumulator of
    its own, so its answer depends on the bytes alone; both paths of a check (and every check's prefix) ask it of the
    same bytes, and each question costs a 16 MiB reader block. Where and whether the paths ask is theirs, as before."""
    return _arrow_takes(bytes(batch.data))


def _check(scan, data: bytes, state: int = 0) -> tuple[bool, bool]:
    """Both paths on ``data``; returns (typed took it, scanner took it) after checking that they agree."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(kc, "arrow_takes", _arrow_takes_once)
        return _check_paths(scan, data, state)


def _check_paths(scan, data: bytes, state: int) -> tuple[bool, bool]:
    typed = _acc(state)
    took_typed = kc._consume_typed(typed, Batch(0, data))
    scanned = _acc(state)
    before = _state(scanned)
    took_c = kc._consume_scanned(scanned, Batch(0, data), scan(data))
    if took_c:
        assert took_typed, f"the scanner took a batch the typed path refuses: {data!r}"
        assert _state(scanned) == _state(typed), data
        table = pa.Table.from_batches(scanned.batches, schema=RAW)
        assert table.equals(pa.Table.from_batches(typed.batches, schema=RAW)), data
    else:
        assert _state(scanned) == before, f"declined but changed the accumulator: {data!r}"
    return took_typed, took_c


# --- generated batches ------------------------------------------------------------------------------------------

_NAMES = ["aten::mm", "ProfilerStep#1", "", "nccl:all_reduce", "record_param_comms", "gloo:all_reduce",
          "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "c10d::allreduce_",
          "ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)", "Record Window End", "process_name",
          "thread_name", "cudaLaunchKernel", "a\u00e9\u4e2d\U0001f600", "x\ty\n\"q\\", "\x00nul"]
_CATS = ["cpu_op", "kernel", "cuda_runtime", "user_annotation", "gpu_memcpy", "Trace", "ac2g", "Kernel", "python"]
_BAD_STRINGS = [b'"\\ud800"', b'"\\udc00"', b'"\\ud800x"', b'"\\ud800\\u0041"', b'"\\x"', b'"\\u00zz"', b'"a\x01b"',
                b'"\xff"', b'"\xed\xa0\x80"', b'"\xc0\xaf"', b'"\xf4\x90\x80\x80"', b'"\xe2\x82"', b'"a', b"'a'"]
_ODD_STRINGS = [b'"a\\u0062"', b'"\\ud83d\\ude00"', b'"\\n\\t\\/\\\\\\b\\f\\r\\""', b'"caf\xc3\xa9"', b'"\\u0000"',
                b'"nccl\\u003aall_reduce"', b'"Record Window End"', b'"Record Window En\\u0064"']
_NUMBERS = ["0", "-0", "0.0", "-0.0", "1", "-1", "7", "1.5", "-2.25", "10.125", "1.0005", "1.2340", "1e2", "1E+2",
            "1.5e-3", "2.5e0", "1e400", "-1e400", "1e-400", "1.8e308", "01", "1.", ".5", "+1", "--1", "-", "1.0",
            "9223372036854775807", "9223372036854775808", "-9223372036854775808", "-9223372036854775809",
            "18446744073709551616", "4611686018427387.904", "4611686018427387.905", "-4611686018427387.904",
            "-4611686018427387.905", "123456789012345678901", "1234567890123456789012", "999999999999999999999.999",
            "8589934591.999", "8589934592", "-8589934592", "8589934591.9995", "0.0005", "0.0015", "2.0000005",
            "9007199254740993", "900719925474099.3", "0.1234567890123456789", "NaN", "Infinity", "-Infinity",
            "1" * 400, "0." + "0" * 310 + "1", "1" * 25 + ".5"]
_WS = [b"", b"", b" ", b"\n  ", b"\t", b"\r\n", b"  "]
_ID_KEYS = ["External id", "external id", "correlation", "device", "stream", "bytes", "wait_on_stream",
            "wait_on_cuda_event_record_corr_id"]
_COMM_KEYS = ["Collective name", "dtype", "In msg nelems", "Out msg nelems", "In msg size", "Out msg size",
              "Group size", "Process Group Name", "Process Group Description", "Process Group ID",
              "Process Group Ranks", "Seq", "Comms Id", "Rank", "Src Rank", "Dst Rank", "Input Dims", "Input dims",
              "Input type"]


class _Gen:
    """Random batch text: ``bad`` is the chance of each hostile choice (0: only what writers write)."""

    def __init__(self, rng: random.Random, bad: float) -> None:
        self.rng, self.bad = rng, bad

    def hostile(self, scale: float = 1.0) -> bool:
        return self.rng.random() < self.bad * scale

    def number(self) -> bytes:
        rng = self.rng
        if self.hostile(2):
            return rng.choice(_NUMBERS).encode()
        if rng.random() < 0.4:
            return str(rng.randint(-(2**64), 2**64) if self.hostile() else rng.randint(-5, 10**9)).encode()
        whole = rng.choice([0, 1, rng.randint(0, 10**6), rng.randint(0, 10**16), rng.randint(0, 10**21)])
        frac = "".join(rng.choice("0123456789") for _ in range(rng.choice([0, 1, 2, 3, 3, 3, 4, 6])))
        return (("-" if rng.random() < 0.15 else "") + str(whole) + ("." + frac if frac else "")).encode()

    def string(self, pool: list[str]) -> bytes:
        rng = self.rng
        if self.hostile(0.5):
            return rng.choice(_BAD_STRINGS)
        if rng.random() < 0.1:
            return rng.choice(_ODD_STRINGS)
        return json.dumps(rng.choice(pool), ensure_ascii=rng.random() < 0.5).encode()

    def value(self, depth: int = 0) -> bytes:
        rng = self.rng
        r = rng.random()
        if r < 0.15:
            return b"null"
        if r < 0.22:
            return rng.choice([b"tru", b"nul"]) if self.hostile() else rng.choice([b"true", b"false"])
        if r < 0.5:
            return self.number()
        if r < 0.7:
            return self.string(_NAMES)
        if depth > 3 or r < 0.75:
            return b"[" + b"[" * 70 + b"]" * 70 + b"]" if self.hostile(0.5) else b"[]"
        items = [self.value(depth + 1) for _ in range(rng.randint(0, 3))]
        if r < 0.88:
            return b"[" + b",".join(items) + (b"," if self.hostile(0.3) else b"") + b"]"
        keys = [self.string(["a", "b", "name", "Input Dims"]) for _ in items]
        return b"{" + b",".join(k + b":" + v for k, v in zip(keys, items, strict=True)) + b"}"

    def int_value(self) -> bytes:
        rng = self.rng
        if self.hostile(2):
            return self.value() if rng.random() < 0.5 else self.number()
        if rng.random() < 0.2:
            return b"null"
        return str(rng.choice([0, 1, 7, 42, rng.randint(0, 2**40), -1, rng.randint(-(2**63), 2**63 - 1)])).encode()

    def obj(self, members: list[tuple[bytes, bytes]]) -> bytes:
        rng = self.rng
        rng.shuffle(members)
        if members and self.hostile(0.3):  # a duplicate key
            members.append((members[0][0], self.value()))
        ws = rng.choice(_WS)
        body = b"," + ws
        if self.hostile(0.1):
            ws = b"\x0c"  # not JSON whitespace
        return b"{" + ws + body.join(k + ws + b":" + ws + v for k, v in members) + ws + b"}"

    def key(self, name: str) -> bytes:
        if self.hostile(0.1):  # an escaped key naming the same member
            return b'"' + name[:-1].encode() + b"\\u%04x" % ord(name[-1]) + b'"'
        return json.dumps(name).encode()

    def args(self) -> bytes:
        rng = self.rng
        members = []
        for k in rng.sample(_ID_KEYS, rng.randint(0, 4)):
            members.append((self.key(k), self.int_value()))
        for k in rng.sample(["name", "labels"], rng.randint(0, 2)):
            members.append((self.key(k), self.value() if self.hostile() else self.string(_NAMES)))
        for k in rng.sample(_COMM_KEYS, rng.randint(0, 6)):
            members.append((json.dumps(k).encode(), self.value()))
        for k in rng.sample(["Record function id", "Ev Idx", "grid", "Concrete Inputs"], rng.randint(0, 2)):
            members.append((json.dumps(k).encode(), self.value()))
        return self.obj(members)

    def record(self, fraction: bool) -> bytes:
        rng = self.rng
        if self.hostile(0.5):
            ph = rng.choice(["B", "E", "Z", "", "XX", "("])
        else:
            ph = "X" if rng.random() < 0.75 else rng.choice(["M", "M", "i", "i", "s", "f", "C"])
        members: list[tuple[bytes, bytes]] = []
        if not self.hostile(0.1):
            ph_text = rng.choice([b"null", b"1", b'"\\u0058"']) if self.hostile(0.1) else json.dumps(ph).encode()
            members.append((self.key("ph"), ph_text))
        if rng.random() < 0.9:
            members.append((self.key("cat"), self.value() if self.hostile() else self.string(_CATS)))
        if rng.random() < 0.95:
            members.append((self.key("name"), self.value() if self.hostile() else self.string(_NAMES)))
        for k in ("pid", "tid"):
            if rng.random() < 0.9:
                members.append((self.key(k), self.string(["Spans", ""]) if self.hostile() else self.int_value()))
        if rng.random() < 0.95:
            if not self.hostile(3):
                ts = str(rng.randint(0, 10**12)) + (f".{rng.randint(0, 999):03d}" if fraction else "")
                members.append((self.key("ts"), ts.encode()))
            else:
                members.append((self.key("ts"), self.number() if rng.random() < 0.7 else self.value()))
        if rng.random() < 0.9:
            dur = self.number() if self.hostile(3) else f"{rng.randint(0, 10**6)}.{rng.randint(0, 999):03d}".encode()
            members.append((self.key("dur"), self.value() if self.hostile() else dur))
        if rng.random() < 0.85:
            members.append((self.key("args"), self.value() if self.hostile(0.5) else self.args()))
        for k in rng.sample(["id", "bp", "s", "queued"], rng.randint(0, 2)):
            members.append((json.dumps(k).encode(), self.value()))
        return self.obj(members)


def _batch(rng: random.Random) -> bytes:
    g = _Gen(rng, rng.choice([0.0, 0.0, 0.003, 0.01, 0.05]))
    fraction = rng.random() < 0.5
    records = [g.record(fraction) for _ in range(rng.randint(0, 12))]
    ws = rng.choice(_WS)
    data = b"[" + ws + (b"," + ws).join(records) + ws + b"]"
    r = rng.random()
    if r < 0.05 and len(data) > 2:  # damage: a flipped byte, a cut, a trailing comma
        i = rng.randrange(len(data))
        data = data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1 :]
    elif r < 0.07:
        data = data[: rng.randrange(len(data) + 1)]
    elif r < 0.08 and records:
        data = data[:-1] + b",]"
    return data


def test_generated_batches_read_the_same(scan) -> None:
    rng = random.Random(20240611)
    counts = {"typed": 0, "both": 0}
    for i in range(2000):
        data = _batch(rng)
        took_typed, took_c = _check(scan, data, i % 3)
        counts["typed"] += took_typed
        counts["both"] += took_c
    # the check above is not vacuous: the scanner takes most batches the typed path takes
    assert counts["typed"] > 300 and counts["both"] > 0.8 * counts["typed"], counts


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.randoms(use_true_random=False), st.integers(0, 2))
def test_hypothesis_batches_read_the_same(scan, rng: random.Random, state: int) -> None:
    _check(scan, _batch(rng), state)


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200), st.integers(0, 2))
def test_arbitrary_bytes_read_the_same(scan, data: bytes, state: int) -> None:
    _check(scan, data, state)
    _check(scan, b'[{"ph": "X", ' + data + b"}]", state)


_CASES = [
    # taken
    (b"[]", True),
    (b'[{"ph":"X"}]', True),
    (b'[{"ph":"X","ts":null,"dur":null,"cat":null,"name":null,"pid":null,"tid":null,"args":{}}]', True),
    (b'[{"ts":1.5,"cat":"a","ph":"X","name":"b","dur":2,"pid":-0,"tid":3}]', True),
    (b'[{"ph":"X","ts":4611686018427387.904}, {"ph":"X","ts":4611686018427387.905}]', True),
    (b'[{"ph":"X","ts":123456789012345678901,"name":"x"}]', True),
    (b'[{"ph":"X","pid":-3,"tid":-4,"ts":1}]', True),
    (b'[{"ph":"X","dur":-5,"ts":1}, {"ph":"X","dur":8589934591.999,"ts":2}]', True),
    (b'[{"ph":"X","name":"a\\u0000b\\ud83d\\ude00","ts":1,"args":{"name":null,"labels":"l","x":[1e299,{"y":-0}]}}]',
     True),
    (b'[{"ph":"M","name":"process_name","pid":1,"args":{"name":"python"}},{"ph":"i","name":"Record Window End"}]',
     True),
    (b'[{"ph":"X","name":"nccl:all_reduce","ts":1,"args":{"Collective name":"allreduce","In msg nelems":4,'
     b'"Input Dims":[[4]],"Input type":["float"],"dtype":"Float","Group size":2}}]', True),
    (b'[{"ph":"s","x":"\\u0000","pid":"Spans","dur":"1","args":null}]', True),
    # declined: the typed path refuses these
    (b'[{"ph":"B","ts":1}]', False),
    (b'[{"ph":"Z"}]', False),
    (b'[{}]', False),
    (b"[1]", False),
    (b'[{"ph":"X","pid":1.0}]', False),
    (b'[{"ph":"X","pid":9223372036854775808}]', False),
    (b'[{"ph":"X","pid":"1"}]', False),
    (b'[{"ph":"X","args":null}]', False),
    (b'[{"ph":"X","args":{"External id":1.5}}]', False),
    (b'[{"ph":"X","args":{"name":1}}]', False),
    (b'[{"ph":"X","x":"\\ud800"}]', False),
    (b'[{"ph":"X","x":"a\x01"}]', False),
    (b'[{"ph":"X","name":"\xff"}]', False),
    (b'[{"ph":"X","args":{"Collective name":1e400}}]', False),
    (b'[{"ph":"X","dur":1e400}]', False),
    (b'[{"ph":"X","ts":"1"}]', False),
    (b'[{"ph":"X","ts":1.2345}]', False),
    (b'[{"ph":"X","ts":1234567890123456789012}]', False),
    (b'[{"ph":"X","dur":8589934592}]', False),
    (b'[{"ph":"X"},]', False),
    (b'[{"ph":"X"}]\x0c', False),
    (b'[{"ph":"X"}] x', False),
    (b'[{"ph":"M","pid":"a"}]', False),
    (b'[{"ph":"M","args":null}]', False),
    (b'[{"ph":"i","name":1}]', False),
    # declined though the typed path may take them: the scanner is stricter
    (b'[{"ph":"X","ph":"X"}]', False),
    (b'[{"ph":"X","pid":1,"pid":2}]', False),
    (b'[{"p\\u0068":"X"}]', False),
    (b'[{"ph":"\\u0058"}]', False),
    (b'[{"ph":"X","args":{"External\\u0020id":1}}]', False),
    (b'[{"ph":"X","x":"\xff"}]', False),
    (b'[{"ph":"X","ts":1e3}]', False),
    (b'[{"ph":"X","x":' + b"[" * 80 + b"]" * 80 + b"}]", False),
]


@pytest.mark.parametrize(("data", "taken"), _CASES)
def test_cases(scan, data: bytes, taken: bool) -> None:
    for state in (0, 1, 2):
        _, took_c = _check(scan, data, state)
        if state == 1:
            assert took_c == taken, data


_PLACES = [b'[{"ph":"X","ts":1,"cat":%s}]', b'[{"ph":"X","ts":1,"name":%s}]', b'[{"ph":"X","ts":1,"other":%s}]',
           b'[{"ph":"X","ts":1,%s:1}]', b'[{"ph":"X","ts":1,"args":{"name":%s}}]', b'[{"ph":"X","args":{%s:[]}}]',
           b'[{"ph":"X","ts":1,"args":{"Collective name":%s,"In msg nelems":[%s]}}]', b'[{"ph":"s","x":{"y":[%s]}}]',
           b'[{"ph":"M","name":"thread_name","args":{"labels":%s}}]', b'[{"ph":"i","name":%s}]',
           b'[{"ph":"X","name":"nccl:all_reduce","ts":1,"args":{"Input Dims":%s,"Input type":[%s]}}]']


def test_odd_values_in_every_place(scan) -> None:
    for place in _PLACES:
        for text in _BAD_STRINGS + _ODD_STRINGS + [n.encode() for n in _NUMBERS]:
            for state in (0, 1):
                _check(scan, place.replace(b"%s", text), state)


def test_the_check_can_fail(scan) -> None:
    """A scanner that reads one duration differently, or takes a batch the typed path refuses, is caught."""
    data = b'[{"ph":"X","ts":1.5,"dur":2.5,"name":"a"}]'
    wrong = list(scan(data))
    wrong[1] = (wrong[1][0], (int.from_bytes(wrong[1][1], "little") + 1).to_bytes(8, "little"), *wrong[1][2:])
    with pytest.raises(AssertionError):
        _check(lambda _: tuple(wrong), data, 1)
    refused = b'[{"ph":"X","pid":1.0}]'
    with pytest.raises(AssertionError):
        _check(lambda _: scan(b'[{"ph":"X"}]'), refused, 1)


# --- whole files ------------------------------------------------------------------------------------------------


def _traces() -> list[Path]:
    out = sorted(p for p in (ROOT / "tests" / "data").rglob("*.pt.trace.json*"))
    out += sorted((ROOT / "samples").rglob("*.pt.trace.json*"))
    shared = shared_data_dir()
    if shared.is_dir():
        out += sorted(p for p in shared.rglob("*.json*") if "horovod" not in p.parts and p.suffix != ".md")
    return out


def _same(a, b) -> None:
    for name in ("events", "collectives"):
        assert getattr(a, name).equals(getattr(b, name)), name
        assert getattr(a, name).schema == getattr(b, name).schema, name
    assert a.meta == b.meta
    assert [str(d) for d in a.diagnostics] == [str(d) for d in b.diagnostics]
    assert (a.complete, a.bytes_lost) == (b.complete, b.bytes_lost)


def _parse(path: Path, monkeypatch: pytest.MonkeyPatch, native: bool, **kw):
    with monkeypatch.context() as m:
        m.setenv("TRACEKIT_NO_EXTENSION", "0" if native else "1")
        return kineto.parse(str(path), **kw)


def _trace_id(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path.relative_to(shared_data_dir()))


def test_there_are_traces_to_compare() -> None:
    assert _traces()


# one test per trace (about a minute of parsing in all): pytest-xdist spreads them over its workers
@pytest.mark.parametrize("path", _traces(), ids=_trace_id)
def test_every_trace_parses_the_same_with_and_without_the_extension(scan, monkeypatch: pytest.MonkeyPatch,
                                                                    path: Path) -> None:
    plain = _parse(path, monkeypatch, False)
    _same(_parse(path, monkeypatch, True), plain)
    _same(_parse(path, monkeypatch, True, threads=2), plain)


@pytest.mark.parametrize("era", kt.ERAS)
def test_every_era_parses_the_same(scan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, era: str) -> None:
    path = kt.write(tmp_path / "t.json", kt.gpu_job(40), era=era, pretty=era != "fraction")
    plain = _parse(path, monkeypatch, False)
    _same(_parse(path, monkeypatch, True), plain)
    _same(_parse(path, monkeypatch, True, threads=1), plain)


@pytest.fixture(scope="module")
def big_trace(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A pretty-printed trace of several batches (5 MB; its text written once for the module's tests)."""
    return kt.write(tmp_path_factory.mktemp("big") / "big.json", kt.gpu_job(1500), pretty=True).read_bytes()


def _big_trace(path: Path, text: bytes) -> Path:
    path.write_bytes(text)
    return path


def test_a_batch_cut_inside_a_string_is_read_again(scan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   big_trace: bytes) -> None:
    """Reading ahead, the stream went on past a batch cut inside a record; the file is read again without."""
    path = _big_trace(tmp_path / "big.json", big_trace)
    data = path.read_bytes()
    at = data.index(b'"name": "', len(data) // 3) + 9
    path.write_bytes(data[:at] + b"}, {" * 200_000 + data[at:])  # a name that looks like record boundaries
    misread = []
    real = reader._parse_once

    def once(p, spill, threads):
        try:
            return real(p, spill, threads)
        except reader._Misread:
            misread.append(threads)
            raise

    monkeypatch.setattr(reader, "_parse_once", once)
    plain = _parse(path, monkeypatch, False)
    _same(_parse(path, monkeypatch, True, threads=2), plain)
    assert misread == [2]
    _same(_parse(path, monkeypatch, True), plain)


def test_batches_this_thread_scans_while_the_scanner_is_busy_read_the_same(scan, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        big_trace: bytes) -> None:
    """Rather than wait for the scanner thread, the reading thread scans the newest batches still queued for it: the
    tables are those of one thread, whichever thread scanned which batch."""
    import threading
    import time

    from tracekit.parsers.kineto import records as kineto_records

    path = _big_trace(tmp_path / "big.json", big_trace)
    plain = _parse(path, monkeypatch, False)
    real = native_scan()
    assert real is not None
    by: list[str] = []

    def slow_scan(data):  # a scanner thread slower than this one: batches queue up behind it
        name = threading.current_thread().name
        by.append(name)
        if name.startswith("tracekit-scan"):
            time.sleep(0.02)
        return real(data)

    with monkeypatch.context() as m:
        m.setattr(kineto_records, "native_scan", lambda: slow_scan)
        m.setattr(reader, "BATCH_BYTES", 1 << 16)
        _same(_parse(path, monkeypatch, True, threads=1), plain)
    assert len(by) > 8
    assert any(n.startswith("tracekit-scan") for n in by)
    assert by.count(threading.current_thread().name) >= len(by) // 4  # this thread took its share


def test_the_scanner_threads_ask_arrow_about_the_batches(scan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Timestamps written with a '.' but whole µs make each batch's consumption ask whether Arrow's reader takes it
    (:func:`kc.arrow_decides`): asked once a batch, with its scan (on a scanner thread, or on this one where it takes
    a scan over rather than wait), never again by the consumption, and the tables are those of one thread."""
    import threading

    path = kt.write(tmp_path / "t.json", _whole_us(kt.gpu_job(1500)), era="fraction")
    plain = _parse(path, monkeypatch, False)
    asked: list[tuple[str, int]] = []
    real = kc._consume_arrow

    def consume_arrow(acc, batch):
        asked.append((threading.current_thread().name, batch.offset))
        return real(acc, batch)

    with monkeypatch.context() as m:
        m.setattr(kc, "_consume_arrow", consume_arrow)  # where both threads' questions go
        m.setattr(reader, "BATCH_BYTES", 1 << 16)
        _same(_parse(path, monkeypatch, True, threads=1), plain)
    offsets = [o for _, o in asked]
    assert len(offsets) > 10 and len(set(offsets)) == len(offsets), asked
    assert any(n.startswith("tracekit-scan") for n, _ in asked), asked


def test_a_question_to_arrow_that_fails_on_the_scanner_thread_is_asked_again(scan, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The scanner thread asks ahead of the consumption, which may refuse the batch before it would ask: what the
    question raises there is left for the consumption to meet, if it asks at all."""
    path = kt.write(tmp_path / "t.json", _whole_us(kt.gpu_job(300)), era="fraction")
    plain = _parse(path, monkeypatch, False)

    def fails(path, batch):
        raise KeyError("args")

    with monkeypatch.context() as m:
        m.setattr(reader, "arrow_takes", fails)  # the scanner thread's, not the consumption's
        _same(_parse(path, monkeypatch, True, threads=1), plain)


def _whole_us(events: list[kt.Ev]) -> list[kt.Ev]:
    """``events`` moved to whole µs (their timestamps' text still has a '.' in the fraction era: ``123.000``)."""
    return [dataclasses.replace(e, start=e.start - e.start % 1000, dur=e.dur - e.dur % 1000) for e in events]


def _integer_head(path: Path) -> Path:
    """The trace at ``path`` with the first 80 events' timestamps written as integers (their whole µs): the exact path
    sees no '.' in the first 64 X events' timestamps, where later ones may have fractions."""
    text = path.read_text()
    head, tail = text.split('"traceEvents": [', 1)
    stamps = list(re.finditer(r'"ts": (\d+)\.(\d{3})', tail))
    cut = stamps[80].start()
    tail = re.sub(r'"ts": (\d+)\.\d{3}', r'"ts": \1', tail[:cut]) + tail[cut:]
    path.write_text(head + '"traceEvents": [' + tail)
    return path


def _exact_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every batch read the old ways (Arrow's path where it takes the batch, else the exact path)."""
    monkeypatch.setattr(kc, "_consume_scanned", lambda *a, **k: False)
    monkeypatch.setattr(kc, "_consume_typed", lambda *a, **k: False)


def _odd_flow() -> list[dict]:
    """A flow record with a string pid: Arrow's reader declines the batch that holds it (the exact path reads it); the
    typed path and the scanner take it (they read no flow records)."""
    return [{"ph": "f", "cat": "ac2g", "name": "flow", "pid": "a string", "tid": 1,
             "ts": kt.RawNumber(f"{kt.EPOCH_NS // 1000 + 5}.000"), "id": 3}]


#: case -> whether the file reads as having fractions (its era), as the old ways read it
_FRACTION_CASES = {"fractions": True, "whole-us-with-dots": False, "integer-head": True,
                   "conflict-fractions": True, "conflict-whole-us-with-dots": True, "conflict-integer-head": False}


@pytest.mark.parametrize("case", list(_FRACTION_CASES))
@pytest.mark.parametrize("native", [False, True])
def test_arrow_is_asked_only_where_its_answer_changes_what_is_read(scan, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch, case: str,
                                                                    native: bool) -> None:
    """Arrow's reader decides, for a file with no fraction yet, whether it has one (its path: a timestamp that is not
    a whole µs; the exact path's: a '.' among the first 64 X events' timestamps): asked only where the two differ,
    and what is read is the old ways' in every case, whether Arrow's path takes the batch or not."""
    events = _whole_us(kt.gpu_job(40)) if "whole-us" in case else kt.gpu_job(40)
    path = kt.write(tmp_path / "t.json", events, era="fraction",
                    extra_events=_odd_flow() if "conflict" in case else None)
    if "integer-head" in case:
        _integer_head(path)
    asked: list[bool] = []
    real = kc.arrow_takes

    def arrow_takes(p, batch):
        asked.append(True)
        return real(p, batch)

    with monkeypatch.context() as m:
        _exact_only(m)
        old = _parse(path, monkeypatch, native)
    with monkeypatch.context() as m:
        m.setattr(kc, "arrow_takes", arrow_takes)
        m.setattr(reader, "arrow_takes", arrow_takes)
        new = _parse(path, monkeypatch, native)
    _same(new, old)
    assert ("fractional" in new.meta["format_version"]) == _FRACTION_CASES[case]
    # asked where the two rules differ: whole µs written with dots, fractions only after an integer head
    assert bool(asked) == ("whole-us" in case or "integer-head" in case), asked


def test_spilled_and_threaded_reads_are_the_same(scan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 big_trace: bytes) -> None:
    path = _big_trace(tmp_path / "big.json", big_trace)
    plain = _parse(path, monkeypatch, False)
    spill = tmp_path / "spill"
    spill.mkdir()
    spilled = _parse(path, monkeypatch, True, spill_dir=str(spill), threads=1)
    assert spilled.events.to_pylist() == plain.events.to_pylist()


@functools.cache
def _seeds() -> list[bytes]:
    return fuzzing.kineto_seeds()


@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.randoms(use_true_random=False))
def test_mutated_files_parse_the_same_with_threads(scan, tmp_path_factory: pytest.TempPathFactory,
                                                   rng: random.Random) -> None:
    what, data = fuzzing.mutate(rng.choice(_seeds()), rng)
    path = tmp_path_factory.mktemp("mut") / "case.json"
    path.write_bytes(data)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(reader, "BATCH_BYTES", 1 << 10)  # many batches from a small file
        m.setattr(reader, "LOOKAHEAD", 3)
        results = []
        for native, threads in ((False, 0), (True, 0), (True, 2)):
            m.setenv("TRACEKIT_NO_EXTENSION", "0" if native else "1")
            try:
                results.append(kineto.parse(str(path), threads=threads))
            except Exception as exc:  # the same error either way
                results.append(f"{type(exc).__name__}: {exc}")
    for r in results[1:]:
        if isinstance(r, str) or isinstance(results[0], str):
            assert r == results[0], what
        else:
            _same(r, results[0])


def test_gzip_and_legacy_lists_parse_the_same(scan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = kt.write(tmp_path / "t.json", kt.gpu_job(30), era="legacy-list")
    gz = tmp_path / "t.json.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    for p in (path, gz):
        _same(_parse(p, monkeypatch, True, threads=1), _parse(p, monkeypatch, False))
