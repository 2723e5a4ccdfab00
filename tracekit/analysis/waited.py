"""The rank everyone waited on most, and what the trace can tell of why (DESIGN.md "Verdict": the verdict accounts
for it). The collectives say who arrived last; the iteration windows say when each rank entered the traced window.
A rank that entered the first traced iteration late, by about what the others then waited for it, was delayed by
something before the trace began: nothing in the window explains it, and only more traced steps tell whether it
repeats."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import polars as pl
import pyarrow as pa

from tracekit.model.units import format_duration

#: a rank is the one everyone waited on when it caused more than this share of all waiting
MOSTLY = 2 / 3
#: ... and when the others waited for it, each on average, at least this share of each iteration (less is noise)
MATTERS = 0.02
#: its lateness began before the window when it entered the first traced iteration at least this share of the
#: largest lateness it caused at a collective of that iteration
ENTRY_SHARE = 0.5


@dataclass(frozen=True)
class WaitedOn:
    """``rank`` caused ``wait_share`` of all waiting (``waited_ns``: its peers' waits summed); it entered the first
    traced iteration ``entry_ns`` after the earliest rank (``earliest``), against ``skew_ns``, the most it was late
    at a collective of that iteration; ``before_window``: its lateness began before the traced window;
    ``iterations`` traced."""

    rank: int
    wait_share: float
    waited_ns: int
    entry_ns: int
    earliest: int | None
    skew_ns: int
    before_window: bool
    iterations: int

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def sentence(self) -> str:
        """What the verdict says of it: who, how much, and what the trace cannot tell."""
        s = (f"The ranks waited most on rank {self.rank} ({100 * self.wait_share:.0f} % of all waiting, "
             f"{format_duration(self.waited_ns)} summed over the others' waits)")
        if self.before_window:
            s += (f": it entered the first traced iteration {format_duration(self.entry_ns)} after rank "
                  f"{self.earliest}, and its work in the window is no more than its peers' — the lateness began "
                  "before the traced window, and the trace cannot tell why.")
            return s + (" Only one step was traced: trace more steps to see whether it repeats."
                        if self.iterations <= 1 else " Start the trace earlier to see where it comes from.")
        return s + (", yet its work in the traced window is no more than its peers': what made it late is not in "
                    "the trace (work the profiler does not see, its host, its link).")


def most_waited_on(instances: pa.Table, stragglers: pl.DataFrame, iterations: pa.Table,
                   ranks: pa.Table | None, iteration_ns: int | None) -> WaitedOn | None:
    """The rank everyone waited on (:data:`MOSTLY` of all waiting; ``stragglers``:
    :func:`tracekit.analysis.collectives.stragglers`), with when it entered the first traced iteration (``iterations``
    on the job clock by ``ranks``' offsets) against the lateness it caused there (``instances``); None when no rank
    caused most of the waiting, or the waiting is less than :data:`MATTERS` of the iteration (``iteration_ns``)."""
    if stragglers.height == 0 or (stragglers.get_column("wait_share")[0] or 0.0) <= MOSTLY or not iteration_ns:
        return None
    top = stragglers.row(0, named=True)
    rank = int(top["rank"])
    w = pl.from_arrow(iterations.select(["rank", "iteration", "start_ns"]))
    assert isinstance(w, pl.DataFrame)
    others = max(w.get_column("rank").n_unique() - 1, 1)
    n = max(w.get_column("iteration").n_unique(), 1)
    if int(top["waited_ns"]) / others / n < MATTERS * iteration_ns:
        return None
    if ranks is not None and ranks.num_rows and "clock_offset_ns" in ranks.column_names:
        off = pl.from_arrow(ranks.select(["rank", "clock_offset_ns"]))
        assert isinstance(off, pl.DataFrame)
        w = w.join(off.with_columns(pl.col("rank").cast(w.schema["rank"])).unique("rank"), on="rank", how="left")
        w = w.with_columns(pl.col("start_ns") + pl.col("clock_offset_ns").fill_null(0))
    n_it = w.get_column("iteration").n_unique()
    first = w.get_column("iteration").min() if w.height else None
    entry, earliest = 0, None
    if first is not None:
        f = w.filter(pl.col("iteration") == first).sort(["start_ns", "rank"])
        mine = f.filter(pl.col("rank") == rank)
        if mine.height and f.height > 1:
            earliest = int(f.get_column("rank")[0])
            entry = int(mine.get_column("start_ns")[0]) - int(f.get_column("start_ns")[0])
    inst = pl.from_arrow(instances.select(["iteration", "straggler_rank", "skew_ns"]))
    assert isinstance(inst, pl.DataFrame)
    skew = inst.filter((pl.col("iteration") == first) & (pl.col("straggler_rank") == rank)).get_column("skew_ns")
    most = int(skew.max() or 0) if skew.len() else 0  # type: ignore[arg-type]
    return WaitedOn(rank=rank, wait_share=float(top["wait_share"]), waited_ns=int(top["waited_ns"]), entry_ns=entry,
                    earliest=earliest, skew_ns=most, before_window=most > 0 and entry >= ENTRY_SHARE * most,
                    iterations=int(n_it))
