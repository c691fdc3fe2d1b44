"""The incident record: what the second field report says an operator should log with every run.

Server version and commit, model and its quantization, drafter, speculative method and token
count, cache config labels (block size, mamba cache mode), launch command and environment
variables of interest, sha256 of each overlay patch, sampling settings and seed, whether cache
reuse was forced off, hitproof's version.

Three sources, each best-effort and labelled: the launch command's flags (``command_facts``,
pure), the server itself (``probe_server``: /version, /v1/models, /metrics, /props and, for a
server hitproof launched, one one-token completion for ``system_fingerprint``), and what the
profile or embedded engine states (``facts``). Nothing here raises: a fact that cannot be found
is "unknown".
"""

from __future__ import annotations

import asyncio
from typing import Any

from ... import __version__
from ..config.errors import ServerProblem
from ..config.redact import REDACTED, redact_argv
from .client import OpenAIClient
from .discovery import discover

from .command_facts import (UNKNOWN, cache_reuse, command_facts, commit_from, python_package_commit,  # noqa: F401
                            quantization, speculative)

__all__ = ["build_incident", "cache_reuse", "command_facts", "commit_from", "probe_server", "speculative"]


# --- the server ----------------------------------------------------------------------------------

async def probe_server(url: str, *, model: str | None = None, timeout: float = 5.0,
                       completion: bool = True) -> dict[str, Any]:
    """What the server says about itself (tui.core.server.discovery). With `completion`, one cold
    one-token completion too (for system_fingerprint), whose prompt shares nothing with any memo.
    Never raises; unreachable parts are left out."""
    out: dict[str, Any] = {}
    client = OpenAIClient(url, timeout=timeout)
    try:
        try:
            found = await discover(client)
        except ServerProblem as exc:
            out["probe_error"] = str(exc)[:200]
            return out
        if found.version_body is not None:
            out["version_body"] = found.version_body
            out["version"] = found.version
        out["models"] = found.models
        if found.props is not None:
            out["props"] = found.props
        if found.cache_config:
            out["cache_config"] = found.cache_config
        chosen = model or next((m.get("id") for m in found.models if m.get("id")), None)
        if chosen and completion:
            await _fingerprint(client, chosen, out)
    finally:
        await client.aclose()
    return out


async def _fingerprint(client: OpenAIClient, model: str, out: dict[str, Any]) -> None:
    try:
        response = await client.post_json("/v1/completions", {
            "model": model, "prompt": "hitproof incident probe", "max_tokens": 1, "temperature": 0})
        body = response.json() if response.status_code == 200 else None
        if isinstance(body, dict) and body.get("system_fingerprint"):
            out["system_fingerprint"] = str(body["system_fingerprint"])
        elif response.status_code != 200:
            out["probe_error"] = f"HTTP {response.status_code}"
    except (ServerProblem, ValueError) as exc:
        out["probe_error"] = type(exc).__name__


async def build_incident(*, url: str, argv: list[str] | None, env_of_interest: dict[str, str],
                         child_env: dict[str, str] | None, facts: dict[str, Any], overlays: list[dict[str, Any]],
                         profile: dict[str, Any] | None, engine: str | None, sampling: dict[str, Any],
                         scenario_seed: int | None, model: str | None = None,
                         probe: bool = True) -> dict[str, Any]:
    """The header's `incident` dict (see the module docstring).

    The one-token completion that reads system_fingerprint is sent only to a server hitproof
    launched (argv given): an attached server gets exactly the soak's requests, nothing more
    (its fingerprint would need the soak's own first response, which the client does not keep)."""
    argv = list(argv or [])
    flags = command_facts(argv, child_env) if argv else _NO_FLAGS
    server = await probe_server(url, model=model, completion=bool(argv)) if probe else {}
    cache_config = server.get("cache_config") or {}
    return {
        "hitproof_version": __version__,
        "launched": bool(argv),
        "profile": profile,
        "engine": engine,
        "server": await _server_facts(server, facts, argv),
        "model": _model_facts(server, facts, flags, model),
        "speculative": _speculative(flags, facts),
        "cache_config": _cache_labels(cache_config, flags),
        "cache_reuse": _cache_reuse(flags, cache_config, facts),
        "launch_command": " ".join(a if REDACTED in a else _quote(a) for a in redact_argv(argv)) if argv else None,
        "env": env_of_interest,
        "overlays": overlays,
        "sampling": sampling,
        "seed": sampling.get("seed"),
        "scenario_seed": scenario_seed,
        "facts": facts,
        "probe": {k: server[k] for k in ("probe_error",) if k in server},
    }


