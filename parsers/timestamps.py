"""Exact conversion of JSON number text in microseconds to int64 nanoseconds.

Kineto writes ``ts``/``dur`` as decimal µs (``1669783687464181``, ``4458676524595.135``). A float
round-trip loses nanoseconds (a float64 step is 0.25 µs near epoch µs), so the text itself is parsed:
integer part × 1000 + the fraction padded to three digits, vectorised over a whole batch with numpy.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_POW10 = 10 ** np.arange(19, dtype=np.int64)


def us_text_to_ns(texts: list | tuple) -> tuple[np.ndarray, np.ndarray]:
    """Convert µs number texts (bytes-like) to ns. Returns ``(values int64, valid bool)``.

    Plain decimals (optional ``-``, digits, optional ``.`` fraction) are converted with Arrow string
    kernels: drop the dot, parse the digits as an integer, scale by the number of fraction digits
    (digits beyond the nanosecond are truncated). Anything else (exponents, quoted numbers) goes
    through :class:`decimal.Decimal`; empty, ``null`` or non-numeric text is invalid.
    """
    n = len(texts)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] >= 2**31:
        return _slow_all(texts)
    strings = pa.StringArray.from_buffers(n, pa.py_buffer(offsets.astype(np.int32)),
                                          pa.py_buffer(b"".join(texts)))
    dot = pc.find_substring(strings, ".").to_numpy(zero_copy_only=False).astype(np.int64)
    frac = np.where(dot >= 0, lengths - dot - 1, 0)
    digits = pc.replace_substring(strings, ".", "", max_replacements=1)
    empty = lengths == 0
    if empty.any():
        digits = pc.if_else(pa.array(empty), pa.scalar("0"), digits)
    try:
        raw = pc.cast(digits, pa.int64()).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return _slow_all(texts)
    scale_up = np.clip(3 - frac, 0, 18)
    scale_down = np.clip(frac - 3, 0, 18)
    values = (raw // _POW10[scale_down]) if scale_down.any() else raw
    if scale_down.any():
        values = np.where(raw < 0, -((-raw) // _POW10[scale_down]), values)
    over = np.abs(values) >= (2**63 - 1) // _POW10[scale_up]
    values = values * _POW10[scale_up]
    valid = ~empty & ~over & (lengths > (dot == 0))
    if over.any():
        for i in np.flatnonzero(over):
            v = _slow(bytes(texts[i]))
            valid[i] = v is not None
            values[i] = v or 0
    return values, valid


def _slow_all(texts: list | tuple) -> tuple[np.ndarray, np.ndarray]:
    """Element-wise Decimal conversion for batches with unusual spellings."""
    conv = [_slow(bytes(t)) for t in texts]
    values = np.array([0 if v is None else v for v in conv], dtype=np.int64)
    valid = np.array([v is not None for v in conv], dtype=bool)
    return values, valid


def _slow(text: bytes) -> int | None:
    """Decimal fallback for exponents, quoted numbers and other rare spellings."""
    t = text.strip().strip(b'"')
    if not t or t in (b"null",):
        return None
    if len(t) > 64:  # no number of a real trace is that long; Decimal work grows with the digits
        return None
    try:
        d = Decimal(t.decode("ascii"))
    except (InvalidOperation, UnicodeDecodeError, ValueError):
        return None
    # a finite value with a sane exponent: 1e22011000 would overflow Decimal's context, 1e-400 is 0
    if not d.is_finite() or d.adjusted() > 24:
        return None
    if d.adjusted() < -24:
        return 0
    ns = int(d * 1000)
    if abs(ns) >= 2**63:
        return None
    return ns
