"""Make a tiny random-weight hybrid model and convert it to a GGUF for llama.cpp.

Run with the tiny build venv's python (torch, transformers, tokenizers); hitproof never
imports this file (tui/embedded/tiny.py runs it).

    python tiny_build.py tokenizer DOCS_DIR OUT_DIR [--vocab 2048]
    python tiny_build.py model NAME --tokenizer DIR --converter DIR --seed N --work DIR --out FILE.gguf
                         [--init-range 0.2] [--convert-arg=--no-mtp ...]
    python tiny_build.py model NAME --tokenizer DIR --seed N --work DIR --variant vllm   (HF folder only)

Lines starting with "tiny:" are progress for the person waiting; the last line,
"tiny-result: {json}", is the outcome.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Qwen2's pre-tokenizer split regex, exactly: llama.cpp's "qwen2" pre-tokenizer implements it,
# so the converter's unknown-hash refusal can be mapped to "qwen2" (tiny.py patches that).
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIALS = [ENDOFTEXT, IM_START, IM_END]  # ids 0, 1, 2; ChatML needs the last two

# The sizes of shared/real-server.md's measured recipe: hidden 128, 8 layers, 4 small experts.
HIDDEN, LAYERS, VOCAB_DEFAULT = 128, 8, 2048
# Standard deviation of the random weights. transformers' default (0.02) gives nearly flat
# logits: two memos differing only in their first line then share their greedy text and their
# top-5 log-probabilities differ by 0.0003 (Granite) / 0.005 (Qwen3-Next). With 0.2 those memos
# get different greedy text and log-probabilities about 1 apart, while a hit still reproduces
# its cold values exactly: a much sharper fingerprint.
INIT_RANGE_DEFAULT = 0.2


def say(msg: str) -> None:
    print(f"tiny: {msg}", flush=True)


def result(data: dict) -> None:
    print("tiny-result: " + json.dumps(data), flush=True)


# -- tokenizer --------------------------------------------------------------------------


def train_tokenizer(docs: Path, out: Path, vocab: int) -> None:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    files = sorted(str(p) for p in docs.rglob("*.md"))  # sorted: the same merges every time
    if not files:
        sys.exit(f"error: no .md files under {docs}")
    size = sum(Path(f).stat().st_size for f in files)
    say(f"training a byte-level BPE (vocab {vocab}) on {len(files)} files of llama.cpp's docs ({size / 1e6:.1f} MB)")
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=SPECIALS, min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train(files, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=ENDOFTEXT, pad_token=ENDOFTEXT, unk_token=None, bos_token=None,
        additional_special_tokens=[IM_START, IM_END], model_max_length=8192,
    )
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    cfg_path = out / "tokenizer_config.json"  # Qwen2-like: no BOS, no EOS added to prompts
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    cfg.update(add_bos_token=False, add_eos_token=False)
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False), encoding="utf-8")
    ids = [tok.token_to_id(s) for s in SPECIALS]
    if ids != [0, 1, 2]:
        sys.exit(f"error: special token ids {ids}, expected [0, 1, 2]")
    sample = "Reconciliation code 7395-2841-6620."
    say(f"vocab {tok.get_vocab_size()}; {sample!r} -> {len(tok.encode(sample).ids)} tokens")
    result({"vocab": tok.get_vocab_size(), "files": len(files), "bytes": size})


# -- models -----------------------------------------------------------------------------


# Head sizes per engine. llama.cpp takes heads of 32. vLLM's CPU gated delta-net kernel does not
# ("Unexpected head dim size, 32"); with 128 it serves (shared/real-server.md, measured 2026-12-02).
QWEN3NEXT_HEADS = {
    "llamacpp": dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2,
                     linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32),
    "vllm": dict(num_attention_heads=2, num_key_value_heads=1, head_dim=128, linear_num_key_heads=1,
                 linear_num_value_heads=2, linear_key_head_dim=128, linear_value_head_dim=128),
}


def qwen3next(vocab: int, init_range: float, variant: str = "llamacpp"):
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    layer_types = (["linear_attention"] * 3 + ["full_attention"]) * (LAYERS // 4)
    cfg = Qwen3NextConfig(
        vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=256, num_hidden_layers=LAYERS,
        **QWEN3NEXT_HEADS[variant],
        linear_conv_kernel_dim=4,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64,
        decoder_sparse_step=1, layer_types=layer_types, max_position_embeddings=8192,
        initializer_range=init_range, tie_word_embeddings=False, bos_token_id=None, eos_token_id=0, pad_token_id=0,
    )
    return Qwen3NextForCausalLM(cfg), {"layer_types": layer_types, "full_attention_interval": 4}


def granite_hybrid(vocab: int, init_range: float, variant: str = "llamacpp"):
    from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM

    layer_types = (["mamba"] * 3 + ["attention"]) * (LAYERS // 4)
    cfg = GraniteMoeHybridConfig(
        vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2,
        num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=64,
        layer_types=layer_types, position_embedding_type="nope",  # as Granite-4.0-H: Mamba carries position
        mamba_n_heads=8, mamba_d_head=32, mamba_expand=2, mamba_d_state=32, mamba_n_groups=1, mamba_d_conv=4,
        max_position_embeddings=8192, initializer_range=init_range, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=0, pad_token_id=0,
    )
    # Newer transformers writes linear_attention / full_attention, which the converter ignores
    # (the server then fails: tensor 'blk.3.ssm_in.weight' not found): config.json gets these back.
    return GraniteMoeHybridForCausalLM(cfg), {"layer_types": layer_types}


BUILDERS = {"qwen3next-tiny": qwen3next, "granite-h-tiny": granite_hybrid}


def build_model(args: argparse.Namespace) -> None:
    import torch
    import transformers
    from transformers import AutoTokenizer

    if args.name not in BUILDERS:
        sys.exit(f"error: unknown model {args.name!r}; known: {', '.join(BUILDERS)}")
    for key in ("tokenizer", "converter", "work", "out"):  # the converter runs in its own folder
        if getattr(args, key) is not None:
            setattr(args, key, getattr(args, key).resolve())
    t0 = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer))
    vocab = len(tokenizer)
    torch.manual_seed(args.seed)  # the random weights are a function of the seed (and the pinned versions)
    model, config_fix = BUILDERS[args.name](vocab, args.init_range, args.variant)
    # vLLM's build is saved in bf16, as real Qwen3-Next checkpoints are: vLLM then keeps the recurrent
    # state in bf16 too (the field's default; a float32 folder gave mamba_ssm_cache_dtype float32)
    model = model.to(torch.bfloat16 if args.variant == "vllm" else torch.float32).eval()
    params = sum(p.numel() for p in model.parameters())
    say(f"{args.name}: {type(model).__name__}, {params / 1e6:.2f} M parameters, "
        f"random weights (seed {args.seed}, std {args.init_range})")
    hf_dir = args.work / "hf"
    hf_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(hf_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(hf_dir))
    cfg_path = hf_dir / "config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    cfg.update(config_fix)
    cfg_path.write_text(json.dumps(cfg, indent=2), encoding="utf-8")
    if args.out is None:              # vLLM serves the Hugging Face folder itself
        say(f"{hf_dir}: Hugging Face folder for {args.variant}")
        result({"architecture": type(model).__name__, "parameters": params, "vocab": vocab, "hf_dir": str(hf_dir),
                "initializer_range": args.init_range, "torch": torch.__version__,
                "transformers": transformers.__version__, "seconds": round(time.monotonic() - t0, 1)})
        return

    converter = args.converter / "convert_hf_to_gguf.py"
    argv = [sys.executable, str(converter), str(hf_dir), "--outfile", str(args.out), "--outtype", "f32",
            *args.convert_arg]
    say("converting with llama.cpp's convert_hf_to_gguf.py (f32)")
    env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}  # use the gguf-py beside the converter
    proc = subprocess.run(argv, cwd=str(args.converter), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    print(proc.stdout, flush=True)
    if proc.returncode != 0:
        lines = [line for line in proc.stdout.splitlines() if line.strip()]
        why = next((line for line in reversed(lines) if "error" in line.lower()), lines[-1] if lines else "?")
        sys.exit(f"error: convert_hf_to_gguf.py exited {proc.returncode}: {why}")

    sys.path.insert(0, str(args.converter / "gguf-py"))
    from gguf import GGUFReader

    reader = GGUFReader(str(args.out))
    arch_field = reader.fields["general.architecture"]
    arch = bytes(arch_field.parts[arch_field.data[0]]).decode()
    pre_field = reader.fields.get("tokenizer.ggml.pre")
    pre = bytes(pre_field.parts[pre_field.data[0]]).decode() if pre_field else None
    size = args.out.stat().st_size
    say(f"{args.out.name}: {arch}, {len(reader.tensors)} tensors, {size / 1e6:.1f} MB, pre-tokenizer {pre}")
    result({
        "architecture": arch, "parameters": params, "tensors": len(reader.tensors), "bytes": size,
        "pre_tokenizer": pre, "vocab": vocab, "initializer_range": args.init_range, "torch": torch.__version__, "transformers": transformers.__version__,
        "seconds": round(time.monotonic() - t0, 1),
    })


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("tokenizer")
    p.add_argument("docs", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--vocab", type=int, default=VOCAB_DEFAULT)
    p = sub.add_parser("model")
    p.add_argument("name")
    p.add_argument("--tokenizer", type=Path, required=True)
    p.add_argument("--converter", type=Path)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--init-range", type=float, default=INIT_RANGE_DEFAULT)
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--out", type=Path, help="the GGUF to write; without it only the Hugging Face folder (vLLM)")
    p.add_argument("--variant", choices=sorted(QWEN3NEXT_HEADS), default="llamacpp",
                   help="the engine the sizes are for (head sizes differ)")
    p.add_argument("--convert-arg", action="append", default=[])
    args = parser.parse_args()
    if args.cmd == "tokenizer":
        train_tokenizer(args.docs, args.out, args.vocab)
    else:
        build_model(args)


if __name__ == "__main__":
    main()
