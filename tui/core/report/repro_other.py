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

OTHER_CLAIMS = {"server_error": "server_error", "reuse_short": "reuse"}


def failed_request(log: LoadedLog, finding: Finding) -> RequestStarted | None:
    """The first request of the finding's phase that got no answer (an error, or no end at all): the
    one the server failed on; the requests after it found it failing already."""
    failed = [s for s in log.starts.values() if (not finding.phase or s.phase == finding.phase)
              and (s.request not in log.ends or log.ends[s.request].error)]
    return min(failed, key=lambda s: s.request) if failed else None


def other_unreplayable(log: LoadedLog, finding: Finding) -> str | None:
    """Why a server_error or reuse_short finding cannot be replayed (None: it can)."""
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
    """The plan of a replayable server_error or reuse_short finding (see the module's doc)."""
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
