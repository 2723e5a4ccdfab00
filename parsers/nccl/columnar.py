"""The columnar fast path of the NCCL log parser: a block of lines as one Arrow string array
(:func:`_utf8_lines`), split into space-separated tokens, and the COLL and (2.24+) TUNING lines -- the bulk
of a big log -- read by token position with vectorised checks (:func:`_fast_block`). Repetitive tokens are
parsed once per distinct value. What it cannot read goes to the per-line path (:mod:`.lines`), the
other INFO lines with their anchor already parsed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

# ---------------------------------------------------------------------------------------------------
# a block's lines as Arrow strings


def _split_lines(data: bytes) -> tuple[bytes, np.ndarray, np.ndarray]:
    """Line boundaries of a block: ``(data, starts, ends)``; ``ends`` excludes ``\\n`` and ``\\r``."""
    buf = np.frombuffer(data, np.uint8)
    nl = np.flatnonzero(buf == 10)
    starts = np.empty(len(nl), np.int64)
    if len(nl):
        starts[0] = 0
        starts[1:] = nl[:-1] + 1
    ends = nl.astype(np.int64)
    if len(nl):
        cr = (buf[np.maximum(nl - 1, 0)] == 13) & (nl > starts)
        ends -= cr
    return data, starts, ends


def _utf8_lines(data: bytes) -> tuple[bytes, np.ndarray, np.ndarray, pa.StringArray]:
    """The lines of a block as an Arrow string array (zero parse). Invalid UTF-8 is replaced
    (U+FFFD) so Arrow's string kernels apply; newlines are unaffected, so line numbers hold."""
    data, starts, ends = _split_lines(data)
    lines = _slices(data, starts, ends)
    try:
        lines.validate(full=True)
    except pa.ArrowInvalid:
        data, starts, ends = _split_lines(data.decode("utf-8", "replace").encode("utf-8"))
        lines = _slices(data, starts, ends)
    return data, starts, ends, lines


def _slices(data: bytes, starts: np.ndarray, ends: np.ndarray) -> pa.StringArray:
    """Zero-parse string array of ``data[starts[i]:ends[i]]`` (sorted, non-overlapping ranges): one
    array over the block with interleaved offsets, of which every other element is kept."""
    n = len(starts)
    if n == 0:
        return pa.array([], pa.string())
    off = np.empty(2 * n + 1, np.int32 if len(data) < (1 << 31) else np.int64)
    off[0:2 * n:2] = starts
    off[1:2 * n:2] = ends
    off[2 * n] = len(data)
    typ = pa.string() if off.dtype == np.int32 else pa.large_string()
    both = pa.Array.from_buffers(typ, 2 * n, [None, pa.py_buffer(off), pa.py_buffer(data)])
    return both.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int64)))


# ---------------------------------------------------------------------------------------------------
# fast path: COLL lines, columnar

#: COLL keywords at their offsets from the ``opCount`` token
_KEYWORDS = ((2, "sendbuff"), (4, "recvbuff"), (6, "count"), (8, "datatype"), (10, "op"), (12, "root"),
             (14, "comm"), (17, "stream"))

#: columns of the raw COLL table (fast and per-line paths alike); repetitive strings are dictionaries
_DICT = pa.dictionary(pa.int32(), pa.string())
_RAW_COLL = pa.schema([
    ("line", pa.int64()), ("sub", pa.int32()), ("host", _DICT), ("pid", pa.int64()),
    ("tid", pa.int64()), ("device", pa.int32()), ("op_raw", _DICT), ("opcount", pa.int64()),
    ("in_place", pa.bool_()), ("count", pa.int64()), ("dtype_id", pa.int32()), ("redop", pa.int32()),
    ("root", pa.int32()), ("comm", _DICT), ("nranks", pa.int32()), ("stream", _DICT),
    ("prefix", _DICT), ("rest", pa.string()), ("orphan", pa.bool_()),
])


def _hex(arr: pa.Array) -> pa.Array:
    """Hex strings (no ``0x``) to int64; null where not hex or too big."""
    return pl.from_arrow(arr).str.to_integer(base=16, strict=False).cast(pl.Int64).to_arrow()


def _np(arr: pa.Array) -> np.ndarray:
    return arr.to_numpy(zero_copy_only=False)


def _str_offsets(arr: pa.Array) -> np.ndarray:
    """The value offsets of a string array (absolute positions in its data buffer), as int64."""
    dt = np.int64 if pa.types.is_large_string(arr.type) else np.int32
    raw = np.frombuffer(arr.buffers()[1], dt)
    return raw[arr.offset:arr.offset + len(arr) + 1].astype(np.int64)


