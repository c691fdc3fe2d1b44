"""Embedded real engines (vLLM CPU, llama.cpp), installed on first use under cache_dir().

    prepare("vllm", progress=print)             # idempotent; minutes the first time, instant later
    spec = launch_spec("vllm", port=free_port())
    server = ServerProcess(spec.argv, url=spec.url, env=spec.env)   # tui.core.server.launch
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..core.server.launch import free_port
from ..core.server.profiles import LaunchPlan
from . import llamacpp, vllm
from .common import EngineLaunch, SetupError, cache_dir

__all__ = ["ENGINES", "EngineLaunch", "SetupError", "cache_dir", "placeholders", "prepare", "launch_spec",
           "launch_plan"]

ENGINES = ("vllm", "llamacpp")
_MODULES = {"vllm": vllm, "llamacpp": llamacpp}


def _module(engine: str):
    try:
        return _MODULES[engine]
    except KeyError:
        raise SetupError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}") from None


def prepare(engine: str, *, model: str = "gemma3-270m", progress: Callable[[str], None] = print,
            lora: bool = False) -> None:
    """Install the engine and its model once (visible progress); later calls return at once.

    lora=True also makes the two tiny LoRA adapters (tui/embedded/lora.py; needs the vLLM setup,
    whose venv and converted model make them, whichever engine serves them).
    """
    _module(engine).prepare(model, progress)
    if lora:
        from . import lora as lora_mod

        lora_mod.prepare(progress, model=model)


def launch_spec(engine: str, *, port: int, model: str = "gemma3-270m", lora: bool = False,
                drafter: bool = False, small_cache: bool = False, extra_args: tuple[str, ...] = ()) -> EngineLaunch:
    """How to start the engine's server on 127.0.0.1:port; SetupError if prepare() has not run.

    lora: serve adapters a and b (vLLM: models "a"/"b"; llama.cpp: ids 0/1 at scale 0 by default).
    drafter: speculative decoding (llama.cpp: Gemma drafting for itself; vLLM: n-gram lookup).
    small_cache: a KV / prompt cache small enough to evict within minutes.
    extra_args: appended to the command line last.
    """
    return _module(engine).launch_spec(port=port, model=model, lora=lora, drafter=drafter,
                                       small_cache=small_cache, extra_args=tuple(extra_args))


def launch_plan(engine: str, *, model: str = "gemma3-270m", replicas: int | None = None, router: str | None = None,
                policy: str | None = None) -> LaunchPlan:
    """How `hitproof run --engine E` starts it: alone on a free port, or `replicas` of it behind a real
    router (tui/embedded/router.py); SetupError if prepare() has not run."""
    if replicas:
        from .router import cluster_launch_plan

        return cluster_launch_plan(replicas, router=router, policy=policy, engine=engine, model=model)
    return launch_spec(engine, port=free_port(), model=model).plan()


def placeholders() -> dict[str, Callable[[], str]]:
    """Values of the launch profiles' {llama_server}, {models}, {chat_template} (the embedded Gemma chat
    template, package data of every install) and {router_python} (tui.core.server.profiles)."""
    from ..core.config.errors import BadInput
    from .common import cache_dir, read_info

    def llama_server() -> str:
        binary = read_info("llamacpp").get("binary")
        if not binary:
            raise BadInput("{llama_server}: the embedded llama.cpp is not set up: run `hitproof setup --engine "
                             "llamacpp`")
        return str(binary)

    def router_python() -> str:
        from .router import router_python as python

        path = python()
        if path is None:
            raise BadInput("{router_python}: the routers are not set up: run `hitproof setup --engine router`")
        return str(path)

    return {"llama_server": llama_server, "models": lambda: str(cache_dir() / "models"),
            "router_python": router_python,
            "chat_template": lambda: str(Path(__file__).resolve().parent / "gemma_chat.jinja")}
