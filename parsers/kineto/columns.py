"""Kineto records → Arrow columns, batch by batch: the typed msgspec path first, Arrow's JSON reader for the
batches it leaves, and the exact per-record path for anything either would read differently."""

from __future__ import annotations

import io
import re
from itertools import compress, repeat
from operator import attrgetter, is_
from typing import Any, Union

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
from msgspec.structs import astuple

from tracekit.model.schema import clean_text

from ..json_stream import Batch, invalid_utf8
from ..timestamps import us_text_to_ns
from .records import (
    _DECODE,
    _DECODE_ONE,
    _LEGACY_PID_CATS,
    _NONFINITE,
    _UNESCAPED_NAME,
    ARG_NAMES,
    COMM_ARG_FIELDS,
    DECODE_ERRORS,
    EMPTY_RAW,
    MAX_DUR_NS,
    MAX_NS,
    RAW,
    Args,
    Event,
    _Accumulator,
    _may_carry_comm,
)


def _decode_batch(acc: _Accumulator, batch: Batch) -> list[Event]:
    """Decode a batch; on damage, repair what can be repaired and skip (and count) the rest."""
    try:
        return _DECODE.decode(batch.data)
    except DECODE_ERRORS as exc:
        if invalid_utf8(exc):
            # invalid UTF-8: U+FFFD for every bad byte (never a structural character, so the element
            # boundaries stay where they were)
            fixed = batch.data.decode("utf-8", "replace")
            acc.repaired_utf8 += fixed.count("\ufffd") - batch.data.count("\ufffd".encode())
            batch = Batch(batch.offset, fixed.encode())
            try:
                return _DECODE.decode(batch.data)
            except DECODE_ERRORS:
                pass
    data = batch.data
    if _NONFINITE.search(data):
        data, k = _NONFINITE.subn(rb"\1null", data)
        try:
            events = _DECODE.decode(data)
            acc.repaired_nonfinite += k
            return events
        except DECODE_ERRORS:
            pass
    # element by element; elements that are not even objects are counted in bulk, not one by one
    events: list[Event] = []
    bounds = batch.bounds
    view = np.frombuffer(batch.data, dtype=np.uint8)
    solid = np.flatnonzero((view != 0x20) & (view != 0x0A) & (view != 0x0D) & (view != 0x09))
    at = np.searchsorted(solid, bounds[:-1] + 1)
    first = solid[np.minimum(at, solid.size - 1)]
    present = (at < solid.size) & (first < bounds[1:])
    is_obj = present & (view[first] == 0x7B)
    junk = np.flatnonzero(present & ~is_obj)
    if junk.size:
        acc.bad(batch.element_offset(int(junk[0])), "unreadable event skipped")
        acc.n_bad += junk.size - 1
    for i in np.flatnonzero(is_obj).tolist():
        ev = _decode_one(acc, batch.element(i))
        if ev is None:
            acc.bad(batch.element_offset(i), "unreadable event skipped")
        else:
            events.append(ev)
    return events


def _decode_one(acc: _Accumulator, raw: bytes) -> Event | None:
    """Decode one event, trying the repairs real files need (non-finite numbers, unescaped names,
    control characters, invalid UTF-8, wrong types)."""
    try:
        return _DECODE_ONE.decode(raw)
    except DECODE_ERRORS:
        pass
    fixed = raw
    k = 0
    if _NONFINITE.search(fixed):
        fixed, k = _NONFINITE.subn(rb"\1null", fixed)
    m = _UNESCAPED_NAME.search(fixed)
    if m and re.search(rb'(?<!\\)"', m.group(2)):
        inner = re.sub(rb'(?<!\\)"', rb'\\"', m.group(2))
        fixed = fixed[: m.start(2)] + inner + fixed[m.end(2):]
        acc.repaired_names += 1
    try:
        ev = _DECODE_ONE.decode(fixed)
        acc.repaired_nonfinite += k
        return ev
    except DECODE_ERRORS:
        pass
    import json

    try:
        obj = json.loads(fixed.decode("utf-8", "replace"), strict=False)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    ts = obj.get("ts")
    args = obj.get("args") if isinstance(obj.get("args"), dict) else {}
    try:
        return Event(ph=obj.get("ph", ""), cat=obj.get("cat"), name=obj.get("name"), pid=obj.get("pid"),
                     tid=obj.get("tid"), ts=msgspec.Raw(msgspec.json.encode(ts)) if ts is not None
                     else EMPTY_RAW, dur=obj.get("dur"), args=msgspec.convert(args, Args, strict=False))
    except DECODE_ERRORS:
        return None


