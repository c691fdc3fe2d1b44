"""Phase 3: concurrent streams of different lengths on one memo; even streams recall, odd summarize.

A summary stream answering with the code is a wrong-task event (a candidate fluke): every
stream carries the same code here, which is why the rotation phase exists.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..requester import run_round


TITLE = "shared concurrency"


@dataclass(frozen=True)
class Settings:
    """[phases.shared_concurrency]"""
    streams: int = 4
    rounds: int = 2
    length_step_tokens: int = 60     # stream s appends s * step tokens: different lengths


MINIMUMS = {"streams": 1, "rounds": 1, "length_step_tokens": 0}


def check(s: Settings) -> tuple[str, str, str] | None:
    # the streams share the rotation's bound, and have always been reported under its key
    return ("phases.rotation", "slots", "at most 256 concurrent slots") if s.streams > 256 else None


def plan(scenario) -> dict:
    c = scenario.shared_concurrency
    return {"slots": c.streams, "rounds": c.rounds, "planned_requests": c.streams * c.rounds}


async def run(rq, state) -> None:
    c = rq.scenario.shared_concurrency
    memo, fresh = await rq.shared_memo(state)
    contexts = []
    for stream in range(c.streams):
        extra = await rq.filler(f"shared-{stream}", stream * c.length_step_tokens) if stream else ""
        contexts.append(f"{memo.text}\n\nAddendum {stream}. {extra}" if extra else memo.text)

    async def one(stream: int, round_: int):
        task = "recall" if stream % 2 == 0 else "summary"
        expect = "hit" if (round_ > 0 or not fresh) else "any"
        return await rq.send(state, rq.question(contexts[stream], task), task=task, memo=memo, slot=stream,
                             round=round_, expect=expect)

    for round_ in range(c.rounds):
        await run_round(rq, state, round_, c.rounds, c.streams, lambda stream: memo, one)
