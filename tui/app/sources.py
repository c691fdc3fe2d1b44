"""Event sources for the app. A live soak runs inside the app's event loop as a worker."""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Awaitable, Callable

from ..core.soak.control import SoakControl
from ..core.soak.engine import Outcome, SoakEngine
from ..core.soak.hooks import RunHooks
from ..core.config.errors import HitproofError
from ..core.log.events import RunFinished
from .messages import MatrixDone, MatrixProfileStarted, MatrixRowDone, StatusLine
from .stream import Stream

if TYPE_CHECKING:
    from .ports import AppPort

# start(hooks) runs one soak (tui.runner.run, as headless does) and returns its outcome.
Starter = Callable[[RunHooks], Awaitable[Outcome]]


class LiveSource:
    """Runs the soak; when it ends, keeps it (and any launched server) until the user quits, so
    isolation re-runs still reach the server. It holds the soak's control surface, not its engine."""

    live = True

    def __init__(self, start: Starter):
        self._start = start
        self.control: SoakControl | None = None
        self.quit_requested: asyncio.Event | None = None

    async def run(self, app: AppPort) -> int | None:
        self.quit_requested = asyncio.Event()

        async def hold(engine: SoakEngine, outcome: Outcome) -> None:
            await self.quit_requested.wait()

        def attach(control: SoakControl) -> None:
            self.control = control

        try:
            outcome = await self._start(RunHooks(listeners=[app.feed], after_run=hold, on_control=attach,
                                                 progress=lambda line: app.post_message(StatusLine(line))))
        except HitproofError as exc:
            app.feed(RunFinished(verdict="error", exit_code=exc.exit_code, message=str(exc)))
            return exc.exit_code
        return outcome.exit_code

    async def isolate(self, request: int, kind: str | None) -> bool:
        return self.control is not None and await self.control.isolate(request, kind)

    def set_paused(self, paused: bool) -> None:
        if self.control is not None:
            self.control.set_paused(paused)


# start(hooks=, on_row=) runs the matrix (tui.matrix.run_matrix: hooks(profile) -> RunHooks), returns its rows.
MatrixStarter = Callable[..., Awaitable[list]]


class MatrixSource:
    """Runs a matrix: one profile after another, each soak's events into a fresh stream of the app
    (posted with MatrixProfileStarted), each finished row posted to the app as a message. The app shows the
    running profile live below the rows; a finished row's run is its log, replayed on demand."""

    live = True
    matrix = True

    def __init__(self, start: MatrixStarter, rows: list[dict], *, out: str = ""):
        self._start = start
        self.rows = [dict(row) for row in rows]    # the pending rows (tui.matrix.pending_row), in order
        self.out = out
        self.control: SoakControl | None = None
        self.running: int | None = None
        self.started_at: float | None = None       # monotonic time the running profile was launched
        self.finished = False
        self.paused = False

    async def run(self, app: AppPort) -> int | None:
        begun = time.monotonic()
        names = [row["profile"] for row in self.rows]

        def hooks(profile) -> RunHooks:
            """Asked as each profile launches: its events go to a fresh stream on screen."""
            index = names.index(profile.name)
            self.running, self.started_at, self.control = index, time.monotonic(), None
            stream = Stream()
            app.post_message(MatrixProfileStarted(index, stream))
            return RunHooks(listeners=[stream.feed], on_control=attach,
                            progress=lambda line: app.post_message(StatusLine(f"[{profile.name}] {line}")))

        def on_row(index: int, row: dict) -> None:
            self.rows[index] = json_copy(row)
            self.running = self.control = None
            app.post_message(MatrixRowDone(index, self.rows[index]))

        def attach(control: SoakControl) -> None:
            self.control = control
            if self.paused:
                control.set_paused(True)

        await self._start(hooks=hooks, on_row=on_row)
        self.finished = True
        app.post_message(MatrixDone(time.monotonic() - begun))
        return 0

    async def isolate(self, request: int, kind: str | None) -> bool:
        return self.control is not None and await self.control.isolate(request, kind)

    def set_paused(self, paused: bool) -> None:
        self.paused = paused
        if self.control is not None:
            self.control.set_paused(paused)


def json_copy(row: dict) -> dict:
    """A row as the files have it (plain data, not shared with the matrix runner)."""
    return json.loads(json.dumps(row))