_ARGS_TYPE = pa.struct([("External id", pa.int64()), ("external id", pa.int64()), ("correlation", pa.int64()),
                        ("device", pa.int64()), ("stream", pa.int64()), ("bytes", pa.int64()),
                        ("name", pa.string()), ("labels", pa.string()), ("wait_on_stream", pa.int64()),
                        ("wait_on_cuda_event_record_corr_id", pa.int64())])
_ARROW_SCHEMA = pa.schema([("ph", pa.string()), ("cat", pa.string()), ("name", pa.string()), ("pid", pa.int64()),
                          ("tid", pa.int64()), ("ts", pa.decimal128(24, 3)), ("dur", pa.decimal128(24, 3)),
                          ("args", _ARGS_TYPE)])
_ARROW_PARSE = pj.ParseOptions(explicit_schema=_ARROW_SCHEMA, unexpected_field_behavior="ignore")
_ARROW_PARSE_NL = pj.ParseOptions(explicit_schema=_ARROW_SCHEMA, unexpected_field_behavior="ignore",
                                  newlines_in_values=True)
_ARROW_READ = pj.ReadOptions(use_threads=False, block_size=16 << 20)
_SEPARATOR = re.compile(rb"\}\s*,\s*\{")


def _decimal_ns(col: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """µs as decimal128(·, 3) → int64 ns, exactly: the decimal's storage *is* the value × 1000.

    Returns ``(ns, ok)``; ``ok`` is False for nulls and for values beyond ±:data:`MAX_NS` (the low
    64-bit word alone would silently wrap them)."""
    words = np.frombuffer(col.buffers()[1], dtype=np.int64)[2 * col.offset : 2 * (col.offset + len(col))]
    low, high = words[0::2], words[1::2]
    ok = (high == (low >> 63)) & (low <= MAX_NS) & (low >= -MAX_NS)
    if col.null_count:
        ok &= pc.is_valid(col).to_numpy(zero_copy_only=False)
    return np.where(ok, low, 0), ok


def _records(lines: bytes, n: int, batch: Batch):
    """``k -> bytes of record k`` for records joined by ``}\\n{`` (the separators this parser wrote);
    falls back to the batch's structural index if a record happens to contain that sequence itself."""
    arr = np.frombuffer(lines, dtype=np.uint8)
    cut = np.flatnonzero(arr[1:-1] == 0x0A) + 1  # newlines first: one pass, then look around the few found
    cut = cut[(arr[cut - 1] == 0x7D) & (arr[cut + 1] == 0x7B)]
    if cut.size != n - 1:
        return batch.element
    starts = np.concatenate(([0], cut + 1))
    ends = np.append(cut, len(lines))
    return lambda k: lines[starts[k] : ends[k]]


def _consume_arrow(acc: _Accumulator, batch: Batch) -> bool:
    """Fast path: decode a batch with Arrow's C++ JSON reader into typed columns (no Python objects
    per event). Returns False, having done nothing, for anything unusual (string tids, non-finite
    numbers, more than ns precision, B/E pairs, damaged records): the msgspec path handles those."""
    tbl = None
    body = batch.data[1:-1]
    # writers use one separator between records: replace it exactly (memchr-fast); objects may still span
    # lines (pretty-printed), which the reader is told about
    m = _SEPARATOR.search(body, 0, 1 << 16)
    if m is not None:
        sep = m.group()
        lines = body.replace(sep, b"}\n{")
        # a separator with spacing is longer than its replacement, so the shrinkage counts them for free
        n_sep = (len(body) - len(lines)) // (len(sep) - 3) if len(sep) > 3 else lines.count(b"}\n{")
        if n_sep * 32 > len(lines):
            return False  # millions of tiny records (no real event is this small): Arrow's per-row cost is high
        try:
            tbl = pj.read_json(io.BytesIO(lines), read_options=_ARROW_READ, parse_options=_ARROW_PARSE_NL)
            tbl.validate(full=True)  # the reader does not check UTF-8; invalid text goes the repairing way
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            tbl = None
        # two records with no comma between them read as two rows without a separator: rows and records
        # would fall out of step, so that batch goes the exact way (as does a record holding the separator)
        if tbl is not None and tbl.num_rows != n_sep + 1:
            tbl = None
    if tbl is None:  # mixed separators: normalise every one
        lines = _SEPARATOR.sub(b"}\n{", body.replace(b"\n", b" "))
        if lines.count(b"\n") * 32 > len(lines):
            return False
        try:
            tbl = pj.read_json(io.BytesIO(lines), read_options=_ARROW_READ, parse_options=_ARROW_PARSE)
            tbl.validate(full=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return False
        if tbl.num_rows != lines.count(b"\n") + 1:
            return False
    if tbl.num_rows == 0:
        return True
    tbl = tbl.combine_chunks()
    ph = tbl.column("ph").chunk(0)
    is_x = pc.equal(ph, "X")
    n_x = pc.sum(is_x).as_py() or 0
    if n_x != tbl.num_rows:
        if pc.any(pc.is_in(ph, pa.array(["B", "E"]))).as_py():
            return False
        # only metadata rows and the window-end marker matter among the others (flows, instants, ...)
        wanted = pc.or_(pc.equal(ph, "M"), pc.and_(pc.equal(ph, "i"),
                                                    pc.equal(tbl.column("name").chunk(0), "Record Window End")))
        other = tbl.filter(pc.fill_null(wanted, False))
        for row in other.select(["ph", "name", "pid", "tid", "args"]).to_pylist():
            if row["ph"] == "M":
                a = row["args"] or {}
                acc.meta_records.append((str(row["name"]), row["pid"], row["tid"],
                                         a.get("name") if a.get("name") is not None else a.get("labels")))
            elif row["ph"] == "i" and row["name"] == "Record Window End":
                acc.window_end = True
    line_index = np.flatnonzero(pc.fill_null(is_x, False).to_numpy(zero_copy_only=False))
    x = tbl.take(pa.array(line_index)) if n_x != tbl.num_rows else tbl
    start, ts_ok = _decimal_ns(x.column("ts").chunk(0))
    if not acc.has_fraction:
        acc.has_fraction = bool((start[ts_ok] % 1000 != 0).any())
    dur, dur_ok = _decimal_ns(x.column("dur").chunk(0))
    dur = np.where(dur_ok & (dur <= MAX_DUR_NS), dur, 0)
    args = x.column("args").chunk(0)
    field = {f: pc.struct_field(args, f) for f in ("External id", "external id", "correlation", "device",
                                                   "stream", "bytes", "wait_on_stream",
                                                   "wait_on_cuda_event_record_corr_id")}
    n = len(x)
    rb = pa.record_batch({
        "cat": x.column("cat").chunk(0).dictionary_encode(),
        "name": x.column("name").chunk(0).dictionary_encode(),
        "start_ns": pa.array(start),
        "dur_ns": pa.array(np.maximum(dur, 0)),
        "pid": pc.abs(x.column("pid").chunk(0)),
        "tid": pc.abs(x.column("tid").chunk(0)),
        "arg_device": field["device"],
        "arg_stream": field["stream"],
        "correlation": field["correlation"],
        "external_id": pc.coalesce(field["External id"], field["external id"]),
        "bytes": field["bytes"],
        "sync_stream": field["wait_on_stream"],
        "sync_correlation": field["wait_on_cuda_event_record_corr_id"],
        "_index": pa.array(np.arange(acc.n, acc.n + n, dtype=np.int64)),
    })
    if not ts_ok.all():
        acc.dropped += int((~ts_ok).sum())
        keep = pa.array(ts_ok)
        rb = rb.filter(keep)
        line_index = line_index[ts_ok]
    # collective metadata: decode only the few records that may carry it, with msgspec
    names = rb.column("name")
    hot = [i for i, nm in enumerate(names.dictionary.to_pylist()) if nm and _may_carry_comm(nm)]
    if hot:
        sel = np.flatnonzero(np.isin(pc.fill_null(names.indices, -1).to_numpy(zero_copy_only=False), hot))
        record = _records(lines, tbl.num_rows, batch)
        index = rb.column("_index").to_numpy()
        for j in sel:
            ev = _decode_one(acc, record(int(line_index[j])))
            if ev is None:
                continue
            a = ev.args
            row = {f: getattr(a, f) for f in COMM_ARG_FIELDS}
            row["_index"] = int(index[j])
            acc.comm_rows.append(row)
    acc.add(rb)
    acc.n += n
    return True


# --- the typed fast path --------------------------------------------------------------------------------------

class _TArgs(msgspec.Struct, frozen=True, gc=False, rename=ARG_NAMES):
    """The args of an X event as the fast path reads them: the ids of every event typed exactly as
    :data:`_ARROW_SCHEMA` types them (a value of another type sends the batch the old ways), and the
    collective metadata as :class:`Args` reads it, the tensor shapes left as raw JSON until an event turns
    out to be one that may carry a collective's size."""

    external_id: int | None = None
    external_id_legacy: int | None = None
    correlation: int | None = None
    device: int | None = None
    stream: int | None = None
    bytes: int | None = None
    wait_stream: int | None = None
    wait_correlation: int | None = None
    label_name: str | None = None
    labels: str | None = None
    collective: Any = None
    dtype: Any = None
    in_nelems: Any = None
    out_nelems: Any = None
    in_size: Any = None
    out_size: Any = None
    group_size: Any = None
    pg_name: Any = None
    pg_desc: Any = None
    pg_id: Any = None
    pg_ranks: Any = None
    seq: Any = None
    comms_id: Any = None
    comm_rank: Any = None
    src_rank: Any = None
    dst_rank: Any = None
    input_dims: msgspec.Raw = EMPTY_RAW
    input_dims_legacy: msgspec.Raw = EMPTY_RAW
    input_type: msgspec.Raw = EMPTY_RAW


_NO_TARGS = _TArgs()
_IDS = attrgetter("external_id", "external_id_legacy", "correlation", "device", "stream", "bytes", "wait_stream",
                  "wait_correlation")
_RAW_COMM_FIELDS = frozenset({"input_dims", "input_dims_legacy", "input_type"})


class _TX(msgspec.Struct, gc=False, tag="X", tag_field="ph"):
    """A complete event (``ph`` X); ``ts`` as its text, for an exact decimal conversion (``dur`` below 2^33 µs
    converts exactly from a float)."""

    cat: str | None = None
    name: str | None = None
    pid: int | None = None
    tid: int | None = None
    ts: msgspec.Raw = EMPTY_RAW
    dur: float | None = None
    args: _TArgs = _NO_TARGS


class _TMetaArgs(msgspec.Struct, frozen=True, gc=False, rename={"label_name": "name"}):
    label_name: str | None = None
    labels: str | None = None


class _TM(msgspec.Struct, gc=False, tag="M", tag_field="ph"):
    """Track metadata (``process_name``, ``thread_name``, ...)."""

    name: str | None = None
    pid: int | None = None
    tid: int | None = None
    args: _TMetaArgs = _TMetaArgs()


class _TI(msgspec.Struct, gc=False, tag="i", tag_field="ph"):
    """An instant: only ``Record Window End`` matters (its pid and tid are ``""``)."""

    name: str | None = None


def _other(ph: str) -> type:
    """A record whose content the analysis does not use (flows, counters, ...): an empty struct. (Arrow's path
    also checks the types of their fields, so it may refuse a batch this path takes; where that changes a
    result, :func:`_consume_typed` asks it.)"""
    return msgspec.defstruct(f"_T_{ord(ph[0])}", [], tag=ph, tag_field="ph", gc=False)


#: every phase of the Chrome trace event format; B/E pairs go the exact way (a batch holding one is left to it)
_TB, _TE = _other("B"), _other("E")
_T_OTHERS = [_other(ph) for ph in ("s", "f", "t", "I", "C", "b", "n", "e", "P", "O", "N", "D", "V", "v", "R", "c",
                                   "(", ")")]
_TYPED = msgspec.json.Decoder(list[Union[_TX, _TM, _TI, _TB, _TE, *_T_OTHERS]])
_DECIMAL = pa.decimal128(24, 3)
_NULL_FIRST = ord("n")


def _raw_decimal_ns(raws: tuple[msgspec.Raw, ...]) -> tuple[np.ndarray, np.ndarray] | None:
    """The raw texts of JSON numbers (µs) as exact int64 ns, with :func:`_decimal_ns`'s validity; absent
    values and ``null`` are invalid. None when a text is not a number Arrow's JSON reader would read the same
    way (quoted numbers, more than 3 decimals, beyond decimal128(24, 3)): the batch then goes the old ways."""
    n = len(raws)
    lengths = np.fromiter(map(len, raws), dtype=np.int64, count=n)
    joined = b"".join(raws)
    if len(joined) >= 2**31:
        return None
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    buf = np.frombuffer(joined, dtype=np.uint8)
    null = lengths == 0
    if buf.size:
        null |= buf[np.minimum(offsets[:-1], buf.size - 1)] == _NULL_FIRST  # the JSON is valid: n is null
    n_null = int(null.sum())
    validity = pa.py_buffer(np.packbits(~null, bitorder="little")) if n_null else None
    strings = pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(joined), validity, n_null)
    try:
        dec = pc.cast(strings, _DECIMAL)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return _decimal_ns(dec)


def _float_us_ns(values: tuple) -> tuple[np.ndarray, np.ndarray]:
    """Durations in µs decoded as floats → int64 ns: exactly what the decimal text gives for values below 2^33 µs
    with at most 3 decimals (and what the exact path gives for more decimals); absent and null values are 0, as
    there. Returns ``(ns, exact)``: ``exact`` is False for values of 2^33 µs or more (their text is needed)."""
    f = pa.array(values, pa.float64()).to_numpy(zero_copy_only=False)  # nulls become NaN
    nan = np.isnan(f)
    exact = nan | (np.abs(f) < float(1 << 33))
    ns = np.rint(np.where(exact & ~nan, f, 0.0) * 1000.0).astype(np.int64)
    return ns, exact


def _consume_typed(acc: _Accumulator, batch: Batch) -> bool:
    """Fastest path: one msgspec decode of the whole batch into typed structs (records the analysis does
    not use become empty structs), moved into columns with C-level transposes. Gives exactly what
    :func:`_consume_arrow` gives; returns False, having changed nothing, for every batch that path would not
    take (and a few more), which then goes the old ways."""
    data = batch.data
    try:
        evs = _TYPED.decode(data)
    except DECODE_ERRORS:
        return False
    n_rec = len(evs)
    kinds = list(map(type, evs))
    if kinds.count(_TB) or kinds.count(_TE):
        return False
    n_x = kinds.count(_TX)
    xs = evs if n_x == n_rec else list(compress(evs, map(is_, kinds, repeat(_TX))))
    meta: list[tuple[str, Any, Any, Any]] = []
    window_end = False
    if kinds.count(_TM) or kinds.count(_TI):
        for e in evs:
            if e.__class__ is _TM:
                meta.append(_meta_record(e))
            elif e.__class__ is _TI and e.name == "Record Window End":
                window_end = True
    del evs, kinds
    rb = None
    args: tuple[_TArgs, ...] = ()
    if n_x:
        cat, name, pid, tid, ts, dur, args = zip(*map(astuple, xs), strict=True)
        del xs
        converted = _raw_decimal_ns(ts)
        if converted is None:
            return False
        start, ts_ok = converted
        dur_ns, dur_exact = _float_us_ns(dur)
        if not dur_exact.all():
            return False  # durations of 2^33 µs (2.4 hours) or more: only their text gives them exactly
        try:
            ids = [pa.array(c, pa.int64()) for c in (pid, tid, *zip(*map(_IDS, args), strict=True))]
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            return False
        pid_a, tid_a, ext, ext_l, corr, dev, stream, nbytes, wstream, wcorr = ids
        try:
            cat_a, name_a = pa.array(cat, pa.string()), pa.array(name, pa.string())
        except (pa.ArrowInvalid, UnicodeEncodeError):  # lone surrogates (escaped in the JSON) are not UTF-8
            return False
        has_fraction = acc.has_fraction or bool((start[ts_ok] % 1000 != 0).any())
        # Where the two old paths differ (negative pids and tids, whether timestamps have fractions; durations of
        # 2^33 µs or more went back above), give what they gave: Arrow's result if it takes this batch (which it
        # decides on types of records this path does not look at), else the exact path's.
        negative = (pc.min(pid_a).as_py() or 0) < 0 or (pc.min(tid_a).as_py() or 0) < 0
        acc.consulted = negative or (not acc.has_fraction and (has_fraction or b"." in b"".join(ts)))
        if acc.consulted:
            flags = (F_NEGATIVE if negative else 0) | (F_FRACTION if has_fraction else 0) | (
                F_DOT_HEAD if b"." in b"".join(ts[:DOT_HEAD_ROWS]) else 0)
            if arrow_decides(flags, acc.has_fraction) and not arrow_takes(acc.path, batch):
                return False
        # collective metadata: only from events whose name says they may carry it; read before the accumulator
        # changes, as a value msgspec cannot hold (``"Input Dims": 1e400``) sends the batch the old ways
        local = name_a.dictionary_encode()
        hot = acc.names.comm_flags_of(local.dictionary.to_pylist())
        hot_rows = np.flatnonzero(hot[pc.fill_null(local.indices, len(hot) - 1).to_numpy(zero_copy_only=False)]
                                  & ts_ok).tolist()
        try:
            comm = [_comm_row(args[r], acc.n + r) for r in hot_rows]
        except DECODE_ERRORS:
            return False
        # every check passed: from here on the accumulator changes
        acc.has_fraction = has_fraction
        dur_ns = np.maximum(dur_ns, 0)
        name_codes = acc.names.encode(name_a)
        rb = pa.record_batch([
            acc.cats.encode(cat_a), name_codes, pa.array(start),
            pa.array(dur_ns), pc.abs(pid_a), pc.abs(tid_a), dev, stream, corr, pc.coalesce(ext, ext_l), nbytes,
            wstream, wcorr, pa.array(np.arange(acc.n, acc.n + n_x, dtype=np.int64))], schema=RAW)
        if not ts_ok.all():
            acc.dropped += int((~ts_ok).sum())
            rb = rb.filter(pa.array(ts_ok))
        acc.comm_rows.extend(comm)
    acc.meta_records.extend(meta)
    acc.window_end = acc.window_end or window_end
    if rb is not None:
        acc.add_raw(rb)
        acc.n += n_x
    return True


def _meta_record(e: _TM | Event) -> tuple[str, Any, Any, Any]:
    """A track-metadata record (``process_name``, ``thread_name``, ...) as the accumulator keeps it: name, pid, tid
    and its ``args.name`` (else ``args.labels``)."""
    a = e.args
    return str(e.name), e.pid, e.tid, a.label_name if a.label_name is not None else a.labels


def _comm_row(a: _TArgs, index: int) -> dict[str, Any]:
    """The collective metadata of one event, as :class:`Args` would have read it."""
    row = {f: getattr(a, f) for f in COMM_ARG_FIELDS}
    for f in _RAW_COMM_FIELDS:
        raw = row[f]
        row[f] = msgspec.json.decode(raw) if len(raw) else None
    row["_index"] = index
    return row


# --- the C scanner's results -----------------------------------------------------------------------------------

_DECODE_X = msgspec.json.Decoder(_TX)
_DECODE_M = msgspec.json.Decoder(_TM)
#: in place of what the C scanner made of a batch: it was not run yet
_NOT_SCANNED: Any = object()
#: the scanner's batch flags (``F_*`` in ``scan.c``): a valid timestamp is not a whole µs, a timestamp's
#: text has a '.', an instant named "Record Window End", a negative pid or tid, a '.' in the timestamp's text of one
#: of the batch's first :data:`DOT_HEAD_ROWS` X events
F_FRACTION, F_DOT, F_WINDOW_END, F_NEGATIVE, F_DOT_HEAD = 1, 2, 4, 8, 16
#: how many of a batch's first X events the exact path looks at for a '.' in their timestamps (:func:`_columns`)
DOT_HEAD_ROWS = 64


def arrow_decides(flags: int, has_fraction: bool) -> bool:
    """Whether what a consulted batch reads as depends on Arrow's path taking it (the typed path and the scanner's
    consumption give that path's result if it does, else the exact path's). ``flags`` as the scanner's (``F_*``) and
    ``has_fraction``: whether the file had a fraction before. Negative pids or tids always do; a batch's timestamps
    only decide whether the file has fractions, which Arrow's path reads as a valid timestamp that is not a whole µs
    and the exact path as a '.' in the text of one of the batch's first :data:`DOT_HEAD_ROWS`: asked only where the
    two differ (Arrow's reader takes ~65 ms over a 2 MB batch, a third of a 10 MB trace's parse)."""
    if flags & F_NEGATIVE:
        return True
    return not has_fraction and bool(flags & F_FRACTION) != bool(flags & F_DOT_HEAD)


def _int_array(n: int, values: bytes, validity: tuple[bytes, int] | None) -> pa.Array:
    """An int64 column on the scanner's buffers: its values, and its validity bitmap with the null count (None: no
    nulls). No copy, no mask to invert and pack per column and batch."""
    if validity is None:
        return pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(values)], null_count=0)
    return pa.Array.from_buffers(pa.int64(), n, [pa.py_buffer(validity[0]), pa.py_buffer(values)],
                                 null_count=validity[1])


