"""``tracekit report`` on the bundled sample: the time the command takes (a fresh process each run, parse cache
warm), the size of the file, and the time a headless Chromium (Debian's ``chromium``) takes from navigation to
every chart drawn (a fresh tab each load).

    python benchmarks/report.py [--runs 5] [--loads 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import headless  # noqa: E402
from tracekit.views import html_report  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5, help="runs of the command")
    ap.add_argument("--loads", type=int, default=7, help="loads of the page in the browser")
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="tracekit-report-")) / "report.html"
    cmd = [sys.executable, "-m", "tracekit.cli", "report", str(ROOT / "samples" / "ddp-gloo"), "--link-bw", "500mbit",
           "-o", str(out), "--force", "-q"]
    subprocess.run(cmd, check=True, capture_output=True)  # warms the parse cache
    walls = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        walls.append(time.perf_counter() - t0)
    print(f"tracekit report samples/ddp-gloo: median {statistics.median(walls):.2f} s (min {min(walls):.2f}, max "
          f"{max(walls):.2f}, {len(walls)} runs; whole process, imports included); {out.stat().st_size / 1e6:.2f} MB")
    charts = len(html_report.SECTIONS)
    loads = []
    with headless.Chromium() as browser:
        for _ in range(args.loads):
            page = browser.open("about:blank")
            t0 = time.perf_counter()
            page.navigate(out.as_uri())
            page.wait_for(f"document.body.dataset.charts === '{charts}'", timeout=60)
            loads.append(time.perf_counter() - t0)
            assert not page.errors, page.errors
    print(f"headless Chromium, navigation → {charts} charts drawn: median {1000 * statistics.median(loads):.0f} ms "
          f"(min {1000 * min(loads):.0f}, max {1000 * max(loads):.0f}, {len(loads)} loads)")


if __name__ == "__main__":
    main()
