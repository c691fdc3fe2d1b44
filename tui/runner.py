"""Wires a soak together: bus, recorder, listeners, and (when asked) a server hitproof launches.

Headless and the app both start soaks through here; nothing in this module imports Textual.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path
from typing import Awaitable, Callable

from .core.engine import Outcome, SoakEngine, Target
from .core.events import Event, EventBus, RunHeader, ServerLog
from .core.launch import LaunchError, ServerProcess, free_port
from .core.recorder import Recorder
from .core.errors import ServerProblem
from .core.scenario import Scenario

Listener = Callable[[Event], None]


def default_log_path() -> Path:
    return Path("logs") / f"hitproof-{dt.datetime.now():%Y%m%d-%H%M%S}.jsonl"


class ServerLogRelay:
    """Server output lines become events, but only after the header (the log's first line)."""

    def __init__(self, bus: EventBus):
        self.bus = bus
        self.buffer: list[str] = []
        self.open = False

    def on_event(self, event: Event) -> None:
        if isinstance(event, RunHeader) and not self.open:
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self.open = True
        for line in self.buffer:
            self.bus.emit(ServerLog(line=line))
        self.buffer.clear()

    def __call__(self, line: str) -> None:
        if self.open:
            self.bus.emit(ServerLog(line=line))
        else:
            self.buffer.append(line)


AfterRun = Callable[[SoakEngine, Outcome], Awaitable[None]]


async def run_soak(scenario: Scenario, target: Target, *, bus: EventBus, record: Path | None,
                   listeners: list[Listener], argv: list[str] | None = None, isolate: bool = False,
                   after_run: AfterRun | None = None,
                   on_engine: Callable[[SoakEngine], None] | None = None) -> Outcome:
    """Run one soak. `after_run` runs while the server and client are still up (the app waits
    there until the user quits, so isolation re-runs can still reach the server)."""
    recorder = Recorder(record) if record else None
    if recorder:
        await recorder.start()
        bus.subscribe(recorder)
    for listener in listeners:
        bus.subscribe(listener)
    engine = SoakEngine(scenario, target, bus, argv=argv, isolate=isolate)
    if on_engine is not None:
        on_engine(engine)
    try:
        outcome = await engine.run()
        if after_run is not None:
            await after_run(engine, outcome)
        return outcome
    finally:
        await engine.aclose()
        if recorder:
            await recorder.close()


async def run_launched(scenario: Scenario, *, argv_cmd: list[str], url: str, env: dict[str, str] | None,
                       engine: str | None, env_of_interest: dict[str, str], facts: dict, startup_timeout: float,
                       bus: EventBus, record: Path | None, listeners: list[Listener],
                       progress: Callable[[str], None], argv: list[str] | None = None,
                       isolate: bool = False, after_run: AfterRun | None = None,
                       on_engine: Callable[[SoakEngine], None] | None = None) -> Outcome:
    """Start a server, wait until it serves, soak it, and always stop it (no orphan)."""
    relay = ServerLogRelay(bus)
    bus.subscribe(relay.on_event)
    server = ServerProcess(argv_cmd, url=url, env=env, on_line=relay)
    try:
        await server.start()
        progress(f"started {engine or 'server'} (pid {server.pid}): {server.command_line}")
        try:
            await server.wait_ready(startup_timeout, progress)
        except LaunchError as exc:
            raise ServerProblem(str(exc)) from None
        progress(f"server ready at {url}")
        target = Target(url=url, engine=engine, launch_command=server.command_line,
                        env_of_interest=env_of_interest, facts=facts, exited=server.exited)
        return await run_soak(scenario, target, bus=bus, record=record, listeners=listeners, argv=argv,
                              isolate=isolate, after_run=after_run, on_engine=on_engine)
    finally:
        await server.stop()


async def run_embedded(scenario: Scenario, engine: str, model: str, *, bus: EventBus, record: Path | None,
                       listeners: list[Listener], progress: Callable[[str], None],
                       argv: list[str] | None = None, isolate: bool = False,
                       after_run: AfterRun | None = None,
                       on_engine: Callable[[SoakEngine], None] | None = None) -> Outcome:
    from .engines import launch_spec    # the embedded engines are only needed here

    spec = launch_spec(engine, port=free_port(), model=model)
    return await run_launched(scenario, argv_cmd=spec.argv, url=spec.url, env=spec.env, engine=spec.engine,
                              env_of_interest=spec.env_of_interest, facts=spec.facts,
                              startup_timeout=spec.startup_timeout, bus=bus, record=record,
                              listeners=listeners, progress=progress, argv=argv, isolate=isolate,
                              after_run=after_run, on_engine=on_engine)
