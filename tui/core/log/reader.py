"""Reading a hitproof log: its header checked, its events in order (a damaged or cut last line stops the read
with a warning), lines of unwanted types left unparsed. The lines are what tui.core.log.recorder writes."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Collection, Iterator

import orjson

from ..config.errors import BadInput
from .events import EVENT_TYPES, SCHEMA_VERSION, DecodeError, Event, RunHeader, decode

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
