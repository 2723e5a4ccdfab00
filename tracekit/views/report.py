"""Human-readable rendering of analysis results for the terminal (rich), shared by the CLI and TUI.

Light to import: pyarrow and polars are imported where they are used (``tracekit --help`` 0.16 -> 0.08 s median); the
CLI builds its ``--sort`` choices from :mod:`tracekit.views.sorts` without importing this module at all."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tracekit.model.units import count
from tracekit.views import nccl_report
from tracekit.views.formats import fmt_bytes, fmt_change, fmt_delta_ns, fmt_gbps, fmt_ns, fmt_share, text
from tracekit.views.sorts import SORTS, TENSOR_SORTS

if TYPE_CHECKING:
    from tracekit.analysis.compare import Diff  # noqa: F401 (what diff_renderables is given)
    from tracekit.analysis.pipeline import Analysis

CLASS_LABELS = {"compute": "compute", "overlapped": "overlapped", "exposed_comm": "exposed comm",
                "memory": "memory", "idle": "idle"}
SHORT_LABELS = {"compute": "compute", "overlapped": "overlap", "exposed_comm": "exposed", "memory": "memory",
                "idle": "idle"}
CLASS_STYLES = {"compute": "green", "overlapped": "cyan", "exposed_comm": "red", "memory": "yellow",
                "idle": "grey50"}
#: colours of event kinds on the timeline; kinds that are also classes keep the class colour
KIND_STYLES = {"compute": "green", "comm": "magenta", "memory": "yellow", "cpu_op": "dodger_blue2",
               "runtime": "medium_purple1", "wait": "red", "queue": "dark_orange", "annotation": "grey50"}
#: colours of the critical path's labels (tracekit.analysis.graph.critical_path.LABELS), those of the event kinds they
#: are spent in (transfer: comm, launch: runtime, CPU: cpu_op); waiting on a rank stands out in bold pure red
PATH_STYLES = {"compute": "green", "transfer": "magenta", "memory": "yellow", "idle": "grey50",
               "launch": "medium_purple1", "CPU": "dodger_blue2", "waiting": "bold red1"}

#: colours of the verdict's classes (tracekit.analysis.verdict.KINDS)
VERDICT_STYLES = {"link-bound": "bold red", "straggler-bound": "bold dark_orange", "input-bound": "bold cyan",
                  "host-bound": "bold yellow", "compute-bound": "bold green", "mixed": "bold magenta", "none": "bold",
                  "hung": "bold red", "desync": "bold red"}


#: the per-rank tables show this many ranks (a job of 100 000 ranks would print for minutes); --json and
#: export have them all
MAX_RANK_ROWS = 64


def _more_ranks(console: Console, ranks: int) -> None:
    if ranks > MAX_RANK_ROWS:
        console.print(f"showing {MAX_RANK_ROWS} of {ranks} ranks; --json or export for all", highlight=False)


def render_summary(console: Console, result: Analysis) -> None:
    """The ``tracekit summary`` screen: ranks × classes, then the job's headline numbers."""
    from tracekit.model.schema import CLASSES
    from tracekit.views import summary

    pr = summary.per_rank(result.breakdown)
    job = summary.job(result.breakdown, result.ranks)
    if result.hang is not None and (result.hang.kind != "none" or not job.get("ranks")):
        from tracekit.views import hang_report  # a hang comes first: the verdict names it, then every rank's position

        hang_report.render(console, result.hang, verdict_line=True)
        console.print()
    if not job.get("ranks"):
        if result.hang is not None and all(f.format == "flight-recorder" for f in result.traces.files):
            return  # dumps alone: the hang section is all there is
        # no profiler trace with activity: what the other inputs tell
        if any(f.format == "nccl-log" for f in result.traces.files) and all(
                f.format == "nccl-log" for f in result.traces.files):
            console.print("no iterations found: NCCL debug logs only, no profiler trace (give the job's traces "
                          "with the logs for the iteration breakdown)", highlight=False)
        else:
            console.print("no iterations found: no profiler trace with activity among the inputs")
        nccl_report.render_nccl(console, result.collectives, result.traces.topology)
        nccl_report.render_topology(console, result)
        return
    answer = result.summary_verdict
    if answer.source != "hang":  # a hang's verdict line came with its section
        console.print(Text.assemble(("verdict: ", "bold"), (answer.headline, VERDICT_STYLES.get(answer.kind, "bold"))),
                      soft_wrap=False)
    one = result.one_job
    if not one.one:  # every file, with what was found in it
        console.print(Text.assemble(("files: ", "bold"), one.listing()), soft_wrap=False)
    if answer.source != "hang" or not one.one:
        console.print()
    missing = summary.without_iterations(result.breakdown, result.ranks)
    title = f"{count(result.ranks.num_rows, 'rank')} · {count(job['iterations'], 'iteration')}" + (
        f" · {count(len(missing), 'rank')} without iterations" if missing else "")
    if result.notes:
        title += " · " + text("; ".join(result.notes))
    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False,
                  caption="share of each rank's iteration time; overlap = communication hidden under compute, "
                          "exposed = communication with no compute", caption_justify="left")
    table.add_column("rank", justify="right", no_wrap=True)
    table.add_column("iters", justify="right", no_wrap=True)
    table.add_column("median", justify="right", no_wrap=True)
    for c in CLASSES:
        table.add_column(SHORT_LABELS[c], justify="right", style=CLASS_STYLES[c], no_wrap=True)
    table.add_column("comm/it", justify="right", no_wrap=True)
    for row in pr.head(MAX_RANK_ROWS).iter_rows(named=True):
        table.add_row(str(row["rank"]), str(row["iterations"]), fmt_ns(row["median_iteration_ns"]),
                      *[fmt_share(row[f"{c}_share"]) for c in CLASSES], fmt_bytes(row["comm_bytes_per_iteration"]))
    for rank in missing[:max(MAX_RANK_ROWS - pr.height, 0)]:  # a file without iterations stays visible
        table.add_row(str(rank), "0", "–", *["–" for _ in CLASSES], "–")
    console.print(table)
    _more_ranks(console, pr.height + len(missing))
    shares = " · ".join(f"[{CLASS_STYLES[c]}]{CLASS_LABELS[c]} {fmt_share(job[f'{c}_share'])}[/]"
                        for c in CLASSES)
    console.print(f"[bold]job[/]: {shares}")
    w = job["worst_iteration"]
    console.print(f"[bold]iteration[/]: {fmt_ns(job['median_iteration_ns'])} (median time between iteration starts); "
                  f"worst iteration #{w['iteration']}: {fmt_ns(w['iteration_ns'])} (slowest: rank {w['slowest_rank']})")
    e = job["most_exposed_rank"]
    console.print(f"[bold]most exposed rank[/]: {e['rank']} — {fmt_share(e['exposed_comm_share'])} of its time "
                  "is communication not hidden under compute")
    console.print()
    render_links(console, result, pr)
    # traces that are not one job: nobody waited on anybody
    strag = summary.stragglers(result.instances) if one.one else summary.stragglers(result.instances).clear()
    if strag.height:
        console.print()
        render_stragglers(console, strag)
    if any(f.format == "nccl-log" for f in result.traces.files):
        console.print()
        nccl_report.render_nccl(console, result.collectives, result.traces.topology)
        nccl_report.render_topology(console, result)
    from tracekit.views import verdict

    console.print()
    console.print(verdict.paragraph(job, strag, summary.collectives_overview(result.instances),
                                    line_rate_bps=result.line_rate_bps, line_rate_source=result.line_rate_source,
                                    n_ranks=result.ranks.num_rows,
                                    sizes=summary.transfer_sizes(result.collectives),
                                    link_classes=result.link_busy.to_pylist()), soft_wrap=False)
    console.print()
    console.print(Text.assemble(("verdict: ", "bold"), (answer.headline, VERDICT_STYLES.get(answer.kind, "bold")),
                                " " + " ".join([*answer.support, *([answer.caveat] if answer.caveat else [])])),
                  soft_wrap=False)


