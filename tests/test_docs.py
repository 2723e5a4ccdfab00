"""The documentation shows what tracekit does now: every printed example in README.md and docs/ is its command's
output (``docs/build.py``'s ``EXAMPLES``), every screenshot of ``tracekit inspect`` shows what the app's snapshot test
shows, and ``docs/report.png`` was drawn from the report the sample gives now. After an intended change, run
``python docs/build.py`` (all of them, or ``examples``, ``screenshots``, ``report``) and look at what changed."""

from __future__ import annotations

import difflib
import html
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from tests import tui_scenarios as sc

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOTS = ROOT / "tests" / "__snapshots__" / "test_tui_snapshots"

_spec = importlib.util.spec_from_file_location("docs_build", ROOT / "docs" / "build.py")
assert _spec is not None and _spec.loader is not None
build = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = build  # its dataclasses look their module up
_spec.loader.exec_module(build)


@pytest.fixture(scope="module")
def printed() -> dict[str, str]:
    """Every example's block as its command prints it now."""
    return build.expected()


def _places(name: str) -> list[tuple[Path, str]]:
    return [(page, block) for page in build.pages() for n, block in build.blocks(page.read_text(encoding="utf-8"))
            if n == name]


@pytest.mark.parametrize("name", sorted(build.EXAMPLES))
def test_a_printed_example_is_its_commands_output(name: str, printed: dict[str, str]) -> None:
    places = _places(name)
    assert places, f"the example {name!r} is printed nowhere: mark a block with it, or drop it from EXAMPLES"
    for page, block in places:
        assert block == printed[name], (
            f"{page.relative_to(ROOT)}: the example {name!r} is not what its command prints now "
            "(python docs/build.py examples):\n" + "".join(difflib.unified_diff(
                block.splitlines(True), printed[name].splitlines(True), "as written", "printed now")))


def test_every_marked_block_is_a_known_example() -> None:
    unknown = [(str(page.relative_to(ROOT)), name) for page in build.pages()
               for name, _ in build.blocks(page.read_text(encoding="utf-8")) if name not in build.EXAMPLES]
    assert not unknown, f"marked blocks of no example in docs/build.py EXAMPLES: {unknown}"


def test_the_check_finds_a_changed_example(printed: dict[str, str]) -> None:
    """What --check and the test above compare: a block that lost a line differs; the block written back matches."""
    name = "whatif"
    page, block = _places(name)[0]
    text = page.read_text(encoding="utf-8")
    m = next(m for m in build.MARKER.finditer(text) if m.group(2) == name)
    broken = text[:m.start(3)] + block.replace("10 Gbit/s", "11 Gbit/s", 1) + text[m.end(3):]
    assert next(b for n, b in build.blocks(broken) if n == name) != printed[name]
    assert build.render(build.EXAMPLES[name], printed[name].split("\n", 1)[1].rstrip("\n")) == printed[name]


def _screen_text(svg: str) -> str:
    """The characters a screenshot shows (title bar and blanks aside: exports differ in how they draw spaces)."""
    svg = re.sub(r'<text class="[^"]*-title"[^>]*>[^<]*</text>', "", svg)
    return re.sub(r"\s", "", "".join(html.unescape(t) for t in re.findall(r"<text [^>]*>([^<]*)</text>", svg)))


@pytest.mark.parametrize("name", list(sc.SCENARIOS))
def test_a_screenshot_shows_what_the_app_shows(name: str) -> None:
    """``docs/screenshots/NAME.svg`` shows the screen the snapshot test (``tests/test_tui_snapshots.py``) checks
    the app against."""
    docs = build.SCREENSHOTS / f"{name}.svg"
    assert docs.exists(), f"no {docs.relative_to(ROOT)}: python docs/build.py screenshots"
    snap = SNAPSHOTS / f"test_screen[{name}].svg"
    assert _screen_text(docs.read_text(encoding="utf-8")) == _screen_text(snap.read_text(encoding="utf-8")), \
        f"{docs.relative_to(ROOT)} is not the app's screen now: python docs/build.py screenshots"


def test_every_screenshot_is_a_screen() -> None:
    extra = {p.stem for p in build.SCREENSHOTS.glob("*.svg")} - set(sc.SCENARIOS)
    assert not extra, f"screenshots of no scenario in tests/tui_scenarios.py: {sorted(extra)}"


def test_the_report_picture_is_of_the_report_now() -> None:
    """``docs/report.png`` carries what it was drawn from (its command and the report's verdicts, the text at its
    top): the same as the sample's report gives now."""
    facts = build.png_text(build.REPORT_PNG.read_bytes()).get(build.PNG_KEY)
    assert facts, "docs/report.png was not made by docs/build.py report"
    assert json.loads(facts) == build.report_facts(), \
        "docs/report.png shows another report than the sample gives now: python docs/build.py report"


def test_png_text_round_trip() -> None:
    png = build.REPORT_PNG.read_bytes()
    again = build.with_text(png, "tracekit-test", "≥ 4x — ✓")
    assert build.png_text(again)["tracekit-test"] == "≥ 4x — ✓"
    assert len(again) > len(png) and again[:8] == png[:8]


