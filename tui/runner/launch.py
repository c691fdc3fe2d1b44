"""Starts what a run names and stops it on the way out (also on an error and on Ctrl-C: no orphan):

- a Target: a server already running (attach), nothing to start;
- a LaunchPlan (`--launch`, or a profile already planned): one server, or its replicas and the router
  in front of them (tui.core.server.cluster);
- a Profile: planned at start, on fresh ports (the matrix launches one after another);
- an Embedded engine (`--engine`, `--replicas`): planned by tui.embedded, then as a LaunchPlan.

`launched(what, bus, hooks)` yields a `Launched`: the Target the soak runs against and the handles
behind it (the server or the cluster, for restarts), with the relays of their output."""

from __future__ import annotations

import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator, Union

from ..core.config.errors import HitproofError, ServerProblem
from ..core.config.redact import Redactor, secrets_of
from ..core.log.events import EventBus
from ..core.server.cluster import Cluster
from ..core.server.launch import LaunchError, ServerProcess
from ..core.server.profiles import LaunchPlan, Profile
from ..core.soak.engine import Outcome, SoakEngine, Target
from ..core.soak.hooks import RunHooks
from .relay import Relays


@dataclass(frozen=True)
class Embedded:
    """An engine hitproof sets up and starts itself (`--engine E`), alone or `replicas` of it behind a
    real router (`--replicas N --router R --policy P`; None: tui.embedded.router's defaults)."""

    engine: str
    model: str = "gemma3-270m"
    replicas: int | None = None
    router: str | None = None
    policy: str | None = None


What = Union[Target, LaunchPlan, Profile, Embedded]


@dataclass
class Launched:
    """What the soak needs from what was started."""

    target: Target
    plan: LaunchPlan | None = None               # how it was launched (the incident header); None: attached
    server: ServerProcess | Cluster | None = None
    relays: Relays | None = None

    def attach(self, engine: SoakEngine) -> None:
        if self.relays is not None:
            self.relays.attach(engine)

    def settle(self, outcome: Outcome) -> Outcome:
        return self.relays.settle(outcome) if self.relays is not None else outcome


def plan_of(what: LaunchPlan | Profile | Embedded) -> LaunchPlan:
    """The launch plan, made now (fresh ports); a setup that is missing is one line, exit 2."""
    from ..embedded import SetupError, launch_plan, placeholders

    if isinstance(what, LaunchPlan):
        return what
    if isinstance(what, Profile):
        return what.plan(placeholders=placeholders())      # {llama_server}, {models}, {chat_template}
    try:
        return launch_plan(what.engine, model=what.model, replicas=what.replicas, router=what.router,
                           policy=what.policy)
    except SetupError as exc:
        raise HitproofError(str(exc)) from None


@asynccontextmanager
async def launched(what: What, bus: EventBus, hooks: RunHooks) -> AsyncIterator[Launched]:
    """Start `what`, wait until it serves, yield it; stop it however the block ends. A server that never
    serves is a ServerProblem (exit 3) whose message ends with the server's last output line."""
    if isinstance(what, Target):
        yield Launched(what)
        return
    plan = plan_of(what)
    redactor = Redactor(secrets_of(plan.argv, plan.env))
    relays = Relays(bus, hooks.echo, redactor or None)
    start = _start_cluster if plan.replicas else _start_server
    try:
        async with start(plan, relays, hooks, redactor) as up:
            yield up
    finally:
        relays.detach()


def _prefix(plan: LaunchPlan) -> str:
    """Whose start-up failed, at the head of the one line."""
    if plan.profile:
        return f"profile {plan.profile['name']}: "
    return f"{plan.engine}: " if plan.engine and not plan.replicas else ""


@asynccontextmanager
async def _start_server(plan: LaunchPlan, relays: Relays, hooks: RunHooks,
                        redactor: Redactor) -> AsyncIterator[Launched]:
    shown = redactor.command_line(plan.argv)          # the launch command as said and recorded
    server = ServerProcess(plan.argv, url=plan.url, env=plan.env, on_line=relays.new(),
                           on_line_error=relays.failed)
    name = (plan.profile or {}).get("name") or plan.engine or "server"
    try:
        try:
            await server.start()
        except LaunchError as exc:
            raise ServerProblem(f"{_prefix(plan)}{exc}") from None
        if hooks.on_server is not None:
            hooks.on_server(server)
        hooks.progress(f"started {name} (pid {server.pid}): {shown}")
        started = time.monotonic()
        try:
            await server.wait_ready(plan.startup_timeout, hooks.progress)
        except LaunchError as exc:
            raise ServerProblem(f"{_prefix(plan)}{exc} (waited for {plan.url}/health and /v1/models)") from None
        hooks.progress(f"server ready at {plan.url} after {time.monotonic() - started:.0f}s")
        target = Target(url=plan.url, engine=plan.engine, launch_command=shown,
                        env_of_interest=plan.env_of_interest, facts=plan.facts, exited=server.exited,
                        exit_info=lambda: {"exit_code": server.returncode,
                                           "last_lines": list(server.recent_lines)[-20:]})
        yield Launched(target, plan, server, relays)
    finally:
        await server.stop()


@asynccontextmanager
async def _start_cluster(plan: LaunchPlan, relays: Relays, hooks: RunHooks,
                         redactor: Redactor) -> AsyncIterator[Launched]:
    cluster = Cluster(plan, replica_lines=[relays.new(tag=f"r{i}", replica=i) for i in range(len(plan.replicas))],
                      router_lines=relays.new(tag="router"), on_line_error=relays.failed)
    try:
        started = time.monotonic()
        try:
            await cluster.start(hooks.progress)
        except LaunchError as exc:
            raise ServerProblem(f"{_prefix(plan)}{exc}") from None
        hooks.progress(f"router ready at {plan.url} in front of {len(plan.replicas)} replica(s) after "
                       f"{time.monotonic() - started:.0f}s")
        target = Target(url=plan.url, engine=plan.engine, launch_command=redactor.command_line(plan.argv),
                        env_of_interest=plan.env_of_interest,
                        facts={**plan.facts, "replica_commands": [redactor.command_line(p.argv) for p in plan.replicas]},
                        exited=cluster.exited, exit_info=cluster.exit_info, replicas=cluster.replica_urls,
                        router_metrics=plan.router_metrics, slot_dir=plan.slot_dir,
                        restart_replica=lambda i: cluster.restart(i, hooks.progress))
        yield Launched(target, plan, cluster, relays)
    finally:
        await cluster.stop()
