"""Convert a Gemma 3 GGUF into a Hugging Face folder that vLLM can load.

Run with the vLLM venv's python (it needs torch, transformers, gguf, accelerate);
hitproof never imports this file.   usage: python convert_gemma.py MODEL.gguf OUT_DIR
Lines starting with "convert:" are progress for the person waiting.
"""

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig  # noqa: E402

BOS, BOS_ID = "<bos>", 2


def say(msg: str) -> None:
    print(f"convert: {msg}", flush=True)


def patch_bos(out: Path) -> None:
    """The GGUF says "add <bos>", the converted tokenizer does not; without it the model babbles."""
    path = out / "tokenizer.json"
    tok = json.loads(path.read_text(encoding="utf-8"))
    bos = {"SpecialToken": {"id": BOS, "type_id": 0}}
    tok["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": BOS, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {BOS: {"id": BOS, "ids": [BOS_ID], "tokens": [BOS]}},
    }
    path.write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
    # transformers rebuilds the post-processor from this flag on load: it must agree.
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    cfg["add_bos_token"] = True
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False), encoding="utf-8")


def verify(out: Path) -> None:
    tok = AutoTokenizer.from_pretrained(str(out))
    ids = tok("hello")["input_ids"]
    if not ids or ids[0] != BOS_ID or ids.count(BOS_ID) != 1:
        sys.exit(f"error: tokenizer check failed: 'hello' -> {ids}, expected one leading <bos> ({BOS_ID})")
    say(f"tokenizer check ok: 'hello' -> {ids}")


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    gguf, out = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
    folder, name = str(gguf.parent), gguf.name
    out.mkdir(parents=True, exist_ok=True)
    say(f"reading tokenizer from {gguf}")
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(out)
    say("dequantizing weights to bf16 (about a minute)")
    model = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.bfloat16,
        quantization_config=GgufConfig(gguf_file=name, dequantize=True),
    )
    model.save_pretrained(out)
    patch_bos(out)
    verify(out)
    say("conversion done")


if __name__ == "__main__":
    main()
