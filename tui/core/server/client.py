"""Streaming OpenAI-compatible client with per-dialect cache reporting.

Time to first token is stamped with perf_counter_ns when the bytes arrive, before any
parsing: the client must never add its own latency to what it measures.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import httpx
import orjson

from ..config.errors import ServerProblem
from .transport import CLOCK, JSON_HEADERS, STREAM_EXTENSIONS, StreamingTransport, direct_http_origin

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


def api_key(env: str = API_KEY_ENV) -> str | None:
    """The server's API key, when it needs one: $HITPROOF_API_KEY, else $OPENAI_API_KEY. It goes in
    the Authorization header only, never in a log, a report or the incident record."""
    return os.environ.get(env) or os.environ.get("OPENAI_API_KEY") or None


class OpenAIClient:
    """One connection pool for the whole run; limits raised so the pool never throttles slots."""

    def __init__(self, base_url: str, *, dialect: str = "vllm", timeout: float = 600.0,
                 api_key_env: str = API_KEY_ENV, max_connections: int = 1024):
        self.base_url = base_url.rstrip("/")
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
            async with self._http.stream("POST", path, content=content, headers=JSON_HEADERS,
                                         extensions=STREAM_EXTENSIONS) as response:
                answered = True
                # the streaming transport stamps when the request went on the wire and when each
                # network read arrived (before any parsing); other transports: stamped here
                clock = response.extensions.get(CLOCK)
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
        except (httpx.RemoteProtocolError, httpx.WriteError) as exc:
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
