"""What background work tells the app. Sources only post these; the app's handlers change its state."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual.message import Message

if TYPE_CHECKING:
    from .stream import Stream


class StatusLine(Message):
    """A line of a launched server's start-up progress (shown until the run's first event)."""

    def __init__(self, line: str) -> None:
        self.line = line
        super().__init__()


class MatrixProfileStarted(Message):
    """A matrix profile starts; its events arrive on `stream`."""

    def __init__(self, index: int, stream: Stream) -> None:
        self.index = index
        self.stream = stream
        super().__init__()


class MatrixRowDone(Message):
    def __init__(self, index: int, row: dict[str, Any]) -> None:
        self.index = index
        self.row = row
        super().__init__()


class MatrixDone(Message):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        super().__init__()
