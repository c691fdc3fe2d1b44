"""Drive the app the way the CLI builds it: build_app(LiveSource(start)) over a real event stream."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tui.app.app import build_app
from tui.app.sources import LiveSource
from tui.core.soak.engine import Target
from tui.core.config.scenario import load_scenario, parse_scenario
from tui.runner import run

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "screenshots"


def live_app(url: str, scenario: str | Path, *, record: Path | None = None, text: str | None = None,
             replicas: list[str] | None = None):
    scen = parse_scenario(text, "test.toml") if text is not None else load_scenario(scenario)

    def start(hooks):
        return run(scen, Target(url=url, replicas=list(replicas or [])), hooks, record=record)

    return build_app(LiveSource(start), screenshot_dir=SCREENSHOTS)


async def wait_for(pilot, condition, timeout: float = 60.0, step: float = 0.1) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not condition():
        if loop.time() > end:
            raise AssertionError("condition not met in time")
        await pilot.pause(step)
    await pilot.pause(0.2)


def text_of(widget) -> str:
    content = widget.content
    return content.plain if hasattr(content, "plain") else str(content)


def styles_at(widget, offset: int) -> set[str]:
    """Styles of the character at `offset` in a Static holding Rich Text."""
    content = widget.content
    return {str(span.style) for span in content.spans if span.start <= offset < span.end}
