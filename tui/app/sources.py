"""Event sources for the app. A live soak runs inside the app's event loop as a worker."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Awaitable, Callable

from ..core.soak.engine import Outcome, SoakEngine
from ..core.config.errors import HitproofError
from ..core.log.events import Finding, RunFinished

if TYPE_CHECKING:
    from .app import HitproofApp

# start(listeners, after_run, on_engine) runs one soak (tui.runner) and returns its outcome.
Starter = Callable[..., Awaitable[Outcome]]


class LiveSource:
    """Runs the soak; when it ends, keeps the engine (and any launched server) until the user quits,
    so isolation re-runs still reach the server."""

    live = True

    def __init__(self, start: Starter):
        self._start = start
        self.engine: SoakEngine | None = None
        self.quit_requested: asyncio.Event | None = None

    async def run(self, app: HitproofApp) -> int | None:
        self.quit_requested = asyncio.Event()

        async def hold(engine: SoakEngine, outcome: Outcome) -> None:
            await self.quit_requested.wait()

        def attach(engine: SoakEngine) -> None:
            self.engine = engine

        try:
            outcome = await self._start(listeners=[app.feed], after_run=hold, on_engine=attach,
                                        progress=app.show_status)
        except HitproofError as exc:
            app.feed(RunFinished(verdict="error", exit_code=exc.exit_code, message=str(exc)))
            return exc.exit_code
        return outcome.exit_code

    async def isolate(self, request: int, kind: str | None) -> bool:
        engine = self.engine
        if engine is None or engine.requester is None or engine.requester.record(request) is None:
            return False
        finding = next((f for f in engine.findings if f.request == request and (kind is None or f.kind == kind)),
                       None)
        if finding is None:
            record = engine.requester.record(request)
            finding = Finding(kind="any", severity="info", phase=record.phase, slot=record.slot,
                              round=record.round, request=request)
        was_running = engine.gate.is_set()
        engine.gate.clear()               # alone: the soak sends nothing new while isolation runs
        try:
            await engine.isolate(finding)
        finally:
            if was_running:
                engine.gate.set()
        return True

    def set_paused(self, paused: bool) -> None:
        if self.engine is not None:
            (self.engine.gate.clear if paused else self.engine.gate.set)()
