"""The soak engine: discovers the server, runs the phases, and speaks only through events."""

from __future__ import annotations

import asyncio
import collections
import time
import datetime as dt
import hashlib
import platform
import random
import secrets
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

from .. import __version__
from .client import OpenAIClient
from .errors import EXIT_INTERRUPTED, EXIT_SERVER, HitproofError, ServerProblem
from .isolation import IsolationResult, isolate
from .events import (CheckpointSeen, Event, EventBus, Finding, MetricsSample, PhaseFinished, PhaseStarted, RunFinished,
                     RunHeader, ServerInfo)
from .evidence import CodeBook, Registry, new_nonce
from .metrics import MetricSnapshot, block_size, compact, parse_metrics
from .phases import PHASES
from .requests import PhaseState, Requester
from .restarts import RestartWatch
from .scenario import Scenario
from .tokens import TokenCounter
from .verdicts import exit_code, run_verdict

DEFAULT_GRID = 16


@dataclass
class Target:
    """Where the soak points and how that server came to be (for the incident header)."""

    url: str
    engine: str | None = None            # "vllm" | "llamacpp" when hitproof launched it
    dialect: str | None = None           # forced dialect; None: detect
    launch_command: str | None = None
    env_of_interest: dict[str, str] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)
    exited: asyncio.Event | None = None  # set when a launched server process exits
    # () -> {"exit_code": int | None, "last_lines": [...]}: how a launched server ended
    exit_info: Callable[[], dict[str, Any]] | None = None
    # The incident record (tui.core.incident.build_incident): version, commit, model, quantization,
    # speculative decoding, cache config, cache reuse, overlays, env ... ; goes in the header.
    incident: dict[str, Any] = field(default_factory=dict)


@dataclass
class Outcome:
    verdict: str
    exit_code: int
    message: str = ""


