"""Line rates, bus bytes, link columns and the verdict paragraph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tests import kineto_traces as kt
from tracekit.analysis import links
from tracekit.analysis.pipeline import analyse
from tracekit.loading.traceset import load
from tracekit.model import schema
from tracekit.model.diagnostics import TraceError
from tracekit.model.units import format_rate, parse_rate
from tracekit.views import summary, verdict

MS = kt.MS


@pytest.mark.parametrize(("text", "bps"), [
    ("100Gbit", 100e9), ("100gbit", 100e9), ("100 Gbit/s", 100e9), ("100Gb/s", 100e9), ("25GB/s", 200e9),
    ("25GBps", 200e9), ("200mbit", 200e6), ("1e9", 1e9), ("1e9bit", 1e9), ("1.5gbit", 1.5e9),
    ("3.125GiB/s", 3.125 * 8 * 2**30), ("400kbit", 400e3), ("12.5 GB/s", 100e9),
])
def test_parse_rate(text: str, bps: float) -> None:
    assert parse_rate(text) == pytest.approx(bps)


@pytest.mark.parametrize(("text", "says"), [
    ("100mbps", "ambiguous"), ("100G", "bits or bytes"), ("fast", "expected a number"), ("0", "positive"),
    ("-5gbit", "expected a number"), ("1e30bit", "outside"), ("100MB", "size, not a rate"),
    ("12 furlongs", "unknown unit"), ("1bit", "outside"),
])
def test_bad_rates_are_one_line_errors(text: str, says: str) -> None:
    with pytest.raises(TraceError) as e:
        parse_rate(text)
    msg = str(e.value)
    assert says in msg and "\n" not in msg and text in msg


def test_format_rate() -> None:
    assert format_rate(100e9) == "100 Gbit/s" and format_rate(3e8) == "300 Mbit/s" and format_rate(None) == "–"


@pytest.mark.parametrize(("op", "n", "factor"), [
    ("allreduce", 2, 1.0), ("allreduce", 8, 1.75), ("allgather", 4, 0.75), ("reduce_scatter", 4, 0.75),
    ("all_to_all", 8, 0.875), ("broadcast", 8, 1.0), ("reduce", 8, 1.0), ("send", 2, 1.0), ("recv", 2, 1.0),
    ("barrier", 8, 0.0), ("allreduce", None, None), ("mystery", 4, None),
])
def test_bus_factors(op: str, n: int | None, factor: float | None) -> None:
    assert links.bus_factor(op, n) == factor
    got = pl.DataFrame({"op": [op], "bytes": [1_000_000], "nranks": [n]},
                       schema={"op": pl.String, "bytes": pl.Int64, "nranks": pl.Int32}).select(
        links.bus_bytes_expr().alias("b"))["b"][0]
    assert got == (None if factor is None else round(1_000_000 * factor))


def test_window_link_columns() -> None:
    b = schema.table(schema.BREAKDOWN, {
        "rank": [0, 0], "iteration": [1, 2], "start_ns": [0, 100 * MS], "end_ns": [100 * MS, 200 * MS],
        "wall_ns": [100 * MS, 100 * MS], "link_active_ns": [40 * MS, 0]})
    colls = schema.table(schema.COLLECTIVES, {
        "rank": [0, 0], "op": ["allreduce", "allgather"], "bytes": [10_000_000, 8_000_000], "nranks": [4, 4],
        "start_ns": [10 * MS, 20 * MS]})
    rate = 1e9  # 1 Gbit/s = 125 MB/s
    out = pl.from_arrow(links.window_links(b, colls, rate))
    assert isinstance(out, pl.DataFrame)
    r0, r1 = out.row(0, named=True), out.row(1, named=True)
    bus = 15_000_000 + 6_000_000  # 2(n-1)/n S + (n-1)/n S
    assert r0["bus_bytes"] == bus and r0["link_idle_ns"] == 60 * MS
    assert r0["busbw_gbps"] == pytest.approx(bus * 8 / (40 * MS))  # Gbit/s = bits per ns
    assert r0["ideal_comm_ns"] == round(bus * 8 / rate * 1e9)
    assert r0["link_utilisation"] == pytest.approx(bus * 8 / (rate * 0.1))
    # no collective in the second window: no traffic, no bandwidth
    assert (r1["bus_bytes"], r1["busbw_gbps"], r1["link_utilisation"]) == (0, None, 0.0)
    without = pl.from_arrow(links.window_links(b, colls, None))
    assert isinstance(without, pl.DataFrame)
    assert without["link_utilisation"].null_count() == 2 and without["ideal_comm_ns"].null_count() == 2


def test_line_rate_sources() -> None:
    assert links.line_rate(25e9) == (25e9, "given")
    assert links.line_rate(None, schema.empty(schema.TOPOLOGY)) == (None, None)
    import pyarrow as pa

    topo = pa.table({"rank": [0, 1], "rate_bps": [200e9, 100e9]})
    assert links.line_rate(None, topo) == (100e9, "topology")
    assert links.line_rate(5e9, topo) == (5e9, "given")


def test_unmatched_link_activity_is_all_communication(tmp_path: Path) -> None:
    kt.write(tmp_path / "rank0.json", kt.gpu_job(2), rank=0)
    b = pl.from_arrow(analyse(load([str(tmp_path)])).breakdown)
    assert isinstance(b, pl.DataFrame)
    assert (b["link_active_ns"] == b["comm_ns"]).all() and b["wait_ns"].null_count() == 2


def test_verdict_names_the_straggler_and_the_line_rate(tmp_path: Path) -> None:
    d = kt.write_gpu_job(tmp_path / "job", [0, 0, 0, 0], straggler=2, late=800_000)
    r = analyse(load([str(d)]), link_bw_bps=100e9)
    job = summary.job(r.breakdown)
    text = verdict.paragraph(job, summary.stragglers(r.instances), summary.collectives_overview(r.instances),
                             line_rate_bps=r.line_rate_bps, line_rate_source=r.line_rate_source, n_ranks=4)
    assert "Links were busy" in text and "of the 100 Gbit/s line rate" in text
    assert "Rank 2 is the straggler: last to arrive at 3 of 3 collectives" in text
    # rank 2 never waits; the others wait 0.8 of 3.5 ms of exposed communication
    assert f"{100 * job['wait_share_of_exposed']:.0f} % of it is waiting" in text
    assert job["wait_share_of_exposed"] == pytest.approx(3 * 0.8 / (3 * 3.5 + 2.7))
    assert "\n" not in text


def test_verdict_without_matching_says_why(tmp_path: Path) -> None:
    kt.write(tmp_path / "rank0.json", kt.gpu_job(2), rank=0)
    r = analyse(load([str(tmp_path)]))
    text = verdict.paragraph(summary.job(r.breakdown), summary.stragglers(r.instances),
                             summary.collectives_overview(r.instances), n_ranks=1)
    assert "with one rank" in text and "--link-bw" in text and "waiting included" in text


def test_parse_link_rates() -> None:
    from tracekit.model.units import parse_link_rates

    assert parse_link_rates("10gbit") == (10e9, {})
    assert parse_link_rates("dp=25Gbit,tp=900GB/s") == (None, {"dp": 25e9, "tp": 7200e9})
    assert parse_link_rates("1gbit, inter=100mbit") == (1e9, {"inter": 100e6})
    for bad, says in (("1gbit,2gbit", "two rates"), ("dp=", "expected a number"), ("d p=1gbit", "not a process"),
                      ("dp=1gbit,,", "empty item")):
        with pytest.raises(TraceError, match=says):
            parse_link_rates(bad)


def test_a_window_with_a_call_of_unknown_size_has_unknown_bytes() -> None:
    """An unknown size is never summed as zero; a barrier moves nothing, whatever its size."""
    from tracekit.analysis.attribution import bytes_per_window

    c = pl.DataFrame({"rank": [0, 0, 0, 0], "start_ns": [10, 20, 110, 120], "op": ["allreduce", "allreduce",
                                                                                  "allreduce", "barrier"],
                      "bytes": [100, None, 100, None]}, schema={"rank": pl.Int32, "start_ns": pl.Int64,
                                                               "op": pl.String, "bytes": pl.Int64})
    got = bytes_per_window(c, np.array([0, 0]), np.array([0, 100]), np.array([100, 200]))
    assert got.to_pylist() == [None, 100]


def test_a_selector_names_the_calls_of_the_links_it_names() -> None:
    """``link_classes.selected`` asks :func:`selects` once per distinct link and gives every call its link's answer,
    links with an unknown class or transport (null) included."""
    from tracekit.analysis import link_classes

    rows = pl.DataFrame({
        "link": ["0", "1", "0", None, "2", "1", "0", "2"],
        "link_class": ["intra", "inter", "intra", None, None, "inter", "intra", None],
        "transport": [None, "NET/IB", None, None, "P2P/IPC", "NET/IB", None, "P2P/IPC"],
    }, schema={"link": pl.String, "link_class": pl.String, "transport": pl.String})
    descs = {"2": "mesh_dp"}
    for sel in ("intra", "inter", "ib", "nvlink", "dp", "0", "default"):
        want = np.array([link_classes.selects(sel, pg, descs.get(pg), cls, tr)
                         for pg, cls, tr in rows.iter_rows()], dtype=bool)
        got = link_classes.selected(rows, sel, descs)
        assert got.dtype == bool and got.tolist() == want.tolist(), sel
    assert link_classes.selected(rows.head(0), "inter", descs).size == 0
