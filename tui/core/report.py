"""The run summary, built by consuming the event stream (live or from a log)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from .events import (Event, Finding, FingerprintCompared, IsolationFinished, PhaseFinished, PhaseStarted, RequestFinished, RequestStarted, RunFinished,
                     RunHeader, ServerInfo)
from .verdicts import exit_code, run_verdict

FINDING_KEYS = ("kind", "severity", "phase", "slot", "round", "request", "offset", "detail")


@dataclass
class RunReport:
    header: RunHeader | None = None
    server: ServerInfo | None = None
    phases: dict[str, dict[str, Any]] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    starts: dict[int, RequestStarted] = field(default_factory=dict)
    ends: dict[int, RequestFinished] = field(default_factory=dict)
    isolations: dict[int, IsolationFinished] = field(default_factory=dict)
    fingerprints: dict[int, str] = field(default_factory=dict)     # request -> fingerprint verdict
    end: RunFinished | None = None
    warning: str | None = None
    last_t: float = 0.0

    def feed(self, event: Event) -> None:
        self.last_t = max(self.last_t, event.t)
        if isinstance(event, RunHeader):
            self.header = event
        elif isinstance(event, ServerInfo):
            self.server = event
        elif isinstance(event, PhaseStarted):
            self.phases[event.phase] = {"status": "running", "title": event.title,
                                        "planned_requests": event.planned_requests}
        elif isinstance(event, PhaseFinished):
            entry = self.phases.setdefault(event.phase, {})
            entry.update(event.summary)
            entry["status"] = event.status
            entry["reasons"] = event.reasons
        elif isinstance(event, RequestStarted):
            self.starts[event.request] = event
        elif isinstance(event, RequestFinished):
            self.ends[event.request] = event
        elif isinstance(event, Finding):
            self.findings.append(event)
        elif isinstance(event, FingerprintCompared):
            self.fingerprints[event.request] = event.verdict
        elif isinstance(event, IsolationFinished):
            self.isolations[event.request] = event
        elif isinstance(event, RunFinished):
            self.end = event

    @classmethod
    def from_events(cls, events: Iterable[Event], warning: str | None = None) -> "RunReport":
        report = cls(warning=warning)
        for event in events:
            report.feed(event)
        return report

    # --- derived --------------------------------------------------------------------------

    @property
    def verdict(self) -> str:
        if self.end is not None and self.end.verdict in ("error", "interrupted"):
            return self.end.verdict
        statuses = [p.get("status") for p in self.phases.values() if p.get("status") != "running"]
        fails = sum(1 for f in self.findings if f.severity == "fail")
        if self.end is None and not fails:
            return "incomplete"
        return run_verdict(statuses, fails)

    @property
    def exit_code(self) -> int:
        if self.end is not None:
            return self.end.exit_code
        return exit_code(self.verdict) if self.verdict != "incomplete" else 3

    def cache_hits(self) -> int:
        return sum(1 for e in self.ends.values() if e.cached_tokens)

    def to_json(self) -> dict[str, Any]:
        server = self.server
        return {
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "message": self.end.message if self.end else (self.warning or "the log ends before the run did"),
            "requests": len(self.starts),
            "cache_hits": self.cache_hits(),
            "phases": self.phases,
            "findings": [self._finding(f) for f in self.findings],
            "run": {
                "run_id": self.header.run_id if self.header else None,
                "started_at": self.header.started_at if self.header else None,
                "scenario": (self.header.scenario.get("name") if self.header else None),
                "tool_version": (self.header.tool.get("version") if self.header else None),
                "duration_s": round(self.last_t, 2),
            },
            "server": None if server is None else {
                "url": server.url, "dialect": server.dialect, "version": server.version, "model": server.model,
                "grid": server.grid, "grid_source": server.grid_source, "tokenizer": server.tokenizer,
                "cache_config": server.cache_config,
                "launch_command": self.header.target.get("launch_command") if self.header else None,
            },
            "warning": self.warning,
        }

    def _finding(self, f: Finding) -> dict[str, Any]:
        data = {key: getattr(f, key) for key in FINDING_KEYS}
        data["memo"] = f.memo
        data["evidence"] = f.evidence
        iso = self.isolations.get(f.request) if f.request is not None else None
        if iso is not None and f.severity in ("fail", "warn"):
            data["isolation"] = {"verdict": iso.verdict, "for_kind": iso.kind, "k": iso.k, "hit_runs": iso.hit_runs, "cold_runs": iso.cold_runs,
                                 "reproduced": iso.reproduced, "cold_reproduced": iso.cold_reproduced,
                                 "detail": iso.detail}
        return data
