"""Streaming OpenAI-compatible client with per-dialect cache reporting.

Time to first token is stamped with perf_counter_ns when the bytes arrive, before any
parsing: the client must never add its own latency to what it measures.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

import httpx
import orjson

from .errors import ServerProblem

DIALECTS = ("vllm", "llamacpp", "sglang", "openai")
API_KEY_ENV = "HITPROOF_API_KEY"


@dataclass
class RequestSpec:
    api: str                                  # "completions" | "chat"
    max_tokens: int
    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    temperature: float = 0.0
    seed: int | None = None
    salt: str | None = None                   # a fresh salt forces a cold request
    stop: list[str] | None = None
    model: str = ""
    logprobs: int | None = None               # top-k log-probabilities per output token
    tools: list[dict] | None = None           # chat tool schemas, sent as given

    def prompt_chars(self) -> int:
        if self.prompt is not None:
            return len(self.prompt)
        return sum(len(m.get("content", "")) for m in self.messages or [])


@dataclass
class Completion:
    text: str = ""
    prompt_tokens: int | None = None
    cached_tokens: int | None = None          # None: the server did not say (unknown, not zero)
    completion_tokens: int | None = None
    finish_reason: str | None = None
    ttft_s: float | None = None               # request sent -> first bytes carrying text
    first_byte_s: float | None = None
    total_s: float = 0.0
    chunks: int = 0
    raw_usage: dict[str, Any] = field(default_factory=dict)
    # per output token: [token, logprob, [[alternative, logprob], ...]] when logprobs were asked for
    logprobs: list[list] = field(default_factory=list)


class StreamError(ServerProblem):
    """A broken stream: malformed chunk, error event, or a connection cut mid-answer."""


class _Unanswered(Exception):
    """The connection closed before any response: the request was never served."""


def _cached_tokens(usage: dict | None, timings: dict | None) -> int | None:
    if usage:
        details = usage.get("prompt_tokens_details") or {}
        if isinstance(details, dict) and details.get("cached_tokens") is not None:
            return int(details["cached_tokens"])
    if timings and timings.get("cache_n") is not None:        # llama.cpp
        return int(timings["cache_n"])
    return None


class OpenAIClient:
    """One connection pool for the whole run; limits raised so the pool never throttles slots."""

    def __init__(self, base_url: str, *, dialect: str = "vllm", timeout: float = 600.0,
                 api_key_env: str = API_KEY_ENV, max_connections: int = 1024):
        self.base_url = base_url.rstrip("/")
        self.dialect = dialect
        key = os.environ.get(api_key_env) or os.environ.get("OPENAI_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        # Answer streams to a plain-http server go through _StreamingTransport (one pass over each
        # network read, arrival stamped in data_received); everything else is httpx's own transport.
        origin = _direct_http_origin(self.base_url)
        mounts = {origin: _StreamingTransport(httpx.AsyncHTTPTransport(limits=limits), max_connections)} \
            if origin else None
        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=headers,
            timeout=httpx.Timeout(timeout, connect=10.0), limits=limits, mounts=mounts,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    # --- plain endpoints -----------------------------------------------------------

    async def _request(self, method: str, path: str, **kwargs) -> httpx.Response:
        """One plain request; a kept-alive connection the server already closed is retried once."""
        for attempt in (1, 2):
            try:
                return await self._http.request(method, path, **kwargs)
            except httpx.RemoteProtocolError as exc:
                if attempt == 2:
                    raise ServerProblem(f"cannot reach {self.base_url}{path}: {_describe(exc)}") from None
            except httpx.HTTPError as exc:
                raise ServerProblem(f"cannot reach {self.base_url}{path}: {_describe(exc)}") from None
        raise AssertionError("unreachable")

    async def get(self, path: str, timeout: float = 10.0) -> httpx.Response:
        return await self._request("GET", path, timeout=timeout)

    async def get_json(self, path: str) -> Any | None:
        """JSON body of a GET, or None when the endpoint is absent or not JSON."""
        response = await self.get(path)
        if response.status_code != 200:
            return None
        try:
            return response.json()
        except ValueError:
            return None

    async def tokenize(self, text: str, model: str) -> int | None:
        """Prompt token count with the server's tokenizer (vLLM and llama.cpp schemas); None if absent."""
        attempts = [{"model": model, "prompt": text}, {"content": text, "add_special": True}]
        if self.dialect == "llamacpp":
            attempts.reverse()
        for body in attempts:
            response = await self._request("POST", "/tokenize", json=body, timeout=60.0)
            if response.status_code == 200:
                data = response.json()
                if isinstance(data.get("count"), int):
                    return data["count"]
                if isinstance(data.get("tokens"), list):
                    return len(data["tokens"])
        return None

    # --- generation ------------------------------------------------------------------

    def body(self, spec: RequestSpec) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": spec.model,
            "max_tokens": spec.max_tokens,
            "temperature": spec.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if spec.api == "chat":
            body["messages"] = spec.messages
            if spec.tools:
                body["tools"] = spec.tools
        else:
            body["prompt"] = spec.prompt
        if spec.seed is not None:
            body["seed"] = spec.seed
        if spec.stop:
            body["stop"] = spec.stop
        if spec.logprobs:
            if spec.api == "chat":
                body["logprobs"] = True
                body["top_logprobs"] = spec.logprobs
            else:
                body["logprobs"] = spec.logprobs
        if spec.salt is not None:
            if self.dialect == "llamacpp":
                body["cache_prompt"] = False      # llama.cpp has no salt: refuse reuse instead
            else:
                body["cache_salt"] = spec.salt
        return body

    async def stream(self, spec: RequestSpec, on_text: Callable[[str], None] | None = None) -> Completion:
        try:
            return await self._stream(spec, on_text)
        except _Unanswered:
            # A kept-alive connection the server had already closed (llama-server closes idle
            # ones after 5 s): nothing was sent back, so the request never ran. Send it once more.
            return await self._stream(spec, on_text)

    async def _stream(self, spec: RequestSpec, on_text: Callable[[str], None] | None = None) -> Completion:
        path = "/v1/chat/completions" if spec.api == "chat" else "/v1/completions"
        result = Completion()
        chat = spec.api == "chat"
        content = _json_bytes(self.body(spec))
        started = time.perf_counter_ns()
        buffer = b""
        parts: list[str] = []
        answered = False
        absorb = self._absorb
        try:
            async with self._http.stream("POST", path, content=content, headers=_JSON_HEADERS,
                                         extensions=_STREAM_EXTENSIONS) as response:
                answered = True
                # the streaming transport stamps when the request went on the wire and when each
                # network read arrived (before any parsing); other transports: stamped here
                clock = response.extensions.get(_CLOCK)
                if clock is not None:
                    started = clock.sent
                if response.status_code >= 400:
                    detail = (await response.aread()).decode("utf-8", "replace")
                    raise ServerProblem(f"HTTP {response.status_code} from {path}: {_error_text(detail)}")
                async for raw in response.aiter_raw():
                    arrived = clock.arrived if clock is not None else time.perf_counter_ns()
                    if result.first_byte_s is None:
                        result.first_byte_s = (arrived - started) / 1e9
                    if buffer:
                        raw = buffer + raw
                    lines = raw.split(b"\n")
                    buffer = lines.pop()
                    texts = []
                    for line in lines:
                        if not line.startswith(b"data:"):
                            continue
                        payload = line[5:].strip()
                        if payload == b"[DONE]":
                            continue
                        text = absorb(payload, result, chat)
                        if text:
                            texts.append(text)
                    if texts:
                        if result.ttft_s is None:
                            result.ttft_s = (arrived - started) / 1e9
                        text = texts[0] if len(texts) == 1 else "".join(texts)
                        parts.append(text)
                        if on_text is not None:
                            on_text(text)             # once per network read, not once per token
        except httpx.RemoteProtocolError as exc:
            if result.first_byte_s is None and not answered:
                raise _Unanswered() from None
            raise StreamError(f"stream from {path} broke: {_describe(exc)}") from None
        except httpx.HTTPError as exc:
            raise StreamError(f"stream from {path} broke: {_describe(exc)}") from None
        result.text = "".join(parts)
        if buffer.strip().startswith(b"data:") and buffer.strip()[5:].strip() != b"[DONE]":
            absorb(buffer.strip()[5:].strip(), result, chat)
        result.total_s = (time.perf_counter_ns() - started) / 1e9
        if result.finish_reason is None and result.chunks == 0:
            raise StreamError(f"stream from {path} ended without any chunk")
        return result

    @staticmethod
    def _absorb(payload: bytes, result: Completion, chat: bool) -> str:
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            raise StreamError(f"malformed stream chunk: {payload[:80].decode('utf-8', 'replace')!r}") from None
        if not isinstance(chunk, dict):
            raise StreamError(f"malformed stream chunk: {payload[:80].decode('utf-8', 'replace')!r}")
        if "error" in chunk:
            raise StreamError(f"server error in stream: {_error_text(json.dumps(chunk['error']))}")
        result.chunks += 1
        usage = chunk.get("usage")
        timings = chunk.get("timings")
        if usage or timings:
            cached = _cached_tokens(usage, timings)
            if cached is not None:
                result.cached_tokens = cached
            if usage:
                result.raw_usage = usage
                result.prompt_tokens = usage.get("prompt_tokens", result.prompt_tokens)
                result.completion_tokens = usage.get("completion_tokens", result.completion_tokens)
            if timings and result.prompt_tokens is None and timings.get("prompt_n") is not None:
                result.prompt_tokens = int(timings["prompt_n"]) + int(timings.get("cache_n") or 0)
        choices = chunk.get("choices")
        if not choices:
            return ""
        if len(choices) == 1:                       # the usual chunk: one choice, a few characters
            choice = choices[0]
            if chat:
                text = (choice.get("delta") or {}).get("content") or ""
            else:
                text = choice.get("text") or ""
            if choice.get("logprobs"):
                result.logprobs.extend(parse_logprobs(choice["logprobs"]))
            if choice.get("finish_reason"):
                result.finish_reason = choice["finish_reason"]
            return text
        text = ""
        for choice in choices:
            if chat:
                text += (choice.get("delta") or {}).get("content") or ""
            else:
                text += choice.get("text") or ""
            if choice.get("logprobs"):
                result.logprobs.extend(parse_logprobs(choice["logprobs"]))
            if choice.get("finish_reason"):
                result.finish_reason = choice["finish_reason"]
        return text


