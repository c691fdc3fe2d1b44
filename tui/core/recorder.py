"""JSONL recorder (aiofiles, flushed per event) and a tolerant log reader."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import aiofiles

from .errors import BadInput
from .events import SCHEMA_VERSION, DecodeError, Event, RunHeader, decode, encode


class Recorder:
    """Subscribes to the bus; a writer task appends and flushes every event as it comes."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._task: asyncio.Task | None = None
        self.written = 0

    async def start(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = await aiofiles.open(self.path, "w", encoding="utf-8")
        except OSError as exc:
            raise BadInput(f"cannot write the log {self.path}: {exc.strerror or exc}") from None
        self._task = asyncio.create_task(self._write_loop(), name="recorder")

    def __call__(self, event: Event) -> None:
        self._queue.put_nowait(encode(event) + "\n")

    async def _write_loop(self) -> None:
        while True:
            line = await self._queue.get()
            if line is None:
                break
            lines = [line]
            while not self._queue.empty():            # batch what is already waiting
                more = self._queue.get_nowait()
                if more is None:
                    await self._flush(lines)
                    return
                lines.append(more)
            await self._flush(lines)

    async def _flush(self, lines: list[str]) -> None:
        await self._file.write("".join(lines))
        await self._file.flush()
        self.written += len(lines)

    async def close(self) -> None:
        if self._task is None:
            return
        self._queue.put_nowait(None)
        await asyncio.shield(self._task)
        await self._file.close()
        self._task = None


@dataclass
class LogContents:
    events: list[Event] = field(default_factory=list)
    warning: str | None = None       # e.g. a truncated last line

    @property
    def header(self) -> RunHeader | None:
        first = self.events[0] if self.events else None
        return first if isinstance(first, RunHeader) else None


def check_header(event: Event, path: str | Path) -> RunHeader:
    """The first event of a log must be a header this hitproof can read."""
    if not isinstance(event, RunHeader):
        raise BadInput(f"{path}: not a hitproof log (first line is not a header)")
    if event.schema > SCHEMA_VERSION:
        raise BadInput(f"{path}: log schema {event.schema} is newer than this hitproof understands "
                       f"({SCHEMA_VERSION}); upgrade hitproof")
    return event


def iter_log(path: str | Path, warnings: list[str] | None = None, skip_deltas: bool = False) -> Iterator[Event]:
    """Events of a log, in order. A bad line stops the read with a warning (a crash mid-write).
    `skip_deltas` leaves out answer deltas (their text is repeated in request_end) unparsed."""
    path = Path(path)
    try:
        handle = open(path, "rb")
    except OSError as exc:
        raise BadInput(f"cannot open log {path}: {exc.strerror or exc}") from None
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.endswith(b"\n") and line.strip():
                if warnings is not None:
                    warnings.append(f"{path}:{number}: the last line is cut short (a crash mid-write?); "
                                    f"read up to the last good event")
                return
            if not line.strip() or (skip_deltas and line.startswith(b'{"type":"delta"')):
                continue
            try:
                event = decode(line)
            except DecodeError as exc:
                if warnings is not None:
                    warnings.append(f"{path}:{number}: log ends with a damaged line ({exc}); "
                                    f"read up to the last good event")
                return
            if number == 1:
                check_header(event, path)
            yield event


def read_log(path: str | Path, skip_deltas: bool = False) -> LogContents:
    warnings: list[str] = []
    events = list(iter_log(path, warnings, skip_deltas=skip_deltas))
    if not events:
        raise BadInput(f"{path}: empty log")
    return LogContents(events=events, warning=warnings[0] if warnings else None)