def _digits(arr: pa.Array) -> np.ndarray:
    """Mask of tokens that are 1..18 ASCII digits (castable to int64 without overflow)."""
    return _np(pc.and_(pc.utf8_is_digit(arr), pc.less_equal(pc.utf8_length(arr), 18)))


def _ints(arr: pa.Array, typ: pa.DataType, signed: bool = False) -> tuple[pa.Array, np.ndarray]:
    """Cast decimal tokens to ``typ`` and the mask of valid ones. The whole array is cast at once (the
    usual case: all valid); only when that fails are the bad tokens found and masked."""
    try:
        return pc.cast(arr, typ), np.ones(len(arr), bool)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        ok = _digits(pc.utf8_ltrim(arr, "-") if signed else arr)
        fixed = pc.cast(pc.if_else(pa.array(ok), arr, "0"), typ)
        return fixed, ok


@dataclass
class _Fast:
    """What the columnar path made of a block: COLL rows, TUNING rows, and the other single-anchor
    INFO lines with their anchor already parsed (for the per-line path)."""

    coll: pa.Table | None = None
    tuning: pa.Table | None = None
    done: np.ndarray | None = None  # over the block's lines: handled here (fully or anchor-parsed)
    bare: int = 0  # of those, lines without host:pid:tid
    rest: list[tuple[int, str | None, str, int, int, int | None, str, int]] = field(default_factory=list)


#: TUNING lines in RE2 syntax (Arrow's regex kernels): raw text, normalised in :func:`_tuning_frame`
TUNING_RE2 = (
    r"^\s*(?:(?P<op>[A-Za-z]+)(?: \[Symmetric\])?: )?\s*(?P<bytes>\d{1,18}) Bytes -> "
    r"(?:Algo (?P<algo>\S+) proto (?P<proto>\S+)(?: time (?P<time>\S+))?"
    r"(?: channel\{Lo\.\.Hi\}=\{(?P<lo>\d{1,9})\.\.(?P<hi>\d{1,9})\})?|Kernel (?P<kernel>\S+))(?P<tail>.*)$")

#: TUNING fields as text (the RE2 and per-line paths) ...
_TEXT_TUNING = pa.schema([
    ("line", pa.int64()), ("host", pa.string()), ("pid", pa.int64()), ("op", pa.string()),
    ("bytes", pa.string()), ("algo", pa.string()), ("proto", pa.string()), ("time", pa.string()),
    ("lo", pa.string()), ("hi", pa.string()), ("kernel", pa.string()), ("tail", pa.string()),
])
#: ... and typed, as kept per block (raw NCCL names; normalised in :func:`_tuning_frame`)
_RAW_TUNING = pa.schema([
    ("line", pa.int64()), ("host", _DICT), ("pid", pa.int64()), ("op", _DICT), ("bytes", pa.int64()),
    ("algo", _DICT), ("proto", _DICT), ("time", pa.float64()), ("lo", pa.int32()), ("hi", pa.int32()),
    ("kernel", _DICT), ("tail", pa.string()),
])


def _typed_tuning(t: pa.Table) -> pa.Table:
    """A ``_TEXT_TUNING`` table as ``_RAW_TUNING`` ("" from RE2's non-participating groups -> null)."""
    cols = {}
    for f in _RAW_TUNING:
        c = t.column(f.name)
        if pa.types.is_string(c.type):
            if f.name != "host":  # an empty host is a host
                c = pc.if_else(pc.equal(c, ""), pa.scalar(None, pa.string()), c)
            if f.type == _DICT:
                c = pc.dictionary_encode(c)
            elif f.type != pa.string():
                c = pc.cast(c, f.type, safe=False) if f.name != "time" else _floats(c)
        cols[f.name] = c
    return pa.table(cols, schema=_RAW_TUNING)


def _floats(arr: pa.ChunkedArray) -> pa.Array:
    """Text to float64, null where it is not a number."""
    return pl.from_arrow(arr).cast(pl.Float64, strict=False).to_arrow()


#: one token ``[launcher]:host:pid:tid``: the host starts after the last ``:``, ``[`` or ``]`` before it
#: (as in ANCHOR)
_ANCHOR_TOKEN = re.compile(
    r"^(?P<glued>.*[:\[\]])?(?P<host>[^\s:\[\]]*):(?P<pid>\d{1,18}):(?P<tid>\d{1,18})$")


