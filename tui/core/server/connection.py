"""One keep-alive connection of the streaming transport: a non-blocking socket read from the event
loop's selector, each network read queued with the time it arrived (the kernel's receive stamp,
SO_TIMESTAMPNS, on Linux; else the read time, taken before any parsing)."""

from __future__ import annotations

import asyncio
import collections
import socket
import struct
import sys
import time
from typing import Callable

# Seconds an idle connection is reused. llama-server (cpp-httplib) and vLLM (uvicorn) close idle ones after
# 5 s, counted from their last write, which precedes our release: reusing one at 4.99 s by our clock raced
# the server's close (llama.cpp, a request sent 5 s after the last phase, its retry on a second stale
# connection: "closed the connection without sending a response (twice)", 1 run in 5, 2026-12-03).
_KEEPALIVE_EXPIRY = 4.0
_READ_HIGH_WATER = 4 << 20        # bytes buffered unread before the socket stops being read


class _Clock:
    """When the request went on the wire and when the block being handed over arrived."""

    __slots__ = ("sent", "arrived")

    def __init__(self) -> None:
        self.sent = 0
        self.arrived = 0


# Linux: SO_TIMESTAMPNS (the generic value; the cmsg it yields has the same number) makes every
# recvmsg carry when the kernel received the latest data it returns, as a struct timespec.
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35) if sys.platform == "linux" else None
_TIMESPEC = struct.Struct("@ll")
_ANCILLARY = socket.CMSG_SPACE(_TIMESPEC.size) if _SO_TIMESTAMPNS is not None else 0
_READ_SIZE = 256 * 1024


def read_buffer() -> bytearray:
    """Where a loop's connections read into, one read at a time (each read is copied out at once).
    recv(256 KiB) allocates 256 KiB per call and shrinks it to what came: 20 us a read against 3 us
    into a buffer kept (a 400-byte read, this machine, 2026-12-05), and an answer is about 13 reads."""
    return bytearray(_READ_SIZE)
_CLOCK_RESOLUTION = time.get_clock_info("monotonic").resolution
_NO_SELECTOR = sys.platform == "win32"         # the Proactor loop has no add_reader: httpx's transport there


