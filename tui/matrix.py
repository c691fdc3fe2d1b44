"""`hitproof matrix`: one scenario against a freshly launched server per profile, like an ablation table.

Profiles run one after the other (a fresh server each time, on a fresh port, stopped before the
next starts); each soak is recorded to DIR/<profile>.jsonl. After every profile, DIR/matrix.json
(a list of rows) and DIR/matrix.md (a PASS / FAIL / INCONCLUSIVE / ERROR table) are rewritten,
so an interrupted matrix still leaves the rows it finished. A row is what `hitproof report
--format json` says about that log, cut down to what an ablation table needs, plus how long the
profile took (launch, soak and stop). Nothing here imports Textual.

Exit code of the command: 0 when the matrix ran (every profile was tried, whatever its verdict:
the verdicts are in the files), 2 for bad input before anything is launched (a profile or the
scenario does not load, two profiles share a name), 130 when interrupted (the files keep the rows
done so far; the rest say "not_run").
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from .core.config.errors import EXIT_INTERRUPTED, BadInput, HitproofError
from .core.log.events import EventBus
from .core.server.profiles import Profile
from .core.report.report import RunReport
from .core.config.scenario import Scenario
from .core.server.launch import ServerProcess
from .core.soak.hooks import RunHooks

RESULT = {"pass": "PASS", "fail": "FAIL", "inconclusive": "INCONCLUSIVE", "error": "ERROR",
          "interrupted": "INTERRUPTED", "incomplete": "ERROR", "not_run": "NOT RUN"}


def check_names(profiles: list[Profile]) -> None:
    seen: dict[str, str] = {}
    for p in profiles:
        if p.name in seen:
            raise BadInput(f"two profiles are named {p.name!r} ({seen[p.name]} and {p.source}); each names its "
                           "log file, so names must differ")
        seen[p.name] = p.source


def pending_row(profile: Profile, scenario: Scenario) -> dict[str, Any]:
    return {"profile": profile.name, "description": profile.description, "profile_file": profile.source,
            "scenario": scenario.name, "verdict": "not_run", "exit_code": None, "message": "not run yet",
            "requests": 0, "cache_hits": 0,
            "findings": {"fail": 0, "warn": 0, "info": 0, "fail_kinds": [], "kinds": {}},
            "phases": {}, "log": None, "duration_s": 0.0, "startup_s": None, "soak_s": None, "server": {}}


def fill_row(row: dict[str, Any], report: RunReport, log: Path | None) -> dict[str, Any]:
    """The row for a profile whose soak started: verdict and counts from the log's own report."""
    data = report.to_json()
    counts = {"fail": 0, "warn": 0, "info": 0}
    kinds: dict[str, int] = {}
    fail_kinds: list[str] = []
    for f in report.findings:
        counts[f.severity] = counts.get(f.severity, 0) + 1
        kinds[f.kind] = kinds.get(f.kind, 0) + 1
        if f.severity == "fail" and f.kind not in fail_kinds:
            fail_kinds.append(f.kind)
    incident = ((report.header.target if report.header else {}) or {}).get("incident") or {}
    server, model = incident.get("server") or {}, incident.get("model") or {}
    reuse = incident.get("cache_reuse") or {}
    row.update({
        "verdict": data["verdict"], "exit_code": data["exit_code"], "message": data["message"],
        "requests": data["requests"], "cache_hits": data["cache_hits"],
        "findings": {**counts, "fail_kinds": sorted(fail_kinds), "kinds": dict(sorted(kinds.items()))},
        "phases": {name: phase.get("status") for name, phase in report.phases.items()},
        # behind a router (a profile with [replicas]): per replica requests, hits, findings
        "replicas": _replica_cells(report),
        "log": str(log) if log else None,
        # the bus clock starts before the launch: the header's t is the start-up (and probe) time
        "startup_s": round(report.header.t, 1) if report.header else None,
        "soak_s": round(report.last_t - (report.header.t if report.header else 0.0), 1),
        "server": {"version": server.get("version") or (report.server.version if report.server else None),
                   "commit": server.get("commit"), "system_fingerprint": server.get("system_fingerprint"),
                   "model": model.get("served") or (report.server.model if report.server else None),
                   "quantization": model.get("quantization"),
                   "speculative": (incident.get("speculative") or {}).get("method"),
                   "cache_reuse_forced_off": reuse.get("forced_off"), "cache_reuse_decided_by": reuse.get("decided_by"),
                   "launch_command": incident.get("launch_command")},
    })
    return row


def _replica_cells(report: RunReport) -> list[dict[str, Any]] | None:
    fold = report.replicas
    if not fold.active:
        return None
    return [{"label": r["label"], "url": r["url"], "requests": r["requests"], "hits": r["hits"],
             "fail": r["findings"]["fail"]} for r in fold.rows()]


# --- files ---------------------------------------------------------------------------------------

def _md(value: Any) -> str:
    text = "" if value is None else str(value)
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").replace("\r", " ")