def render_links(console: Console, result: Analysis, pr: object | None = None) -> None:
    """Per rank: bus traffic per iteration, how busy the links were, the achieved bus bandwidth, and with a
    line rate the utilisation; plus how much exposed communication was waiting."""
    import polars as pl

    from tracekit.model.units import format_rate
    from tracekit.views import summary

    per = pr if isinstance(pr, pl.DataFrame) else summary.per_rank(result.breakdown)
    rate = result.line_rate_bps
    known = result.breakdown.column("wait_ns").null_count
    hvd = getattr(result, "horovod", None)
    if hvd is not None and hvd.merged and known == 0:
        caption = "link busy = union of transfer time (rank 0: Horovod's transfer phases)"
    elif known == 0:
        caption = "link busy = union of transfer time (collectives matched across ranks)"
    elif known == result.breakdown.num_rows:
        caption = "link busy = union of all communication time (collectives not matched across ranks)"
    else:
        caption = "link busy = union of transfer time where collectives matched, of all communication elsewhere"
    title = "links" + (f" · line rate {format_rate(rate)}" + (f" ({result.line_rate_source})"
                                                              if result.line_rate_source != "given" else "")
                       if rate else " · no line rate (--link-bw)")
    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False,
                  caption=caption + "; busbw = bus bytes / busy time", caption_justify="left")
    for col in ("rank", "bus/it", "link busy", "busbw"):
        table.add_column(col, justify="right", no_wrap=True)
    if rate:
        table.add_column("of line", justify="right", no_wrap=True)
        table.add_column("utilisation", justify="right", no_wrap=True)
    table.add_column("wait of exposed", justify="right", no_wrap=True)
    for row in per.head(MAX_RANK_ROWS).iter_rows(named=True):
        cells = [str(row["rank"]), fmt_bytes(row["bus_bytes_per_iteration"]), fmt_share(row["link_busy_share"]),
                 fmt_gbps(row["busbw_gbps"])]
        if rate:
            cells.append(fmt_share(None if row["busbw_gbps"] is None else row["busbw_gbps"] * 1e9 / rate))
            cells.append(fmt_share(row["link_utilisation"]))
        cells.append(fmt_share(row["wait_share_of_exposed"]))
        table.add_row(*cells)
    console.print(table)
    _more_ranks(console, per.height)


def render_stragglers(console: Console, strag: object, top: int = 5) -> None:
    """The ranks everyone waited for most."""
    import polars as pl

    assert isinstance(strag, pl.DataFrame)
    table = Table(title="top stragglers", title_justify="left", header_style="bold", box=box.SIMPLE_HEAD,
                  pad_edge=False, caption="last = arrived last at a collective; waited = the other members' "
                  "wait for it, summed", caption_justify="left")
    for col in ("rank", "last", "of collectives", "waited", "of all waiting", "median lateness"):
        table.add_column(col, justify="right", no_wrap=True)
    for row in strag.head(top).iter_rows(named=True):
        table.add_row(str(row["rank"]), str(row["last_arrivals"]), fmt_share(row["last_arrival_share"]),
                      fmt_ns(row["waited_ns"]), fmt_share(row["wait_share"]), fmt_ns(row["median_skew_ns"]))
    console.print(table)


