"""Train a tiny hybrid to read back hitproof's planted codes (issue 33): `qwen3next-recall`.

Run with a python that has torch and transformers (the GPU machine's own; on the CPU it runs, slowly);
hitproof never imports this file. The examples are hitproof's own: memos from tui.core.evidence.text
(MemoText, SentenceSource, code_sentence), codes from tui.core.evidence.codes.CodeBook, the prompts the
scenarios send (recall, summary, determinism, conversation transcripts, the agent replay of
tui.core.evidence.agent), tokenized with the tiny models' own tokenizer. The loss is on the answers,
plus a small weight on the memo text itself (so the summary and turn answers are memo-like prose).

    PYTHONPATH=. python3 tui/embedded/recall_train.py --tokenizer DIR --out DIR --layout hybrid \
        --seed 33 --minutes 7

Lines starting with "train:" are progress; the last line "train-result: {json}" is the outcome. The
folder written is a Hugging Face folder (bf16 weights, config, tokenizer, train.log, result.json).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

# run as a script, its own folder comes first on sys.path: the sibling is imported without tui.embedded's
# __init__ (which needs httpx, absent from the GPU machine's training environment)
from recall_examples import EOS, Examples, pick_task  # noqa: I001

HIDDEN, LAYERS = 128, 8
# vLLM's CPU gated delta-net kernel takes heads of 128 only (tiny_build.QWEN3NEXT_HEADS["vllm"]); llama.cpp
# serves these sizes too, so one set of weights serves both engines.
HEADS = dict(num_attention_heads=2, num_key_value_heads=1, head_dim=128, linear_num_key_heads=1,
             linear_num_value_heads=2, linear_key_head_dim=128, linear_value_head_dim=128)
# Layer layouts tried (issue 33, "recall that needs the state"): with attention in the middle of the stack
# the copy can be an induction head over the memo's cached keys, which a zeroed recurrent state leaves
# intact; with attention only in the last layer of each group, or none, the state has to carry the code.
LAYOUTS = {
    "hybrid": (["linear_attention"] * 3 + ["full_attention"]) * 2,          # full_attention_interval 4
    "late": ["linear_attention"] * 7 + ["full_attention"],                 # full_attention_interval 8
    "recurrent": ["linear_attention"] * 8,                                 # no attention layer
}
INTERVAL = {"hybrid": 4, "late": 8, "recurrent": 9}   # llama.cpp: layer i is recurrent unless (i+1) % N == 0
LM_WEIGHT = 0.05      # weight of the memo text's mean loss against the answers' mean loss


def say(msg: str) -> None:
    print(f"train: {msg}", flush=True)


# -- model -------------------------------------------------------------------------------


def long_memory(model) -> None:
    """--decay-init long: transformers starts each gated delta-net head forgetting at A * softplus(1), with A drawn
    from 0.01-16 (Qwen3NextGatedDeltaNet), so most heads keep a token for well under one position and the
    gradient that could slow them vanishes with the memory; the recurrent layouts never learned a copy (calls 5,
    7, 8). Here each head's rate is spread log-uniformly over 1e-4 to 1e-1 a token (Mamba-2's dt range, reaching
    memos of thousands of tokens): A = 1 and dt_bias = softplus's inverse of the rate."""
    import torch

    heads = [m for m in model.modules() if hasattr(m, "A_log") and hasattr(m, "dt_bias")]
    total = sum(m.dt_bias.numel() for m in heads)
    rates = torch.logspace(-4, -1, steps=total)[torch.randperm(total)].split([m.dt_bias.numel() for m in heads])
    with torch.no_grad():
        for m, rate in zip(heads, rates):
            m.A_log.zero_()
            m.dt_bias.copy_(torch.log(torch.expm1(rate)))


