"""A real 2-rank gloo DDP job across a tc-shaped link, recorded at two line rates: tracekit's achieved bus
bandwidth is the link's rate when the link is the bottleneck, and link utilisation moves the right way.

For a 2-rank ring all-reduce each rank sends S/2 in the reduce-scatter and S/2 in the all-gather, so bus
bytes = 2(n−1)/n·S = S per direction, and ``busbw`` = bus bytes over the union of transfer time (DDP's
two gloo threads run two buckets at once on one link; the union counts that time once). A perfect link
delivers ~95.6 % of the tbf rate as TCP payload (headers of 1500-byte frames), so a link-bound job
measures just under that and never above the set rate.

At 60 Mbit/s (8.4 MB of gradients per step, ~1.1 s of transfer against ~50 ms of compute) the link is the
bottleneck even on a loaded 2-core machine: tracekit measured 84-92 % of the set rate across runs here and
in CI. The shortfall below 95.6 % is real, not tracekit's: a transfer stays in flight while gloo's thread
waits for a core, so on a busy machine the link idles inside the union of transfer time. The lower bound
(70 %) is well clear of that and still catches a wrong bus-byte factor or a union that double-counts
overlapping buckets (each is off by 2x). At 480 Mbit/s the
same job is CPU-bound here (gloo's threads reduce and copy on cores shared with the model and with other
jobs: busbw falls to ~50 % of the rate although transfers are in flight 80 % of the time), so only the
utilisation claim is checked there: the faster link sits idle for a larger share of each iteration.
"""

from __future__ import annotations

import importlib.util
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from tracekit.analysis.pipeline import analyse
from tracekit.loading.traceset import load

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
RATES = (60_000_000, 480_000_000)


def _netns_usable() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        return False
    return subprocess.run(["ip", "netns", "list"], capture_output=True).returncode == 0


pytestmark = [
    pytest.mark.netns,
    pytest.mark.slow,
    pytest.mark.skipif(not _netns_usable(), reason="needs root and iproute2 (ip netns, tc)"),
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed"),
]


def _record(out: Path, rate_bps: int) -> Path:
    sys.path.insert(0, str(SAMPLES))
    try:
        import record_ddp
    finally:
        sys.path.remove(str(SAMPLES))
    cfg = record_ddp.RecordConfig(out=str(out), layers=8, batch=256, steps=2, wait=0, warmup=1,
                                  link_rate_bps=rate_bps, check_link=False, timeout_s=120)
    record_ddp.record(cfg, log=io.StringIO())
    return out


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, float]]:
    root = tmp_path_factory.mktemp("links")
    out: dict[int, dict[str, float]] = {}
    for rate in RATES:
        result = analyse(load([str(_record(root / str(rate), rate))]), link_bw_bps=rate)
        b = pl.from_arrow(result.breakdown)
        assert isinstance(b, pl.DataFrame)
        assert b["wait_ns"].null_count() == 0, "collectives were not matched across the two ranks"
        tot = b.select(pl.col("bus_bytes").sum(), pl.col("link_active_ns").sum(), pl.col("wall_ns").sum(),
                       pl.col("ideal_comm_ns").sum()).row(0, named=True)
        out[rate] = {"busbw_bps": tot["bus_bytes"] * 8e9 / tot["link_active_ns"],
                     "busy": tot["link_active_ns"] / tot["wall_ns"],
                     "utilisation": tot["ideal_comm_ns"] / tot["wall_ns"]}
    return out


def test_achieved_bandwidth_is_the_set_rate(measured: dict[int, dict[str, float]]) -> None:
    rate = RATES[0]
    m = measured[rate]
    assert m["busy"] > 0.85, f"the link was not the bottleneck at {rate} bit/s: {m}"
    assert 0.70 <= m["busbw_bps"] / rate <= 1.0, f"{rate} bit/s: {m}"
    # never faster than the wire
    assert all(m["busbw_bps"] < r for r, m in measured.items())


def test_utilisation_falls_as_the_link_gets_faster(measured: dict[int, dict[str, float]]) -> None:
    slow, fast = measured[RATES[0]], measured[RATES[1]]
    assert slow["utilisation"] > fast["utilisation"]
    assert slow["busy"] > fast["busy"]
