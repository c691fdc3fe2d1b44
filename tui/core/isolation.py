"""Isolation re-run: send a flagged request alone k times as hits and k times cold.

A foreign code is a leak whether or not it reproduces (no sampling can produce a code the
request never saw); isolation says whether it reproduces alone. Hit wrong but cold right is
corruption on the hit path. Anything that does not reproduce alone is a fluke (the detail
says when the cause could also be a fault that needs concurrency). Counts travel with the
verdict, never just a label.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .checks import first_divergence
from .events import Finding, IsolationFinished, IsolationStarted
from .requests import Record, hit_path_problems

if TYPE_CHECKING:
    from .requests import PhaseState, Requester

VERDICTS = ("leak", "hit_path_corruption", "fluke")


@dataclass(frozen=True)
class IsolationResult:
    verdict: str
    k: int
    hit_runs: int          # re-sends as hits (same salt as the original)
    cold_runs: int         # re-sends under fresh salts
    reproduced: int        # hit runs that showed the same problem
    cold_reproduced: int   # cold runs that showed it
    detail: str


def _is_bad(kind: str, original: Record, finding: Finding, record: Record) -> bool:
    """Does this re-send show the same problem the finding describes?"""
    found = record.checks
    if kind == "any":                    # a request isolated from its slot, with no finding on it
        return bool(hit_path_problems(found)) or any(f["groups"] >= 2 for f in found.get("foreign", []))
    if kind == "foreign_code":           # any other memo's code: the same phenomenon, maybe another victim
        return any(f["groups"] >= 2 for f in found.get("foreign", []))
    if kind == "wrong_task":
        return found.get("wrong_task") is not None
    if kind in ("recall_miss", "empty_answer", "repetition"):
        return kind in {k for k, _, _ in hit_path_problems(found)}
    # divergence kinds: a re-send that differs from the flagged answer reproduces the difference
    return first_divergence(original.text, record.text) is None


def classify(kind: str, k: int, hit_bad: int, cold_bad: int) -> tuple[str, str]:
    if kind == "foreign_code":
        alone = "reproduces alone" if hit_bad else "does not reproduce alone (only under concurrency)"
        return "leak", f"a foreign code is a leak whether or not it reproduces; it {alone} ({hit_bad}/{k} hits)"
    if hit_bad and not cold_bad:
        return "hit_path_corruption", f"wrong on {hit_bad}/{k} hits, right on {k - cold_bad}/{k} cold runs"
    if cold_bad:
        return "fluke", (f"the cold path fails too ({cold_bad}/{k} cold, {hit_bad}/{k} hits): the model, "
                         f"not the cache")
    return "fluke", (f"does not reproduce alone (0/{k} hits, 0/{k} cold): a sampling fluke, or a fault that "
                     f"needs concurrency")


async def isolate(requester: Requester, state: PhaseState, finding: Finding, k: int) -> IsolationResult | None:
    original = requester.record(finding.request)
    if original is None:
        return None
    engine = requester.engine
    engine.emit(IsolationStarted(request=original.request, kind=finding.kind, k=k))
    hit_bad = cold_bad = 0
    for salted in (False, True):
        for _ in range(k):
            spec = dataclasses.replace(original.spec, salt=requester.fresh_salt()) if salted else original.spec
            record = await requester.send(state, spec, task=original.task, memo=original.memo,
                                          slot=original.slot, round=original.round, turn=original.turn,
                                          expect="cold" if salted else "hit", arm="isolation",
                                          of_request=original.request)
            if _is_bad(finding.kind, original, finding, record):
                if salted:
                    cold_bad += 1
                else:
                    hit_bad += 1
    verdict, detail = classify(finding.kind, k, hit_bad, cold_bad)
    result = IsolationResult(verdict, k, k, k, hit_bad, cold_bad, detail)
    engine.emit(IsolationFinished(request=original.request, kind=finding.kind, verdict=verdict, k=k,
                                  hit_runs=k, cold_runs=k, reproduced=hit_bad, cold_reproduced=cold_bad,
                                  detail=detail))
    return result
