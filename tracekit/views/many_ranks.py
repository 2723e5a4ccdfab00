"""A job of many ranks at a glance: how each attribution class is distributed over the ranks, and which ranks stand
out, instead of one row per rank (``tracekit inspect``'s overview beyond :data:`MANY_RANKS` ranks).

- :func:`distribution`: per class (and the median iteration time), the smallest, 10th percentile, median, 90th
  percentile and largest value over the ranks, with the ranks at either end.
- :func:`outliers`: ranks far from the others on some figure — more than :data:`OUTLIER_MADS` robust deviations
  (1.4826 × the median absolute deviation) from the median rank and at least :data:`OUTLIER_MIN_SHARE` of the
  iteration (or :data:`OUTLIER_MIN_NS`) away — largest first; where every rank of a host is out on the same figure,
  the host is named once instead.
- :func:`stragglers`: the ranks the others waited for most (from the matched collectives).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from tracekit.model.schema import CLASSES

#: beyond this many ranks the overview summarises them instead of listing them
MANY_RANKS = 32
#: robust deviations from the median rank that make an outlier ...
OUTLIER_MADS = 3.0
#: ... and the least distance from it: a share of the iteration, or time
OUTLIER_MIN_SHARE = 0.02
OUTLIER_MIN_NS = 1_000_000
#: the figures the distribution and the outliers look at: (column, label, is a share)
FIGURES = (("median_iteration_ns", "iteration", False), *[(f"{c}_share", c, True) for c in CLASSES])


def distribution(per_rank: pl.DataFrame | list[dict[str, Any]]) -> pl.DataFrame:
    """``figure, share, min, p10, median, p90, max, min_rank, max_rank`` for each of :data:`FIGURES` over the ranks
    (``share`` says whether the values are shares of the iteration or ns)."""
    pr = per_rank if isinstance(per_rank, pl.DataFrame) else pl.DataFrame(per_rank)
    rows = []
    for col, label, share in FIGURES:
        if pr.height == 0 or col not in pr.columns:
            continue
        v = pr.get_column(col).cast(pl.Float64).fill_null(np.nan).to_numpy()
        r = pr.get_column("rank").to_numpy()
        ok = ~np.isnan(v)
        if not ok.any():
            continue
        v, r = v[ok], r[ok]
        q = np.quantile(v, [0.0, 0.1, 0.5, 0.9, 1.0])
        rows.append({"figure": label, "share": share, "min": float(q[0]), "p10": float(q[1]), "median": float(q[2]),
                     "p90": float(q[3]), "max": float(q[4]), "min_rank": int(r[np.argmin(v)]),
                     "max_rank": int(r[np.argmax(v)])})
    return pl.DataFrame(rows, schema={"figure": pl.String, "share": pl.Boolean, "min": pl.Float64, "p10": pl.Float64,
                                      "median": pl.Float64, "p90": pl.Float64, "max": pl.Float64,
                                      "min_rank": pl.Int64, "max_rank": pl.Int64})


def outliers(per_rank: pl.DataFrame | list[dict[str, Any]], hosts: dict[int, str | None] | None = None,
             most: int = 8) -> list[dict[str, Any]]:
    """Ranks (or whole hosts) far from the median rank (module docstring), largest distance first: dicts with
    ``who`` (``rank 7`` or ``host node003 (8 ranks)``), ``ranks``, ``figure``, ``share``, ``value`` (the rank's, or
    the host's median), ``median`` and ``deviations``."""
    pr = per_rank if isinstance(per_rank, pl.DataFrame) else pl.DataFrame(per_rank)
    if pr.height < 3:
        return []
    hosts = hosts or {}
    found = []
    ranks = pr.get_column("rank").to_numpy()
    iteration = float(np.nanmedian(pr.get_column("median_iteration_ns").cast(pl.Float64).to_numpy())) \
        if "median_iteration_ns" in pr.columns else 0.0
    for col, label, share in FIGURES:
        if col not in pr.columns:
            continue
        v = pr.get_column(col).cast(pl.Float64).fill_null(np.nan).to_numpy()
        if np.isnan(v).all():
            continue
        med = float(np.nanmedian(v))
        mad = 1.4826 * float(np.nanmedian(np.abs(v - med)))
        floor = OUTLIER_MIN_SHARE if share else max(OUTLIER_MIN_NS, OUTLIER_MIN_SHARE * iteration)
        dev = np.abs(v - med)
        out = (dev > OUTLIER_MADS * max(mad, 1e-12)) & (dev >= floor)
        for i in np.flatnonzero(out):
            found.append({"rank": int(ranks[i]), "figure": label, "share": share, "value": float(v[i]),
                          "median": med, "deviations": float(dev[i] / max(mad, floor / OUTLIER_MADS))})
    by_host: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for f in found:
        h = hosts.get(f["rank"])
        if h is not None:
            by_host.setdefault((h, f["figure"]), []).append(f)
    per_host: dict[str, int] = {}
    for h in hosts.values():
        if h is not None:
            per_host[h] = per_host.get(h, 0) + 1
    rows, named = [], set()
    for (h, fig), fs in by_host.items():
        if len(fs) > 1 and len(fs) == per_host.get(h, 0):
            named.update((f["rank"], fig) for f in fs)
            rows.append({"who": f"host {h} ({len(fs)} ranks)", "ranks": sorted(f["rank"] for f in fs), "figure": fig,
                         "share": fs[0]["share"], "value": float(np.median([f["value"] for f in fs])),
                         "median": fs[0]["median"], "deviations": float(np.median([f["deviations"] for f in fs]))})
    rows += [{"who": f"rank {f['rank']}", "ranks": [f["rank"]], "figure": f["figure"], "share": f["share"],
              "value": f["value"], "median": f["median"], "deviations": f["deviations"]}
             for f in found if (f["rank"], f["figure"]) not in named]
    rows.sort(key=lambda x: (-x["deviations"], x["ranks"][0], x["figure"]))
    return rows[:most]


def stragglers(instances: pa.Table, most: int = 5) -> pl.DataFrame:
    """The ranks the others waited for most (:func:`tracekit.views.summary.stragglers`), the first ``most``."""
    from tracekit.views import summary

    return summary.stragglers(instances).head(most)