def arrow_takes(path: str, batch: Batch) -> bool:
    """Whether Arrow's path (:func:`_consume_arrow`) takes ``batch``, asked on an accumulator of its own: nothing of
    the file's changes (the older paths' results depend on the answer, not on what it read)."""
    return _consume_arrow(_Accumulator(path), batch)


def _consume_scanned(acc: _Accumulator, batch: Batch, scanned: Any, asked: bool | None = None) -> bool:
    """What :func:`_consume_typed` does with a batch, from what the C scanner (``parsers/kineto/scan.c``) made of
    it (``scanned``; None where it declined): the same columns, dictionaries, collective and metadata records.
    Returns False, having changed nothing, where the scanner declined or the typed path would consult Arrow's.
    ``asked``: :func:`arrow_takes` of the batch, where asked already (None: ask it here)."""
    if scanned is None:
        return False
    n_x, ints, valid, codes, cats, names, meta_ranges, flags = scanned
    data = batch.data
    meta: list[tuple[str, Any, Any, Any]] = []
    if meta_ranges:
        bounds = np.frombuffer(meta_ranges, dtype=np.int64).tolist()
        try:
            for k in range(0, len(bounds), 2):
                meta.append(_meta_record(_DECODE_M.decode(data[bounds[k] : bounds[k + 1]])))
        except DECODE_ERRORS:
            return False
    rb = None
    comm: list[dict[str, Any]] = []
    if n_x:
        has_fraction = acc.has_fraction or bool(flags & F_FRACTION)
        # where the typed path asks Arrow's path whether it takes the batch (negative pids or tids, timestamps
        # with fractions), ask it too
        consulted = bool(flags & F_NEGATIVE) or (not acc.has_fraction and (has_fraction or bool(flags & F_DOT)))
        if consulted and arrow_decides(flags, acc.has_fraction) and not (
                asked if asked is not None else arrow_takes(acc.path, batch)):
            return False
        ts_ok = np.frombuffer(valid[0], dtype=np.bool_)
        all_ok = bool(ts_ok.all())
        name_local = np.frombuffer(codes[1], dtype=np.int32)
        hot = acc.names.comm_flags_of(names)
        if hot.any():
            rec_start, rec_end = np.frombuffer(ints[12], dtype=np.int64), np.frombuffer(ints[13], dtype=np.int64)
            rows = np.flatnonzero(hot[name_local] & ts_ok).tolist()
            try:
                for r in rows:
                    args = _DECODE_X.decode(data[int(rec_start[r]) : int(rec_end[r])]).args
                    comm.append(_comm_row(args, acc.n + r))
            except DECODE_ERRORS:
                return False
        # every check passed: from here on the accumulator changes
        acc.has_fraction = has_fraction
        acc.consulted = consulted
        cat_codes = acc.cats.encode_local(cats, np.frombuffer(codes[0], dtype=np.int32))
        name_codes = acc.names.encode_local(names, name_local)
        ids = [_int_array(n_x, ints[2 + k], valid[1 + k]) for k in range(10)]
        pid_a, tid_a, ext, ext_l, corr, dev, stream, nbytes, wstream, wcorr = ids
        if flags & F_NEGATIVE:
            pid_a, tid_a = pc.abs(pid_a), pc.abs(tid_a)
        rb = pa.record_batch([
            cat_codes, name_codes, _int_array(n_x, ints[0], None),
            pa.array(np.maximum(np.frombuffer(ints[1], dtype=np.int64), 0)), pid_a, tid_a, dev, stream,
            corr, pc.coalesce(ext, ext_l), nbytes, wstream, wcorr,
            pa.array(np.arange(acc.n, acc.n + n_x, dtype=np.int64))], schema=RAW)
        if not all_ok:
            acc.dropped += int((~ts_ok).sum())
            rb = rb.filter(pa.array(ts_ok))
        acc.comm_rows.extend(comm)
    acc.meta_records.extend(meta)
    acc.window_end = acc.window_end or bool(flags & F_WINDOW_END)
    if rb is not None:
        acc.add_raw(rb)
        acc.n += n_x
    return True


