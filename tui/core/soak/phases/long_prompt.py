"""Phase 5: a long prompt cold then hit: the time-to-first-token cut, and the code both times.

The cut is the number that justifies prefix caching; a hit that is not faster is a warning
with both times (the same judgement as cold_hit's).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..reuse import repeat_for_reuse
from ..results import UNSET, PhaseResult
from .cold_hit import cold_until_recalled, judge_hit_claims
from ..results import HitClaims

TITLE = "long prompt"


@dataclass(frozen=True)
class Settings:
    """[phases.long_prompt]"""
    memo_tokens: int = 11000


MINIMUMS = {"memo_tokens": 64}



@dataclass
class Result(PhaseResult):
    ttft_cold_s: float = UNSET
    ttft_hit_s: float = UNSET
    prompt_tokens: int | None = UNSET     # the long prompt's own (the phase's sum otherwise)


def plan(scenario) -> dict:
    return {"slots": 1, "rounds": 1, "planned_requests": 2}


async def run(rq, state) -> None:
    result = state.result = Result()
    tokens = rq.scenario.long_prompt.memo_tokens
    memo, spec, cold = await cold_until_recalled(
        rq, state, await rq.memo(state, tokens=tokens, tag="long"),
        lambda attempt: rq.memo(state, tokens=tokens, tag=f"long-recall{attempt}"))
    rq.long_memo = memo
    hit = await repeat_for_reuse(rq, state, await rq.send(state, spec, task="recall", memo=memo, expect="hit"),
                                 what="the long prompt's repeat")
    if not hit.hit:
        why = "reported 0 cached tokens" if hit.cached == 0 else "has no proven cache hit (cached tokens unknown)"
        state.mark_inconclusive(f"the long prompt's repeat {why}")
        rq.finding(state, "no_hits", "warn", hit, detail=f"the long prompt's repeat {why}")
    if cold.completion.ttft_s and hit.completion.ttft_s:
        result.ttft_cold_s = round(cold.completion.ttft_s, 3)
        result.ttft_hit_s = round(hit.completion.ttft_s, 3)
    await judge_hit_claims(rq, state, cold, hit)
    result.prompt_tokens = cold.completion.prompt_tokens


# --- what the phase adds to the reports ---------------------------------------------------------------

def console_lines(summary: dict) -> list[str]:
    cut = HitClaims.read(summary).ttft_cut_pct
    if cut is None:
        return []
    r = Result.read(summary)
    return [f"long prompt ({r.prompt_tokens} tokens): TTFT {r.ttft_cold_s} s cold -> {r.ttft_hit_s} s hit ({cut}% cut)"]


def ttft_label(summary: dict) -> str:
    tokens = Result.read(summary).prompt_tokens
    return f" ({tokens} prompt tokens)" if tokens else ""
