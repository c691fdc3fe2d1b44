"""A run's events on their way to the screen: queued by a source, folded by the next frame."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..core.log import events as ev
from .model import RunModel

if TYPE_CHECKING:
    from .app import HitproofApp


class Stream:
    """One run's events on their way to its model: a source queues them, the next frame folds them."""

    def __init__(self, model: RunModel | None = None) -> None:
        self.model = model or RunModel()
        self.pending: list[ev.Event] = []
        self.folded_at = time.monotonic()      # when the last event was folded (the live clock's anchor)

    def feed(self, event: ev.Event) -> None:
        self.pending.append(event)

    def fold(self) -> bool:
        if not self.pending:
            return False
        pending, self.pending = self.pending, []
        for event in pending:
            self.model.apply(event)
        self.folded_at = time.monotonic()
        return True


class StreamPort:
    """What a replay inside the matrix sees of the app: its own stream (feed, replace_model) and
    notifications. Detached when the view moves on, so a late event goes nowhere."""

    def __init__(self, app: "HitproofApp", stream: Stream) -> None:
        self.app = app
        self.stream = stream
        self.attached = True

    def feed(self, event: ev.Event) -> None:
        if self.attached:
            self.stream.feed(event)

    def replace_model(self, model: RunModel) -> None:
        if self.attached:
            self.stream.model = model
            self.stream.pending.clear()
            self.app.draw_frame()

    def notify(self, *args: Any, **kwargs: Any) -> None:
        if self.attached:
            self.app.notify(*args, **kwargs)
