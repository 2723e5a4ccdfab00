"""Every picture and printed example of the documentation, made by tracekit itself (run from anywhere):

    python docs/build.py                # all of them
    python docs/build.py examples       # the printed examples in README.md and docs/*.md
    python docs/build.py screenshots    # docs/screenshots/*.svg: every screen of tracekit inspect on the sample
    python docs/build.py report         # docs/report.png: tracekit report of the sample, drawn by headless Chromium
    python docs/build.py --check        # the printed examples in the files against what the commands print now

A printed example is the fenced block right after a marker ``<!-- example: NAME -->`` in README.md or a page of
docs/ (a name may be used in several places); :data:`EXAMPLES` says which command prints it and which part of its
output is shown. ``tests/test_docs.py`` fails when a block no longer matches its command's output, when a screenshot
no longer shows what the app's snapshot test shows, or when the report picture was made from another verdict than
the report has now: after an intended change, run this script and look at what changed before committing it.

The report picture needs ``pip install 'tracekit[report]'`` and Chromium (Debian: ``apt-get install chromium``).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SCREENSHOTS = DOCS / "screenshots"
REPORT_PNG = DOCS / "report.png"
#: the command the report picture shows (run from the repository root), and Chromium's window for it
REPORT_ARGS = ("report", "samples/ddp-gloo", "--link-bw", "500mbit")
REPORT_WINDOW = (1200, 3080)
#: the key of the PNG text chunk that says what the report picture was made from
PNG_KEY = "tracekit-report"


@dataclass(frozen=True)
class Example:
    """A command whose output a page prints."""

    #: tracekit's arguments, run from the repository root
    argv: tuple[str, ...]
    #: show only the output's paragraphs (blank-line separated) that start with one of these, ``…`` where some are
    #: left out; all of it when empty
    parts: tuple[str, ...] = ()
    #: and this many paragraphs after each of them
    after: int = 0
    #: shown after the command line
    comment: str = ""
    #: ``benchmarks/jobgen.py`` arguments of a generated job (of known truth) the command reads: written to
    #: :data:`GENERATED` ``/<the first of them>`` first, and ``{job}`` in ``argv`` names it
    generate: tuple[str, ...] = ()
    #: the exit status the command must end with (``diff --fail-on-regression`` exits 3 on a regression)
    rc: int = 0

    @property
    def job(self) -> str:
        return f"{GENERATED}/{self.generate[0]}" if self.generate else ""


#: where the generated jobs of the examples are written (a fixed path: the pages print it)
GENERATED = "/tmp/tracekit-docs"
EXAMPLES: dict[str, Example] = {
    "summary": Example(("summary", "samples/ddp-gloo", "--link-bw", "500mbit")),
    "critical-path": Example(("critical-path", "samples/ddp-gloo", "--iteration", "3")),
    "whatif": Example(("whatif", "samples/ddp-gloo", "--link-bw", "500mbit", "--bandwidth", "500mbit,1gbit,10gbit",
                       "--compression", "1,4")),
    "diff-comm": Example(("diff", "tests/data/jobs/ddp-bucket1mb", "tests/data/jobs/ddp-bucket4mb"),
                         parts=("communication per op",), after=1),
    "diff-gate": Example(("diff", "tests/data/jobs/ddp-bucket1mb", "tests/data/jobs/ddp-bucket4mb", "--no-verdict",
                          "--fail-on-regression", "5%"), parts=("regression gate",), rc=3),
    "noshapes": Example(("summary", "tests/data/jobs/ddp-noshapes-1gbit"),
                        parts=("Links were busy", "verdict:"),
                        comment="# torch.profiler's defaults: no record_shapes"),
    "noshapes-link-bw": Example(("summary", "tests/data/jobs/ddp-noshapes-1gbit", "--link-bw", "1gbit"),
                                parts=("verdict:",)),
    "pipeline": Example(("summary", "tests/data/jobs/pipeline-1gbit"), parts=("verdict:",)),
    # the verdict's classes, on generated GPU jobs whose truth is known (docs/verdict.md)
    "verdict-straggler": Example(("summary", "{job}", "--link-bw", "100gbit"), parts=("verdict:",),
                                 generate=("straggler", "--ranks", "16", "--inter-gbit", "100",
                                           "--straggler", "5=1.5")),
    "verdict-stall": Example(("summary", "{job}", "--link-bw", "100gbit"), parts=("verdict:",),
                             generate=("stall", "--ranks", "16", "--inter-gbit", "100", "--stall", "1=60")),
    "verdict-link": Example(("summary", "{job}", "--link-bw", "10gbit"), parts=("verdict:",),
                            generate=("link", "--ranks", "16", "--inter-gbit", "10")),
    # Flight Recorder dumps of recorded gloo jobs (docs/hangs.md)
    "hang-traces": Example(("summary", "tests/data/flight_recorder/hang-skip"), parts=("verdict:", "hang ·")),
    "hang-subgroup": Example(("summary", "tests/data/flight_recorder/subgroup-stuck/pickle")),
    "hang-desync": Example(("summary", "tests/data/flight_recorder/desync-size/pickle")),
}

MARKER = re.compile(r"(<!-- example: ([\w-]+) -->\n```text\n)(.*?)(```)", re.S)


# --- printed examples -------------------------------------------------------------------------------------------


def pages() -> list[Path]:
    """The files printed examples may be in: README.md and every page of docs/."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def blocks(text: str) -> Iterator[tuple[str, str]]:
    """``(example name, block as written)`` of every marked block of a page."""
    for m in MARKER.finditer(text):
        yield m.group(2), m.group(3)


