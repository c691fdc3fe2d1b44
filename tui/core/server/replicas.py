"""Several replicas behind one router: who served each request, and every replica's own counters.

hitproof sends through the router (`--attach ROUTER_URL`) and reads each replica (`--replica URL`,
repeatable) directly: its /metrics (a router's /metrics is its own, or one worker's: vllm-router
proxies it to whichever worker it picks), its model list, its tokenizer. Which replica served a
request is known, in this order:

- from the response: a header whose value names a replica's host:port (nginx's X-Upstream-Addr
  and the like), or the answer's `model` field when every replica serves under its own model id
  (llama-server puts its --alias in every answer and chunk, whatever the request named; both
  routers measured here pass the body through untouched);
- else from counter deltas: the replicas' generated-token, prompt-token and cached-token counters
  (and the router's per-worker request counter, where it has one) are read when a window of
  requests opens and when it closes (nothing in flight either time, as in tui.core.soak.proof),
  and each member is given the replica every assignment that explains every delta exactly agrees
  on (`assign`). A request alone in its window always gets its replica; a round of concurrent
  requests gets one where the deltas leave a single way to explain them, else none (unknown,
  never guessed).

Before the first phase one tiny request is sent alone (the attribution probe): the replica whose
counters moved is the one that served it, and the response either names that replica (attribution
from the response, checked against the counters) or does not (attribution by counter).
"""

from __future__ import annotations

import asyncio
import urllib.parse
from dataclasses import dataclass, field
from typing import Iterable

import httpx

from ..config.errors import ServerProblem
from .client import OpenAIClient
from .metrics import MetricSnapshot, parse_metrics
from .restarts import in_order

# A request adds its completion tokens to one of these, its prompt tokens to the prompt counters
# (llama.cpp counts the re-processed and the cached part apart), one to the request counters.
GENERATED = ("vllm:generation_tokens_total", "llamacpp:tokens_predicted_total", "sglang:generation_tokens_total")
PROMPTED = (("vllm:prompt_tokens_total",), ("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total"),
            ("sglang:prompt_tokens_total",))
CACHED = ("llamacpp:prompt_tokens_cached_total", "vllm:prefix_cache_hits_total", "sglang:cached_tokens_total")
REQUESTED = ("vllm:request_success_total", "sglang:num_requests_total")
# A router's own counter of requests it sent a worker and got answered, by the `worker` label:
# (sample name, a label the sample must carry, or None)
ROUTER_WORKER_COUNTERS = (("vllm_router_processed_requests_total", None),
                          ("smg_worker_cb_outcomes_total", ("outcome", "success")))
ROUTER_WORKER_HEALTH = ("vllm_router_worker_health", "smg_worker_health")
# What vllm-router (reqwest) answers, as HTTP 500, when it could not send a request to a worker at all
# (seen here: llama-server closed a keep-alive connection the router then reused)
ROUTER_SEND_FAILED = "error sending request for url"
SEARCH_LIMIT = 20_000               # assignments tried per window before giving up (unknown)


@dataclass(frozen=True)
class Replica:
    index: int
    url: str
    models: tuple[str, ...] = ()    # its own /v1/models ids

    @property
    def label(self) -> str:
        return f"r{self.index}"

    @property
    def hostport(self) -> str:
        parts = urllib.parse.urlsplit(self.url)
        return parts.netloc


@dataclass(frozen=True)
class Served:
    """What one request's answer and counters said about the replica that served it."""
    replica: int | None
    source: str = ""                # "header" | "model" | "counter" | "" (unknown)


@dataclass(frozen=True)
class Signature:
    """What a request adds to its replica's counters (None: not known)."""
    completion: int | None
    prompt: int | None
    cached: int | None


@dataclass
class ClusterSnapshot:
    """Every replica's /metrics (None where it did not answer) and the router's per-worker counts."""
    replicas: dict[int, MetricSnapshot | None] = field(default_factory=dict)
    routed: dict[int, float] | None = None

    def combined(self) -> MetricSnapshot | None:
        """The replicas' counters summed: the cluster's counters (None unless every replica answered)."""
        snaps = list(self.replicas.values())
        if not snaps or any(s is None or s.error is not None for s in snaps):
            return None
        values: dict[str, float] = {}
        for snap in snaps:
            for name, value in snap.values.items():
                values[name] = values.get(name, 0.0) + value
        first = snaps[0]
        return MetricSnapshot(t=max(s.t for s in snaps), values=values, info=dict(first.info))


def normalize(url: str) -> str:
    url = url.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[:-3]
    if "://" not in url:
        url = "http://" + url
    return url


def checked_url(raw: str, option: str) -> str:
    """A server URL as given to `option`, normalized; ValueError (one line) when it is not one (a port
    that is not a number went on as an internal error before)."""
    url = normalize(raw)
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port
        httpx.URL(url)
    except (ValueError, httpx.InvalidURL) as exc:
        raise ValueError(f"{option} {raw}: not a URL hitproof can reach ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{option} {raw}: not an http(s) URL")
    return url


