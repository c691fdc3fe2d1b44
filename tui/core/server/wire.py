"""What goes over the wire to an OpenAI-compatible server and what comes back, as plain data: a
request's spec, the completion it produced (text, usage, cached tokens by dialect, log-probabilities),
how long to wait before retrying a refusal, and the small text helpers for errors. No I/O."""

from __future__ import annotations

import datetime as dt
import email.utils
import json

from dataclasses import dataclass, field
from typing import Any

import orjson

RETRY_STATUSES = (429, 503)       # "too many requests", "unavailable": the server may take it later
MAX_RETRIES = 4
RETRY_CAP = 30.0                  # seconds: the longest wait for one retry, whatever Retry-After says


def retry_delay(header: str | None, attempt: int, cap: float) -> float:
    """Seconds to wait before retry number attempt+1: Retry-After as delay-seconds or an HTTP date
    (RFC 9110 10.2.3), else 1, 2, 4 ... s; never below 0 nor above cap."""
    delay = None
    if header:
        value = header.strip()
        if value.isdigit():
            delay = float(int(value))
        else:
            try:
                when = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError, IndexError, OverflowError):
                when = None
            if when is not None:
                if when.tzinfo is None:
                    when = when.replace(tzinfo=dt.timezone.utc)
                delay = (when - dt.datetime.now(dt.timezone.utc)).total_seconds()
    if delay is None:
        delay = float(2 ** min(attempt, 16))
    return min(max(delay, 0.0), cap)


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
    slot_id: int | None = None                # llama.cpp: pin the request to this slot (id_slot)
    # More body fields, sent as given: what picks an identity other than the model name (a llama.cpp
    # `lora` list); see tui.core.server.adapters
    extra: dict[str, Any] | None = None
    # Sent as the X-Request-Id header: vLLM names the request after it in its own log lines and answer id
    # ("cmpl-<it>"), so a finding's request can be found in the server's log; other servers ignore it
    request_id: str | None = None

    def with_request_id(self, request_id: str) -> "RequestSpec":
        """A copy sent under its own id: dataclasses.replace, without re-running __init__ over every field
        (0.8 against 3.3 us, once a request; the spec has no __post_init__ to skip)."""
        copy = object.__new__(RequestSpec)
        copy.__dict__.update(self.__dict__)
        copy.request_id = request_id
        return copy

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
    notes: list[str] = field(default_factory=list)   # what was odd about the stream but tolerated
    model: str | None = None                  # the answer's own `model` field (a replica's alias names it)
    headers: dict[str, str] = field(default_factory=dict)   # the response's headers
    server_id: str | None = None              # the answer's own `id` field (what the server calls it)


def _cached_tokens(usage: dict | None, timings: dict | None) -> int | None:
    if usage:
        details = usage.get("prompt_tokens_details") or {}
        if isinstance(details, dict) and details.get("cached_tokens") is not None:
            return int(details["cached_tokens"])
    if timings and timings.get("cache_n") is not None:        # llama.cpp
        return int(timings["cache_n"])
    return None


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
    if len(tokens) == 1:        # a streamed chunk's one token (vLLM): the loop below, without the loop
        top = tops[0] if tops and isinstance(tops[0], dict) else {}
        return [[tokens[0], values[0] if values else None, [[k, v] for k, v in top.items()]]]
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
