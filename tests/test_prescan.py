"""The prescan (``parsers/_kineto_prescan.c``, :mod:`tracekit.parsers.kineto_prescan`): a file read and scanned ahead
of the parser answers each batch exactly as scanning it would, whatever the prescan guessed, and the tables are those
of a parse without it. Blocks here are a few KB, so that small files are cut into many batches as the parser's 1 MB
blocks cut a big one."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import kineto_traces as kt
from tracekit.parsers import json_stream, kineto, kineto_prescan
from tracekit.parsers.source import Blocks


@pytest.fixture(scope="module")
def native():
    module = kineto_prescan.native_module()
    if module is None or not hasattr(module, "Prescan"):
        pytest.skip("the C extension is not built")  # test_kineto_scan fails instead where it must be built
    return module


def _plain(result):
    """A scan's result with its column views as bytes (comparable)."""
    if isinstance(result, memoryview):
        return result.tobytes()
    if isinstance(result, (tuple, list)):
        return type(result)(_plain(x) for x in result)
    return result


def _batches(path: Path, block: int) -> list[json_stream.Batch]:
    """The batches the parser cuts ``path`` into with blocks and batches of ``block`` bytes."""
    blocks = Blocks(str(path), block_size=block)
    items = json_stream.stream_array(blocks, batch_bytes=block, lazy=True)
    return [b for b in items if isinstance(b, json_stream.Batch)]


def _done(pre: kineto_prescan.Prescan) -> kineto_prescan.Prescan:
    pre._thread.join(timeout=30)
    assert pre.stats()["over"]
    return pre


def _parse(path: Path, monkeypatch: pytest.MonkeyPatch, block: int, prescan=None, **kw):
    with monkeypatch.context() as m:
        m.setattr(kineto, "BATCH_BYTES", block)
        return kineto.parse(str(path), prescan=prescan, **kw)


def _same(a, b) -> None:
    for name in ("events", "collectives"):
        assert getattr(a, name).equals(getattr(b, name)), name
    assert a.meta == b.meta
    assert [str(d) for d in a.diagnostics] == [str(d) for d in b.diagnostics]
    assert (a.complete, a.bytes_lost) == (b.complete, b.bytes_lost)


def _trace(tmp_path: Path, steps: int = 300, **kw) -> Path:
    return kt.write(tmp_path / "t.json", kt.gpu_job(steps), **kw)


# --- batch by batch -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pretty", [True, False])
def test_every_batch_is_answered_as_the_scanner_answers_it(native, tmp_path: Path, pretty: bool) -> None:
    path = _trace(tmp_path, pretty=pretty)
    block = 8 << 10
    batches = _batches(path, block)
    assert len(batches) > 50
    pre = _done(kineto_prescan.Prescan(str(path), native, block=block))
    for b in batches:
        assert _plain(pre.scan(b.offset, b.data)) == _plain(native.scan(b.data))
    stats = pre.stats()
    # the array's first batch (its start is the parser's to find) and its last records (cut exactly) are not
    # prescanned: every other batch is
    assert stats["misses"] <= 3 and stats["hits"] == len(batches) - stats["misses"]
    assert stats["held"] == 0