#: ``tracekit collectives --sort`` keys: column and whether largest first
def render_collectives(console: Console, result: Analysis, *, sort: str = "time", limit: int = 40) -> None:
    """The ``tracekit collectives`` screen: one row per collective instance, then totals per op."""
    import polars as pl

    from tracekit.model.units import format_rate
    from tracekit.views import summary

    inst = pl.from_arrow(result.instances)
    assert isinstance(inst, pl.DataFrame)
    ov = summary.collectives_overview(result.instances)
    if inst.height == 0:
        console.print("no collective calls with times in these traces")
        return
    col, desc = SORTS[sort]
    inst = inst.sort(col, descending=desc, nulls_last=True)
    shown = inst if limit <= 0 else inst.head(limit)
    rate = result.line_rate_bps
    title = (f"{count(ov['instances'], 'collective')} · {ov['matched']} matched across ranks · "
             f"{ov['partial']} partial · {ov['inconsistent']} inconsistent"
             + (f" · line rate {format_rate(rate)}" if rate else ""))
    t0 = int(inst.get_column("first_start_ns").min())  # type: ignore[arg-type]
    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False,
                  caption="times in the job clock; skew = last arrival - first; wait = summed over members; "
                          "transfer = median over members of end - last arrival; busbw = this call's bus bytes / "
                          "its transfer (calls running at once share the link)", caption_justify="left")
    for name in ("#", "at", "iter", "op", "bytes", "ranks", "skew", "wait", "transfer", "busbw"):
        table.add_column(name, justify="left" if name == "op" else "right", no_wrap=True)
    if rate:
        table.add_column("util", justify="right", no_wrap=True)
    table.add_column("straggler", justify="right", no_wrap=True)
    table.add_column("", no_wrap=True)
    for row in shown.iter_rows(named=True):
        flags = []
        if row["partial"]:
            flags.append("partial")
        if not row["consistent"]:
            flags.append("inconsistent")
        if not row["sizes_agree"]:
            flags.append("sizes differ")
        cells = [str(row["instance"]), fmt_ns(row["first_start_ns"] - t0),
                 "–" if row["iteration"] is None else str(row["iteration"]), text(row["op"] or "?"),
                 fmt_bytes(row["bytes"]), f"{len(row['ranks'])}/{row['nranks'] or '?'}", fmt_ns(row["skew_ns"]),
                 fmt_ns(row["wait_ns"]), fmt_ns(row["transfer_ns"]), fmt_gbps(row["busbw_gbps"])]
        if rate:
            cells.append(fmt_share(row["link_utilisation"]))
        cells += ["–" if row["straggler_rank"] is None else str(row["straggler_rank"]), ", ".join(flags)]
        table.add_row(*cells)
    console.print(table)
    if limit > 0 and inst.height > limit:
        console.print(f"showing {limit} of {inst.height} (sorted by {sort}); --limit 0 shows all")
    ops = summary.by_op(result.instances)
    t = Table(title="by op", title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("op", "calls", "sizes", "bus bytes", "median skew", "wait", "median transfer", "busbw"):
        t.add_column(name, justify="left" if name == "op" else "right", no_wrap=True)
    for row in ops.iter_rows(named=True):
        t.add_row(text(row["op"] or "?"), str(row["calls"]), str(row["sizes"]), fmt_bytes(row["bus_bytes"]),
                  fmt_ns(row["median_skew_ns"]), fmt_ns(row["wait_ns"]), fmt_ns(row["median_transfer_ns"]),
                  fmt_gbps(row["busbw_gbps"]))
    console.print()
    console.print(t)


def render_critical_path(console: Console, summ: object, segs: object, iteration: int, min_share: float) -> None:
    """Per iteration: the path's length and where it went; then the chosen iteration's path as runs of
    consecutive segments with the same rank, label and activity."""
    import polars as pl

    from tracekit.analysis.graph.critical_path import LABELS

    assert isinstance(summ, pl.DataFrame) and isinstance(segs, pl.DataFrame)
    table = Table(title="critical path per iteration (its length is the iteration time)", title_justify="left",
                  header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("iter", justify="right")
    table.add_column("length", justify="right")
    for lab in LABELS:
        table.add_column("waiting" if lab == "waiting" else lab, justify="right")
    unexplained = "unexplained_share" in summ.columns
    if unexplained:
        table.add_column("unexplained", justify="right")
        table.caption = ("unexplained = idle that no recorded or inferred dependency explains: every what-if replay "
                         "keeps it as measured")
        table.caption_justify = "left"
    table.add_column("ranks on path")
    table.add_column("most waited on", justify="right")
    for row in summ.iter_rows(named=True):
        shares = [fmt_share(row[f"{lab}_share"]) for lab in LABELS]
        if unexplained:
            shares.append(fmt_share(row["unexplained_share"]))
        table.add_row(str(row["iteration"]), fmt_ns(row["path_ns"]), *shares,
                      ",".join(str(r) for r in row["ranks"]),
                      "–" if row["most_waited_on"] is None else f"rank {row['most_waited_on']}")
    console.print(table)
    total = int(segs.get_column("dur_ns").sum()) if segs.height else 0
    if not total:
        return
    from tracekit.analysis.graph.critical_path import runs as path_runs

    runs = path_runs(segs)
    t0 = int(segs.get_column("start_ns").min())  # type: ignore[arg-type]
    shown = runs.filter(pl.col("dur_ns") >= min_share * total)
    path = Table(title=f"iteration {iteration}: the critical path ({runs.height} runs, {shown.height} of at least "
                 f"{100 * min_share:g} % shown)", title_justify="left", header_style="bold", box=box.SIMPLE_HEAD,
                 pad_edge=False)
    for col, just in (("at", "right"), ("for", "right"), ("rank", "right"), ("lane", "left"), ("what", "left"),
                      ("activity", "left")):
        path.add_column(col, justify=just)  # type: ignore[arg-type]
    for row in shown.iter_rows(named=True):
        style = PATH_STYLES["waiting"] if row["what"].startswith("waiting") else PATH_STYLES.get(row["what"], "")
        path.add_row(fmt_ns(row["start_ns"] - t0), fmt_ns(row["dur_ns"]), str(row["rank"]), text(row["lane"]),
                     f"[{style}]{text(row['what'])}[/]" if style else text(row["what"]), text((row["name"] or "")[:60]))
    console.print()
    console.print(path)


def render_whatif(console: Console, rows: object, model: object, verdict: object | None) -> None:
    """The what-if table: one row per scenario, then the job's verdict (or, given a link replays' answer, that)."""
    import polars as pl

    from tracekit.analysis.ranges import ranged_text, ratio_text
    from tracekit.model.units import format_rate

    assert isinstance(rows, pl.DataFrame)
    m: Any = model
    table = Table(title=f"what-if (measured iteration {fmt_ns(m.measured_iteration_ns)}, {m.workers} workers)",
                  title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False,
                  caption="speed-up = the job replayed as measured / predicted iteration time; scaling factor = "
                          "iteration time with free communication / predicted iteration time",
                  caption_justify="left")
    named = "links" in rows.columns and rows.get_column("links").is_not_null().any()
    ranged = "iteration_ns_low" in rows.columns
    for col in ("line rate", *(["links"] if named else []), "compression", "workers", "efficiency", "iteration",
                "speed-up", "scaling"):
        table.add_column(col, justify="right")
    for row in rows.iter_rows(named=True):
        rate = row["bandwidth_bps"]
        first = format_rate(rate) if rate and rate == rate else "as measured"
        if row.get("stragglers_removed"):  # the number behind "straggler-bound"
            first = "stragglers removed"
        if ranged:
            it = ranged_text(row["iteration_ns"], row["iteration_ns_low"], row["iteration_ns_high"])
            up = ratio_text(row["speedup"], row["speedup_low"], row["speedup_high"]).replace(" (", "x (", 1)
            up = up if "(" in up else up + "x"
            sf = ratio_text(row["scaling_factor"], row["scaling_factor_low"], row["scaling_factor_high"])
        else:
            it, up, sf = fmt_ns(row["iteration_ns"]), f"{row['speedup']:.2f}x", f"{row['scaling_factor']:.2f}"
        table.add_row(first, *([row["links"] or "–"] if named else []),
                      f"{row['compression']:g}x", str(row["workers"]), row["efficiency"], it, up, sf)
    console.print(table)
    console.print(m.self_check, highlight=False)  # the model's self-check: never a speed-up
    if ranged and rows.height:
        console.print(Text("ranges: where the truth should fall 9 times in 10; made of " +
                           ranges_made_of(rows.get_column("range_sources").to_list()), style="dim"))
    if verdict is not None and hasattr(verdict, "kind"):  # the job's one verdict
        v: Any = verdict
        console.print(Text.assemble(("verdict: ", "bold"), (v.headline, VERDICT_STYLES.get(v.kind, "bold")),
                                    " " + " ".join([*v.support, *([v.caveat] if v.caveat else [])])))
    elif verdict is not None:  # the link replays' answer (under another --latency than the job's)
        console.print(f"[bold]is the network the bottleneck?[/] {verdict.text}")  # type: ignore[attr-defined]


def ranges_made_of(per_row: list[list[dict[str, Any]] | None]) -> str:
    """What the what-if table's ranges are made of, over its rows: each source with its largest deviation."""
    from tracekit.analysis.ranges import sources_of, sources_text

    most: dict[str, tuple[float, float]] = {}
    for row in per_row:
        for k, (lo, hi) in sources_of(row).items():
            a, b = most.get(k, (0.0, 0.0))
            most[k] = (min(a, lo), max(b, hi))
    names = {"variation": "run-to-run variation", "model": "the model's self-check",
             "replay": "the replay's own error", "sizes": "estimated sizes",
             "link": "the link's split between wire and hosts", "unexplained": "gaps no dependency explains",
             "contention": "the contention fit"}
    text = sources_text(most)
    for k, v in names.items():
        text = text.replace(k + " ", v + " ", 1)
    return (text or "nothing the trace leaves open") + "."


def horovod_paragraph(res: object) -> str:
    """Plain-language account of a Horovod timeline's per-window table (:mod:`tracekit.analysis.horovod.windows`)."""
    from tracekit.analysis.horovod import windows as horovod

    assert isinstance(res, horovod.Result)
    s = horovod.summary(res)
    if not s.get("windows"):
        return "The Horovod timeline has no window with activity."
    over = res.method if res.only or not res.merged else "rank 0's iterations"
    parts = [f"Over {count(s['windows'], 'window')} ({over}), "
             f"Horovod moved data {fmt_share(s['transfer_share'])} of the time (the union of every tensor's "
             "transfer phases: fused tensors count once)"]
    if s.get("busbw_gbps") is not None:
        parts[-1] += f", at {fmt_gbps(s['busbw_gbps'])} of bus bandwidth while busy"
        if s.get("link_utilisation") is not None:
            parts[-1] += f" ({fmt_share(s['link_utilisation'])} of the line rate over the whole time)"
    parts[-1] += "."
    extra = [f"negotiation (waiting for the other ranks to ask for the same tensor) covered "
             f"{fmt_share(s['negotiation_share'])}"]
    for key, label in (("queue_share", "queueing"), ("memcpy_share", "fusion-buffer copies"),
                       ("wait_for_data_share", "waiting for this rank's data")):
        if s.get(key):
            extra.append(f"{label} {fmt_share(s[key])}")
    parts.append(extra[0][0].upper() + "; ".join(extra)[1:] + ".")
    last = res.totals.get("last_ticks") or {}
    judged = res.totals.get("judged") or 0
    if judged and len(last) > 0:
        rank, n = max(last.items(), key=lambda kv: (kv[1], -kv[0]))
        parts.append(f"Rank {rank} asked last for {n} of {count(judged, 'tensor')} whose negotiation logged every "
                     "rank.")
    if res.only:
        parts.append(f"No Horovod data moved {fmt_share(s['link_idle_share'])} of the time; the timeline cannot "
                     "say what the job did then (it holds no compute): add rank 0's profiler trace for the "
                     "five-way breakdown.")
    elif res.merged:
        parts.append("Rank 0's breakdown above uses these phases as its communication: transfer as transfer, "
                     "negotiation as waiting.")
    return " ".join(parts)


def render_horovod(console: Console, res: object, *, line_rate_bps: float | None = None, limit: int = 40) -> None:
    """The Horovod part of ``tracekit summary``: one row per window of ``horovod_breakdown``, a total row,
    and the paragraph."""
    import polars as pl

    from tracekit.analysis.horovod import windows as horovod
    from tracekit.model.units import format_rate

    assert isinstance(res, horovod.Result)
    b = pl.from_arrow(res.breakdown)
    assert isinstance(b, pl.DataFrame)
    s = horovod.summary(res)
    where = "timeline only" if res.only else ("merged into rank 0" if res.merged else "not merged")
    windows = f"{count(b.height, 'iteration')} ({res.method})" if res.only or not res.merged else \
        f"{count(b.height, 'window')} (rank 0's iterations)"
    title = f"horovod timeline · {windows} · {rank_count(res.world_size)} · {where}"
    if line_rate_bps:
        title += f" · line rate {format_rate(line_rate_bps)}"
    show_wfd = bool(b.height) and int(b.get_column("wait_for_data_ns").sum()) > 0
    show_queue = bool(b.height) and int(b.get_column("queue_ns").sum()) > 0
    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False,
                  caption="transfer = union of all tensors' transfer phases (fused tensors once); link idle = wall - "
                          "transfer (no Horovod data moving: the timeline has no compute, so not 'the job was idle'); "
                          "negotiation = union of NEGOTIATE phases (waiting for the other ranks); busbw = bus bytes / "
                          "transfer", caption_justify="left")
    cols = ["iter", "wall", "transfer", "%", "link idle", "negotiation", "%"]
    if show_queue:
        cols.append("queue")
    cols.append("memcpy")
    if show_wfd:
        cols.append("wait data")
    cols += ["bytes", "busbw"]
    if line_rate_bps:
        cols.append("util")
    for c in cols:
        table.add_column(c, justify="right", no_wrap=True)

    def cells(row: dict, label: str) -> list[str]:
        out = [label, fmt_ns(row["wall_ns"]), fmt_ns(row["transfer_ns"]), fmt_share(row.get("transfer_share")),
               fmt_ns(row["link_idle_ns"]), fmt_ns(row["negotiation_ns"]), fmt_share(row.get("negotiation_share"))]
        if show_queue:
            out.append(fmt_ns(row["queue_ns"]))
        out.append(fmt_ns(row["memcpy_ns"]))
        if show_wfd:
            out.append(fmt_ns(row["wait_for_data_ns"]))
        out += [fmt_bytes(row["bytes"]), fmt_gbps(row["busbw_gbps"])]
        if line_rate_bps:
            out.append(fmt_share(row["link_utilisation"]))
        return out

    shown = b if limit <= 0 or b.height <= limit else b.head(limit)
    for row in shown.iter_rows(named=True):
        table.add_row(*cells(row, str(row["iteration"])))
    if b.height:
        total = {"wall_ns": s["wall_ns"], "transfer_ns": s["transfer_ns"], "transfer_share": s["transfer_share"],
                 "link_idle_ns": s["link_idle_ns"], "negotiation_ns": s["negotiation_ns"],
                 "negotiation_share": s["negotiation_share"], "queue_ns": s["queue_ns"], "memcpy_ns": s["memcpy_ns"],
                 "wait_for_data_ns": s["wait_for_data_ns"], "bytes": b.get_column("bytes").sum(),
                 "busbw_gbps": s["busbw_gbps"], "link_utilisation": s.get("link_utilisation")}
        table.add_section()
        table.add_row(*cells(total, "all"), style="bold")
    console.print(table)
    if shown.height < b.height:
        console.print(f"showing {shown.height} of {b.height} windows; --json or export for all")
    console.print(horovod_paragraph(res), soft_wrap=False)


#: ``tracekit tensors --sort`` keys: column and whether largest first
def render_tensors(console: Console, res: object, *, sort: str = "transfer", limit: int = 40,
                   line_rate_bps: float | None = None) -> None:
    """The ``tracekit tensors`` screen: one row per tensor of ``horovod_tensors``, then the job's totals."""
    import polars as pl

    from tracekit.analysis.horovod import windows as horovod
    from tracekit.model.units import format_rate

    assert isinstance(res, horovod.Result)
    t = pl.from_arrow(res.tensors)
    assert isinstance(t, pl.DataFrame)
    tot = res.totals
    if t.height == 0:
        console.print("no tensors in the Horovod timeline")
        return
    col, desc = TENSOR_SORTS[sort]
    t = t.sort(col, descending=desc, nulls_last=True)
    shown = t if limit <= 0 else t.head(limit)
    title = (f"{count(tot['tensors'], 'tensor')} · {count(tot['instances'], 'op instance')} in "
             f"{count(tot['responses'], 'response')} · {rank_count(res.world_size)}"
             + (f" · line rate {format_rate(line_rate_bps)}" if line_rate_bps else ""))
    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False,
                  caption="bytes = dtype x shape of one instance; negotiation = NEGOTIATE phases (waiting for the "
                          "other ranks), total and median; transfer = the whole transfer of the fused response(s) the "
                          "tensor travelled in, total and median (shared by its fused tensors: never add the rows up); "
                          "busbw = those responses' bus bytes / their transfer; fused = median tensors per response; "
                          "last = how often each rank asked for the tensor last (negotiations with every rank's tick)",
                  caption_justify="left")
    for name, just in (("tensor", "left"), ("op", "left"), ("dtype", "left"), ("shape", "left"), ("bytes", "right"),
                       ("inst", "right"), ("negotiation", "right"), ("median", "right"), ("transfer", "right"),
                       ("median", "right"), ("busbw", "right")):
        if name == "tensor":
            table.add_column(name, justify="left", overflow="fold", max_width=48)
        else:
            table.add_column(name, justify=just, no_wrap=True)  # type: ignore[arg-type]
    if line_rate_bps:
        table.add_column("util", justify="right", no_wrap=True)
    table.add_column("fused", justify="right", no_wrap=True)
    table.add_column("last", justify="left", no_wrap=True)
    for row in shown.iter_rows(named=True):
        last = row["last_ticks"] or []
        last_txt = " ".join(f"r{r}:{n}" for r, n in enumerate(last) if n) or "–"
        shape = row["shape"] or "–"
        cells = [text(row["tensor"] or "?"), text(row["op"] or "?"), text(row["dtype"] or "–"),
                 text(shape if len(shape) <= 24 else shape[:23] + "…"), fmt_bytes(row["bytes"]),
                 str(row["instances"]), fmt_ns(row["negotiate_ns"]), fmt_ns(row["negotiate_median_ns"]),
                 fmt_ns(row["transfer_ns"]), fmt_ns(row["transfer_median_ns"]), fmt_gbps(row["busbw_gbps"])]
        if line_rate_bps:
            cells.append(fmt_share(row["link_utilisation"]))
        fused = row["fusion_size_median"]
        cells += ["–" if fused is None else f"{fused:g}", last_txt]
        table.add_row(*cells)
    console.print(table)
    if limit > 0 and t.height > limit:
        console.print(f"showing {limit} of {t.height} tensors (sorted by {sort}); --limit 0 shows all")
    last = tot.get("last_ticks") or {}
    strag = ", ".join(f"rank {r} {n}" for r, n in sorted(last.items())) if last else "no negotiation logged every rank"
    line = (f"[bold]all[/]: {fmt_bytes(tot['bytes_total'])} in {count(tot['instances'], 'instance')}; over "
            f"{fmt_ns(tot['span_ns'])} of timeline, transfer {fmt_ns(tot['transfer_ns'])} and negotiation "
            f"{fmt_ns(tot['negotiation_ns'])} (unions: fused tensors and concurrent negotiations once)")
    if tot.get("busbw_gbps") is not None:
        line += f"; busbw {fmt_gbps(tot['busbw_gbps'])}"
        if tot.get("link_utilisation") is not None:
            line += f" ({fmt_share(tot['link_utilisation'])} of the line rate)"
    console.print(line, highlight=False)
    console.print(f"[bold]last to ask[/]: {strag}" + (f" (of {tot['judged']} judged negotiations)" if last else ""),
                  highlight=False)


