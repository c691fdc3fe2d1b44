"""One discovery of a server: what it says about itself (/v1/models, /version, /props, /metrics) and
which dialect it speaks. The soak engine builds its ServerInfo from it; the incident record its
server facts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..config.errors import ServerProblem
from .adapters import adapters_from_llamacpp, adapters_from_models
from .client import OpenAIClient, RequestSpec
from .metrics import CACHE_CONFIG, MetricSnapshot, parse_metrics
from .restarts import in_order


# What a server needs to report per-request cached tokens (said when a phase cannot prove hits).
CACHE_REPORT_FIX = {
    "vllm": "start vLLM with --enable-prompt-tokens-details",
    "sglang": "start SGLang with --enable-cache-report",
    "llamacpp": "llama.cpp reports timings.cache_n by itself: something between hitproof and the server drops it",
    "openai": "the server (or a proxy in front of it) must pass usage.prompt_tokens_details.cached_tokens through "
              "or expose a cached-token counter on /metrics",
}

# (cached-token counter, the matching query counter or None). Queries count every prompt token
# that was looked up; with them a window can tell that someone else used the server meanwhile.
CACHED_COUNTERS = (
    ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
    ("vllm:prompt_tokens_cached_total", None),
    ("sglang:cached_tokens_total", None),
    ("llamacpp:prompt_tokens_cached_total", None),
)


@dataclass
class Discovery:
    models_body: dict[str, Any] | None = None
    models: list[dict[str, Any]] = field(default_factory=list)     # id, root, max_model_len, owned_by
    version_body: dict[str, Any] | None = None
    version: str | None = None
    props: dict[str, Any] | None = None                            # llama.cpp's /props, trimmed
    metrics: MetricSnapshot | None = None                          # parsed /metrics (error set if unparsable)
    dialect: str = "openai"
    adapters: list[dict[str, Any]] = field(default_factory=list)   # LoRA adapters served (tui.core.server.adapters)

    @property
    def model_ids(self) -> list[str]:
        return [m.get("id", "") for m in self.models]

    @property
    def base_model_ids(self) -> list[str]:
        """The models that are not an adapter of another one."""
        return [m.get("id", "") for m in self.models if not m.get("parent") or m.get("parent") == m.get("id")]

    @property
    def cache_config(self) -> dict[str, str]:
        if self.metrics is None or self.metrics.error is not None:
            return {}
        return dict(self.metrics.info.get(CACHE_CONFIG) or {})

    @property
    def metrics_available(self) -> bool:
        return self.metrics is not None and self.metrics.error is None and bool(self.metrics.values)


async def scrape(client: OpenAIClient) -> MetricSnapshot | None:
    """/metrics parsed, or None when the server has none (or is unreachable for it). One at a time per
    client, re-read when it shows a restart sign (restarts.in_order): a late answer is no restart."""
    async def fetch() -> MetricSnapshot | None:
        try:
            response = await client.get("/metrics")
        except ServerProblem:
            return None
        if response.status_code != 200:
            return None
        return parse_metrics(response.text)

    return await in_order(client, fetch)


async def discover(client: OpenAIClient, *, dialect: str | None = None) -> Discovery:
    """Ask the server about itself. /v1/models must answer (ServerProblem otherwise); everything
    else is optional and left None when absent. `dialect` forces one instead of detecting it."""
    found = Discovery()
    models_body = await client.get_json("/v1/models")
    if not isinstance(models_body, dict):
        raise ServerProblem(f"{client.base_url} answered but /v1/models is not an OpenAI model list")
    found.models_body = models_body
    found.models = [{k: m.get(k) for k in ("id", "root", "parent", "max_model_len", "owned_by")
                     if k in m and m.get(k) is not None}
                    for m in models_body.get("data", []) if isinstance(m, dict)]
    version_body = await client.get_json("/version")
    if isinstance(version_body, dict):
        found.version_body = {k: v for k, v in version_body.items() if isinstance(v, (str, int, float, bool))}
        found.version = version_body.get("version")
    props = await client.get_json("/props")
    if isinstance(props, dict):
        trimmed = {k: props[k] for k in ("build_info", "model_path", "total_slots", "n_ctx") if k in props}
        settings = props.get("default_generation_settings")
        if isinstance(settings, dict) and "n_ctx" in settings:
            trimmed["n_ctx"] = settings["n_ctx"]
        found.props = trimmed
    found.metrics = await scrape(client)
    found.dialect = dialect or await _detect_dialect(client, found)
    if found.dialect == "llamacpp":
        found.adapters = adapters_from_llamacpp(await client.get_json("/lora-adapters"))
    else:
        found.adapters = adapters_from_models(found.models)
    return found


async def _detect_dialect(client: OpenAIClient, found: Discovery) -> str:
    owners = {m.get("owned_by") for m in found.models}
    if "llamacpp" in owners or found.props is not None:
        return "llamacpp"
    if "sglang" in owners or await client.get_json("/get_server_info") is not None:
        return "sglang"
    if found.version_body is not None and "version" in found.version_body:
        return "vllm"
    return "openai"


def counter_name(snapshot: MetricSnapshot | None) -> tuple[str, str | None] | None:
    """The cached-token counter (and its query counter) this server exposes, if any."""
    if snapshot is None or snapshot.error is not None:
        return None
    for name, queries in CACHED_COUNTERS:
        if name in snapshot.values:
            return name, (queries if queries in snapshot.values else None)
    return None


def probe_request(api: str, model: str, prompt: str, salt: str) -> RequestSpec:
    """One tiny greedy request (one token) with its own prompt and salt: hitproof's probes."""
    return RequestSpec(api=api, max_tokens=1, temperature=0.0, model=model, salt=salt,
                       prompt=prompt if api == "completions" else None,
                       messages=[{"role": "user", "content": prompt}] if api == "chat" else None)


async def probe_cache_report(client: OpenAIClient, api: str, model: str, nonce: str,
                             snapshot: MetricSnapshot | None) -> tuple[str, str, str]:
    """How this server's hits can be proven: one tiny cold request (unique prompt, fresh salt, one
    token) shows whether it reports per-request cached tokens; if not, whether its metrics have a
    cached-token counter to attribute. ("request" | "counter" | "none", counter, query counter)."""
    spec = probe_request(api, model, f"hitproof cache-report probe, run {nonce}.", f"hp-{nonce}-probe")
    try:
        completion = await client.stream(spec)
    except ServerProblem as exc:
        raise type(exc)(f"the cache-report probe before the first phase: {exc}") from None
    if completion.cached_tokens is not None:
        return "request", "", ""
    pair = counter_name(snapshot)
    if pair is None:
        return "none", "", ""
    return "counter", pair[0], pair[1] or ""
