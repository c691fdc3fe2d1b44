"""A finding's reproduction, planned from its log: the minimal request sequence behind it.

`plan_repro(path, finding)` reads a soak log and returns a plain-data plan (`ReproPlan.data`) for
one fail-class finding: the cold reference (the hit's own prompt under the control's salt), the
requests that wrote the prefix (another memo's, for a leak; the hit's own prompt once), and the hit
re-sent, each with the request body the soak sent (prompt, model or adapter, salt, sampling) and what
the log saw of it. `report/repro_script.py` renders the plan as a standalone script.

The log keeps every memo's text and each prompt's length and last 160 characters, so a prompt is
rebuilt exactly when it is its memo plus what those last characters hold (recall, summary and
determinism questions, the control phase, rotation); a prompt grown past that (a conversation turn,
a longer suffix) cannot be, and a finding on one says so and names the findings that can.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config.errors import BadInput
from ..log.events import (Finding, MemoPlanted, PhaseFinished, RequestFinished, RequestStarted, RunHeader,
                          ServerInfo)
from ..log.recorder import iter_log

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
    "partition_leak": "fingerprint",      # a request sent together with other identities' (the batch)
}
REPEATS = 3                   # the hit re-sent this many times (a fault that shows on some hits only)
_TYPES = ("header", "server", "memo", "request_start", "request_end", "finding", "phase_end")


@dataclass
class LoadedLog:
    header: RunHeader | None = None
    server: ServerInfo | None = None
    memos: dict[str, MemoPlanted] = field(default_factory=dict)
    starts: dict[int, RequestStarted] = field(default_factory=dict)
    ends: dict[int, RequestFinished] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    phases: dict[str, dict[str, Any]] = field(default_factory=dict)     # phase -> its summary
    warnings: list[str] = field(default_factory=list)

    @property
    def fails(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "fail"]

    def settings(self) -> dict[str, Any]:
        return ((self.header.scenario if self.header else None) or {}).get("settings") or {}


def load(path: str | Path) -> LoadedLog:
    """The events a reproduction needs (a missing file or not a log: BadInput, exit 2)."""
    log = LoadedLog()
    for event in iter_log(path, log.warnings, only=_TYPES):
        if isinstance(event, RunHeader):
            log.header = event
        elif isinstance(event, ServerInfo):
            log.server = event
        elif isinstance(event, MemoPlanted):
            log.memos[event.memo] = event
        elif isinstance(event, RequestStarted):
            log.starts[event.request] = event
        elif isinstance(event, RequestFinished):
            log.ends[event.request] = event
        elif isinstance(event, Finding):
            log.findings.append(event)
        elif isinstance(event, PhaseFinished):
            log.phases[event.phase] = event.summary or {}
    return log


def prompt_of(log: LoadedLog, start: RequestStarted) -> str | None:
    """The request's whole prompt (or chat content), rebuilt from its memo and its logged tail;
    None when the log does not hold all of it."""
    tail, n = start.prompt_tail or "", start.prompt_chars or 0
    if n <= 0:
        return None
    if n == len(tail) and n < 160:
        return tail
    memo = log.memos.get(start.memo or "")
    if memo is None or not memo.text:
        return None
    extra = n - len(memo.text)
    overlap = len(tail) - extra
    if extra < 0 or overlap < 1 or not memo.text.endswith(tail[:overlap]):
        return None
    return memo.text + tail[overlap:]


def replayable(log: LoadedLog, finding: Finding) -> str | None:
    """Why this finding cannot be replayed (None: it can)."""
    if finding.kind not in CLAIMS:
        return (f"a {finding.kind} finding has no reproduction script yet (there is one for "
                f"{', '.join(sorted(CLAIMS))})")
    start = log.starts.get(finding.request) if finding.request is not None else None
    if start is None:
        return f"the {finding.kind} finding names no request the log holds"
    if finding.kind == "partition_leak" and not _together(log, finding):
        return ("a partition_leak of a request sent alone has no reproduction script yet (there is one for a "
                "request sent together with other identities': the batch)")
    if prompt_of(log, start) is None:
        return (f"request {start.request}'s prompt ({start.prompt_chars or 'an unknown number of'} characters) is not in the log whole "
                f"(only its memo and its last 160 characters are)")
    return None


def pick(log: LoadedLog, number: int | None) -> tuple[int, Finding]:
    """(1-based number among the fail-class findings, the finding): `number`, or the first that can
    be replayed. BadInput when there is none, or the one asked for cannot be replayed."""
    fails = log.fails
    if not fails:
        raise BadInput("the log has no fail-class finding: nothing to reproduce")
    if number is not None:
        if not 1 <= number <= len(fails):
            raise BadInput(f"--finding {number}: the log has {len(fails)} fail-class finding(s) (1 to {len(fails)})")
        why = replayable(log, fails[number - 1])
        if why:
            raise BadInput(f"--finding {number}: {why}{_others(log)}")
        return number, fails[number - 1]
    for i, finding in enumerate(fails, start=1):
        if replayable(log, finding) is None:
            return i, finding
    raise BadInput(f"none of the log's {len(fails)} fail-class finding(s) can be replayed: "
                   f"{replayable(log, fails[0])}")


def _others(log: LoadedLog) -> str:
    ok = [str(i) for i, f in enumerate(log.fails, start=1) if replayable(log, f) is None]
    more = f" and {len(ok) - 12} more" if len(ok) > 12 else ""
    return f"; these can: --finding {', '.join(ok[:12])}{more}" if ok else "; no fail-class finding of this log can"


def _identity(log: LoadedLog, start: RequestStarted) -> tuple[str, dict[str, Any]]:
    """(model, extra body fields) of the identity the request ran under, as the soak sent them."""
    server = log.server
    base = server.model if server else ""
    if start.identity is None:
        return base, {}
    for adapter in (server.adapters if server else []) or []:
        if adapter.get("name") == start.identity:
            return adapter.get("model") or base, dict(adapter.get("extra") or {})
    if start.identity == "base" and server and server.dialect == "llamacpp":
        ids = sorted(a["id"] for a in server.adapters if isinstance(a.get("id"), int))
        return base, ({"lora": [{"id": i, "scale": 0.0} for i in ids]} if ids else {})
    return (base if start.identity == "base" else start.identity), {}


def _body(log: LoadedLog, start: RequestStarted, salt: str | None) -> dict[str, Any]:
    """The body the soak's client sent (tui.core.server.client: model, sampling, logprobs, salt)."""
    settings = log.settings()
    sampling, evidence = settings.get("sampling") or {}, settings.get("evidence") or {}
    end = log.ends.get(start.request)
    model, extra = _identity(log, start)
    prompt = prompt_of(log, start)
    body: dict[str, Any] = {"model": model, "max_tokens": start.max_tokens,
                            "temperature": sampling.get("temperature"), "stream": True,
                            "stream_options": {"include_usage": True}}
    for key in ("max_tokens", "temperature"):
        if body[key] is None:               # not in the log: the server's default
            del body[key]
    if start.api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if sampling.get("seed") is not None:
        body["seed"] = sampling["seed"]
    if end is not None and end.logprobs:
        top = evidence.get("fingerprint_top_k") if evidence.get("fingerprints") else None
        top = top or (settings.get(start.phase) or {}).get("logprobs") or len(end.logprobs[0][2] or []) or 1
        if start.api == "chat":
            body["logprobs"], body["top_logprobs"] = True, top
        else:
            body["logprobs"] = top
    body.update(extra)
    if salt is not None:
        if log.server and log.server.dialect == "llamacpp":
            body["cache_prompt"] = False
        else:
            body["cache_salt"] = salt
    return body


