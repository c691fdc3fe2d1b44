"""JSONL recorder (aiofiles, flushed per event) and a tolerant log reader."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import aiofiles
import orjson

from .errors import BadInput
from .events import EVENT_TYPES, SCHEMA_VERSION, DecodeError, Event, RunHeader, decode, encode

_DELTA_PREFIX = b'{"type":"delta"'
_READ_BLOCK = 4 << 20                 # bytes read at a time by iter_log
_EXACT_FIELDS = {cls.type: (cls, frozenset(f.name for f in dataclasses.fields(cls))) for cls in EVENT_TYPES.values()}
_new = object.__new__


def decode_line(line: bytes | str) -> Event:
    """decode(line), faster on what the recorder writes: when a line holds exactly its type's fields
    the parsed dict becomes the event's attributes as is (what the dataclass __init__ would set, minus
    the keyword filtering). Anything else (unknown types, missing or extra fields, bad JSON) goes
    through decode itself, errors included."""
    try:
        data = orjson.loads(line)
    except orjson.JSONDecodeError:
        return decode(line)
    if type(data) is dict:
        entry = _EXACT_FIELDS.get(data.pop("type", None))
        if entry is not None and data.keys() == entry[1]:
            event = _new(entry[0])
            event.__dict__ = data
            return event
    return decode(line)


def encode_line(event: Event) -> bytes:
    """encode(event) + newline as UTF-8, byte for byte, without dataclasses.asdict's deep copy (which
    costs tens of microseconds an event, on the event loop): orjson serializes the dataclass itself,
    in field order, and "type" is put first by hand. Anything it cannot take goes the slow way."""
    try:
        body = orjson.dumps(event)
    except TypeError:
        return (encode(event) + "\n").encode("utf-8")
    return b'{"type":"%s",%s\n' % (event.type.encode("ascii"), body[1:])


class Recorder:
    """Subscribes to the bus; a writer task appends and flushes every event as it comes."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._task: asyncio.Task | None = None
        self.written = 0

    async def start(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # binary: lines are encoded on the loop, the writer thread only copies bytes (no
            # allocations in its own malloc arena, which kept growing a night-long run's RSS)
            self._file = await aiofiles.open(self.path, "wb")
        except OSError as exc:
            raise BadInput(f"cannot write the log {self.path}: {exc.strerror or exc}") from None
        self._task = asyncio.create_task(self._write_loop(), name="recorder")

    def __call__(self, event: Event) -> None:
        self._queue.put_nowait(encode_line(event))

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

    async def _flush(self, lines: list[bytes]) -> None:
        await self._file.write(b"".join(lines))
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
        number = 0                                   # lines before the current block
        tail = b""
        while True:
            block = handle.read(_READ_BLOCK)
            if not block:
                break
            lines = (tail + block).split(b"\n") if tail else block.split(b"\n")
            tail = lines.pop()                       # the unfinished last line, completed by the next block
            for offset, line in enumerate(lines, start=number + 1):
                # answer deltas are most of a log: skipped by prefix, never parsed
                if (skip_deltas and line.startswith(_DELTA_PREFIX)) or not line.strip():
                    continue
                try:
                    event = decode_line(line)
                except DecodeError as exc:
                    if warnings is not None:
                        warnings.append(f"{path}:{offset}: log ends with a damaged line ({exc}); "
                                        f"read up to the last good event")
                    return
                if offset == 1:
                    check_header(event, path)
                yield event
            number += len(lines)
        if tail.strip() and warnings is not None:
            warnings.append(f"{path}:{number + 1}: the last line is cut short (a crash mid-write?); "
                            f"read up to the last good event")


def read_log(path: str | Path, skip_deltas: bool = False) -> LogContents:
    warnings: list[str] = []
    events = list(iter_log(path, warnings, skip_deltas=skip_deltas))
    if not events:
        raise BadInput(f"{path}: empty log")
    return LogContents(events=events, warning=warnings[0] if warnings else None)
