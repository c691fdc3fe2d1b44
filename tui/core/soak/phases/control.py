"""Phase 7: fresh memos under fresh salts: no hit is possible, every code must come back.

It separates cache faults from model faults: if the model misses codes here, recall
evidence elsewhere proves nothing and the run is inconclusive.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ..record import concurrently

TITLE = "control"


@dataclass(frozen=True)
class Settings:
    """[phases.control]"""
    requests: int = 4
    concurrency: int = 2


MINIMUMS = {"requests": 1, "concurrency": 1}


def plan(scenario) -> dict:
    c = scenario.control
    return {"slots": c.concurrency, "rounds": 1, "planned_requests": c.requests}


async def run(rq, state) -> None:
    c = rq.scenario.control
    state.hits_required = False
    limit = asyncio.Semaphore(c.concurrency)

    async def one(index: int):
        async with limit:
            memo = await rq.memo(state, tokens=rq.scenario.evidence.memo_tokens, tag=f"ctl{index}")
            return await rq.send(state, rq.question(memo.text, "recall", salt=rq.fresh_salt()), task="recall",
                                 memo=memo, slot=index % c.concurrency, expect="cold")

    await concurrently(*(one(i) for i in range(c.requests)))
