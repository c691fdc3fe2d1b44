"""The two tiny LoRA adapters as the engines serve them: their recipe, where they lie, what a launch and
a request say about them. Made by tui/embedded/lora.py (its `prepare`); served by vllm.py and
llamacpp.py, which read them here, so neither engine depends on the setup that makes them.

    adapters()                          # {"a": Adapter(...), "b": Adapter(...)} once made
    facts()                             # what a run header records about them
    request_fields(engine, adapter)     # the body fields that choose one (None: the base model)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .common import SetupError, cache_dir, engine_home, read_info

HOME = "lora"
MODEL = "gemma3-270m"  # the only model the adapters are made for
RANK = 8
ALPHA = 8  # scaling alpha / rank = 1: the strength alone sets how far the output moves
# B's standard deviation is STRENGTH / sqrt(rank), A's 1 / sqrt(in_features). Measured on Gemma 3
# 270M (NOTES-lora-drafter.md): 0.05 changes greedy text and moves top-5 log-probabilities by 1.3-2.7
# while both adapters still recall planted codes; 0.2 makes the model babble ("1:1:1:1").
STRENGTH = 0.05
SEEDS = {"a": 1, "b": 2}


@dataclass(frozen=True)
class Adapter:
    name: str  # "a" | "b": vLLM's served LoRA name, and the llama.cpp adapter id order
    llamacpp_id: int  # position in llama-server's --lora list
    peft_dir: str
    gguf: str
    seed: int


def home() -> Path:
    return engine_home(HOME)


def peft_dir(name: str) -> Path:
    return cache_dir() / "models" / f"{MODEL}-lora-{name}"


def gguf_path(name: str) -> Path:
    return cache_dir() / "models" / f"{MODEL}-lora-{name}-f32.gguf"


def info() -> dict:
    """The setup's record (cache_dir()/lora/info.json); empty before the setup wrote one."""
    try:
        return read_info(HOME)
    except SetupError:
        return {}


def adapters() -> dict[str, Adapter]:
    """Both adapters; SetupError (one line) if lora.prepare() has not made them."""
    made = info()
    out = {}
    for i, (name, seed) in enumerate(SEEDS.items()):
        entry = made.get(name) or {}
        pdir, gguf = peft_dir(name), gguf_path(name)
        if not (pdir / "adapter_model.safetensors").is_file() or not gguf.is_file() or "gguf" not in entry:
            raise SetupError(f"the LoRA adapters are not made yet (no {gguf.name}): "
                             "run tui.embedded.prepare(engine, lora=True) first")
        out[name] = Adapter(name, i, str(pdir), str(gguf), seed)
    return out


def facts() -> dict:
    """What a run header records about the adapters."""
    made = info()
    return {
        "lora_adapters": {n: {"seed": a.seed, "peft_dir": a.peft_dir, "gguf": a.gguf} for n, a in adapters().items()},
        "lora_recipe": f"rank {RANK}, alpha {ALPHA}, all decoder linear layers, random A and B "
                       f"(B std {STRENGTH}/sqrt(rank)), peft {made.get('peft', '?')}",
    }


def request_fields(engine: str, adapter: str | None, *, base_model: str = MODEL) -> dict:
    """The body fields that choose an adapter (None: the base model) on a launch_spec(lora=True) server.

    vLLM serves each adapter as its own model name. llama.cpp takes a per-request `lora` list; it
    is always the full list (every id, the unused ones at scale 0): a request *without* the field
    gets the server's default set, and this llama.cpp build then keeps the slot's cache from a
    request under another adapter (measured, NOTES-lora-drafter.md), so an explicit list is the
    only way to say "base" that drops a foreign cache.
    """
    if adapter is not None and adapter not in SEEDS:
        raise ValueError(f"unknown adapter {adapter!r}; known: {', '.join(SEEDS)}")
    if engine == "vllm":
        return {"model": adapter or base_model}
    if engine == "llamacpp":
        return {"model": base_model,
                "lora": [{"id": i, "scale": 1.0 if name == adapter else 0.0} for i, name in enumerate(SEEDS)]}
    raise ValueError(f"unknown engine {engine!r}")
