"""How many tokens a cold request may share with earlier prompts and still be cold."""

from __future__ import annotations

import asyncio

from ..evidence.text import memo_heading
from ..evidence.tokens import TokenCounter
from ..server.client import RequestSpec

CHAT_TEMPLATE_TOKENS = 8      # turn markers a chat template puts before the first message (Gemma: 4)


class ColdTolerance:
    """Tokens a cold request may share with earlier prompts: those before the run nonce, the first
    token no other run's prompt carries ("<bos>Memo m05, run "). On a cache that matches in blocks
    this is below one block and changes nothing; on one that matches token by token (llama.cpp,
    SGLang's radix cache) a fresh memo does reuse them. Counted with the server's tokenizer when it
    has one (the count includes the BOS token it adds)."""

    def __init__(self, counter: TokenCounter, nonce: str, dialect: str):
        self.counter, self.nonce = counter, nonce
        self._tolerances: dict[tuple[str, str], int] = {}
        self._prefix_tokens: dict[str, int] = {}      # a memo's text before the run nonce, counted with the memo
        # A prompt with no run nonce (a user's captured conversation): a cache that matches token by
        # token (llama.cpp, SGLang) still shares a template's first tokens with whatever it held.
        self.fallback = 8 if dialect in ("llamacpp", "sglang") else 0

    async def of(self, spec: RequestSpec) -> int:
        text = spec.prompt if spec.prompt is not None else \
            "\n".join(str(m.get("content") or "") for m in spec.messages or [])
        at = text.find(self.nonce)
        if at < 0:
            return self.fallback
        prefix = text[:at]
        key = (spec.api, prefix)
        if key not in self._tolerances:
            tokens = self._prefix_tokens.get(prefix)
            if tokens is None:
                tokens = await self.counter.count(prefix) if prefix else 1
            # a chat template adds its turn markers before the first message's text
            self._tolerances[key] = tokens + (CHAT_TEMPLATE_TOKENS if spec.api == "chat" else 0)
        return self._tolerances[key]

    async def count_memos(self, memo_ids: list[str]) -> None:
        """What `of` asks of a prompt that starts with the memo, counted while the memo is sized (not one
        round trip more before the memo's first request)."""
        prefixes = [heading[:heading.find(self.nonce)] for heading in
                    (memo_heading(memo_id, self.nonce) for memo_id in memo_ids)]
        prefixes = [p for p in dict.fromkeys(prefixes) if p and p not in self._prefix_tokens]
        for prefix, tokens in zip(prefixes, await asyncio.gather(*(self.counter.count(p) for p in prefixes))):
            self._prefix_tokens[prefix] = tokens
