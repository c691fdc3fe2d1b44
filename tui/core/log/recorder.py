"""The JSONL recorder: every event of the run, in order, written by a thread of its own (the file opened and
closed through aiofiles). tui.core.log.reader reads what it writes."""

from __future__ import annotations

import asyncio
import errno
import os
import queue
import threading
import time
from pathlib import Path
from typing import Callable

import aiofiles
import orjson

from ..config.errors import LogWriteError
from .events import Event, encode



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
    """Subscribes to the bus; a writer thread of its own appends and flushes the events as they come, in
    batches no closer together than LINGER seconds.

    A write that fails (a full disk, an I/O error) or a file that is no longer where it was (removed,
    or its folder was: writes to an unlinked file still succeed, so the path is checked about once a
    second and at the end) stops the recorder at once: `failure` holds the one-line error, later
    events are dropped (nothing piles up in memory) and `on_failure` is called once, on the event loop,
    so the run can stop too. Nothing is raised from the writer or from `close`."""

    CHECK_EVERY = 1.0            # seconds between checks that the file is still at its path
    # Seconds a line may wait for others to join its batch after a write: a slow run still writes each event
    # at once, a fast one 20 batches a second. close() writes what is waiting, so only a killed process loses
    # more (at most this long of events) than before. Measured at 4 streams (2026-12-06): 2,113 batches for
    # 2,040 requests without it, 250 with it.
    LINGER = 0.05

    def __init__(self, path: str | Path, on_failure: Callable[[LogWriteError], None] | None = None,
                 redact: Callable[[bytes], bytes] | None = None):
        self.path = Path(path)
        self.redact = redact         # the run's secrets out of every line (tui.core.config.redact)
        # Lines go to the writer thread through a SimpleQueue: a put costs the loop no future, no task and no
        # wake of its own. The batch went through run_in_executor before (a future each way, the loop woken
        # through its self-pipe): 2.70 against 1.91 ms of CPU a request with the live text's events on and
        # off, reference server at 40 ms a token, 4 streams (2026-12-06); a batch per event at that pace.
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._ended: asyncio.Future | None = None
        self.written = 0
        self._bytes = 0
        self.failure: LogWriteError | None = None
        self.on_failure = on_failure
        self._inode: tuple[int, int] | None = None
        self._checked = 0.0
        self._flushed = 0.0          # when the last batch was written (monotonic seconds)
        self._closing = threading.Event()

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
        loop = asyncio.get_running_loop()
        self._ended = loop.create_future()
        self._thread = threading.Thread(target=self._write_loop, args=(loop,), name="hitproof-recorder",
                                        daemon=True)
        self._thread.start()

    def __call__(self, event: Event) -> None:
        if self.failure is None:
            line = encode_line(event)
            self._queue.put(self.redact(line) if self.redact is not None else line)

    def _write_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The writer thread: each batch as one write to the raw file, until close() (None) or a failure."""
        reason = None
        try:
            closing = False
            while not closing:
                line = self._queue.get()
                if line is None:
                    break
                wait = self._flushed + self.LINGER - time.monotonic()
                if wait > 0:
                    self._closing.wait(wait)                 # close() ends the wait
                lines = [line]
                while True:                                  # batch what is already waiting
                    try:
                        more = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if more is None:
                        closing = True
                        break
                    lines.append(more)
                self._write_batch(lines)
        except OSError as exc:
            reason = _reason(exc)
        try:
            loop.call_soon_threadsafe(self._writer_ended, reason)
        except RuntimeError:                                 # the loop is closed: nobody waits for it
            pass

    def _write_batch(self, lines: list[bytes]) -> None:
        data = b"".join(lines)
        try:
            # the file's buffer is always empty between batches, so the batch goes straight to its raw file
            _write_all(self._file.raw, data)
        except OSError:
            self.written += self._landed(data)
            raise
        self.written += len(lines)
        self._bytes += len(data)
        now = self._flushed = time.monotonic()
        if now - self._checked >= self.CHECK_EVERY:
            self._checked = now
            self._check_in_place()

    def _writer_ended(self, reason: str | None) -> None:
        """On the loop: the writer thread stopped (closed, or failed for `reason`)."""
        if reason is not None:
            self._fail(reason)
        if self._ended is not None and not self._ended.done():
            self._ended.set_result(None)

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
        if self._thread is None:
            return
        self._queue.put(None)
        self._closing.set()
        await asyncio.shield(self._ended)
        self._thread = None
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


