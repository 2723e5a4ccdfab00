"""The Flight Recorder dumps of one job, put together: one dump per rank, every process group with its members,
the world size (:func:`collect`). The hang analysis (:mod:`tracekit.analysis.hang.stuck`) reads what this gives.

A dump knows its rank only from its file name (PyTorch names it ``<prefix><rank>``): a dump whose name ends in no
number takes the lowest rank no other dump has, in the order given. Two dumps of one rank (the pickle and the JSON
form of the same moment, as ``_dump_fr_trace()`` and ``_dump_fr_trace_json()`` write them) count once: the one with
the call stacks, else the one with more entries. Members of a group come from every source there is — the dumps'
``pg_config`` (gloo's names no group and lists the ranks of the last group its rank created, so it only bounds the
world size), the profiler traces' ``pg_config``, the ranks that have entries in the group, and for the default group
every rank of the job — so that a member that never entered the group's stuck collective still counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import polars as pl
import pyarrow as pa

#: the description PyTorch gives the group of every rank
DEFAULT_DESC = "default_pg"


@dataclass(frozen=True)
class Dumps:
    """The dumps of one job: the kept dumps (``FR_DUMPS`` rows, rank filled), their entries, ``pg_config`` and
    ``pg_status`` rows, each group's members and description, the world size, and what was decided on the way."""

    dumps: pl.DataFrame
    entries: pl.DataFrame
    pg_config: pl.DataFrame
    pg_status: pl.DataFrame
    members: dict[str, list[int]]
    descs: dict[str, str | None]
    world_size: int
    notes: list[str] = field(default_factory=list)

    @property
    def ranks(self) -> list[int]:
        """The ranks that left a dump."""
        return sorted(self.dumps.get_column("rank").to_list())

    @property
    def backend(self) -> str | None:
        """The backend most dumps name (``gloo``, ``nccl``)."""
        b = self.dumps.get_column("backend").drop_nulls()
        return b.mode().sort()[0] if b.len() else None

    def label(self, pg: str) -> str:
        """A group as people read it: ``pg 0 (default_pg)``, ``pg 1``."""
        desc = self.descs.get(pg)
        return f"pg {pg} ({desc})" if desc and desc != "undefined" else f"pg {pg}"


def _frame(t: pa.Table | None) -> pl.DataFrame | None:
    if t is None or t.num_rows == 0:
        return None
    df = pl.from_arrow(t)
    assert isinstance(df, pl.DataFrame)
    return df


def _assign(dumps: pl.DataFrame, notes: list[str]) -> pl.DataFrame:
    """Ranks for dumps whose name gave none (the lowest free ones, in input order); one dump per rank."""
    taken = set(dumps.get_column("rank").drop_nulls().to_list())
    ranks = []
    free = 0
    for r in dumps.get_column("rank").to_list():
        if r is None:
            while free in taken:
                free += 1
            taken.add(free)
            r = free
        ranks.append(r)
    if dumps.get_column("rank").null_count():
        notes.append(f"{dumps.get_column('rank').null_count()} dump(s) without a rank in their name: ranks given by "
                     "the order of the inputs")
    dumps = dumps.with_columns(pl.Series("rank", ranks, dtype=pl.Int32))
    ordered = dumps.with_row_index("_i").sort(["rank", "with_stacks", "entries", "_i"],
                                              descending=[False, True, True, False], nulls_last=True)
    kept = ordered.unique("rank", keep="first", maintain_order=True)
    twice = ordered.group_by("rank").len().filter(pl.col("len") > 1)
    if twice.height:
        forms = ordered.filter(pl.col("rank").is_in(twice.get_column("rank").to_list()))
        both = set(forms.get_column("form").to_list()) == {"pickle", "json"}
        notes.append(f"{twice.height} rank{'s' if twice.height > 1 else ''} with "
                     f"{'a pickle and a JSON' if both else 'more than one'} dump: each rank's read once (the one "
                     "with call stacks, else the one with more entries)")
    return kept.drop("_i").sort("rank")


def collect(tables: Mapping[str, pa.Table], groups: Mapping[str, list[int]] | None = None,
            world_size: int | None = None) -> Dumps | None:
    """The job's dumps from the TraceSet's tables (``fr_*``, as the parser writes them); ``groups`` are process
    groups the profiler traces list (``{name: members}``) and ``world_size`` the job's as they say it. None without
    a dump."""
    dumps = _frame(tables.get("fr_dumps"))
    if dumps is None:
        return None
    notes: list[str] = []
    dumps = _assign(dumps, notes)
    rank_of = dict(zip(dumps.get_column("path").to_list(), dumps.get_column("rank").to_list(), strict=True))

    def of_kept(name: str, schema_of: pa.Schema) -> pl.DataFrame:
        df = _frame(tables.get(name))
        if df is None:
            out = pl.from_arrow(schema_of.empty_table())
            assert isinstance(out, pl.DataFrame)
            return out
        df = df.filter(pl.col("path").is_in(list(rank_of)))
        return df.with_columns(pl.col("path").replace_strict(rank_of, return_dtype=pl.Int32).alias("rank"))

    from tracekit.model import schema

    entries = of_kept("fr_entries", schema.FR_ENTRIES).sort(["rank", "record_id"], nulls_last=True)
    config = of_kept("fr_pg_config", schema.FR_PG_CONFIG)
    status = of_kept("fr_pg_status", schema.FR_PG_STATUS)
    listed = [r for rs in config.get_column("ranks").to_list() if rs for r in rs]
    world = max([int(world_size or 0), max(rank_of.values()) + 1, max(listed, default=-1) + 1,
                 *(max(m) + 1 for m in (groups or {}).values() if m)])
    descs: dict[str, str | None] = {}
    for pg, desc in entries.select("pg", "pg_desc").unique(maintain_order=True).iter_rows():
        if pg is not None and (descs.get(pg) in (None, "undefined")):
            descs[pg] = desc
    members: dict[str, set[int]] = {pg: set() for pg in descs}
    for pg, rs in config.filter(pl.col("pg") != "").select("pg", "ranks").iter_rows():
        if rs:
            members.setdefault(pg, set()).update(rs)
    for pg, rs in (groups or {}).items():
        if pg in members:
            members[pg].update(rs)
    for pg, rank in entries.select("pg", "rank").unique().iter_rows():
        if pg is not None:
            members.setdefault(pg, set()).add(rank)
    for pg in members:
        if descs.get(pg) == DEFAULT_DESC or (pg == "0" and descs.get(pg) is None):
            members[pg].update(range(world))
    return Dumps(dumps=dumps, entries=entries, pg_config=config, pg_status=status,
                 members={pg: sorted(m) for pg, m in members.items()}, descs=descs, world_size=world, notes=notes)
