"""`hitproof report LOG --format issue`: a markdown bug report for an engine's tracker, all from the log.

The incident record (server, engine version, launch flags as recorded, already redacted by the
soak), one fail-class finding with its numbers, what was ruled out (the cold control, the salted
cold arm, the re-hits, the twin, an isolation re-run), and the reproduction script inline: the
same text `hitproof repro` writes (report/repro.py, report/repro_script.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config.errors import BadInput
from ..log.events import Finding
from ..log.reader import iter_log
from . import fmt
from .incident import incident_rows
from .report import FED_TYPES, RunReport
from .repro import REPEATS, LoadedLog, load, pick, plan_for, replayable
from .repro_script import script_text

SERVER_LINES = 20   # the server's lines quoted for a finding's requests: enough for a hit and its controls

_WHAT = {
    "recall_miss": "a prefix-cache hit answers without the code its prompt holds, while the same request cold "
                   "(a fresh cache_salt) gives it",
    "foreign_code": "a prefix-cache hit answers with a code planted in another request's prompt",
    "empty_answer": "a prefix-cache hit answers empty, while the same request cold does not",
    "repetition": "a prefix-cache hit collapses into one repeated token, while the same request cold does not",
    "fingerprint_mismatch": "a prefix-cache hit's greedy tokens and log-probabilities differ from the same "
                            "request's cold run beyond the tolerance",
    "foreign_state": "a prefix-cache hit continues as if from another request's state",
    "hit_path_divergence": "a prefix-cache hit's answer differs from the same request's cold run",
    "cache_path_divergence": "at temperature 0, hits answer differently from cold runs, while hits agree with "
                             "hits and cold runs with cold runs",
    "partition_leak": "a request under one identity (salt or adapter) answers from, or reuses, a state another "
                      "identity computed",
    "server_error": "the server failed on a request during the soak",
    "bad_restore": "a damaged slot file restored by the server answers wrong, while the same request cold is right",
}
# what the title calls the finding's place: most findings are about a hit
_WHERE = {"server_error": "during a prefix-cache soak", "bad_restore": "after a slot restore",
          "partition_leak": "across cache identities"}


def _fence(text: str, lang: str = "") -> str:
    ticks = "```"
    while ticks in text:
        ticks += "`"
    return f"{ticks}{lang}\n{text.rstrip()}\n{ticks}"


def _cell(value: Any) -> str:
    return fmt.word(value).replace("|", "\\|").replace("\n", " ")


def _request_line(log: LoadedLog, request: int | None) -> str:
    start, end = log.starts.get(request), log.ends.get(request)
    if start is None or end is None:
        return f"request {fmt.word(request)}: not in the log"
    salt = f"cache_salt `{start.salt}`" if start.salt else "no salt"
    recall = ((end.checks or {}).get("recall") or {}).get("status")
    named = f", the server's id `{end.server_id}`" if end.server_id else ""
    return (f"request {request} ({fmt.word(start.arm)}, {salt}, {fmt.word(end.cached_tokens)} cached of "
            f"{fmt.word(end.prompt_tokens)} prompt tokens" + (f", code {recall}" if recall else "") + named
            + f"): `{' '.join((end.text or '').split())[:120]}`")


def _server_lines(path: str | Path, request_ids: dict[str, int], cap: int = SERVER_LINES) -> list[str]:
    """The launched server's own lines (server_log events) that name one of these requests by the id
    hitproof sent (X-Request-Id; vLLM logs it inside its own ids), each tagged with the request."""
    out: list[str] = []
    if not request_ids:
        return out
    for event in iter_log(path, [], only=("server_log",)):
        line = getattr(event, "line", "")
        for rid, request in request_ids.items():
            # the id is followed by vLLM's own suffix ("-0-<hex>") or ends the word: "-1" is not "-12"
            at = line.find(rid)
            if at >= 0 and not line[at + len(rid):at + len(rid) + 1].isdigit():
                out.append(f"[request {request}] {line.rstrip()}")
                break
        if len(out) >= cap:
            break
    return out


def _ruled_out(log: LoadedLog, report: RunReport, finding: Finding) -> list[str]:
    ev = finding.evidence or {}
    out = []
    control = ev.get("control_request") or ev.get("cold_request") or ev.get("own_request")
    if control is not None:
        out.append(f"- **The cold control** (the same prompt, not served from the cache): {_request_line(log, control)}.")
    colds = [r for r in ev.get("control_requests") or [] if r in log.ends]
    if colds:
        out.append(f"- **The salt arm**: {len(colds)} more cold runs under fresh salts (requests "
                   f"{', '.join(map(str, colds))}); {fmt.word(ev.get('cold_reproduced'))} of {len(colds)} reproduce "
                   f"the cold fingerprint: the cold path is stable, so the model and its kernels are not the cause.")
    rehits = [r for r in ev.get("rehit_requests") or [] if r in log.ends]
    if rehits:
        out.append(f"- **The re-hits**: {len(rehits)} more hits (requests {', '.join(map(str, rehits))}); "
                   f"{fmt.word(ev.get('hit_reproduced'))} of {len(rehits)} repeat the deviation: it is "
                   f"reproducible, not a one-off.")
    if ev.get("twin_request") is not None:
        out.append(f"- **The twin** (a hit of the same prompt under a fresh salt, request {ev['twin_request']}): "
                   f"verdict `{fmt.word(ev.get('twin_verdict'))}`, {fmt.word(ev.get('twin_distance'))} nats from the "
                   f"hit (what resuming at a grid line costs, told apart from a wrong state).")
    if finding.kind == "foreign_code":
        out.append(f"- **No sampling can produce it**: code `{fmt.word(ev.get('code'))}` was planted only in memo "
                   f"{fmt.word(ev.get('owner'))}'s prompt, never in this request's.")
    iso = report.isolations.get(finding.request) if finding.request is not None else None
    if iso is not None:
        out.append(f"- **Isolation**: the request re-sent alone: reproduced on {iso.reproduced}/{iso.hit_runs} hits "
                   f"and {iso.cold_reproduced}/{iso.cold_runs} cold; verdict `{iso.verdict}` ({iso.detail}).")
    return out or ["- nothing beyond the finding itself is in the log"]


def _environment(log: LoadedLog, report: RunReport) -> list[str]:
    rows = incident_rows(report)
    server = log.server
    if server is not None:
        rows = [("server", f"{fmt.word(server.url)} ({fmt.word(server.dialect)})"), ("model served", server.model),
                ("cache config", fmt.kv(server.cache_config) or "not reported")] + rows
        if not any(k == "server version" for k, _ in rows):
            rows.append(("server version", server.version or "unknown"))
    lines = ["| | |", "|---|---|"] + [f"| {k} | {_cell(v)} |" for k, v in rows]
    return lines


def _server_section(path: str | Path, log: LoadedLog, finding: Finding) -> list[str]:
    """The server's log lines about the finding's hit and its controls, when hitproof launched the server
    and kept its output; else how to find them (the id each request was sent under)."""
    ev = finding.evidence or {}
    requests = [finding.request, ev.get("control_request") or ev.get("cold_request") or ev.get("own_request"),
                ev.get("twin_request")]
    ids = {log.starts[r].request_id: r for r in requests if r in log.starts and log.starts[r].request_id}
    if not ids:
        return []
    found = _server_lines(path, ids)
    sent = ", ".join(f"request {r} `{rid}`" for rid, r in ids.items())
    if not found:
        return ["## In the server's log", "",
                f"Each request went out with an `X-Request-Id` header (vLLM names the request after it: "
                f"`cmpl-<id>`): {sent}. The run kept none of the server's lines naming them (a server hitproof "
                f"did not launch, or one that logs no request ids).", ""]
    return ["## In the server's log", "", f"Sent with `X-Request-Id`: {sent}. The server's lines naming them:", "",
            _fence("\n".join(found)), ""]


def issue_markdown(path: str | Path, number: int | None = None, repeats: int = REPEATS) -> str:
    """The bug report for fail-class finding `number` (None: the first that can be replayed, else the
    first). A log without one: BadInput (exit 2)."""
    log = load(path)
    report = RunReport.from_events(iter_log(path, [], only=FED_TYPES))
    fails = log.fails
    if not fails:
        raise BadInput("the log has no fail-class finding: nothing to report as an issue")
    try:
        index, finding = pick(log, number)
        plan, why = plan_for(log, index, finding, repeats=repeats), None
    except BadInput:
        if number is not None and not 1 <= number <= len(fails):
            raise
        index = number or 1
        finding, plan = fails[index - 1], None
        why = replayable(log, finding)
    server = log.server
    engine = f"{fmt.word(server.dialect)} {server.version or '(version unknown)'}" if server else "the server"
    model = (server.model if server else None) or "unknown"
    where = _WHERE.get(finding.kind, "on a prefix-cache hit")
    lines = [f"# {finding.kind} {where} ({engine}, model {model})", "",
             f"{_WHAT.get(finding.kind, finding.kind).capitalize()}. Found by "
             f"hitproof {fmt.word(((log.header.tool if log.header else None) or {}).get('version'))} "
             f"(run `{fmt.word(log.header.run_id if log.header else None)}`, "
             f"{fmt.word(log.header.started_at if log.header else None)}); "
             f"finding {index} of {len(fails)} fail-class finding(s) in that run.", "",
             "## Environment (the incident record)", "", *_environment(log, report), ""]
    lines += ["## What was seen", "",
              f"- **{finding.kind}** in phase `{finding.phase}`, request "
              f"{fmt.word(finding.request if plan is None else plan['finding']['request'])}"
              + (f", memo `{finding.memo}`" if finding.memo else "")
              + (f", offset {finding.offset}" if finding.offset is not None else "") + ".",
              f"- {fmt.word(finding.detail)}"]
    if finding.request in log.ends:
        lines.append(f"- The hit: {_request_line(log, finding.request)}.")
        start = log.starts.get(finding.request)
        if start is not None and start.code:
            lines.append(f"- Its own code: `{start.code}`.")
    numbers = {k: v for k, v in (finding.evidence or {}).items() if isinstance(v, (int, float, str)) and v is not None}
    if numbers:
        lines += ["", "| evidence | value |", "|---|---|"] + [f"| {k} | {_cell(v)} |" for k, v in numbers.items()]
    lines += ["", "## What was ruled out", "", *_ruled_out(log, report, finding), ""]
    lines += _server_section(path, log, finding)
    lines += ["## Reproduce", ""]
    if plan is None:
        lines.append(f"No standalone script for this finding: {why}.")
    else:
        lines += [f"Python standard library only. Save as `repro.py` and run `python3 repro.py http://HOST:PORT` "
                  f"against a server started the same way: it sends the cold reference, the requests that wrote "
                  f"the prefix and the hit ({plan['steps'][-1]['repeats']} times), checks the claim "
                  f"(`{plan['claim']}`), prints what it saw next to what the log saw, and exits 1 while the fault "
                  f"shows, 0 once it does not.", "", "<details><summary>repro.py</summary>", "",
                  _fence(script_text(plan), "python"), "", "</details>"]
    verdict = fmt.word(report.end.verdict) if report.end else "incomplete"
    lines += ["", f"_The run: verdict {verdict}, {len(report.starts)} requests, {len(fails)} fail-class "
                  f"finding(s); scenario {fmt.word((log.settings() or {}).get('name'))}. Generated by "
                  f"`hitproof report LOG --format issue`._", ""]
    return "\n".join(lines)
