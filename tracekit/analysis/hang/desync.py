"""Desync: members of a process group that called different operations, sizes or dtypes at the same position
(the same ``collective_seq_id``) of their Flight Recorder dumps.

What must agree follows PyTorch's own analyser (``torch/distributed/flight_recorder/components/types.py``,
``Op.match``): the operation always; the input shapes except for ``all_to_all`` and ``scatter``, the output shapes
except for ``all_to_all`` and ``gather`` (and neither for the ``_v`` variants, whose sizes differ by design); the
dtypes. The rank or ranks that differ from the most common call are named (the odd ones out); where no call is more
common than another (two ranks, two calls) every rank is named with what it called. Only the first position where a
group disagrees is reported: what follows is its consequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

_NO_INPUT_SIZES = ("all_to_all", "scatter")
_NO_OUTPUT_SIZES = ("all_to_all", "gather")


@dataclass(frozen=True)
class Desync:
    """The first position of group ``pg`` where its members disagree: ``what`` differs (``operation``, ``shape``,
    ``size``, ``dtype``); ``calls`` is each rank's call there as text; ``odd`` the ranks that differ from the most
    common call (all of them when none is most common)."""

    pg: str
    seq: int
    what: str
    calls: dict[int, str]
    odd: tuple[int, ...]
    majority: str | None

    def as_dict(self) -> dict[str, object]:
        return {"pg": self.pg, "seq": self.seq, "what": self.what, "calls": {str(k): v for k, v in self.calls.items()},
                "odd_ranks": list(self.odd), "majority": self.majority}


def call_name(profiling_name: str | None) -> str:
    """``gloo:all_reduce`` → ``all_reduce``; ``nccl:send 0->1`` → ``send 0->1``."""
    if not profiling_name:
        return "?"
    return profiling_name.split(":", 1)[1] if ":" in profiling_name else profiling_name


def _shape(sizes: list[list[int]] | None) -> str:
    if sizes is None:
        return "?"
    return ", ".join("[" + ", ".join(map(str, s)) + "]" for s in sizes)


def describe(row: dict) -> str:
    """One call as text: ``all_reduce [272] Float``."""
    dtypes = sorted(set(row.get("input_dtypes") or []) | set(row.get("output_dtypes") or []))
    return " ".join(x for x in (call_name(row.get("profiling_name")), _shape(row.get("input_sizes")),
                                "/".join(dtypes)) if x)


def _key(row: dict) -> tuple:
    """What must agree between members' calls at one position (module docstring)."""
    base = call_name(row.get("profiling_name")).split(" ")[0]
    loose = base.endswith("_v") or base.endswith("_v_single")
    ins = None if loose or base in _NO_INPUT_SIZES else _sizes_key(row.get("input_sizes"))
    outs = None if loose or base in _NO_OUTPUT_SIZES else _sizes_key(row.get("output_sizes"))
    dtypes = (tuple(sorted(set(row.get("input_dtypes") or []))), tuple(sorted(set(row.get("output_dtypes") or []))))
    return base, ins, outs, dtypes


def _sizes_key(sizes: list[list[int]] | None) -> tuple | None:
    return None if sizes is None else tuple(tuple(s) for s in sizes)


def _what(a: tuple, b: tuple) -> str:
    """The first thing two call keys differ in, as a word."""
    if a[0] != b[0]:
        return "operation"
    for x, y in ((a[1], b[1]), (a[2], b[2])):
        if x != y and x is not None and y is not None:
            numel = [sum(_prod(s) for s in v) for v in (x, y)]
            return "shape" if numel[0] == numel[1] else "size"
    return "dtype"


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _signature() -> pl.Expr:
    """A hash per call of what must agree (:func:`_key`), as polars expressions over FR_ENTRIES."""
    base = pl.col("profiling_name").fill_null("?").str.split(":").list.last().str.split(" ").list.first()
    loose = base.str.ends_with("_v") | base.str.ends_with("_v_single")
    ins = pl.when(loose | base.is_in(list(_NO_INPUT_SIZES))).then(None).otherwise(pl.col("input_sizes").hash())
    outs = pl.when(loose | base.is_in(list(_NO_OUTPUT_SIZES))).then(None).otherwise(pl.col("output_sizes").hash())
    dtypes = [pl.col(c).list.unique().list.sort().hash() for c in ("input_dtypes", "output_dtypes")]
    return pl.struct(base.alias("b"), ins.alias("i"), outs.alias("o"), dtypes[0].alias("di"),
                     dtypes[1].alias("do")).hash()


def find(entries: pl.DataFrame) -> list[Desync]:
    """The first disagreement of each process group among ``entries`` (FR_ENTRIES of the kept dumps)."""
    colls = entries.filter(~pl.col("is_p2p").fill_null(False) & pl.col("collective_seq_id").is_not_null()
                           & pl.col("pg").is_not_null())
    if colls.height == 0:
        return []
    # a rank's last call of a position counts (a coalesced group repeats one); the positions whose calls' signatures
    # (a hash of what _key compares) differ are found in one pass, then looked at in order up to each group's first
    at = colls.unique(["pg", "collective_seq_id", "rank"], keep="last", maintain_order=True).with_columns(
        _signature().alias("_sig"))
    differ = (at.group_by("pg", "collective_seq_id").agg(pl.col("_sig").n_unique().alias("n"))
              .filter(pl.col("n") > 1).select("pg", "collective_seq_id"))
    at = at.join(differ, on=["pg", "collective_seq_id"]).sort(["pg", "collective_seq_id", "rank"])
    out: list[Desync] = []
    done: set[str] = set()
    for (pg, seq), rows in at.group_by(["pg", "collective_seq_id"], maintain_order=True):
        if pg in done:
            continue
        calls = rows.to_dicts()
        keys = {r["rank"]: _key(r) for r in calls}
        if len(set(keys.values())) < 2:
            continue
        counts: dict[tuple, int] = {}
        for k in keys.values():
            counts[k] = counts.get(k, 0) + 1
        top = sorted(counts.values(), reverse=True)
        major = max(counts, key=lambda k: counts[k]) if top[0] > top[1] else None
        odd = tuple(sorted(r for r, k in keys.items() if major is None or k != major))
        ref = major if major is not None else keys[min(keys)]
        other = next(k for k in keys.values() if k != ref)
        text = {r["rank"]: describe(r) for r in calls}
        maj_text = next(text[r] for r, k in keys.items() if k == major) if major is not None else None
        out.append(Desync(str(pg), int(seq), _what(ref, other), text, odd, maj_text))  # type: ignore[arg-type]
        done.add(str(pg))
    return out