_NO_FLAGS = {"model_arg": None, "cache_reuse": {"forced_off": False, "decided_by": None},
             "speculative": {"method": UNKNOWN, "drafter": UNKNOWN, "num_speculative_tokens": UNKNOWN, "flags": []}}


async def _server_facts(server: dict[str, Any], facts: dict[str, Any], argv: list[str]) -> dict[str, Any]:
    build_info = (server.get("props") or {}).get("build_info")
    commit, commit_source = commit_from(server.get("version"), server.get("system_fingerprint"), build_info)
    if commit == UNKNOWN and argv:
        local = await asyncio.to_thread(python_package_commit, argv)
        if local:
            commit, commit_source = local, "vllm/_version.py of the launched interpreter"
    return {
        "version": server.get("version") or (facts.get("engine_version") if argv else None) or UNKNOWN,
        "commit": commit, "commit_source": commit_source,
        "system_fingerprint": server.get("system_fingerprint") or (None if argv else "not probed (attached)"),
        "build_info": build_info,
    }


def _model_facts(server: dict[str, Any], facts: dict[str, Any], flags: dict[str, Any],
                 model: str | None) -> dict[str, Any]:
    models = server.get("models") or []
    first = models[0] if models else {}
    served = model or first.get("id")
    root = next((m.get("root") for m in models if m.get("id") == served), first.get("root"))
    quant, quant_source = quantization(facts, flags, root)
    return {"served": served or UNKNOWN, "root": root, "max_model_len": first.get("max_model_len"),
            "path": flags.get("model_arg"), "quantization": quant, "quantization_source": quant_source,
            "dtype": flags.get("dtype"), "kv_cache_dtype": flags.get("kv_cache_dtype")}


def _speculative(flags: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
    spec = dict(flags["speculative"])
    for key, fact in (("method", "speculative_method"), ("drafter", "drafter"),
                      ("num_speculative_tokens", "num_speculative_tokens")):
        if facts.get(fact) is not None:
            spec[key] = facts[fact]
    return spec


def _cache_labels(cache_config: dict[str, str], flags: dict[str, Any]) -> dict[str, Any]:
    return {
        "block_size": cache_config.get("block_size") or flags.get("block_size_flag") or UNKNOWN,
        "mamba_cache_mode": cache_config.get("mamba_cache_mode") or flags.get("mamba_cache_mode_flag")
        or ("n/a" if cache_config else UNKNOWN),
        "mamba_block_size": cache_config.get("mamba_block_size") or flags.get("mamba_block_size_flag"),
        "source": "server metrics (vllm:cache_config_info)" if cache_config else
        ("launch flags" if flags.get("block_size_flag") or flags.get("mamba_cache_mode_flag") else "not reported"),
        "labels": cache_config,
    }


def _cache_reuse(flags: dict[str, Any], cache_config: dict[str, str], facts: dict[str, Any]) -> dict[str, Any]:
    """Whether cache reuse was forced off and what decided it: the profile's facts, else the server's
    own word (vLLM cache_config_info), else the launch flags."""
    if facts.get("cache_reuse_forced_off") is not None:
        return {"forced_off": bool(facts["cache_reuse_forced_off"]), "decided_by": "profile facts"}
    reuse = dict(flags["cache_reuse"])
    enabled = str(cache_config.get("enable_prefix_caching", "")).lower()
    if enabled in ("true", "false"):
        said = f"server: vllm:cache_config_info enable_prefix_caching={cache_config['enable_prefix_caching']}"
        if reuse.get("decided_by") in (None, "engine default") or reuse.get("forced_off") != (enabled == "false"):
            reuse = {"forced_off": enabled == "false", "decided_by": said}
        else:
            reuse["confirmed_by"] = said
    return reuse


def _quote(word: str) -> str:
    import shlex
    return shlex.quote(word)