def _parse_anchor_token(tok: str) -> tuple[str, int, int, int] | None:
    """``[default5]:host:pid:tid`` -> (host, pid, tid, length of the glued launcher prefix)."""
    m = _ANCHOR_TOKEN.match(tok)
    if m is None:
        return None
    # the glued prefix's length in bytes (it is sliced out of the block's bytes), not in characters
    return m["host"], int(m["pid"]), int(m["tid"]), len(m["glued"].encode()) if m["glued"] else 0


def _int_or_none(tok: str, lo: int = 0) -> int | None:
    t = tok[1:] if tok[:1] == "-" else tok
    if not (t.isascii() and t.isdigit()) or len(t) > 18:
        return None
    v = int(tok)
    return v if v >= lo else None


_CHANNELS = re.compile(r"^channel\{Lo\.\.Hi\}=\{(\d{1,9})\.\.(\d{1,9})\}$")


def _channel_range(tok: str) -> tuple[int, int] | None:
    m = _CHANNELS.match(tok)
    return (int(m[1]), int(m[2])) if m else None


def _by_value(arr: pa.Array, fn: Any, types: tuple[pa.DataType, ...]) -> tuple[list[pa.Array], np.ndarray]:
    """Map a column of repetitive tokens through ``fn`` once per distinct value (a dictionary encode
    and a Python call per distinct token instead of string kernels over every row). ``fn`` returns a
    tuple of len(types) or None; returns the mapped columns and the mask of rows that mapped."""
    enc = pc.dictionary_encode(arr)
    mapped = [fn(u) for u in enc.dictionary.to_pylist()]
    ok_u = np.array([m is not None for m in mapped], bool)
    cols = []
    for i, typ in enumerate(types):
        vals = pa.array([m[i] if m is not None else None for m in mapped], typ)
        cols.append(vals.take(enc.indices))
    idx = _np(enc.indices)
    return cols, ok_u[idx] if len(idx) else np.zeros(0, bool)


