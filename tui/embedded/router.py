"""Real routers in front of several embedded servers: vllm-router and sglang-router.

Both are Rust binaries shipped as PyPI wheels (no GPU needed). They are set up on first use
in their own venv under cache_dir()/router (pinned versions, about 20 s with pip's cache, 220 MB),
and a *cluster plan* says how to start N llama.cpp servers and one router in front of them,
each on a free loopback port:

    prepare_router(progress=print)                       # idempotent; instant once done
    plan = plan_cluster(2, router="vllm-router", policy="round_robin")
    async with Cluster(plan.launch_plan()) as cluster:   # tui.core.server.cluster: workers, then the router
        ...  # send requests to cluster.url; cluster.replica_urls are the workers

Facts measured here (tui/embedded/NOTES-router-slots.md has the numbers):

- neither router adds a header naming the worker that served a request; but llama-server
  puts its own alias in the `model` field of every answer (ignoring the request's), so each
  replica here serves under its own alias MODEL@i (`replica_index`), which names the replica
  per request even under concurrency; without that, attribution comes from counter deltas
  (the workers' own llama.cpp counters, or the router's per-worker counter, see
  `worker_request_counts`, both exact for a request sent alone);
- both pass the worker's JSON through untouched: `usage.prompt_tokens_details.cached_tokens`
  and llama.cpp's `timings` arrive intact, streaming and not;
- vllm-router answers `/v1/models` from a worker; sglang-router answers it itself with the
  model id "unknown" (it cannot read a llama.cpp worker's model info), and llama-server
  ignores the model field of a request, so requests still work through it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

from ..core.server.launch import free_port
from ..core.server.profiles import LaunchPlan
from ..core.server.replicas import router_counts_by_worker
from .router_metrics import llamacpp_counters, scrape_workers, served_by, worker_health
from .common import (
    EngineLaunch, Progress, Setup, SetupError, Step, cache_dir, child_env, engine_home, read_info,
    venv_python, write_info,
)

HOME = "router"  # cache_dir()/router: venv, info.json, step markers


@dataclass(frozen=True)
class RouterKind:
    name: str  # hitproof's name for it
    package: str  # pinned PyPI requirement
    module: str  # `python -m MODULE` starts it
    policies: tuple[str, ...]  # --policy choices of the pinned version
    metrics_prefix: str  # its own Prometheus names start with this
    per_worker_counter: str  # a counter with a worker="URL" label that counts served requests
    per_worker_outcome: str | None  # label value that counter must have in `outcome`, if any


ROUTERS = {
    "vllm-router": RouterKind(
        "vllm-router", "vllm-router==0.1.17", "vllm_router.launch_router",
        ("random", "round_robin", "cache_aware", "kv_aware", "power_of_two", "consistent_hash",
         "sticky_least_loaded"),
        "vllm_router_", "vllm_router_processed_requests_total", None,
    ),
    "sglang-router": RouterKind(
        "sglang-router", "sglang-router==0.3.2", "sglang_router.launch_router",
        ("random", "round_robin", "cache_aware", "power_of_two", "manual"),
        "smg_", "smg_worker_cb_outcomes_total", "success",
    ),
}
DEFAULT_ROUTER = "vllm-router"
# round_robin: every replica gets every other request, so hits land on both (cache_aware sent
# nearly everything to one worker here: see the notes).
DEFAULT_POLICY = "round_robin"
STARTUP_TIMEOUT = 60.0  # the router itself starts in well under a second


def router_kind(router: str) -> RouterKind:
    try:
        return ROUTERS[router]
    except KeyError:
        raise SetupError(f"unknown router {router!r}; choose one of {', '.join(ROUTERS)}") from None


def _venv() -> Path:
    return engine_home(HOME) / "venv"


# -- setup ------------------------------------------------------------------------------


def prepare_router(progress: Progress = print) -> None:
    """Install both routers (pinned) into their own venv once; later calls return at once."""
    venv = _venv()
    packages = [kind.package for kind in ROUTERS.values()]
    with Setup(HOME, progress) as s:

        def install() -> None:
            s.pip("install routers", venv, "install", *packages)

        def check() -> None:
            code = (
                "import json, importlib.metadata as m; "
                f"print(json.dumps({{p: m.version(p) for p in {[k.name for k in ROUTERS.values()]!r}}}))"
            )
            versions = json.loads(s.python("check routers", venv, code))
            for kind in ROUTERS.values():  # the module must import and parse its own --help
                s.run("check routers", [str(venv_python(venv)), "-m", kind.module, "--help"], show=lambda line: False)
            write_info(HOME, {"versions": versions})

        s.steps([
            Step("create venv", f"venv {HOME}", lambda: s.create_venv("create venv", venv),
                 check=lambda: venv_python(venv).exists()),
            Step("install routers", " ".join(packages), install),
            Step("check routers", " ".join(packages), check, check=lambda: (engine_home(HOME) / "info.json").exists()),
        ])


def router_python() -> Path | None:
    """The interpreter of the routers' venv (`python -m vllm_router.launch_router ...`), None before setup."""
    python = venv_python(_venv())
    return python if python.exists() and (engine_home(HOME) / "info.json").exists() else None