def _seen(log: LoadedLog, request: int | None) -> dict[str, Any] | None:
    """What the log saw of a request, for the script's side-by-side lines."""
    end = log.ends.get(request) if request is not None else None
    if end is None:
        return None
    checks = end.checks or {}
    return {"request": request, "cached_tokens": end.cached_tokens, "text": (end.text or "")[:400],
            "recall": (checks.get("recall") or {}).get("status"), "fingerprint": checks.get("fingerprint")}


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
        mates = [s for s in log.starts.values() if s.identity == name and s.phase == finding.phase
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


def plan_repro(path: str | Path, number: int | None = None, repeats: int = REPEATS) -> dict[str, Any]:
    """The plan for the fail-class finding `number` (1-based; None: the first that can be replayed)."""
    log = load(path)
    return plan_for(log, *pick(log, number), repeats=repeats)


def plan_for(log: LoadedLog, index: int, finding: Finding, repeats: int = REPEATS) -> dict[str, Any]:
    """The plan for one replayable fail-class finding (`index`: its 1-based number among them)."""
    hit = log.starts[finding.request]
    evidence = log.settings().get("evidence") or {}
    control = _control_request(log, finding)
    cold_salt = log.starts[control].salt if control is not None else None
    steps = [{"role": "cold", "label": "cold reference (the hit's prompt under the control's salt)",
              "request": control, "body": _body(log, hit, cold_salt), "fresh_salt": cold_salt is None,
              "log": _seen(log, control)}]
    together = _together(log, finding) if finding.kind == "partition_leak" else []
    if together:              # nothing to write first: the batch itself is the path that went wrong
        steps.append({"role": "hit", "label": f"the request sent together with {', '.join(t.identity or '?' for t in together)}"
                                              f" (requests {', '.join(str(t.request) for t in together)}), as the soak did",
                      "request": hit.request, "body": _body(log, hit, hit.salt), "fresh_salt": False,
                      "log": _seen(log, hit.request), "repeats": repeats,
                      "together": [_body(log, t, t.salt) for t in together]})
    writer = None if together else _owner_writer(log, finding, hit)
    if writer is not None:
        steps.append({"role": "other", "label": f"writes memo {writer.memo}'s prefix (the state that leaked in)",
                      "request": writer.request, "body": _body(log, writer, writer.salt), "fresh_salt": False,
                      "log": _seen(log, writer.request)})
    if not together:
        steps.append({"role": "writer", "label": "writes the prefix (the hit's prompt, once)",
                      "request": None, "body": _body(log, hit, hit.salt), "fresh_salt": False, "log": None})
        steps.append({"role": "hit", "label": "the hit, as the soak sent it", "request": hit.request,
                      "body": _body(log, hit, hit.salt), "fresh_salt": False, "log": _seen(log, hit.request),
                      "repeats": repeats})
    codes = {m.code: m.memo for m in log.memos.values() if m.code}
    tolerance = evidence.get("fingerprint_tolerance", 0.5)     # what the judge compared fingerprints with
    if finding.kind == "partition_leak":      # the phase calibrates its own (tui/core/soak/identities.py)
        calibrated = (log.phases.get(finding.phase) or {}).get("fingerprint_tolerance") or {}
        tolerance = calibrated.get("used", tolerance) if isinstance(calibrated, dict) else tolerance
    server = log.server
    return {
        "finding": {"number": index, "of": len(log.fails), "kind": finding.kind, "phase": finding.phase,
                    "request": finding.request, "memo": finding.memo, "detail": finding.detail,
                    "offset": finding.offset, "owner": (finding.evidence or {}).get("owner"),
                    "code": (finding.evidence or {}).get("code")},
        "claim": CLAIMS[finding.kind],
        "run": {"run_id": log.header.run_id if log.header else None,
                "started_at": log.header.started_at if log.header else None,
                "url": server.url if server else None, "dialect": server.dialect if server else None,
                "version": server.version if server else None, "model": server.model if server else None},
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
