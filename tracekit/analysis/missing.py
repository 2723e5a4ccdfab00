"""Ranks the job had that the inputs lack (a trace deleted, lost, or never written), and what their absence does to
each answer. The job's size comes from the traces themselves: the world size ``distributedInfo`` states, and the
members of the process groups its ``pg_config`` lists."""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from tracekit.model.diagnostics import Diagnostic


def missing_ranks(ranks: pa.Table, groups: dict[str, list[int]]) -> list[int]:
    """The ranks below the largest stated world size, or members of a stated process group, that no input holds."""
    present = {int(r) for r in ranks.column("rank").to_pylist() if r is not None}
    sizes = _world_sizes(ranks)
    expected = set(range(max(sizes))) if sizes else set()
    for members in groups.values():
        expected.update(members)
    return sorted(expected - present)


def _world_sizes(ranks: pa.Table) -> list[int]:
    """The world sizes the profiler traces state (an NCCL log's communicator sizes say which ranks it saw, not which
    ones the job had traced)."""
    return [int(w) for w, f in zip(ranks.column("world_size").to_pylist(), ranks.column("format").to_pylist(),
                                   strict=True) if w is not None and f == "kineto" and 0 < w <= 1 << 20]


def spans(ranks: list[int]) -> str:
    """``[1, 2, 3, 7]`` → ``1-3, 7``."""
    out: list[str] = []
    start = prev = None
    for r in [*ranks, None]:
        if start is not None and (r is None or r != prev + 1):  # type: ignore[operator]
            out.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if r is not None and start is None:
            start = r
        prev = r
    return ", ".join(out)


def note(missing: list[int], ranks: pa.Table, groups: dict[str, list[int]], instances: pa.Table) -> Diagnostic | None:
    """One warning naming the missing ranks, where the job's size was read, and what it costs each answer."""
    if not missing:
        return None
    gone = set(missing)
    sizes = _world_sizes(ranks)
    world = max(sizes) if sizes else max(missing) + 1
    who = f"rank{'s' if len(missing) > 1 else ''} {spans(missing)} of {world}"
    said = [f"world size {world} in the traces' distributedInfo"] if sizes else []
    hit = sorted((name for name, members in groups.items() if gone & set(members) and name != "default"),
                 key=lambda n: (len(n), n))
    if hit:
        said.append(f"member{'s' if len(missing) > 1 else ''} of process group{'s' if len(hit) > 1 else ''} "
                    f"{', '.join(hit[:6])}{' …' if len(hit) > 6 else ''}")
    inst = pl.from_arrow(instances.select(["partial"])) if instances.num_rows else None
    partial = int(inst.get_column("partial").fill_null(False).sum()) if isinstance(inst, pl.DataFrame) else 0
    total = instances.num_rows
    its, it = ("their", "they") if len(missing) > 1 else ("its", "it")
    effects = [f"{its} groups' collectives are matched among the {ranks.num_rows} ranks present and flagged partial"
               + (f" ({partial} of {total})" if total else ""),
               f"waiting and transfer are not told apart in the groups {it} belong{'' if len(missing) > 1 else 's'} "
               "to", "stragglers, balance and the verdict compare the ranks present only (a missing rank may be the "
               "one the others waited for)"]
    return Diagnostic("", f"{who} {'are' if len(missing) > 1 else 'is'} missing from the inputs ({'; '.join(said)}):"
                      f" {'; '.join(effects)}")


#: a cut rank is reported when it holds less than this share of its peers' iterations or events
SHORT = 0.9


def truncated(ranks: pa.Table, iterations: pa.Table) -> list[Diagnostic]:
    """For each rank whose profiler trace ends early (cut, or without its end marker) and holds less than its peers:
    how much of its file is missing, judged by its complete peers' files (sizes, events), and what it costs — the
    iterations the others have and it lost, which the job's figures for them leave it out of."""
    import os

    r = pl.from_arrow(ranks.select(["rank", "format", "complete", "events", "source_files"]))
    it = pl.from_arrow(iterations.select(["rank", "iteration"]))
    assert isinstance(r, pl.DataFrame) and isinstance(it, pl.DataFrame)
    r = r.filter((pl.col("format") == "kineto") & pl.col("rank").is_not_null())
    whole = r.filter(pl.col("complete").fill_null(False))
    if whole.height == 0:
        return []

    def size(files: list[str] | None) -> int | None:
        try:
            return sum(os.path.getsize(f) for f in files) if files else None
        except OSError:
            return None

    peer_sizes = [s for s in (size(f) for f in whole.get_column("source_files").to_list()) if s]
    peer_size = sorted(peer_sizes)[len(peer_sizes) // 2] if peer_sizes else None
    peer_events = int(whole.get_column("events").median() or 0)  # type: ignore[arg-type]
    iters = it.filter(pl.col("iteration").is_not_null())
    peer_iters = set(iters.filter(pl.col("rank").is_in(whole.get_column("rank").implode())).get_column(
        "iteration").to_list())
    out = []
    for row in r.filter(~pl.col("complete").fill_null(False)).iter_rows(named=True):
        mine = set(iters.filter(pl.col("rank") == row["rank"]).get_column("iteration").to_list())
        lost = sorted(peer_iters - mine)
        events = int(row["events"] or 0)
        if len(mine) >= SHORT * len(peer_iters) and events >= SHORT * peer_events:
            continue
        have = size(row["source_files"])
        parts = []
        if have is not None and peer_size and peer_size > have:
            gone = peer_size - have
            parts.append(f"about {_mb(gone)} of it ({100 * gone / peer_size:.0f} %) is missing, judging by its "
                         f"{whole.height} complete peer{'s' if whole.height > 1 else ''}' files ({_mb(peer_size)})")
        if peer_events > events:
            parts.append(f"it holds {events} events against {peer_events} on its peers")
        if peer_iters:
            cost = f"it has {len(mine)} of the {len(peer_iters)} iterations its peers have"
            if lost:
                cost += (f": iteration{'s' if len(lost) > 1 else ''} {spans(lost)} {'are' if len(lost) > 1 else 'is'}"
                         " lost on this rank (the job's figures for them leave it out, and their collectives are "
                         "partial)")
            parts.append(cost)
        files = row["source_files"] or [""]
        out.append(Diagnostic(files[0], f"rank {row['rank']}'s trace is cut short: " + "; ".join(parts)))
    return out


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n / 1e3:.0f} kB"
