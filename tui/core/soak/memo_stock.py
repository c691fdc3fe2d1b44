"""Memos sized before the phase that plants them (issue 34).

A wide phase sizes all its memos at once before its first request, and the server waits meanwhile.
Measured, vLLM 0.26 on an H100, qwen3next-recall, gpu-quick at 128 streams (run R, 2026-12-06): nothing was
in flight for 0.88 s while hitproof sized the resume calibration's 128 memos and 0.87 s while it sized
rotation's: 1.75 s of the 2.0 s by which its soak (31.8 s) trailed the raw client replaying the same
requests (29.8 s), a request-rate ratio of 0.938.

The stock sizes them from the start of the run, in the background and two at a time, while the first
phases wait on the server. A phase takes its memos from the stock (waiting for any still being sized; those
not yet started are sized at once, as without the stock) and plants them itself: the memo events, the codes
and their registry belong to it as before. A memo's id and code are drawn when it is ordered, so a wide
scenario's memo texts (seeded by the id) differ from a run without the stock; only phases that size at least
AHEAD_FROM memos at once are ordered, so the narrow scenarios (four slots, the CPU ones) keep theirs. No I/O of
its own: sizing is the requester's.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass
from typing import Awaitable, Callable, Iterable

from ..evidence.memos import Memo
from .resume import memos_ahead as calibration_ahead

AHEAD_FROM = 8       # memos a phase sizes at once before the stock sizes them ahead (resume.WIDE_FROM's width)
BACKGROUND = 2       # memos sized at a time in the background: a request of the running phase waits behind two
                     # sizing steps at most. Sixteen at a time held the run's first request back 0.61 s at 128
                     # streams on an H100 host (run S, 2026-12-06); what a phase takes unsized is sized at once.

Wanted = tuple[int, str, bool]      # (tokens, tag, with a code): what a phase asks the requester for


@dataclass
class _Ordered:
    memo_id: str
    tokens: int
    code: str | None
    task: asyncio.Task | None = None       # None: not started


class MemoStock:
    def __init__(self, draw: Callable[[str, bool], tuple[str, str | None]],
                 size: Callable[[str, int, str | None], Awaitable[Memo]],
                 count_prefixes: Callable[[list[str]], Awaitable[None]]):
        self._draw, self._size, self._count_prefixes = draw, size, count_prefixes
        self._ahead: dict[Wanted, _Ordered] = {}
        self._queue: collections.deque[_Ordered] = collections.deque()
        self._side: list[asyncio.Task] = []       # the background workers, the prefix counts

    def order(self, wanted: Iterable[Wanted]) -> None:
        """Draw each memo's id and code now, in order, and size them in the background, in that order."""
        ids = []
        for tokens, tag, with_code in wanted:
            key = (tokens, tag, with_code)
            if key in self._ahead:
                continue
            memo_id, code = self._draw(tag, with_code)
            ids.append(memo_id)
            self._ahead[key] = ordered = _Ordered(memo_id, tokens, code)
            self._queue.append(ordered)
        if ids:
            self._side.append(asyncio.create_task(self._count_prefixes(ids), name="memo prefixes"))
            running = sum(1 for task in self._side if task.get_name() == "memo stock" and not task.done())
            self._side += [asyncio.create_task(self._work(), name="memo stock") for _ in range(BACKGROUND - running)]

    def _start(self, ordered: _Ordered) -> asyncio.Task:
        if ordered.task is None:
            ordered.task = asyncio.create_task(self._size(ordered.memo_id, ordered.tokens, ordered.code),
                                               name=f"memo {ordered.memo_id}")
        return ordered.task

    async def _work(self) -> None:
        while self._queue:
            ordered = self._queue.popleft()
            if ordered.task is None:                  # not taken meanwhile
                await asyncio.wait([self._start(ordered)])      # its error is the taker's (or close()'s)

    def take(self, tokens: int, tag: str, with_code: bool) -> asyncio.Task | None:
        """The memo ordered for this (tokens, tag, with_code): sized, being sized, or sized from now on (its
        error, if sizing failed, is raised where it is awaited); None when none was ordered."""
        ordered = self._ahead.pop((tokens, tag, with_code), None)
        return None if ordered is None else self._start(ordered)

    @property
    def waiting(self) -> int:
        """Memos ordered and not yet taken."""
        return len(self._ahead)

    async def close(self) -> None:
        """Stop sizing what no phase took (a run that ended early, a phase not reached)."""
        left = [*(o.task for o in self._ahead.values() if o.task is not None), *self._side]
        self._ahead.clear()
        self._queue.clear()
        self._side.clear()
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)


def memos_ahead(scenario, phases: dict, server, checkpoints_seen: bool) -> list[Wanted]:
    """What to order at the start of a run: the resume calibration's wide memos (asked for first), then each
    phase's `memos_ahead(scenario)` in the scenario's order; each only where it sizes at least AHEAD_FROM at
    once."""
    out = []
    for wanted in (calibration_ahead(scenario, server, checkpoints_seen),
                   *(getattr(phases.get(name), "memos_ahead", lambda _: [])(scenario) for name in scenario.phases)):
        if len(wanted) >= AHEAD_FROM:
            out += wanted
    return out