def _fast_block(data: bytes, starts: np.ndarray, ends: np.ndarray, lines: pa.StringArray,
                line0: int) -> _Fast:
    """Columnar parse of the lines with exactly one ``host:pid:tid [dev] NCCL INFO`` anchor: the line
    is split into space-separated tokens, the anchor found as the tokens before ``NCCL INFO``, and
    COLL fields taken by position after it. Repetitive tokens (anchors, ``[dev]``, op names, datatypes,
    ``[nranks=N]``) are parsed once per distinct value; the rest by vectorised kernels. Lines that fail
    any check are left for the per-line path (``done`` false)."""
    n = len(lines)
    res = _Fast(done=np.zeros(n, bool))
    if n == 0:
        return res
    # every line is tokenised; a second anchor in a line shows as a second "NCCL" token below
    toks = pc.split_pattern(lines, " ")
    loff = _np(toks.offsets).astype(np.int64)
    flat = toks.values
    q = np.flatnonzero(_np(pc.equal(flat, "NCCL")))
    if len(q) == 0:
        return res
    row = np.searchsorted(loff, q, side="right") - 1
    per_row = np.bincount(row, minlength=n)
    ok = (per_row[row] == 1) & (q + 1 < loff[row + 1])
    q, row = q[ok], row[ok]
    lfirst = loff[row]

    def tk(idx: np.ndarray) -> pa.Array:
        return flat.take(pa.array(idx))

    ok = _np(pc.equal(tk(q + 1), "INFO"))
    # "[dev]" before NCCL (INFO lines always have it), then the host:pid:tid token -- or, in excerpts
    # without host prefix, "[dev] NCCL INFO" / "NCCL INFO" starting the line
    (dev,), has_dev = _by_value(tk(np.maximum(q - 1, lfirst)), lambda t: (_int_or_none(t[1:-1], -1),)
                                if t[:1] == "[" and t[-1:] == "]" and _int_or_none(t[1:-1], -1) is not None
                                else None, (pa.int32(),))
    has_dev &= q - 1 >= lfirst
    (host_s, pid_a, tid_a, glued), good = _by_value(tk(np.maximum(q - 2, lfirst)), _parse_anchor_token,
                                                      (pa.string(), pa.int64(), pa.int64(), pa.int64()))
    anchored = has_dev & good & (q - 2 >= lfirst)
    bare = ((q == lfirst) | (has_dev & (q - 1 == lfirst))) & ~anchored
    ok &= anchored | bare
    if not ok.any():
        return res
    if bare[ok].any():
        b = pa.array(bare)
        host_s = pc.if_else(b, "", host_s)
        pid_a = pc.if_else(b, pc.if_else(pa.array(has_dev), pc.subtract(pa.scalar(-2, pa.int64()),
                                                                        pc.cast(dev, pa.int64())), -1), pid_a)
        tid_a = pc.if_else(b, pa.scalar(None, pa.int64()), tid_a)
        glued = pc.if_else(b, 0, glued)
        dev = pc.if_else(pa.array(has_dev), dev, pa.scalar(None, pa.int32()))
    sel = np.flatnonzero(ok)
    if len(sel) < len(q):
        selp = pa.array(sel)
        q, row, bare = q[sel], row[sel], bare[sel]
        dev, host_s, pid_a, tid_a, glued = (a.take(selp) for a in (dev, host_s, pid_a, tid_a, glued))
    fo = _str_offsets(flat)
    first, rend = loff[row], loff[row + 1]

    def char_pos(j: np.ndarray, first: np.ndarray) -> np.ndarray:
        """Byte position of token ``j`` in its line (tokens are separated by one space)."""
        return fo[j] - fo[first] + (j - first)

    line_idx = row
    lstart, lend = starts[line_idx], ends[line_idx]
    plen_chars = np.where(bare, 0, char_pos(np.maximum(q - 2, first), first) + _np(glued))
    has_prefix = plen_chars > 0
    prefix = pa.nulls(len(q), pa.string())
    if has_prefix.any():
        hp = np.flatnonzero(has_prefix)
        prefix = pc.replace_with_mask(prefix, pa.array(has_prefix),
                                      _slices(data, lstart[hp], lstart[hp] + plen_chars[hp]))
    body_start = np.minimum(lstart + char_pos(q + 1, first) + 5, lend)  # after "INFO "
    handled = np.zeros(len(q), bool)

    # COLL: "NCCL INFO <Op>: opCount ..." -- fields at fixed offsets from the opCount token
    p = q + 3
    is_coll = p + 18 < rend
    is_coll[is_coll] &= _np(pc.equal(tk(p[is_coll]), "opCount"))
    ci = np.flatnonzero(is_coll)
    if len(ci):
        pc_ = p[ci]
        t = {d: tk(pc_ + d) for d in (-1, 1, 2, 4, 6, 8, 10, 12, 14, 17)}
        cok = np.ones(len(ci), bool)
        for d, kw in _KEYWORDS:
            cok &= _np(pc.equal(t[d], kw))
        (opname,), good = _by_value(t[-1], lambda x: (x[:-1],) if x[-1:] == ":" and x[:-1].isalpha() and
                                    x[:-1].isascii() else None, (pa.string(),))
        cok &= good
        small = {}
        for d, lo in ((9, 0), (11, 0), (13, -(1 << 31)), (16, 0)):
            tok = tk(pc_ + d)
            if d == 16:
                (v,), good = _by_value(tok, lambda x: (_int_or_none(x[8:-1]),) if x.startswith("[nranks=") and
                                       x[-1:] == "]" and _int_or_none(x[8:-1]) is not None else None,
                                       (pa.int32(),))
            else:
                (v,), good = _by_value(tok, lambda x, lo=lo: None if _int_or_none(x, lo) is None or
                                       abs(_int_or_none(x, lo) or 0) >= 1 << 31 else (_int_or_none(x, lo),),
                                       (pa.int32(),))
            small[d] = v
            cok &= good
        count, good = _ints(tk(pc_ + 7), pa.int64())
        cok &= good
        sendb, recvb = tk(pc_ + 3), tk(pc_ + 5)
        if not cok.all():
            mask = pa.array(cok)
            ci, pc_ = ci[cok], pc_[cok]
            t = {d: v.filter(mask) for d, v in t.items()}
            small = {d: v.filter(mask) for d, v in small.items()}
            opname, count, sendb, recvb = (a.filter(mask) for a in (opname, count, sendb, recvb))
        if len(ci):
            ca = pa.array(ci)
            stream = tk(pc_ + 18)
            rest = pa.nulls(len(ci), pa.string())
            has_rest = rend[ci] > pc_ + 19
            if has_rest.any():
                hr = np.flatnonzero(has_rest)
                rs = (lstart[ci][hr] + char_pos(pc_[hr] + 18, first[ci][hr])
                      + _np(pc.binary_length(stream.take(pa.array(hr)))))
                rest = pc.replace_with_mask(rest, pa.array(has_rest), _slices(data, rs, lend[ci][hr]))
            res.coll = pa.table({
                "line": pa.array(line0 + line_idx[ci], pa.int64()),
                "sub": pa.array(np.zeros(len(ci), np.int32)),
                "host": pc.dictionary_encode(host_s.take(ca)), "pid": pid_a.take(ca), "tid": tid_a.take(ca),
                "device": dev.take(ca), "op_raw": pc.dictionary_encode(opname), "opcount": _hex(t[1]),
                "in_place": pc.equal(sendb, recvb), "count": count, "dtype_id": small[9],
                "redop": small[11], "root": small[13], "comm": pc.dictionary_encode(tk(pc_ + 15)),
                "nranks": small[16], "stream": pc.dictionary_encode(stream),
                "prefix": pc.dictionary_encode(prefix.take(ca)),
                "rest": rest, "orphan": pa.array(np.zeros(len(ci), bool)),
            }, schema=_RAW_COLL)
            handled[ci] = True

    # TUNING, 2.24+: "<Op>: <bytes> Bytes -> Algo <algo> proto <proto> [channel{Lo..Hi}={lo..hi}]"
    tuning: list[pa.Table] = []
    oi = np.flatnonzero(~handled)
    ti = oi[(rend[oi] == q[oi] + 10) | (rend[oi] == q[oi] + 11)]
    if len(ti):
        qt = q[ti]
        tok = {d: tk(qt + d) for d in (2, 3, 4, 5, 6, 7, 8, 9)}
        tm = (_np(pc.equal(tok[4], "Bytes")) & _np(pc.equal(tok[5], "->")) & _np(pc.equal(tok[6], "Algo"))
              & _np(pc.equal(tok[8], "proto")))
        (top,), good = _by_value(tok[2], lambda x: (x[:-1],) if x[-1:] == ":" and x[:-1].isascii()
                                 and x[:-1].isalpha() else None, (pa.string(),))
        tm &= good
        nbytes, good = _ints(tok[3], pa.int64())
        tm &= good
        has_ch = rend[ti] == qt + 11
        lo = hi = pa.nulls(len(ti), pa.int32())
        if has_ch.any():
            (lo, hi), good = _by_value(tk(np.where(has_ch, qt + 10, qt + 9)), _channel_range,
                                       (pa.int32(), pa.int32()))
            tm &= good | ~has_ch
        if tm.any():
            mk = pa.array(tm)
            src = pa.array(ti[tm])
            tuning.append(pa.table({
                "line": pa.array(line0 + line_idx[ti[tm]], pa.int64()),
                "host": pc.dictionary_encode(host_s.take(src)), "pid": pid_a.take(src),
                "op": pc.dictionary_encode(top.filter(mk)), "bytes": nbytes.filter(mk),
                "algo": pc.dictionary_encode(tok[7].filter(mk)),
                "proto": pc.dictionary_encode(tok[9].filter(mk)),
                "time": pa.nulls(int(tm.sum()), pa.float64()), "lo": lo.filter(mk), "hi": hi.filter(mk),
                "kernel": pa.nulls(int(tm.sum()), _DICT), "tail": pa.nulls(int(tm.sum()), pa.string()),
            }, schema=_RAW_TUNING))
            handled[ti[tm]] = True

    # everything else: the body after "NCCL INFO " (other TUNING shapes through RE2)
    oi = np.flatnonzero(~handled)
    if len(oi):
        bodies = _slices(data, body_start[oi], lend[oi])
        is_tuning = _np(pc.match_substring(bodies, " Bytes -> "))
        if is_tuning.any():
            ti = np.flatnonzero(is_tuning)
            ext = pc.extract_regex(bodies.take(pa.array(ti)), TUNING_RE2)
            valid = _np(ext.is_valid())
            if valid.any():
                tv = ti[valid]
                good = ext.filter(pa.array(valid))
                src = pa.array(oi[tv])
                tuning.append(_typed_tuning(pa.table({
                    "line": pa.array(line0 + line_idx[oi[tv]], pa.int64()),
                    "host": host_s.take(src), "pid": pid_a.take(src),
                    **{k: good.field(k) for k in ("op", "bytes", "algo", "proto", "time", "lo", "hi",
                                                   "kernel", "tail")},
                }, schema=_TEXT_TUNING)))
                handled[oi[tv]] = True
        left = np.flatnonzero(~handled[oi])
        if len(left):
            li = oi[left]
            la = pa.array(li)
            res.rest = list(zip(
                (line0 + line_idx[li]).tolist(), prefix.take(la).to_pylist(), host_s.take(la).to_pylist(),
                pid_a.take(la).to_pylist(), tid_a.take(la).to_pylist(), dev.take(la).to_pylist(),
                bodies.take(pa.array(left)).to_pylist(), (lend[li] - lstart[li] - plen_chars[li]).tolist(),
                strict=True))
    if tuning:
        res.tuning = pa.concat_tables(tuning).unify_dictionaries().combine_chunks()
    res.done[line_idx] = True
    res.bare = int(bare.sum())
    return res