def test_bytes_that_changed_since_the_prescan_are_scanned_again(native, tmp_path: Path) -> None:
    path = _trace(tmp_path, pretty=False)
    block = 8 << 10
    pre = _done(kineto_prescan.Prescan(str(path), native, block=block))
    data = path.read_bytes()
    at = data.index(b'"dur": ', len(data) // 2) + 7  # one digit of one duration, the batches' bounds unchanged
    path.write_bytes(data[:at] + (b"7" if data[at:at + 1] != b"7" else b"8") + data[at + 1:])
    batches = _batches(path, block)
    answers = [_plain(pre.scan(b.offset, b.data)) for b in batches]
    assert answers == [_plain(native.scan(b.data)) for b in batches]
    assert pre.stats()["misses"] >= 3  # the changed batch is among them


def test_a_batch_asked_for_with_other_bytes_is_scanned_on_the_spot(native, tmp_path: Path) -> None:
    path = _trace(tmp_path, steps=50)
    pre = _done(kineto_prescan.Prescan(str(path), native, block=4096))
    for data in (b"", b"x", b"[", b"[]", b'[{"ph":"X","ts":1,"dur":2}]', b'[{"ph":"X"}'):
        assert _plain(pre.scan(0, data)) == _plain(native.scan(data))


# --- whole parses -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("era", kt.ERAS)
@pytest.mark.parametrize("threads", [0, 1])
def test_a_prescanned_parse_gives_the_same_tables(native, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, era: str,
                                                  threads: int) -> None:
    path = kt.write(tmp_path / "t.json", kt.gpu_job(120), era=era, pretty=era != "fraction")
    block = 4096
    plain = _parse(path, monkeypatch, block)
    pre = kineto_prescan.Prescan(str(path), native, block=block)
    _same(_parse(path, monkeypatch, block, pre, threads=threads), plain)
    pre.close()
    assert pre.stats()["hits"] > 20


def test_records_larger_than_a_block(native, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks with no record boundary inside: the parser cuts where the buffer has one; the prescan follows, or picks
    up again at the next block it can be sure of."""
    events = kt.gpu_job(60)
    for k in range(0, len(events), 7):
        events[k] = dataclasses.replace(events[k], name=events[k].name + "_" + "x" * (3000 + 900 * (k % 5)))
    path = kt.write(tmp_path / "t.json", events)
    block = 2048
    plain = _parse(path, monkeypatch, block)
    pre = kineto_prescan.Prescan(str(path), native, block=block)
    _same(_parse(path, monkeypatch, block, pre, threads=1), plain)
    pre.close()
    assert pre.stats()["hits"] > 0


def test_a_header_of_many_blocks_costs_only_misses(native, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A header spanning blocks, with "}, {" in it: the prescan's first cuts are not the parser's batches; it holds at
    most `ahead` bytes of them and the parser does not wait for it while it is held up."""
    path = tmp_path / "t.json"
    kt.write(path, kt.gpu_job(150), pretty=False)
    doc = json.loads(path.read_bytes())
    doc["deviceProperties"] = [{"id": i, "name": "H100 " + "#" * 50} for i in range(400)]  # ~30 KB of "}, {"
    events = doc.pop("traceEvents")
    path.write_text(json.dumps({**doc, "traceEvents": events}))
    block = 2048
    plain = _parse(path, monkeypatch, block)
    for ahead in (4 * block, 1 << 20):
        pre = kineto_prescan.Prescan(str(path), native, block=block, ahead=ahead)
        time.sleep(0.05)
        _same(_parse(path, monkeypatch, block, pre, threads=1), plain)
        pre.close()
        assert pre.stats()["hits"] > 0


def test_a_prescan_held_up_by_memory_neither_waits_nor_keeps_the_parser_waiting(
        native, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _trace(tmp_path)
    block = 4096
    pre = kineto_prescan.Prescan(str(path), native, block=block, ahead=3 * block)
    deadline = time.monotonic() + 10
    while pre.stats()["held"] < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not pre.stats()["over"]  # waiting for the parser, its memory bounded
    _same(_parse(path, monkeypatch, block, pre, threads=1), _parse(path, monkeypatch, block))
    closed = threading.Thread(target=pre.close)
    closed.start()
    closed.join(timeout=10)
    assert not closed.is_alive() and pre.stats()["over"]


def test_a_cancelled_prescan_leaves_the_parser_to_scan(native, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _trace(tmp_path)
    block = 4096
    pre = kineto_prescan.Prescan(str(path), native, block=block)
    pre.close()
    pre.close()  # twice is harmless
    assert pre.stats()["over"] and pre.stats()["held"] == 0
    _same(_parse(path, monkeypatch, block, pre, threads=1), _parse(path, monkeypatch, block))


def test_a_prescan_of_another_file_or_block_is_not_used(native, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    path = _trace(tmp_path)
    other = kt.write(tmp_path / "other.json", kt.gpu_job(30))
    block = 4096
    plain = _parse(path, monkeypatch, block)
    for pre in (kineto_prescan.Prescan(str(other), native, block=block),
                kineto_prescan.Prescan(str(path), native, block=2 * block)):
        _done(pre)
        _same(_parse(path, monkeypatch, block, pre, threads=1), plain)
        assert pre.stats()["hits"] == pre.stats()["misses"] == 0
        pre.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.integers(1, 40), pretty=st.booleans(), block=st.sampled_from([64, 200, 1024, 3000]),
       spaces=st.sampled_from([b", ", b",\n", b"\n,\n", b" ,\t", b"\r\n,"]))
def test_any_cut_reads_the_same(native, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, steps: int, pretty: bool,
                                block: int, spaces: bytes) -> None:
    """Records split anywhere by blocks of any size, with any JSON whitespace between them."""
    path = kt.write(tmp_path / "t.json", kt.gpu_job(steps), pretty=pretty)
    path.write_bytes(path.read_bytes().replace(b"},\n  {" if pretty else b"}, {", b"}" + spaces + b"{"))
    plain = _parse(path, monkeypatch, block)
    pre = kineto_prescan.Prescan(str(path), native, block=block)
    _same(_parse(path, monkeypatch, block, pre, threads=1), plain)
    pre.close()


# --- which file, and the command ----------------------------------------------------------------------------------


def _sized(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"{" + b" " * (size - 2) + b"}")
    return path


def test_start_takes_the_one_big_plain_file(native, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kineto_prescan, "PRESCAN_MIN_BYTES", 1000)
    big = _sized(tmp_path / "job" / "rank0.json", 5000)
    _sized(tmp_path / "job" / "nccl.log", 100)
    for paths in ([str(big)], [str(tmp_path / "job")]):
        pre = kineto_prescan.start(paths, 2)
        assert pre is not None and pre.is_for(str(big))
        pre.close()
    assert kineto_prescan.start([str(tmp_path / "job")], 1) is None  # one core asked for: no second one to use
    assert kineto_prescan.start([str(tmp_path / "job")], 3) is None  # the file is split across processes instead
    _sized(tmp_path / "job" / "rank1.json", 5000)
    assert kineto_prescan.start([str(tmp_path / "job")], 2) is None  # several ranks: read by worker processes
    gz = tmp_path / "gz" / "rank0.json.gz"
    _sized(gz, 5000)
    gz.write_bytes(b"\x1f\x8b" + gz.read_bytes()[2:])
    assert kineto_prescan.start([str(gz)], 2) is None
    many = tmp_path / "many"
    for k in range(kineto_prescan.PRESCAN_MAX_FILES + 1):
        _sized(many / f"f{k}.json", 10)
    assert kineto_prescan.start([str(many)], 2) is None
    monkeypatch.setenv("TRACEKIT_NO_EXTENSION", "1")
    assert kineto_prescan.start([str(big)], 2) is None


def test_summary_reads_a_big_trace_from_its_prescan(native, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture) -> None:
    """The command starts the prescan before it loads its libraries; its answer is the one without."""
    from tracekit import cli

    path = _trace(tmp_path, steps=400)
    block = 16 << 10
    monkeypatch.setattr(kineto_prescan, "PRESCAN_MIN_BYTES", 1000)
    monkeypatch.setattr(kineto_prescan, "BATCH_BYTES", block)
    monkeypatch.setattr(kineto, "BATCH_BYTES", block)
    started = []
    real_start = kineto_prescan.start
    monkeypatch.setattr(kineto_prescan, "start", lambda *a: started.append(real_start(*a)) or started[-1])
    assert cli.main(["summary", str(path), "--no-cache", "--json", "--jobs", "2"]) == 0
    with_prescan = json.loads(capsys.readouterr().out)
    assert started and started[0] is not None
    stats = started[0].stats()
    assert stats["hits"] > 50 and stats["over"] and stats["held"] == 0
    monkeypatch.setattr(kineto_prescan, "start", lambda *a: None)
    assert cli.main(["summary", str(path), "--no-cache", "--json", "--jobs", "2"]) == 0
    assert json.loads(capsys.readouterr().out) == with_prescan


async def test_inspect_reads_a_prescanned_file(native, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The app hands the prescan to its loading thread, whose parse takes from it; with cached results it is closed
    at once (the traces are cached too)."""
    from tests.test_tui import SIZE, loaded
    from tracekit.tui.app import InspectApp
    from tracekit.tui.data import LoadOptions

    path = _trace(tmp_path, steps=200)
    block = 8 << 10
    monkeypatch.setattr(kineto, "BATCH_BYTES", block)
    options = LoadOptions(use_cache=True, cache_dir=str(tmp_path / "cache"), jobs=2)
    shown = []
    for _ in range(2):
        pre = kineto_prescan.Prescan(str(path), native, block=block)
        app = InspectApp([str(path)], options, prescan=pre)
        async with app.run_test(size=SIZE) as pilot:
            await loaded(pilot)
            assert app.data is not None and app.data.analysis is not None
            shown.append(app.data.analysis.breakdown)
        assert pre.stats()["over"] and pre.stats()["held"] == 0
        shown.append(pre.stats()["hits"])
    assert shown[1] > 20 and shown[3] == 0  # read from it cold; closed unused where the results are cached
    assert shown[0].equals(shown[2])
