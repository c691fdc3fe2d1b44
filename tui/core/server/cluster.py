"""Several servers hitproof launches and a router in front of them (a LaunchPlan with replicas): the
replicas started first (ready concurrently), then the router, until the router routes to every
replica; stopped router first; one replica restarted on purpose (the restore phase); an exit that was
not asked for is what the soak watches (`exited`), with the process named.

The one implementation for every such plan: a profile with [replicas], `hitproof run --engine E
--replicas N` (tui/embedded/router.py plans it), and the real-router tests. Each process's output goes
to its own line sink (the runner's ServerLogRelay), so a replica's crash line can name the replica.

    async with Cluster(plan) as cluster:       # replicas, then the router; everything stopped on exit
        ...  # cluster.url is the router; cluster.replica_urls the replicas behind it
"""

from __future__ import annotations

import asyncio
import shutil
import time
from typing import Callable, Sequence

import httpx

from .launch import LaunchError, ServerProcess
from .profiles import LaunchPlan
from .replicas import normalize, router_worker_health

ROUTING_TIMEOUT = 60.0      # after the router answers, until its metrics list every replica healthy

LineSink = Callable[[str], None]


class Cluster:
    def __init__(self, plan: LaunchPlan, *, replica_lines: Sequence[LineSink | None] = (),
                 router_lines: LineSink | None = None,
                 on_line_error: Callable[[Exception, str], None] | None = None):
        if not plan.replicas:
            raise ValueError("a cluster plan names at least one replica")
        self.plan = plan
        self._replica_lines = list(replica_lines) + [None] * (len(plan.replicas) - len(replica_lines))
        self._on_line_error = on_line_error       # a sink that raised: its line may have carried a finding
        self.replicas = [self._process(i) for i in range(len(plan.replicas))]
        self.router = ServerProcess(plan.argv, url=plan.url, env=plan.env, on_line=router_lines,
                                    on_line_error=on_line_error)
        self.exited = asyncio.Event()         # a process exited and nobody asked it to
        self.who = ""                         # which one
        self._restarting: set[int] = set()
        self._watchers: list[asyncio.Task] = []

    def _process(self, index: int) -> ServerProcess:
        p = self.plan.replicas[index]
        return ServerProcess(p.argv, url=p.url, env=p.env, on_line=self._replica_lines[index],
                             on_line_error=self._on_line_error)

    @property
    def url(self) -> str:
        return self.plan.url

    @property
    def replica_urls(self) -> list[str]:
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

    async def start(self, progress: Callable[[str], None] | None = None) -> None:
        say = progress or (lambda line: None)
        try:
            for i, process in enumerate(self.replicas):
                await process.start()
                say(f"started replica r{i} (pid {process.pid}): {process.command_line}")
                self._watch(process, f"replica r{i} ({process.url})", i)
            timeout = max(p.startup_timeout for p in self.plan.replicas)
            await asyncio.gather(*(p.wait_ready(timeout, progress) for p in self.replicas))
            say(f"{len(self.replicas)} replica(s) ready")
            await self.router.start()
            say(f"started the router (pid {self.router.pid}): {self.router.command_line}")
            self._watch(self.router, f"the router ({self.router.url})")
            await self.router.wait_ready(self.plan.startup_timeout, progress)
            await self._wait_routing()
        except BaseException:                 # Ctrl-C and errors alike: no orphan
            await self.stop()
            raise

    async def _wait_routing(self) -> None:
        """Both real routers answer /health before they have registered their workers: wait until the
        router's own metrics say every replica is healthy (a router whose metrics name no worker, like
        the reference router before its first request, is taken as ready)."""
        if not self.plan.router_metrics:
            return
        wanted = {normalize(u) for u in self.replica_urls}
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
        if self.plan.slot_dir:                # the run's own folder (made with the plan)
            shutil.rmtree(self.plan.slot_dir, ignore_errors=True)

    async def __aenter__(self) -> "Cluster":
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
