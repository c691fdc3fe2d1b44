"""The run summary, built by consuming the event stream (live or from a log)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from ..log.events import (Event, Finding, FingerprintCompared, IsolationFinished, PhaseFinished, PhaseStarted,
                          PowerJudged, ReplicasJudged, RequestFinished, ResumeCalibrated, RequestStarted, RunFinished, RunHeader,
                          ServerInfo)
from .power import EvidenceTally
from .tables import EndTable, StartTable
from .latency import LatencyFold
from .replicas import ReplicaFold
from ..checks.verdicts import exit_code, run_verdict

FINDING_KEYS = ("kind", "severity", "phase", "slot", "round", "request", "offset", "detail", "replica")


@dataclass
class RunReport:
    header: RunHeader | None = None
    server: ServerInfo | None = None
    phases: dict[str, dict[str, Any]] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    # per request, slim: what the summaries read (a night's soak keeps its memory flat); the full
    # events are in the log and, for the last few thousand requests, in the app's model
    starts: StartTable = field(default_factory=StartTable)
    ends: EndTable = field(default_factory=EndTable)
    isolations: dict[int, IsolationFinished] = field(default_factory=dict)
    fingerprints: dict[int, str] = field(default_factory=dict)     # request -> fingerprint verdict
    tally: EvidenceTally = field(default_factory=EvidenceTally)     # hits checked per kind of evidence
    # False: the soak's engine feeds `tally` (a live headless run hands the engine this one through RunHooks:
    # the same events in the same order, tallied once instead of twice a request); a replay feeds its own
    feeds_tally: bool = True
    power_target: PowerJudged | None = None
    resume: ResumeCalibrated | None = None      # what resuming costs on the server (issue 32)
    end: RunFinished | None = None
    warning: str | None = None
    last_t: float = 0.0
    latency: LatencyFold = field(default_factory=LatencyFold)    # TTFT cold vs hit per phase (tui.core.report.latency)
    replicas: ReplicaFold = field(default_factory=ReplicaFold)   # per replica, behind a router

    def feed(self, event: Event) -> None:
        if event.t > self.last_t:
            self.last_t = event.t
        handler = _FEEDERS.get(type(event))
        if handler is not None:
            handler(self, event)
            if self.feeds_tally and type(event) in _TALLIED:
                self.tally.feed(event)
            if type(event) in _REPLICATED:
                self.replicas.feed(event)

    def _on_header(self, event: RunHeader) -> None:
        self.header = event

    def _on_server(self, event: ServerInfo) -> None:
        self.server = event

    def _on_phase_start(self, event: PhaseStarted) -> None:
        self.phases[event.phase] = {"status": "running", "title": event.title,
                                    "planned_requests": event.planned_requests}

    def _on_phase_end(self, event: PhaseFinished) -> None:
        entry = self.phases.setdefault(event.phase, {})
        entry.update(event.summary)
        entry["status"] = event.status
        entry["reasons"] = event.reasons

    def _on_request_start(self, event: RequestStarted) -> None:
        self.starts.add(event)
        self.latency.start(event)

    def _on_request_end(self, event: RequestFinished) -> None:
        self.ends.add(event)
        self.latency.end(event)

    def _on_finding(self, event: Finding) -> None:
        self.findings.append(event)
        self.starts.pin(event.request)          # its row outlives the tables' window (tables.py)
        self.ends.pin(event.request)

    def _on_fingerprint(self, event: FingerprintCompared) -> None:
        self.fingerprints[event.request] = event.verdict

    def _on_isolation_end(self, event: IsolationFinished) -> None:
        self.isolations[event.request] = event

    def _on_run_end(self, event: RunFinished) -> None:
        self.end = event

    def _on_power(self, event: PowerJudged) -> None:
        self.power_target = event

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
        return run_verdict(statuses, fails, (self.power_target is None or self.power_target.reached)
                           and self.replicas.routing()[0])

    @property
    def exit_code(self) -> int:
        if self.end is not None:
            return self.end.exit_code
        return exit_code(self.verdict) if self.verdict != "incomplete" else 3

    def cache_hits(self) -> int:
        return self.ends.hits

    def to_json(self) -> dict[str, Any]:
        server = self.server
        return {
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "message": self.end.message if self.end else (self.warning or "the log ends before the run did"),
            "requests": len(self.starts),
            "cache_hits": self.cache_hits(),
            "phases": {name: {**phase, "ttft": self.latency.phase(name)} for name, phase in self.phases.items()},
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
            "resume": None if self.resume is None else {**self.resume.calibration, "detail": self.resume.detail},
            **({"replicas": self.replicas.to_json()} if self.replicas.active else {}),
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


_FEEDERS = {RunHeader: RunReport._on_header, ServerInfo: RunReport._on_server, PhaseStarted: RunReport._on_phase_start,
            PhaseFinished: RunReport._on_phase_end, RequestStarted: RunReport._on_request_start,
            RequestFinished: RunReport._on_request_end, Finding: RunReport._on_finding,
            FingerprintCompared: RunReport._on_fingerprint, IsolationFinished: RunReport._on_isolation_end,
            RunFinished: RunReport._on_run_end, PowerJudged: RunReport._on_power,
            ReplicasJudged: lambda report, event: None,
            ResumeCalibrated: lambda report, event: setattr(report, "resume", event)}
_TALLIED = frozenset({RequestStarted, RequestFinished, FingerprintCompared, Finding, PhaseFinished})
_REPLICATED = frozenset({ServerInfo, RequestStarted, RequestFinished, Finding, ReplicasJudged})


FED_TYPES = frozenset(cls.type for cls in _FEEDERS)     # the event types a RunReport reads; a log reader may skip the rest