def _consume(acc: _Accumulator, batch: Batch, scanned: Any = _NOT_SCANNED, asked: bool | None = None) -> None:
    """Turn one batch into Arrow columns (X events) and side records (metadata, markers). ``scanned``: what the C
    scanner made of it, if it was run already; ``asked``: :func:`arrow_takes` of it, if asked already."""
    acc.consulted = False
    if scanned is _NOT_SCANNED:
        scanned = acc.scan(batch.data) if acc.scan is not None else None
    if _consume_scanned(acc, batch, scanned, asked) or _consume_typed(acc, batch):
        if acc.log is not None:
            acc.log.append((batch.offset, len(batch.data), not acc.consulted))
        return
    if acc.log is not None:
        acc.log.append((batch.offset, len(batch.data), False))
    if not batch.check():
        return  # cut inside a record: the stream splits these bytes again exactly
    if _consume_arrow(acc, batch):
        return
    events = _decode_batch(acc, batch)
    if not events:
        return
    phs = [e.ph for e in events]
    xs = [e for e, ph in zip(events, phs, strict=True) if ph == "X"]
    if len(xs) != len(events):
        for e, ph in zip(events, phs, strict=True):
            if ph == "M":
                acc.meta_records.append(_meta_record(e))
            elif ph == "i":
                if e.name == "Record Window End":
                    acc.window_end = True
            elif ph in ("B", "E"):
                acc.be_events.append(e)
    if xs:
        _columns(acc, xs)


