"""What a caller hears from a run and says into it, as one object: the headless console, the app and the
matrix each build one RunHooks and hand it to tui.runner.run, whatever the run starts (an attached
URL, a launched server, an embedded engine, replicas behind a router)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Awaitable, Callable

from ..log.events import Event
from ..report.power import EvidenceTally
from ..server.launch import ServerProcess
from .control import SoakControl
from .engine import Outcome, SoakEngine
from .record import DELTA_INTERVAL

Listener = Callable[[Event], None]
AfterRun = Callable[[SoakEngine, Outcome], Awaitable[None]]


def _ignore(line: str) -> None:
    """No one is shown the start-up lines."""


@dataclass
class RunHooks:
    # every event of the run, subscribed after the recorder (the log has each event before they see it)
    listeners: list[Listener] = field(default_factory=list)
    # start-up lines of what is launched: started, waiting, ready
    progress: Callable[[str], None] = _ignore
    # each output line of a launched server as it comes (--verbose)
    echo: Callable[[str], None] | None = None
    # the soak's control once its engine exists: the app pauses it and sends isolation re-runs through it
    on_control: Callable[[SoakControl], None] | None = None
    # awaited after the soak while the servers are still up (the app holds them until the user quits)
    after_run: AfterRun | None = None
    # a launched single server once its process started (its pid, its last lines when it failed)
    on_server: Callable[[ServerProcess], None] | None = None
    # seconds between a streaming answer's text deltas (AnswerDelta): the app shows them as they come; a run
    # nobody watches records them at LIVE_TEXT_UNWATCHED (tui.headless)
    live_text_every: float = DELTA_INTERVAL
    # the tally of checked hits the engine keeps, when a listener reads the same one (the headless report,
    # RunReport(feeds_tally=False)); None: the engine keeps its own
    tally: EvidenceTally | None = None
