"""Wires a soak together: bus, recorder, listeners, and (when asked) a server hitproof launches.

Headless and the app both start soaks through here; nothing in this module imports Textual.
"""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
import time
from pathlib import Path
from typing import Awaitable, Callable

from .core.server import enginelog
from .core.soak.engine import Outcome, SoakEngine, Target
from .core.server.checkpoints import parse_checkpoint_line
from .core.log.events import CheckpointSeen, Event, EventBus, Finding, RunFinished, RunHeader, ServerLog
from .core.server.incident import build_incident
from .core.server.launch import LaunchError, ServerProcess, free_port
from .core.server.profiles import LaunchPlan, Profile, env_of_interest
from .core.log.recorder import Recorder
from .core.config.errors import EXIT_LOG, HitproofError, InternalError, ServerProblem
from .core.config.redact import Redactor, secrets_of
from .core.config.scenario import Scenario

PROBE_BUDGET = 20.0   # seconds the incident probe may take before the soak starts without it

Listener = Callable[[Event], None]


def default_log_path() -> Path:
    return Path("logs") / f"hitproof-{dt.datetime.now():%Y%m%d-%H%M%S}.jsonl"


class ServerLogRelay:
    """A launched server's output lines become ServerLog events, but only after the header (the log's
    first line); lines that mean trouble (tui.core.server.enginelog) also become `engine_log` findings,
    which the soak engine counts like any other: in the running phase, else the next one, else the last.
    After the run has ended, lines are still relayed (the app keeps the server for isolation re-runs)
    but make no findings; once the soak has returned (detach), they only go to `echo`.
    """

    MAX_PER_KIND = 20           # a crash loop must not bury the log in findings
    CONTEXT = 5                 # lines before the classified one kept in the evidence

    def __init__(self, bus: EventBus, echo: Callable[[str], None] | None = None, *, tag: str = "",
                 replica: int | None = None):
        self.bus = bus
        self.echo = echo
        self.tag = tag                  # several servers: each line says whose it is ("[r1] ...")
        self.replica = replica          # ... and a finding from a replica's line names it
        self.buffer: list[str] = []
        self.open = False
        self.detached = False
        self.engine: SoakEngine | None = None
        self.ended = False
        self.line_no = 0
        self.recent: collections.deque[str] = collections.deque(maxlen=self.CONTEXT)
        self.per_kind: collections.Counter[str] = collections.Counter()
        self.suppressed = 0
        self.on_error: Callable[[Exception, str], None] | None = None    # a line it could not relay
        self.redact: Callable[[str], str] | None = None      # the run's secrets out of every line

    def on_event(self, event: Event) -> None:
        if isinstance(event, RunHeader) and not self.open:
            asyncio.get_running_loop().call_soon(self._flush)
        elif isinstance(event, RunFinished):
            self.ended = True

    def _flush(self) -> None:
        self.open = True
        for line in self.buffer:
            try:
                self._emit(line)
            except Exception as exc:     # called from the loop: raising here would only be logged
                if self.on_error is None:
                    raise
                self.on_error(exc, line)
        self.buffer.clear()

    def __call__(self, line: str) -> None:
        if self.redact is not None:
            line = self.redact(line)
        if self.tag:
            line = f"[{self.tag}] {line}"
        if self.echo is not None:
            self.echo(line)
        if self.detached:
            return
        if self.open:
            self._emit(line)
        else:
            self.buffer.append(line)

    def _emit(self, line: str) -> None:
        self.line_no += 1
        self.bus.emit(ServerLog(line=line))
        checkpoint = parse_checkpoint_line(line)
        if checkpoint is not None:
            self.bus.emit(CheckpointSeen(kind=checkpoint.kind, slot=checkpoint.slot, n_tokens=checkpoint.n_tokens,
                                         n_past=checkpoint.n_past, reason=checkpoint.reason, line=checkpoint.raw))
        found = None if self.ended else enginelog.classify(line)
        if found is not None:
            kind, severity = found
            self.per_kind[kind] += 1
            if self.per_kind[kind] > self.MAX_PER_KIND:
                self.suppressed += 1
            else:
                self._finding(line, kind, severity)
        self.recent.append(line)

    def _finding(self, line: str, kind: str, severity: str) -> None:
        engine = self.engine
        running = engine.running_phase() if engine is not None else ""
        started = bool(engine is not None and engine.phase_states)
        self.bus.emit(Finding(
            kind="engine_log", severity=severity, phase=running,
            detail=f"server log ({kind.replace('_', ' ')}): {line.strip()[:400]}",
            evidence={"line": line, "match": kind, "matched": enginelog.matched_text(line),
                      "line_no": self.line_no, "before": list(self.recent),
                      "when": "running" if running else ("between phases" if started else "startup")},
            replica=self.replica))

    def detach(self) -> None:
        self.detached = True


