"""JSONL recorder (aiofiles, flushed per event) and a tolerant log reader."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Collection, Iterator

import aiofiles
import orjson

from ..config.errors import BadInput, LogWriteError
from .events import EVENT_TYPES, SCHEMA_VERSION, DecodeError, Event, RunHeader, decode, encode

_DELTA_PREFIX = b'{"type":"delta"'
_TYPE_PREFIX = b'{"type":"'                # how the recorder starts every line (9 bytes)
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
    if type(data) is dict and type(data.get("type")) is str:
        entry = _EXACT_FIELDS.get(data.pop("type"))
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
    """Subscribes to the bus; a writer task appends and flushes the events as they come, in batches
    no closer together than LINGER seconds.

    A write that fails (a full disk, an I/O error) or a file that is no longer where it was (removed,
    or its folder was: writes to an unlinked file still succeed, so the path is checked about once a
    second and at the end) stops the recorder at once: `failure` holds the one-line error, later
    events are dropped (nothing piles up in memory) and `on_failure` is called once, so the run can
    stop too. Nothing is raised from the writer task or from `close`."""

    CHECK_EVERY = 1.0            # seconds between checks that the file is still at its path
    # Seconds a line may wait for others to join its batch after a write. Each batch is one hop to the
    # file's thread and back (a queue put, a thread woken, the loop woken through its self-pipe: 30-53 us of
    # CPU). At 4 streams nearly every event was its own batch: 2,113 hops for 2,040 requests (2026-12-06).
    # A slow run still writes each event at once; a fast one writes 20 batches a second. close() writes
    # what is waiting, so only a killed process loses more (at most this long of events) than before.
    LINGER = 0.05

    def __init__(self, path: str | Path, on_failure: Callable[[LogWriteError], None] | None = None,
                 redact: Callable[[bytes], bytes] | None = None):
        self.path = Path(path)
        self.redact = redact         # the run's secrets out of every line (tui.core.config.redact)
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._task: asyncio.Task | None = None
        self.written = 0
        self._bytes = 0
        self.failure: LogWriteError | None = None
        self.on_failure = on_failure
        self._inode: tuple[int, int] | None = None
        self._checked = 0.0
        self._flushed = 0.0          # when the last batch was written (monotonic seconds)
        self._closing = asyncio.Event()

    async def start(self) -> None:
        try:
            _make_folder(self.path.parent)
            # binary: lines are encoded on the loop, the writer thread only copies bytes (no
            # allocations in its own malloc arena, which kept growing a night-long run's RSS)
            self._file = await aiofiles.open(self.path, "wb")
            found = os.fstat(self._file.fileno())
        except OSError as exc:
            raise LogWriteError(log_write_message(self.path, _reason(exc), 0)) from None
        self._inode = (found.st_dev, found.st_ino)
        self._checked = time.monotonic()
        self._task = asyncio.create_task(self._write_loop(), name="recorder")

    def __call__(self, event: Event) -> None:
        if self.failure is None:
            line = encode_line(event)
            self._queue.put_nowait(self.redact(line) if self.redact is not None else line)

    async def _write_loop(self) -> None:
        try:
            while True:
                line = await self._queue.get()
                if line is None:
                    break
                wait = self._flushed + self.LINGER - time.monotonic()
                if wait > 0 and not self._closing.is_set():
                    try:
                        async with asyncio.timeout(wait):        # close() ends the wait
                            await self._closing.wait()
                    except TimeoutError:
                        pass
                lines = [line]
                while not self._queue.empty():            # batch what is already waiting
                    more = self._queue.get_nowait()
                    if more is None:
                        await self._flush(lines)
                        return
                    lines.append(more)
                await self._flush(lines)
        except OSError as exc:
            self._fail(_reason(exc))

    async def _flush(self, lines: list[bytes]) -> None:
        data = b"".join(lines)
        try:
            # one hop to the file's thread per batch, not two (write, then flush): the file's buffer is
            # always empty between batches, so the batch goes straight to its raw file, all of it
            await asyncio.get_running_loop().run_in_executor(None, _write_all, self._file.raw, data)
        except OSError:
            self.written += self._landed(data)
            raise
        self.written += len(lines)
        self._bytes += len(data)
        now = self._flushed = time.monotonic()
        if now - self._checked >= self.CHECK_EVERY:
            self._checked = now
            self._check_in_place()

    def _landed(self, data: bytes) -> int:
        """Whole events of a failed batch that reached the file all the same (part of a buffer)."""
        try:
            size = os.fstat(self._file.fileno()).st_size
        except (OSError, ValueError):
            return 0
        return data[:max(0, size - self._bytes)].count(b"\n")

    def _check_in_place(self) -> None:
        """The file must still be at its path: an unlinked file takes writes that nobody will read."""
        try:
            found = os.stat(self.path)
        except FileNotFoundError:
            raise OSError(errno.ENOENT, "the file was removed during the run (or its folder was)") from None
        if (found.st_dev, found.st_ino) != self._inode:
            raise OSError(errno.ENOENT, "the file was replaced by another during the run")

    def _fail(self, reason: str) -> None:
        if self.failure is not None:
            return
        self.failure = LogWriteError(log_write_message(self.path, reason, self.written))
        while not self._queue.empty():                    # what could not be written is dropped
            self._queue.get_nowait()
        if self.on_failure is not None:
            self.on_failure(self.failure)

    async def close(self) -> None:
        if self._task is None:
            return
        self._queue.put_nowait(None)
        self._closing.set()
        await asyncio.shield(self._task)
        self._task = None
        try:
            if self.failure is None:
                self._check_in_place()
            await self._file.close()
        except OSError as exc:
            self._fail(_reason(exc))
            try:
                await self._file.close()
            except OSError:
                pass                                   # the failure is already the report


def _write_all(raw, data: bytes) -> None:
    """Every byte of data to the raw file (a raw write may take part of it), or OSError."""
    view = memoryview(data)
    while view:
        written = raw.write(view)
        if written is None:                     # non-blocking and not ready: a regular file never is
            raise OSError(errno.EAGAIN, "the log file took no bytes")
        view = view[written:]


def check_writable(path: str | Path) -> None:
    """Before anything starts (a server launched, a model loaded): can the log be written there?
    Creates its folder; a file that was not there is not left behind. LogWriteError (exit 5) if not."""
    path = Path(path)
    existed = path.exists()
    try:
        _make_folder(path.parent)
        with open(path, "ab"):
            pass
        if not existed:
            path.unlink()
    except OSError as exc:
        raise LogWriteError(log_write_message(path, _reason(exc), 0)) from None


def log_write_message(path: Path, reason: str, written: int) -> str:
    events = "1 event" if written == 1 else f"{written:,} events"
    return f"could not write the log {path}: {reason} ({events} written; the log stops there)"


def _make_folder(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:                       # something on the way is a file
        raise NotADirectoryError(errno.ENOTDIR, f"{_first_file(folder)} is a file, not a folder") from None


def _first_file(folder: Path) -> Path:
    for parent in reversed((folder, *folder.parents)):
        if parent.exists() and not parent.is_dir():
            return parent
    return folder


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


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
    if type(event.schema) is not int:
        raise BadInput(f"{path}: not a hitproof log (the header's schema is {event.schema!r:.40}, not a number)")
    if event.schema > SCHEMA_VERSION:
        raise BadInput(f"{path}: log schema {event.schema} is newer than this hitproof understands "
                       f"({SCHEMA_VERSION}); upgrade hitproof")
    return event


HEADER_LIMIT = 64 << 20       # bytes the first line (the header, with the scenario's text) may take


def read_header(path: str | Path, handle=None) -> RunHeader:
    """The log's header, read from its first line whatever a reader skips later: anything that is not a
    hitproof log (a folder, an empty file, binary data, a first line that is not a header) is one
    BadInput line (exit 2)."""
    path = Path(path)
    try:
        if handle is None:
            with open(path, "rb") as own:
                first = own.readline(HEADER_LIMIT)
        else:
            first = handle.readline(HEADER_LIMIT)
            handle.seek(0)
    except OSError as exc:
        raise BadInput(f"cannot open log {path}: {exc.strerror or exc}") from None
    return header_of(first, path)


def header_of(first: bytes, path: str | Path) -> RunHeader:
    """The header in a log's first line (bytes up to and with its newline)."""
    if not first.strip():
        raise BadInput(f"{path}: empty file, not a hitproof log" if not first else
                       f"{path}: not a hitproof log (the first line is blank)")
    if b"\0" in first:
        raise BadInput(f"{path}: not a hitproof log (binary data)")
    if not first.endswith(b"\n"):
        raise BadInput(f"{path}: not a hitproof log (the first line is cut short or too long)")
    try:
        first.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput(f"{path}: not a hitproof log (binary data)") from None
    try:
        event = decode_line(first)
    except DecodeError:
        raise BadInput(f"{path}: not a hitproof log (the first line is not a JSON event)") from None
    return check_header(event, path)