class _Connection:
    """One keep-alive connection: a non-blocking socket read from the event loop's selector; each
    read queued with its arrival time (perf_counter_ns)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, buffer: bytearray | None = None):
        self.loop = loop
        self.sock = sock
        self.buffer = buffer if buffer is not None else read_buffer()
        self.view = memoryview(self.buffer)
        self.fd = sock.fileno()
        self.kernel_stamps = False
        if _SO_TIMESTAMPNS is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
                self.kernel_stamps = True
            except OSError:
                pass
        self.reusable = True                       # no response on it has left it in doubt
        self.error: OSError | None = None          # why the socket was lost, when it was an error
        self.received = 0                          # bytes read on this connection since the last request
        self.pieces: collections.deque[tuple[bytes, int]] = collections.deque()
        self.buffered = 0
        self.closed = False
        self.reading = False
        self.waiter: asyncio.Future | None = None
        self.deadline: float | None = None         # when the wait in progress times out (loop time)
        self.watchdog: asyncio.TimerHandle | None = None
        self.idle_since = 0.0
        # gather(): each read goes to sink(data, stamp) from the read callback, not to `pieces`; the waiting
        # task is woken only when the sink says so (or the server closes), and each read moves the deadline
        self.sink: Callable[[bytes, int], bool] | None = None
        self.read_timeout: float | None = None
        self._resume_reading()

    def _resume_reading(self) -> None:
        if not self.reading and not self.closed:
            self.loop.add_reader(self.fd, self._readable)
            self.reading = True

    def _pause_reading(self) -> None:
        if self.reading:
            self.loop.remove_reader(self.fd)
            self.reading = False

    def _readable(self) -> None:
        sink = self.sink
        try:
            # a gathered read (gather(): after an answer's first text) is stamped only to pace the live text
            # (0.1 s): the read time will do, and recv_into costs 2 us less than recvmsg_into and its stamp
            if self.kernel_stamps and sink is None:
                size, ancillary, _, _ = self.sock.recvmsg_into((self.buffer,), _ANCILLARY)
            else:
                size, ancillary = self.sock.recv_into(self.buffer), ()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.error = exc
            self._lost()
            return
        if not size:                                   # the server closed its side
            self._lost()
            return
        stamp = time.perf_counter_ns()
        data = self.view[:size].tobytes()
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(payload) >= _TIMESPEC.size:
                seconds, nanoseconds = _TIMESPEC.unpack_from(payload)
                # the kernel's wall-clock stamp moved onto perf_counter's scale; never later than now
                kernel = seconds * 1_000_000_000 + nanoseconds - (time.time_ns() - stamp)
                if 0 < stamp - kernel < 60_000_000_000:
                    stamp = kernel
        self.received += len(data)
        if sink is not None:
            if sink(data, stamp):
                self._wake()
            elif self.deadline is not None:
                self.deadline = self.loop.time() + self.read_timeout
            return
        self.pieces.append((data, stamp))
        self.buffered += len(data)
        if self.buffered > _READ_HIGH_WATER:
            self._pause_reading()
        self._wake()

    def _lost(self) -> None:
        self.closed = True
        self._pause_reading()
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def send(self, data: bytes):
        """Writes what the socket takes now (so the request leaves when its clock starts); an
        awaitable for the rest, None when all of it went."""
        try:
            sent = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        if sent == len(data):
            return None
        return self.loop.sock_sendall(self.sock, data[sent:])

    async def next_piece(self, timeout: float | None) -> tuple[bytes, int] | None:
        """The next network read and its arrival time; None once the server closed."""
        while not self.pieces:
            if self.closed:
                return None
            await self._woken(timeout)
        piece = self.pieces.popleft()
        self.buffered -= len(piece[0])
        if not self.reading and self.buffered < _READ_HIGH_WATER // 4:
            self._resume_reading()
        return piece

    async def gather(self, sink: Callable[[bytes, int], bool], timeout: float | None) -> None:
        """Hand each network read to sink(data, arrival) as it comes, from the event loop's read callback,
        until the sink returns True or the server closes; TimeoutError after `timeout` seconds without a
        read. Nothing may be queued (`pieces` empty). An answer's later reads, gathered without waking the
        reading task for each one (issue 34: a task's wake is about as costly as the read itself)."""
        self.sink, self.read_timeout = sink, timeout
        self._resume_reading()
        try:
            if not self.closed:
                await self._woken(timeout)
        finally:
            self.sink = None

    async def _woken(self, timeout: float | None) -> None:
        """Until the read callback wakes this connection's one waiter (or the server closes); TimeoutError
        after `timeout` seconds without a read."""
        waiter = self.waiter = self.loop.create_future()
        if timeout is not None:
            self._arm(self.loop.time() + timeout)
        try:
            await waiter
        finally:
            self.waiter = None
            self.deadline = None

    def _arm(self, deadline: float) -> None:
        """One watchdog timer per connection, moved only when a wait must end sooner than it fires: a
        timer made and cancelled for every read cost 2.2 us of an answer's 13 reads (2026-12-05)."""
        self.deadline = deadline
        watchdog = self.watchdog
        if watchdog is None or watchdog.when() > deadline:
            if watchdog is not None:
                watchdog.cancel()
            self.watchdog = self.loop.call_at(deadline, self._watch)

    def _watch(self) -> None:
        self.watchdog = None
        deadline, waiter = self.deadline, self.waiter
        if deadline is None or waiter is None or waiter.done():
            return
        if self.loop.time() + _CLOCK_RESOLUTION >= deadline:       # as the loop itself fires a timer
            waiter.set_exception(TimeoutError())
        else:                                                      # a later wait: its own deadline
            self.watchdog = self.loop.call_at(deadline, self._watch)

    def usable(self, now: float) -> bool:
        return (not self.closed and not self.pieces and now - self.idle_since <= _KEEPALIVE_EXPIRY
                and self.reusable)

    def lost_reason(self) -> str:
        """How the server ended the connection, for an error message."""
        if isinstance(self.error, ConnectionResetError):
            return "the server reset the connection"
        if self.error is not None:
            return f"the connection failed ({self.error.strerror or type(self.error).__name__})"
        return "the server closed the connection"

    def close(self) -> None:
        if self.watchdog is not None:
            self.watchdog.cancel()
            self.watchdog = None
        if self.sock.fileno() < 0:
            return
        self._pause_reading()
        self.closed = True
        self.sock.close()


async def _connect(loop: asyncio.AbstractEventLoop, host: str, port: int) -> socket.socket:
    """A connected non-blocking TCP socket to host:port, trying each address in turn."""
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    error: OSError | None = None
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await loop.sock_connect(sock, address)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
        except BaseException:
            sock.close()
            raise
    raise error or OSError(f"no address for {host}")

