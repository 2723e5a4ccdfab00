"""The streaming splitter: same elements as a plain decode, whatever the block size or cut."""

from __future__ import annotations

import json

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.parsers import json_stream as js

EVENTS = [{"ph": "X", "name": f'a{i} "q" \\ [{{,', "args": {"x": [1, {"y": "]"}]}} for i in range(20)]
DOC = json.dumps({"schemaVersion": 1, "deviceProperties": [{"id": 0}], "traceEvents": EVENTS,
                  "baseTimeNanoseconds": 5, "traceName": "x"}, indent=1).encode()
ARRAY = json.dumps(EVENTS).encode()
#: the documents cut at every byte (quadratic: each cut streams its prefix): eight events hold every kind of place a
#: cut can fall (the header's members, each part of an event, its escapes and nested brackets, between events, the
#: members after the array) at several offsets in a 97-byte block and across 40-byte batches
CUT_EVENTS = EVENTS[:8]
CUT_DOC = json.dumps({"schemaVersion": 1, "deviceProperties": [{"id": 0}], "traceEvents": CUT_EVENTS,
                      "baseTimeNanoseconds": 5, "traceName": "x"}, indent=1).encode()
CUT_ARRAY = json.dumps(CUT_EVENTS).encode()


def run(doc: bytes, block: int = 7, batch: int = 30):
    blocks = [(i, doc[i : i + block]) for i in range(0, len(doc), block)]
    out, members, end = [], {}, None
    for item in js.stream_array(blocks, batch_bytes=batch):
        if isinstance(item, js.Batch):
            elements = msgspec.json.decode(item.data)
            assert len(elements) == len(item)
            for i in range(len(item)):
                assert msgspec.json.decode(item.element(i)) == elements[i]
            out += elements
        elif isinstance(item, js.Member):
            members[item.key] = msgspec.json.decode(item.raw)
        else:
            end = item
    return out, members, end


def test_object_document_any_block_size() -> None:
    for block in (1, 3, 64, 100_000):
        for batch in (1, 50, 1 << 20):
            out, members, end = run(DOC, block, batch)
            assert out == EVENTS
            assert members == {"schemaVersion": 1, "deviceProperties": [{"id": 0}], "baseTimeNanoseconds": 5,
                               "traceName": "x"}
            assert end.complete and end.array_closed


def test_members_of_any_size_are_found_whatever_window_their_end_is_looked_for_in(monkeypatch) -> None:
    """A member's end is looked for in windows growing fourfold from a small one: a window may end inside a string, an
    escape or a nested value, and every member still comes whole (the first window made tiny here, the scan's at most
    a few hundred bytes), in a document read in one block or in small ones."""
    big = {"s": 'x "q" \\ ,{[' * 400, "n": [{"a": ["}", "\\", {"b": ","}]}] * 300}
    doc = json.dumps({"schemaVersion": 1, "header": big, "traceEvents": EVENTS, "after": big, "z": 2}).encode()
    monkeypatch.setattr(js, "MEMBER_SCAN_BYTES", 5)
    for limit in (js.SCAN_BYTES, 301):
        monkeypatch.setattr(js, "SCAN_BYTES", limit)
        for block in (len(doc), 4096, 13):
            out, members, end = run(doc, block, 1 << 20)
            assert out == EVENTS and end.complete
            assert members == {"schemaVersion": 1, "header": big, "after": big, "z": 2}


def test_every_cut_of_an_object_document() -> None:
    for cut in range(len(CUT_DOC)):
        out, _, end = run(CUT_DOC[:cut], 97, 40)
        assert out == CUT_EVENTS[: len(out)]
        if cut < len(CUT_DOC) - 1:
            assert not end.complete


def test_bare_arrays_closed_or_not() -> None:
    assert run(ARRAY)[0] == EVENTS
    out, _, end = run(ARRAY[:-1])
    assert out == EVENTS and not end.array_closed and end.bytes_lost == 0
    out, _, end = run(ARRAY[:-1] + b",\n")
    assert out == EVENTS and not end.array_closed and end.bytes_lost == 0
    for cut in range(len(CUT_ARRAY)):
        out = run(CUT_ARRAY[:cut], 61, 20)[0]
        assert out == CUT_EVENTS[: len(out)]


