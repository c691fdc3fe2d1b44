"""One answer stream's body, read into a Completion: server-sent events of OpenAI-compatible chunks.

The reads before the first text are parsed as they come: the time to first token is the arrival of the
first read that carries text. After it, reads are kept as bytes and parsed together: when the stream ends,
and at most every `every_ns` of arrivals for a listener that shows the text as it streams. A
server sends one chunk (one read) per token; parsing them one by one cost about 5 us a read in the
decoder's and the chunk reader's calls (issue 34: hitproof's CPU per request against a raw client's).
What is parsed, and every error it raises, is the same either way; an error in a later chunk is raised
when that chunk is parsed (by the stream's end at the latest).
"""

from __future__ import annotations

import json
from typing import Callable, Iterable, Iterator

import orjson

from ..config.errors import ServerProblem
from .sse import Event, SSEDecoder
from .wire import Completion, _cached_tokens, _error_text, parse_logprobs

TEXT_EVERY_NS = 100_000_000        # 0.1 s: the live text's pace in the app (the soak's answer deltas keep the same)
NEVER = 1 << 62                    # perf_counter_ns no run reaches


class StreamError(ServerProblem):
    """A broken stream: malformed chunk, error event, or a connection cut mid-answer."""


class AnswerReader:
    """feed(read, arrival ns) per network read, then finish(). `on_text` gets the text as it streams (the
    first text at once, then what came at most every `every_ns`); the text parsed at the end goes only
    into the Completion, whose `text` holds all of it."""

    __slots__ = ("result", "chat", "on_text", "every_ns", "decoder", "parts", "pending", "done", "texted")

    def __init__(self, result: Completion, chat: bool, on_text: Callable[[str], None] | None,
                 every_ns: int = TEXT_EVERY_NS):
        self.result = result
        self.chat = chat
        self.on_text = on_text
        self.every_ns = every_ns
        self.decoder = SSEDecoder()
        self.parts: list[str] = []
        self.pending: list[bytes] = []     # reads after the first text, not parsed yet
        self.done = False                  # data: [DONE] came
        self.texted = 0                    # arrival (ns) of the read whose text on_text last got

    def feed(self, raw: bytes, arrived: int, started: int) -> None:
        """One read (or gathered reads) that arrived at `arrived`, for a request sent at `started` (ns)."""
        result = self.result
        if result.first_byte_s is None:
            result.first_byte_s = (arrived - started) / 1e9
        if result.ttft_s is not None:
            self.pending.append(raw)
            if self.on_text is not None and arrived - self.texted >= self.every_ns:
                self._tell(self._parse(b"".join(self.pending)), arrived)
            return
        text = self._parse(raw)
        if text:
            result.ttft_s = (arrived - started) / 1e9
            self._tell(text, arrived)

    def hold_until(self) -> int | None:
        """Until when (perf_counter_ns) later reads may be gathered before they are handed over: None (each
        read as it comes) before the first text; then when the live text is next due, or never without a
        listener (the whole rest at the body's end)."""
        if self.result.ttft_s is None:
            return None
        return self.texted + self.every_ns if self.on_text is not None else NEVER

    def finish(self) -> None:
        """The body ended: what is left, and a last event without its blank line (see SSEDecoder.close)."""
        if self.pending:
            self.parts.append(self._parse(b"".join(self.pending)))
            self.pending.clear()
        self.parts.append(self._take(self.decoder.close()))
        self.result.text = "".join(self.parts)

    def _tell(self, text: str, arrived: int) -> None:
        self.pending.clear()
        if text:
            self.parts.append(text)
            if self.on_text is not None:
                self.texted = arrived
                self.on_text(text)

    def _parse(self, block: bytes) -> str:
        """The text of the events `block` completes, parsed into the Completion: the usual block (whole
        `data:` lines, SSEDecoder.plain_data) straight from its bytes, anything else through the decoder."""
        payloads = self.decoder.plain_data(block)
        return self._texts(self._messages(self.decoder.feed(block)) if payloads is None else payloads)

    def _take(self, events: list[Event]) -> str:
        return self._texts(self._messages(events))

    @staticmethod
    def _messages(events: list[Event]) -> Iterator[bytes]:
        """The data of the message events, in order (another event type: other_event, where it stands)."""
        for event in events:
            if event.event != "message":
                other_event(event)
                continue
            yield event.data.encode()

    def _texts(self, payloads: Iterable[bytes]) -> str:
        """Each message's data into the Completion; their text."""
        texts = []
        result, chat = self.result, self.chat
        for payload in payloads:
            if payload.startswith(b"[DONE]"):     # as openai-python reads it
                self.done = True
                continue
            try:
                chunk = orjson.loads(payload)
            except orjson.JSONDecodeError:        # as the decoder hands it over (bad UTF-8 replaced), or its error
                text = absorb(payload.decode("utf-8", "replace"), result, chat)
            else:
                text = absorb_chunk(chunk, payload, result, chat)
            if text:
                texts.append(text)
        return texts[0] if len(texts) == 1 else "".join(texts)


def other_event(event: Event) -> None:
    """An event whose type is not "message": an `error` event is the server's error; any other type
    is not for an OpenAI client (the standard: only listeners of that type see it) and is skipped."""
    if event.event == "error":
        raise StreamError(f"server error in stream: {_error_text(event.data)}")


def absorb(payload: str, result: Completion, chat: bool) -> str:
    """One chunk into the Completion; its text."""
    try:
        chunk = orjson.loads(payload)
    except orjson.JSONDecodeError:
        raise StreamError(f"malformed stream chunk: {payload[:80]!r}") from None
    return absorb_chunk(chunk, payload, result, chat)


def absorb_chunk(chunk, payload: str | bytes, result: Completion, chat: bool) -> str:
    """One parsed chunk into the Completion; its text. `payload`: the chunk as it came (errors quote it)."""
    if not isinstance(chunk, dict):
        if isinstance(payload, bytes):
            payload = payload.decode("utf-8", "replace")
        raise StreamError(f"malformed stream chunk: {payload[:80]!r}")
    if "error" in chunk:
        raise StreamError(f"server error in stream: {_error_text(json.dumps(chunk['error']))}")
    result.chunks += 1
    if result.model is None:
        if isinstance(chunk.get("model"), str):
            result.model = chunk["model"]
        if isinstance(chunk.get("id"), str):
            result.server_id = chunk["id"]
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
        logprobs = choice.get("logprobs")
        if logprobs:
            result.logprobs.extend(parse_logprobs(logprobs))
        finish = choice.get("finish_reason")
        if finish:
            result.finish_reason = finish
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
