"""The transport for answer streams: time to first token as the network saw it.

This transport serves the answer streams (requests marked with STREAM_EXTENSIONS) to a
plain-http origin with no proxy in the way: one non-blocking socket per connection, kept alive in
a small pool, read straight from the event loop's selector. The HTTP framing is llhttp's (Node's
HTTP parser, in C, through httptools, the binding uvicorn uses), fed one network read at a time:
a chunk size the grammar forbids is refused, not guessed at, and everything one read completes is
handed over as one block, stamped with that read's arrival. OpenAIClient hands it its plain
requests too (/tokenize, /metrics: `whole`), past httpx's client; a request it is given without the
SSE mark goes to httpx's own transport.

Why not h11 (the parser under httpx): it costs about 6 us per HTTP chunk here (one Data event
each, and servers send one chunk per token), more than the rest of the answer path together;
llhttp costs about 0.07 us. benchmarks/run.py, same machine, same hour, 64 streams flooding:
h11 138,517 chunks/s, llhttp 328,872, the former hand-written de-chunker 367,613; and on a
loaded machine h11's event loop fell behind at 256 streams of 50 chunks/s, adding hundreds of
milliseconds to the time to first token.

Each read carries the time it arrived. On Linux that is the kernel's receive timestamp
(SO_TIMESTAMPNS), so a busy event loop (hundreds of streams being parsed and judged) does not
delay the stamp: what a soak reports is the server's latency, not the client's queue. Elsewhere,
or when the kernel gives no stamp, the read is stamped when the socket is read, before any parsing.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from typing import AsyncIterator

import httptools
import httpx

from .connection import _NO_SELECTOR, _Clock, _Connection, _connect, read_buffer

NO_SELECTOR = _NO_SELECTOR      # no selector loop (Windows): every request stays with httpx

SSE = "hitproof.sse"
CLOCK = "hitproof.clock"
STREAM_EXTENSIONS = {SSE: True}
FRESH = "hitproof.fresh"          # a request to send on a new connection, never a kept-alive one
FRESH_STREAM_EXTENSIONS = {SSE: True, FRESH: True}
JSON_HEADERS = {"Content-Type": "application/json"}
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


def request_head(method: str, raw_path: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
    """A request's line and header lines, each ending in CRLF (the blank line that ends the head not included)."""
    return b"%s %s HTTP/1.1\r\n" % (method.encode("ascii"), raw_path) + \
        b"".join([b"%s: %s\r\n" % (name, value) for name, value in headers])


class _AfterTheEnd(Exception):
    """Bytes after the end of the response: the connection is not reused."""


class _Response:
    """What llhttp (httptools) reports of one response, callback by callback. Interim 1xx responses
    are skipped; bytes that start another message after this one are _AfterTheEnd."""

    __slots__ = ("parser", "headers", "reason", "status", "head", "body", "complete", "length", "chunked",
                 "keep_alive", "error")

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.headers: list[tuple[bytes, bytes]] = []
        self.reason = b""
        self.status = 0
        self.head = False                 # the final head is complete
        self.body: list[bytes] = []       # body bytes parsed and not handed over yet
        self.complete = False
        self.length = False               # the head gave a content-length
        self.chunked = False
        self.keep_alive = False
        self.error: str | None = None     # a framing error in body bytes that came with the head

    def on_message_begin(self) -> None:
        if self.complete:
            raise _AfterTheEnd()

    def on_status(self, reason: bytes) -> None:
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if 100 <= self.status < 200:
            return
        self.head = True
        self.keep_alive = self.parser.should_keep_alive()    # (after the message llhttp has moved on)
        for name, value in self.headers:
            lower = name.lower()
            if lower == b"content-length":
                self.length = True
            elif lower == b"transfer-encoding" and b"chunked" in value.lower():
                self.chunked = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self.head:
            self.complete = True
        else:                             # an interim response ended: the real one follows
            self.headers, self.reason = [], b""

    def feed(self, data: bytes) -> None:
        """Parse one network read; llhttp's error becomes _FramingError (its message is one line)."""
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if not isinstance(exc.__context__, _AfterTheEnd) and not self.complete:
                raise _FramingError(str(exc)) from None
            raise _AfterTheEnd() from None
        except httptools.HttpParserError as exc:
            if self.complete:
                raise _AfterTheEnd() from None
            raise _FramingError(_llhttp_text(exc)) from None

    def close_delimited(self) -> bool:
        return not self.length and not self.chunked and self.status not in (204, 304)

    def release(self) -> None:
        """Done with the parser. llhttp's parser holds this object's callbacks and this object holds the parser:
        a cycle that reference counting never frees. Left to the cyclic collector, every answer's response
        (its parser, six bound callbacks, the header lists: 15 objects) piled up as garbage until a young
        collection walked and freed it: 22,000 objects and 27 ms of CPU in one collection of a 1,076-request
        soak at 128 streams (gc.callbacks, the reference server, 2026-12-07)."""
        self.parser = None


