"""The soak engine: discovers the server, runs the phases, and speaks only through events."""

from __future__ import annotations

import asyncio, collections, random, sys, time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from ..server.client import OpenAIClient
from ..config.errors import EXIT_INTERRUPTED, EXIT_SERVER, HitproofError, ServerProblem
from .isolation import IsolationResult, isolate, why_not_isolated
from ..log.events import (CheckpointSeen, Event, EventBus, Finding, MetricsSample, PhaseFinished, PhaseStarted,
                          PowerJudged, RunFinished, ServerInfo)
from ..evidence.codes import CodeBook, Registry, new_nonce
from ..server.discovery import CACHE_REPORT_FIX, discover, probe_cache_report, scrape
from ..server.metrics import MetricSnapshot, block_size, compact
from .phases import PHASES
from ..report.power import EvidenceTally, hits_needed, target_sentence, upper_bound
from .context import SoakContext
from .header import run_header
from .record import DELTA_INTERVAL
from .memo_stock import memos_ahead
from .requester import Requester
from .state import PhaseState
from ..config.scenario import Scenario
from ..evidence.tokens import TokenCounter, load_estimator
from ..checks.verdicts import exit_code, run_verdict
from ..server.restarts import RestartWatch
from .cluster import ClusterView
from .width import admit_width

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
    # The incident record (tui.core.server.incident.build_incident): version, commit, model, quantization,
    # speculative decoding, cache config, cache reuse, overlays, env ... ; goes in the header.
    incident: dict[str, Any] = field(default_factory=dict)
    # Behind a router (url is the router's): the replicas' own URLs, the router's metrics endpoint,
    # and, when hitproof launched them, how to restart replica i and the folder their slots are saved in.
    replicas: list[str] = field(default_factory=list)
    router_metrics: str | None = None
    restart_replica: Callable[[int], Awaitable[None]] | None = None
    slot_dir: str | None = None


@dataclass
class Outcome:
    verdict: str
    exit_code: int
    message: str = ""


