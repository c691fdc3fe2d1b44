"""How a request's cached tokens are known: reported by the server, or attributed from its counters.

A server that reports per-request cached tokens (vLLM with --enable-prompt-tokens-details,
llama.cpp's timings.cache_n, SGLang with --enable-cache-report) proves each hit itself. One that
does not still moves a counter of cached prompt tokens (vllm:prefix_cache_hits_total,
llamacpp:prompt_tokens_cached_total, sglang:cached_tokens_total). The counter proves hits only
when its deltas can be pinned on requests: hitproof scrapes it when a window of requests opens
(nothing in flight) and when it closes (nothing in flight again), and bounds each member's share:

    delta = sum of the members' cached tokens,  0 <= cached_r <= prompt_tokens_r
    =>  max(0, delta - sum of the other members' prompt tokens) <= cached_s <= min(prompt_tokens_s, delta)

A request alone in its window gets an exact count; a round of concurrent hits that all reuse most
of their prompts gets a lower bound above zero each (a proven hit); a window whose delta is 0 proves
every member cold. Anything else stays unknown, never zero. A window whose query counter moved by
more than its members' prompt tokens had traffic from someone else: nothing in it is attributed.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from ..server.metrics import MetricSnapshot

# llama.cpp prints /metrics values with 6 significant digits: above 10^6 a counter moves in steps.
EXACT_BELOW = 1_000_000


@dataclass(frozen=True)
class CacheProof:
    """What is known about one request's cached tokens."""

    source: str                  # "request" (the server said) | "counter" (attributed) | "unknown"
    low: int = 0                 # proven lower bound
    high: int | None = None      # proven upper bound; None: no bound

    @property
    def exact(self) -> int | None:
        return self.low if self.high is not None and self.high == self.low else None

    @property
    def hit(self) -> bool:
        return self.low > 0

    def cold(self, tolerance: int) -> bool:
        """Proven to have reused at most `tolerance` tokens."""
        return self.high is not None and self.high <= tolerance

    @classmethod
    def reported(cls, cached: int) -> "CacheProof":
        return cls("request", cached, cached)


UNKNOWN = CacheProof("unknown")


def rises(before: CacheProof, after: CacheProof) -> bool | None:
    """Did cached tokens rise from one request to the next? True or False when the proofs say so,
    None when they cannot tell (unknown is never taken for either)."""
    if before.high is not None and after.low > before.high:
        return True
    if after.high is not None and after.high <= before.low:
        return False
    return None


def quantum(value: float) -> float:
    """The step a value printed with 6 significant digits moves in (0 below 10^6: exact)."""
    if value < EXACT_BELOW:
        return 0.0
    return 10.0 ** (math.floor(math.log10(value)) - 5)


def attribute(delta: float | None, prompt_tokens: dict[int, int | None],
              queries: float | None = None, step: float = 0.0) -> dict[int, CacheProof]:
    """Bounds on each member's cached tokens from the window's counter delta (pure).

    `step` is the counter's print quantum (its values move in steps above 10^6 on llama.cpp): the
    true delta lies within +-2 steps of the printed one, and the bounds widen by as much."""
    members = list(prompt_tokens)
    if delta is None or delta < 0 or not members:
        return {rid: UNKNOWN for rid in members}
    if any(v is None for v in prompt_tokens.values()):
        # without every member's size there is no upper bound on the others' share
        if len(members) == 1 and delta <= 2 * step:
            return {members[0]: CacheProof("counter", 0, int(delta + 2 * step))}
        return {rid: UNKNOWN for rid in members}
    sizes = {rid: int(v) for rid, v in prompt_tokens.items()}
    total = sum(sizes.values())
    if queries is not None and queries > total + 2 * step:
        return {rid: UNKNOWN for rid in members}          # someone else's requests moved the counter
    low_delta, high_delta = max(0.0, delta - 2 * step), delta + 2 * step
    out = {}
    for rid in members:
        others = total - sizes[rid]
        low = max(0, math.ceil(low_delta - others))
        high = min(sizes[rid], math.floor(high_delta))
        out[rid] = CacheProof("counter", min(low, high), high)
    return out


@dataclass
class _Window:
    before: MetricSnapshot | None = None
    opened: asyncio.Future | None = None
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    in_flight: int = 0
    members: dict[int, int | None] = field(default_factory=dict)
    failed: bool = False
    result: dict[int, CacheProof] = field(default_factory=dict)


class CounterWindows:
    """Groups requests into windows between two quiet moments and attributes the counter's deltas.

    enter() before a request is sent; leave() after its stream ended (always, also on failure): it
    waits until every request of the window has ended, so the closing scrape sees all of them.
    A subclass may read other counters the same way: it overrides `_attribute` (window, the closing
    scrape -> request id -> its result) and `missing` (the result of a member nothing is known of);
    tui.core.soak.replica_proof attributes requests to replicas so."""

    missing: object = UNKNOWN

    def __init__(self, scrape: Callable[[], Awaitable[MetricSnapshot | None]], counter: str,
                 queries: str | None):
        self.scrape = scrape
        self.counter = counter
        self.queries = queries
        self._open: _Window | None = None
        self._closing: _Window | None = None
        self.windows = 0
        self.attributed = 0               # requests whose share came out hit or cold
        self.members = 0

    async def enter(self) -> _Window:
        while True:
            if self._closing is not None:
                await self._closing.closed.wait()
                continue
            window = self._open
            if window is None:
                window = self._open = _Window(opened=asyncio.get_running_loop().create_future())
                window.in_flight += 1
                try:
                    window.before = await self.scrape()
                finally:
                    if not window.opened.done():
                        window.opened.set_result(None)
                return window
            window.in_flight += 1
            await asyncio.shield(window.opened)
            return window

    async def leave(self, window: _Window, request: int, prompt_tokens: int | None, failed: bool = False,
                    tolerance: int = 0) -> CacheProof:
        window.members[request] = prompt_tokens
        window.failed |= failed
        window.in_flight -= 1
        if window.in_flight == 0:
            if self._open is window:
                self._open = None
            self._closing = window
            try:
                after = await self.scrape()
                window.result = self._attribute(window, after, tolerance)
            finally:
                self._closing = None
                window.closed.set()
        else:
            await window.closed.wait()
        return window.result.get(request, self.missing)

    def abandon(self, window: _Window) -> None:
        """A member whose request failed (or was cancelled): nothing in the window is attributed,
        and nobody waits for a scrape."""
        window.failed = True
        window.in_flight -= 1
        if window.in_flight == 0:
            if self._open is window:
                self._open = None
            self.windows += 1
            self.members += len(window.members)
            window.result = {rid: self.missing for rid in window.members}
            window.closed.set()

    def _attribute(self, window: _Window, after: MetricSnapshot | None, tolerance: int) -> dict[int, CacheProof]:
        self.windows += 1
        self.members += len(window.members)
        before = window.before
        if window.failed or before is None or after is None:
            return {rid: UNKNOWN for rid in window.members}
        a, b = before.get(self.counter), after.get(self.counter)
        delta = None if a is None or b is None else b - a
        queries = None
        if self.queries is not None:
            qa, qb = before.get(self.queries), after.get(self.queries)
            queries = None if qa is None or qb is None else qb - qa
        step = quantum(max(a or 0.0, b or 0.0))
        result = attribute(delta, window.members, queries, step)
        self.attributed += sum(1 for p in result.values() if p.hit or p.cold(tolerance))
        return result