def test_not_json() -> None:
    assert run(b"")[2].reason == "no JSON value"
    assert not run(b"hello")[2].array_found


@settings(max_examples=60, deadline=None)
@given(st.lists(st.dictionaries(st.text(max_size=5), st.one_of(st.integers(), st.text(max_size=8),
                                                                 st.lists(st.integers(), max_size=3)),
                                max_size=4), max_size=12),
       st.integers(1, 50), st.integers(1, 200))
def test_random_documents(elements, block, batch) -> None:
    doc = json.dumps({"a": 1, "traceEvents": elements, "z": [1, 2]}).encode()
    out, members, end = run(doc, block, batch)
    assert out == elements and members == {"a": 1, "z": [1, 2]} and end.complete


def test_lazy_batches_give_the_same_elements_whatever_the_caller_decides() -> None:
    # names full of "}, {" make the likely cut land inside strings: a caller that finds a lazy batch does not
    # decode checks it, and a wrong cut is split again exactly (nothing lost, nothing twice)
    events = [{"ph": "X", "name": "a}, {" * (i % 5) + str(i), "args": {"x": [{"y": 1}, {"z": "}, {"}]}}
              for i in range(200)]
    doc = json.dumps({"traceEvents": events, "traceName": "x"}).encode()
    for block, batch in ((64, 100), (1000, 700), (1 << 20, 1 << 20)):
        blocks = [(i, doc[i : i + block]) for i in range(0, len(doc), block)]
        out, lazy = [], 0
        for item in js.stream_array(blocks, batch_bytes=batch, lazy=True):
            if not isinstance(item, js.Batch):
                continue
            lazy += item.lazy
            try:
                out += msgspec.json.decode(item.data)
            except msgspec.DecodeError:
                assert item.lazy and not item.check()
        assert out == events and lazy


@settings(max_examples=200, deadline=None, database=None)
@given(st.data())
def test_a_batch_cut_from_the_last_block_is_the_cut_of_the_whole_buffer(data: st.DataObject) -> None:
    """The fast path cuts a batch out of what was buffered and the block just read without joining them first: the
    same boundary and bytes as cutting the joined buffer, wherever the record boundaries fall (none in the block,
    one spanning the two, none in the block's last 64 KB, a block smaller than that)."""
    piece = st.sampled_from([b"}, {", b"},\n  {", b"}", b"{", b",", b" ", b'"x": 1', b"a" * 100, b"b" * 5000])
    head = b"".join(data.draw(st.lists(piece, max_size=30)))
    tail = b"".join(data.draw(st.lists(piece, max_size=40)))
    filler = data.draw(st.sampled_from([0, 10, 40_000, 1 << 16, 70_000, 300_000]))
    where = data.draw(st.integers(0, 2))  # the boundaries before, around or after the filler
    body = [tail + b"c" * filler, b"c" * (filler // 2) + tail + b"c" * (filler // 2), b"c" * filler + tail][where]
    stream = js._Stream([(0, head), (len(head), body)])
    while stream.more():
        pass
    whole = head + body
    expected = js._fast_cut(whole)
    got = stream.cut_batch()
    if expected is None:
        assert got is None
    else:
        assert got == (js._bracketed(whole, expected), expected)
    assert stream.buf == whole and stream.size == len(whole)
    if expected is not None:  # what is left after the batch, as the array's fast path drops it
        stream.drop(expected + 1)
        assert stream.buf == whole[expected + 1 :]


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(st.sampled_from([b"}", b"{", b",", b" ", b"\n", b"\x0b", b"\t", b"a", b'"x": {', b"}, {", b"},\n  {",
                                 b"}\x0b,\x0c{", b"}\r,\t{", b"[1, {", b"{" * 40]), max_size=80),
       st.integers(0, 70_000))
def test_the_last_boundary_read_backwards_is_the_patterns(pieces: list[bytes], pad: int) -> None:
    """Reading back from the last ``{`` finds the comma of the last ``}, {`` the pattern finds over its windows
    (braces that start no boundary, none at all, one beyond the first window, more braces than it tries)."""
    buf = b"".join(pieces)
    for b in (buf, buf + b"b" * pad, b"}, {" + b"b" * pad + buf):
        assert js._fast_cut(b) == js._last_cut(b)
