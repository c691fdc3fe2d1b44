"""Phase 5: a long prompt cold then hit: the time-to-first-token cut, and the code both times."""

from __future__ import annotations

TITLE = "long prompt"


def plan(scenario) -> dict:
    return {"slots": 1, "rounds": 1, "planned_requests": 2}


async def run(rq, state) -> None:
    memo = await rq.memo(state, tokens=rq.scenario.long_prompt.memo_tokens, tag="long")
    rq.long_memo = memo
    spec = rq.question(memo.text, "recall")
    cold = await rq.send(state, spec, task="recall", memo=memo, expect="cold")
    hit = await rq.send(state, spec, task="recall", memo=memo, expect="hit")
    if hit.cached == 0:
        state.mark_inconclusive("the long prompt's repeat got no cache hit")
        rq.finding(state, "no_hits", "warn", hit, detail="the long prompt's repeat reported 0 cached tokens")
    if cold.completion.ttft_s and hit.completion.ttft_s:
        state.extra["ttft_cold_s"] = round(cold.completion.ttft_s, 3)
        state.extra["ttft_hit_s"] = round(hit.completion.ttft_s, 3)
        state.extra["ttft_cut_pct"] = round(100 * (1 - hit.completion.ttft_s / cold.completion.ttft_s), 1)
    state.extra["prompt_tokens"] = cold.completion.prompt_tokens