def router_version(router: str) -> str:
    kind = router_kind(router)
    versions = read_info(HOME).get("versions", {})
    return f"{kind.name} {versions.get(kind.name, '?')}"


def local_tokenizer(model: str = "gemma3-270m") -> Path | None:
    """A local Hugging Face tokenizer folder for sglang-router's --tokenizer-path, if one exists.

    The vLLM setup converts Gemma into such a folder; the tiny models' tokenizer lies in the
    tiny build's cache. Without one, sglang-router logs that it will ask the worker (it does
    not reach for a hub when no --model-path is given: measured, see the notes).
    """
    candidates = [cache_dir() / "models" / f"{model}-hf", cache_dir() / "tiny" / "tokenizer"]
    wanted = candidates[:1] if model == "gemma3-270m" else candidates[1:]
    for folder in wanted:
        if (folder / "tokenizer.json").is_file():
            return folder
    return None


# -- launch plan ------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterPlan:
    """N worker launches and one router launch, every one on its own free loopback port."""

    router: str
    policy: str
    workers: tuple[EngineLaunch, ...]
    front: EngineLaunch  # the router's own launch (engine = router name)
    metrics_url: str  # the router's Prometheus endpoint
    facts: dict = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.front.url

    @property
    def worker_urls(self) -> list[str]:
        return [w.url for w in self.workers]

    def launch_plan(self, slot_dir: str | None = None) -> LaunchPlan:
        """The router's launch with the workers as its replicas (what tui.core.server.cluster.Cluster starts)."""
        plan = self.front.plan(replicas=[w.plan() for w in self.workers], router_metrics=self.metrics_url,
                               slot_dir=slot_dir)
        plan.engine = self.workers[0].engine
        plan.facts = {**self.facts, **({"slot_dir": slot_dir} if slot_dir else {})}
        return plan


def router_argv(router: str, *, port: int, metrics_port: int, worker_urls: Sequence[str], policy: str,
                tokenizer: Path | None = None, extra_args: Sequence[str] = ()) -> list[str]:
    """The router's command line: loopback only, metrics on loopback, no retries on another worker.

    Retries are off so that a worker's error reaches the client instead of being answered
    silently by the other replica (which would also make the attribution of that request wrong).
    """
    kind = router_kind(router)
    if policy not in kind.policies:
        raise SetupError(f"{router} has no policy {policy!r}; choose one of {', '.join(kind.policies)}")
    if not worker_urls:
        raise SetupError(f"{router} needs at least one worker URL")
    argv = [
        str(venv_python(_venv())), "-m", kind.module,
        "--host", "127.0.0.1", "--port", str(port),
        "--worker-urls", *worker_urls,
        "--policy", policy,
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
        "--disable-retries",
        "--log-level", "info",
    ]
    if router == "sglang-router" and tokenizer is not None:
        argv += ["--tokenizer-path", str(tokenizer)]
    return argv + list(extra_args)


def plan_cluster(
    n: int = 2,
    *,
    router: str = DEFAULT_ROUTER,
    policy: str = DEFAULT_POLICY,
    engine: str = "llamacpp",
    model: str = "gemma3-270m",
    worker_extra_args: Sequence[str] = (),
    router_extra_args: Sequence[str] = (),
    ports: Sequence[int] | None = None,
) -> ClusterPlan:
    """How to start n servers of `engine` and a router; SetupError if something is not set up.

    `ports`, when given, is n + 2 ports: the workers', the router's, the router's metrics.
    """
    from . import launch_spec  # the package's dispatcher (vllm or llamacpp)

    if n < 1:
        raise SetupError(f"a cluster needs at least one worker, not {n}")
    router_kind(router)
    if ports is not None and len(ports) != n + 2:
        raise SetupError(f"plan_cluster needs {n + 2} ports for {n} workers, got {len(ports)}")
    if not _venv().exists() or not (engine_home(HOME) / "info.json").exists():
        raise SetupError(f"{router} is not set up yet: run prepare_router() first")
    if ports is None:
        ports = _distinct_ports(n + 2)
    threads = worker_threads(engine, n, worker_extra_args)
    extra = (*worker_extra_args, "--threads", str(threads)) if threads else tuple(worker_extra_args)
    workers = tuple(
        _as_replica(launch_spec(engine, port=ports[i], model=model, extra_args=extra), i)
        for i in range(n)
    )
    port, metrics_port = ports[n], ports[n + 1]
    tokenizer = local_tokenizer(model) if router == "sglang-router" else None
    argv = router_argv(router, port=port, metrics_port=metrics_port, worker_urls=[w.url for w in workers],
                       policy=policy, tokenizer=tokenizer, extra_args=router_extra_args)
    env_add = {"NO_COLOR": "1"}  # plain log lines (the Rust logger colours them otherwise)
    facts = {
        "router": router_version(router),
        "policy": policy,
        "replicas": n,
        "worker_urls": [w.url for w in workers],
        "worker_engine": workers[0].facts.get("engine_version") or engine,
        "retries": "disabled (--disable-retries)",
        "worker_threads": f"{threads} per llama-server (the machine's {_cores()} cores shared by {n})" if threads else None,
        "tokenizer_path": str(tokenizer) if tokenizer else None,
        "attribution": ("the answer's model field (each llama.cpp replica serves as MODEL@i); "
                        "else per-worker counter deltas (no router adds a header naming the worker)"),
    }
    front = EngineLaunch(router, model, argv, child_env(env_add), env_add, f"http://127.0.0.1:{port}",
                         STARTUP_TIMEOUT, {k: v for k, v in facts.items() if v is not None})
    return ClusterPlan(router, policy, workers, front, f"http://127.0.0.1:{metrics_port}/metrics",
                       dict(front.facts))


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:            # not Linux
        return os.cpu_count() or 1


