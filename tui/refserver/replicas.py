"""Several reference servers behind a small router, for the fast tests of `--replica` (the claims
about real routers are shown on vllm-router and sglang-router, tests/real/test_real_replicas.py).

    cluster = await start_replicas(2, faults={1: "foreign_state"}, policy="round_robin")
    ... cluster.url (the router), cluster.replica_urls, cluster.metrics_url (the router's own counters)
    await cluster.close()

    python -m tui.refserver.router --port 0 --worker-urls URL URL [--policy sticky] [--served-by-header]

Each replica is a whole reference server with its own cache, counters and fault. The router
forwards every request to one replica (round_robin, or `sticky`: the same replica for the same
first 200 characters of the prompt, like a consistent-hash policy) and passes the answer through
byte for byte, like the real routers. What names the replica to a client is chosen per cluster,
as it differs between real setups:

- `names="model"`: replica i serves as MODEL@i (llama-server's --alias does the same), so the
  answer's `model` field names it;
- `names="header"`: every replica serves as MODEL and the router adds `x-served-by: HOST:PORT`;
- `names="none"`: nothing names it: only the replicas' counters (and the router's) can tell.

The router's own metrics (`/router/metrics`) count requests per worker in vllm-router's names.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from .server import RefServerHandle, start_refserver

POLICIES = ("round_robin", "sticky")
NAMES = ("model", "header", "none")


@dataclass
class RouterHandle:
    url: str
    metrics_url: str
    worker_urls: list[str]
    routed: dict[str, int] = field(default_factory=dict)      # worker url -> requests forwarded and answered
    _runner: web.AppRunner | None = None
    _session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()


@dataclass
class ReplicaCluster:
    router: RouterHandle
    replicas: list[RefServerHandle]

    @property
    def url(self) -> str:
        return self.router.url

    @property
    def metrics_url(self) -> str:
        return self.router.metrics_url

    @property
    def routed(self) -> dict[str, int]:
        return self.router.routed

    @property
    def replica_urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    async def close(self) -> None:
        await self.router.close()
        for replica in self.replicas:
            await replica.close()

    async def __aenter__(self) -> "ReplicaCluster":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def start_replicas(n: int = 2, *, faults: dict[int, str] | None = None, policy: str = "round_robin",
                         names: str = "model", model_name: str = "refmodel",
                         replica_options: dict[int, dict] | None = None, **options: object) -> ReplicaCluster:
    """n reference servers (each with `options`, `faults[i]` and `replica_options[i]`) and a router."""
    if n < 1:
        raise ValueError("a cluster needs at least one replica")
    if names not in NAMES:
        raise ValueError(f"unknown names {names!r}; choose from {', '.join(NAMES)}")
    replicas: list[RefServerHandle] = []
    try:
        for i in range(n):
            own = {**options, **(replica_options or {}).get(i, {})}
            served = f"{model_name}@{i}" if names == "model" else model_name
            replicas.append(await start_refserver(fault=(faults or {}).get(i, "none"), model_name=served, **own))
        router = await start_router([r.url for r in replicas], policy=policy, served_by=names == "header")
    except BaseException:
        for replica in replicas:
            await replica.close()
        raise
    return ReplicaCluster(router, replicas)


async def start_router(worker_urls: list[str], *, policy: str = "round_robin", served_by: bool = False,
                       port: int = 0) -> RouterHandle:
    """A router on 127.0.0.1:port in front of `worker_urls` (any OpenAI-compatible servers)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    if not worker_urls:
        raise ValueError("a router needs at least one worker")
    urls = [u.rstrip("/") for u in worker_urls]
    handle = RouterHandle("", "", urls, {u: 0 for u in urls})
    session = handle._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900))
    turn = itertools.count()

    def choose(body: bytes) -> str:
        if policy == "sticky":
            digest = hashlib.sha1(_prompt_head(body).encode()).digest()
            return urls[digest[0] % len(urls)]
        return urls[next(turn) % len(urls)]

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        generation = request.method == "POST" and request.path in ("/v1/completions", "/v1/chat/completions")
        upstream = choose(body) if generation else urls[0]
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        try:
            up_cm = session.request(request.method, upstream + request.path_qs, data=body or None, headers=headers)
            async with up_cm as up:
                out = web.StreamResponse(status=up.status, headers={
                    "Content-Type": up.headers.get("Content-Type", "application/octet-stream")})
                if served_by:
                    out.headers["x-served-by"] = upstream.split("://", 1)[1]
                await out.prepare(request)
                async for data in up.content.iter_any():
                    await out.write(data)
                await out.write_eof()
        except aiohttp.ClientError as exc:
            return web.json_response({"error": {"message": f"router: worker {upstream} failed: {exc}"}}, status=502)
        if generation and up.status == 200:
            handle.routed[upstream] += 1
        return out

    async def router_metrics(request: web.Request) -> web.Response:
        lines = ["# HELP vllm_router_processed_requests_total Requests processed per worker",
                 "# TYPE vllm_router_processed_requests_total counter"]
        lines += [f'vllm_router_processed_requests_total{{worker="{url}"}} {float(count)!r}'
                  for url, count in handle.routed.items()]
        lines += ["# HELP vllm_router_worker_health Worker health", "# TYPE vllm_router_worker_health gauge"]
        lines += [f'vllm_router_worker_health{{worker="{url}"}} 1.0' for url in urls]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def health(request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def no_metrics(request: web.Request) -> web.Response:
        return web.Response(status=404, text="the router has no /metrics of the workers")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_get("/health", health)
    app.router.add_get("/router/metrics", router_metrics)
    app.router.add_get("/metrics", no_metrics)
    app.router.add_route("*", "/{tail:.*}", forward)
    runner = handle._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    try:
        await site.start()
    except BaseException:
        await handle.close()
        raise
    bound = runner.addresses[0][1]
    handle.url = f"http://127.0.0.1:{bound}"
    handle.metrics_url = f"{handle.url}/router/metrics"
    return handle


def _prompt_head(body: bytes) -> str:
    import json

    try:
        data = json.loads(body)
    except ValueError:
        return ""
    if isinstance(data.get("prompt"), str):
        return data["prompt"][:200]
    messages = data.get("messages") or []
    return str(messages[0].get("content", ""))[:200] if messages and isinstance(messages[0], dict) else ""