def iter_log(path: str | Path, warnings: list[str] | None = None, skip_deltas: bool = False,
             only: Collection[str] | None = None) -> Iterator[Event]:
    """Events of a log, in order. A bad line stops the read with a warning (a crash mid-write).
    `skip_deltas` leaves out answer deltas (their text is repeated in request_end) unparsed;
    `only` (event type names) leaves out, unparsed, every line of another type."""
    path = Path(path)
    try:
        handle = open(path, "rb")
    except OSError as exc:
        raise BadInput(f"cannot open log {path}: {exc.strerror or exc}") from None
    wanted = _wanted_lines(only) if only is not None else None
    with handle:
        read_header(path, handle)                    # before any filter can skip the first line
        number = 0                                   # lines before the current block
        tail = b""
        while True:
            block = handle.read(_READ_BLOCK)
            if not block:
                break
            data = tail + block if tail else block
            cut = data.rfind(b"\n") + 1
            whole, tail = data[:cut], data[cut:]      # the unfinished last line waits for the next block
            if not whole:
                continue
            count = whole.count(b"\n")
            if wanted is not None and (b"\n" + whole).count(b'\n{"type":"') == count:
                # every line is an event line: the wanted ones are found by one C-level scan
                scanned = b"\n" + whole
                for match in wanted.finditer(scanned):
                    at = match.start()
                    # the line's number is counted only when it is needed: the header, or a damaged line
                    offset = 1 if number == 0 and at == 0 else None
                    event = _checked(match.group()[1:], offset, path, warnings,
                                     lambda: number + scanned.count(b"\n", 0, at + 1))
                    if event is None:
                        return
                    yield event
            else:
                for offset, line in enumerate(whole[:-1].split(b"\n"), start=number + 1):
                    if wanted is not None and line.startswith(_TYPE_PREFIX):
                        if line[9:line.find(b'"', 9)].decode("ascii", "replace") not in only:
                            continue
                    elif skip_deltas and line.startswith(_DELTA_PREFIX):
                        continue                     # answer deltas are most of a log: never parsed
                    if not line.strip():
                        continue
                    event = _checked(line, offset, path, warnings)
                    if event is None:
                        return
                    yield event
            number += count
        if tail.strip() and warnings is not None:
            warnings.append(f"{path}:{number + 1}: the last line is cut short (a crash mid-write?); "
                            f"read up to the last good event")


def _wanted_lines(only: Collection[str]) -> re.Pattern[bytes]:
    """Lines (after a newline) of the given event types, as the recorder writes them."""
    names = b"|".join(re.escape(name.encode("ascii")) for name in sorted(only))
    return re.compile(b'\n\\{"type":"(?:' + names + b')"[^\n]*')


def _checked(line: bytes, offset: int | None, path: Path, warnings: list[str] | None,
             where: Callable[[], int] | None = None) -> Event | None:
    """The line's event; None (with a warning) when it is damaged: the read stops there. `offset`
    is the line's number (None: not counted yet, `where()` counts it)."""
    try:
        event = decode_line(line)
    except DecodeError as exc:
        if warnings is not None:
            if offset is None and where is not None:
                offset = where()
            warnings.append(f"{path}:{offset}: log ends with a damaged line ({exc}); "
                            f"read up to the last good event")
        return None
    if offset == 1:
        check_header(event, path)
    return event


def read_log(path: str | Path, skip_deltas: bool = False) -> LogContents:
    warnings: list[str] = []
    events = list(iter_log(path, warnings, skip_deltas=skip_deltas))
    if not events:
        raise BadInput(f"{path}: empty log")
    return LogContents(events=events, warning=warnings[0] if warnings else None)
