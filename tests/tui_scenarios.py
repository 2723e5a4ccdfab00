"""Screens of ``tracekit inspect`` on the bundled sample, as key presses from launch: the SVG snapshot
tests check them and ``docs/screenshots/render.py`` renders them for the README, so both always show
the same app."""

from __future__ import annotations

from pathlib import Path

from textual.pilot import Pilot

from tracekit.tui.app import InspectApp
from tracekit.tui.data import JobData, LoadCallbacks, LoadOptions, load_job

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "ddp-gloo"
SIZE = (160, 48)

#: name → (keys to press after loading, what the screen shows)
SCENARIOS: dict[str, tuple[tuple[str, ...], str]] = {
    "overview": ((), "Overview: the verdict, per-rank stacked bars of the five classes, iteration times, the most "
                     "exposed rank and the worst iteration"),
    "iterations": (("2", "s", "s"), "Iterations: every rank × iteration window, here sorted by wall time (s)"),
    "timeline": (("3",), "Timeline: each rank's attribution classes, then its threads, coloured by kind"),
    "timeline-iteration": (("3", "c", "w"), "Timeline zoomed to one iteration (w) after jumping to the first "
                                            "communication (c), with the details of the event under the cursor"),
    "timeline-search": (("3", "slash", *"all_reduce", "enter"), "Search (/): every gloo all-reduce highlighted, "
                                                                  "n/N jump between hits"),
    "keys": (("question_mark",), "The key map (?)"),
}


def sample_data() -> JobData:
    """The bundled sample, loaded without any cache (deterministic)."""
    return load_job([str(SAMPLE)], LoadOptions(use_cache=False), LoadCallbacks())


def app(data: JobData) -> InspectApp:
    return InspectApp(["samples/ddp-gloo"], data=data)


async def settle(pilot: Pilot) -> None:
    """Wait until every phase is on screen."""
    app_ = pilot.app
    assert isinstance(app_, InspectApp)
    for _ in range(400):
        if "timeline" in app_.phases:
            break
        await pilot.pause(0.05)
    await pilot.pause()
    await pilot.pause()
