"""One answer's checks, as plain data for the event stream, and the problems a broken restore shares
with a weak model (the ones a cold control must rule out). Pure."""

from __future__ import annotations

import dataclasses
from typing import Any

from . import detectors as checks

ALL_JUDGES = ("foreign", "recall", "empty", "repetition", "wrong_task")


def evaluate(text: str, task: str, code: str | None, registry: dict[str, str],
             judges: tuple[str, ...] = ALL_JUDGES) -> dict[str, Any]:
    """All checks of one answer, as plain data for the event stream."""
    found: dict[str, Any] = {}
    if "foreign" in judges:
        found["foreign"] = [dataclasses.asdict(f) for f in checks.find_foreign_codes(text, registry, code)]
    if "recall" in judges and task == "recall" and code:
        recall = checks.check_recall(text, code)
        found["recall"] = {"status": recall.status, "offset": recall.offset, "matched": recall.matched}
    if "empty" in judges:
        found["empty"] = checks.is_empty(text)
    if "repetition" in judges:
        rep = checks.find_repetition(text)
        found["repetition"] = dataclasses.asdict(rep) if rep else None
    if "wrong_task" in judges:
        found["wrong_task"] = checks.wrong_task(text, task, code)
    return found


def hit_path_problems(found: dict[str, Any]) -> list[tuple[str, int | None, str]]:
    """(kind, offset, detail) for what a broken restore produces and a weak model also can."""
    if found.get("empty"):
        return [("empty_answer", 0, "empty answer")]     # an empty answer also misses the code: say it once
    problems = []
    recall = found.get("recall")
    if recall and recall["status"] != "exact":
        problems.append(("recall_miss", recall["offset"],
                         f"code {recall['status']}" + (f" ({recall['matched']!r})" if recall["matched"] else "")))
    rep = found.get("repetition")
    if rep:
        problems.append(("repetition", rep["offset"],
                         f"collapsed into {rep['unit']!r} repeated {rep['count']} times"))
    return problems
