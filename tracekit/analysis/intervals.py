"""Vectorised interval arithmetic: a sweep over many ranks' activity at once.

Every analysis that asks "what was going on at each instant" (attribution, link activity) reduces to
the same sweep: turn intervals into +1/-1 points per class, sort them per rank, keep running counts,
and sum the lengths of the elementary segments between consecutive points by window and state.
Everything is numpy; nothing loops over events in Python.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_TIME_BITS = 44  # ~4.9 hours of trace per rank in one sort key; longer traces use a lexsort
_PRIO_BITS = 2


@dataclass(frozen=True)
class Sweep:
    """Elementary segments of a sweep: each lies in one window and has constant activity.

    ``state`` has bit c set when at least one interval of class c is active in the segment.
    """

    window: np.ndarray  # index into the windows passed to :func:`sweep`
    length: np.ndarray  # int64 ns
    state: np.ndarray  # int64 bit set of active classes
    start: np.ndarray | None = None  # int64 ns: where each segment begins (segments of a rank are in time order)

    def total(self, n_windows: int, mask: np.ndarray | None = None) -> np.ndarray:
        """Per window, the summed length of the segments selected by ``mask`` (all by default)."""
        w = self.window if mask is None else self.window[mask]
        ln = self.length if mask is None else self.length[mask]
        # float64 sums of int64 lengths are exact below 2^53 ns (104 days) per window
        return np.bincount(w, weights=ln, minlength=n_windows).round().astype(np.int64)


def lane_order(rank: np.ndarray, lane: np.ndarray, start: np.ndarray, end: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    """The stable order of rows by rank, lane, start and end (descending), and each row's lane group in that
    order (nondecreasing; any id per (rank, lane)). ``lane``: integer codes >= -1 in the lanes' order. Rank,
    lane and start packed into one int64 key sort several times faster than the columns (strings above all)
    would; a lexsort when the key does not fit."""
    if rank.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    group = (rank - int(rank.min())) * (int(lane.max()) + 2) + lane + 1
    span = int(start.max()) - int(start.min()) + 1
    if (int(group.max()) + 1) * span < 1 << 62:
        key = group * span + (start - int(start.min()))
        order = np.argsort(key, kind="stable")  # a trace's rows are mostly in order: a merge sort's best case
        _by_end_within_ties(order, key[order], end)
    else:
        order = np.lexsort((-end, start, group))
    return order, group[order]


def _by_end_within_ties(order: np.ndarray, sorted_key: np.ndarray, end: np.ndarray) -> None:
    """Reorder in place the runs of equal ``sorted_key`` in ``order`` by ``end`` descending, stably (rows that
    start together on one lane: the outer one first). Only the rows in such runs are sorted again."""
    tie = sorted_key[1:] == sorted_key[:-1]
    if not tie.any():
        return
    rows = np.zeros(order.size, dtype=bool)
    rows[:-1] = tie
    rows[1:] |= tie
    at = np.flatnonzero(rows)
    sub = order[at]
    order[at] = sub[np.lexsort((-end[sub], sorted_key[at]))]


#: a (rank, value) pair packed into one int64, ``rank * 2^PACK_SHIFT + value``: a join, a sort or a lookup on one
#: column is several times faster than on two
PACK_SHIFT = 40


def packs(rank_lo: int, rank_hi: int, value_lo: int, value_hi: int) -> bool:
    """Whether ranks in ``[rank_lo, rank_hi]`` and values in ``[value_lo, value_hi]`` fit the packed key (ranks below
    2^22, values below 2^PACK_SHIFT, neither negative)."""
    return rank_lo >= 0 and rank_hi < 1 << 22 and value_lo >= 0 and value_hi < 1 << PACK_SHIFT


def first_match(keys: np.ndarray, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per query, whether some key equals it, and the position in ``keys`` of the first that does (meaningless where
    none does): an inner join on one int64 column keeping each key's first row, by numpy's ``unique`` and one
    ``searchsorted`` (several times faster than a polars ``unique`` and join)."""
    uniq, first = np.unique(keys, return_index=True)
    if uniq.size == 0:
        return np.zeros(queries.size, dtype=bool), np.zeros(queries.size, dtype=np.int64)
    pos = np.minimum(np.searchsorted(uniq, queries), uniq.size - 1)
    return uniq[pos] == queries, first[pos]


