"""Trained models that ship in the package (issue 33): `qwen3next-recall`, the tiny Qwen3-Next trained on a GPU to
recall hitproof's planted codes (tui/embedded/recall_train.py; runs and commands in benchmarks/gpu/recall/), and
`qwen3next-recurrent-recall`, the same sizes with every layer recurrent, whose recall needs the restored state.

Two folders hold each, each with a SHA256SUMS: `recall_model/` (the Hugging Face folder vLLM serves, bf16
safetensors and the tiny models' tokenizer) and `recall_gguf/` (the same weights converted for llama.cpp by
its own convert_hf_to_gguf.py of the server's release, `--outtype bf16 --no-mtp`: lossless for bf16 weights,
the same bytes on every conversion, measured). Setup checks every file against its sum and copies it where
the engine serves it: no build, no torch, a second.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent


@dataclass(frozen=True)
class ShippedModel:
    name: str            # hitproof's --model choice
    hf: Path             # the Hugging Face folder vLLM serves
    gguf: Path           # the folder holding the same weights for llama.cpp
    layers: str          # what a person reads in the run header
    weights: str


RECALL = "qwen3next-recall"
RECALL_HF = HERE / "recall_model"
RECALL_GGUF = HERE / "recall_gguf"
RECALL_LAYERS = "8 layers: (gated delta-net x3, full attention) x2; hidden 128; 4 experts; heads of 128"
RECALL_WEIGHTS = ("trained to recall hitproof's planted codes (issue 33, H200 call 6): exact at 1,500-4,500 "
                  "tokens; its attention layers make the copy, so a zeroed recurrent state keeps the code")
# Every layer that counts a gated delta-net: the code crosses the memo in the recurrent state alone, so a restore
# that yields a zeroed or wrong state loses it (the field report's proof; benchmarks/gpu/recall/README.md, call 9).
# Its last layer is full attention whose output is zero: llama.cpp serves no Qwen3-Next without an attention
# layer, and with one vLLM takes its hybrid path (the attention-aligned grid), as for qwen3next-recall.
RECURRENT_RECALL = "qwen3next-recurrent-recall"
SHIPPED = {
    RECALL: ShippedModel(RECALL, RECALL_HF, RECALL_GGUF, RECALL_LAYERS, RECALL_WEIGHTS),
    RECURRENT_RECALL: ShippedModel(
        RECURRENT_RECALL, HERE / "recurrent_recall_model", HERE / "recurrent_recall_gguf",
        "9 layers: gated delta-net x8, then one full attention adding zero (recall_hybridize.py); hidden 128; "
        "4 experts; heads of 128",
        "trained to recall hitproof's planted codes through the recurrent state alone (issue 33, H200 call 9): "
        "a zeroed or foreign state at a restore loses the code"),
}
def sums(folder: Path) -> dict[str, str]:
    """A shipped folder's SHA256SUMS: file name -> sha256."""
    lines = (folder / "SHA256SUMS").read_text(encoding="utf-8").splitlines()
    return {name.strip(): digest for digest, name in (line.split(maxsplit=1) for line in lines if line.strip())}


def mismatched(folder: Path) -> list[str]:
    """The files of a shipped folder that are missing or whose sha256 is not SHA256SUMS' ([] when all match)."""
    return [name for name, digest in sums(folder).items()
            if not (folder / name).is_file() or hashlib.sha256((folder / name).read_bytes()).hexdigest() != digest]


def parameters(safetensors: Path) -> int:
    """How many parameters a safetensors file holds (from its header: each tensor's shape)."""
    with safetensors.open("rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    return sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__")


def copy_checked(source: Path, target: Path) -> None:
    """Copy a shipped folder (or one file of it, when `target` is a file path) after checking its sums;
    ValueError naming the files that differ. The copy lands whole or not at all."""
    if wrong := mismatched(source):
        raise ValueError(f"{', '.join(wrong)} in {source} differ from SHA256SUMS: reinstall hitproof")
    partial = target.with_name(target.name + ".partial")
    if partial.is_dir():
        shutil.rmtree(partial)
    partial.unlink(missing_ok=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    names = list(sums(source))
    if target.suffix == ".gguf":
        (gguf,) = [n for n in names if n.endswith(".gguf")]
        shutil.copyfile(source / gguf, partial)
        partial.replace(target)
        return
    shutil.copytree(source, partial)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
