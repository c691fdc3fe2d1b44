"""A test proxy in front of a server with a speculative drafter that makes the drafter useless on
prefix-cache hits, the way a real server does when the drafter's own state is not restored with the
target's cache (the draft model's KV, or the hidden states an EAGLE head drafts from, are missing
for the cached positions): the drafter still proposes every draft, the target rejects them all.

What such a server reports, and so what the proxy rewrites, consistently:
  - the answer itself is unchanged (speculative decoding verifies every drafted token with the
    target model: drafts that are all rejected cost time, never change the text);
  - per request (llama.cpp): `timings.draft_n` as before, `timings.draft_n_accepted` 0;
  - /metrics: the drafts counters move as before (`*spec_decode_num_drafts_total`,
    `*_num_draft_tokens_total`), the accepted-token counters (`*spec_decode_num_accepted_tokens_total`
    and its per-position series) do not move for a hit: the proxy subtracts, series by series, every
    accepted token a hit really had.

hitproof's acceptance_collapse check reads the /metrics counters around each agent turn (the only
source vLLM has; llama.cpp's per-request timings say the same), so it is the counters a proxy must
rewrite; the per-request field is rewritten too so that both sources agree, as on a real server.

To know how many accepted tokens a hit had, the proxy scrapes the server's /metrics before and after
it, and sends one generation request at a time (the agent replay sends one at a time anyway).
A hit is a response with cached prompt tokens (usage.prompt_tokens_details.cached_tokens or
timings.cache_n); cold requests (the control arm, under a fresh cache_salt / cache_prompt false)
pass untouched. mode "none" does all the same bookkeeping and rewrites nothing.
"""

from __future__ import annotations

import asyncio
import json
import re

from aiohttp import web
from support.loopback import serve_catch_all

MODES = ("none", "strip_on_hit")
GENERATION = ("/v1/completions", "/v1/chat/completions")
# a sample line: name{labels} value [timestamp]
SAMPLE = re.compile(r"^(?P<series>(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?)\s+(?P<value>\S+)(?P<rest>.*)$")


def accepted_series(text: str) -> dict[str, float]:
    """The accepted-token counters of a /metrics page (every series, labels included)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match is None or line.startswith("#"):
            continue
        name = match["name"]
        if "spec_decode_num_accepted_tokens" in name and name.endswith("_total"):
            try:
                out[match["series"]] = float(match["value"])
            except ValueError:
                continue
    return out


def _number(value: float) -> str:
    return str(int(value)) if value == int(value) else repr(value)


class DraftStrippingProxy:
    def __init__(self, upstream: str, mode: str = "strip_on_hit"):
        assert mode in MODES, mode
        self.upstream = upstream.rstrip("/")
        self.mode = mode
        self.url = ""
        self.generations = 0
        self.hits = 0                  # generation requests that were cache hits
        self.stripped_requests = 0     # hits whose accepted drafts were taken away
        self.accepted_seen = 0.0       # accepted tokens the server reported in total (not per position)
        self.stripped: dict[str, float] = {}   # series -> accepted tokens taken away so far
        self._one_at_a_time = asyncio.Lock()

    async def start(self) -> "DraftStrippingProxy":
        self._session, self._runner, self.url = await serve_catch_all(self.handle)
        return self

    async def close(self) -> None:
        await self._runner.cleanup()
        await self._session.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.method == "POST" and request.path in GENERATION:
            async with self._one_at_a_time:
                return await self._generation(request, body)
        if request.path == "/metrics":
            # never between a generation and its bookkeeping: the server's counter would already hold the
            # hit's accepted tokens and `stripped` not yet, and the next page would show the counter going
            # back (CI, 2026-12-05: hitproof's restart check fired on 183 -> 159)
            async with self._one_at_a_time:
                return await self._pass(request, body)
        return await self._pass(request, body)

    async def _pass(self, request: web.Request, body: bytes) -> web.Response:
        async with self._session.request(request.method, self.upstream + request.path_qs, data=body or None,
                                         headers={"Content-Type": request.headers.get("Content-Type", "")}) as up:
            raw = await up.read()
            if request.path == "/metrics" and up.status == 200:
                raw = self._rewrite_metrics(raw.decode()).encode()
            return web.Response(status=up.status, body=raw, content_type=up.content_type or "text/plain")

    async def _scrape(self) -> dict[str, float]:
        async with self._session.get(self.upstream + "/metrics") as up:
            return accepted_series(await up.text()) if up.status == 200 else {}

    async def _generation(self, request: web.Request, body: bytes) -> web.StreamResponse:
        self.generations += 1
        before = await self._scrape()
        async with self._session.post(self.upstream + request.path, data=body,
                                      headers={"Content-Type": "application/json"}) as up:
            raw = await up.read()
            status, content_type = up.status, up.content_type
        after = await self._scrape()
        if status != 200:
            return web.Response(status=status, body=raw, content_type=content_type or "application/json")
        streamed = content_type == "text/event-stream" or raw.lstrip().startswith(b"data:")
        chunks = ([json.loads(line[5:]) for line in raw.decode().split("\n")
                   if line.startswith("data:") and line[5:].strip() != "[DONE]"] if streamed else [json.loads(raw)])
        cached = 0
        for chunk in chunks:
            usage = chunk.get("usage") or {}
            cached = ((usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                      or (chunk.get("timings") or {}).get("cache_n") or cached)
        moved = {series: value - before.get(series, 0.0) for series, value in after.items()}
        self.accepted_seen += sum(v for s, v in moved.items() if "per_pos" not in s)
        if cached:
            self.hits += 1
        if cached and self.mode == "strip_on_hit":
            self.stripped_requests += 1
            for series, value in moved.items():
                if value > 0:
                    self.stripped[series] = self.stripped.get(series, 0.0) + value
            for chunk in chunks:
                timings = chunk.get("timings")
                if isinstance(timings, dict) and "draft_n_accepted" in timings:
                    timings["draft_n_accepted"] = 0
        if not streamed:
            return web.json_response(chunks[0])
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in chunks:
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def _rewrite_metrics(self, text: str) -> str:
        if not self.stripped:
            return text
        lines = []
        for line in text.split("\n"):
            match = None if line.startswith("#") else SAMPLE.match(line)
            if match is not None and match["series"] in self.stripped:
                try:
                    value = float(match["value"]) - self.stripped[match["series"]]
                    line = f"{match['series']} {_number(max(0.0, value))}{match['rest']}"
                except ValueError:
                    pass
            lines.append(line)
        return "\n".join(lines)
