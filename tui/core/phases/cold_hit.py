"""Phase 1: a memo cold, the identical request (a hit), then a hit with a longer suffix."""

from __future__ import annotations

TITLE = "cold → hit"


def plan(scenario) -> dict:
    return {"slots": 1, "rounds": 1, "planned_requests": 3}


async def run(rq, state) -> None:
    memo, fresh = await rq.shared_memo(state)
    spec = rq.question(memo.text, "recall")
    cold = await rq.send(state, spec, task="recall", memo=memo, expect="cold" if fresh else "any")
    hit = await rq.send(state, spec, task="recall", memo=memo, expect="hit")
    if hit.cached == 0:
        state.mark_inconclusive("the identical repeat got no cache hit")
        rq.finding(state, "no_hits", "warn", hit, detail="the identical repeat of a memo reported 0 cached tokens")
    addendum = await rq.filler("cold_hit-suffix", rq.scenario.cold_hit.suffix_tokens)
    longer = rq.question(f"{memo.text}\n\nAddendum. {addendum}", "recall")
    await rq.send(state, longer, task="recall", memo=memo, expect="hit")
    if cold.completion.ttft_s and hit.completion.ttft_s and hit.hit and cold.cached == 0:
        state.extra["ttft_cut_pct"] = round(100 * (1 - hit.completion.ttft_s / cold.completion.ttft_s), 1)
