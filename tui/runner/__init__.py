"""Starts what a run names and runs the soak in it: the one way every run goes, headless, in the app,
in the matrix, and in the tests.

    outcome = await run(scenario, what, RunHooks(listeners=[...], progress=...), record=path)

`what` is a Target (attach), a LaunchPlan (a command, a profile's plan, replicas behind a router), a
Profile or an Embedded engine (launch.py starts it and always stops it); the soak itself is soak.py,
a launched server's output on the bus relay.py. Nothing here imports Textual."""

from __future__ import annotations

from pathlib import Path

from ..core.config.scenario import Scenario
from ..core.log.events import EventBus
from ..core.soak.engine import Outcome, Target
from ..core.soak.hooks import RunHooks
from .launch import Embedded, Launched, What, launched
from .relay import Relays, ServerLogRelay
from .soak import default_log_path, run_soak

__all__ = ["run", "RunHooks", "Embedded", "Target", "What", "Launched", "launched", "Relays", "ServerLogRelay",
           "default_log_path"]


async def run(scenario: Scenario, what: What, hooks: RunHooks | None = None, *, bus: EventBus | None = None,
              record: Path | None = None, argv: list[str] | None = None, isolate: bool = False) -> Outcome:
    """Start `what`, soak it, stop it. `bus`: the caller's, when it folds the events itself (a report
    subscribed before the run starts); `record`: the JSONL log; `argv`: the command line in the header."""
    hooks = hooks or RunHooks()
    bus = bus if bus is not None else EventBus()
    async with launched(what, bus, hooks) as up:
        outcome = await run_soak(scenario, up.target, hooks, bus=bus, record=record, argv=argv, isolate=isolate,
                                 plan=up.plan, attach=up.attach)
        return up.settle(outcome)
