"""Phase 7: fresh memos under fresh salts: no hit is possible, every code must come back.

It separates cache faults from model faults: if the model misses codes here, recall
evidence elsewhere proves nothing and the run is inconclusive. A memo whose code the model
missed is re-drawn (a fresh memo and code, sent cold) up to rotation's MAX_RECALL_REDRAWS
times, as rotation does; a memo whose every draw is missed leaves the phase inconclusive.
Measured: the recall-trained models miss some memos cold and on hits alike (qwen3next-recall one
in 146, 2026-12-04; qwen3next-recurrent-recall 13 in 131, 2026-12-05), and one miss among the
control's four memos left whole clean runs INCONCLUSIVE (vLLM CUDA at 64 streams, llama.cpp on
qwen3next-recurrent-recall). Each phase's hits are still judged against their own memo's cold run.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ..record import concurrently
from ..results import UNSET, PhaseResult
from .rotation import MAX_RECALL_REDRAWS

TITLE = "control"


@dataclass(frozen=True)
class Settings:
    """[phases.control]"""
    requests: int = 4
    concurrency: int = 2


MINIMUMS = {"requests": 1, "concurrency": 1}


@dataclass
class Result(PhaseResult):
    memos_redrawn_for_recall: int = UNSET  # memos re-drawn because the model missed their code


def plan(scenario) -> dict:
    c = scenario.control
    return {"slots": c.concurrency, "rounds": 1, "planned_requests": c.requests}


async def run(rq, state) -> None:
    c = rq.scenario.control
    state.hits_required = False
    state.result = Result()
    state.unrecalled = []             # misses are re-drawn below instead of ending the phase at once
    limit = asyncio.Semaphore(c.concurrency)

    async def one(index: int, attempt: int = 0) -> str:
        async with limit:
            tag = f"ctl{index}" + (f"-recall{attempt}" if attempt else "")
            memo = await rq.memo(state, tokens=rq.scenario.evidence.memo_tokens, tag=tag)
            await rq.send(state, rq.question(memo.text, "recall", salt=rq.fresh_salt()), task="recall",
                          memo=memo, slot=index % c.concurrency, expect="cold")
            return memo.memo_id

    memo_ids = await concurrently(*(one(i) for i in range(c.requests)))
    redrawn, given_up = 0, []
    for index, memo_id in enumerate(memo_ids):
        attempt = 0
        while memo_id in state.unrecalled:
            if attempt == MAX_RECALL_REDRAWS:
                given_up.append(memo_id)
                break
            attempt += 1
            redrawn += 1
            memo_id = await one(index, attempt)
    state.unrecalled = None
    state.result.memos_redrawn_for_recall = redrawn
    for memo_id in given_up:
        state.mark_inconclusive(f"cold baseline failed: the model missed the codes of {MAX_RECALL_REDRAWS + 1} "
                                f"fresh memos in a row, the last {memo_id} (recall_miss)")