def check_urls(urls: Iterable[str]) -> list[str]:
    """The replica URLs, normalized; ValueError (one line) for a bad or repeated one."""
    out: list[str] = []
    for raw in urls:
        url = checked_url(raw, "--replica")
        if url in out:
            raise ValueError(f"--replica {raw}: given twice")
        out.append(url)
    return out


# --- attribution from the response ------------------------------------------------------------

def named_by_response(replicas: list[Replica], model: str | None, headers: dict[str, str]) -> Served:
    """The replica a response names: by a header carrying its host:port, else by the answer's model
    field when that is one replica's own model id and no other replica's."""
    for name, value in headers.items():
        if not isinstance(value, str):
            continue
        hits = [r.index for r in replicas if r.hostport and (r.hostport in value or r.url in value)]
        if len(hits) == 1:
            return Served(hits[0], "header")
    if model:
        owners = [r.index for r in replicas if model in r.models]
        if len(owners) == 1:
            return Served(owners[0], "model")
    return Served(None)


def distinct_models(replicas: list[Replica]) -> bool:
    """Every replica serves under model ids no other replica has (then the model field names it)."""
    seen: dict[str, int] = {}
    for r in replicas:
        if not r.models:
            return False
        for m in r.models:
            if seen.setdefault(m, r.index) != r.index:
                return False
    return True


def header_naming(replicas: list[Replica], headers: dict[str, str]) -> str | None:
    """The header that named a replica, for the summary ("x-upstream-addr")."""
    for name, value in headers.items():
        if isinstance(value, str) and any(r.hostport and r.hostport in value for r in replicas):
            return name
    return None


# --- attribution by counters (pure) ------------------------------------------------------------------

def _first(snapshot: MetricSnapshot, names: Iterable[str]) -> float | None:
    for name in names:
        value = snapshot.get(name)
        if value is not None:
            return value
    return None


def _prompted(snapshot: MetricSnapshot) -> float | None:
    for names in PROMPTED:
        parts = [snapshot.get(n) for n in names]
        if all(p is not None for p in parts):
            return sum(parts)  # type: ignore[arg-type]
    return None


def replica_deltas(before: ClusterSnapshot, after: ClusterSnapshot) -> dict[int, tuple] | None:
    """Per replica (requests, generated, prompt, cached) moved between two readings (None where the
    counter is not known); None when some replica did not answer either time."""
    out: dict[int, tuple] = {}
    for index, a in before.replicas.items():
        b = after.replicas.get(index)
        if a is None or b is None or a.error or b.error:
            return None

        def moved(read) -> float | None:
            x, y = read(a), read(b)
            return None if x is None or y is None else y - x

        requests = None
        if before.routed is not None and after.routed is not None:
            requests = after.routed.get(index, 0.0) - before.routed.get(index, 0.0)
        if requests is None:
            requests = moved(lambda s: _first(s, REQUESTED))
        out[index] = (requests, moved(lambda s: _first(s, GENERATED)), moved(_prompted),
                      moved(lambda s: _first(s, CACHED)))
    return out


def assign(members: dict[int, Signature], deltas: dict[int, tuple], step: float = 0.0) -> dict[int, int | None]:
    """Each member's replica where every way of explaining every replica's counter deltas agrees
    (None where they disagree, or nothing can explain them: then traffic from someone else moved a
    counter). `step`: a counter printed with 6 significant digits moves in steps (widen by 2 steps).

    A dimension (requests, completion, prompt, cached tokens) counts only where every replica knows
    its delta and every member its own value."""
    ids = sorted(members)
    replicas = sorted(deltas)
    unknown = {rid: None for rid in ids}
    if not ids or not replicas:
        return unknown
    sigs = {rid: (1, members[rid].completion, members[rid].prompt, members[rid].cached) for rid in ids}
    dims = [d for d in range(4)
            if all(deltas[r][d] is not None for r in replicas) and all(sigs[m][d] is not None for m in ids)]
    if not dims:
        return unknown
    slack = [0.0 if d == 0 else 2 * step for d in range(4)]
    target = {r: [deltas[r][d] for d in range(4)] for r in replicas}
    # no member can be on a replica none of whose counters moved where the member adds something
    options = {m: [r for r in replicas if all(sigs[m][d] <= target[r][d] + slack[d] for d in dims)] for m in ids}
    if any(not opts for opts in options.values()):
        return unknown
    order = sorted(ids, key=lambda m: len(options[m]))
    sums = {r: [0] * 4 for r in replicas}
    possible: dict[int, set[int]] = {m: set() for m in ids}
    chosen: dict[int, int] = {}
    tried = 0
    solutions = 0

    def walk(i: int) -> bool:
        nonlocal tried, solutions
        tried += 1
        if tried > SEARCH_LIMIT:
            return False
        if i == len(order):
            if all(abs(sums[r][d] - target[r][d]) <= slack[d] for r in replicas for d in dims):
                solutions += 1
                for m, r in chosen.items():
                    possible[m].add(r)
            return True
        m = order[i]
        for r in options[m]:
            if any(sums[r][d] + sigs[m][d] > target[r][d] + slack[d] for d in dims):
                continue
            for d in dims:
                sums[r][d] += sigs[m][d]
            chosen[m] = r
            ok = walk(i + 1)
            for d in dims:
                sums[r][d] -= sigs[m][d]
            del chosen[m]
            if not ok:
                return False
        return True

    if not walk(0) or not solutions:
        return unknown
    return {m: (next(iter(possible[m])) if len(possible[m]) == 1 else None) for m in ids}


