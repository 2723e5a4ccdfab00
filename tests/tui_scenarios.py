"""Screens of ``tracekit inspect`` on the bundled sample, as key presses from launch: the SVG snapshot
tests check them and ``docs/build.py screenshots`` renders them for the docs, so both always show
the same app.

The sample was recorded on a 500 Mbit/s link (``samples/ddp-gloo/run.json``), so the screens are of
``tracekit inspect samples/ddp-gloo --link-bw 500mbit``: the what-if answers need the line rate."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from textual.pilot import Pilot

from tracekit.tui.app import LAST_PHASE, InspectApp
from tracekit.tui.data import JobData, LoadCallbacks, LoadOptions, load_job

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "ddp-gloo"
SIZE = (160, 48)
LINK_BW = "500mbit"
COMMAND = f"tracekit inspect samples/ddp-gloo --link-bw {LINK_BW}"

#: name → (keys to press after loading, what the screen shows)
SCENARIOS: dict[str, tuple[tuple[str, ...], str]] = {
    "overview": ((), "Overview: the verdict with the what-if replay's answer, per-rank stacked bars of the five "
                     "classes, iteration times, the most exposed rank and the worst iteration"),
    "iterations": (("2", "s", "s"), "Iterations: every rank × iteration window, here sorted by wall time (s)"),
    "timeline": (("3",), "Timeline: each rank's attribution classes, then its threads, coloured by kind, with the "
                         "critical path drawn over them (━)"),
    "timeline-iteration": (("3", "c", "w"), "Timeline zoomed to one iteration (w) after jumping to the first "
                                            "communication (c), with the details of the event under the cursor and "
                                            "its instance on every rank"),
    "timeline-path": (("3", "p", "p", "p", "w"), "The critical path followed segment by segment (p), in one "
                                                 "iteration (w); the details say what the path spends there"),
    "timeline-search": (("3", "slash", *"all_reduce", "enter"), "Search (/): every gloo all-reduce highlighted, "
                                                                  "n/N jump between hits"),
    "critical-path": (("4",), "Critical path: per iteration what the path went through, and the slowest "
                              "iteration's path as runs (waiting on a rank in bold red); enter shows a run on the "
                              "timeline"),
    "collectives": (("5", "s", "s"), "Collectives: every instance matched across ranks, here sorted by wait (s); "
                                     "/ filters by op or group, enter shows the instance on the timeline"),
    "whatif": (("6",), "What-if: the job replayed at its own line rate, with a sweep of line rates around it "
                       "and the bottleneck verdict"),
    "whatif-compression": (("6", "c", "4", "enter", "f"), "What-if with 4x compression (c) at full utilisation of "
                                                          "the link (f): the numbers follow the inputs"),
    "top-ops": (("8",), "Top ops: why each rank's device sat idle (not applicable on this CPU-only job) and the "
                        "kernels / CPU operators with the most time in each attribution class"),
    "keys": (("question_mark",), "The key map (?)"),
}


def sample_data() -> JobData:
    """The bundled sample with its line rate, loaded without any cache (deterministic)."""
    from tracekit.model.units import parse_rate

    return load_job([str(SAMPLE)], LoadOptions(use_cache=False, link_bw_bps=parse_rate(LINK_BW)), LoadCallbacks())


def app(data: JobData) -> InspectApp:
    return InspectApp(["samples/ddp-gloo"], data=data)


async def settle(pilot: Pilot) -> None:
    """Wait until every phase is on screen."""
    app_ = pilot.app
    assert isinstance(app_, InspectApp)
    for _ in range(400):
        if LAST_PHASE in app_.phases:
            break
        await pilot.pause(0.05)
    await pilot.pause()
    await pilot.pause()


async def quiet(pilot: Pilot) -> None:
    """Wait until no view computes anything in the background (a what-if prediction, say)."""
    app_ = pilot.app
    assert isinstance(app_, InspectApp)
    for _ in range(400):
        if not any(view.busy for view in app_.views.values()):
            break
        await pilot.pause(0.05)
    await pilot.pause()


def run_scenario(keys: tuple[str, ...]) -> Callable[[Pilot], Awaitable[None]]:
    """What to run before a screenshot: wait for the loading, press ``keys``, wait for the views."""

    async def run(pilot: Pilot) -> None:
        await settle(pilot)
        await pilot.press(*keys)
        await quiet(pilot)

    return run
