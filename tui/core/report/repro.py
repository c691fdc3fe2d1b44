"""A finding's reproduction, planned from its log: the minimal request sequence behind it.

`plan_repro(path, finding)` reads a soak log and returns a plain-data plan for one finding: the cold
reference (the hit's own prompt under the control's salt), the requests that wrote the prefix
(another memo's or another identity's, for a leak; the hit's own prompt once), and the hit re-sent,
each with the request body the soak sent (prompt, model or adapter, salt, sampling) and what the log
saw of it. A server that failed on a request, and a repeat that reused less than the grid promises,
are planned by `repro_other.py`. `report/repro_script.py` renders the plan as a standalone script.
A prompt the log does not hold whole (`repro_log.prompt_of`) cannot be replayed: the finding says so
and names those that can.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config.errors import BadInput
from ..log.events import Finding, RequestStarted
from .repro_log import LoadedLog, body_of, finding_of, load, prompt_of, run_of, seen_of
from .repro_other import OTHER_CLAIMS, other_plan, other_unreplayable

__all__ = ["CLAIMS", "REPEATS", "LoadedLog", "load", "pick", "plan_for", "plan_repro", "replayable"]

# finding kind -> the claim the script checks again (the same one the judge made)
CLAIMS = {
    "recall_miss": "recall",
    "foreign_code": "foreign",
    "empty_answer": "empty",
    "repetition": "repetition",
    "fingerprint_mismatch": "fingerprint",
    "foreign_state": "fingerprint",
    "hit_path_divergence": "fingerprint",
    "cache_path_divergence": "divergence",
    # a request under one identity: sent with other identities' (the batch), or after them alone:
    # its fingerprint, or (when it reused what only they computed) its cached tokens: `reuse_across`
    "partition_leak": "fingerprint",
    **OTHER_CLAIMS,                   # server_error (the server failed on a request), reuse_short (a warning)
}
REPEATS = 3                   # the hit re-sent this many times (a fault that shows on some hits only)


def replayable(log: LoadedLog, finding: Finding) -> str | None:
    """Why this finding cannot be replayed (None: it can)."""
    if finding.kind not in CLAIMS:
        return (f"a {finding.kind} finding has no reproduction script yet (there is one for "
                f"{', '.join(sorted(CLAIMS))})")
    if finding.kind in OTHER_CLAIMS:
        return other_unreplayable(log, finding)
    start = log.starts.get(finding.request) if finding.request is not None else None
    if start is None:
        return f"the {finding.kind} finding names no request the log holds"
    if finding.kind == "partition_leak" and not _together(log, finding) and not _identity_writers(log, finding, start):
        return ("a partition_leak of a request sent alone names no other identity's request on its prompt that the "
                "log holds whole")
    if prompt_of(log, start) is None:
        return (f"request {start.request}'s prompt ({start.prompt_chars or 'an unknown number of'} characters) is not in the log whole "
                f"(only its memo and its last 160 characters are)")
    return None


def pick(log: LoadedLog, number: int | None, kind: str | None = None) -> tuple[int, Finding]:
    """(1-based number among the fail-class findings, or among the findings of `kind` when given, the
    finding): `number`, or the first that can be replayed. BadInput when there is none, or the one
    asked for cannot be replayed."""
    pool, what = _pool(log, kind)
    if not pool:
        hint = ""
        if kind is None and any(f.kind in CLAIMS for f in log.findings if f.severity == "warn"):
            hint = f" (a warn-class one can be: --kind {next(f.kind for f in log.findings if f.kind in CLAIMS and f.severity == 'warn')})"
        raise BadInput(f"the log has no {what}: nothing to reproduce{hint}")
    if number is not None:
        if not 1 <= number <= len(pool):
            raise BadInput(f"--finding {number}: the log has {len(pool)} {what}(s) (1 to {len(pool)})")
        why = replayable(log, pool[number - 1])
        if why:
            raise BadInput(f"--finding {number}: {why}{_others(log, kind)}")
        return number, pool[number - 1]
    for i, finding in enumerate(pool, start=1):
        if replayable(log, finding) is None:
            return i, finding
    raise BadInput(f"none of the log's {len(pool)} {what}(s) can be replayed: {replayable(log, pool[0])}")


def _pool(log: LoadedLog, kind: str | None) -> tuple[list[Finding], str]:
    """The findings `--finding N` counts: the fail-class ones, or every one of `kind`."""
    if kind is None:
        return log.fails, "fail-class finding"
    if kind not in CLAIMS:
        raise BadInput(f"--kind {kind}: no reproduction script for it (there is one for {', '.join(sorted(CLAIMS))})")
    return [f for f in log.findings if f.kind == kind and f.severity in ("fail", "warn")], f"{kind} finding"


def _others(log: LoadedLog, kind: str | None = None) -> str:
    pool, what = _pool(log, kind)
    ok = [str(i) for i, f in enumerate(pool, start=1) if replayable(log, f) is None]
    more = f" and {len(ok) - 12} more" if len(ok) > 12 else ""
    return f"; these can: --finding {', '.join(ok[:12])}{more}" if ok else f"; no {what} of this log can"


def _control_request(log: LoadedLog, finding: Finding) -> int | None:
    ev = finding.evidence or {}
    for key in ("control_request", "cold_request", "own_request"):
        if isinstance(ev.get(key), int) and ev[key] in log.starts and ev[key] != finding.request:
            return ev[key]
    for key in ("control_requests", "twin_requests"):
        for r in ev.get(key) or []:
            if isinstance(r, int) and r in log.starts and log.starts[r].salt is not None:
                return r
    return next((s.request for s in log.starts.values() if s.of_request == finding.request and s.expect == "cold"),
                None)


def _together(log: LoadedLog, finding: Finding) -> list[RequestStarted]:
    """A partition finding's batch: for each identity it was sent with, that identity's main-arm request
    nearest to it (the phase sends a batch's requests one after the other, then awaits them)."""
    ev = finding.evidence or {}
    names = ev.get("concurrent_with") or []
    if ev.get("via") not in ("batch", "cache or batch") or not names or finding.request is None:
        return []
    out = []
    for name in names:
        mates = [s for s in log.starts.values() if _is(s, name) and s.phase == finding.phase
                 and s.arm == "main" and prompt_of(log, s) is not None]
        if not mates:
            return []
        out.append(min(mates, key=lambda s: abs(s.request - finding.request)))
    return out


def _owner_writer(log: LoadedLog, finding: Finding, hit: RequestStarted) -> RequestStarted | None:
    """For a leak: the last request before the hit, on the memo whose code or state leaked in, whose
    prompt the log holds (the same task first)."""
    owner = (finding.evidence or {}).get("owner")
    if not owner or owner == hit.memo:
        return None
    found = [s for s in log.starts.values() if s.memo == owner and s.request < hit.request
             and prompt_of(log, s) is not None]
    same = [s for s in found if s.task == hit.task and s.arm == "main"]
    return (same or found or [None])[-1]


def _is(start: RequestStarted, name: str) -> bool:
    """The request ran under the phase's identity `name` (the base asked for with no adapter field is
    logged with no identity)."""
    return start.identity == name or (name == "base" and start.identity is None)


def _identity_writers(log: LoadedLog, finding: Finding, hit: RequestStarted) -> list[RequestStarted]:
    """For a partition leak of a request sent alone: the requests of the identities whose state it
    reused or answered with, last before it on the same prompt (the phase's order: they write, it
    follows)."""
    ev = finding.evidence or {}
    if finding.kind != "partition_leak" or ev.get("concurrent_with") or ev.get("via") not in ("cache", "unknown"):
        return []
    names = ev.get("computed_by") or ([ev["owner"]] if ev.get("owner") else [])
    if not names:             # a state close to no identity's: the last other identity on its prompt wrote it
        before = [s for s in log.starts.values() if s.phase == hit.phase and s.memo == hit.memo
                  and s.request < hit.request and s.prompt_chars == hit.prompt_chars and s.identity != hit.identity]
        names = [max(before, key=lambda s: s.request).identity or "base"] if before else []
    out = []
    for name in names:
        found = [s for s in log.starts.values() if _is(s, name) and s.phase == hit.phase and s.memo == hit.memo
                 and s.request < hit.request and s.prompt_chars == hit.prompt_chars and prompt_of(log, s) is not None]
        if not found:
            return []
        out.append(found[-1])
    return sorted(out, key=lambda s: s.request)


def plan_repro(path: str | Path, number: int | None = None, repeats: int = REPEATS,
               kind: str | None = None) -> dict[str, Any]:
    """The plan for the fail-class finding `number` (1-based; None: the first that can be replayed), or
    for the `number`-th finding of `kind`."""
    log = load(path)
    index, finding = pick(log, number, kind)
    return plan_for(log, index, finding, repeats=repeats, of=len(_pool(log, kind)[0]))


def plan_for(log: LoadedLog, index: int, finding: Finding, repeats: int = REPEATS,
             of: int | None = None) -> dict[str, Any]:
    """The plan for one replayable finding (`index`: its 1-based number among `of`, by default among
    the fail-class findings)."""
    of = len(log.fails) if of is None else of
    if finding.kind in OTHER_CLAIMS:
        return other_plan(log, finding, index, of, repeats)
    hit = log.starts[finding.request]
    evidence = log.settings().get("evidence") or {}
    control = _control_request(log, finding)
    cold_salt = log.starts[control].salt if control is not None else None
    steps = [{"role": "cold", "label": "cold reference (the hit's prompt under the control's salt)",
              "request": control, "body": body_of(log, hit, cold_salt), "fresh_salt": cold_salt is None,
              "log": seen_of(log, control)}]
    together = _together(log, finding) if finding.kind == "partition_leak" else []
    others = [] if together else _identity_writers(log, finding, hit)
    claim = CLAIMS[finding.kind]
    if together:              # nothing to write first: the batch itself is the path that went wrong
        steps.append({"role": "hit", "label": f"the request sent together with {', '.join(t.identity or '?' for t in together)}"
                                              f" (requests {', '.join(str(t.request) for t in together)}), as the soak did",
                      "request": hit.request, "body": body_of(log, hit, hit.salt), "fresh_salt": False,
                      "log": seen_of(log, hit.request), "repeats": repeats,
                      "together": [body_of(log, t, t.salt) for t in together]})
    elif others:              # another identity writes its prompt before each hit: the state that leaked in
        names = ", ".join(o.identity or "the base model" for o in others)
        steps.append({"role": "hit", "label": f"the request after {names} wrote its prompt (requests "
                                              f"{', '.join(str(o.request) for o in others)}), as the soak sent it",
                      "request": hit.request, "body": body_of(log, hit, hit.salt), "fresh_salt": False,
                      "log": seen_of(log, hit.request), "repeats": repeats,
                      "before": [{"label": f"{o.identity or 'the base model'} writes the prompt (request {o.request})",
                                  "body": body_of(log, o, o.salt), "log": seen_of(log, o.request)} for o in others]})
        if (finding.evidence or {}).get("computed_by") and not (finding.evidence or {}).get("owner"):
            claim = "reuse_across"    # the claim was the reuse itself: more cached than the run nonce allows
    writer = None if together or others else _owner_writer(log, finding, hit)
    if writer is not None:
        steps.append({"role": "other", "label": f"writes memo {writer.memo}'s prefix (the state that leaked in)",
                      "request": writer.request, "body": body_of(log, writer, writer.salt), "fresh_salt": False,
                      "log": seen_of(log, writer.request)})
    if not together and not others:
        steps.append({"role": "writer", "label": "writes the prefix (the hit's prompt, once)",
                      "request": None, "body": body_of(log, hit, hit.salt), "fresh_salt": False, "log": None})
        steps.append({"role": "hit", "label": "the hit, as the soak sent it", "request": hit.request,
                      "body": body_of(log, hit, hit.salt), "fresh_salt": False, "log": seen_of(log, hit.request),
                      "repeats": repeats})
    codes = {m.code: m.memo for m in log.memos.values() if m.code}
    tolerance = evidence.get("fingerprint_tolerance", 0.5)     # what the judge compared fingerprints with
    if finding.kind == "partition_leak":      # the phase calibrates its own (tui/core/soak/phases/partition_identities.py)
        calibrated = (log.phases.get(finding.phase) or {}).get("fingerprint_tolerance") or {}
        tolerance = calibrated.get("used", tolerance) if isinstance(calibrated, dict) else tolerance
    return {
        "finding": finding_of(finding, index, of),
        "claim": claim,
        "run": run_of(log),
        "api": hit.api,
        "code": hit.code,
        "codes": codes,
        "single_group": "odds" in (finding.evidence or {}),
        "batched": bool(together),            # judged whether or not anything was reused
        "tolerance": tolerance,
        "fingerprint_tokens": evidence.get("fingerprint_tokens", 12),
        "cold_tolerance": (log.ends.get(hit.request).cold_tolerance if log.ends.get(hit.request) else None) or 0,
        "steps": steps,
    }
