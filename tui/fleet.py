"""Several servers hitproof launches and a router in front of them (a plan with replicas): started
replicas first (concurrently ready), then the router, until the router routes to every replica;
stopped router first; one replica restarted on purpose (the restore phase); an exit that was not
asked for is what the soak watches (`exited`), with the process named.

Each process's output goes through its own ServerLogRelay (tui.runner), so a replica's crash line
becomes an engine_log finding that names the replica. Nothing here imports Textual.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from typing import Callable

import httpx

from .core.server.launch import LaunchError, ServerProcess
from .core.server.profiles import LaunchPlan
from .core.server.replicas import normalize, router_worker_health

ROUTING_TIMEOUT = 60.0      # after the router answers, until its metrics list every replica healthy


class Fleet:
    def __init__(self, plan: LaunchPlan, relays: list[Callable[[str], None]], front_relay: Callable[[str], None]):
        self.plan = plan
        self.relays = relays
        self.replicas = [self._process(i) for i in range(len(plan.replicas))]
        self.router = ServerProcess(plan.argv, url=plan.url, env=plan.env, on_line=front_relay)
        self.exited = asyncio.Event()         # a process exited and nobody asked it to
        self.who = ""                         # which one
        self._restarting: set[int] = set()
        self._watchers: list[asyncio.Task] = []

    def _process(self, index: int) -> ServerProcess:
        p = self.plan.replicas[index]
        return ServerProcess(p.argv, url=p.url, env=p.env, on_line=self.relays[index])

    @property
    def urls(self) -> list[str]:
        return [p.url for p in self.plan.replicas]

    def _watch(self, process: ServerProcess, name: str, index: int | None = None) -> None:
        async def watch() -> None:
            await process.exited.wait()
            if index is not None and (index in self._restarting or process is not self.replicas[index]):
                return
            self.who = self.who or name
            self.exited.set()

        self._watchers.append(asyncio.ensure_future(watch()))

    def exit_info(self) -> dict:
        process = self.router
        for i, replica in enumerate(self.replicas):
            if replica.exited.is_set() and i not in self._restarting:
                process = replica
        return {"exit_code": process.returncode, "last_lines": list(process.recent_lines)[-20:],
                "process": self.who or "router"}

    async def start(self, progress: Callable[[str], None]) -> None:
        try:
            for i, process in enumerate(self.replicas):
                await process.start()
                progress(f"started replica r{i} (pid {process.pid}): {process.command_line}")
                self._watch(process, f"replica r{i} ({process.url})", i)
            timeout = max(p.startup_timeout for p in self.plan.replicas)
            await asyncio.gather(*(p.wait_ready(timeout, progress) for p in self.replicas))
            progress(f"{len(self.replicas)} replica(s) ready")
            await self.router.start()
            progress(f"started the router (pid {self.router.pid}): {self.router.command_line}")
            self._watch(self.router, f"the router ({self.router.url})")
            await self.router.wait_ready(self.plan.startup_timeout, progress)
            await self._wait_routing()
        except LaunchError:
            await self.stop()
            raise
        except BaseException:
            await self.stop()
            raise

    async def _wait_routing(self) -> None:
        """sglang-router answers /health before it has registered its workers: wait until the router's own
        metrics say every replica is healthy (a router whose metrics name no worker is taken as ready)."""
        if not self.plan.router_metrics:
            return
        wanted = {normalize(u) for u in self.urls}
        deadline = time.monotonic() + ROUTING_TIMEOUT
        async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
            while True:
                if self.router.exited.is_set():
                    raise LaunchError(f"the router exited with code {self.router.returncode}: {self.router.last_line()}")
                health = {}
                try:
                    health = router_worker_health((await client.get(self.plan.router_metrics)).text)
                except httpx.HTTPError:
                    pass
                if health and wanted <= {u for u, up in health.items() if up}:
                    return
                if time.monotonic() >= deadline:
                    if not health:
                        return
                    missing = ", ".join(sorted(wanted - {u for u, up in health.items() if up}))
                    raise LaunchError(f"the router does not route to {missing} after {ROUTING_TIMEOUT:.0f}s")
                await asyncio.sleep(0.25)

    async def restart(self, index: int, progress: Callable[[str], None] | None = None) -> None:
        """Stop replica `index` and start it again with the same command, port and slot folder."""
        self._restarting.add(index)
        try:
            old = self.replicas[index]
            await old.stop()
            process = self.replicas[index] = self._process(index)
            await process.start()
            self._watch(process, f"replica r{index} ({process.url})", index)
            await process.wait_ready(self.plan.replicas[index].startup_timeout, progress)
        finally:
            self._restarting.discard(index)

    async def stop(self) -> None:
        for task in self._watchers:
            task.cancel()
        await self.router.stop()
        await asyncio.gather(*(p.stop() for p in self.replicas), return_exceptions=True)
        if self.plan.slot_dir:
            shutil.rmtree(self.plan.slot_dir, ignore_errors=True)
