"""Phase 2: a conversation that grows on the shared memo; the last turn asks for the code.

Each turn adds at least one alignment block of text, so cached tokens must rise turn over turn.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...evidence.text import RECALL_ANSWER_LEAD, RECALL_QUESTION
from ..proof import rises
from ..reuse import grid_promises, promised_extension, report_short, short_of
from ..results import UNSET, PhaseResult

TURNS_LABEL = "conversation turns"   # its cached tokens per turn, charted in the html report
TITLE = "conversation"


@dataclass(frozen=True)
class Settings:
    """[phases.conversation]"""
    turns: int = 6                   # turns before the recall turn
    turn_tokens: int = 160           # user text added per turn (at least one block is used)


MINIMUMS = {"turns": 1, "turn_tokens": 8}



@dataclass
class Result(PhaseResult):
    cached_by_turn: list[int | None] = UNSET      # cached tokens of each turn, the recall turn last


def plan(scenario) -> dict:
    return {"slots": 1, "rounds": scenario.conversation.turns + 1,
            "planned_requests": scenario.conversation.turns + 1}


def judge_rise(rq, state, previous, record, turn: int) -> None:
    """Cached tokens must rise turn over turn; a turn where they did not, or where nobody can tell
    (cached tokens unknown), leaves the phase inconclusive."""
    if previous is None:
        return
    rose = rises(previous.proof, record.proof)
    if rose:
        return
    said = f"{_words(previous.proof)} -> {_words(record.proof)}"
    if rose is None:
        state.mark_inconclusive(f"cached tokens not proven to rise at turn {turn} ({said})")
        return
    promised = promised_extension(previous.completion.prompt_tokens, rq.server.grid) if grid_promises(rq) else None
    if resumed_at_whole_previous(record, previous, promised):
        return
    if record.hit and short_of(record, promised) and previous.cached is not None and promised > previous.cached:
        # the grid promised a rise and the engine resumed at the turn before's line: a reuse loss; the
        # phase is proven only if a later turn rises past it (judged there)
        report_short(rq, state, record, what=f"turn {turn}", prompt_tokens=previous.completion.prompt_tokens,
                     promised=promised)
        state.reuse.turns_short = [*(state.reuse.turns_short or []), turn]
        return
    state.mark_inconclusive(f"cached tokens did not rise at turn {turn} ({said})")
    rq.finding(state, "no_hits", "warn", record, detail=f"turn {turn}: cached tokens did not rise ({said})")


def resumed_at_whole_previous(record, previous, promised: int | None) -> bool:
    """The turn before already reused all of its own prompt (an identical send had written it: behind a
    router, the routing miss that was sent again to the same replica), and this turn resumed at that
    prompt's last grid line: it continued the turn before, though its cached tokens equal the turn before's.
    Seen in CI (vllm-router power_of_two before two reference servers, 2026-12-04): turn 1 routed away to
    a replica without the memo, re-sent there and reusing its 1,376 tokens; turn 2 reused the same 1,376
    (a reference server caches prompts, not answers): "did not rise", a false INCONCLUSIVE."""
    return (record.hit and promised is not None and previous.cached is not None and record.cached is not None
            and previous.cached >= promised and record.cached >= promised)


def _words(proof) -> str:
    if proof.exact is not None:
        return str(proof.exact)
    return "unknown" if proof.source == "unknown" else f"{proof.low}-{proof.high if proof.high is not None else '?'}"


def _question(turn: int) -> str:
    return f"Which team does note {turn} mention first?"


async def run(rq, state) -> None:
    s = rq.scenario
    memo, fresh = await rq.shared_memo(state)
    # each turn must cross a grid line, or no rise is possible: a quarter of the grid to spare (measured on
    # the tiny Qwen3-Next's tokenizer: turns asked for 400 tokens grew the prompt by 370-400 on a 384 grid)
    turn_tokens = max(s.conversation.turn_tokens, rq.server.grid + rq.server.grid // 4 + 16)
    chat = s.api == "chat"
    transcript = f"{memo.text}\n"
    messages: list[dict[str, str]] = []
    previous = None
    last_on: dict[int, object] = {}    # behind a router: the last turn each replica served
    cached_by_turn = []
    for turn in range(1, s.conversation.turns + 2):
        final = turn == s.conversation.turns + 1
        if final:
            user = f"{RECALL_QUESTION}" + (" Reply with the code only." if chat else "")
        else:
            note = await rq.filler(f"conversation-{turn}", turn_tokens)
            user = f"Note {turn}: {note} {_question(turn)}"
        if chat:
            content = f"{memo.text}\n\n{user}" if turn == 1 else user
            messages.append({"role": "user", "content": content})
            spec = rq.spec(messages=list(messages), max_tokens=s.evidence.recall_max_tokens if final
                           else s.evidence.turn_max_tokens)
        else:
            lead = f" {RECALL_ANSWER_LEAD}" if final else ""
            transcript += f"\nUser: {user}\nAssistant:{lead}"
            spec = rq.spec(prompt=transcript, stop=None if final else ["\nUser:"],
                           max_tokens=s.evidence.recall_max_tokens if final else s.evidence.turn_max_tokens)
        record = await rq.send(state, spec, task="recall" if final else "turn", memo=memo, round=turn - 1,
                               turn=turn, expect="cold" if (fresh and turn == 1) else "hit")
        if chat:
            messages.append({"role": "assistant", "content": record.text})
        else:
            transcript += record.text.rstrip("\n") if not final else record.text
        # a turn can only reuse what its own replica holds: compare with the last turn that replica served;
        # when the router moved the conversation in between, reusing all of that turn (not more) is right
        before = last_on.get(record.replica) if record.replica is not None else previous
        moved = before is not None and before is not previous
        if not (moved and record.cached and before.cached is not None and record.cached >= before.cached):
            judge_rise(rq, state, before, record, turn)
        previous = record
        if record.replica is not None:
            last_on[record.replica] = record
        cached_by_turn.append(record.cached)
    state.result = Result(cached_by_turn=cached_by_turn)
    for turn in state.reuse.turns_short or []:      # turn t is cached_by_turn[t - 1]
        stuck = cached_by_turn[turn - 1]
        if not any(c is not None and c > stuck for c in cached_by_turn[turn:]):
            state.mark_inconclusive(f"cached tokens did not rise after turn {turn} ({stuck}): the engine kept "
                                    f"no state past that grid line")
