"""A test proxy that answers in another order than it was asked, as a threaded gateway can.

Every request goes upstream on a connection of its own (`serve_catch_all`: nothing is kept alive,
so nothing serialises requests for us). `/metrics` is fetched from the server at once, and every
`delay_every`-th answer is then held `delay` seconds before it goes back: a scrape sent after it
comes back first, so the older body (smaller counters) arrives last. That is what made hitproof see
"the server restarted during the soak (its counter ... went back)" behind a plain proxy (issue 26).

Generations stream through chunk by chunk, with the per-request cached tokens removed
(usage.prompt_tokens_details, timings.cache_n) as `strip_usage` in corrupting_proxy does, so hits
can only be proven by the server's counters. Every `delay_every`-th generation holds its
`[DONE]` for `done_delay` seconds (its request ends late; time to first token is untouched).

`stale_every` (0: never) answers every such scrape with the body the scrape before the last got, as a
gateway caching /metrics would: an old answer even when scrapes are taken one at a time.
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import web
from support.loopback import serve_catch_all

GENERATIONS = ("/v1/completions", "/v1/chat/completions")


class ReorderingProxy:
    def __init__(self, upstream: str, *, delay: float = 0.4, delay_every: int = 2, done_delay: float = 0.05,
                 strip_usage: bool = True, stale_every: int = 0):
        self.upstream = upstream.rstrip("/")
        self.delay = delay
        self.delay_every = delay_every
        self.done_delay = done_delay
        self.strip_usage = strip_usage
        self.stale_every = stale_every
        self.stale = 0                # /metrics answered with an older body
        self._bodies: list[bytes] = []  # the last /metrics bodies the server gave
        self.url = ""
        self.scrapes = 0              # /metrics requests seen
        self.delayed = 0              # /metrics answers held back
        self.overtaken = 0            # held answers that a later scrape's answer overtook
        self.generations = 0
        self._answered = 0            # /metrics answers sent back so far

    async def start(self) -> "ReorderingProxy":
        self._session, self._runner, self.url = await serve_catch_all(self.handle)
        return self

    async def close(self) -> None:
        await self._runner.cleanup()
        await self._session.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.method == "POST" and request.path in GENERATIONS:
            return await self.generation(request, body)
        async with self._session.request(request.method, self.upstream + request.path_qs, data=body or None,
                                         headers={"Content-Type": request.headers.get("Content-Type", "")}) as up:
            status, raw, kind = up.status, await up.read(), up.content_type or "application/octet-stream"
        if request.path == "/metrics":
            self.scrapes += 1
            self._bodies = (self._bodies + [raw])[-3:]
            if self.stale_every and self.scrapes % self.stale_every == 0 and len(self._bodies) == 3:
                self.stale += 1
                raw = self._bodies[0]
            if self.scrapes % self.delay_every == 0:
                self.delayed += 1
                answered = self._answered
                await asyncio.sleep(self.delay)
                if self._answered > answered:
                    self.overtaken += 1
            self._answered += 1
        return web.Response(status=status, body=raw, content_type=kind)

    async def generation(self, request: web.Request, body: bytes) -> web.StreamResponse:
        self.generations += 1
        held = self.generations % self.delay_every == 0
        async with self._session.post(self.upstream + request.path, data=body,
                                      headers={"Content-Type": "application/json"}) as up:
            if up.status != 200:
                return web.Response(status=up.status, body=await up.read(), content_type="application/json")
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            async for line in up.content:
                text = line.decode()
                if text.startswith("data:") and text[5:].strip() == "[DONE]":
                    if held:
                        await asyncio.sleep(self.done_delay)
                elif text.startswith("data:") and self.strip_usage:
                    line = b"data: " + json.dumps(without_cached_tokens(json.loads(text[5:]))).encode() + b"\n"
                await response.write(line)
            await response.write_eof()
            return response


def without_cached_tokens(chunk: dict) -> dict:
    if isinstance(chunk.get("usage"), dict):
        chunk["usage"].pop("prompt_tokens_details", None)
    if isinstance(chunk.get("timings"), dict):
        chunk["timings"].pop("cache_n", None)
    return chunk
