"""A soak log read for a reproduction: the events it needs, each prompt rebuilt whole, and each
request's body as the soak's client sent it (tui.core.server.client: model or adapter, salt, sampling).

The log keeps every memo's text and each prompt's length and last 160 characters, so a prompt is
rebuilt exactly when it is its memo plus what those last characters hold (recall, summary and
determinism questions, the control phase, rotation); a prompt grown past that (a conversation turn,
a longer suffix) cannot be.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..log.events import (Finding, MemoPlanted, PhaseFinished, RequestFinished, RequestStarted, RunHeader,
                          ServerInfo)
from ..log.reader import iter_log

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
    if extra < 0:                 # the memo cut short (the restore phase's prefill ends where tokens align)
        return memo.text[:n] if memo.text[:n].endswith(tail) else None
    overlap = len(tail) - extra
    if extra < 0 or overlap < 1 or not memo.text.endswith(tail[:overlap]):
        return None
    return memo.text + tail[overlap:]


def identity_of(log: LoadedLog, start: RequestStarted) -> tuple[str, dict[str, Any]]:
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


def body_of(log: LoadedLog, start: RequestStarted, salt: str | None) -> dict[str, Any]:
    """The body the soak's client sent (tui.core.server.client: model, sampling, logprobs, salt)."""
    settings = log.settings()
    sampling, evidence = settings.get("sampling") or {}, settings.get("evidence") or {}
    end = log.ends.get(start.request)
    model, extra = identity_of(log, start)
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


def seen_of(log: LoadedLog, request: int | None) -> dict[str, Any] | None:
    """What the log saw of a request, for the script's side-by-side lines."""
    end = log.ends.get(request) if request is not None else None
    if end is None:
        return None
    checks = end.checks or {}
    return {"request": request, "cached_tokens": end.cached_tokens, "text": (end.text or "")[:400],
            "recall": (checks.get("recall") or {}).get("status"), "fingerprint": checks.get("fingerprint")}


def run_of(log: LoadedLog) -> dict[str, Any]:
    """The run a plan came from, as the script's header and the bug report name it."""
    server = log.server
    return {"run_id": log.header.run_id if log.header else None,
            "started_at": log.header.started_at if log.header else None,
            "url": server.url if server else None, "dialect": server.dialect if server else None,
            "version": server.version if server else None, "model": server.model if server else None}


def finding_of(finding: Finding, index: int, of: int) -> dict[str, Any]:
    """The finding a plan reproduces, as the script prints it."""
    ev = finding.evidence or {}
    return {"number": index, "of": of, "kind": finding.kind, "phase": finding.phase, "severity": finding.severity,
            "request": finding.request, "memo": finding.memo, "detail": finding.detail, "offset": finding.offset,
            "owner": ev.get("owner"), "code": ev.get("code")}
