"""A lazily built index over a JSONL soak log, for replay of logs of any size.

The header is read at once; the offsets of every line are found by a scan that runs in the
background and never decodes JSON (the recorder writes "type" first, so a line's kind is its
prefix). Events are then read one by one with positional reads.
"""

from __future__ import annotations

import os
import threading
from array import array
from pathlib import Path
from typing import Callable, Iterator

from ..config.errors import BadInput
from .events import DecodeError, Event, RunHeader
from .reader import HEADER_LIMIT, decode_line, header_of

# Lines whose kind matters for navigation; the prefix is how the recorder writes them.
MARK_TYPES = ("finding", "phase_start", "phase_end", "run_end", "isolation_end")
_PREFIX = b'{"type":"'
SKIP_WHEN_FOLDING = (b'{"type":"delta"',)    # answer deltas are repeated in request_end


def line_type(line: bytes) -> str | None:
    if not line.startswith(_PREFIX):
        return None
    end = line.find(b'"', len(_PREFIX))
    return line[len(_PREFIX):end].decode("ascii", "replace") if end > 0 else None


class LogIndex:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self._fd = os.open(self.path, os.O_RDONLY)
        except OSError as exc:
            raise BadInput(f"cannot open log {self.path}: {exc.strerror or exc}") from None
        self.size = os.fstat(self._fd).st_size
        self.offsets = array("q")
        self.marks: dict[str, list[int]] = {name: [] for name in MARK_TYPES}
        self.scanned = 0                    # bytes scanned so far
        self.complete = False
        self.warning: str | None = None
        self._lock = threading.Lock()
        self.header = self._read_header()

    def close(self) -> None:
        os.close(self._fd)

    def _read_header(self) -> RunHeader:
        try:
            first = os.pread(self._fd, 1 << 20, 0)
            if b"\n" not in first and len(first) == 1 << 20:     # a long header (a big scenario text)
                first = os.pread(self._fd, HEADER_LIMIT, 0)
        except OSError as exc:                 # a folder opens, and fails here
            os.close(self._fd)
            raise BadInput(f"cannot open log {self.path}: {exc.strerror or exc}") from None
        cut = first.find(b"\n")
        try:
            return header_of(first[:cut + 1] if cut >= 0 else first, self.path)
        except BadInput:
            os.close(self._fd)
            raise

    # --- the scan -------------------------------------------------------------------------------

    def scan(self, progress: Callable[[float], None] | None = None, block: int = 8 << 20) -> None:
        """Find every line start. Safe to run in a thread; readers see a growing prefix."""
        position = 0
        carry = b""
        carry_start = 0
        while position < self.size:
            chunk = os.pread(self._fd, min(block, self.size - position), position)
            if not chunk:
                break
            data = carry + chunk
            base = carry_start
            start = 0
            offsets, marks = [], []
            while True:
                end = data.find(b"\n", start)
                if end < 0:
                    break
                if end > start:
                    kind = line_type(data[start:start + 48])
                    if kind is None:
                        self.warning = (f"{self.path}: line {len(self.offsets) + len(offsets) + 1} is damaged; "
                                        f"replaying up to the last good event")
                        self._publish(offsets, marks, base + start)
                        self.complete = True
                        return
                    if kind in self.marks:
                        marks.append((kind, len(self.offsets) + len(offsets)))
                    offsets.append(base + start)
                start = end + 1
            carry = data[start:]
            carry_start = base + start
            position += len(chunk)
            self._publish(offsets, marks, carry_start)
            if progress is not None:
                progress(position / self.size if self.size else 1.0)
        if carry.strip():
            self.warning = (f"{self.path}: the last line is cut short (a crash mid-write?); "
                            f"replaying up to the last good event")
        self.complete = True

    def _publish(self, offsets: list[int], marks: list[tuple[str, int]], scanned: int) -> None:
        with self._lock:
            self.offsets.extend(offsets)
            for kind, index in marks:
                self.marks[kind].append(index)
            self.scanned = scanned

    # --- reading ----------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.offsets)

    def raw(self, index: int) -> bytes:
        start = self.offsets[index]
        end = self.offsets[index + 1] if index + 1 < len(self.offsets) else self.scanned
        return os.pread(self._fd, end - start, start)

    def read(self, index: int) -> Event:
        return decode_line(self.raw(index))

    def events(self, start: int = 0, stop: int | None = None, *, skip_deltas: bool = False) -> Iterator[Event]:
        """Decoded events in [start, stop), read in large sequential blocks."""
        stop = len(self.offsets) if stop is None else min(stop, len(self.offsets))
        index = start
        while index < stop:
            last = min(stop, index + 4096)
            begin = self.offsets[index]
            end = self.offsets[last] if last < len(self.offsets) else self.scanned
            blob = os.pread(self._fd, end - begin, begin)
            for line in blob.split(b"\n"):
                if not line:
                    continue
                if skip_deltas and line.startswith(SKIP_WHEN_FOLDING):
                    index += 1
                    continue
                try:
                    yield decode_line(line)
                except DecodeError:
                    self.warning = self.warning or (f"{self.path}: event {index + 1} is damaged; "
                                                    f"replaying up to the last good event")
                    return
                index += 1