class SoakEngine:
    def __init__(self, scenario: Scenario, target: Target, bus: EventBus, *, argv: list[str] | None = None,
                 metrics_interval: float = 1.0, isolate: bool = False, live_text_every: float = DELTA_INTERVAL,
                 tally: EvidenceTally | None = None):
        self.scenario = scenario
        self.target = target
        self.bus = bus
        self.argv = argv or sys.argv
        self.metrics_interval, self.live_text_every = metrics_interval, live_text_every
        self.nonce = new_nonce()
        self.registry = Registry()
        # Codes differ from run to run (seeded by the nonce): a state leaking in from an earlier
        # run can never pass for the request's own code.
        self.codes = CodeBook(random.Random(self.nonce))
        self.client = OpenAIClient(target.url, dialect=target.dialect or "vllm", timeout=scenario.request_timeout)
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
        # hits checked per kind of evidence, for the power target (a headless run's report reads this one)
        self.tally = tally if tally is not None else EvidenceTally()
        self._running: PhaseState | None = None
        self._pending = {"fail": 0, "warn": 0, "info": 0}      # findings before the first phase started
        self._stop = asyncio.Event()     # stop_with: the soak ends now with that error
        self._stop_error: HitproofError | None = None
        self.cluster = (ClusterView(list(target.replicas), router_metrics=target.router_metrics,
                                    timeout=scenario.request_timeout, restarts=self.restarts,
                                    restart=target.restart_replica) if target.replicas else None)
        bus.subscribe(self._watch)

    def _watch(self, event: Event) -> None:
        """Every event on the bus: the tally, checkpoint lines, and each finding counted where it belongs
        (whoever emitted it: a phase, the judge, or the launched server's log relay)."""
        self.tally.feed(event)
        if self.cluster is not None:
            self.cluster.tally.feed(event)
        if isinstance(event, CheckpointSeen):
            self.checkpoints.append((time.monotonic(), event))
        elif isinstance(event, Finding):
            self.findings.append(event)
            self._count(event)

    def _count(self, finding: Finding) -> None:
        """A finding counts in the phase that is running; one before the first phase or between phases
        in the next phase; one after the last phase in the last phase (so the verdict sees it)."""
        if finding.severity not in self._pending:
            return
        state = self._running
        if state is None and self.phase_states and len(self.phase_states) >= len(self.scenario.phases):
            state = self.phase_states[-1]
        if state is None:
            self._pending[finding.severity] += 1
        else:
            state.findings[finding.severity] += 1

    def _start_phase(self, state: PhaseState) -> None:
        self.phase_states.append(state)
        self._running = state
        for severity, n in self._pending.items():
            state.findings[severity] += n
            self._pending[severity] = 0

    def _finish_phase(self, state: PhaseState) -> None:
        state.finished, self._running = True, None

    def checkpoints_since(self, since: float) -> list[CheckpointSeen]:
        return [event for at, event in self.checkpoints if at >= since]

    def emit(self, event: Event) -> Event:
        return self.bus.emit(event)

    def running_phase(self) -> str:
        """The name of the phase running now ("" between phases)."""
        return self._running.name if self._running is not None else ""

    def stop_with(self, error: HitproofError) -> None:
        """End the soak at once with this error (its line and exit code), e.g. a log that can no longer
        be written. The first call wins."""
        if self._stop_error is None:
            self._stop_error = error
            self._stop.set()

    async def aclose(self) -> None:
        await self.client.aclose()
        if self.cluster is not None:
            await self.cluster.aclose()

    async def isolate(self, finding: Finding) -> IsolationResult | None:
        """Re-send a flagged request alone, k times as hits and k times cold (k from the scenario)."""
        if self.requester is None or finding.request is None:
            return None
        return await isolate(self.requester, PhaseState(name=finding.phase), finding, self.scenario.isolation.k)

    # --- the run ------------------------------------------------------------------------

    async def run(self) -> Outcome:
        self.emit(run_header(self.scenario, self.target, self.nonce, self.argv))
        work = asyncio.create_task(self._run_phases(), name="soak")
        watchers = [work]
        try:
            if self.target.exited is not None:
                watchers.append(asyncio.create_task(self.target.exited.wait(), name="server-exit"))
            watchers.append(asyncio.create_task(self.restarts.seen.wait(), name="server-restart"))
            watchers.append(asyncio.create_task(self._stop.wait(), name="stop"))
            done, _ = await asyncio.wait(watchers, return_when=asyncio.FIRST_COMPLETED)
            if work not in done:
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)
                if self._stop_error is not None:
                    raise self._stop_error
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
        message = f"{info.get('process') or 'the server process'} {how} during the soak"
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
            self._finish_phase(state)
            self.emit(PhaseFinished(phase=state.name, status="fail" if finding else "inconclusive",
                                    reasons=[message], summary=state.summary()))
        self.emit(RunFinished(verdict=verdict, exit_code=code, message=message))
        return Outcome(verdict, code, message)

    async def _run_phases(self) -> Outcome:
        loading = asyncio.create_task(asyncio.to_thread(load_estimator))   # beside discovery's round trips
        info = admit_width(self.scenario, await self._discover())    # a width it cannot hold: exit 2
        await loading
        tokenizer = self.cluster.set.clients[0] if self.cluster else self.client
        counter = TokenCounter((lambda text: tokenizer.tokenize(text, info.model)) if info.tokenizer == "server" else None)
        requester = self.requester = Requester(SoakContext(
            scenario=self.scenario, server=info, client=self.client, emit=self.emit, nonce=self.nonce,
            codes=self.codes, registry=self.registry, gate=self.gate, scrape=lambda: self.scrape(record=False),
            checkpoints_since=self.checkpoints_since, checkpoints_seen=lambda: bool(self.checkpoints),
            tally=self.tally, metrics_available=self.metrics_available,
            replicas=self.cluster.set if self.cluster else None,
            replica_scrape=self.cluster.scrape if self.cluster else None,
            restart_replica=self.cluster.restart if self.cluster and self.cluster.can_restart else None,
            slot_dir=self.target.slot_dir, live_text_every=self.live_text_every), counter)
        requester.stock.order(memos_ahead(self.scenario, PHASES, info, bool(self.checkpoints)))   # sized meanwhile
        fix = info.cached_fix if info.cached_report != "request" else ""
        sampler = asyncio.create_task(self._sample_metrics(), name="metrics") if self.metrics_available else None
        try:
            for index, name in enumerate(self.scenario.phases):
                phase = PHASES[name]
                state = PhaseState(name=name, no_report_fix=fix)
                self._start_phase(state)
                self.emit(PhaseStarted(phase=name, index=index, title=phase.TITLE,
                                       **phase.plan(self.scenario)))
                state.metrics_before = await self.scrape()
                await requester.judge.calibrate(state)       # what resuming costs, once, at the start (resume.py)
                await phase.run(requester, state)
                state.metrics_after = await self.scrape()
                self._judge_counter_agreement(requester, state)
                self._finish_phase(state)
                status, reasons = state.status()
                self.emit(PhaseFinished(phase=name, status=status, reasons=reasons, summary=state.summary()))
        finally:
            await requester.stock.close()
            if sampler is not None:
                sampler.cancel()
                await asyncio.gather(sampler, return_exceptions=True)
        if self.isolate_findings:
            await self._isolate_flagged()
        power = self._judge_power()
        routing = self.emit(self.cluster.judge()) if self.cluster is not None else None
        statuses = [s.status()[0] for s in self.phase_states]
        fails = sum(s.fail_findings for s in self.phase_states)
        verdict = run_verdict(statuses, fails, (power is None or power.reached) and (routing is None or routing.routing_ok))
        message = {"pass": "every phase passed", "fail": f"{fails} fail-class finding(s)",
                   "inconclusive": "nothing failed, but some phase proved nothing"}[verdict]
        if power is not None and verdict != "fail":
            if verdict == "pass":
                message = f"every phase passed; {power.sentence}"
            else:
                message = f"{message}; {power.sentence}" if "inconclusive" in statuses else power.sentence
        if routing is not None and not routing.routing_ok and verdict != "fail":
            message = routing.detail if verdict == "inconclusive" and message.startswith("every phase") else \
                f"{message}; {routing.detail}"
        self.emit(RunFinished(verdict=verdict, exit_code=exit_code(verdict), message=message))
        return Outcome(verdict, exit_code(verdict), message)

    def _judge_counter_agreement(self, requester: Requester, state: PhaseState) -> None:
        """Per-request cached tokens must add up to the server counter's delta over the phase (the
        README's claim that hits are proven twice). Judged only where both are known."""
        if state.hits_agree() is not False:
            return
        summary = state.summary()
        requester.finding(state, "hits_disagree", "warn", None,
                          detail=f"per-request cached tokens add up to {summary['reported_cached_tokens']}, the "
                                 f"server's counter moved by {summary['metrics']['prefix_cache_hits']:.0f} over the "
                                 f"phase: one of them is wrong (or another client used the server)",
                          reported=summary["reported_cached_tokens"],
                          counter=summary["metrics"]["prefix_cache_hits"])

    def _judge_power(self) -> PowerJudged | None:
        """The scenario's power target, judged on every phase's checked hits (the same tally the
        report counts with)."""
        p = self.scenario.power
        if not p.fault_rate:
            return None
        evidence = self.scenario.power_evidence
        counts = self.tally.counts(p.confidence)[evidence]
        reached, sentence = target_sentence(evidence, counts["checked_hits"], counts["failures"], p.fault_rate,
                                            p.confidence)
        bound = upper_bound(counts["checked_hits"], counts["failures"], p.confidence)
        event = PowerJudged(evidence=evidence, fault_rate=p.fault_rate, confidence=p.confidence,
                            checked=counts["checked_hits"], failures=counts["failures"],
                            needed=hits_needed(p.fault_rate, p.confidence), reached=reached,
                            upper_bound=None if bound is None else round(bound, 6), sentence=sentence)
        self.emit(event)
        return event

    async def _isolate_flagged(self) -> None:
        """Each flagged request once, for its most telling finding: fail before warn, a kind that
        can be isolated before one that cannot (that one only says why not)."""
        chosen: dict[int, Finding] = {}
        for finding in self.findings:
            if finding.severity not in ("fail", "warn") or finding.request is None:
                continue
            rank = (finding.severity != "fail", why_not_isolated(finding.kind) is not None)
            best = chosen.get(finding.request)
            if best is None or rank < (best.severity != "fail", why_not_isolated(best.kind) is not None):
                chosen[finding.request] = finding
        for request in sorted(chosen):
            await self.isolate(chosen[request])

    # --- server discovery -----------------------------------------------------------------

    async def _discover(self) -> ServerInfo:
        found = await discover(self.client, dialect=self.target.dialect)
        models = found.model_ids
        if self.cluster is not None:      # a router's own answers are not a server's: ask replica 0
            found = await self.cluster.discover(self.target.dialect)
            found.metrics = await self.cluster.combined()
            models = [m for m in models if m and m != "unknown"] or found.model_ids
        # not an adapter listed as a model; behind a router its list (replica 0's ids end in @0)
        bases = models if self.cluster is not None else (found.base_model_ids or models)
        model = self.scenario.model or (bases[0] if bases else "")
        dialect = self.client.dialect = found.dialect
        snapshot = found.metrics
        self.metrics_available = found.metrics_available
        server_grid = block_size(snapshot)
        if self.scenario.evidence.block_size:
            grid, grid_source = self.scenario.evidence.block_size, "scenario"
        elif server_grid:
            grid, grid_source = server_grid, "server"
        else:
            grid, grid_source = DEFAULT_GRID, "default"
        tokenizer_client = self.cluster.set.clients[0] if self.cluster else self.client
        tokenizer = "server" if await tokenizer_client.tokenize("hitproof", model) is not None else "estimate"
        facts = dict(self.target.facts)
        version = found.version
        if dialect == "llamacpp" and found.props is not None:
            facts["props"] = found.props
            version = version or found.props.get("build_info")
        report, counter, queries = await probe_cache_report(self.client, self.scenario.api, model, self.nonce,
                                                            snapshot if self.metrics_available else None)
        replicas = {}
        if self.cluster is not None:
            await self.cluster.probe(self.client, self.scenario.api, model, self.nonce)
            replicas = {"replicas": self.cluster.server_facts(), "replica_attribution": self.cluster.method}
        info = ServerInfo(
            url=self.target.url, dialect=dialect, version=version, models=models, model=model,
            cache_config=found.cache_config, grid=grid, grid_source=grid_source, tokenizer=tokenizer,
            metrics_available=self.metrics_available,
            salts="cache_prompt=false" if dialect == "llamacpp" else "cache_salt", facts=facts,
            cached_report=report, cached_counter=counter, cached_queries=queries,
            cached_fix=CACHE_REPORT_FIX.get(dialect, CACHE_REPORT_FIX["openai"]), adapters=found.adapters, **replicas)
        self.emit(info)
        return info

    # --- metrics ------------------------------------------------------------------------

    async def scrape(self, record: bool = True) -> MetricSnapshot | None:
        """The server's metrics (behind a router: every replica's, summed), watched for restarts."""
        snapshot = await self.cluster.combined() if self.cluster is not None else await scrape(self.client)
        if self.cluster is None and snapshot is not None and self.restarts.observe(snapshot):   # counters went back
            raise ServerProblem(self.restarts.message)
        if record and snapshot is not None and snapshot.error is None and snapshot.values:
            self.emit(MetricsSample(values=compact(snapshot)))
        return snapshot

    async def _sample_metrics(self) -> None:
        while True:
            await asyncio.sleep(self.metrics_interval)
            await self.scrape()