def run(argv: tuple[str, ...], want_rc: int = 0) -> str:
    """What ``tracekit ARGV`` prints into a pipe, run in this process from the repository root (lines stripped of
    trailing blanks); an exit status other than ``want_rc`` is an error."""
    from tracekit import cli

    out, err = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    try:
        os.chdir(ROOT)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main(list(argv))
    finally:
        os.chdir(cwd)
    if rc != want_rc:
        raise RuntimeError(f"tracekit {' '.join(argv)} exited {rc}: {err.getvalue().strip()}")
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines()).strip("\n")


def argv(example: Example) -> tuple[str, ...]:
    """The example's tracekit arguments, its generated job's path put in."""
    return tuple(a.replace("{job}", example.job) for a in example.argv)


def generate(example: Example) -> None:
    """Write the example's generated job (benchmarks/jobgen.py), unless it has none."""
    if not example.generate:
        return
    sys.path.insert(0, str(ROOT))
    import fcntl

    from benchmarks import jobgen

    # once per set of arguments, under a lock: test workers running side by side read the same fixed path
    os.makedirs(GENERATED, exist_ok=True)
    done = Path(f"{example.job}.args")
    args = " ".join(example.generate)
    with open(f"{example.job}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists() and done.read_text() == args and os.path.isdir(example.job):
            return
        done.unlink(missing_ok=True)
        with contextlib.redirect_stdout(io.StringIO()):
            jobgen.main([example.job, *example.generate[1:], "--workers", "1"])
        done.write_text(args)


def render(example: Example, output: str) -> str:
    """The block a page shows for ``example`` whose command printed ``output``."""
    head = "$ tracekit " + " ".join(argv(example)) + (f"      {example.comment}" if example.comment else "")
    if example.generate:
        head = f"$ python benchmarks/jobgen.py {example.job} {' '.join(example.generate[1:])}\n{head}"
    if not example.parts:
        return f"{head}\n{output}\n"
    paras = re.split(r"\n\s*\n", output)
    keep: list[int] = []
    for i, p in enumerate(paras):
        if p.lstrip().startswith(example.parts):
            keep += [k for k in range(i, min(i + example.after + 1, len(paras))) if k not in keep]
    if not keep:
        raise RuntimeError(f"tracekit {' '.join(example.argv)}: no paragraph starts with {example.parts}")
    lines, last = [head], -1
    for k in keep:
        if k != last + 1:
            lines.append("…")
        elif lines[-1] != head:
            lines.append("")
        lines.append(paras[k])
        last = k
    if last != len(paras) - 1:
        lines.append("…")
    return "\n".join(lines) + "\n"


def expected(names: set[str] | None = None) -> dict[str, str]:
    """Every example's block as the commands print it now (those of ``names`` only, when given)."""
    with _cache_dir():
        out = {}
        for name, ex in EXAMPLES.items():
            if names is None or name in names:
                generate(ex)
                out[name] = render(ex, run(argv(ex), ex.rc))
        return out


def drift(want: dict[str, str]) -> list[str]:
    """Unified diffs of every marked block that differs from ``want`` (an unknown name is reported too)."""
    out = []
    for page in pages():
        for name, block in blocks(page.read_text(encoding="utf-8")):
            where = page.relative_to(ROOT)
            if name not in EXAMPLES:
                out.append(f"{where}: unknown example {name!r} (docs/build.py EXAMPLES)")
            elif name in want and block != want[name]:
                out.append("".join(difflib.unified_diff(block.splitlines(True), want[name].splitlines(True),
                                                        f"{where} ({name}, as written)", f"{name} (printed now)")))
    return out


def write_examples(want: dict[str, str]) -> list[Path]:
    """Rewrite the marked blocks of every page with ``want``; the pages changed."""
    changed = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        new = MARKER.sub(lambda m: m.group(1) + want.get(m.group(2), m.group(3)) + m.group(4), text)
        if new != text:
            page.write_text(new, encoding="utf-8")
            changed.append(page)
    return changed


@contextlib.contextmanager
def _cache_dir() -> Iterator[None]:
    """A parse cache of its own for the runs (the user's stays as it is)."""
    old = os.environ.get("TRACEKIT_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="tracekit-docs-") as tmp:
        os.environ["TRACEKIT_CACHE_DIR"] = tmp
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("TRACEKIT_CACHE_DIR", None)
            else:
                os.environ["TRACEKIT_CACHE_DIR"] = old


# --- the screens of tracekit inspect ----------------------------------------------------------------------------


def screenshots() -> list[Path]:
    """Every screen of ``tracekit inspect`` on the sample into ``docs/screenshots/<name>.svg``, from the app itself
    (the key presses of the SVG snapshot tests, ``tests/tui_scenarios.py``)."""
    import asyncio

    sys.path.insert(0, str(ROOT))
    from tests import tui_scenarios as sc

    async def shot(name: str, keys: tuple[str, ...], data: sc.JobData) -> str:
        app = sc.app(data)
        async with app.run_test(size=sc.SIZE) as pilot:
            await sc.run_scenario(keys)(pilot)
            await pilot.pause()
            await pilot.wait_for_scheduled_animations()
            await pilot.pause()
            return app.export_screenshot(title=f"{sc.COMMAND} — {name}")

    data = sc.sample_data()
    written = []
    for name, (keys, _) in sc.SCENARIOS.items():
        path = SCREENSHOTS / f"{name}.svg"
        path.write_text(asyncio.run(shot(name, keys, data)), encoding="utf-8")
        written.append(path)
    return written


# --- the report picture -----------------------------------------------------------------------------------------


def report_facts() -> dict[str, object]:
    """What the report picture shows in words: its command and the report's verdicts (the text at its top)."""
    import tracekit
    from tracekit.views.figures import verdicts

    with _cache_dir():
        job = tracekit.load(str(ROOT / REPORT_ARGS[1]), link_bw=REPORT_ARGS[3])
    return {"command": "tracekit " + " ".join(REPORT_ARGS), "verdicts": verdicts(job.analysis)}


def report_picture() -> Path:
    """``tracekit report`` of the sample as a page, drawn by headless Chromium into ``docs/report.png``; the PNG
    carries :func:`report_facts` (a text chunk), which ``tests/test_docs.py`` compares with the report now."""
    sys.path.insert(0, str(ROOT))
    from tests import headless

    chromium = headless.executable()
    if chromium is None:
        raise SystemExit("docs/build.py report: Chromium is not installed (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="tracekit-docs-") as tmp:
        html = Path(tmp) / "report.html"
        png = Path(tmp) / "report.png"
        with _cache_dir():
            run((*REPORT_ARGS, "-o", str(html)))
        w, h = REPORT_WINDOW
        subprocess.run([chromium, *headless.FLAGS, f"--screenshot={png}", f"--window-size={w},{h}",
                        "--virtual-time-budget=10000", html.as_uri()], check=True, capture_output=True, timeout=120)
        REPORT_PNG.write_bytes(with_text(png.read_bytes(), PNG_KEY, json.dumps(report_facts(), ensure_ascii=False)))
    return REPORT_PNG


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def with_text(png: bytes, key: str, text: str) -> bytes:
    """``png`` with an international text chunk (UTF-8) ``key`` = ``text`` right after its header."""
    end = 8 + 8 + struct.unpack(">I", png[8:12])[0] + 4  # signature, then the IHDR chunk
    itxt = key.encode("latin-1") + b"\0\0\0" + b"\0" + b"\0" + text.encode("utf-8")
    return png[:end] + _chunk(b"iTXt", itxt) + png[end:]


def png_text(png: bytes) -> dict[str, str]:
    """The uncompressed international text chunks of a PNG, by key."""
    out, at = {}, 8
    while at + 8 <= len(png):
        n = struct.unpack(">I", png[at:at + 4])[0]
        kind, data = png[at + 4:at + 8], png[at + 8:at + 8 + n]
        if kind == b"iTXt":
            key, rest = data.split(b"\0", 1)
            if rest[:1] == b"\0":  # not compressed
                _, _, text = rest[2:].split(b"\0", 2)
                out[key.decode("latin-1")] = text.decode("utf-8")
        at += 12 + n
    return out


# --- the command ------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    kinds = {"examples", "screenshots", "report"}
    p.add_argument("what", nargs="*", metavar="examples|screenshots|report", help="what to make (default: all)")
    p.add_argument("--check", action="store_true", help="compare the printed examples only; exit 1 where they differ")
    a = p.parse_args(argv)
    if set(a.what) - kinds:
        p.error(f"unknown: {', '.join(sorted(set(a.what) - kinds))}")
    what = set(a.what) or kinds
    if a.check:
        diffs = drift(expected())
        print("\n".join(diffs) if diffs else "every printed example matches its command's output")
        return 1 if diffs else 0
    if "examples" in what:
        changed = write_examples(expected())
        print("examples:", ", ".join(str(p.relative_to(ROOT)) for p in changed) or "unchanged")
    if "screenshots" in what:
        print("screenshots:", len(screenshots()), "screens into", SCREENSHOTS.relative_to(ROOT))
    if "report" in what:
        print("report:", report_picture().relative_to(ROOT))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