AfterRun = Callable[[SoakEngine, Outcome], Awaitable[None]]


async def run_soak(scenario: Scenario, target: Target, *, bus: EventBus, record: Path | None,
                   listeners: list[Listener], argv: list[str] | None = None, isolate: bool = False,
                   after_run: AfterRun | None = None,
                   on_engine: Callable[[SoakEngine], None] | None = None,
                   plan: LaunchPlan | None = None, probe: bool = True) -> Outcome:
    """Run one soak. `after_run` runs while the server and client are still up (the app waits
    there until the user quits, so isolation re-runs can still reach the server).

    With `probe`, the incident record (tui.core.server.incident) is gathered first (a few GETs and one
    cold one-token completion) and goes in the run header; `plan` says how the server was launched."""
    if probe and not target.incident:
        target.incident = await gather_incident(scenario, target, plan)
    engine = SoakEngine(scenario, target, bus, argv=argv, isolate=isolate)
    redactor = Redactor(secrets_of(plan.argv if plan else None, plan.env if plan else None))
    # a log that can no longer be written stops the soak at once (exit 5, one line), not at the end;
    # API keys and tokens never reach it
    recorder = Recorder(record, on_failure=engine.stop_with, redact=redactor.line if redactor else None) \
        if record else None
    if recorder:
        try:
            await recorder.start()
        except BaseException:
            await engine.aclose()
            raise
        bus.subscribe(recorder)
    for listener in listeners:
        bus.subscribe(listener)
    if on_engine is not None:
        on_engine(engine)
    outcome: Outcome | None = None
    try:
        outcome = await engine.run()
        if after_run is not None:
            await after_run(engine, outcome)
    finally:
        await engine.aclose()
        if recorder:
            await recorder.close()
    if recorder is not None and recorder.failure is not None and outcome.exit_code != EXIT_LOG:
        # the last write (or the file's last check) failed after the soak had ended
        outcome = Outcome("error", EXIT_LOG, str(recorder.failure))
    return outcome


async def gather_incident(scenario: Scenario, target: Target, plan: LaunchPlan | None) -> dict:
    """The header's incident record; a server that does not answer the probe in time gets the
    record without the server's side (version, models, cache config, fingerprint)."""
    def make(probe: bool):
        return build_incident(
            url=target.url, argv=plan.argv if plan else None, env_of_interest=target.env_of_interest,
            child_env=plan.env if plan else None, facts=target.facts, overlays=plan.overlays if plan else [],
            profile=plan.profile if plan else None, engine=target.engine,
            sampling={"temperature": scenario.sampling.temperature, "seed": scenario.sampling.seed},
            scenario_seed=scenario.seed, model=scenario.model or None, probe=probe)

    try:
        return await asyncio.wait_for(make(True), PROBE_BUDGET)
    except asyncio.TimeoutError:
        incident = await make(False)
        incident["probe"] = {"probe_error": f"the server did not answer the probe within {PROBE_BUDGET:.0f}s"}
        return incident