def _int_column(values: list, name: str) -> pa.Array:
    """int64 column from JSON values that should be ints (strings of digits and floats tolerated)."""
    try:
        return pa.array(values, type=pa.int64())
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        return pa.array([_as_int(v) for v in values], type=pa.int64())


def _as_int(v: Any) -> int | None:
    """Lenient int: ``7``, ``"7"``, ``"stream 7"``, ``7.0``; None for anything else."""
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int):
        return abs(v) if abs(v) < 2**63 else None
    if isinstance(v, float):
        return int(v) if v == v and abs(v) < 2**63 else None
    if isinstance(v, str):
        m = re.search(r"-?\d+", v)
        if m and len(m.group()) < 19:
            return abs(int(m.group()))
    return None


def _str_column(values: list) -> pa.Array:
    """A string column; other JSON values become their text, lone surrogates become ``?``."""
    try:
        return pa.array(values, type=pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, UnicodeEncodeError):
        return pa.array([None if v is None else clean_text(v if isinstance(v, str) else str(v))
                         for v in values], type=pa.string())


def _dur_ns(values: list) -> tuple[np.ndarray, np.ndarray]:
    """``dur`` in µs (int or float) → ns. Floats below 2^33 µs round-trip exactly to the ns; anything
    that is not a finite number within ±:data:`MAX_NS` ns is invalid."""
    try:
        arr = pa.array(values, type=pa.float64())
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        arr = pa.array([float(v) if isinstance(v, int | float) and not isinstance(v, bool) and abs(v) < 1e300
                        else None for v in values], type=pa.float64())
    f = arr.to_numpy(zero_copy_only=False)
    valid = np.isfinite(f) & (np.abs(f) <= MAX_DUR_NS / 1000.0)
    ns = np.zeros(len(f), dtype=np.int64)
    ns[valid] = np.rint(f[valid] * 1000.0).astype(np.int64)
    return ns, valid


