"""A launch profile that starts several servers and a router in front of them (tui.core.server.profiles):

    command = "{router_python} -m vllm_router.launch_router --host 127.0.0.1 --port {port} \\
               --worker-urls {replica_urls} --policy round_robin --prometheus-port {metrics_port} --disable-retries"
    router_metrics = "http://127.0.0.1:{metrics_port}/metrics"    # optional: the router's own counters
    [replicas]
    count = 2
    command = "{llama_server} -m {models}/gemma-3-270m-q4_k_m.gguf --alias gemma3-270m@{index} \\
               --host 127.0.0.1 --port {port} --metrics --no-repack --slot-save-path {slot_dir}"
    url = "http://127.0.0.1:{port}"                               # default, with {port} in the command
    startup_timeout = 120

Each replica gets its own free {port}; {index} is 0, 1, ...; {slot_dir} is one folder hitproof makes
for the run and every replica shares (llama.cpp slot files saved on one can be restored on another).
In the router's command, {replica_urls} becomes the replicas' URLs as separate words and
{metrics_port} one more free port. hitproof starts the replicas first, then the router.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
KEYS = ("count", "command", "url", "startup_timeout", "env")
MAX_REPLICAS = 16
ROUTER_PLACEHOLDERS = ("replica_urls", "metrics_port", "slot_dir")
REPLICA_PLACEHOLDERS = ("index", "slot_dir")


@dataclass(frozen=True)
class ReplicaSpec:
    count: int
    command: str
    url: str
    startup_timeout: float
    env: dict[str, str]


def parse_replicas(data: dict, fail, command_of, url_of, timeout_of, env_of) -> ReplicaSpec | None:
    """The [replicas] table, checked with the profile's own checkers (command, url, timeout, env)."""
    table = data.get("replicas")
    if table is None:
        return None
    if not isinstance(table, dict):
        raise fail("replicas", "must be a table [replicas] with count and command")
    for key in table:
        if key not in KEYS:
            raise fail(key, f"unknown key (known: {', '.join(KEYS)})", "replicas")
    count = table.get("count")
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_REPLICAS:
        raise fail("count", f"must be a whole number of replicas from 1 to {MAX_REPLICAS}, got {count!r}", "replicas")
    if "command" not in table:
        raise fail("replicas", "command: missing (the command that starts one replica)")
    return ReplicaSpec(count=count, command=command_of(table), url=url_of(table, REPLICA_PLACEHOLDERS),
                       startup_timeout=timeout_of(table), env=env_of(table))


def check_router_placeholders(command: str, replicas: ReplicaSpec | None, fail) -> None:
    """{replica_urls} and {metrics_port} belong to a profile with [replicas]; such a profile's router
    command must name its workers with {replica_urls}."""
    used = set(re.findall(r"\{([A-Za-z_]\w*)\}", command))
    if replicas is None:
        for name in ROUTER_PLACEHOLDERS:
            if name in used:
                raise fail("command", f"{{{name}}} needs a [replicas] table (the servers behind the router)")
    elif "replica_urls" not in used:
        raise fail("command", "a profile with [replicas] starts a router: its command must pass the replicas' "
                              "URLs with {replica_urls}")


def check_router_metrics(data: dict, fail) -> str | None:
    value = data.get("router_metrics")
    if value is None:
        return None
    if not isinstance(value, str) or not re.match(r"^https?://[^/\s]+", value):
        raise fail("router_metrics", f"must be an http(s) URL such as http://127.0.0.1:{{metrics_port}}/metrics, "
                                     f"got {value!r}")
    if "replicas" not in data:
        raise fail("router_metrics", "needs a [replicas] table (the router's metrics name its workers)")
    return value