def parse_logprobs(data: dict) -> list[list]:
    """Both shapes servers use: OpenAI chat / llama.cpp (`content` entries with `top_logprobs`)
    and legacy completions / vLLM (`tokens`, `token_logprobs`, `top_logprobs` dicts)."""
    out = []
    if isinstance(data.get("content"), list):
        # llama.cpp gives token ids: byte tokens often have an empty or replacement-char text
        for entry in data["content"]:
            top = [[alt.get("id", alt.get("token", "")), alt.get("logprob")] for alt in entry.get("top_logprobs") or []]
            out.append([entry.get("id", entry.get("token", "")), entry.get("logprob"), top])
        return out
    tokens = data.get("tokens") or []
    values = data.get("token_logprobs") or []
    tops = data.get("top_logprobs") or []
    for i, token in enumerate(tokens):
        top = tops[i] if i < len(tops) and isinstance(tops[i], dict) else {}
        out.append([token, values[i] if i < len(values) else None, [[k, v] for k, v in top.items()]])
    return out


def _describe(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())[:200]


def _error_text(body: str) -> str:
    try:
        data = json.loads(body)
        if isinstance(data, dict):
            error = data.get("error", data)
            if isinstance(error, dict):
                return str(error.get("message") or error)[:200]
            return str(error)[:200]
    except ValueError:
        pass
    return " ".join(body.split())[:200] or "(empty body)"