def test_the_readme_links_lead_somewhere() -> None:
    """The README is not part of the site (mkdocs checks the site's links): its relative links name files that exist,
    and headings that exist in them."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = ROOT / path if path else ROOT / "README.md"
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md":
            slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                     for h in re.findall(r"^#+ (.+)$", file.read_text(encoding="utf-8"), re.M)}
            if anchor not in slugs:
                broken.append(target)
    assert not broken, f"README.md links to what is not there: {broken}"


#: a Sphinx cross-reference role (``:class:`Verdict```), which mkdocstrings prints as it is; the pages' docstrings
#: link with autorefs instead (``[Verdict][tracekit.api.Verdict]``) or name the object in code
RAW_ROLE = re.compile(r":(?:py:)?(?:class|mod|func|meth|attr|data|exc|obj|ref|const):`[^`]+`")


def _rendered_docstrings() -> dict[str, str]:
    """The docstrings the site's API pages render: every ``::: name`` of docs/*.md, and its public members (those
    the page's ``filters: ["!^_"]`` keep), by their dotted names."""
    import importlib
    import inspect

    out: dict[str, str] = {}
    for page in sorted((ROOT / "docs").glob("*.md")):
        for name in re.findall(r"^::: *([\w.]+)", page.read_text(encoding="utf-8"), re.M):
            module, _, attr = name.rpartition(".")
            obj = getattr(importlib.import_module(module), attr)
            out[name] = inspect.getdoc(obj) or ""
            if inspect.isclass(obj):
                for member, value in vars(obj).items():
                    inner = getattr(value, "fget", None) or getattr(value, "func", None) or value
                    doc = getattr(inner, "__doc__", None)
                    if not member.startswith("_") and isinstance(doc, str) and not isinstance(value, str | int):
                        out[f"{name}.{member}"] = doc
    return out


def test_api_pages_render_no_raw_sphinx_role() -> None:
    """mkdocstrings does not resolve Sphinx roles: a docstring the API pages render must not carry one."""
    docs = _rendered_docstrings()
    assert {"tracekit.api.Job", "tracekit.api.Job.verdict", "tracekit.analysis.compare.Diff.regression"} <= set(docs)
    raw = {name: RAW_ROLE.findall(doc) for name, doc in docs.items() if RAW_ROLE.search(doc)}
    assert not raw, f"raw Sphinx roles in docstrings the site renders (write [Name][dotted.path]): {raw}"


def test_the_role_check_finds_a_role() -> None:
    assert RAW_ROLE.findall("see :class:`Verdict` and :mod:`tracekit.analysis.compact`, not [Job][tracekit.api.Job]") \
        == [":class:`Verdict`", ":mod:`tracekit.analysis.compact`"]


def test_the_run_directories_the_pages_record_into_are_ignored_by_git() -> None:
    """``tracekit record --out runs/demo`` (README) must not leave traces for ``git add .`` to pick up."""
    import shutil
    import subprocess

    outs = sorted({m for page in build.pages() for m in re.findall(r"--out (runs/[\w.-]+)", page.read_text("utf-8"))})
    assert "runs/demo" in outs
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    files = [f"{d}/rank0.pt.trace.json.gz" for d in outs]
    r = subprocess.run(["git", "check-ignore", "--no-index", *files], cwd=ROOT, capture_output=True, text=True)
    assert sorted(r.stdout.split()) == sorted(files), f"not ignored: {set(files) - set(r.stdout.split())}"


def test_the_pages_say_one_figure_for_the_parser_without_its_extension() -> None:
    """README.md, setup.py and DEVELOPERS.md each say how much slower the Kineto parser is without its C extension:
    the same measured figure (they said 2.3x and 2.5x)."""
    said = {}
    for name, pattern in (("README.md", r"same tables,\s+about\s+([\d.]+)×\s+slower"),
                          ("setup.py", r"about\s+([\d.]+)x\s+slower"),
                          ("DEVELOPERS.md", r"same tables,\s+about\s+([\d.]+)×\s+the\s+parse\s+CPU")):
        m = re.search(pattern, (ROOT / name).read_text(encoding="utf-8"))
        assert m, f"{name} no longer says it as {pattern!r}"
        said[name] = float(m.group(1))
    assert len(set(said.values())) == 1, said


#: pages about how tracekit was measured and built, where its history belongs; every other page is about use
HISTORY_PAGES = {"speed.md", "accuracy.md", "development.md"}
#: a commit hash (hex with letters and digits, not an ``0x`` id) or words that narrate how a figure came about
NARRATION = re.compile(r"(?<![0-9a-zA-Z_])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![0-9a-zA-Z_])|"
                       r"\b(?:this tree|alternating with|stop \d+|issue \d+|earlier versions|re-measured|this stop|"
                       r"last stop|the commit|in this run)\b", re.I)


def test_user_pages_are_about_use() -> None:
    """Benchmark history ("alternating with 702cbef's tree") lives in docs/speed.md; the README and the user pages of
    the site carry no commit hash and no narration of how a figure was measured."""
    nav = re.findall(r":\s*(\S+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(encoding="utf-8"), re.M)
    assert set(nav) >= HISTORY_PAGES and "inspect.md" in nav
    pages = [ROOT / "README.md", *(ROOT / "docs" / p for p in nav if p not in HISTORY_PAGES)]
    found = [f"{page.relative_to(ROOT)}:{i}: {m.group()!r}" for page in pages
             for i, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
             for m in NARRATION.finditer(line)]
    assert not found, "history on a user page (move it to docs/speed.md): " + "; ".join(found)
    assert NARRATION.search("13 more pairs of cold launches, alternating with 702cbef's tree")
    assert not NARRATION.search("ncclCommInitRank comm 0x55b07c1e9f30 rank 0")
