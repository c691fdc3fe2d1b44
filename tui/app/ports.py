"""What the app and its event sources see of each other, as protocols: sources (sources.py, replay.py)
know the app only as an AppPort, the app knows a source only as a Source, so neither imports the other.

    source.run(app)         # the source feeds events to app.feed (and, live, posts messages.py messages)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from textual.message import Message

    from ..core.log import events as ev
    from .model import RunModel


class EventSink(Protocol):
    """Where a source's events go: the app itself, or (a finished matrix row replayed) a port to one of its streams."""

    def feed(self, event: ev.Event) -> None: ...                     # queue one event; the next frame folds it

    def replace_model(self, model: RunModel) -> None: ...            # a model folded elsewhere (a replay jump)

    def notify(self, *args: Any, **kwargs: Any) -> None: ...        # a toast


class AppPort(EventSink, Protocol):
    """What a live source sees of the app: an EventSink that also takes messages (messages.py)."""

    def post_message(self, message: Message) -> bool: ...


class Source(Protocol):
    """Where events come from: a live soak or a log. It calls app.feed(event) for each one."""

    live: bool

    async def run(self, app: AppPort) -> int | None: ...                  # the exit code when known

    async def isolate(self, request: int, kind: str | None) -> bool: ...  # False: not possible here

    def set_paused(self, paused: bool) -> None: ...