def to_markdown(rows: list[dict[str, Any]], scenario: str = "") -> str:
    lines = [f"## hitproof matrix{': scenario ' + scenario if scenario else ''} ({len(rows)} profiles)", ""]
    width = max([len(r["profile"]) for r in rows] + [8])
    lines += ["```"] + [f"{r['profile']:<{width}}  {RESULT.get(r['verdict'], r['verdict'].upper())}" for r in rows] \
        + ["```", ""]
    header = ["profile", "what changed", "result", "exit", "requests", "cache hits", "findings f/w/i", "fail kinds",
              "cache reuse forced off", "replicas (hits/requests)", "duration s", "log"]
    lines += ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        f = r["findings"]
        off = (r.get("server") or {}).get("cache_reuse_forced_off")
        decided = (r.get("server") or {}).get("cache_reuse_decided_by")
        cells = [r["profile"], r.get("description") or "", f"**{RESULT.get(r['verdict'], r['verdict'])}**",
                 r["exit_code"], r["requests"], r["cache_hits"], f"{f['fail']}/{f['warn']}/{f['info']}",
                 ", ".join(f"`{k}`" for k in f["fail_kinds"]),
                 "" if off is None else ("yes" if off else "no") + (f" ({decided})" if off and decided else ""),
                 " ".join(f"{c['label']} {c['hits']}/{c['requests']}" for c in r.get("replicas") or []),
                 f"{r['duration_s']:.1f}", r["log"] or ""]
        lines.append("| " + " | ".join(_md(c) for c in cells) + " |")
    lines.append("")
    notes = [f"- **{r['profile']}**: {r['message']}" for r in rows if r["message"]]
    if notes:
        lines += notes + [""]
    return "\n".join(lines)


def write_files(out: Path, rows: list[dict[str, Any]], scenario: str = "") -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, text in (("matrix.json", json.dumps(rows, indent=2, ensure_ascii=False) + "\n"),
                       ("matrix.md", to_markdown(rows, scenario))):
        tmp = out / (name + ".partial")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(out / name)


# --- running -------------------------------------------------------------------------------------

async def run_matrix(scenario: Scenario, profiles: list[Profile], out: Path, *,
                     hooks: Callable[[Profile], RunHooks] = lambda p: RunHooks(),
                     on_row: Callable[[int, dict[str, Any]], None] = lambda i, row: None,
                     argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Run every profile in turn; returns the rows (also written to out after each profile).

    `hooks(profile)` is what that profile's run tells (its listeners, start-up progress, server
    output, the engine once it exists: the app pauses it), asked just before it launches (its
    on_server is the matrix's own: the server's last lines go in an error row); `on_row(i, row)`
    gets each finished row."""
    from .runner import run

    check_names(profiles)
    out.mkdir(parents=True, exist_ok=True)
    rows = [pending_row(p, scenario) for p in profiles]
    write_files(out, rows, scenario.name)
    for index, profile in enumerate(profiles):
        row = rows[index]
        log = out / f"{profile.name}.jsonl"
        report = RunReport()
        bus = EventBus()
        bus.subscribe(report.feed)
        told = hooks(profile)
        tail: list[ServerProcess] = []     # the server, for its last lines when it never served
        started = time.monotonic()
        row["message"] = "running"
        try:
            await run(scenario, profile, replace(told, on_server=tail.append), bus=bus, record=log, argv=argv)
            fill_row(row, report, log)
        except HitproofError as exc:
            if report.header is not None:
                fill_row(row, report, log)
            row.update(verdict="error", exit_code=exc.exit_code, message=str(exc))
            if tail:
                row["server_tail"] = [line for line in list(tail[0].recent_lines)[-20:] if line.strip()]
        except asyncio.CancelledError:
            if report.header is not None:
                fill_row(row, report, log)
            row.update(verdict="interrupted", exit_code=EXIT_INTERRUPTED, message="interrupted by the user")
            row["duration_s"] = round(time.monotonic() - started, 1)
            for later in rows[index + 1:]:
                later["message"] = "not run (the matrix was interrupted)"
            write_files(out, rows, scenario.name)
            raise
        row["duration_s"] = round(time.monotonic() - started, 1)
        write_files(out, rows, scenario.name)
        on_row(index, row)
    return rows


def row_line(index: int, total: int, row: dict[str, Any]) -> str:
    """One line per finished profile, for the console."""
    f = row["findings"]
    if row["verdict"] == "not_run" or row["exit_code"] is None:
        return f"[{index + 1}/{total}] {row['profile']}: {RESULT.get(row['verdict'], row['verdict'].upper())}: {row['message']}"
    kinds = f" ({', '.join(f['fail_kinds'])})" if f["fail_kinds"] else ""
    return (f"[{index + 1}/{total}] {row['profile']}: {RESULT.get(row['verdict'], row['verdict'])} "
            f"(exit {row['exit_code']}), {row['requests']} requests, {row['cache_hits']} cache hits, "
            f"findings {f['fail']}/{f['warn']}/{f['info']}{kinds}, {row['duration_s']:.1f} s"
            + (f", log {row['log']}" if row["log"] else "") + (f": {row['message']}" if row["verdict"] == "error" else ""))
