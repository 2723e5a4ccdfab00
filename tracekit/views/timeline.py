"""The timeline view model: every lane of a job, pre-binned into levels of detail for drawing.

A terminal timeline shows one row per lane (rank × CPU thread / device stream) and one cell per
:func:`cell_ns` nanoseconds (four zoom steps per doubling). Whatever the trace size, drawing a row
must cost O(cells), never O(events). This module prepares everything the drawing needs, with numpy and no Textual:

- per lane and per event kind, the *union* of the kind's activity as disjoint sorted intervals with
  prefix sums (:class:`Intervals`), so the busy time of any time range is two binary searches;
- per lane, levels of detail: the busy time of every kind in bins of ``2**p`` ns for each power of
  two ``p`` from the finest stored level (at most :data:`FINEST_BINS` bins across the job) to one bin
  for the whole job. A cell of ``m * 2**p`` ns (m = 4..7) is ``m`` whole bins of level ``p``, so a row
  is a slice and a sum; zooms finer than the finest level are binned on demand from the intervals,
  which costs O(cells · log events);
- per rank, a *classes* lane: the five attribution classes of :mod:`tracekit.analysis.attribution`
  (compute, overlapped, exposed_comm, memory, idle) over time, from the same activity definition, so
  its bins add up to the ``breakdown`` table's numbers;
- the events of each lane sorted by start, for the event under the cursor, jumps to the next
  communication and name search (:class:`Marks`).

Busy time is conserved exactly: the bins of any level add up to the busy time of the lane (int64 ns).
All times here are on the job clock: a rank's times plus its ``ranks.clock_offset_ns``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.model.schema import CLASSES

if TYPE_CHECKING:
    import polars as pl

    from tracekit.analysis.pipeline import Analysis

#: event kinds drawn on event lanes, highest drawing priority first (a cell shows its busiest kind;
#: ties go to the earlier one). Annotations (ProfilerStep#N, ...) are metadata and are not drawn.
DRAWN_KINDS: tuple[str, ...] = ("comm", "wait", "queue", "memory", "compute", "runtime", "cpu_op")
#: the name of the per-rank lane that shows the attribution classes
CLASSES_LANE = "classes"
#: the finest stored level has at most this many bins across the whole job
FINEST_BINS = 1 << 13
_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class Intervals:
    """Disjoint intervals ``[start, end)`` sorted by start, with prefix sums of their lengths.

    ``first`` is, for each interval, the index (into the model's sorted event arrays) of the event
    that opened it, or -1 when the interval does not come from one event.
    """

    start: np.ndarray
    end: np.ndarray
    first: np.ndarray
    cum: np.ndarray  # cum[i] = total length of intervals before i; len n + 1

    @classmethod
    def empty(cls) -> Intervals:
        return cls(_EMPTY, _EMPTY, _EMPTY, np.zeros(1, dtype=np.int64))

    @classmethod
    def union(cls, start: np.ndarray, end: np.ndarray, index: np.ndarray | None = None) -> Intervals:
        """The union of intervals given sorted by start (``end`` may nest or overlap)."""
        n = start.size
        if n == 0:
            return cls.empty()
        end = np.maximum(end, start)
        reach = np.maximum.accumulate(end)
        # a new interval starts where the start is past everything before it
        new = np.empty(n, dtype=bool)
        new[0] = True
        new[1:] = start[1:] > reach[:-1]
        heads = np.flatnonzero(new)
        tails = np.append(heads[1:] - 1, n - 1)
        s, e = start[heads], reach[tails]
        first = heads if index is None else index[heads]
        return cls.from_disjoint(s, e, first.astype(np.int64))

    @classmethod
    def from_disjoint(cls, start: np.ndarray, end: np.ndarray, first: np.ndarray | None = None) -> Intervals:
        """Wrap intervals that are already disjoint and sorted (empty ones are dropped)."""
        keep = end > start
        if not keep.all():
            start, end = start[keep], end[keep]
            first = first[keep] if first is not None else None
        cum = np.zeros(start.size + 1, dtype=np.int64)
        np.cumsum(end - start, out=cum[1:])
        first = np.full(start.size, -1, dtype=np.int64) if first is None else first
        return cls(start.astype(np.int64), end.astype(np.int64), first, cum)

    def __len__(self) -> int:
        return int(self.start.size)

    @property
    def total(self) -> int:
        """Total covered length in ns."""
        return int(self.cum[-1])

    def covered_before(self, t: np.ndarray) -> np.ndarray:
        """For each time in ``t``, the covered length in ``(-inf, t)``."""
        t = np.asarray(t, dtype=np.int64)
        n = self.start.size
        if n == 0:
            return np.zeros(t.shape, dtype=np.int64)
        i = np.searchsorted(self.end, t, side="right")  # intervals ending at or before t are whole
        j = np.minimum(i, n - 1)
        partial = np.where(i < n, np.clip(t - self.start[j], 0, None), 0)
        return self.cum[i] + partial

    def coverage(self, edges: np.ndarray) -> np.ndarray:
        """Covered ns inside each bin ``[edges[k], edges[k+1])``."""
        return np.diff(self.covered_before(edges))

    def overlapping(self, t0: int, t1: int) -> tuple[int, int]:
        """Index range of the intervals that overlap ``[t0, t1)``."""
        i0 = int(np.searchsorted(self.end, t0, side="right"))
        i1 = int(np.searchsorted(self.start, t1, side="left"))
        return i0, max(i0, i1)

    def intersect(self, other: Intervals) -> Intervals:
        """The intervals covered by both ``self`` and ``other``."""
        if not len(self) or not len(other):
            return Intervals.empty()
        t = np.concatenate([self.start, self.end, other.start, other.end])
        d = np.concatenate([np.ones(len(self), np.int8), -np.ones(len(self), np.int8),
                            np.ones(len(other), np.int8), -np.ones(len(other), np.int8)])
        order = np.lexsort((d, t))  # ends before starts at equal times: touching is not overlapping
        t, d = t[order], d[order]
        depth = np.cumsum(d, dtype=np.int64)
        opens = np.flatnonzero(depth == 2)
        return Intervals.from_disjoint(t[opens], t[opens + 1])

    def merge(self, *others: Intervals) -> Intervals:
        """The union of ``self`` and ``others``."""
        parts = [self, *others]
        s = np.concatenate([p.start for p in parts])
        e = np.concatenate([p.end for p in parts])
        order = np.argsort(s, kind="stable")
        out = Intervals.union(s[order], e[order])
        return Intervals.from_disjoint(out.start, out.end)


@dataclass
class Lane:
    """One row of the timeline.

    An *event* lane draws the kinds in ``kinds`` (a subset of :data:`DRAWN_KINDS`, in that order) from
    ``sets`` (one :class:`Intervals` per kind) plus ``busy`` (their union). A *classes* lane draws
    the attribution classes; ``sets`` then holds compute, communication, compute ∪ communication,
    compute ∪ communication ∪ memory, each inside the iteration windows, and the windows themselves.
    """

    index: int
    rank: int
    name: str
    kinds: tuple[str, ...]
    sets: tuple[Intervals, ...]
    busy: Intervals
    ev_lo: int = 0  # this lane's events in the model's sorted event arrays: [ev_lo, ev_hi)
    ev_hi: int = 0
    levels: list[np.ndarray] = field(default_factory=list)

    @property
    def is_classes(self) -> bool:
        return self.name == CLASSES_LANE

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.is_classes else self.name

    def coverage(self, edges: np.ndarray) -> np.ndarray:
        """Busy ns per bin: shape ``(bins, len(kinds) + 1)``; the last column is the lane's union
        (for a classes lane: the iteration windows, so idle counts)."""
        if not self.is_classes:
            cols = [s.coverage(edges) for s in self.sets]
            cols.append(self.busy.coverage(edges))
            return np.stack(cols, axis=1)
        c, t, ct, ctm, w = (s.coverage(edges) for s in self.sets)
        compute = ct - t
        overlapped = c + t - ct
        exposed = ct - c
        memory = ctm - ct
        idle = w - ctm
        return np.stack([compute, overlapped, exposed, memory, idle, w], axis=1)

    def bin_levels(self, edges: np.ndarray) -> None:
        """Bin the lane at ``edges`` (the finest stored level), then sum pairs of bins up to one bin."""
        level = self.coverage(edges)
        levels = [level]
        while level.shape[0] > 1:
            if level.shape[0] % 2:
                level = np.vstack([level, np.zeros((1, level.shape[1]), dtype=level.dtype)])
            level = level[0::2] + level[1::2]
            levels.append(level)
        self.levels = levels


@dataclass(frozen=True)
class Cells:
    """One lane row at one zoom: per cell the kind to draw (index into ``Lane.kinds``, -1 for nothing)
    and how much of the cell is busy (0..1)."""

    kind: np.ndarray
    fill: np.ndarray


@dataclass
class Marks:
    """Spans on lanes that the cursor can jump between and the timeline highlights: search hits now,
    the critical path when that analysis exists. Sorted by start time."""

    name: str
    lane: np.ndarray  # int32 lane index
    start: np.ndarray  # int64 job-clock ns
    end: np.ndarray
    event: np.ndarray  # index into the model's sorted event arrays, -1 if none
    #: what each mark is, for a details panel (e.g. a critical-path segment's label); None if nothing
    label: np.ndarray | None = None
    _per_lane: dict[int, Intervals] = field(default_factory=dict, repr=False)
    _lane_order: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        order = np.lexsort((self.lane, self.start))
        self.lane, self.start = self.lane[order], self.start[order]
        self.end, self.event = self.end[order], self.event[order]
        if self.label is not None:
            self.label = self.label[order]

    def __len__(self) -> int:
        return int(self.start.size)

    def next_after(self, t: int, lanes: np.ndarray | None = None) -> int | None:
        """Index of the first mark starting after ``t`` (on one of ``lanes`` if given)."""
        i = int(np.searchsorted(self.start, t, side="right"))
        if lanes is None:
            return i if i < len(self) else None
        hit = np.flatnonzero(np.isin(self.lane[i:], lanes))
        return i + int(hit[0]) if hit.size else None

    def prev_before(self, t: int, lanes: np.ndarray | None = None) -> int | None:
        """Index of the last mark starting before ``t`` (on one of ``lanes`` if given)."""
        i = int(np.searchsorted(self.start, t, side="left"))
        if lanes is None:
            return i - 1 if i > 0 else None
        hit = np.flatnonzero(np.isin(self.lane[:i], lanes))
        return int(hit[-1]) if hit.size else None

    def at(self, lane: int, t0: int, t1: int) -> int | None:
        """The mark of ``lane`` that overlaps ``[t0, t1)`` the most (a zero-length mark inside counts),
        or None."""
        got = self._lane_order.get(lane)
        if got is None:
            idx = np.flatnonzero(self.lane == lane)  # sorted by start, as the marks are
            got = (idx, np.maximum.accumulate(self.end[idx]) if idx.size else idx)
            self._lane_order[lane] = got
        idx, reach = got
        # only marks that start before t1 and whose lane has reached past t0 by then can overlap
        lo = int(np.searchsorted(reach, t0, side="left"))
        hi = int(np.searchsorted(self.start[idx], t1, side="left"))
        if hi <= lo:
            return None
        idx = idx[lo:hi]
        s, e = self.start[idx], self.end[idx]
        overlap = np.minimum(e, t1) - np.maximum(s, t0)
        ok = (overlap > 0) | ((e == s) & (s >= t0) & (s < t1))
        if not ok.any():
            return None
        cand = np.flatnonzero(ok)
        return int(idx[cand[int(np.argmax(overlap[cand]))]])

    def on_lane(self, lane: int) -> Intervals:
        """The marks of one lane as a union of intervals (for highlighting cells)."""
        got = self._per_lane.get(lane)
        if got is None:
            sel = self.lane == lane
            s, e = self.start[sel], np.maximum(self.end[sel], self.start[sel] + 1)
            order = np.argsort(s, kind="stable")
            got = Intervals.union(s[order], e[order])
            self._per_lane[lane] = got
        return got


def column_codes(col: pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    """Dictionary codes (int32, -1 for null) and values of a string or dictionary column."""
    if not pa.types.is_dictionary(col.type):
        col = pc.dictionary_encode(col)
    col = pa.chunked_array(col.chunks, type=col.type) if col.num_chunks else pa.chunked_array([], col.type)
    unified = pa.table({"c": col}).unify_dictionaries().column("c")
    if unified.num_chunks == 0:
        return np.zeros(0, dtype=np.int32), []
    values = [str(v) for v in unified.chunk(0).dictionary.to_pylist()]
    codes = np.concatenate([pc.fill_null(c.indices, -1).to_numpy(zero_copy_only=False).astype(np.int32)
                            for c in unified.chunks])
    return codes, values


def lane_sort_key(name: str) -> tuple[int, list[object]]:
    """Device streams first, then CPU threads, then anything else; numbers in names compare as numbers."""
    group = 0 if name.startswith("gpu") else 1 if name.startswith("cpu") else 2
    parts: list[object] = [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]
    return group, parts


def _zoom_parts(zoom: int) -> tuple[int, int]:
    """Zoom ``z`` means cells of ``m * 2**p`` ns with ``m = 4 + z % 4`` and ``p = z // 4``: four steps
    per doubling, each cell a whole number of bins of the level of ``2**p`` ns bins."""
    return 4 + zoom % 4, zoom // 4


def cell_ns(zoom: int) -> int:
    """Nanoseconds per cell at zoom ``zoom`` (4, 5, 6, 7, 8, 10, 12, 14, 16, 20, ... ns)."""
    m, p = _zoom_parts(zoom)
    return m << p


def _nice_step(ns: float) -> int:
    """The smallest 1-2-5 × 10^k ns that is at least ``ns``."""
    ns = max(ns, 1.0)
    mag = 10 ** int(np.floor(np.log10(ns)))
    for m in (1, 2, 5, 10):
        if m * mag >= ns:
            return int(m * mag)
    return int(10 * mag)


class TimelineModel:
    """All lanes of a job with their levels of detail and sorted events (see the module docstring).

    Build it with :meth:`build`; every query is O(cells) or O(log events) except the event under the
    cursor, which looks at the events that overlap one cell.
    """

    def __init__(self, lanes: list[Lane], t0: int, t1: int, *, ev_row: np.ndarray, ev_start: np.ndarray,
                 ev_end: np.ndarray, ev_kind: np.ndarray, ev_name: np.ndarray, names: list[str],
                 iterations: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]],
                 clock_offsets: dict[int, int] | None = None, finest: int = FINEST_BINS) -> None:
        self.lanes = lanes
        self.t0 = t0
        self.t1 = max(t1, t0 + 1)
        #: sorted event arrays: by lane, then start. ``ev_row`` is the row of ``Analysis.events``.
        self.ev_row, self.ev_start, self.ev_end = ev_row, ev_start, ev_end
        self.ev_kind, self.ev_name, self.names = ev_kind, ev_name, names
        #: per rank: iteration numbers, window starts and ends (job clock), sorted by start
        self.iterations = iterations
        #: per rank: ns added to the rank's own times to put them on the job clock
        self.clock_offsets = clock_offsets or {}
        span = self.t1 - self.t0
        self.finest_exp = max(0, int(np.ceil(np.log2(max(span / finest, 1.0)))))
        self._reach: dict[int, np.ndarray] = {}
        self._build_levels()

    # ------------------------------------------------------------------ construction

    @classmethod
    def build(cls, analysis: Analysis, *, finest: int = FINEST_BINS) -> TimelineModel:
        """Lanes, levels and sorted events of ``analysis`` (its events with iterations assigned)."""
        import polars as pl  # building needs polars; drawing from a built model does not

        ev = analysis.events
        # the aligned clocks (the TraceSet's ranks are as read: every offset 0), as the critical path's marks are
        offsets = dict(zip(analysis.ranks.column("rank").to_pylist(),
                           analysis.ranks.column("clock_offset_ns").to_pylist(), strict=True))
        kind_codes, kind_values = column_codes(ev.column("kind"))
        drawn = np.array([DRAWN_KINDS.index(k) if k in DRAWN_KINDS else -1 for k in kind_values] or [-1],
                         dtype=np.int8)
        kind = drawn[np.maximum(kind_codes, 0)] if kind_codes.size else np.zeros(0, np.int8)
        kind[kind_codes < 0] = -1
        rank = pc.fill_null(ev.column("rank"), -1).to_numpy().astype(np.int64)
        start = pc.fill_null(ev.column("start_ns"), 0).to_numpy().astype(np.int64)
        dur = np.maximum(pc.fill_null(ev.column("dur_ns"), 0).to_numpy().astype(np.int64), 0)
        lane_codes, lane_values = column_codes(ev.column("lane"))
        keep = np.flatnonzero((kind >= 0) & (rank >= 0) & (lane_codes >= 0))
        off_by_rank = np.zeros(int(rank.max()) + 2 if rank.size else 1, dtype=np.int64)
        for r, o in offsets.items():
            if r is not None and 0 <= r < off_by_rank.size:
                off_by_rank[r] = o or 0
        start = start + off_by_rank[np.maximum(rank, 0)]

        # lanes: one per (rank, lane name), ordered by rank then device streams, CPU threads
        combo = rank[keep] * max(len(lane_values), 1) + lane_codes[keep]
        present = np.unique(combo) if combo.size else _EMPTY
        pairs = [(int(c) // max(len(lane_values), 1), lane_values[int(c) % max(len(lane_values), 1)]) for c in present]
        pairs.sort(key=lambda p: (p[0], lane_sort_key(p[1])))
        lane_of_combo = {r * max(len(lane_values), 1) + lane_values.index(n): i for i, (r, n) in enumerate(pairs)}
        lut = np.full(int(present.max()) + 1 if present.size else 1, -1, dtype=np.int64)
        for c, i in lane_of_combo.items():
            lut[c] = i
        lane_id = lut[combo] if combo.size else _EMPTY

        # sort the kept events by (lane, start): one parallel polars sort
        order = (pl.DataFrame({"l": lane_id, "s": start[keep]}).with_row_index("i")
                 .sort(["l", "s"]).get_column("i").to_numpy())
        rows = keep[order]
        ev_start = start[rows]
        ev_end = ev_start + dur[rows]
        ev_kind = kind[rows]
        name_codes, names = column_codes(ev.column("name"))
        ev_name = name_codes[rows] if name_codes.size else np.zeros(0, np.int32)
        sorted_lane = lane_id[order]
        bounds = np.searchsorted(sorted_lane, np.arange(len(pairs) + 1))

        lanes: list[Lane] = []
        windows = cls._windows(analysis.iterations, off_by_rank)
        act = cls._activity(analysis, off_by_rank)
        for r in sorted({p[0] for p in pairs} | set(windows)):
            if r in windows:
                lanes.append(cls._classes_lane(len(lanes), r, act.get(r), windows[r][1:]))
            for i, (pr, name) in enumerate(pairs):
                if pr != r:
                    continue
                lo, hi = int(bounds[i]), int(bounds[i + 1])
                lanes.append(cls._event_lane(len(lanes), r, name, lo, hi, ev_start, ev_end, ev_kind))
        firsts = [int(ev_start.min())] if ev_start.size else []
        lasts = [int(ev_end.max())] if ev_end.size else []
        firsts += [int(w[1].min()) for w in windows.values() if w[1].size]
        lasts += [int(w[2].max()) for w in windows.values() if w[2].size]
        t0 = min(firsts, default=0)
        t1 = max(lasts, default=t0 + 1)
        return cls(lanes, t0, t1, ev_row=rows.astype(np.int64), ev_start=ev_start, ev_end=ev_end,
                   ev_kind=ev_kind, ev_name=ev_name, names=names, iterations=windows,
                   clock_offsets={int(r): int(o or 0) for r, o in offsets.items() if r is not None},
                   finest=finest)

    @staticmethod
    def _windows(iterations: pa.Table, off_by_rank: np.ndarray
                 ) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        import polars as pl

        out: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        if iterations.num_rows == 0:
            return out
        df = pl.from_arrow(iterations.select(["rank", "iteration", "start_ns", "end_ns"]))
        assert isinstance(df, pl.DataFrame)
        for (r,), g in df.sort(["rank", "start_ns"]).group_by(["rank"], maintain_order=True):
            off = int(off_by_rank[int(r)]) if 0 <= int(r) < off_by_rank.size else 0  # type: ignore[arg-type]
            out[int(r)] = (g.get_column("iteration").to_numpy(),  # type: ignore[arg-type]
                           g.get_column("start_ns").to_numpy() + off, g.get_column("end_ns").to_numpy() + off)
        return out

    @staticmethod
    def _activity(analysis: Analysis, off_by_rank: np.ndarray) -> dict[int, pl.DataFrame]:
        """Attribution's activity intervals (compute / communication / memory) per rank."""
        import polars as pl

        act = analysis.activity  # computed once for the top ops, the idle split and this
        if act.height == 0:
            return {}
        return {int(r): g.sort("start_ns")  # type: ignore[arg-type]
                .with_columns(pl.col("start_ns") + int(off_by_rank[int(r)]),  # type: ignore[arg-type]
                              pl.col("end_ns") + int(off_by_rank[int(r)]))  # type: ignore[arg-type]
                for (r,), g in act.group_by(["rank"])}

    @staticmethod
    def _classes_lane(index: int, rank: int, act: pl.DataFrame | None,
                      window: tuple[np.ndarray, np.ndarray]) -> Lane:
        import polars as pl

        from tracekit.analysis import attribution

        w = Intervals.union(window[0].astype(np.int64), window[1].astype(np.int64))
        w = Intervals.from_disjoint(w.start, w.end)

        def of(cls_ids: tuple[int, ...]) -> Intervals:
            if act is None:
                return Intervals.empty()
            sel = act.filter(pl.col("cls").is_in(list(cls_ids)))
            u = Intervals.union(sel.get_column("start_ns").to_numpy().astype(np.int64),
                                sel.get_column("end_ns").to_numpy().astype(np.int64))
            return u.intersect(w)

        c = of((attribution.COMPUTE,))
        t = of((attribution.TRANSFER, attribution.WAIT))
        ct = of((attribution.COMPUTE, attribution.TRANSFER, attribution.WAIT))
        ctm = of((attribution.COMPUTE, attribution.TRANSFER, attribution.WAIT, attribution.MEMORY))
        return Lane(index, rank, CLASSES_LANE, CLASSES, (c, t, ct, ctm, w), busy=w)

    @staticmethod
    def _event_lane(index: int, rank: int, name: str, lo: int, hi: int, ev_start: np.ndarray,
                    ev_end: np.ndarray, ev_kind: np.ndarray) -> Lane:
        s, e, k = ev_start[lo:hi], ev_end[lo:hi], ev_kind[lo:hi]
        idx = np.arange(lo, hi, dtype=np.int64)
        present = sorted(set(np.unique(k).tolist()))
        kinds = tuple(DRAWN_KINDS[i] for i in present)
        sets = []
        for i in present:
            sel = k == i
            sets.append(Intervals.union(s[sel], e[sel], idx[sel]))
        busy = Intervals.union(s, e, idx)
        return Lane(index, rank, name, kinds, tuple(sets), busy, ev_lo=lo, ev_hi=hi)

    def _finest_edges(self) -> np.ndarray:
        """The bin edges of the finest stored level, over the whole span."""
        w0 = 1 << self.finest_exp
        n0 = max(1, -(-(self.t1 - self.t0) // w0))
        return self.t0 + np.arange(n0 + 1, dtype=np.int64) * w0

    def _build_levels(self) -> None:
        """Bin every lane at the finest stored level, then sum pairs of bins up to one bin."""
        edges = self._finest_edges()
        for lane in self.lanes:
            lane.bin_levels(edges)

    # ------------------------------------------------------------------ queries

    @property
    def span(self) -> int:
        return self.t1 - self.t0

    @property
    def events(self) -> int:
        return int(self.ev_start.size)

    def fit_zoom(self, width: int, span: int | None = None) -> int:
        """The finest zoom that shows ``span`` ns (default: the whole job) in ``width`` cells."""
        span = self.span if span is None else max(int(span), 1)
        z = 0
        while cell_ns(z) * max(width, 1) < span:
            z += 1
        return z

    def max_zoom(self, width: int) -> int:
        """Zooming out further than the whole job in half the width shows nothing new."""
        return self.fit_zoom(max(width // 2, 1))

    def coverage(self, lane: int, zoom: int, offset: int, width: int) -> np.ndarray:
        """Busy ns per cell, shape ``(width, kinds + 1)``, for cells ``offset .. offset + width`` of
        ``cell_ns(zoom)`` ns from the job start. A cell is ``m`` whole bins of a stored level when
        there is a level that fine (a reshape and a sum); finer zooms are binned on demand."""
        ln = self.lanes[lane]
        m, p = _zoom_parts(zoom)
        k = p - self.finest_exp
        if 0 <= k < len(ln.levels):
            level = ln.levels[k]
            out = np.zeros((width * m, level.shape[1]), dtype=np.int64)
            lo, hi = max(offset * m, 0), min((offset + width) * m, level.shape[0])
            if hi > lo:
                out[lo - offset * m:hi - offset * m] = level[lo:hi]
            return out.reshape(width, m, -1).sum(axis=1)
        edges = self.t0 + (np.arange(width + 1, dtype=np.int64) + offset) * cell_ns(zoom)
        return ln.coverage(edges)

    def cells(self, lane: int, zoom: int, offset: int, width: int) -> Cells:
        """What to draw in each of ``width`` cells of a lane: never more than ``width`` cells."""
        cov = self.coverage(lane, zoom, offset, width)
        kinds = cov[:, :-1]
        kind = np.argmax(kinds, axis=1).astype(np.int8) if kinds.shape[1] else np.zeros(width, np.int8)
        busy = cov[:, -1]
        kind[busy <= 0] = -1
        fill = np.clip(busy / float(cell_ns(zoom)), 0.0, 1.0)
        return Cells(kind, fill)

    def labels(self, lane: int, zoom: int, offset: int, width: int, min_cells: int = 4
               ) -> list[tuple[int, int, int, str]]:
        """Names to write inside wide spans: ``(first cell, end cell, kind index, name)``, for spans at
        least ``min_cells`` wide; nothing for kinds with more spans in view than cells."""
        ln = self.lanes[lane]
        if ln.is_classes:
            return []
        cell = cell_ns(zoom)
        v0 = self.t0 + offset * cell
        v1 = v0 + width * cell
        out = []
        for ki, s in enumerate(ln.sets):
            i0, i1 = s.overlapping(v0, v1)
            if i1 - i0 > width:
                continue
            st, en, first = s.start[i0:i1], s.end[i0:i1], s.first[i0:i1]
            c0 = np.maximum((st - v0) // cell, 0)
            c1 = np.minimum(-((v0 - en) // cell), width)
            for a, b, f in zip(c0.tolist(), c1.tolist(), first.tolist(), strict=True):
                if b - a >= min_cells and f >= 0:
                    out.append((a, b, ki, self.event_name(f)))
        return out

    def event_name(self, i: int) -> str:
        """Name of the sorted event ``i``."""
        code = int(self.ev_name[i]) if self.ev_name.size else -1
        return self.names[code] if 0 <= code < len(self.names) else "?"

    def event_at(self, lane: int, t0: int, t1: int) -> int | None:
        """The event of a lane to show for the time range ``[t0, t1)`` (one cell): of the highest-priority
        kind present, the one that overlaps the range most, the innermost on a tie; None if idle."""
        ln = self.lanes[lane]
        if ln.is_classes or ln.ev_hi == ln.ev_lo:
            return None
        reach = self._reach.get(lane)
        if reach is None:
            reach = np.maximum.accumulate(self.ev_end[ln.ev_lo:ln.ev_hi])
            self._reach[lane] = reach
        lo = ln.ev_lo + int(np.searchsorted(reach, t0, side="right"))
        hi = ln.ev_lo + int(np.searchsorted(self.ev_start[ln.ev_lo:ln.ev_hi], t1, side="left"))
        if hi <= lo:
            return None
        s, e, k = self.ev_start[lo:hi], self.ev_end[lo:hi], self.ev_kind[lo:hi].astype(np.int64)
        overlap = np.minimum(e, t1) - np.maximum(s, t0)
        ok = (overlap > 0) | ((e == s) & (s >= t0) & (s < t1))
        if not ok.any():
            return None
        cand = np.flatnonzero(ok)
        best = np.lexsort((-(e[cand] - s[cand]), overlap[cand], -k[cand]))[-1]
        return lo + int(cand[best])

    def lane_of_event(self, i: int) -> int:
        """The lane that holds sorted event ``i``."""
        if not 0 <= i < self.events:
            raise IndexError(i)
        slot = int(np.searchsorted(self._lane_starts, i, side="right")) - 1
        return int(self._lane_index_of_slot[slot])

    def next_event(self, t: int, lanes: list[int], kinds: tuple[str, ...], forward: bool = True
                   ) -> int | None:
        """The sorted event of one of ``kinds`` on ``lanes`` that starts next after (or last before)
        ``t``."""
        codes = np.array([DRAWN_KINDS.index(k) for k in kinds], dtype=np.int8)
        best: int | None = None
        for li in lanes:
            ln = self.lanes[li]
            if ln.is_classes or ln.ev_hi == ln.ev_lo:
                continue
            starts = self.ev_start[ln.ev_lo:ln.ev_hi]
            kind = self.ev_kind[ln.ev_lo:ln.ev_hi]
            if forward:
                i = int(np.searchsorted(starts, t, side="right"))
                hit = np.flatnonzero(np.isin(kind[i:], codes))
                cand = ln.ev_lo + i + int(hit[0]) if hit.size else None
                if cand is not None and (best is None or self.ev_start[cand] < self.ev_start[best]):
                    best = cand
            else:
                i = int(np.searchsorted(starts, t, side="left"))
                hit = np.flatnonzero(np.isin(kind[:i], codes))
                cand = ln.ev_lo + int(hit[-1]) if hit.size else None
                if cand is not None and (best is None or self.ev_start[cand] > self.ev_start[best]):
                    best = cand
        return best

    def lanes_of_rank(self, rank: int) -> list[int]:
        return [ln.index for ln in self.lanes if ln.rank == rank]

    def search(self, pattern: str) -> Marks:
        """Events whose name matches ``pattern`` (a case-insensitive regular expression, or plain text
        when it is not a valid one)."""
        try:
            rx = re.compile(pattern, re.IGNORECASE)
        except re.error:
            rx = re.compile(re.escape(pattern), re.IGNORECASE)
        codes = np.array([i for i, n in enumerate(self.names) if rx.search(n)], dtype=np.int32)
        hit = np.flatnonzero(np.isin(self.ev_name, codes)) if codes.size else _EMPTY
        lane = np.searchsorted(self._lane_starts, hit, side="right") - 1
        lane_index = self._lane_index_of_slot[lane] if hit.size else np.zeros(0, np.int32)
        return Marks(f"search {pattern!r}", lane_index.astype(np.int32), self.ev_start[hit], self.ev_end[hit],
                     hit.astype(np.int64))

    @cached_property
    def _lane_starts(self) -> np.ndarray:
        ev_lanes = [ln for ln in self.lanes if not ln.is_classes]
        return np.array([ln.ev_lo for ln in ev_lanes], dtype=np.int64)

    @cached_property
    def _lane_index_of_slot(self) -> np.ndarray:
        return np.array([ln.index for ln in self.lanes if not ln.is_classes], dtype=np.int32)

    def lane_index(self, rank: int, name: str) -> int | None:
        """Index of the lane ``name`` of ``rank`` (``"classes"`` for the rank's classes lane)."""
        for ln in self.lanes:
            if ln.rank == rank and ln.name == name:
                return ln.index
        return None

    def marks_from_table(self, name: str, table: pa.Table, *, job_clock: bool = False,
                         label: str | None = None) -> Marks:
        """Marks from an analysis table with ``rank, lane, start_ns, end_ns`` columns (times on the
        rank's own clock, as most analysis tables have them, or already on the job clock with
        ``job_clock``, as the critical path's are); rows on unknown lanes go to the rank's classes lane.
        ``label`` names a column that says what each row is (shown in the details panel). This is how
        result tables such as a critical path become an overlay."""
        import polars as pl

        known = pl.DataFrame({"rank": [ln.rank for ln in self.lanes], "lane": [ln.name for ln in self.lanes],
                              "li": [ln.index for ln in self.lanes]},
                             schema={"rank": pl.Int64, "lane": pl.String, "li": pl.Int64})
        classes = known.filter(pl.col("lane") == CLASSES_LANE).select("rank", pl.col("li").alias("li_classes"))
        rows = pl.DataFrame({
            "rank": pl.Series(table.column("rank").to_numpy(zero_copy_only=False)).cast(pl.Int64),
            "lane": pl.Series(table.column("lane").cast(pa.string()).to_pylist(), dtype=pl.String),
        }).with_row_index("row")
        rows = (rows.join(known, on=["rank", "lane"], how="left", maintain_order="left")
                .join(classes, on="rank", how="left", maintain_order="left")
                .with_columns(pl.coalesce("li", "li_classes").alias("li"))
                .filter(pl.col("li").is_not_null()))
        keep = rows.get_column("row").to_numpy().astype(np.int64)
        idx = rows.get_column("li").to_numpy()
        sel = pa.array(keep, type=pa.int64())
        off = np.zeros(keep.size, dtype=np.int64)
        if not job_clock and self.clock_offsets:
            offsets = pl.DataFrame({"rank": list(self.clock_offsets), "off": list(self.clock_offsets.values())},
                                   schema={"rank": pl.Int64, "off": pl.Int64})
            off = (rows.join(offsets, on="rank", how="left", maintain_order="left").get_column("off")
                   .fill_null(0).to_numpy().astype(np.int64))
        start = table.column("start_ns").take(sel).to_numpy().astype(np.int64) + off
        end = table.column("end_ns").take(sel).to_numpy().astype(np.int64) + off
        labels = None
        if label is not None:
            labels = np.array(table.column(label).take(sel).to_pylist(), dtype=object)
        return Marks(name, idx.astype(np.int32), start, end, np.full(keep.size, -1, np.int64), labels)

    def iteration_at(self, rank: int, t: int) -> int | None:
        """The iteration of ``rank`` whose window contains ``t``."""
        w = self.iterations.get(rank)
        if w is None or not w[0].size:
            return None
        i = int(np.searchsorted(w[1], t, side="right")) - 1
        if i < 0 or t >= w[2][i]:
            return None
        return int(w[0][i])

    def iterations_in(self, rank: int, start: int, end: int) -> list[int]:
        """The iterations of ``rank`` whose windows overlap job-clock ``start .. end``, in time order."""
        w = self.iterations.get(rank)
        if w is None or not w[0].size:
            return []
        return [int(x) for x in w[0][(w[1] < end) & (w[2] > start)]]

    def window(self, rank: int, iteration: int) -> tuple[int, int] | None:
        """Job-clock window of one iteration on one rank."""
        w = self.iterations.get(rank)
        if w is None:
            return None
        hit = np.flatnonzero(w[0] == iteration)
        return (int(w[1][hit[0]]), int(w[2][hit[0]])) if hit.size else None


def ticks(t_view: int, zoom: int, width: int, min_gap: int = 14) -> list[tuple[int, int]]:
    """Ruler ticks for a view starting ``t_view`` ns after the job start: ``(cell, ns after job start)``
    at round times at least ``min_gap`` cells apart."""
    cell = cell_ns(zoom)
    step = _nice_step(min_gap * float(cell))
    t = -(-t_view // step) * step
    out = []
    while (t - t_view) // cell < width:
        out.append((int((t - t_view) // cell), int(t)))
        t += step
    return out
