"""Phase 5: a long prompt cold then hit: the time-to-first-token cut, and the code both times.

The cut is the number that justifies prefix caching; a hit that is not faster is a warning
with both times (the same judgement as cold_hit's).
"""

from __future__ import annotations

from ..reuse import repeat_for_reuse
from .cold_hit import judge_hit_claims

TITLE = "long prompt"


def plan(scenario) -> dict:
    return {"slots": 1, "rounds": 1, "planned_requests": 2}


async def run(rq, state) -> None:
    memo = await rq.memo(state, tokens=rq.scenario.long_prompt.memo_tokens, tag="long")
    rq.long_memo = memo
    spec = rq.question(memo.text, "recall")
    cold = await rq.send(state, spec, task="recall", memo=memo, expect="cold")
    hit = await repeat_for_reuse(rq, state, await rq.send(state, spec, task="recall", memo=memo, expect="hit"),
                                 what="the long prompt's repeat")
    if not hit.hit:
        why = "reported 0 cached tokens" if hit.cached == 0 else "has no proven cache hit (cached tokens unknown)"
        state.mark_inconclusive(f"the long prompt's repeat {why}")
        rq.finding(state, "no_hits", "warn", hit, detail=f"the long prompt's repeat {why}")
    if cold.completion.ttft_s and hit.completion.ttft_s:
        state.extra["ttft_cold_s"] = round(cold.completion.ttft_s, 3)
        state.extra["ttft_hit_s"] = round(hit.completion.ttft_s, 3)
    await judge_hit_claims(rq, state, cold, hit)
    state.extra["prompt_tokens"] = cold.completion.prompt_tokens
