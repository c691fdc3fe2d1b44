"""The transport for answer streams: time to first token as the network saw it.

This transport serves only the answer streams (requests marked with STREAM_EXTENSIONS) to a
plain-http origin with no proxy in the way: one non-blocking socket per connection, kept alive in
a small pool, read straight from the event loop's selector (httpx's own stack hands each HTTP
chunk through several layers of async iterators). The HTTP framing is h11's (the parser under
httpx itself, so a chunk size the grammar forbids is refused, not guessed at), fed one network
read at a time: everything h11 gives back from one read is handed over as one block, stamped with
that read's arrival. Every other request goes to httpx's own transport.

h11 costs about 6 us per HTTP chunk here (one Data event each; servers send one chunk per token),
more than the rest of the answer path together (SSE, JSON, checks): benchmarks/run.py floods at
about 0.38 times the rate of the former hand-written de-chunker (138,517 vs 367,613 chunks/s at
64 streams, same machine, same hour). A server's real pace (tens to hundreds of tokens a second
per stream) is far below either; on a loaded machine the event loop falls behind sooner.

Each read carries the time it arrived. On Linux that is the kernel's receive timestamp
(SO_TIMESTAMPNS), so a busy event loop (hundreds of streams being parsed and judged) does not
delay the stamp: what a soak reports is the server's latency, not the client's queue. Elsewhere,
or when the kernel gives no stamp, the read is stamped when the socket is read, before any parsing.
"""

from __future__ import annotations

import asyncio
import collections
import re
import socket
import struct
import sys
import time
import urllib.request
from typing import AsyncIterator

import h11
import httpx

SSE = "hitproof.sse"
CLOCK = "hitproof.clock"
STREAM_EXTENSIONS = {SSE: True}
JSON_HEADERS = {"Content-Type": "application/json"}
_KEEPALIVE_EXPIRY = 5.0           # seconds an idle connection is reused (httpx's default)
_READ_HIGH_WATER = 4 << 20        # bytes buffered unread before the socket stops being read
_MAX_HEAD = 1 << 20               # a response head (or a chunk size line) larger than this is refused


def direct_http_origin(base_url: str) -> str | None:
    """"http://host:port" when streams to base_url go straight to the server, else None (https, or
    an environment proxy that applies: those stay with httpx)."""
    url = httpx.URL(base_url)
    if url.scheme != "http" or not url.host:
        return None
    proxies = urllib.request.getproxies()
    if (proxies.get("http") or proxies.get("all")) and not urllib.request.proxy_bypass(url.host):
        return None
    host = f"[{url.host}]" if ":" in url.host else url.host
    return f"http://{host}" + (f":{url.port}" if url.port else "")      # no port: any port of that host


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
_NO_SELECTOR = sys.platform == "win32"         # the Proactor loop has no add_reader: httpx's transport there


class _Connection:
    """One keep-alive connection: a non-blocking socket read from the event loop's selector; each
    read queued with its arrival time (perf_counter_ns)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket):
        self.loop = loop
        self.sock = sock
        self.fd = sock.fileno()
        self.kernel_stamps = False
        if _SO_TIMESTAMPNS is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
                self.kernel_stamps = True
            except OSError:
                pass
        self.http = h11.Connection(h11.CLIENT, max_incomplete_event_size=_MAX_HEAD)
        self.error: OSError | None = None          # why the socket was lost, when it was an error
        self.received = 0                          # bytes read on this connection since the last request
        self.pieces: collections.deque[tuple[bytes, int]] = collections.deque()
        self.buffered = 0
        self.closed = False
        self.reading = False
        self.waiter: asyncio.Future | None = None
        self.idle_since = 0.0
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
        try:
            if self.kernel_stamps:
                data, ancillary, _, _ = self.sock.recvmsg(_READ_SIZE, _ANCILLARY)
            else:
                data, ancillary = self.sock.recv(_READ_SIZE), ()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.error = exc
            self._lost()
            return
        if not data:                                   # the server closed its side
            self._lost()
            return
        stamp = time.perf_counter_ns()
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(payload) >= _TIMESPEC.size:
                seconds, nanoseconds = _TIMESPEC.unpack_from(payload)
                # the kernel's wall-clock stamp moved onto perf_counter's scale; never later than now
                kernel = seconds * 1_000_000_000 + nanoseconds - (time.time_ns() - stamp)
                if 0 < stamp - kernel < 60_000_000_000:
                    stamp = kernel
        self.pieces.append((data, stamp))
        self.buffered += len(data)
        self.received += len(data)
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
            waiter = self.waiter = self.loop.create_future()
            timer = self.loop.call_later(timeout, _expire, waiter) if timeout is not None else None
            try:
                await waiter
            finally:
                self.waiter = None
                if timer is not None:
                    timer.cancel()
        piece = self.pieces.popleft()
        self.buffered -= len(piece[0])
        if not self.reading and self.buffered < _READ_HIGH_WATER // 4:
            self._resume_reading()
        return piece

    def usable(self, now: float) -> bool:
        return (not self.closed and not self.pieces and now - self.idle_since <= _KEEPALIVE_EXPIRY
                and self.http.our_state is h11.IDLE and self.http.their_state is h11.IDLE)

    def lost_reason(self) -> str:
        """How the server ended the connection, for an error message."""
        if isinstance(self.error, ConnectionResetError):
            return "the server reset the connection"
        if self.error is not None:
            return f"the connection failed ({self.error.strerror or type(self.error).__name__})"
        return "the server closed the connection"

    def close(self) -> None:
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


def _h11_text(exc: Exception) -> str:
    """h11's message, its bytearray(b'...') reprs shown as b'...'."""
    return re.sub(r"bytearray\((b'.*?'|b\".*?\")\)", r"\1", str(exc))[:200]


