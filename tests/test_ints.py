"""parsers/ints.py: the one int-range check the parsers use for what goes into an integer column."""

from __future__ import annotations

import numpy as np

from tracekit.parsers.ints import INT32_END, INT32_MIN, int_in, within


def test_int_in_takes_ints_of_the_range_only() -> None:
    assert int_in(0) == 0 and int_in(INT32_MIN) == INT32_MIN and int_in(INT32_END - 1) == INT32_END - 1
    assert int_in(INT32_END) is None and int_in(INT32_MIN - 1) is None and int_in(10**70) is None
    for not_an_int in (True, False, None, 3.0, "3", [3]):
        assert int_in(not_an_int) is None
    assert int_in(0, 1) is None and int_in(1, 1) == 1  # a world size: at least 1
    assert int_in(5, 0, 5) is None and int_in(4, 0, 5) == 4


def test_within_is_int_in_per_element() -> None:
    values = np.array([INT32_MIN - 1, INT32_MIN, -1, 0, INT32_END - 1, INT32_END, 1 << 62], np.int64)
    assert within(values).tolist() == [int_in(int(v)) is not None for v in values]
    assert within(values, 0).tolist() == [int_in(int(v), 0) is not None for v in values]
