"""The isolation re-run itself: a flagged request sent alone k times as hits and k times cold (under
fresh salts); which re-sends show the flagged problem again, and the verdict (tui.core.checks.isolation)."""

from __future__ import annotations

import dataclasses

from ..checks.answers import hit_path_problems
from ..checks.detectors import first_divergence
from ..checks.isolation import IsolationResult, classify, why_not_isolated
from ..log.events import Finding, IsolationFinished, IsolationStarted
from .record import Record
from .requester import Requester
from .state import PhaseState


def _is_bad(kind: str, original: Record, finding: Finding, record: Record, requester: Requester) -> bool:
    """Does this re-send show the same problem the finding describes?"""
    found = record.checks
    if kind == "any":                    # a request isolated from its slot, with no finding on it
        return bool(hit_path_problems(found)) or any(f["groups"] >= 2 for f in found.get("foreign", []))
    if kind == "foreign_code":           # any other memo's code (the same phenomenon, maybe another victim),
        code = (finding.evidence or {}).get("code")        # or the very group that was flagged
        return any(f["groups"] >= 2 or f["code"] == code for f in found.get("foreign", []))
    if kind == "foreign_state":
        return requester.fingerprint_verdict(record) == "foreign_state"
    if kind == "wrong_task":
        return found.get("wrong_task") is not None
    if kind in ("recall_miss", "empty_answer", "repetition"):
        return kind in {k for k, _, _ in hit_path_problems(found)}
    # divergence kinds: a re-send that gives the flagged answer again reproduces the difference
    return first_divergence(original.text, record.text) is None


async def isolate(requester: Requester, state: PhaseState, finding: Finding, k: int) -> IsolationResult | None:
    original = requester.record(finding.request)
    if original is None:
        return None
    why = why_not_isolated(finding.kind)
    if why is not None:
        detail = f"not isolated: {why}"
        requester.emit(IsolationFinished(request=original.request, kind=finding.kind, verdict="not_isolated", k=0,
                                      detail=detail))
        return IsolationResult("not_isolated", 0, 0, 0, 0, 0, detail)
    requester.emit(IsolationStarted(request=original.request, kind=finding.kind, k=k))
    hit_bad = cold_bad = 0
    for salted in (False, True):
        for _ in range(k):
            spec = dataclasses.replace(original.spec, salt=requester.fresh_salt()) if salted else original.spec
            record = await requester.send(state, spec, task=original.task, memo=original.memo,
                                          slot=original.slot, round=original.round, turn=original.turn,
                                          expect="cold" if salted else "hit", arm="isolation",
                                          of_request=original.request)
            if _is_bad(finding.kind, original, finding, record, requester):
                if salted:
                    cold_bad += 1
                else:
                    hit_bad += 1
    whole = finding.kind != "foreign_code" or finding.severity == "fail"
    verdict, detail = classify(finding.kind, k, hit_bad, cold_bad, whole_code=whole)
    result = IsolationResult(verdict, k, k, k, hit_bad, cold_bad, detail)
    requester.emit(IsolationFinished(request=original.request, kind=finding.kind, verdict=verdict, k=k,
                                  hit_runs=k, cold_runs=k, reproduced=hit_bad, cold_reproduced=cold_bad,
                                  detail=detail))
    return result