class SoakEngine:
    def __init__(self, scenario: Scenario, target: Target, bus: EventBus, *, argv: list[str] | None = None,
                 metrics_interval: float = 1.0, isolate: bool = False):
        self.scenario = scenario
        self.target = target
        self.bus = bus
        self.argv = argv or sys.argv
        self.metrics_interval = metrics_interval
        self.nonce = new_nonce()
        self.registry = Registry()
        # Codes differ from run to run (seeded by the nonce): a state leaking in from an earlier
        # run can never pass for the request's own code.
        self.codes = CodeBook(random.Random(self.nonce))
        self.client = OpenAIClient(target.url, dialect=target.dialect or "vllm",
                                   timeout=scenario.request_timeout)
        self.metrics_available = False
        self.restarts = RestartWatch()   # counters going backwards, or refused then accepted again
        self.phase_states: list[PhaseState] = []
        self.isolate_findings = isolate
        self.findings: list[Finding] = []
        self.requester: Requester | None = None
        self.gate = asyncio.Event()      # cleared: the soak pauses before its next request
        self.gate.set()
        # Checkpoint lines of a launched llama-server, to tell each request where its hit came from.
        self.checkpoints: collections.deque[tuple[float, CheckpointSeen]] = collections.deque(maxlen=256)
        bus.subscribe(self._watch)

    def _watch(self, event: Event) -> None:
        if isinstance(event, CheckpointSeen):
            self.checkpoints.append((time.monotonic(), event))

    def checkpoints_since(self, since: float) -> list[CheckpointSeen]:
        return [event for at, event in self.checkpoints if at >= since]

    def emit(self, event: Event) -> Event:
        if isinstance(event, Finding):
            self.findings.append(event)
        return self.bus.emit(event)

    async def aclose(self) -> None:
        await self.client.aclose()

    async def isolate(self, finding: Finding) -> IsolationResult | None:
        """Re-send a flagged request alone, k times as hits and k times cold (k from the scenario)."""
        if self.requester is None or finding.request is None:
            return None
        return await isolate(self.requester, PhaseState(name=finding.phase), finding, self.scenario.isolation.k)

    # --- the run ------------------------------------------------------------------------

    async def run(self) -> Outcome:
        self.emit(self._header())
        work = asyncio.create_task(self._run_phases(), name="soak")
        watchers = [work]
        try:
            if self.target.exited is not None:
                watchers.append(asyncio.create_task(self.target.exited.wait(), name="server-exit"))
            watchers.append(asyncio.create_task(self.restarts.seen.wait(), name="server-restart"))
            done, _ = await asyncio.wait(watchers, return_when=asyncio.FIRST_COMPLETED)
            if work not in done:
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)
                raise ServerProblem(self.restarts.message or "the server process exited during the soak")
            for other in watchers[1:]:
                other.cancel()
            return work.result()
        except ServerProblem as exc:
            for other in watchers[1:]:
                other.cancel()
            exited = await self._server_exit()
            if exited is not None:     # a request failing because the server died: say that it died
                message, evidence = exited
                return self._abort("error", EXIT_SERVER, message, finding=True, evidence=evidence)
            restarted = await self.restarts.confirm(self.client) if self.requester is not None else None
            return self._abort("error", EXIT_SERVER, restarted or str(exc), finding=True)
        except HitproofError as exc:
            return self._abort("error", exc.exit_code, str(exc), finding=False)
        except asyncio.CancelledError:
            for task in watchers:
                task.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
            self._abort("interrupted", EXIT_INTERRUPTED, "interrupted by the user", finding=False)
            raise

    async def _server_exit(self, wait: float = 3.0) -> tuple[str, dict[str, Any]] | None:
        """(message, evidence) when the launched server process has exited (waiting a moment: a
        request can fail on the dead connection before the exit is noticed), else None."""
        exited = self.target.exited
        if exited is None:
            return None
        if not exited.is_set():
            try:
                await asyncio.wait_for(exited.wait(), wait)
            except asyncio.TimeoutError:
                return None
        info = dict(self.target.exit_info() if self.target.exit_info is not None else {})
        code = info.get("exit_code")
        lines = [line for line in info.get("last_lines") or [] if line.strip()]
        how = "was killed by signal %d" % -code if isinstance(code, int) and code < 0 else f"exited with code {code}"
        message = f"the server process {how} during the soak"
        if lines:
            message += f"; last output: {lines[-1].strip()[:300]}"
        return message, {"exit_code": code, "last_lines": lines[-20:]}

    def _abort(self, verdict: str, code: int, message: str, *, finding: bool,
               evidence: dict[str, Any] | None = None) -> Outcome:
        phase = self.phase_states[-1].name if self.phase_states else ""
        if finding:
            self.emit(Finding(kind="server_error", severity="fail", phase=phase, detail=message,
                              evidence=evidence or {}))
        if self.phase_states and not self.phase_states[-1].finished:
            state = self.phase_states[-1]
            state.finished = True
            self.emit(PhaseFinished(phase=state.name, status="fail" if finding else "inconclusive",
                                    reasons=[message], summary=state.summary()))
        self.emit(RunFinished(verdict=verdict, exit_code=code, message=message))
        return Outcome(verdict, code, message)

    async def _run_phases(self) -> Outcome:
        info = await self._discover()
        counter = TokenCounter(
            (lambda text: self.client.tokenize(text, info.model)) if info.tokenizer == "server" else None)
        requester = self.requester = Requester(self, counter, info)
        sampler = asyncio.create_task(self._sample_metrics(), name="metrics") if self.metrics_available else None
        try:
            for index, name in enumerate(self.scenario.phases):
                phase = PHASES[name]
                state = PhaseState(name=name)
                self.phase_states.append(state)
                self.emit(PhaseStarted(phase=name, index=index, title=phase.TITLE,
                                       **phase.plan(self.scenario)))
                state.metrics_before = await self.scrape()
                await phase.run(requester, state)
                state.metrics_after = await self.scrape()
                state.finished = True
                status, reasons = state.status()
                self.emit(PhaseFinished(phase=name, status=status, reasons=reasons, summary=state.summary()))
        finally:
            if sampler is not None:
                sampler.cancel()
                await asyncio.gather(sampler, return_exceptions=True)
        if self.isolate_findings:
            await self._isolate_flagged()
        statuses = [s.status()[0] for s in self.phase_states]
        fails = sum(s.fail_findings for s in self.phase_states)
        verdict = run_verdict(statuses, fails)
        message = {"pass": "every phase passed", "fail": f"{fails} fail-class finding(s)",
                   "inconclusive": "nothing failed, but some phase proved nothing"}[verdict]
        self.emit(RunFinished(verdict=verdict, exit_code=exit_code(verdict), message=message))
        return Outcome(verdict, exit_code(verdict), message)

    async def _isolate_flagged(self) -> None:
        done: set[int] = set()
        for finding in list(self.findings):
            if finding.severity in ("fail", "warn") and finding.request is not None and finding.request not in done:
                done.add(finding.request)
                await self.isolate(finding)

    # --- server discovery -----------------------------------------------------------------

    async def _discover(self) -> ServerInfo:
        models_body = await self.client.get_json("/v1/models")
        if models_body is None:
            raise ServerProblem(f"{self.target.url} answered but /v1/models is not an OpenAI model list")
        models = [m.get("id", "") for m in models_body.get("data", []) if isinstance(m, dict)]
        model = self.scenario.model or (models[0] if models else "")
        version_body = await self.client.get_json("/version")
        version = version_body.get("version") if isinstance(version_body, dict) else None
        dialect = self.target.dialect or await self._detect_dialect(models_body, version_body)
        self.client.dialect = dialect
        snapshot = await self.scrape(record=False)
        self.metrics_available = snapshot is not None and snapshot.error is None and bool(snapshot.values)
        server_grid = block_size(snapshot)
        if self.scenario.evidence.block_size:
            grid, grid_source = self.scenario.evidence.block_size, "scenario"
        elif server_grid:
            grid, grid_source = server_grid, "server"
        else:
            grid, grid_source = DEFAULT_GRID, "default"
        tokenizer = "server" if await self.client.tokenize("hitproof", model) is not None else "estimate"
        facts = dict(self.target.facts)
        if dialect == "llamacpp":
            props = await self.client.get_json("/props")
            if isinstance(props, dict):
                facts["props"] = {k: props[k] for k in ("total_slots", "build_info", "model_path", "n_ctx")
                                  if k in props}
                version = version or props.get("build_info")
        info = ServerInfo(
            url=self.target.url, dialect=dialect, version=version, models=models, model=model,
            cache_config=(snapshot.info.get("vllm:cache_config_info", {}) if snapshot else {}),
            grid=grid, grid_source=grid_source, tokenizer=tokenizer, metrics_available=self.metrics_available,
            salts="cache_prompt=false" if dialect == "llamacpp" else "cache_salt", facts=facts)
        self.emit(info)
        return info

    async def _detect_dialect(self, models_body: dict, version_body: Any) -> str:
        owners = {m.get("owned_by") for m in models_body.get("data", []) if isinstance(m, dict)}
        if "llamacpp" in owners:
            return "llamacpp"
        if await self.client.get_json("/props") is not None:
            return "llamacpp"
        if "sglang" in owners or await self.client.get_json("/get_server_info") is not None:
            return "sglang"
        if isinstance(version_body, dict) and "version" in version_body:
            return "vllm"
        return "openai"

    # --- metrics ------------------------------------------------------------------------

    async def scrape(self, record: bool = True) -> MetricSnapshot | None:
        try:
            response = await self.client.get("/metrics")
        except ServerProblem:
            return None
        if response.status_code != 200:
            return None
        snapshot = parse_metrics(response.text)
        if self.restarts.observe(snapshot):          # counters went back: another server now
            raise ServerProblem(self.restarts.message)
        if record and snapshot.error is None and snapshot.values:
            self.emit(MetricsSample(values=compact(snapshot)))
        return snapshot

    async def _sample_metrics(self) -> None:
        while True:
            await asyncio.sleep(self.metrics_interval)
            await self.scrape()

    # --- header ---------------------------------------------------------------------------

    def _header(self) -> RunHeader:
        s = self.scenario
        return RunHeader(
            run_id=f"{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}",
            nonce=self.nonce,
            started_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            tool={"name": "hitproof", "version": __version__, "python": platform.python_version(),
                  "argv": list(self.argv)},
            scenario={"name": s.name, "source": s.source,
                      "sha256": hashlib.sha256(s.text.encode()).hexdigest() if s.text else None,
                      "settings": s.to_dict(), "text": s.text},
            target=self._target_header(),
        )

    def _target_header(self) -> dict[str, Any]:
        s, t = self.scenario, self.target
        incident = dict(t.incident)
        reuse = incident.get("cache_reuse") or {}
        if incident:
            incident.setdefault("sampling", {"temperature": s.sampling.temperature, "seed": s.sampling.seed})
            incident.setdefault("hitproof_version", __version__)
        return {"url": t.url, "engine": t.engine,
                "launch_command": t.launch_command,
                "env": t.env_of_interest,
                "sampling": {"temperature": s.sampling.temperature, "seed": s.sampling.seed},
                "cache_reuse_forced_off": bool(reuse.get("forced_off", False)),
                "cache_reuse_decided_by": reuse.get("decided_by"),
                "profile": incident.get("profile"),
                "overlays": incident.get("overlays") or [],
                "incident": incident}