def _columns(acc: _Accumulator, xs: list[Event]) -> None:
    # one comprehension per field is about twice as fast as transposing per-event tuples
    cat = [e.cat for e in xs]
    name = [e.name for e in xs]
    pid = [e.pid for e in xs]
    tid = [e.tid for e in xs]
    ts = [e.ts for e in xs]
    dur = [e.dur for e in xs]
    args = [e.args for e in xs]
    ext = [a.external_id for a in args]
    ext_legacy = [a.external_id_legacy for a in args]
    corr = [a.correlation for a in args]
    device = [a.device for a in args]
    stream = [a.stream for a in args]
    nbytes = [a.bytes for a in args]
    wait_stream = [a.wait_stream for a in args]
    wait_corr = [a.wait_correlation for a in args]
    if None in cat:
        # legacy autograd-profiler lists (PyTorch <= 1.7) have no categories, only these pids
        cat = [c if c is not None else _LEGACY_PID_CATS.get(p) if isinstance(p, str) else None
               for c, p in zip(cat, pid, strict=True)]
    start, ts_ok = us_text_to_ns(ts)
    ts_ok &= (start <= MAX_NS) & (start >= -MAX_NS)
    if not acc.has_fraction:
        acc.has_fraction = any(b"." in bytes(t) for t in ts[:DOT_HEAD_ROWS])
    dur_ns, dur_ok = _dur_ns(dur)
    keep = ts_ok
    dropped = int((~keep).sum())
    cat_arr = _str_column(cat)
    name_arr = _str_column(name)
    pid_arr = _int_column(pid, "pid")
    tid_arr = _int_column(tid, "tid")
    ext_arr = _int_column(ext, "External id")
    if pc.any(pc.is_valid(_int_column(ext_legacy, "external id"))).as_py():
        ext_arr = pc.coalesce(ext_arr, _int_column(ext_legacy, "external id"))
    dur_ns = np.where(dur_ok & (dur_ns > 0), dur_ns, 0)
    rb = pa.record_batch({
        "cat": cat_arr.dictionary_encode(),
        "name": name_arr.dictionary_encode(),
        "start_ns": pa.array(start),
        "dur_ns": pa.array(dur_ns),
        "pid": pid_arr,
        "tid": tid_arr,
        "arg_device": _int_column(device, "device"),
        "arg_stream": _int_column(stream, "stream"),
        "correlation": _int_column(corr, "correlation"),
        "external_id": ext_arr,
        "bytes": _int_column(nbytes, "bytes"),
        "sync_stream": _int_column(wait_stream, "wait_on_stream"),
        "sync_correlation": _int_column(wait_corr, "wait_on_cuda_event_record_corr_id"),
        "_index": pa.array(np.arange(acc.n, acc.n + len(xs), dtype=np.int64)),
    })
    if dropped:
        rb = rb.filter(pa.array(keep))
        acc.dropped += dropped
    # collective metadata: only from events whose name says they may carry it
    names = rb.column("name")
    dict_names = names.dictionary.to_pylist()
    hot = [i for i, n in enumerate(dict_names) if n and _may_carry_comm(n)]
    if hot:
        sel = np.flatnonzero(np.isin(names.indices.to_numpy(zero_copy_only=False), hot))
        index = rb.column("_index").to_numpy()
        base = acc.n
        for j in sel:
            a = args[int(index[j]) - base]
            row = {f: getattr(a, f) for f in COMM_ARG_FIELDS}
            row["_index"] = int(index[j])
            acc.comm_rows.append(row)
    acc.add(rb)
    acc.n += len(xs)

