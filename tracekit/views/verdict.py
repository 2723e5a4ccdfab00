"""A plain-language paragraph of what the numbers say about the links and the waiting, for the terminal and
the TUI alike. It states measurements only — how busy the links were, how fast relative to the line rate,
how much exposed communication was waiting and for whom; whether a faster link would pay off is the
what-if analysis' question, not this paragraph's.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from tracekit.analysis import waited
from tracekit.analysis.link_classes import sentence as link_sentence
from tracekit.model.units import count
from tracekit.model.units import format_rate as _rate
from tracekit.views.formats import fmt_bytes as _bytes
from tracekit.views.formats import fmt_ns as _ns

#: a rank is called the straggler when it caused more than this share of all waiting (the verdict's rank everyone
#: waited on, which it accounts for)
MOSTLY = waited.MOSTLY


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %" if x >= 0.01 or x == 0 else f"{100 * x:.1f} %"


def paragraph(job: dict[str, Any], stragglers: pl.DataFrame, overview: dict[str, Any], *,
              line_rate_bps: float | None = None, line_rate_source: str | None = None, n_ranks: int = 0,
              sizes: dict[str, Any] | None = None, link_classes: list[dict[str, Any]] | None = None) -> str:
    """One paragraph from :func:`tracekit.views.summary.job`, :func:`tracekit.views.summary.stragglers`,
    :func:`tracekit.views.summary.collectives_overview` and :func:`tracekit.views.summary.transfer_sizes`
    (``sizes``: when some are unknown, the paragraph says so instead of quoting traffic figures that would leave
    them out); ``link_classes``, the rows of :func:`tracekit.analysis.link_classes.busy`, add which link class is
    busiest."""
    if not job.get("ranks"):
        return "No iteration was found, so there is nothing to say about the links."
    parts: list[str] = []
    split_known = job.get("wait_share_of_exposed") is not None
    busy = job.get("link_busy_share")
    busbw = job.get("busbw_gbps")
    what = "moving data for a collective" if split_known else "carrying communication (waiting included, " \
                                                               "as the collectives were not matched across ranks)"
    if busy is not None and job.get("link_active_ns"):
        s = f"Links were busy {_pct(busy)} of the iteration time, {what}"
        if job.get("bus_bytes_per_iteration"):
            s += f"; each rank put {_bytes(job['bus_bytes_per_iteration'])} of bus traffic on them per iteration"
        if busbw is not None:
            s += f" at {_rate(busbw * 1e9)} while busy"
            if line_rate_bps:
                src = "" if line_rate_source == "given" else f" ({line_rate_source})"
                s += f", {_pct(busbw * 1e9 / line_rate_bps)} of the {_rate(line_rate_bps)} line rate{src}"
        s += "."
        if sizes and sizes.get("unknown"):
            s += (f" How much data moved is not known: the sizes of {sizes['unknown']} of "
                  f"{count(sizes['calls'], 'call')} are not in the traces (record_shapes was off), so bus traffic, "
                  "bandwidth and utilisation are not given.")
        if line_rate_bps and busbw is not None and busbw * 1e9 > 1.05 * line_rate_bps:
            s += (" That is faster than the line rate: some of the traffic did not cross that link (NVLink or "
                  "shared memory inside a host?), or the rate given is too low.")
        elif line_rate_bps and job.get("link_utilisation") is not None:
            s += (f" Over the whole iteration the links ran at {_pct(job['link_utilisation'])} of line rate: "
                  f"the same traffic at full rate would take {_pct(job['link_utilisation'])} of the time.")
        elif not line_rate_bps:
            s += " Give --link-bw (e.g. 100Gbit) to compare with the line rate."
        by_class = link_sentence(link_classes or [])
        if by_class:
            s += f" {by_class} (transfer time over their ranks' iteration time)."
        parts.append(s)
    else:
        parts.append("No communication was found in the iterations.")
        return " ".join(parts)
    exposed = job.get("exposed_comm_share", 0.0)
    s = f"Exposed communication (not hidden under compute) is {_pct(exposed)} of the iteration time"
    if split_known:
        wait_share = job["wait_share_of_exposed"]
        covered = job.get("exposed_split_share")
        if covered is not None and covered < 0.995:  # the verdict says the same (tracekit.analysis.verdict)
            s += (f"; where its collectives were matched on all their ranks ({_pct(covered)} of it), "
                  f"{_pct(wait_share)} is waiting for other ranks to arrive, the rest is transfer; elsewhere "
                  f"{_why_unsplit(overview, n_ranks)}.")
        else:
            s += f"; {_pct(wait_share)} of it is waiting for other ranks to arrive, the rest is transfer."
        if stragglers.height:
            top = stragglers.row(0, named=True)
            judged = overview.get("judged", 0)
            share = top["wait_share"] or 0.0
            if share > MOSTLY:
                s += (f" Rank {top['rank']} is the straggler: last to arrive at {top['last_arrivals']} of {judged} "
                      f"collectives, and {_pct(share)} of all waiting ({_ns(top['waited_ns'])}, counting waits "
                      "hidden under other work) was for it.")
            else:
                s += (f" No rank stands out as the straggler: the most waited-for, rank {top['rank']}, arrived last "
                      f"at {top['last_arrivals']} of {count(judged, 'collective')} and caused {_pct(share)} of all "
                      "waiting.")
    else:
        s += "; " + _why_unsplit(overview, n_ranks) + "."
    parts.append(s)
    if overview.get("inconsistent"):
        parts.append(f"{overview['inconsistent']} matched collectives are impossible in time and were left out.")
    return " ".join(parts)


def _why_unsplit(overview: dict[str, Any], n_ranks: int) -> str:
    """Why waiting and transfer cannot be told apart."""
    if n_ranks <= 1:
        return "with one rank, waiting for others cannot be told apart from transfer"
    if not overview.get("instances"):
        return "no collective calls with times were found, so waiting cannot be told apart from transfer"
    if not overview.get("matched"):
        return "no collective matched across ranks, so waiting cannot be told apart from transfer"
    if overview.get("partial"):
        return (f"{overview['partial']} of {count(overview['instances'], 'collective')} were seen on only some of "
                "their ranks (not every rank was traced), so waiting cannot be told apart from transfer")
    return "some communication could not be matched across ranks, so waiting cannot be told apart from transfer"