def build_model(vocab: int, layout: str, seed: int):
    import torch
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3NextConfig(
        vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=256, num_hidden_layers=LAYERS, **HEADS,
        linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
        shared_expert_intermediate_size=64, decoder_sparse_step=1, layer_types=LAYOUTS[layout],
        max_position_embeddings=8192, tie_word_embeddings=False, bos_token_id=None, eos_token_id=EOS,
        pad_token_id=EOS,
    )
    return Qwen3NextForCausalLM(cfg)


TEXT, ANSWER, FIRST = 1, 2, 3   # what each position of a batch is: 0 padding, memo text, answer, its first word
# The answer's first real token (a code's first digit, after the token " "): the one the hybrid got wrong on
# every recall after 1,300 steps (always "7": " " also precedes every section number, so copying the first
# digit needs two tokens of context, the others one). Weighed up with --first-weight.


def batch_of(ex: Examples, length: int, budget: int, device, bare_share: float = 0.0):
    """(token ids, kind of each position): right-padded rows of about `length` prompt tokens."""
    import torch

    rows, width = [], 0
    while not rows or (len(rows) + 1) * width <= budget:    # padded tokens within the budget
        prompt, answer = ex.tokens(pick_task(ex.rng, bare_share), length)
        if rows and (len(rows) + 1) * max(width, len(prompt) + len(answer)) > budget:
            break
        rows.append((prompt, answer))
        width = max(width, len(prompt) + len(answer))
    ids = torch.full((len(rows), width), EOS, dtype=torch.long)
    kind = torch.zeros((len(rows), width), dtype=torch.int8)
    for i, (p, a) in enumerate(rows):
        seq = p + a
        ids[i, :len(seq)] = torch.tensor(seq)
        kind[i, 1:len(p)] = TEXT         # kind[t]: what predicting seq[t] from seq[:t] is
        kind[i, len(p):len(seq)] = ANSWER
        if len(a) > 1:
            kind[i, len(p) + 1] = FIRST
    return ids.to(device), kind.to(device)


def attention_mask(length: int, window: int, device):
    """--attention-window: each full-attention layer sees only the last `window` positions (itself
    included), so that the code cannot cross the memo in attention, only in the recurrent state; None:
    full causal attention (what the engines serve)."""
    if not window:
        return None
    import torch

    at = torch.arange(length, device=device)
    back = at[:, None] - at[None, :]
    return {"full_attention": ((back >= 0) & (back < window))[None, None], "linear_attention": None}


def loss_of(model, ids, kind, first_weight: float = 1.0, window: int = 0):
    """(loss, answer loss, memo-text loss): each normalised on its own, so that a 1,500-token memo's text
    does not drown the 16 answer tokens (a first GPU run that weighed them per token learned the text
    and recalled nothing in 420 steps)."""
    import torch.nn.functional as F

    logits = model(input_ids=ids, attention_mask=attention_mask(ids.shape[1], window, ids.device),
                   use_cache=False).logits[:, :-1].float()
    target, k = ids[:, 1:].reshape(-1), kind[:, 1:].reshape(-1)
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target, reduction="none")
    first = (k == FIRST).float()
    answer, text = (k == ANSWER).float() + first_weight * first, (k == TEXT).float()
    answer_loss = (nll * answer).sum() / answer.sum().clamp(min=1)
    text_loss = (nll * text).sum() / text.sum().clamp(min=1)
    return answer_loss + LM_WEIGHT * text_loss, answer_loss, text_loss


