"""One soak over what tui.runner.launch started: the incident probe, the recorder, the engine; the log
closed and its last failure reported whatever happens."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path
from typing import Callable

from ..core.config.errors import EXIT_LOG
from ..core.config.redact import Redactor, secrets_of
from ..core.config.scenario import Scenario
from ..core.log.events import EventBus
from ..core.log.recorder import Recorder
from ..core.server.incident import build_incident
from ..core.server.profiles import LaunchPlan
from ..core.soak.engine import Outcome, SoakEngine, Target
from ..core.soak.control import SoakControl
from ..core.soak.hooks import RunHooks
from .collector import soak_collector

PROBE_BUDGET = 20.0   # seconds the incident probe may take before the soak starts without it


def default_log_path() -> Path:
    return Path("logs") / f"hitproof-{dt.datetime.now():%Y%m%d-%H%M%S}.jsonl"


async def run_soak(scenario: Scenario, target: Target, hooks: RunHooks, *, bus: EventBus, record: Path | None,
                   argv: list[str] | None, isolate: bool, plan: LaunchPlan | None,
                   attach: Callable[[SoakEngine], None] | None) -> Outcome:
    """Run one soak. `hooks.after_run` runs while the server and client are still up (the app waits
    there until the user quits, so isolation re-runs can still reach the server); `attach` gives the
    engine to the launch's relays; the caller's `hooks.on_control` gets the soak's control surface.

    The incident record (tui.core.server.incident) is gathered first (a few GETs and one cold
    one-token completion) and goes in the run header; `plan` says how the server was launched."""
    if not target.incident:
        target.incident = await gather_incident(scenario, target, plan)
    engine = SoakEngine(scenario, target, bus, argv=argv, isolate=isolate, live_text_every=hooks.live_text_every,
                        tally=hooks.tally)
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
    for listener in hooks.listeners:
        bus.subscribe(listener)
    if attach is not None:
        attach(engine)
    if hooks.on_control is not None:
        hooks.on_control(SoakControl(engine))
    outcome: Outcome | None = None
    try:
        with soak_collector():
            outcome = await engine.run()
        if hooks.after_run is not None:
            await hooks.after_run(engine, outcome)
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
