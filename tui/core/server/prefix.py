"""The beginning of a prompt that the server tokenizes into exactly N tokens, with its own tokenizer
(`/tokenize` and `/detokenize`, vLLM's and llama.cpp's schemas): what a request must send to leave a
state at grid line N and nothing beyond it (a hit's twin, tui/core/soak/twin.py)."""

from __future__ import annotations

from typing import Any

import orjson

from ..config.errors import ServerProblem

_INTEGERS = frozenset((int, bool))       # what isinstance(t, int) takes of what orjson makes


async def _ids(client: Any, body: dict) -> list[int] | None:
    """The token ids of a /tokenize answer. As the memos' counts are (OpenAIClient.post_for_bytes): httpx's request
    and response objects, its JSON decoding and a per-id type check were most of the twin's binary search, about 13
    round trips a twin (the reference server with --resume-cost 0.06, cProfile 2026-12-07)."""
    try:
        status, content = await client.post_for_bytes("/tokenize", body)
    except ServerProblem:
        return None
    if status != 200:
        return None
    try:
        data = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    tokens = data.get("tokens") if isinstance(data, dict) else None
    return tokens if isinstance(tokens, list) and set(map(type, tokens)) <= _INTEGERS else None


async def prefix_text(client: Any, text: str, model: str, tokens: int) -> str | None:
    """The longest prefix of `text` that tokenizes into `tokens` tokens (those the server adds itself,
    a BOS, counted), checked to be exactly the first `tokens` tokens of the whole text; None when the
    server cannot tokenize or no cut gives them. A binary search over character positions, one
    /tokenize each (about 12 for 4,000 characters); no /detokenize, whose text need not round-trip."""
    whole = await _ids(client, {"model": model, "prompt": text})
    if whole is None or not 0 < tokens < len(whole):
        return None
    lo, hi = 0, len(text)                # the largest cut with at most `tokens` tokens
    while lo < hi:
        mid = (lo + hi + 1) // 2
        ids = await _ids(client, {"model": model, "prompt": text[:mid]})
        if ids is None:
            return None
        if len(ids) <= tokens:
            lo = mid
        else:
            hi = mid - 1
    cut = text[:lo].rstrip() if lo < len(text) and text[lo].isspace() else text[:lo]
    for piece in dict.fromkeys((text[:lo], cut)):        # a trailing space may belong to the next token
        if piece and await _ids(client, {"model": model, "prompt": piece}) == whole[:tokens]:
            return piece
    return None