# ---------------------------------------------------------------------------------------------------
# top ops and the idle split (tracekit/analysis/top_ops.py, tracekit/analysis/idle.py)


def top_ops_table(top: object, limit: int = 5) -> Table:
    """The job's top ops per attribution class (rows of :func:`tracekit.analysis.top_ops.job_level`). In the
    overlapped class compute and communication run at once, so every instant counts on both sides: its ops are
    listed side by side (compute, then communication), each side's shares adding up to the class (not twice it)."""
    import polars as pl

    assert isinstance(top, pl.DataFrame)
    table = Table(title="top ops per class (all ranks; time per rank-iteration)", title_justify="left",
                  header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False,
                  caption="of class = how much of the class's time the op ran (ops running at once each count); "
                          "overlapped: compute and communication at once, each side's ops listed apart; CPU "
                          "operators: each thread's top-level ones", caption_justify="left")
    for col, just in (("class", "left"), ("#", "right"), ("kind", "left"), ("name", "left"), ("calls", "right"),
                      ("time/it", "right"), ("of class", "right")):
        if col == "name":
            table.add_column(col, justify="left", overflow="ellipsis", max_width=60, no_wrap=True)
        else:
            table.add_column(col, justify=just, no_wrap=True)  # type: ignore[arg-type]
    if top.height:
        side = pl.when(pl.col("class") != "overlapped").then(pl.col("class")) \
            .when(pl.col("kind") == "comm").then(pl.lit("overlapped (communication)")) \
            .otherwise(pl.lit("overlapped (compute)"))
        comm_side = (pl.col("class") == "overlapped") & (pl.col("kind") == "comm")
        order = {c: 2 * i for i, c in enumerate(dict.fromkeys(top.get_column("class").to_list()))}
        top = top.with_columns(side.alias("_section"),
                               (pl.col("class").replace_strict(order, return_dtype=pl.Int64) + comm_side)
                               .alias("_o")).sort("_o", maintain_order=True) \
            .with_columns(pl.int_range(1, pl.len() + 1).over("_section").alias("_n"))  # rows are ranked already
    shown = top.filter(pl.col("_n") <= limit) if top.height else top
    last = None
    for row in shown.iter_rows(named=True):
        section = row["_section"]
        if last is not None and section != last:
            table.add_section()
        cls = row["class"]
        label = CLASS_LABELS.get(cls, cls) + section.removeprefix(cls)
        table.add_row(label if section != last else "", str(row["_n"]), row["kind"],
                      row["name"] or "?", f"{row['calls']:,}", fmt_ns(row["per_iteration_ns"]),
                      fmt_share(row["class_share"]),
                      style=CLASS_STYLES.get(cls, "") if section != last else "")
        last = section
    return table


