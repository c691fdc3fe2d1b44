"""Phase 4: distinct memos rotate across concurrent slots (slot s gets memo (s + r) mod n in round r).

Every slot lands on blocks another slot wrote a round earlier, and every memo has its own
code, so a code from another memo in an answer is unambiguous.
"""

from __future__ import annotations

from ..requests import concurrently


TITLE = "rotation"


def plan(scenario) -> dict:
    r = scenario.rotation
    return {"slots": r.slots, "rounds": r.rounds, "planned_requests": r.slots * r.rounds}


async def run(rq, state) -> None:
    r = rq.scenario.rotation
    memos = [await rq.memo(state, tokens=r.memo_tokens, slot=slot, tag=f"rot{slot}") for slot in range(r.slots)]

    async def one(slot: int, round_: int):
        memo = memos[(slot + round_) % r.slots]
        task = "recall" if slot % 2 == 0 else "summary"
        return await rq.send(state, rq.question(memo.text, task), task=task, memo=memo, slot=slot,
                             round=round_, expect="cold" if round_ == 0 else "hit")

    for round_ in range(r.rounds):
        rq.round(state, round_, r.rounds, {str(s): memos[(s + round_) % r.slots].memo_id for s in range(r.slots)})
        await concurrently(*(one(slot, round_) for slot in range(r.slots)))
