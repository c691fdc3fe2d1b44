"""Make the tiny LoRA adapters for the embedded Gemma 3 270M, and measure what they change.

Run with the vLLM venv's python (torch, transformers, peft); hitproof never imports this file
(tui/embedded/lora.py runs it).

    python lora_build.py make HF_DIR OUT_DIR --seed N --rank R --alpha A --strength S
    python lora_build.py measure HF_DIR PROMPTS.json --adapter NAME=DIR ... [--tokens 12]

`make` writes a PEFT adapter folder (adapter_config.json + adapter_model.safetensors) with
random, non-zero A *and* B matrices drawn from a generator seeded with N (PEFT's default
initialisation sets B to zero, which changes nothing). `measure` runs the base model and each
adapter on the prompts with transformers (float32, greedy) and reports, per adapter, how many
of the first greedy tokens differ from the base model's, the largest log-probability difference
on the base model's top-5 tokens (teacher-forced on the base continuation, so the positions
line up), and which planted codes are still recalled.

Lines starting with "lora:" are progress for the person waiting; the last line,
"lora-result: {json}", is the outcome.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local

# Every linear layer of the decoder: vLLM packs q/k/v and gate/up, llama.cpp applies each.
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def say(msg: str) -> None:
    print(f"lora: {msg}", flush=True)


def result(data: dict) -> None:
    print("lora-result: " + json.dumps(data), flush=True)


def load_base(hf_dir: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf_dir)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    return tok, model


def make(args: argparse.Namespace) -> None:
    import peft
    import torch
    from peft import LoraConfig, get_peft_model

    t0 = time.monotonic()
    _, model = load_base(args.hf_dir)
    cfg = LoraConfig(r=args.rank, lora_alpha=args.alpha, lora_dropout=0.0, bias="none",
                     target_modules=TARGETS, init_lora_weights=False, task_type="CAUSAL_LM")
    model = get_peft_model(model, cfg)
    # Our own draw, not PEFT's or torch's global state: the same seed gives the same adapter.
    gen = torch.Generator().manual_seed(args.seed)
    count = 0
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if "lora_A" in name:        # (rank, in): unit-variance projections of the input
                param.copy_(torch.randn(param.shape, generator=gen) / param.shape[1] ** 0.5)
            elif "lora_B" in name:      # (out, rank): the strength sets how far the output moves
                param.copy_(torch.randn(param.shape, generator=gen) * args.strength / param.shape[1] ** 0.5)
            else:
                continue
            count += param.numel()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    # vLLM and llama.cpp's converter both read base_model_name_or_path; a local path, never a hub id.
    cfg_path = out / "adapter_config.json"
    data = json.loads(cfg_path.read_text())
    data["base_model_name_or_path"] = str(Path(args.hf_dir).resolve())
    cfg_path.write_text(json.dumps(data, indent=2))
    size = sum(p.stat().st_size for p in out.iterdir())
    say(f"{out.name}: rank {args.rank}, alpha {args.alpha}, strength {args.strength}, seed {args.seed}, "
        f"{count / 1e6:.2f} M parameters, {size / 1e6:.1f} MB")
    result({"parameters": count, "bytes": size, "peft": peft.__version__, "torch": torch.__version__,
            "seconds": round(time.monotonic() - t0, 1)})


def measure(args: argparse.Namespace) -> None:
    import torch
    from peft import PeftModel

    t0 = time.monotonic()
    tok, base = load_base(args.hf_dir)
    adapters = dict(a.split("=", 1) for a in args.adapter)
    names = list(adapters)
    model = PeftModel.from_pretrained(base, adapters[names[0]], adapter_name=names[0])
    for name in names[1:]:
        model.load_adapter(adapters[name], adapter_name=name)
    model.eval()
    prompts = json.loads(Path(args.prompts).read_text())

    def run(which: str | None, ids, forced=None):
        """Greedy tokens (or the forced ones) and log-softmax at each generated position."""
        ctx = model.disable_adapter() if which is None else _nullcontext()
        if which is not None:
            model.set_adapter(which)
        with torch.no_grad(), ctx:
            if forced is None:
                out = model.generate(ids, max_new_tokens=args.tokens, do_sample=False, num_beams=1,
                                     pad_token_id=tok.pad_token_id)
                forced = out[0, ids.shape[1]:].tolist()
            full = torch.cat([ids, torch.tensor([forced])], dim=1)
            logits = model(full).logits[0, ids.shape[1] - 1: ids.shape[1] - 1 + len(forced)]
            return forced, torch.log_softmax(logits.float(), dim=-1)

    report: dict = {"prompts": [], "adapters": names}
    for p in prompts:
        ids = tok(p["text"], return_tensors="pt")["input_ids"]
        entry = {"name": p["name"], "prompt_tokens": ids.shape[1], "code": p.get("code")}
        base_tokens, base_lp = run(None, ids)
        entry["base"] = {"text": tok.decode(base_tokens), "recalled": _recalled(tok, base_tokens, p)}
        top5 = torch.topk(base_lp, 5, dim=-1).indices
        greedy = {None: base_tokens}
        for name in names:
            tokens, _ = run(name, ids)
            greedy[name] = tokens
            _, forced_lp = run(name, ids, forced=base_tokens)   # same positions as the base run
            diff = (forced_lp.gather(1, top5) - base_lp.gather(1, top5)).abs()
            entry[name] = {
                "text": tok.decode(tokens), "recalled": _recalled(tok, tokens, p),
                "tokens_differ_from_base": sum(a != b for a, b in zip(tokens, base_tokens)),
                "max_top5_logprob_diff": round(diff.max().item(), 4),
                "first_token_top5_logprob_diff": round(diff[0].max().item(), 4),
            }
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                entry[f"{a}_vs_{b}_tokens_differ"] = sum(x != y for x, y in zip(greedy[a], greedy[b]))
        report["prompts"].append(entry)
        say(f"{p['name']} ({ids.shape[1]} tokens): base {entry['base']['text']!r}; "
            + "; ".join(f"{n} {entry[n]['text']!r} ({entry[n]['tokens_differ_from_base']} differ, "
                        f"max dlogp {entry[n]['max_top5_logprob_diff']})" for n in names))
    report["seconds"] = round(time.monotonic() - t0, 1)
    result(report)


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _recalled(tok, tokens: list[int], prompt: dict) -> bool | None:
    code = prompt.get("code")
    return None if not code else code in tok.decode(tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("make")
    p.add_argument("hf_dir")
    p.add_argument("out")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--alpha", type=int, required=True)
    p.add_argument("--strength", type=float, required=True)
    p = sub.add_parser("measure")
    p.add_argument("hf_dir")
    p.add_argument("prompts")
    p.add_argument("--adapter", action="append", required=True, help="NAME=DIR")
    p.add_argument("--tokens", type=int, default=12)
    args = parser.parse_args()
    if args.cmd == "make":
        make(args)
    else:
        measure(args)


if __name__ == "__main__":
    sys.exit(main())
