"""A reproduction plan (report/repro.py) rendered as a standalone Python script: the standard library
only (urllib, json, argparse), no hitproof. It carries the detectors hitproof judged with, copied
from their source (checks/detectors.py), so it checks the same claim the same way."""

from __future__ import annotations

import inspect
import json
from typing import Any

from ..checks import detectors
from .repro_other import flow_source

# The detectors the script needs, in order (a regex constant is written from its pattern).
_COPIED = ("_GROUP", "_SEPARATORS", "Recall", "check_recall", "ForeignCode", "find_foreign_codes", "is_empty",
           "Repetition", "_REPEAT", "find_repetition", "_may_repeat", "first_divergence", "ALTERNATIVE_FLOOR",
           "SPIKE_FACTOR", "FingerprintMatch", "position_entries", "fingerprint_match")


def detector_source() -> str:
    parts = []
    for name in _COPIED:
        value = getattr(detectors, name)
        if hasattr(value, "pattern"):
            parts.append(f"{name} = re.compile({value.pattern!r}, {int(value.flags)})")
        elif isinstance(value, (str, int, float)):
            parts.append(f"{name} = {value!r}")
        else:
            parts.append(inspect.getsource(value).rstrip())
    return "\n\n\n".join(parts)


def _plan_literal(plan: dict[str, Any]) -> str:
    # JSON inside r'''...''': a quote in the text is written \u0027, which json.loads reads back
    return "r'''" + json.dumps(plan, indent=1, ensure_ascii=True).replace("'", "\\u0027") + "'''"


def script_text(plan: dict[str, Any]) -> str:
    f, run = plan["finding"], plan["run"]
    doc = (f'"""Reproduce hitproof\'s finding {f["number"]} of {f["of"]}: {f["kind"]} in phase {f["phase"]}, '
           f'request {f["request"]}\n(run {run["run_id"]}, {run["dialect"]} {run["version"]} at {run["url"]}, '
           f'model {run["model"]}).\n')
    return "#!/usr/bin/env python3\n" + doc + _TEMPLATE.replace("@PLAN@", _plan_literal(plan)).replace(
        "@DETECTORS@", detector_source()).replace("@FLOWS@", flow_source(plan["claim"]))


