"""Reproductions of findings that are not a wrong answer to a hit (report/repro.py plans those).

- `server_error`: the server failed during the soak (the process died, or answered with an error).
  The script sends the first request that got no answer, as the soak sent it, and says whether the
  server answers it, and whether it still answers anything after it.
- `reuse_short` (a warning: a performance fault): an identical repeat reused fewer tokens than the
  server's own block grid promises. The script writes the prompt under a fresh `cache_salt` (so the
  server has never seen it), repeats it, and compares the tokens reused with the promise; a second
  repeat shows whether the reuse came late rather than never.
"""

from __future__ import annotations

from typing import Any

from ..log.events import Finding, RequestStarted
from .repro_log import LoadedLog, body_of, finding_of, prompt_of, run_of, seen_of
from .repro_restore import RESTORE_CLAIMS, RESTORE_FLOWS, restore_plan, restore_unreplayable

OTHER_CLAIMS = {"server_error": "server_error", "reuse_short": "reuse", **RESTORE_CLAIMS}


def failed_request(log: LoadedLog, finding: Finding) -> RequestStarted | None:
    """The first request of the finding's phase that got no answer (an error, or no end at all): the
    one the server failed on; the requests after it found it failing already."""
    failed = [s for s in log.starts.values() if (not finding.phase or s.phase == finding.phase)
              and (s.request not in log.ends or log.ends[s.request].error)]
    return min(failed, key=lambda s: s.request) if failed else None


def other_unreplayable(log: LoadedLog, finding: Finding) -> str | None:
    """Why a server_error, reuse_short or restore finding cannot be replayed (None: it can)."""
    if finding.kind in RESTORE_CLAIMS:
        return restore_unreplayable(log, finding)
    if finding.kind == "server_error":
        start = failed_request(log, finding)
        if start is None:
            return "the server_error finding's phase has no request that went unanswered: nothing to re-send"
    else:
        start = log.starts.get(finding.request) if finding.request is not None else None
        if start is None:
            return f"the {finding.kind} finding names no request the log holds"
        if not isinstance((finding.evidence or {}).get("promised"), int):
            return "the reuse_short finding does not say what the grid promised"
        if log.server and log.server.dialect == "llamacpp":
            return "a reuse_short on llama.cpp cannot be replayed: it has no cache_salt to make the prompt new again"
    if prompt_of(log, start) is None:
        return (f"request {start.request}'s prompt ({start.prompt_chars or 'an unknown number of'} characters) is "
                f"not in the log whole (only its memo and its last 160 characters are)")
    return None


def other_plan(log: LoadedLog, finding: Finding, index: int, of: int, repeats: int) -> dict[str, Any]:
    """The plan of a replayable server_error, reuse_short or restore finding (see the module's doc)."""
    if finding.kind in RESTORE_CLAIMS:
        return restore_plan(log, finding, index, of, repeats)
    claim = OTHER_CLAIMS[finding.kind]
    ev = finding.evidence or {}
    if claim == "server_error":
        start = failed_request(log, finding)
        end = log.ends.get(start.request)
        seen = seen_of(log, start.request) or {"request": start.request, "cached_tokens": None, "text": ""}
        seen["error"] = (end.error if end else None) or "no answer (the run ended before it)"
        steps = [{"role": "failed", "label": f"the request the server failed on (request {start.request}, "
                                             f"{start.prompt_chars} characters)",
                  "request": start.request, "body": body_of(log, start, start.salt), "fresh_salt": False,
                  "log": seen, "repeats": 1}]
        extra = {"exit_code": ev.get("exit_code"), "last_lines": (ev.get("last_lines") or [])[-5:]}
    else:
        start = log.starts[finding.request]
        body = body_of(log, start, None)
        body.pop("cache_prompt", None)
        steps = [{"role": "writer", "label": "writes the prompt (under a fresh cache_salt: new to the server)",
                  "request": None, "body": body, "fresh_salt": True, "log": None},
                 {"role": "hit", "label": "the identical repeat", "request": start.request, "body": body,
                  "fresh_salt": False, "log": seen_of(log, start.request), "repeats": repeats}]
        extra = {"promised": ev.get("promised"), "prompt_tokens": ev.get("prompt_tokens"),
                 "second_cached": ev.get("second_cached")}
    described = finding_of(finding, index, of)
    described["request"] = start.request          # a server_error names none: the one it failed on
    return {"finding": described, "claim": claim, "run": run_of(log), "api": start.api,
            "code": start.code, "codes": {}, "single_group": False, "batched": False, "tolerance": 0.0,
            "fingerprint_tokens": 0, "cold_tolerance": 0, "steps": steps, **extra}