async def run_launched(scenario: Scenario, plan: LaunchPlan, *, bus: EventBus, record: Path | None,
                       listeners: list[Listener], progress: Callable[[str], None], argv: list[str] | None = None,
                       isolate: bool = False, after_run: AfterRun | None = None,
                       on_engine: Callable[[SoakEngine], None] | None = None,
                       echo: Callable[[str], None] | None = None,
                       on_server: Callable[[ServerProcess], None] | None = None) -> Outcome:
    """Start a server, wait until it serves, soak it, and always stop it (no orphan): on the way out,
    on an error and on Ctrl-C (cancellation). A server that never serves is a ServerProblem (exit 3)
    whose message ends with the server's last output line."""
    if plan.replicas:
        return await run_fleet(scenario, plan, bus=bus, record=record, listeners=listeners, progress=progress,
                               argv=argv, isolate=isolate, after_run=after_run, on_engine=on_engine, echo=echo)
    relay = ServerLogRelay(bus, echo=echo)
    bus.subscribe(relay.on_event)
    failures: list[HitproofError] = []

    def relay_failed(exc: Exception, line: str) -> None:
        """A server line that could not be relayed may have carried a fail finding: the soak stops."""
        if failures:
            return
        failures.append(exc if isinstance(exc, HitproofError) else InternalError(
            f"relaying the server's output failed on the line {line.strip()[:80]!r} ({type(exc).__name__}: "
            f"{exc}); its engine-log findings could be lost, so the soak stops here"))
        if relay.engine is not None:
            relay.engine.stop_with(failures[0])

    relay.on_error = relay_failed
    redactor = Redactor(secrets_of(plan.argv, plan.env))
    relay.redact = redactor.text if redactor else None
    shown = redactor.command_line(plan.argv)          # the launch command as said and recorded
    server = ServerProcess(plan.argv, url=plan.url, env=plan.env, on_line=relay, on_line_error=relay_failed)

    def attach(engine: SoakEngine) -> None:
        relay.engine = engine
        if failures:
            engine.stop_with(failures[0])
        if on_engine is not None:
            on_engine(engine)

    name = (plan.profile or {}).get("name") or plan.engine or "server"
    prefix = f"profile {plan.profile['name']}: " if plan.profile else (f"{plan.engine}: " if plan.engine else "")
    try:
        try:
            await server.start()
        except LaunchError as exc:
            raise ServerProblem(f"{prefix}{exc}") from None
        if on_server is not None:
            on_server(server)
        progress(f"started {name} (pid {server.pid}): {shown}")
        started = time.monotonic()
        try:
            await server.wait_ready(plan.startup_timeout, progress)
        except LaunchError as exc:
            raise ServerProblem(f"{prefix}{exc} (waited for {plan.url}/health and /v1/models)") from None
        progress(f"server ready at {plan.url} after {time.monotonic() - started:.0f}s")
        target = Target(url=plan.url, engine=plan.engine, launch_command=shown,
                        env_of_interest=plan.env_of_interest, facts=plan.facts, exited=server.exited,
                        exit_info=lambda: {"exit_code": server.returncode,
                                           "last_lines": list(server.recent_lines)[-20:]})
        outcome = await run_soak(scenario, target, bus=bus, record=record, listeners=listeners, argv=argv,
                                 isolate=isolate, after_run=after_run, on_engine=attach, plan=plan)
        if failures and outcome.message != str(failures[0]):     # it failed after the soak had ended
            outcome = Outcome("error", failures[0].exit_code, str(failures[0]))
        return outcome
    finally:
        relay.detach()
        await server.stop()


