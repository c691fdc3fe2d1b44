"""Reading OpenAI-style request bodies into one plain ``Params`` (400 on anything bad).

Chat requests are flattened to a transcript the model reads like a completion prompt:
``Tools: <json>\\n`` (when tools are given), then one ``System: ...``, ``User: ...``,
``Assistant: ...`` or ``Tool: ...`` line per message, ending with ``Assistant:``.

Defaults: ``max_tokens`` 16 for completions (vLLM's default), 256 for chat (capped so a
continuation cannot run for minutes).  ``temperature``, ``top_p`` and ``seed`` are
validated and accepted but decoding is always greedy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .tokenizer import detokenize

ROLES = {"system": "System", "developer": "System", "user": "User",
         "assistant": "Assistant", "tool": "Tool", "function": "Tool"}


class BadRequest(ValueError):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Params:
    prompt_text: str
    max_tokens: int
    stop: list[str]
    stream: bool
    include_usage: bool
    cache_salt: str
    logprobs: int | None  # number of top log-probabilities per token, None = off
    chat: bool


def load_json(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"Invalid JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    return body


def _int(body: dict, name: str, low: int, high: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        raise BadRequest(f"{name} must be an integer >= {low}" + (f" and <= {high}" if high else ""), name)
    return value


def _common(body: dict, prompt_text: str, chat: bool, default_max: int) -> Params:
    max_tokens = _int(body, "max_completion_tokens", 1) if chat else None
    max_tokens = max_tokens or _int(body, "max_tokens", 1) or default_max
    for name in ("temperature", "top_p"):
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise BadRequest(f"{name} must be a non-negative number", name)
    _int(body, "seed", -(2**63))
    if body.get("n", 1) != 1:
        raise BadRequest("only n=1 is supported", "n")
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise BadRequest("cache_salt must be a non-empty string", "cache_salt")
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else (stop or [])
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise BadRequest("stop must be a string or a list of strings", "stop")
    stream = body.get("stream", False)
    options = body.get("stream_options") or {}
    if not isinstance(stream, bool) or not isinstance(options, dict):
        raise BadRequest("stream must be a boolean and stream_options an object", "stream")
    if chat:
        top = _int(body, "top_logprobs", 0, 20)
        logprobs = (top or 0) if body.get("logprobs") else None
    else:
        logprobs = _int(body, "logprobs", 0, 20)
    return Params(prompt_text, max_tokens, stops, stream, bool(options.get("include_usage")),
                  salt or "", logprobs, chat)


def parse_completion(body: dict[str, Any]) -> Params:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    elif isinstance(prompt, list) and prompt and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt):
        prompt = detokenize(prompt)  # ids from our own /tokenize map back to their text
    if not isinstance(prompt, str) or not prompt:
        raise BadRequest("prompt must be a non-empty string", "prompt")
    return _common(body, prompt, chat=False, default_max=16)


def parse_chat(body: dict[str, Any]) -> Params:
    return _common(body, flatten_chat(body.get("messages"), body.get("tools")), chat=True, default_max=256)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    raise BadRequest("message content must be a string or a list of parts", "messages")


def flatten_chat(messages: Any, tools: Any = None) -> str:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", "messages")
    lines = [f"Tools: {json.dumps(tools, sort_keys=True)}\n"] if tools else []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest("each message needs a string role", "messages")
        text = _content_text(message.get("content"))
        if message.get("tool_calls"):
            text += (" " if text else "") + json.dumps(message["tool_calls"], sort_keys=True)
        role = ROLES.get(message["role"], message["role"].capitalize())
        lines.append(f"{role}: {text}\n")
    return "".join(lines) + "Assistant:"


def tokenize_request(body: dict[str, Any]) -> tuple[str, bool]:
    """(text, add_bos) for vLLM's and llama.cpp's /tokenize bodies."""
    add_bos = body.get("add_special_tokens", body.get("add_special", True))
    if "messages" in body:
        return flatten_chat(body["messages"], body.get("tools")), bool(add_bos)
    text = body.get("prompt", body.get("content"))
    if not isinstance(text, str):
        raise BadRequest("prompt (vLLM) or content (llama.cpp) must be a string", "prompt")
    return text, bool(add_bos)
