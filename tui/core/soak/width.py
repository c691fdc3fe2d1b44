"""Whether the server can hold the width a scenario asks for, said before the first phase (issue 34).

A rotation round keeps every slot's memo in the cache at once and lands each slot on blocks another slot
wrote the round before: the memos of all the slots must stay cached between rounds, and the slots must be
served at the same time. The mix phase's workers each hold a prompt (a memo and its turns) at once.

What a server states:
  - vLLM: `vllm:cache_config_info` labels num_gpu_blocks and block_size (the KV cache's size in blocks;
    on a hybrid model an upper bound: its recurrent state takes blocks too). vLLM does not state its
    `max_num_seqs` (the requests it serves at once) in /metrics, /version or /v1/models: a width above
    it is queued, not refused, and shows as a lower request rate, not here.
  - llama.cpp: `/props` total_slots (its --parallel): requests beyond it wait for a slot, and its RAM
    prompt cache (--cache-ram) keeps more prompts than slots: a wider rotation still proves hits (it
    exercises that cache's restores), so it is not refused.
Each slot needs at least its memo's blocks (ceil(memo_tokens / block_size), the question and the answer
not counted): a lower bound, so a width refused here cannot fit, and one let through may still be tight.
Nothing stated, nothing checked (the run goes on; a cache too small shows as hits missed)."""

from __future__ import annotations

import math

from ..config.errors import HitproofError


def _int(value) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def widths(scenario) -> list[tuple[str, int, int]]:
    """(what, concurrent slots, tokens each must keep cached) for the wide phases the scenario runs."""
    out = []
    if "rotation" in scenario.phases:
        r = scenario.rotation
        out.append(("rotation", r.slots, r.memo_tokens))
    if "mix" in scenario.phases:
        m = scenario.mix
        out.append(("mix", m.workers, m.memo_tokens + (m.turns - 1) * m.turn_tokens))
    return out


def width_problem(scenario, cache_config: dict | None) -> str | None:
    """One line saying which width the server cannot hold and the width that fits; None when it fits
    or the server states nothing to check it against."""
    labels = cache_config or {}
    blocks, size = _int(labels.get("num_gpu_blocks")), _int(labels.get("block_size"))
    for what, slots, tokens in widths(scenario):
        flag = "--streams" if what == "rotation" else f"[phases.{what}] workers"
        if blocks and size:
            per_slot = math.ceil(tokens / size)
            fit = blocks // per_slot
            if slots > fit:
                return (f"{what}: {slots} slots of {tokens}-token memos need at least {slots * per_slot} cache "
                        f"blocks of {size} tokens; the server holds {blocks} (vllm:cache_config_info "
                        f"num_gpu_blocks): {fit} fit ({flag} {fit}, or fewer memo_tokens)")
    return None


def admit_width(scenario, info):
    """The server's info, once its width is known to fit; else exit 2 with one line (HitproofError)."""
    problem = width_problem(scenario, info.cache_config)
    if problem is not None:
        raise HitproofError(problem)
    return info
