"""The beginning of a prompt that the server tokenizes into exactly N tokens, with its own tokenizer
(`/tokenize` and `/detokenize`, vLLM's and llama.cpp's schemas): what a request must send to leave a
state at grid line N and nothing beyond it (a hit's twin, tui/core/soak/twin.py)."""

from __future__ import annotations

from typing import Any

from ..config.errors import ServerProblem


async def _ids(client: Any, body: dict) -> list[int] | None:
    try:
        response = await client.post_json("/tokenize", body)
    except ServerProblem:
        return None
    if response.status_code != 200:
        return None
    tokens = response.json().get("tokens")
    return tokens if isinstance(tokens, list) and all(isinstance(t, int) for t in tokens) else None


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