def flow_source(claim: str) -> str:
    """The script's code for a claim with a flow of its own (none: the cold / writers / hit flow)."""
    if claim in RESTORE_FLOWS:
        return RESTORE_FLOWS[claim]
    if claim in ("server_error", "reuse"):
        return _FLOWS
    return "FLOWS = {}\n\n\ndef add_arguments(parser):\n    pass"


_FLOWS = r'''def health(url, timeout):
    """Whether the server answers GET /v1/models (a listing of its models) at all."""
    try:
        with urllib.request.urlopen(url + "/v1/models", timeout=min(timeout, 30)) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def run_failed(url, args):
    """server_error: the request the server failed on, sent as the soak sent it."""
    if not health(url, args.timeout):
        raise Problem(f"{url}/v1/models: the server does not answer before anything is sent")
    step = PLAN["steps"][0]
    seen = step["log"]
    print(f"log: request {seen['request']} got no answer: {seen['error']}")
    for line in PLAN.get("last_lines") or []:
        print(f"log: the server's last output: {line.strip()[:200]}")
    failed = 0
    for i in range(args.repeats):
        try:
            answer = send(url, dict(step["body"]), args.timeout)
        except Problem as exc:
            if exc.status is not None and exc.status < 500:      # refused, not failed: a wrong URL or model
                raise Problem(f"{exc} (the server refused the request: not the failure the log saw)") from None
            alive = health(url, args.timeout)
            print(f"failed now: {exc}; the server {'still answers' if alive else 'no longer answers'} /v1/models")
            failed += 1
            if not alive:
                break
            continue
        print(f"failed now: answered ({show(answer)})")
    if failed:
        print(f"FAULT SHOWS: the server failed on {failed} of the requests sent")
        return 1
    print(f"fault no longer shows: the server answered the request {args.repeats} time(s)")
    return 0


def run_reuse(url, args):
    """reuse_short: the prompt written under a fresh salt, repeated, against the grid's promise."""
    writer, hit = PLAN["steps"]
    promised, short, known = PLAN["promised"], 0, 0
    print(f"log: request {hit['log']['request']} of {PLAN['prompt_tokens']} tokens reused "
          f"{hit['log']['cached_tokens']} where the grid promises {promised}; a second repeat reused "
          f"{PLAN.get('second_cached')}")
    for i in range(args.repeats):
        body = dict(writer["body"], cache_salt=f"hitproof-repro-{uuid.uuid4().hex[:12]}")
        first = send(url, body, args.timeout)
        repeat = send(url, body, args.timeout)
        second = send(url, body, args.timeout)
        print(f"round {i + 1}: writer {show(first)}; repeat cached {repeat['cached']}; a second repeat cached "
              f"{second['cached']} (promised {promised})")
        if repeat["cached"] is not None:
            known += 1
            short += repeat["cached"] < promised
    if not known:
        print("NOTHING TO JUDGE: the server does not report cached tokens")
        return 4
    if short:
        print(f"FAULT SHOWS on {short} of {known} first repeats: fewer tokens reused than the {promised} promised")
        return 1
    print(f"fault no longer shows: {known} of {known} first repeats reused at least the {promised} promised")
    return 0


FLOWS = {"server_error": run_failed, "reuse": run_reuse}


def add_arguments(parser):
    pass'''