def _json_bytes(body: dict[str, Any]) -> bytes:
    """The request body as httpx's json= would send it (compact, UTF-8), encoded by orjson."""
    try:
        return orjson.dumps(body)
    except TypeError:
        return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


# --- the answer-stream transport ------------------------------------------------------------------
#
# httpx parses a response through h11 one HTTP chunk at a time, and servers send one chunk per
# token: at tens of thousands of tokens a second that parsing, not the server, sets the pace. This
# transport serves only the answer streams (requests marked with _SSE) to a plain-http origin with
# no proxy in the way: one asyncio.Protocol per connection, kept alive in a small pool; the body
# is de-chunked a whole network read at a time, and each read is stamped with perf_counter_ns in
# data_received, before anything looks at it. Every other request goes to httpx's own transport.

_SSE = "hitproof.sse"
_CLOCK = "hitproof.clock"
_STREAM_EXTENSIONS = {_SSE: True}
_JSON_HEADERS = {"Content-Type": "application/json"}
_KEEPALIVE_EXPIRY = 5.0           # seconds an idle connection is reused (httpx's default)
_READ_HIGH_WATER = 4 << 20        # bytes buffered unread before the socket stops being read


def _direct_http_origin(base_url: str) -> str | None:
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


class _Connection(asyncio.Protocol):
    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.pieces: collections.deque[tuple[bytes, int]] = collections.deque()
        self.buffered = 0
        self.closed = False
        self.paused = False
        self.waiter: asyncio.Future | None = None
        self.idle_since = 0.0

    # protocol callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.pieces.append((data, time.perf_counter_ns()))      # stamped on arrival
        self.buffered += len(data)
        if self.buffered > _READ_HIGH_WATER and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def eof_received(self) -> bool:
        self.closed = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # reading
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
        if self.paused and self.buffered < _READ_HIGH_WATER // 4:
            self.paused = False
            self.transport.resume_reading()
        return piece

    def usable(self, now: float) -> bool:
        return (not self.closed and not self.pieces and self.transport is not None
                and not self.transport.is_closing() and now - self.idle_since <= _KEEPALIVE_EXPIRY)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def _expire(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class _StreamingTransport(httpx.AsyncBaseTransport):
    def __init__(self, inner: httpx.AsyncBaseTransport, max_connections: int):
        self.inner = inner
        self.max_connections = max_connections
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._slots: asyncio.Semaphore | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if not request.extensions.get(_SSE) or request.url.scheme != "http" \
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
            clock.sent = time.perf_counter_ns()
            conn.transport.write(b"".join(head))
            status, reason, headers, version, leftover = await self._read_head(conn, request, timeouts.get("read"))
        except BaseException:
            self._release(conn, key, False)
            raise
        body = _Body(self, conn, key, request, status, headers, version, leftover, clock, timeouts.get("read"))
        return httpx.Response(status, headers=headers, stream=body,
                              extensions={"http_version": version, "reason_phrase": reason, _CLOCK: clock})

    async def _connection(self, loop, key, request, timeout) -> _Connection:
        idle = self._idle.get(key)
        now = loop.time()
        while idle:
            conn = idle.pop()
            if conn.usable(now):
                return conn
            conn.close()
        try:
            _, conn = await asyncio.wait_for(loop.create_connection(lambda: _Connection(loop), key[0], key[1]),
                                             timeout)
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

    def __init__(self, pool: _StreamingTransport, conn: _Connection, key, request: httpx.Request, status: int,
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