async def run_fleet(scenario: Scenario, plan: LaunchPlan, *, bus: EventBus, record: Path | None,
                    listeners: list[Listener], progress: Callable[[str], None], argv: list[str] | None = None,
                    isolate: bool = False, after_run: AfterRun | None = None,
                    on_engine: Callable[[SoakEngine], None] | None = None,
                    echo: Callable[[str], None] | None = None) -> Outcome:
    """run_launched for a plan with replicas: the replicas, then the router in front of them (tui.fleet)."""
    from .fleet import Fleet

    relays = [ServerLogRelay(bus, echo=echo, tag=f"r{i}", replica=i) for i in range(len(plan.replicas))]
    front = ServerLogRelay(bus, echo=echo, tag="router")
    for relay in (*relays, front):
        bus.subscribe(relay.on_event)
    fleet = Fleet(plan, relays, front)

    def attach(engine: SoakEngine) -> None:
        for relay in (*relays, front):
            relay.engine = engine
        if on_engine is not None:
            on_engine(engine)

    prefix = f"profile {plan.profile['name']}: " if plan.profile else ""
    try:
        started = time.monotonic()
        try:
            await fleet.start(progress)
        except LaunchError as exc:
            raise ServerProblem(f"{prefix}{exc}") from None
        progress(f"router ready at {plan.url} in front of {len(plan.replicas)} replica(s) after "
                 f"{time.monotonic() - started:.0f}s")
        target = Target(url=plan.url, engine=plan.engine, launch_command=fleet.router.command_line,
                        env_of_interest=plan.env_of_interest, facts={**plan.facts, "replica_commands": [
                            p.command_line for p in plan.replicas]}, exited=fleet.exited,
                        exit_info=fleet.exit_info, replicas=fleet.urls, router_metrics=plan.router_metrics,
                        restart_replica=lambda i: fleet.restart(i, progress), slot_dir=plan.slot_dir)
        return await run_soak(scenario, target, bus=bus, record=record, listeners=listeners, argv=argv,
                              isolate=isolate, after_run=after_run, on_engine=attach, plan=plan)
    finally:
        for relay in (*relays, front):
            relay.detach()
        await fleet.stop()


async def run_embedded(scenario: Scenario, engine: str, model: str, *, bus: EventBus, record: Path | None,
                       listeners: list[Listener], progress: Callable[[str], None],
                       argv: list[str] | None = None, isolate: bool = False,
                       after_run: AfterRun | None = None,
                       on_engine: Callable[[SoakEngine], None] | None = None,
                       echo: Callable[[str], None] | None = None) -> Outcome:
    from .embedded import launch_spec    # the embedded engines are only needed here

    spec = launch_spec(engine, port=free_port(), model=model)
    plan = LaunchPlan(argv=spec.argv, url=spec.url, env=spec.env,
                      env_of_interest=env_of_interest(spec.env_of_interest, spec.env),
                      startup_timeout=spec.startup_timeout, engine=spec.engine, facts=spec.facts)
    return await run_launched(scenario, plan, bus=bus, record=record, listeners=listeners, progress=progress,
                              argv=argv, isolate=isolate, after_run=after_run, on_engine=on_engine, echo=echo)


async def run_embedded_cluster(scenario: Scenario, engine: str, model: str, replicas: int, *, router: str,
                               policy: str, **kwargs) -> Outcome:
    """N embedded servers of `engine` behind a real router (tui.embedded.router), llama.cpp with a
    shared slot folder (the restore phase), then as run_launched."""
    import tempfile

    from .embedded.router import plan_cluster

    slot_dir = tempfile.mkdtemp(prefix="hitproof-slots-") if engine == "llamacpp" else None
    try:
        cluster = plan_cluster(replicas, router=router, policy=policy, engine=engine, model=model,
                               worker_extra_args=("--slot-save-path", slot_dir) if slot_dir else ())
    except BaseException:
        if slot_dir:
            import shutil
            shutil.rmtree(slot_dir, ignore_errors=True)
        raise

    def plan_of(spec, **more) -> LaunchPlan:
        return LaunchPlan(argv=spec.argv, url=spec.url, env=spec.env,
                          env_of_interest=env_of_interest(spec.env_of_interest, spec.env),
                          startup_timeout=spec.startup_timeout, engine=spec.engine, facts=spec.facts, **more)

    plan = plan_of(cluster.front, replicas=[plan_of(w) for w in cluster.workers], router_metrics=cluster.metrics_url,
                   slot_dir=slot_dir)
    plan.engine = engine
    plan.facts = {**cluster.facts, **({"slot_dir": slot_dir} if slot_dir else {})}
    return await run_launched(scenario, plan, **kwargs)


async def run_profile(scenario: Scenario, profile: Profile, **kwargs) -> Outcome:
    """Launch a profile's server on a fresh port, soak it, stop it (see run_launched)."""
    from .embedded import placeholders    # {llama_server}, {models}, {chat_template}

    return await run_launched(scenario, profile.plan(placeholders=placeholders()), **kwargs)