def worker_threads(engine: str, n: int, extra_args: Sequence[str]) -> int | None:
    """Threads for each of n llama.cpp workers on this machine: its cores split between them, unless
    the caller chose (--threads/-t). Each llama-server takes every core by default; two of them busy
    at once on 2 cores took 54.5 s for 8 concurrent 1,100-token prompts, 13.3 s with one thread each
    (measured here). None: leave the engine's default (vLLM, or threads already given)."""
    if engine != "llamacpp" or any(a in ("--threads", "-t") for a in extra_args):
        return None
    return max(1, _cores() // n)


REPLICA_SEPARATOR = "@"


def replica_alias(model: str, index: int) -> str:
    """The name replica `index` serves under: llama-server puts it in the `model` field of every
    answer and stream chunk, whatever model name the request carried (measured), and both
    routers pass the body through, so each answer names the replica that produced it."""
    return f"{model}{REPLICA_SEPARATOR}{index}"


def replica_index(answer_model: object) -> int | None:
    """The replica index in an answer's `model` field ('gemma3-270m@1' -> 1), None if there is none."""
    if not isinstance(answer_model, str) or REPLICA_SEPARATOR not in answer_model:
        return None
    tail = answer_model.rsplit(REPLICA_SEPARATOR, 1)[1]
    return int(tail) if tail.isdigit() else None


def _as_replica(launch: EngineLaunch, index: int) -> EngineLaunch:
    """A llama.cpp launch with its --alias made replica-specific (other engines unchanged)."""
    if launch.engine != "llamacpp" or "--alias" not in launch.argv:
        return launch
    argv = list(launch.argv)
    alias = replica_alias(launch.model, index)
    argv[argv.index("--alias") + 1] = alias
    return replace(launch, argv=argv, facts={**launch.facts, "replica": index, "served_as": alias})


def _distinct_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def cluster_launch_plan(n: int, *, router: str | None = None, policy: str | None = None, engine: str = "llamacpp",
                        model: str = "gemma3-270m") -> LaunchPlan:
    """n embedded servers of `engine` behind `router`, as the one plan every launch takes (started by
    tui.core.server.cluster.Cluster). llama.cpp replicas share a slot folder made for this run (the restore
    phase moves saved state between them); the cluster removes it when it stops."""
    slot_dir = tempfile.mkdtemp(prefix="hitproof-slots-") if engine == "llamacpp" else None
    try:
        cluster = plan_cluster(n, router=router or DEFAULT_ROUTER, policy=policy or DEFAULT_POLICY, engine=engine,
                               model=model, worker_extra_args=("--slot-save-path", slot_dir) if slot_dir else ())
    except BaseException:
        if slot_dir:
            shutil.rmtree(slot_dir, ignore_errors=True)
        raise
    return cluster.launch_plan(slot_dir)


def worker_request_counts(router: str, metrics_text: str) -> dict[str, float]:
    """worker URL -> requests the router sent it and got answered (parsed in tui/core/server/replicas.py):
    the difference of two readings around a request sent alone names the worker that served it."""
    router_kind(router)                   # an unknown router is a SetupError, as everywhere
    return router_counts_by_worker(metrics_text)


__all__ = [
    "ROUTERS", "DEFAULT_ROUTER", "DEFAULT_POLICY", "RouterKind", "ClusterPlan", "prepare_router",
    "plan_cluster", "cluster_launch_plan", "router_argv", "router_version", "local_tokenizer", "replica_alias", "replica_index", "worker_health", "worker_request_counts", "llamacpp_counters", "scrape_workers", "served_by",
]
