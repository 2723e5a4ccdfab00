"""The timeline of a job analysed rank by rank: every lane laid out from the dataset's small tables, each rank's
events read when it is drawn (at most a budget of events held), on the :class:`tracekit.views.timeline.TimelineModel`
contract the terminal app draws from."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.model.schema import CLASSES
from tracekit.views.timeline import (
    CLASSES_LANE,
    DRAWN_KINDS,
    FINEST_BINS,
    Intervals,
    Lane,
    Marks,
    TimelineModel,
    column_codes,
    lane_sort_key,
)

if TYPE_CHECKING:
    import polars as pl

    from tracekit.analysis.pipeline import Analysis

# --- a job analysed rank by rank: lanes laid out from the dataset, each rank read when it is drawn ---------------


class _Ranked:
    """An event column of a :class:`RankedTimeline` that reads like one array: event ``i`` of the job is event
    ``i & LOCAL`` of the rank in slot ``i >> SLOT_SHIFT`` (its events read on first use; a slice stays in one
    rank)."""

    def __init__(self, model: RankedTimeline, name: str) -> None:
        self.model, self.name = model, name

    def _arr(self, i: int) -> np.ndarray:
        return getattr(self.model._rank(int(i) >> SLOT_SHIFT), self.name)

    def __getitem__(self, key: int | slice | np.integer) -> np.ndarray:
        if isinstance(key, slice):
            start = 0 if key.start is None else int(key.start)
            base = (start >> SLOT_SHIFT) << SLOT_SHIFT
            stop = None if key.stop is None else int(key.stop) - base
            return self._arr(start)[start - base:stop]
        i = int(key)
        return self._arr(i)[i & LOCAL]

    @property
    def size(self) -> int:
        return sum(getattr(r, self.name).size for r in self.model._loaded.values())


#: event indices of a rank-by-rank timeline: the rank's slot in the high bits, its own event number in the low ones
SLOT_SHIFT = 32
LOCAL = (1 << SLOT_SHIFT) - 1


@dataclass
class _RankEvents:
    """One rank's events as a :class:`RankedTimeline` draws them (sorted by lane and start; job clock)."""

    ev_start: np.ndarray
    ev_end: np.ndarray
    ev_kind: np.ndarray
    ev_name: np.ndarray
    ev_row: np.ndarray  # the row in the rank's events table
    names: list[str]
    table: pa.Table | None = None  # every column of the rank's events, read for the details of one


