"""Integer bounds, written once: whether a number read from a file fits the column it goes into.

A value beyond its column's type is damage (a 70-digit rank, a world size of 2^40): the parsers make it unknown
(None, null) instead of failing the parse. Shared by the formats; imports nothing.
"""

from __future__ import annotations

from typing import Any

#: the int32 columns' range, ``[INT32_MIN, INT32_END)``: ranks, world sizes, devices, peers
INT32_MIN = -(1 << 31)
INT32_END = 1 << 31


def int_in(v: Any, lo: int = INT32_MIN, end: int = INT32_END) -> int | None:
    """``v`` if it is an int (a bool is not) with ``lo <= v < end``, else None; int32 by default."""
    return v if isinstance(v, int) and not isinstance(v, bool) and lo <= v < end else None


def within(values: Any, lo: int = INT32_MIN, end: int = INT32_END) -> Any:
    """Per element of an integer array, whether ``lo <= value < end`` (a boolean array); int32 by default."""
    return (values >= lo) & (values < end)
