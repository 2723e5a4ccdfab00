"""µs text → ns is exact (no float round-trip)."""

from __future__ import annotations

from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.parsers.timestamps import us_text_to_ns


def test_spellings() -> None:
    texts = [b"1669783687464181", b"4458676524595.135", b"0", b"-12.5", b"1.5e3", b"", b"null", b"12.3456789",
             b"7.", b".5", b"1-2", b'"42"', b"-0.001"]
    values, valid = us_text_to_ns(texts)
    assert list(valid) == [True, True, True, True, True, False, False, True, True, True, False, True, True]
    assert [int(v) for v, ok in zip(values, valid, strict=True) if ok] == [
        1669783687464181000, 4458676524595135, 0, -12500, 1500000, 12345, 7000, 500, 42000, -1]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 9 * 10**15), st.integers(0, 999), st.sampled_from([0, 1, 2, 3])),
                min_size=1, max_size=50))
def test_exact_against_decimal(parts) -> None:
    texts = []
    for whole, frac, digits in parts:
        texts.append(f"{whole}.{str(frac).zfill(3)[:digits]}".rstrip(".").encode() if digits else str(whole).encode())
    values, valid = us_text_to_ns(texts)
    assert valid.all()
    assert [int(v) for v in values] == [int(Decimal(t.decode()) * 1000) for t in texts]