class RankedTimeline(TimelineModel):
    """The timeline of a job analysed rank by rank (:mod:`tracekit.scale.dataset`): every lane of every rank is laid
    out from the dataset's summaries (the lanes each unit saw, its span) without reading an event; a rank's events
    are read from its Parquet part the first time one of its lanes is drawn or asked about, and at most
    ``max_events`` events are held (the ranks drawn least recently are let go, and read again when needed).

    The same queries as :class:`TimelineModel`, with these differences: event indices carry their rank's slot in
    their high bits (:data:`SLOT_SHIFT`), and :meth:`search` looks through the ranks read so far. ``ranks`` keeps
    only those ranks (a filter by host or process group); :meth:`subset` makes such a view sharing what was read."""

    def __init__(self, source: RankSource, ranks: list[int] | None = None, *, finest: int = FINEST_BINS,
                 max_events: int = 8_000_000) -> None:
        self.source = source
        self.lanes = []
        shown = source.ranks if ranks is None else [r for r in source.ranks if r in set(ranks)]
        self.shown = shown
        self._lanes_of: dict[int, list[int]] = {}
        for r in shown:
            idx = []
            names = source.lanes.get(r, [])
            if r in source.windows:
                idx.append(len(self.lanes))
                self.lanes.append(Lane(len(self.lanes), r, CLASSES_LANE, CLASSES, (), Intervals.empty()))
            for name in sorted(names, key=lane_sort_key):
                idx.append(len(self.lanes))
                self.lanes.append(Lane(len(self.lanes), r, name, (), (), Intervals.empty()))
            self._lanes_of[r] = idx
        self.t0, self.t1 = source.t0, max(source.t1, source.t0 + 1)
        self.iterations = source.windows
        self.clock_offsets = source.offsets
        self.names = []
        self.finest_exp = max(0, int(np.ceil(np.log2(max((self.t1 - self.t0) / finest, 1.0)))))
        self._reach = {}
        self.max_events = max_events
        self._loaded = source.loaded  # shared by the subsets of one job
        self.ev_start = _Ranked(self, "ev_start")  # type: ignore[assignment]
        self.ev_end = _Ranked(self, "ev_end")  # type: ignore[assignment]
        self.ev_kind = _Ranked(self, "ev_kind")  # type: ignore[assignment]
        self.ev_name = _Ranked(self, "ev_name")  # type: ignore[assignment]
        self.ev_row = _Ranked(self, "ev_row")  # type: ignore[assignment]

    def subset(self, ranks: list[int] | None) -> RankedTimeline:
        """This job's timeline showing ``ranks`` only (None: every rank), sharing the ranks read."""
        return RankedTimeline(self.source, ranks, max_events=self.max_events)

    # ------------------------------------------------------------------ reading ranks

    def _rank(self, slot: int) -> _RankEvents:
        """The events of the rank in ``slot`` (its position among the job's ranks), read now if they are not held."""
        got = self._loaded.get(slot)
        if got is not None:
            self._loaded.move_to_end(slot)
            return got
        rank = self.source.ranks[slot]
        got = self.source.read(rank)
        self._loaded[slot] = got
        held = sum(r.ev_start.size for r in self._loaded.values())
        while held > self.max_events and len(self._loaded) > 1:
            old, ev = self._loaded.popitem(last=False)
            held -= ev.ev_start.size
            self._forget(self.source.ranks[old])
        return got

    def _forget(self, rank: int) -> None:
        for li in self._lanes_of.get(rank, []):
            ln = self.lanes[li]
            ln.kinds, ln.sets, ln.busy, ln.levels, ln.ev_lo, ln.ev_hi = (
                (CLASSES if ln.is_classes else ()), (), Intervals.empty(), [], 0, 0)
            self._reach.pop(li, None)

    def ensure(self, lane: int) -> None:
        """Read the rank of ``lane`` and lay out its lanes, unless they are."""
        ln = self.lanes[lane]
        if ln.levels:
            return
        rank = ln.rank
        slot = self.source.slot[rank]
        ev = self._rank(slot)
        base = slot << SLOT_SHIFT
        bounds = self.source.bounds[rank]
        edges = self._finest_edges()
        for li in self._lanes_of[rank]:
            target = self.lanes[li]
            if target.is_classes:
                built = TimelineModel._classes_lane(li, rank, self.source.activity(rank), self.iterations[rank][1:])
            else:
                lo, hi = bounds.get(target.name, (0, 0))
                built = TimelineModel._event_lane(li, rank, target.name, lo, hi, ev.ev_start, ev.ev_end, ev.ev_kind)
                built.sets = tuple(Intervals(s.start, s.end, np.where(s.first >= 0, s.first + base, -1), s.cum)
                                   for s in built.sets)
                built.busy = Intervals(built.busy.start, built.busy.end,
                                       np.where(built.busy.first >= 0, built.busy.first + base, -1), built.busy.cum)
                built.ev_lo, built.ev_hi = lo + base, hi + base
            target.kinds, target.sets, target.busy = built.kinds, built.sets, built.busy
            target.ev_lo, target.ev_hi = built.ev_lo, built.ev_hi
            target.bin_levels(edges)

    # ------------------------------------------------------------------ queries (reading what they need)

    @property
    def events(self) -> int:
        return self.source.events

    def coverage(self, lane: int, zoom: int, offset: int, width: int) -> np.ndarray:
        self.ensure(lane)
        return super().coverage(lane, zoom, offset, width)

    def labels(self, lane: int, zoom: int, offset: int, width: int, min_cells: int = 4
               ) -> list[tuple[int, int, int, str]]:
        self.ensure(lane)
        return super().labels(lane, zoom, offset, width, min_cells)

    def event_name(self, i: int) -> str:
        ev = self._rank(int(i) >> SLOT_SHIFT)
        code = int(ev.ev_name[int(i) & LOCAL]) if ev.ev_name.size else -1
        return ev.names[code] if 0 <= code < len(ev.names) else "?"

    def event_at(self, lane: int, t0: int, t1: int) -> int | None:
        self.ensure(lane)
        return super().event_at(lane, t0, t1)

    def lane_of_event(self, i: int) -> int:
        rank = self.source.ranks[int(i) >> SLOT_SHIFT]
        for li in self._lanes_of.get(rank, []):
            self.ensure(li)
            ln = self.lanes[li]
            if not ln.is_classes and ln.ev_lo <= i < ln.ev_hi:
                return li
        raise IndexError(i)

    def next_event(self, t: int, lanes: list[int], kinds: tuple[str, ...], forward: bool = True) -> int | None:
        for li in lanes:
            self.ensure(li)
        return super().next_event(t, lanes, kinds, forward)

    def search(self, pattern: str) -> Marks:
        """Events of the ranks read so far (and shown) whose name matches ``pattern``."""
        try:
            rx = re.compile(pattern, re.IGNORECASE)
        except re.error:
            rx = re.compile(re.escape(pattern), re.IGNORECASE)
        lanes, starts, ends, events = [], [], [], []
        shown = set(self.shown)
        for slot, ev in list(self._loaded.items()):
            rank = self.source.ranks[slot]
            if rank not in shown:
                continue
            codes = np.array([i for i, n in enumerate(ev.names) if rx.search(n)], dtype=np.int32)
            if not codes.size:
                continue
            for li in self._lanes_of[rank]:
                self.ensure(li)
                ln = self.lanes[li]
                if ln.is_classes:
                    continue
                lo, hi = ln.ev_lo & LOCAL, ln.ev_hi & LOCAL
                hit = lo + np.flatnonzero(np.isin(ev.ev_name[lo:hi], codes))
                lanes.append(np.full(hit.size, li, np.int32))
                starts.append(ev.ev_start[hit])
                ends.append(ev.ev_end[hit])
                events.append(hit + (slot << SLOT_SHIFT))
        cat = (lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt))  # noqa: E731
        return Marks(f"search {pattern!r} (ranks read so far)", cat(lanes, np.int32), cat(starts, np.int64),
                     cat(ends, np.int64), cat(events, np.int64))

    def record(self, i: int) -> dict:
        """Every column of event ``i`` (its row of the rank's events; the rank's every column read on first use)."""
        slot = int(i) >> SLOT_SHIFT
        ev = self._rank(slot)
        if ev.table is None:
            ev.table = self.source.dataset.rank_events(self.source.ranks[slot])
        return ev.table.slice(int(ev.ev_row[int(i) & LOCAL]), 1).to_pylist()[0]

    def lanes_of_rank(self, rank: int) -> list[int]:
        return list(self._lanes_of.get(rank, []))

    def lane_index(self, rank: int, name: str) -> int | None:
        for li in self._lanes_of.get(rank, []):
            if self.lanes[li].name == name:
                return li
        return None

    def first_lane(self, rank: int) -> int | None:
        """The first lane of ``rank`` (its classes lane where it has one), None when it is not shown."""
        lanes = self._lanes_of.get(rank)
        return lanes[0] if lanes else None

    def _build_levels(self) -> None:  # a rank's levels are built when it is read (ensure)
        return None