def _expire(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class StreamingTransport(httpx.AsyncBaseTransport):
    def __init__(self, inner: httpx.AsyncBaseTransport, max_connections: int):
        self.inner = inner
        self.max_connections = max_connections
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._slots: asyncio.Semaphore | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if not request.extensions.get(SSE) or request.url.scheme != "http" or _NO_SELECTOR \
                or not isinstance(request.stream, httpx.ByteStream):
            return await self.inner.handle_async_request(request)
        loop = asyncio.get_running_loop()
        if self._loop is not loop:                    # a new event loop: the old connections are unusable
            self._loop, self._idle, self._slots = loop, {}, asyncio.Semaphore(self.max_connections)
        timeouts = request.extensions.get("timeout") or {}
        slots = self._slots
        if slots.locked():
            try:
                await asyncio.wait_for(slots.acquire(), timeouts.get("pool"))
            except asyncio.TimeoutError:
                raise httpx.PoolTimeout("no free connection in the pool", request=request) from None
        else:
            await slots.acquire()
        key = (request.url.host, request.url.port or 80)
        try:
            conn = await self._connection(loop, key, request, timeouts.get("connect"))
        except BaseException:
            slots.release()
            raise
        try:
            http = conn.http
            conn.received = 0
            try:
                data = http.send(h11.Request(method=request.method, target=request.url.raw_path,
                                             headers=request.headers.raw))
                if request.content:
                    data += http.send(h11.Data(data=request.content))
                data += http.send(h11.EndOfMessage())
            except h11.LocalProtocolError as exc:
                raise httpx.LocalProtocolError(str(exc), request=request) from None
            clock = _Clock()
            try:
                clock.sent = time.perf_counter_ns()
                rest = conn.send(data)
                if rest is not None:
                    await asyncio.wait_for(rest, timeouts.get("write"))
            except asyncio.TimeoutError:
                raise httpx.WriteTimeout("timed out sending the request", request=request) from None
            except OSError as exc:
                raise httpx.WriteError(str(exc) or type(exc).__name__, request=request) from None
            response, stamp = await self._read_head(conn, request, timeouts.get("read"))
        except BaseException:
            self._release(conn, key, False)
            raise
        version = b"HTTP/" + response.http_version
        body = _Body(self, conn, key, request, stamp, clock, timeouts.get("read"))
        return httpx.Response(response.status_code, headers=response.headers.raw_items(), stream=body,
                              extensions={"http_version": version, "reason_phrase": response.reason,
                                          CLOCK: clock})

    async def _connection(self, loop, key, request, timeout) -> _Connection:
        idle = self._idle.get(key)
        now = loop.time()
        while idle:
            conn = idle.pop()
            if conn.usable(now):
                return conn
            conn.close()
        try:
            conn = _Connection(loop, await asyncio.wait_for(_connect(loop, key[0], key[1]), timeout))
        except asyncio.TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {key[0]}:{key[1]} timed out", request=request) from None
        except OSError as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__, request=request) from None
        return conn

    @staticmethod
    async def _read_head(conn: _Connection, request: httpx.Request, timeout: float | None):
        """The final response head (interim 1xx ones are skipped) and the arrival of the read that
        completed it; the body bytes that came with it stay in h11's buffer."""
        http = conn.http
        stamp = 0
        while True:
            try:
                event = http.next_event()
            except h11.RemoteProtocolError as exc:
                raise httpx.RemoteProtocolError(f"bad response head: {_h11_text(exc)}", request=request) from None
            if event is h11.NEED_DATA:
                try:
                    piece = await conn.next_piece(timeout)
                except TimeoutError:
                    raise httpx.ReadTimeout(f"no response within {timeout:g} s (the server took the request "
                                            f"but never answered)", request=request) from None
                if piece is None:
                    # before any response: the request never ran (a kept-alive connection the
                    # server had closed, or a reset): the client may send it once more
                    raise httpx.RemoteProtocolError(f"{conn.lost_reason()} without sending a response",
                                                    request=request)
                http.receive_data(piece[0])
                stamp = piece[1]
            elif type(event) is h11.Response:
                return event, stamp
            elif event is h11.PAUSED or type(event) is h11.ConnectionClosed:
                raise httpx.RemoteProtocolError("the server closed the connection without sending a response",
                                                request=request)
            # h11.InformationalResponse (100 Continue, 103 Early Hints): the real one follows

    def _release(self, conn: _Connection, key: tuple[str, int], reusable: bool) -> None:
        if reusable and not conn.closed and self._loop is conn.loop:
            conn.idle_since = conn.loop.time()
            self._idle.setdefault(key, []).append(conn)
        else:
            conn.close()
        if self._slots is not None and self._loop is conn.loop:
            self._slots.release()

    async def aclose(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle = {}
        await self.inner.aclose()


class _Body(httpx.AsyncByteStream):
    """The response body as h11 de-frames it (chunked, content-length or closed by the server), one
    block per network read; clock.arrived is the arrival of the read a block came from. A framing
    error (a chunk size the grammar forbids, a body cut short) is httpx.RemoteProtocolError."""

    def __init__(self, pool: StreamingTransport, conn: _Connection, key, request: httpx.Request, stamp: int,
                 clock: _Clock, timeout: float | None):
        self.pool, self.conn, self.key, self.request = pool, conn, key, request
        self.clock, self.timeout = clock, timeout
        self.stamp = stamp                # arrival of the read that completed the head
        self.released = False
        self.done = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self.conn
        http = conn.http
        next_event = http.next_event
        Data = h11.Data
        stamp = self.stamp
        while True:
            parts = []
            try:
                while True:
                    event = next_event()
                    if type(event) is not Data:
                        break
                    parts.append(event.data)
            except h11.RemoteProtocolError as exc:
                raise httpx.RemoteProtocolError(self._broken(f"bad HTTP framing: {_h11_text(exc)}"),
                                                request=self.request) from None
            if parts:
                self.clock.arrived = stamp
                yield parts[0] if len(parts) == 1 else b"".join(parts)
            if event is h11.NEED_DATA:
                try:
                    piece = await conn.next_piece(self.timeout)
                except TimeoutError:
                    raise httpx.ReadTimeout(f"no data for {self.timeout:g} s in the middle of the answer",
                                            request=self.request) from None
                if piece is None:
                    if conn.error is not None:      # a reset is a reset, even where a close would end the body
                        raise httpx.RemoteProtocolError(self._broken(conn.lost_reason()), request=self.request)
                    http.receive_data(b"")          # h11 says whether the body was complete
                else:
                    http.receive_data(piece[0])
                    stamp = piece[1]
            elif type(event) is h11.EndOfMessage:
                self.done = True
                return
            else:                                   # PAUSED / ConnectionClosed before the end of the body
                raise httpx.RemoteProtocolError(self._broken(conn.lost_reason()), request=self.request)

    def _broken(self, why: str) -> str:
        return f"{why} ({self.conn.received} bytes received)"

    async def aclose(self) -> None:
        if self.released:
            return
        self.released = True
        http = self.conn.http
        reusable = (self.done and http.our_state is h11.DONE and http.their_state is h11.DONE
                    and not http.trailing_data[0])      # bytes after the body: the connection is not reused
        if reusable:
            try:
                http.start_next_cycle()
            except h11.LocalProtocolError:
                reusable = False
        self.pool._release(self.conn, self.key, reusable)
