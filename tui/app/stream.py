"""A run's events on their way to the screen: queued by a source, folded by the next frame."""

from __future__ import annotations

import time

from ..core.log import events as ev
from .model import RunModel


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