def distinct(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` of a 1-D integer array by a sort: numpy's hashing ``unique`` takes ~10x longer on a job's
    hundreds of thousands of rows (20-40 ms against 2-4 ms), and on keys spread wide more still."""
    v = np.sort(values)
    return v[np.concatenate(([True], v[1:] != v[:-1]))] if v.size else v


@dataclass(frozen=True)
class Grouped:
    """The positions of each value of an integer array, looked up (:meth:`of`) rather than scanned for: ``order``
    groups the values (:meth:`by`: a stable sort, each value's positions ascending; or an order given), ``keys`` are the
    values in that order. A look-up per value keeps a loop over ranks linear in the rows, where a scan made it
    quadratic."""

    order: np.ndarray
    keys: np.ndarray

    @staticmethod
    def by(values: np.ndarray, order: np.ndarray | None = None) -> Grouped:
        """``values`` grouped by a stable sort, or by ``order`` (any order that sorts them)."""
        order = np.argsort(values, kind="stable") if order is None else order
        return Grouped(order, values[order])

    def of(self, value: int) -> np.ndarray:
        """The positions of ``value``, in the grouping's order."""
        lo, hi = np.searchsorted(self.keys, [value, value + 1])
        return self.order[lo:hi]


def runs(values: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Where ``values`` is nondecreasing (a job's rows come rank by rank, a sweep's segments too): its distinct
    values and the bounds of their runs (``bounds[i]:bounds[i + 1]`` are the rows of the i-th); else None. Rows of
    a value then read as a slice, not gathered, and the distinct values come without a sort."""
    if values.size == 0:
        return values[:0], np.zeros(1, dtype=np.int64)
    if values.size > 1 and not bool((values[1:] >= values[:-1]).all()):
        return None
    first = np.flatnonzero(np.concatenate(([True], values[1:] != values[:-1])))
    return values[first], np.append(first, values.size)


def prev_max_end(lane: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For rows sorted by (lane, start): the max end of the earlier rows of the same lane (or the smallest
    int64 for the first row of a lane) — a segmented running max in one accumulate (``lane``: any group id)."""
    n = lane.size
    lo = np.iinfo(np.int64).min
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    t0 = int(start.min())
    big = int(end.max()) - t0 + 3  # above every end - t0 + 1 (>= 1)
    first = np.ones(n, dtype=bool)
    first[1:] = lane[1:] != lane[:-1]
    dense = np.cumsum(first, dtype=np.int64)
    dense -= 1  # 0, 1, 2 ... per lane, nondecreasing
    if (int(dense[-1]) + 1) * big >= 1 << 62:  # too many lanes x too long a span for one int64 running max
        import polars as pl

        prev = pl.DataFrame({"g": dense, "e": end}).select(pl.col("e").cum_max().shift(1).over("g")).to_series()
        return prev.fill_null(lo).to_numpy()
    # in place over two arrays (a job's millions of rows): run = cummax(dense * big + previous end - t0 + 1)
    run = np.empty(n, dtype=np.int64)
    run[0] = 0
    np.subtract(end[:-1], t0 - 1, out=run[1:])
    run[first] = 0
    dense *= big
    run += dense
    np.maximum.accumulate(run, out=run)
    run -= dense
    none = run <= 0
    run += t0 - 1
    run[none] = lo
    return run


def _order(rank: np.ndarray, time: np.ndarray, prio: np.ndarray) -> np.ndarray:
    """Sort order by (rank, time, prio); one int64 key (stable, run-aware) when it fits."""
    if time.size == 0:
        return np.zeros(0, dtype=np.int64)
    t0 = int(time.min())
    span = int(time.max()) - t0
    if span < (1 << _TIME_BITS) and int(rank.max()) < (1 << (63 - _TIME_BITS - _PRIO_BITS)) and rank.min() >= 0:
        key = (rank.astype(np.int64) << (_TIME_BITS + _PRIO_BITS)) | ((time - t0) << _PRIO_BITS) | prio
        return np.argsort(key, kind="stable")
    return np.lexsort((prio, time, rank))


def sweep(
    rank: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    cls: np.ndarray,
    n_classes: int,
    win_rank: np.ndarray,
    win_start: np.ndarray,
    win_end: np.ndarray,
) -> Sweep:
    """Cut time into segments with constant activity per class, inside the given windows.

    Intervals ``[start, end)`` of class ``cls`` (0..n_classes-1) belong to ``rank``; windows
    ``[win_start, win_end)`` of ``win_rank`` must not overlap on a rank. Returns the segments that
    lie inside a window, which therefore partition every window exactly (to the nanosecond).
    """
    rank = np.asarray(rank, dtype=np.int64)
    start = np.asarray(start, dtype=np.int64)
    end = np.maximum(np.asarray(end, dtype=np.int64), start)
    cls = np.asarray(cls, dtype=np.int64)
    win_rank = np.asarray(win_rank, dtype=np.int64)
    n = start.size
    m = win_start.size
    if m == 0:
        empty = np.zeros(0, dtype=np.int64)
        return Sweep(empty, empty, empty, empty)
    # points: interval starts/ends (prio 1) and window ends (prio 0) / starts (prio 2)
    p_rank = np.concatenate([rank, rank, win_rank, win_rank])
    p_time = np.concatenate([start, end, np.asarray(win_end, np.int64), np.asarray(win_start, np.int64)])
    p_prio = np.concatenate([np.ones(2 * n, np.int64), np.zeros(m, np.int64), np.full(m, 2, np.int64)])
    order = _order(p_rank, p_time, p_prio)
    p_rank = p_rank[order]
    p_time = p_time[order]
    # running count per class; a class is active while its count is positive. Counts fit int32 (at most n
    # intervals) and a state of up to 8 classes one byte: a job's millions of points cost 4 bytes per class pass
    is_interval = order < 2 * n
    # a window marker is no class's point
    point_cls = np.where(is_interval, np.concatenate([cls, cls])[np.minimum(order, 2 * n - 1)], -1) if n \
        else np.full(order.size, -1, np.int64)
    sign = np.where(order < n, 1, -1).astype(np.int32)
    small = n_classes <= 8
    state = np.zeros(order.size, dtype=np.uint8 if small else np.int64)
    d = np.empty(order.size, dtype=np.int32)
    active = np.empty(order.size, dtype=bool)
    for c in range(n_classes):
        np.equal(point_cls, c, out=active)
        np.multiply(sign, active, out=d)
        np.cumsum(d, out=d)
        np.greater(d, 0, out=active)
        if small:
            state |= active.view(np.uint8) << np.uint8(c)
        else:
            state |= active.astype(np.int64) << c
    # current window: the last window marker before each point (-1 after a window end)
    marker = np.full(order.size, -2, dtype=np.int64)
    marker[~is_interval] = np.where(order[~is_interval] < 2 * n + m, -1, order[~is_interval] - 2 * n - m)
    last = np.maximum.accumulate(np.where(marker != -2, np.arange(order.size), -1))
    current = np.where(last >= 0, marker[np.maximum(last, 0)], -1)
    seg_len = np.diff(p_time)
    keep = (p_rank[1:] == p_rank[:-1]) & (current[:-1] >= 0) & (seg_len > 0)
    return Sweep(window=current[:-1][keep], length=seg_len[keep], state=state[:-1][keep].astype(np.int64),
                 start=p_time[:-1][keep])


def union_length(rank: np.ndarray, start: np.ndarray, end: np.ndarray, win_rank: np.ndarray,
                 win_start: np.ndarray, win_end: np.ndarray) -> np.ndarray:
    """Per window, the length of the union of the intervals (concurrent intervals count once)."""
    s = sweep(rank, start, end, np.zeros(len(start), dtype=np.int64), 1, win_rank, win_start, win_end)
    return s.total(len(win_start), s.state > 0)
