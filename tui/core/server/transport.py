"""The transport for answer streams: time to first token as the network saw it.

httpx parses a response through h11 one HTTP chunk at a time, and servers send one chunk per
token: at tens of thousands of tokens a second that parsing, not the server, sets the pace. This
transport serves only the answer streams (requests marked with STREAM_EXTENSIONS) to a plain-http
origin with no proxy in the way: one non-blocking socket per connection, kept alive in a small
pool; the body is de-chunked a whole network read at a time. Every other request goes to httpx's
own transport.

Each read carries the time it arrived. On Linux that is the kernel's receive timestamp
(SO_TIMESTAMPNS), so a busy event loop (hundreds of streams being parsed and judged) does not
delay the stamp: what a soak reports is the server's latency, not the client's queue. Elsewhere,
or when the kernel gives no stamp, the read is stamped when the socket is read, before any parsing.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import struct
import sys
import time
import urllib.request
from typing import AsyncIterator

import httpx

SSE = "hitproof.sse"
CLOCK = "hitproof.clock"
STREAM_EXTENSIONS = {SSE: True}
JSON_HEADERS = {"Content-Type": "application/json"}
_KEEPALIVE_EXPIRY = 5.0           # seconds an idle connection is reused (httpx's default)
_READ_HIGH_WATER = 4 << 20        # bytes buffered unread before the socket stops being read


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
        except OSError:
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
        return not self.closed and not self.pieces and now - self.idle_since <= _KEEPALIVE_EXPIRY

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
            head = [b"%s %s HTTP/1.1\r\n" % (request.method.encode("ascii"), request.url.raw_path)]
            head += [b"%s: %s\r\n" % (name, value) for name, value in request.headers.raw]
            head.append(b"\r\n")
            head.append(request.content)
            clock = _Clock()
            data = b"".join(head)
            try:
                clock.sent = time.perf_counter_ns()
                rest = conn.send(data)
                if rest is not None:
                    await asyncio.wait_for(rest, timeouts.get("write"))
            except asyncio.TimeoutError:
                raise httpx.WriteTimeout("timed out sending the request", request=request) from None
            except OSError as exc:
                raise httpx.WriteError(str(exc) or type(exc).__name__, request=request) from None
            status, reason, headers, version, leftover = await self._read_head(conn, request, timeouts.get("read"))
        except BaseException:
            self._release(conn, key, False)
            raise
        body = _Body(self, conn, key, request, status, headers, version, leftover, clock, timeouts.get("read"))
        return httpx.Response(status, headers=headers, stream=body,
                              extensions={"http_version": version, "reason_phrase": reason, CLOCK: clock})

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
        data = b""
        while True:
            end = data.find(b"\r\n\r\n")
            if end >= 0:
                lines = data[:end].split(b"\r\n")
                version, _, rest = lines[0].partition(b" ")
                code, _, reason = rest.partition(b" ")
                try:
                    status = int(code)
                except ValueError:
                    raise httpx.RemoteProtocolError(f"bad status line {lines[0][:80]!r}", request=request) from None
                if 100 <= status < 200:                 # an interim response: the real one follows
                    data = data[end + 4:]
                    continue
                headers = []
                for line in lines[1:]:
                    name, sep, value = line.partition(b":")
                    if not sep:
                        raise httpx.RemoteProtocolError(f"bad header line {line[:80]!r}", request=request)
                    headers.append((name.strip(), value.strip()))
                return status, reason, headers, version, (data[end + 4:], stamp)
            if len(data) > 1 << 20:
                raise httpx.RemoteProtocolError("response head too large", request=request)
            try:
                piece = await conn.next_piece(timeout)
            except TimeoutError:
                raise httpx.ReadTimeout("timed out waiting for the response", request=request) from None
            if piece is None:
                raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)
            data += piece[0]
            stamp = piece[1]

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
    """The response body, de-chunked one network read at a time; sets clock.arrived per block."""

    def __init__(self, pool: StreamingTransport, conn: _Connection, key, request: httpx.Request, status: int,
                 headers: list[tuple[bytes, bytes]], version: bytes, leftover: tuple[bytes, int], clock: _Clock,
                 timeout: float | None):
        self.pool, self.conn, self.key, self.request = pool, conn, key, request
        self.clock, self.timeout = clock, timeout
        self.leftover = leftover
        self.released = False
        self.done = False
        self.extra = False                # bytes after the end of the body: the connection is not reusable
        names = {name.lower(): value for name, value in headers}
        tokens = {t.strip().lower() for t in names.get(b"connection", b"").split(b",")}
        self.keep_alive = version == b"HTTP/1.1" and b"close" not in tokens
        self.chunked = False
        self.length: int | None = None
        if request.method == "HEAD" or status in (204, 304):
            self.length = 0
        elif b"chunked" in names.get(b"transfer-encoding", b"").lower():
            self.chunked = True
            self._buf = b""
            self._remaining = 0           # bytes left of the current chunk's data
            self._crlf = False            # the CRLF after a chunk's data is due
            self._trailer = False
        elif names.get(b"content-length") is not None:
            try:
                self.length = int(names[b"content-length"])
            except ValueError:
                raise httpx.RemoteProtocolError("bad content-length", request=request) from None
        else:
            self.keep_alive = False       # delimited by the server closing the connection
        if self.length == 0:
            self.done = True

    async def __aiter__(self) -> AsyncIterator[bytes]:
        data, stamp = self.leftover
        self.leftover = (b"", 0)
        while True:
            if data:
                block = self._decode(data)
                if block:
                    self.clock.arrived = stamp
                    yield block
            if self.done:
                return
            try:
                piece = await self.conn.next_piece(self.timeout)
            except TimeoutError:
                raise httpx.ReadTimeout("timed out waiting for the stream", request=self.request) from None
            if piece is None:
                if not self.chunked and self.length is None:
                    self.done = True
                    return
                raise httpx.RemoteProtocolError("peer closed connection without sending complete message body",
                                                request=self.request)
            data, stamp = piece

    def _decode(self, data: bytes) -> bytes:
        if self.done:
            self.extra = True
            return b""
        if not self.chunked:
            if self.length is None:
                return data
            if len(data) >= self.length:
                if len(data) > self.length:
                    self.extra = True
                data, self.length, self.done = data[:self.length], 0, True
                return data
            self.length -= len(data)
            return data
        buf = self._buf + data if self._buf else data
        out: list[bytes] = []
        append = out.append
        find = buf.find
        pos, size = 0, len(buf)
        need, crlf = self._remaining, self._crlf
        while pos < size:
            if need:                                  # the rest of a chunk cut by the previous read
                end = pos + need
                if end > size:
                    append(buf[pos:])
                    need, pos = end - size, size
                    break
                append(buf[pos:end])
                pos, need, crlf = end, 0, True
            if crlf:
                if size - pos < 2:
                    break
                if buf[pos] != 13 or buf[pos + 1] != 10:
                    raise httpx.RemoteProtocolError("bad chunk framing", request=self.request)
                pos += 2
                crlf = False
                continue
            end = find(b"\r\n", pos)
            if end < 0:
                if size - pos > 4096:
                    raise httpx.RemoteProtocolError("bad chunk size line", request=self.request)
                break
            line = buf[pos:end]
            pos = end + 2
            if self._trailer:
                if not line:
                    self.done = True
                    if pos < size:
                        self.extra = True
                    pos = size
                    break
                continue
            try:
                length = int(line, 16)
            except ValueError:
                try:
                    length = int(line.split(b";", 1)[0], 16)        # a chunk extension
                except ValueError:
                    raise httpx.RemoteProtocolError(f"bad chunk size {line[:40]!r}", request=self.request) from None
            if not length:
                self._trailer = True
                continue
            stop = pos + length
            if stop + 2 <= size and buf[stop] == 13 and buf[stop + 1] == 10:    # the whole chunk is here
                append(buf[pos:stop])
                pos = stop + 2
            else:
                need = length
        self._remaining, self._crlf = need, crlf
        self._buf = buf[pos:] if pos < size else b""
        return out[0] if len(out) == 1 else b"".join(out)

    async def aclose(self) -> None:
        if self.released:
            return
        self.released = True
        self.pool._release(self.conn, self.key, self.done and self.keep_alive and not self.extra)
