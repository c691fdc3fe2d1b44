"""Streaming OpenAI-compatible client with per-dialect cache reporting.

Time to first token is stamped with perf_counter_ns when the bytes arrive, before any
parsing: the client must never add its own latency to what it measures.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import sys
import time
from typing import Any, Awaitable, Callable, TypeVar

import httpx
import orjson

from ..config.errors import ServerProblem
from .answer import TEXT_EVERY_NS, AnswerReader, StreamError
from .wire import (MAX_RETRIES, RETRY_CAP, RETRY_STATUSES, Completion, RequestSpec,  # noqa: F401
                   _describe, _error_text, _json_bytes, retry_delay)
from .transport import (CLOCK, FRESH_STREAM_EXTENSIONS, JSON_HEADERS, NO_SELECTOR, SSE, STREAM_EXTENSIONS,
                        StreamingTransport, direct_http_origin)
from .direct import REQUEST_ID_HEADER, DirectStream, StreamHead, plain_request_id

TIMEOUT_KEYS = ("connect", "read", "write", "pool")
T = TypeVar("T")

# httpcore asks for sniffio on every plain request (current_async_library) and, where it is not installed,
# searches the whole import path for it each time: 0.15 ms of a 1 ms request here (tokenize, metrics). Said
# absent once, `import sniffio` fails at once, as it would have anyway.
if "sniffio" not in sys.modules and importlib.util.find_spec("sniffio") is None:
    sys.modules["sniffio"] = None

DIALECTS = ("vllm", "llamacpp", "sglang", "openai")
API_KEY_ENV = "HITPROOF_API_KEY"


_LEADING_COUNT = re.compile(rb'\{\s*"count"\s*:\s*(\d+)\s*[,}]')


def leading_count(body: bytes) -> int | None:
    """The count of a /tokenize answer whose first member is "count" (vLLM's: {"count": N, "max_model_len":
    ..., "tokens": [N ids]}), read without parsing its token ids (a 1,200-token memo's answer is 8-17 KB: 73 us
    in orjson); None for any other body (parsed whole instead)."""
    found = _LEADING_COUNT.match(body)
    return int(found.group(1)) if found is not None and body.rstrip().endswith(b"}") else None


class _HTTPStatus(ServerProblem):
    """An HTTP error status; 429 and 503 are retried (see OpenAIClient.stream)."""

    def __init__(self, status: int, retry_after: str | None, message: str):
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


class _Unanswered(Exception):
    """The connection closed before any response: the request was never served."""


def api_key(env: str = API_KEY_ENV) -> str | None:
    """The server's API key, when it needs one: $HITPROOF_API_KEY, else $OPENAI_API_KEY. It goes in
    the Authorization header only, never in a log, a report or the incident record."""
    return os.environ.get(env) or os.environ.get("OPENAI_API_KEY") or None


class OpenAIClient:
    """One connection pool for the whole run; limits raised so the pool never throttles slots."""

    def __init__(self, base_url: str, *, dialect: str = "vllm", timeout: float = 600.0,
                 api_key_env: str = API_KEY_ENV, max_connections: int = 1024, max_retries: int = MAX_RETRIES,
                 retry_cap: float = RETRY_CAP):
        self.base_url = base_url.rstrip("/")
        self.max_retries = max_retries
        self.retry_cap = retry_cap
        self.retries: list[tuple[int, float]] = []    # (status, seconds waited) of every retry, in order
        self.dialect = dialect
        key = api_key(api_key_env)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        # Answer streams to a plain-http server go through StreamingTransport (one pass over each
        # network read, arrival stamped in data_received); everything else is httpx's own transport.
        origin = direct_http_origin(self.base_url)
        mounts = {origin: StreamingTransport(httpx.AsyncHTTPTransport(limits=limits), max_connections)} \
            if origin else None
        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=headers,
            timeout=httpx.Timeout(timeout, connect=10.0), limits=limits, mounts=mounts,
        )
        # URLs joined to base_url once (httpx would parse them per request): the two answer endpoints, then
        # each plain path as it is first asked for
        self._urls = {path: self._http.build_request("POST", path).url
                      for path in ("/v1/completions", "/v1/chat/completions")}
        # To a plain-http origin every request goes to StreamingTransport directly, past httpx's client
        # (its cookie jar, auth and redirect layers and httpcore's pool, scanned per request: 0.92 s of
        # 3.9 s of CPU in a 1,204-request soak on the reference server, 2026-12-05; CPU per request 1.40 ->
        # 1.07 ms); the headers are the ones httpx would send. Elsewhere (https, a proxy) httpx's client.
        self._direct = mounts[origin] if mounts and not NO_SELECTOR else None
        self._headers = httpx.Headers(self._http.headers)
        self._json_headers = httpx.Headers(self._http.headers)
        self._json_headers.update(JSON_HEADERS)
        self._stream_timeouts = {**dict.fromkeys(TIMEOUT_KEYS, timeout), "connect": 10.0}
        # the answer requests' heads, built once (direct.py): the bytes httpx would send
        self._heads = {path: StreamHead(url, self._json_headers) for path, url in self._urls.items()} \
            if self._direct is not None else {}

    def use_http(self, http: httpx.AsyncClient) -> None:
        """Send every request through `http` (a test's mock transport), none past it."""
        self._http, self._direct = http, None

    async def aclose(self) -> None:
        await self._http.aclose()

    # --- plain endpoints -----------------------------------------------------------

    async def _request(self, method: str, path: str, **kwargs) -> httpx.Response:
        """One plain request, sent once more where a kept-alive connection gave no answer (_twice)."""
        if self._direct is not None:
            return await self._twice(path, lambda: self._direct_request(method, path, **kwargs))
        return await self._twice(path, lambda: self._http.request(method, path, **kwargs))

    async def _twice(self, path: str, send: Callable[[], Awaitable[T]]) -> T:
        """send(), and once more where a kept-alive connection the server already closed or reset gave no
        answer; any other failure, or a second one, is one line. Measured, vLLM 0.26 on an H200: 128 memos sized
        at once through /tokenize, one read got a reset connection (httpx.ReadError) and the run ended ERROR
        (exit 3) in 1 of 5 soaks (2026-12-04)."""
        for attempt in (1, 2):
            try:
                return await send()
            except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
                if attempt == 2:
                    raise ServerProblem(f"cannot reach {self.base_url}{path}: {_describe(exc)}") from None
            except httpx.HTTPError as exc:
                raise ServerProblem(f"cannot reach {self.base_url}{path}: {_describe(exc)}") from None
        raise AssertionError("unreachable")

    async def _direct_request(self, method: str, path: str, *, timeout: float, json: Any = None) -> httpx.Response:
        """What self._http.request gives (status, headers, the whole body decoded), through StreamingTransport."""
        content = None if json is None else _json_bytes(json)
        url = self._urls.get(path)
        if url is None:             # joined as httpx joins it (a base URL's own path kept in front)
            url = self._urls[path] = self._http.build_request(method, path).url
        request = httpx.Request(method, url, content=content,
                                headers=self._headers if content is None else self._json_headers,
                                extensions={SSE: True, "timeout": dict.fromkeys(TIMEOUT_KEYS, timeout)})
        return await self._direct.whole(request)

    async def post_for_bytes(self, path: str, body: dict[str, Any], timeout: float = 60.0) -> tuple[int, bytes]:
        """(status, the whole body) of a JSON POST. To a plain-http origin straight through StreamingTransport,
        its head built once per path as the answer streams' are (direct.py): httpx's Request and two
        Responses cost more than the rest of a /tokenize round trip, and a wide rotation sizes hundreds of
        memos (770 counts in a 1,716-request soak at 128 streams, 2026-12-07). Sent once more as _request is."""
        if self._direct is None:
            response = await self._request("POST", path, json=body, timeout=timeout)
            return response.status_code, response.content
        head = self._heads.get(path)
        if head is None:
            head = self._heads[path] = StreamHead(self._http.build_request("POST", path).url, self._json_headers)
        data = head.request(_json_bytes(body), None)
        timeouts = dict.fromkeys(TIMEOUT_KEYS, timeout)

        async def send() -> tuple[int, bytes]:
            async with DirectStream(self._direct, head, data, timeouts, False) as answer:
                return answer.status_code, await answer.aread()
        return await self._twice(path, send)

    def _open_stream(self, path: str, content: bytes, fresh: bool, request_id: str | None = None):
        """The answer stream's response, as a context that gives its connection back."""
        if self._direct is not None and plain_request_id(request_id):
            return DirectStream(self._direct, self._heads[path], self._heads[path].request(content, request_id),
                                self._stream_timeouts, fresh)
        extensions = FRESH_STREAM_EXTENSIONS if fresh else STREAM_EXTENSIONS
        headers = JSON_HEADERS if request_id is None else {**JSON_HEADERS, REQUEST_ID_HEADER: request_id}
        return self._http.stream("POST", self._urls[path], content=content, headers=headers, extensions=extensions)

    async def get(self, path: str, timeout: float = 10.0) -> httpx.Response:
        return await self._request("GET", path, timeout=timeout)

    async def post_json(self, path: str, body: dict[str, Any], timeout: float = 60.0) -> httpx.Response:
        return await self._request("POST", path, json=body, timeout=timeout)

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
            status, content = await self.post_for_bytes("/tokenize", body, timeout=60.0)
            if status == 200:
                count = leading_count(content)
                if count is not None:
                    return count
                try:        # orjson: httpx's .json() finds the charset through email.message, per memo count
                    data = orjson.loads(content)
                except orjson.JSONDecodeError:
                    continue
                if not isinstance(data, dict):
                    continue
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
        if spec.slot_id is not None:
            body["id_slot"] = spec.slot_id        # llama.cpp pins the request to that slot
        if spec.extra:
            body.update(spec.extra)
        if spec.salt is not None:
            if self.dialect == "llamacpp":
                body["cache_prompt"] = False      # llama.cpp has no salt: refuse reuse instead
            else:
                body["cache_salt"] = spec.salt
        return body

    async def stream(self, spec: RequestSpec, on_text: Callable[[str], None] | None = None,
                     text_every: float = TEXT_EVERY_NS / 1e9) -> Completion:
        """One answer; `on_text` gets its text as it streams, at most every `text_every` seconds. A server
        that refuses it for now (HTTP 429 or 503) is asked again after the delay its Retry-After gives
        (else 1, 2, 4 ... s), each delay capped at retry_cap, at most max_retries times; then it is a
        ServerProblem."""
        waited: list[float] = []
        while True:
            try:
                try:
                    return await self._stream(spec, on_text, text_every=text_every)
                except _Unanswered:
                    # A kept-alive connection the server had already closed (llama-server closes idle
                    # ones after 5 s): nothing was sent back, so the request never ran. Send it once more.
                    try:
                        return await self._stream(spec, on_text, fresh=True, text_every=text_every)
                    except _Unanswered as again:
                        raise StreamError(f"{again} (twice: the request was sent again on a new connection)") \
                            from None
            except _HTTPStatus as exc:
                if exc.status not in RETRY_STATUSES:
                    raise ServerProblem(str(exc)) from None
                if len(waited) >= self.max_retries:
                    raise ServerProblem(f"{exc}; still refused after {len(waited)} retries over "
                                        f"{sum(waited):.0f} s") from None
                delay = retry_delay(exc.retry_after, len(waited), self.retry_cap)
                waited.append(delay)
                self.retries.append((exc.status, delay))
                await asyncio.sleep(delay)

    async def _stream(self, spec: RequestSpec, on_text: Callable[[str], None] | None = None,
                      fresh: bool = False, text_every: float = TEXT_EVERY_NS / 1e9) -> Completion:
        path = "/v1/chat/completions" if spec.api == "chat" else "/v1/completions"
        result = Completion()
        content = _json_bytes(self.body(spec))
        started = time.perf_counter_ns()
        reader = AnswerReader(result, spec.api == "chat", on_text, int(text_every * 1e9))
        feed = reader.feed
        answered = False
        try:
            async with self._open_stream(path, content, fresh, spec.request_id) as response:
                answered = True
                result.headers = dict(response.headers)
                # the streaming transport stamps when the request went on the wire and when each
                # network read arrived (before any parsing); other transports: stamped here
                clock = response.extensions.get(CLOCK)
                if clock is not None:
                    started = clock.sent
                if response.status_code >= 400:
                    detail = (await response.aread()).decode("utf-8", "replace")
                    raise _HTTPStatus(response.status_code, response.headers.get("retry-after"),
                                      f"HTTP {response.status_code} from {path}: {_error_text(detail)}")
                if clock is not None:
                    # our transport's body raises httpx's own errors: read directly, without httpx's per-read
                    # wrapping; read by read until the first text, then gathered until the live text is due
                    body = response.stream
                    raw = await body.next_block()
                    while raw is not None:
                        feed(raw, clock.arrived, started)
                        raw = await body.next_block(reader.hold_until())
                else:
                    async for raw in response.aiter_raw():
                        feed(raw, time.perf_counter_ns(), started)
                reader.finish()
        except (httpx.RemoteProtocolError, httpx.WriteError) as exc:
            if result.first_byte_s is None and not answered:
                raise _Unanswered(f"no answer from {path}: {_describe(exc)}") from None
            raise StreamError(f"stream from {path} broke: {_describe(exc)}") from None
        except httpx.TimeoutException as exc:
            raise StreamError(f"stream from {path} timed out: {_describe(exc)}") from None
        except httpx.HTTPError as exc:
            raise StreamError(f"stream from {path} broke: {_describe(exc)}") from None
        result.total_s = (time.perf_counter_ns() - started) / 1e9
        if result.finish_reason is None and result.chunks == 0:
            raise StreamError(f"stream from {path} ended without any chunk")
        if not reader.done:
            # vLLM, llama.cpp and SGLang all end a stream with data: [DONE]. Without it, an answer
            # that has its finish_reason is complete (its text and usage came): it is judged, with a
            # note. One without a finish_reason was cut short: judging it would blame the cache
            # for a missing ending, so it is a broken stream.
            if result.finish_reason is None:
                raise StreamError(f"stream from {path} ended without [DONE] and without a finish_reason, "
                                  f"after {result.chunks} chunks (cut short?)")
            result.notes.append("the stream ended without data: [DONE] (after its finish_reason)")
        return result