def idle_table(per_rank: object, job: dict[str, Any]) -> Table:
    """Per rank: idle time per iteration and its split into host-bound, synchronisation and other (rows of
    :func:`tracekit.analysis.idle.per_rank`); "n/a" on CPU-only ranks."""
    import polars as pl

    assert isinstance(per_rank, pl.DataFrame)
    table = Table(title="idle time: why the device waited", title_justify="left", header_style="bold",
                  box=box.SIMPLE_HEAD, pad_edge=False, caption="shares of the idle time; n/a: no device",
                  caption_justify="left")
    for col in ("rank", "idle/it", "host-bound", "sync", "other"):
        table.add_column(col, justify="right", no_wrap=True)

    def cells(r: dict[str, Any]) -> list[str]:
        per_it = r["idle_ns"] / r["windows"] if r.get("windows") else None
        if r.get("host_bound_share") is None and r.get("host_bound_ns") is None:
            return [fmt_ns(per_it), "n/a", "n/a", "n/a"]
        return [fmt_ns(per_it), *[fmt_share(r.get(f"{p}_share")) for p in ("host_bound", "sync", "other")]]

    for r in per_rank.iter_rows(named=True):
        table.add_row(str(r["rank"]), *cells(r))
    if per_rank.height > 1 and job.get("windows"):
        table.add_section()
        table.add_row("all", *cells(job), style="bold")
    return table