def router_counts_by_worker(text: str) -> dict[str, float]:
    """worker URL (normalized) -> requests the router sent it and got answered (its own per-worker
    counter: vllm-router's or sglang-router's, ROUTER_WORKER_COUNTERS); {} for text that is not metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                for name, label in ROUTER_WORKER_COUNTERS:
                    if sample.name not in (name, name.removesuffix("_total")) or "worker" not in sample.labels:
                        continue
                    if label is not None and sample.labels.get(label[0]) != label[1]:
                        continue
                    url = normalize(sample.labels["worker"])
                    out[url] = out.get(url, 0.0) + sample.value
    except ValueError:
        return {}
    return out


def router_worker_counts(text: str, replicas: list[Replica]) -> dict[int, float]:
    """replica index -> requests the router sent it and got answered (router_counts_by_worker)."""
    by_url = {r.url: r.index for r in replicas}
    return {by_url[url]: n for url, n in router_counts_by_worker(text).items() if url in by_url}


def router_worker_health(text: str) -> dict[str, bool]:
    """worker URL -> healthy, from a router's own metrics (vllm-router, sglang-router)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, bool] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in ROUTER_WORKER_HEALTH and "worker" in sample.labels:
                    out[normalize(sample.labels["worker"])] = sample.value >= 1
    except ValueError:
        return {}
    return out


# --- talking to the replicas ---------------------------------------------------------------------

class ReplicaSet:
    """The replicas' own URLs (one client each) and the router's metrics endpoint, if any."""

    def __init__(self, urls: list[str], *, router_metrics: str | None = None, dialect: str = "vllm",
                 timeout: float = 600.0):
        self.replicas = [Replica(i, url) for i, url in enumerate(urls)]
        self.clients = [OpenAIClient(url, dialect=dialect, timeout=timeout) for url in urls]
        self.router_metrics = router_metrics
        self._http = httpx.AsyncClient(timeout=10.0, trust_env=False)
        self.method = ""            # "header <name>" | "model field" | "counter" | "none", after probe()

    def __len__(self) -> int:
        return len(self.replicas)

    def label(self, index: int | None) -> str:
        if index is None or not 0 <= index < len(self.replicas):
            return "an unknown replica"
        r = self.replicas[index]
        return f"replica {r.label} ({r.url})"

    def set_dialect(self, dialect: str) -> None:
        for client in self.clients:
            client.dialect = dialect

    async def aclose(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self.clients), return_exceptions=True)
        await self._http.aclose()

    async def discover(self) -> None:
        """Each replica's own model ids; a replica that does not answer is a ServerProblem naming it."""
        async def one(replica: Replica, client: OpenAIClient) -> Replica:
            try:
                body = await client.get_json("/v1/models")
            except ServerProblem as exc:
                raise ServerProblem(f"replica {replica.label}: {exc}") from None
            if not isinstance(body, dict):
                raise ServerProblem(f"replica {replica.label} ({replica.url}) answered but /v1/models is not an "
                                    f"OpenAI model list")
            ids = tuple(m.get("id", "") for m in body.get("data", []) if isinstance(m, dict) and m.get("id"))
            return Replica(replica.index, replica.url, ids)

        self.replicas = list(await asyncio.gather(*(one(r, c) for r, c in zip(self.replicas, self.clients))))

    async def _metrics(self, index: int) -> MetricSnapshot | None:
        async def fetch() -> MetricSnapshot | None:
            try:
                response = await self.clients[index].get("/metrics")
            except ServerProblem:
                return None
            return parse_metrics(response.text) if response.status_code == 200 else None

        return await in_order(self.clients[index], fetch)   # one at a time per replica, restart signs re-read

    async def router_counts(self) -> dict[int, float] | None:
        if not self.router_metrics:
            return None
        try:
            response = await self._http.get(self.router_metrics)
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        counts = router_worker_counts(response.text, self.replicas)
        return counts or None

    async def scrape(self) -> ClusterSnapshot:
        snaps = await asyncio.gather(*(self._metrics(i) for i in range(len(self.replicas))))
        routed = await self.router_counts()
        return ClusterSnapshot(dict(enumerate(snaps)), routed)

    def facts(self) -> list[dict]:
        return [{"index": r.index, "label": r.label, "url": r.url, "models": list(r.models)} for r in self.replicas]
