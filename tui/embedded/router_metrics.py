"""Reading a router's and its llama.cpp workers' counters: which worker is healthy, how many requests the
router sent each, and which worker served a request sent alone (its generated-token counter moved).
The routers' own per-worker series are parsed once, in tui/core/server/replicas.py."""

from __future__ import annotations

import asyncio
from typing import Sequence

import httpx

from ..core.server.replicas import router_worker_health


def _samples(text: str):
    from prometheus_client.parser import text_string_to_metric_families

    try:
        for family in text_string_to_metric_families(text):
            yield from family.samples
    except ValueError:
        return


# worker URL -> healthy, from a router's own /metrics (both routers export it per worker): the core's parser
worker_health = router_worker_health


# llama.cpp's own counters (with --metrics): prompt tokens processed, prompt tokens taken from the
# cache, tokens generated. A request adds its prompt_n, cache_n and predicted count to them.
LLAMACPP_COUNTERS = ("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total",
                     "llamacpp:tokens_predicted_total")


def llamacpp_counters(metrics_text: str) -> dict[str, float]:
    wanted = {name.replace(":", "_") for name in LLAMACPP_COUNTERS} | set(LLAMACPP_COUNTERS)
    out: dict[str, float] = {}
    for sample in _samples(metrics_text):
        for name in (sample.name, sample.name + "_total"):
            if name in wanted:
                out[name if ":" in name else name.replace("llamacpp_", "llamacpp:", 1)] = sample.value
    return out


async def scrape_workers(urls: Sequence[str], client: httpx.AsyncClient | None = None) -> dict[str, dict[str, float]]:
    """Each worker's llama.cpp counters (an empty dict for a worker that did not answer)."""
    own = client is None
    client = client or httpx.AsyncClient(timeout=10.0, trust_env=False)
    try:
        async def one(url: str) -> dict[str, float]:
            try:
                r = await client.get(url.rstrip("/") + "/metrics")
            except httpx.HTTPError:
                return {}
            return llamacpp_counters(r.text) if r.status_code == 200 else {}

        values = await asyncio.gather(*(one(u) for u in urls))
        return dict(zip(urls, values))
    finally:
        if own:
            await client.aclose()


def served_by(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> list[str]:
    """Workers whose generated-token counter moved between two scrapes (one name for a request sent alone)."""
    key = "llamacpp:tokens_predicted_total"
    return [url for url in after
            if key in after[url] and key in before.get(url, {}) and after[url][key] > before[url][key]]