class _FramingError(Exception):
    pass


def _llhttp_text(exc: Exception) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__


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
        data = request_head(request.method, request.url.raw_path, request.headers.raw) + b"\r\n" + request.content
        body = await self.exchange((request.url.host, request.url.port or 80), data,
                                   request.extensions.get("timeout") or {}, bool(request.extensions.get(FRESH)),
                                   request)
        response = body.response
        version = b"HTTP/" + response.parser.get_http_version().encode("ascii")
        return httpx.Response(response.status, headers=response.headers, stream=body,
                              extensions={"http_version": version, "reason_phrase": response.reason,
                                          CLOCK: body.clock})

    async def exchange(self, key: tuple[str, int], data: bytes, timeouts: dict, fresh: bool, request) -> _Body:
        """Send `data` (a whole HTTP/1.1 request: head and body) to key's (host, port) on a kept-alive
        connection (a new one when `fresh`) and read the response head; its body is the _Body returned
        (body.response: status and headers; body.clock: when the request left, when each block arrived).
        `request` names the request in httpx's errors (an httpx.Request, or the client's own)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:                    # a new event loop: the old connections are unusable
            self._loop, self._idle, self._slots = loop, {}, asyncio.Semaphore(self.max_connections)
            self._buffer = read_buffer()              # shared by this loop's connections
        slots = self._slots
        if slots.locked():
            try:
                await asyncio.wait_for(slots.acquire(), timeouts.get("pool"))
            except asyncio.TimeoutError:
                raise httpx.PoolTimeout("no free connection in the pool", request=request) from None
        else:
            await slots.acquire()
        try:
            conn = await self._connection(loop, key, request, timeouts.get("connect"), fresh=fresh)
        except BaseException:
            slots.release()
            raise
        try:
            conn.received = 0
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
        return _Body(self, conn, key, request, response, stamp, clock, timeouts.get("read"))

    async def _connection(self, loop, key, request, timeout, fresh: bool = False) -> _Connection:
        idle = self._idle.get(key)
        if fresh and idle:          # a retry: every kept-alive connection may be as stale as the last one
            for conn in idle:
                conn.close()
            idle.clear()
        now = loop.time()
        while idle:
            conn = idle.pop()
            if conn.usable(now):
                return conn
            conn.close()
        try:
            conn = _Connection(loop, await asyncio.wait_for(_connect(loop, key[0], key[1]), timeout), self._buffer)
        except asyncio.TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {key[0]}:{key[1]} timed out", request=request) from None
        except ConnectionRefusedError:
            raise httpx.ConnectError(f"connection refused: nothing listens at {key[0]}:{key[1]}",
                                     request=request) from None
        except OSError as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__, request=request) from None
        return conn

    @staticmethod
    async def _read_head(conn: _Connection, request, timeout: float | None):
        """The final response head (interim 1xx ones are skipped) and the arrival of the read that
        completed it; body bytes that came with it wait in response.body."""
        response = _Response()
        stamp = 0
        while not response.head:
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
            stamp = piece[1]
            try:
                response.feed(piece[0])
            except _FramingError as exc:
                if not response.head:
                    raise httpx.RemoteProtocolError(f"bad response head: {exc}", request=request) from None
                response.error = str(exc)         # the body's: raised where the body is read
            except _AfterTheEnd:
                conn.reusable = False
            if len(response.headers) > 1000 or (not response.head and conn.received > _MAX_HEAD):
                raise httpx.RemoteProtocolError("response head too large", request=request)
        return response, stamp

    async def whole(self, request: httpx.Request) -> httpx.Response:
        """A plain request's response with its whole body read (decoded as httpx decodes it)."""
        response = await self.handle_async_request(request)
        try:
            body = b"".join([part async for part in response.stream])
        finally:
            await response.stream.aclose()
        return httpx.Response(response.status_code, headers=response.headers, content=body, request=request,
                              extensions=response.extensions)

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
    """The response body as llhttp de-frames it (chunked, content-length or closed by the server),
    one block per network read, or gathered (next_block); clock.arrived is the arrival of the (last)
    read a block came from. A framing error (a chunk size the grammar forbids, a body cut short) is
    httpx.RemoteProtocolError."""

    def __init__(self, pool: StreamingTransport, conn: _Connection, key, request: httpx.Request,
                 response: _Response, stamp: int, clock: _Clock, timeout: float | None):
        self.pool, self.conn, self.key, self.request = pool, conn, key, request
        self.response = response
        self.clock, self.timeout = clock, timeout
        self.stamp = stamp                # arrival of the last read parsed (at first: the one that completed the head)
        self.released = False
        self.done = False
        self.eof = False                  # the server closed the connection
        self.hold_until = 0               # gathering: a read arriving at or after this releases the block

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (block := await self.next_block()) is not None:
            yield block

    async def next_block(self, hold_until: int | None = None) -> bytes | None:
        """The body's next block; None at its end. Without hold_until: what one network read brought, as it
        comes. With it (perf_counter_ns): the reads gathered, from the event loop's read callback (the task is
        not woken per read), until the body ends or a read arrives at or after hold_until; clock.arrived is
        the last one's arrival."""
        conn, response = self.conn, self.response
        parts = response.body
        while True:
            if parts and (hold_until is None or response.complete or response.error is not None or self.eof
                          or self.stamp >= hold_until):
                self.clock.arrived = self.stamp
                block = parts[0] if len(parts) == 1 else b"".join(parts)
                parts.clear()
                return block
            if response.error is not None:
                raise httpx.RemoteProtocolError(self._broken(f"bad HTTP framing: {response.error}"),
                                                request=self.request)
            if response.complete:
                self.done = True
                return None
            if self.eof:
                if conn.error is None and response.close_delimited():
                    conn.reusable = False           # the close was the end of the body
                    self.done = True
                    return None
                why = conn.lost_reason() if conn.error is not None else \
                    "peer closed connection without sending complete message body"
                raise httpx.RemoteProtocolError(self._broken(why), request=self.request)
            try:
                if hold_until is None or conn.pieces:
                    piece = await conn.next_piece(self.timeout)
                    if piece is None:
                        self.eof = True
                    else:
                        self._take(piece[0], piece[1])
                else:
                    self.hold_until = hold_until
                    await conn.gather(self._take, self.timeout)
                    if conn.closed and not conn.pieces:
                        self.eof = True
            except TimeoutError:
                raise httpx.ReadTimeout(f"no data for {self.timeout:g} s in the middle of the answer",
                                        request=self.request) from None

    def _take(self, data: bytes, stamp: int) -> bool:
        """One read through llhttp; True when the block is to be released (the body ended, a framing error,
        or the read came at or after hold_until; next_block checks the same after a read it waited for)."""
        self.stamp = stamp
        response = self.response
        try:
            response.feed(data)
        except _FramingError as exc:
            response.error = str(exc)
            return True
        except _AfterTheEnd:
            self.conn.reusable = False
        return response.complete or stamp >= self.hold_until

    def _broken(self, why: str) -> str:
        return f"{why} ({self.conn.received} bytes received)"

    async def aclose(self) -> None:
        if self.released:
            return
        self.released = True
        reusable = self.done and self.conn.reusable and self.response.keep_alive
        self.response.release()
        self.pool._release(self.conn, self.key, reusable)