def evaluate(model, ex: Examples, device, lengths: list[int], per_length: int, tasks=("recall",),
             window: int = 0) -> dict:
    """Exact recall by teacher forcing: the answer's code tokens are each the argmax given the prompt and
    the code so far, which is exactly what greedy decoding would emit. One batched forward per length."""
    import torch

    model.eval()
    out = {}
    with torch.no_grad(), torch.autocast(device_type=device.type, dtype=torch.bfloat16,
                                         enabled=device.type == "cuda"):
        for task in tasks:
            for length in lengths:
                rows = []
                for _ in range(per_length):
                    prompt, answer = ex.make(task, length)
                    code = answer.strip().rstrip(".")
                    rows.append((ex.encode(prompt), ex.encode(" " + code)))
                exact = 0
                for i in range(0, len(rows), 8):
                    chunk = rows[i:i + 8]
                    width = max(len(p) + len(a) for p, a in chunk)
                    ids = torch.full((len(chunk), width), EOS, dtype=torch.long)
                    for j, (p, a) in enumerate(chunk):
                        ids[j, :len(p) + len(a)] = torch.tensor(p + a)
                    pred = model(input_ids=ids.to(device), attention_mask=attention_mask(width, window, device),
                                 use_cache=False).logits.argmax(-1).cpu()
                    for j, (p, a) in enumerate(chunk):
                        exact += bool((pred[j, len(p) - 1:len(p) + len(a) - 1] == torch.tensor(a)).all())
                out[f"{task}@{length}"] = round(exact / per_length, 4)
    model.train()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--layout", choices=sorted(LAYOUTS), default="hybrid")
    p.add_argument("--seed", type=int, default=33)
    p.add_argument("--init", type=Path, help="continue from this Hugging Face folder (an earlier run's)")
    p.add_argument("--minutes", type=float, default=7.0, help="training time budget (evaluation after it)")
    p.add_argument("--max-steps", type=int, default=100000)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--first-weight", type=float, default=1.0,
                   help="weight of the answer's first real token (a code's first digit) in the answer loss")
    p.add_argument("--batch-tokens", type=int, default=131072)
    p.add_argument("--start-len", type=int, default=200)
    p.add_argument("--max-len", type=int, default=5000)
    p.add_argument("--hold", type=float, default=0.15, help="share of the budget spent at --start-len")
    p.add_argument("--ramp", type=float, default=0.6, help="share of the budget by which lengths reach --max-len")
    p.add_argument("--eval-lengths", default="800,1500,3000,4500,6000")
    p.add_argument("--eval-n", type=int, default=32)
    p.add_argument("--attention-window", type=int, default=0,
                   help="train with each attention layer seeing only this many positions (0: all); evaluated both ways")
    p.add_argument("--decay-init", choices=("transformers", "long"), default="transformers",
                   help="the gated delta-nets' forgetting rates at the start (long: 1e-4 to 1e-1 a token)")
    p.add_argument("--bare-share", type=float, default=0.0,
                   help="share of batches whose examples are the code sentence, filler and the question alone")
    p.add_argument("--grow-below", type=float, default=0.0,
                   help="lengths grow only while the answer loss (moving mean) is below this (0: on the clock)")
    p.add_argument("--grow-steps", type=int, default=400, help="with --grow-below: steps from --start-len to --max-len")
    args = p.parse_args()

    import torch
    import transformers
    from transformers import AutoTokenizer

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tok = AutoTokenizer.from_pretrained(str(args.tokenizer))
    ex = Examples(tok, args.seed)
    if args.init:        # go on from a folder an earlier run wrote (its layout)
        from transformers import Qwen3NextForCausalLM

        torch.manual_seed(args.seed)
        model = Qwen3NextForCausalLM.from_pretrained(str(args.init), dtype=torch.float32).to(device)
    else:
        model = build_model(len(tok), args.layout, args.seed)
        if args.decay_init == "long":
            long_memory(model)
        model = model.to(device)
    params = sum(q.numel() for q in model.parameters())
    say(f"{args.layout}: {params / 1e6:.2f} M parameters on {device}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}; {ex.per_sentence:.1f} tokens per filler sentence")
    # no weight decay on the forgetting rates (it would pull dt_bias to 0, a rate of 0.69 a token) or norms
    keep = [q for n, q in model.named_parameters() if n.endswith(("A_log", "dt_bias")) or "norm" in n]
    rest = [q for n, q in model.named_parameters() if not (n.endswith(("A_log", "dt_bias")) or "norm" in n)]
    opt = torch.optim.AdamW([{"params": rest}, {"params": keep, "weight_decay": 0.0}], lr=args.lr,
                            betas=(0.9, 0.95), weight_decay=0.01)
    budget_s = args.minutes * 60
    t0 = time.monotonic()
    step, log, level, mean_answer = 0, [], 0.0, None
    while step < args.max_steps:
        elapsed = time.monotonic() - t0
        if elapsed > budget_s:
            break
        # short memos first (the copy is learned there, as in the measured recipe), then growing
        frac = max(0.0, min(1.0, (elapsed / budget_s - args.hold) / max(1e-6, args.ramp - args.hold)))
        if args.grow_below:      # a curriculum that waits for the copy: longer memos only once short ones work
            if mean_answer is not None and mean_answer < args.grow_below:
                level = min(1.0, level + 1.0 / args.grow_steps)
            frac = level
        top = int(args.start_len + (args.max_len - args.start_len) * frac)
        floor = min(32, args.start_len)        # --start-len below 32: the bare copy over a few tokens
        length = ex.rng.randint(max(floor, top // 4), max(floor + 1, top))
        lr = args.lr * min(1.0, (step + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, elapsed / budget_s))))
        for group in opt.param_groups:
            group["lr"] = lr
        # a whole batch bare or none (bare rows padded to an agent prompt's width would waste the batch)
        bare = ex.rng.random() < args.bare_share
        ids, kind = batch_of(ex, length, args.batch_tokens, device, 1.0 if bare else 0.0)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss, answer_loss, text_loss = loss_of(model, ids, kind, args.first_weight, args.attention_window)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        a = float(answer_loss.detach())
        if bare or not args.bare_share:      # with bare batches, the curriculum waits on the bare copy
            mean_answer = a if mean_answer is None else 0.9 * mean_answer + 0.1 * a
        if step % 25 == 0 or step == 1:
            entry = {"step": step, "s": round(elapsed, 1), "len": length, "rows": ids.shape[0],
                     "loss": round(float(loss.detach()), 4),
                     "answer": round(float(answer_loss.detach()), 4), "text": round(float(text_loss.detach()), 4),
                     "lr": round(lr, 6), "level": round(frac, 3), "bare": bare,
                     "mean": round(mean_answer, 4) if mean_answer is not None else None}
            log.append(entry)
            say(json.dumps(entry))
    train_s = time.monotonic() - t0
    lengths = [int(x) for x in args.eval_lengths.split(",") if x]
    scores = evaluate(model, ex, device, lengths, args.eval_n,
                      tasks=("recall", "recall_suffix", "conversation", "agent")
                      + (("bare",) if args.bare_share else ()))
    say(f"exact recall: {json.dumps(scores)}")
    if args.attention_window:       # what the training saw: the code carried by the state alone
        windowed = evaluate(model, ex, device, lengths, args.eval_n, tasks=("recall", "conversation"),
                            window=args.attention_window)
        say(f"exact recall, attention windowed to {args.attention_window}: {json.dumps(windowed)}")

    args.out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(str(args.out), safe_serialization=True)
    tok.save_pretrained(str(args.out))
    cfg_path = args.out / "config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    cfg.update({"layer_types": LAYOUTS[args.layout], "full_attention_interval": INTERVAL[args.layout]})
    cfg_path.write_text(json.dumps(cfg, indent=2), encoding="utf-8")
    result = {"layout": args.layout, "parameters": params, "steps": step, "train_seconds": round(train_s, 1),
              "seed": args.seed, "lr": args.lr, "first_weight": args.first_weight, "init": str(args.init) if args.init else None, "batch_tokens": args.batch_tokens, "max_len": args.max_len,
              "torch": torch.__version__, "transformers": transformers.__version__, "device": str(device),
              "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
              "exact_recall": scores, "command": " ".join(sys.argv), "attention_window": args.attention_window,
              "decay_init": args.decay_init}
    if args.attention_window:
        result["exact_recall_windowed"] = windowed
    (args.out / "train.log").write_text("\n".join(json.dumps(e) for e in log) + "\n", encoding="utf-8")
    (args.out / "result.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
    print("train-result: " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