class RankSource:
    """What a :class:`RankedTimeline` knows of a job analysed rank by rank before reading any event, and how it
    reads one rank: the ranks, their lanes (from the units' summaries), clock offsets, iteration windows and the
    job's span; ``read(rank)`` gives the rank's events sorted by lane and start on the job clock (only the columns
    drawing needs; attribution's intervals as its unit kept them, where it did)."""

    #: the event columns a timeline draws from
    COLUMNS: ClassVar[list[str]] = ["rank", "lane", "kind", "name", "start_ns", "dur_ns", "device"]

    def __init__(self, analysis: Analysis) -> None:
        from collections import OrderedDict


        ds = analysis.dataset
        assert ds is not None, "a RankSource reads a job analysed rank by rank"
        self.dataset = ds
        self.offsets = {int(r): int(o or 0) for r, o in zip(analysis.ranks.column("rank").to_pylist(),
                                                            analysis.ranks.column("clock_offset_ns").to_pylist(),
                                                            strict=True) if r is not None}
        rank_of_path = {p.get("path"): p.get("rank") for p in ds.manifest["parts"] if p.get("rank") is not None}
        self.lanes: dict[int, list[str]] = {}
        self.events = 0
        firsts, lasts = [], []
        for s in ds.summaries:
            r = rank_of_path.get(s.get("path")) if s.get("per_rank") else None
            if r is None:
                continue
            r = int(r)
            self.lanes[r] = [str(name) for name, _ in s.get("lanes") or []]
            self.events += int(s.get("events") or 0)
            off = self.offsets.get(r, 0)
            if s.get("t_first") is not None:
                firsts.append(int(s["t_first"]) + off)
                lasts.append(int(s["t_last"]) + off)
        off_by_rank = np.zeros(max([*self.offsets, *self.lanes, 0]) + 2, dtype=np.int64)
        for r, o in self.offsets.items():
            if 0 <= r < off_by_rank.size:
                off_by_rank[r] = o
        self.windows = TimelineModel._windows(analysis.iterations, off_by_rank)
        self.ranks = sorted(set(self.lanes) | set(self.windows))
        self.slot = {r: i for i, r in enumerate(self.ranks)}
        firsts += [int(w[1].min()) for w in self.windows.values() if w[1].size]
        lasts += [int(w[2].max()) for w in self.windows.values() if w[2].size]
        self.t0 = min(firsts, default=0)
        self.t1 = max(lasts, default=self.t0 + 1)
        self.loaded: OrderedDict[int, _RankEvents] = OrderedDict()
        self.kept = ds.ranks_with("activity")
        self.bounds: dict[int, dict[str, tuple[int, int]]] = {}
        self._activity: dict[int, pl.DataFrame] = {}

    def read(self, rank: int) -> _RankEvents:
        """The rank's events from its part, sorted by lane (text) and start, on the job clock."""
        import polars as pl

        table = self.dataset.rank_events(rank, columns=self.COLUMNS)
        off = self.offsets.get(rank, 0)
        kind_codes, kind_values = column_codes(table.column("kind"))
        drawn = np.array([DRAWN_KINDS.index(k) if k in DRAWN_KINDS else -1 for k in kind_values] or [-1],
                         dtype=np.int8)
        kind = drawn[np.maximum(kind_codes, 0)] if kind_codes.size else np.zeros(0, np.int8)
        kind[kind_codes < 0] = -1
        start = pc.fill_null(table.column("start_ns"), 0).to_numpy().astype(np.int64) + off
        dur = np.maximum(pc.fill_null(table.column("dur_ns"), 0).to_numpy().astype(np.int64), 0)
        lane_codes, lane_values = column_codes(table.column("lane"))
        keep = np.flatnonzero((kind >= 0) & (lane_codes >= 0))
        order = (pl.DataFrame({"l": lane_codes[keep], "s": start[keep]}).with_row_index("i")
                 .sort(["l", "s"]).get_column("i").to_numpy())
        rows = keep[order]
        name_codes, names = column_codes(table.column("name"))
        lanes_sorted = lane_codes[rows]
        bounds = {}
        for c, name in enumerate(lane_values):
            lo = int(np.searchsorted(lanes_sorted, c, "left"))
            hi = int(np.searchsorted(lanes_sorted, c, "right"))
            bounds[name] = (lo, hi)
        self.bounds[rank] = bounds
        from tracekit.analysis import attribution

        if rank in self.kept:  # its unit kept attribution's intervals
            a = pl.from_arrow(self.dataset.rank_table("activity", rank))
            assert isinstance(a, pl.DataFrame)
        else:
            a = attribution.activity(table)
        self._activity[rank] = a.sort("start_ns").with_columns(pl.col("start_ns") + off, pl.col("end_ns") + off)
        return _RankEvents(ev_start=start[rows], ev_end=start[rows] + dur[rows], ev_kind=kind[rows],
                           ev_name=name_codes[rows] if name_codes.size else np.zeros(0, np.int32),
                           ev_row=rows.astype(np.int64), names=names)

    def activity(self, rank: int) -> pl.DataFrame | None:
        """Attribution's intervals of a rank read (job clock), for its classes lane."""
        return self._activity.get(rank)
