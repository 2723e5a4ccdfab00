"""Render every screen of ``tracekit inspect`` on the bundled sample into ``docs/screenshots/<name>.svg``,
from the app itself (the same key presses as the SVG snapshot tests, ``tests/tui_scenarios.py``).

    python docs/screenshots/render.py
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from tests import tui_scenarios as sc  # noqa: E402


async def render(name: str, keys: tuple[str, ...], data: sc.JobData) -> str:
    app = sc.app(data)
    async with app.run_test(size=sc.SIZE) as pilot:
        await sc.run_scenario(keys)(pilot)
        await pilot.pause()
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()
        return app.export_screenshot(title=f"{sc.COMMAND} — {name}")


def main() -> None:
    data = sc.sample_data()
    for name, (keys, what) in sc.SCENARIOS.items():
        svg = asyncio.run(render(name, keys, data))
        (HERE / f"{name}.svg").write_text(svg)
        print(f"{name}.svg: {what}")


if __name__ == "__main__":
    main()