# ---------------------------------------------------------------------------------------------------
# tracekit diff


def rank_count(n: int | None) -> str:
    """``1 rank``, ``8 ranks``, ``? ranks`` when the world size is not known."""
    return count(n, "rank") if n else "? ranks"


def _arrow(a: str, b: str) -> str:
    return a if a == b else f"{a} → {b}"


def _num(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"


def diff_renderables(d: object, limit: int = 10) -> list[Any]:
    """Everything ``tracekit diff`` prints (and the Diff tab shows), as rich renderables."""
    import polars as pl
    from rich.text import Text

    from tracekit.model.schema import CLASSES

    out: list[Any] = []
    head = Text()
    head.append("diff ", style="bold")
    head.append(f"{d.base}", style="cyan")
    head.append(" (base) → ")
    head.append(f"{d.new}", style="magenta")
    same = d.base_ranks == d.new_ranks
    head.append(f" (new) · {count(d.base_ranks, 'rank')} each" if same else
                f" (new) · {count(d.base_ranks, 'rank')} → {count(d.new_ranks, 'rank')}")
    out.append(head)
    # iteration time
    t = Table(title="iteration time (median)", title_justify="left", header_style="bold", box=box.SIMPLE_HEAD,
              pad_edge=False, caption="job: the slowest rank's window of each iteration", caption_justify="left")
    for col in ("scope", "windows", "base", "new", "change", ""):
        t.add_column(col, justify="right", no_wrap=True)
    for r in d.iterations.iter_rows(named=True):
        scope = "job" if r["rank"] is None else f"rank {r['rank']}"
        t.add_row(scope, _arrow(str(r["base_windows"] or 0), str(r["new_windows"] or 0)), fmt_ns(r["base_median_ns"]),
                  fmt_ns(r["new_median_ns"]), fmt_delta_ns(r["delta_median_ns"]),
                  fmt_change(r["base_median_ns"], r["new_median_ns"]), style="bold" if r["rank"] is None else "")
    out.append(t)
    # breakdown of the job
    labels = {"wall": "iteration (wall)", "compute": "compute", "overlapped": "overlapped",
              "exposed_comm": "exposed comm", "wait": "  waiting", "transfer": "  transfer", "memory": "memory",
              "idle": "idle", "host_bound": "  host-bound", "sync": "  sync", "other_idle": "  other"}
    t = Table(title="where an iteration goes (job)", title_justify="left", header_style="bold", box=box.SIMPLE_HEAD,
              pad_edge=False, caption="mean over every rank's windows; share of the iteration",
              caption_justify="left")
    for col, just in (("class", "left"), ("base", "right"), ("share", "right"), ("new", "right"), ("share", "right"),
                      ("change", "right")):
        t.add_column(col, justify=just, no_wrap=True)  # type: ignore[arg-type]
    for r in d.job("breakdown").iter_rows(named=True):
        if r["base_ns"] is None and r["new_ns"] is None:
            continue
        cls = r["class"]
        style = CLASS_STYLES.get(cls, "")
        t.add_row(Text(labels.get(cls, cls), style=style), fmt_ns(r["base_ns"]),
                  "" if cls == "wall" else fmt_share(r["base_share"]), fmt_ns(r["new_ns"]),
                  "" if cls == "wall" else fmt_share(r["new_share"]), fmt_delta_ns(r["delta_ns"]))
    out.append(t)
    # per rank
    if d.ranks:
        t = Table(title="per rank: change per iteration", title_justify="left", header_style="bold",
                  box=box.SIMPLE_HEAD, pad_edge=False)
        t.add_column("rank", justify="right", no_wrap=True)
        cols = ("wall", *CLASSES)
        for c in cols:
            t.add_column("wall" if c == "wall" else SHORT_LABELS[c], justify="right", no_wrap=True,
                         style=CLASS_STYLES.get(c, ""))
        per = d.breakdown.filter(pl.col("rank").is_not_null())
        for rank in d.ranks:
            rows = {r["class"]: r for r in per.filter(pl.col("rank") == rank).iter_rows(named=True)}
            t.add_row(str(rank), *[fmt_delta_ns(rows[c]["delta_ns"]) if c in rows else "–" for c in cols])
        out.append(t)
    # communication per op
    comm = d.job("comm")
    if comm.height:
        t = Table(title="communication per op (job, per rank-iteration)", title_justify="left", header_style="bold",
                  box=box.SIMPLE_HEAD, pad_edge=False,
                  caption="busbw = bus bytes / transfer time of the matched collectives; wait and transfer summed over "
                          "a rank's calls", caption_justify="left")
        for col, just in (("op", "left"), ("calls/it", "right"), ("bytes/call", "right"), ("bytes/it", "right"),
                          ("busbw", "right"), ("wait/it", "right"), ("transfer/it", "right")):
            t.add_column(col, justify=just, no_wrap=True)  # type: ignore[arg-type]
        for r in comm.iter_rows(named=True):
            t.add_row(r["op"], _arrow(_num(r["base_calls_per_iteration"]), _num(r["new_calls_per_iteration"])),
                      _arrow(fmt_bytes(r["base_bytes_per_call"]), fmt_bytes(r["new_bytes_per_call"])),
                      _arrow(fmt_bytes(r["base_bytes_per_iteration"]), fmt_bytes(r["new_bytes_per_iteration"])),
                      _arrow(fmt_gbps(r["base_busbw_gbps"]), fmt_gbps(r["new_busbw_gbps"])),
                      _arrow(fmt_ns(r["base_wait_ns"]), fmt_ns(r["new_wait_ns"])),
                      _arrow(fmt_ns(r["base_transfer_ns"]), fmt_ns(r["new_transfer_ns"])))
        out.append(t)
    # ops
    ops = d.job("ops").head(limit)
    if ops.height:
        t = Table(title="ops whose time changed most (job)", title_justify="left", header_style="bold",
                  box=box.SIMPLE_HEAD, pad_edge=False, caption="per rank-iteration; matched by kind and name; CPU "
                  "operators: each thread's top-level ones", caption_justify="left")
        for col, just in (("kind", "left"), ("name", "left"), ("base", "right"), ("new", "right"),
                          ("change", "right"), ("calls/it", "right")):
            if col == "name":
                t.add_column(col, justify="left", overflow="ellipsis", max_width=56, no_wrap=True)
            else:
                t.add_column(col, justify=just, no_wrap=True)  # type: ignore[arg-type]
        for r in ops.iter_rows(named=True):
            t.add_row(r["kind"], r["name"] or "?", fmt_ns(r["base_ns"]), fmt_ns(r["new_ns"]),
                      fmt_delta_ns(r["delta_ns"]), _arrow(_num(r["base_calls"]), _num(r["new_calls"])))
        out.append(t)
    # critical path
    if d.critical_path.height:
        t = Table(title="critical path (per iteration)", title_justify="left", header_style="bold", box=box.SIMPLE_HEAD,
                  pad_edge=False)
        for col, just in (("label", "left"), ("base", "right"), ("share", "right"), ("new", "right"),
                          ("share", "right"), ("change", "right")):
            t.add_column(col, justify=just, no_wrap=True)  # type: ignore[arg-type]
        for r in d.critical_path.iter_rows(named=True):
            if not r["base_ns"] and not r["new_ns"]:
                continue
            t.add_row(Text(r["label"], style=PATH_STYLES.get(r["label"], "")), fmt_ns(r["base_ns"]),
                      fmt_share(r["base_share"]), fmt_ns(r["new_ns"]), fmt_share(r["new_share"]),
                      fmt_delta_ns(r["delta_ns"]))
        out.append(t)
    for who, v in (("base", d.base_verdict), ("new", d.new_verdict)):
        if v is not None:
            line = Text()
            line.append(f"verdict ({who}): ", style="bold")
            line.append(v.headline, style=VERDICT_STYLES.get(v.kind, "bold"))
            rest = v.text[len(v.headline):].strip() if v.text.startswith(v.headline) else v.text
            if rest:
                line.append(" " + rest)
            out.append(line)
    for note in d.notes:
        out.append(Text(f"note: {note}", style="yellow"))
    return out


def render_diff(console: Console, d: object, limit: int = 10) -> None:
    """The ``tracekit diff`` screen."""
    for i, r in enumerate(diff_renderables(d, limit)):
        if i:
            console.print()
        console.print(r, soft_wrap=False)