_TEMPLATE = r'''
Python standard library only; it does not need hitproof. Usage:

    python3 THIS_FILE.py URL [--repeats K] [--timeout SECONDS]

URL is the server's base URL (http://HOST:PORT; a trailing /v1 is dropped). An API key, when the
server needs one, comes from HITPROOF_API_KEY or OPENAI_API_KEY. It sends, in order: the cold
reference (the hit's prompt under the control's cache_salt, re-sent under a fresh one if the server
still holds that salt's blocks), the requests that wrote the prefix, then the hit K times, each body
as the soak sent it (prompt, model or adapter, cache_salt, sampling); for a request the soak sent
together with other identities' (a partition batch), the hit is sent K times with those requests at
once, on threads, and judged whether or not anything was reused. It checks the claim hitproof
judged on each hit (the planted code, foreign codes, the fingerprint within the tolerance used,
an empty or repeating answer, as the finding's kind says) against the cold reference, and prints
what it saw next to what the log saw. A leak across identities sent alone re-sends the other
identity's request before each hit (and, when the claim was the reuse itself, counts the cached
tokens); a server that failed gets the request it failed on; a repeat that reused too little is
written under a fresh cache_salt and repeated, against the grid's promise.

Exit codes: 0 the fault no longer shows; 1 it shows; 2 a usage or connection error (one line);
4 nothing to judge (no re-sent hit was served from the cache, or no log-probabilities to compare).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import sys
import threading
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from typing import Mapping

PLAN = json.loads(@PLAN@)
# each request goes out with an X-Request-Id header: vLLM names it in its own log as cmpl-<id>
REQUEST_IDS = itertools.count(1)
RUN_TAG = uuid.uuid4().hex[:8]

# --- the detectors hitproof judged with (tui/core/checks/detectors.py, copied) ---------------

@DETECTORS@


@FLOWS@


# --- the wire ----------------------------------------------------------------------------------

class Problem(Exception):
    """A connection or HTTP error: one line, exit 2 (`status`: the HTTP status, None for a connection)."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


def parse_logprobs(data):
    """Both shapes: OpenAI chat / llama.cpp `content` entries, and legacy completions `tokens`."""
    out = []
    if isinstance(data.get("content"), list):
        for entry in data["content"]:
            top = [[alt.get("id", alt.get("token", "")), alt.get("logprob")] for alt in entry.get("top_logprobs") or []]
            out.append([entry.get("id", entry.get("token", "")), entry.get("logprob"), top])
        return out
    tokens, values, tops = data.get("tokens") or [], data.get("token_logprobs") or [], data.get("top_logprobs") or []
    for i, token in enumerate(tokens):
        top = tops[i] if i < len(tops) and isinstance(tops[i], dict) else {}
        out.append([token, values[i] if i < len(values) else None, [[k, v] for k, v in top.items()]])
    return out


def cached_of(usage, timings):
    """Cached prompt tokens as the server reports them (None: it does not say)."""
    details = (usage or {}).get("prompt_tokens_details") or {}
    if isinstance(details, dict) and details.get("cached_tokens") is not None:
        return int(details["cached_tokens"])
    if timings and timings.get("cache_n") is not None:
        return int(timings["cache_n"])
    return None


def send_together(url, bodies, timeout):
    """The bodies sent at once, each on its own thread (a server batches what arrives together); the
    answers in the bodies' order."""
    answers, problems = [None] * len(bodies), []

    def one(i):
        try:
            answers[i] = send(url, bodies[i], timeout)
        except Problem as exc:
            problems.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if problems:
        raise problems[0]
    return answers


def send(url, body, timeout):
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    request_id = f"repro-{RUN_TAG}-{next(REQUEST_IDS)}"
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream", "X-Request-Id": request_id}
    key = os.environ.get("HITPROOF_API_KEY") or os.environ.get("OPENAI_API_KEY")
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers=headers, method="POST")
    text, logprobs, usage, timings, finish = "", [], None, None, None
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            for raw in response:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if isinstance(chunk.get("error"), dict):       # an error inside the stream (vLLM's engine)
                    error = chunk["error"]
                    code = error.get("code") if isinstance(error.get("code"), int) else 500
                    raise Problem(f"{url}{path}: error in the stream: {str(error.get('message'))[:200]}", code)
                usage = chunk.get("usage") or usage
                timings = chunk.get("timings") or timings
                for choice in chunk.get("choices") or []:
                    text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                    if choice.get("logprobs"):
                        logprobs.extend(parse_logprobs(choice["logprobs"]))
                    finish = choice.get("finish_reason") or finish
    except urllib.error.HTTPError as exc:
        detail = " ".join(exc.read().decode("utf-8", "replace").split())[:200]
        raise Problem(f"{url}{path}: HTTP {exc.code}: {detail or exc.reason}", exc.code) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise Problem(f"{url}{path}: {getattr(exc, 'reason', None) or exc}") from None
    return {"text": text, "logprobs": logprobs, "cached": cached_of(usage, timings), "finish": finish,
            "id": request_id}


# --- the claim ----------------------------------------------------------------------------------

def wrong(answer, cold, claim):
    """What is wrong with `answer` in the sense of the finding's claim ("" when nothing is); `cold` is
    the cold reference's answer (None: judging the cold reference itself)."""
    text = answer["text"]
    if claim == "recall" and PLAN["code"]:
        recall = check_recall(text, PLAN["code"])
        return "" if recall.exact else f"code {PLAN['code']} {recall.status}"
    if claim == "foreign":
        found = [f for f in find_foreign_codes(text, PLAN["codes"], PLAN["code"]) if f.whole or PLAN["single_group"]]
        return "; ".join(f"code {f.code} of memo {f.owner} at offset {f.offset} ({f.matched!r})" for f in found)
    if claim == "empty":
        return "empty answer" if is_empty(text) else ""
    if claim == "repetition":
        rep = find_repetition(text)
        return f"{rep.unit!r} repeated {rep.count} times at offset {rep.offset}" if rep else ""
    if cold is None:
        return ""                               # the reference of a comparison cannot differ from itself
    if claim == "fingerprint":
        if not answer["logprobs"] or not cold["logprobs"]:
            return ""
        m = fingerprint_match(answer["logprobs"], cold["logprobs"], PLAN["fingerprint_tokens"])
        if m.matches(PLAN["tolerance"]):
            return ""
        return (f"fingerprint off its cold reference: {m.agreeing} tokens agree, {m.distance:.4f} nats apart at "
                f"most ({m.second:.4f} second), tolerance {PLAN['tolerance']}")
    if claim == "divergence":
        at = first_divergence(cold["text"], text)
        return "" if at is None else f"differs from the cold answer at character {at}"
    return ""


def show(answer):
    cached = "not reported" if answer.get("cached") is None else answer["cached"]
    sent = f" (X-Request-Id {answer['id']})" if answer.get("id") else ""
    return f"cached {cached}, answer {answer['text'][:70]!r}{sent}"


def main():
    class Parser(argparse.ArgumentParser):
        def error(self, message):
            print(f"repro: error: {message} (usage: python3 {os.path.basename(sys.argv[0])} URL "
                  f"[--repeats K] [--timeout S])", file=sys.stderr)
            sys.exit(2)

    parser = Parser(description="Reproduce a hitproof finding against URL.")
    parser.add_argument("url", help="the server's base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--repeats", type=int, default=PLAN["steps"][-1]["repeats"], help="hits to send")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    add_arguments(parser)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    url = args.url.rstrip("/")
    url = url[:-3] if url.endswith("/v1") else url
    if not url.startswith(("http://", "https://")):
        parser.error(f"{args.url}: not an http(s) URL")
    f, claim = PLAN["finding"], PLAN["claim"]
    print(f"finding {f['number']} of {f['of']}: {f['kind']} ({f['phase']}, request {f['request']}): {f['detail']}")
    print(f"claim checked: {claim}; server {url}")
    try:
        return run(url, args, claim)
    except Problem as exc:
        print(f"repro: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("repro: interrupted", file=sys.stderr)
        return 130


def run(url, args, claim):
    if claim in FLOWS:                          # a finding with a flow of its own (report/repro_other.py)
        return FLOWS[claim](url, args)
    tolerance = PLAN["cold_tolerance"]
    cold = None
    hits, hit_step = [], PLAN["steps"][-1]
    for step in PLAN["steps"]:
        body = dict(step["body"])
        if step["fresh_salt"] and PLAN["run"]["dialect"] == "llamacpp":
            body["cache_prompt"] = False            # llama.cpp has no salt: a cold request refuses reuse
        elif step["fresh_salt"] and "cache_salt" not in body:
            body["cache_salt"] = f"hitproof-repro-{uuid.uuid4().hex[:12]}"
        for _ in range(args.repeats if step is hit_step else 1):
            if step.get("before") and PLAN["run"]["dialect"] != "llamacpp":
                # each round in a namespace of its own, shared by the writers and the hit: the hit's own
                # state from the round before must not be what it reuses (llama.cpp has no salt; an
                # adapter change clears its slot instead)
                body["cache_salt"] = f"hitproof-repro-{uuid.uuid4().hex[:12]}"
            for other in step.get("before") or []:      # another identity writes the prompt first
                written = send(url, {**other["body"], **({"cache_salt": body["cache_salt"]} if "cache_salt" in body
                                                         else {})}, args.timeout)
                print(f"{'other':<6} now: {show(written)}  [{other['label']}]")
            if step.get("together"):            # the request and its batch mates, at once
                answer = send_together(url, [body, *step["together"]], args.timeout)[0]
            else:
                answer = send(url, body, args.timeout)
            if step["role"] == "cold" and (answer["cached"] or 0) > tolerance and "cache_salt" in body:
                print(f"  cold reference under salt {body['cache_salt']!r} had {answer['cached']} cached tokens (the "
                      f"server still holds it): sent again under a fresh salt")
                body["cache_salt"] = f"{body['cache_salt']}-repro-{uuid.uuid4().hex[:8]}"
                answer = send(url, body, args.timeout)
            if step["role"] == "cold":
                cold = answer
            if step is hit_step:
                hits.append(answer)
            print(f"{step['role']:<6} now: {show(answer)}  [{step['label']}]")
            seen = step.get("log")
            if seen and (step is not hit_step or len(hits) == 1):
                print(f"{'':<6} log (request {seen['request']}): {show({**seen, 'cached': seen['cached_tokens']})}")
    cold_wrong = wrong(cold, None, claim)
    if cold_wrong:
        print(f"the cold reference is wrong too ({cold_wrong}): the model, not the cache; the fault does not show")
        return 0
    if cold["cached"] is not None and cold["cached"] > tolerance:
        print(f"note: the cold reference was not cold ({cold['cached']} cached tokens)")
    if claim == "reuse_across":           # it reused what only the other identities had computed
        known = [h for h in hits if h["cached"] is not None]
        if not known:
            print("NOTHING TO JUDGE: the server does not report cached tokens")
            return 4
        leaked = [h for h in known if h["cached"] > tolerance]
        if leaked:
            print(f"FAULT SHOWS on {len(leaked)} of {len(known)} requests: {leaked[0]['cached']} cached tokens of a "
                  f"prompt only another identity had computed (at most {tolerance} may be shared)")
            return 1
        print(f"fault no longer shows: {len(known)} of {len(known)} requests reused at most {tolerance} tokens")
        return 0
    # a batch is judged whatever it reused (the fault is in the batch, not the cache)
    proven = hits if PLAN.get("batched") else [h for h in hits if h["cached"] is None or h["cached"] > tolerance]
    if not proven:
        print(f"NOTHING TO JUDGE: none of the {len(hits)} hits was served from the cache (cached tokens "
              f"{', '.join(str(h['cached']) for h in hits)})")
        return 4
    if claim == "fingerprint" and not (cold["logprobs"] and all(h["logprobs"] for h in proven)):
        print("NOTHING TO JUDGE: the server returned no log-probabilities, so no fingerprint can be compared")
        return 4
    shown = [(h, why) for h in proven for why in [wrong(h, cold, claim)] if why]
    unknown = " (cached tokens not reported: hits assumed)" if any(h["cached"] is None for h in proven) else ""
    if shown:
        print(f"FAULT SHOWS on {len(shown)} of {len(proven)} hits{unknown}: {shown[0][1]}; the cold reference is right")
        return 1
    print(f"fault no longer shows: {len(proven)} of {len(proven)} hits right{unknown}, as is the cold reference")
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''
