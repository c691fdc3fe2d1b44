"""Measure the LoRA adapters and the drafter on a running embedded server (the numbers in
NOTES-lora-drafter.md come from here; tests/real/test_real_lora.py and test_real_drafter.py use the
same helpers).

    python -m tui.embedded.measure_lora_drafter lora URL --engine vllm|llamacpp [--memo-tokens 1000]
    python -m tui.embedded.measure_lora_drafter drafter URL
    python -m tui.embedded.measure_lora_drafter ramcache URL      (llama.cpp with --parallel 1)
    python -m tui.embedded.measure_lora_drafter mix URL --engine vllm|llamacpp   (base and adapters batched)

Prints one JSON object. Plain, non-streamed /v1/completions requests, greedy, top-5 log-probabilities.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import httpx

from . import lora

SHORT_PROMPT = "The history of the city of Lyon begins"
CODES = ("7395-2841-6620", "4817-3906-5142", "2658-9174-3380")


@dataclass
class Answer:
    text: str
    tokens: list[str]
    top5: list[dict[str, float]]  # per generated position: token -> logprob
    prompt_tokens: int
    cached: int | None  # usage.prompt_tokens_details.cached_tokens, else timings.cache_n
    timings: dict = field(default_factory=dict)  # llama.cpp only: cache_n, prompt_n, draft_n, draft_n_accepted

    def brief(self) -> dict:
        out = {"text": self.text, "prompt_tokens": self.prompt_tokens, "cached": self.cached}
        for key in ("draft_n", "draft_n_accepted"):
            if key in self.timings:
                out[key] = self.timings[key]
        return out


def complete(url: str, engine: str, prompt: str, *, adapter: str | None = None, lora_on: bool = False,
             max_tokens: int = 12, cache: bool = True, body_extra: dict | None = None,
             timeout: float = 900.0) -> Answer:
    """One greedy completion; `lora_on` adds the adapter-choosing fields (lora.request_fields)."""
    body = {"model": lora.MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "logprobs": 5, "stream": False}
    if lora_on:
        body.update(lora.request_fields(engine, adapter))
    if not cache:
        body["cache_prompt" if engine == "llamacpp" else "cache_salt"] = False if engine == "llamacpp" \
            else f"cold-{time.monotonic_ns()}"
    body.update(body_extra or {})
    r = httpx.post(url.rstrip("/") + "/v1/completions", json=body, timeout=timeout)
    if r.status_code != 200:
        raise RuntimeError(f"HTTP {r.status_code}: {r.text[:300]}")
    data = r.json()
    choice = data["choices"][0]
    usage = data.get("usage") or {}
    timings = data.get("timings") or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached is None:
        cached = timings.get("cache_n")
    tokens, top5 = _logprobs(choice.get("logprobs") or {})
    return Answer(choice.get("text", ""), tokens, top5, usage.get("prompt_tokens", 0), cached, timings)


def _logprobs(lp: dict) -> tuple[list[str], list[dict[str, float]]]:
    if isinstance(lp.get("content"), list):  # llama.cpp
        tokens = [e.get("token", "") for e in lp["content"]]
        top5 = [{alt.get("token", str(alt.get("id"))): alt["logprob"] for alt in e.get("top_logprobs") or []}
                for e in lp["content"]]
        return tokens, top5
    return list(lp.get("tokens") or []), [dict(d or {}) for d in lp.get("top_logprobs") or []]


def tokens_differ(a: Answer, b: Answer) -> int:
    n = max(len(a.tokens), len(b.tokens))
    return sum(1 for i in range(n) if (a.tokens[i:i + 1] or [None]) != (b.tokens[i:i + 1] or [None]))


def max_logprob_diff(a: Answer, b: Answer) -> float:
    """Largest |logprob| difference over the tokens both top-5 lists hold, at the positions
    before (and at) the first differing token, where both answers saw the same context."""
    worst = 0.0
    for i, (ta, tb) in enumerate(zip(a.top5, b.top5)):
        for token in set(ta) & set(tb):
            worst = max(worst, abs(ta[token] - tb[token]))
        if a.tokens[i:i + 1] != b.tokens[i:i + 1]:
            break
    return round(worst, 4)


def first_top5_diff(a: Answer, b: Answer) -> float | None:
    """At the first position: the largest difference over shared top-5 tokens (None if no overlap)."""
    if not a.top5 or not b.top5:
        return None
    shared = set(a.top5[0]) & set(b.top5[0])
    return round(max(abs(a.top5[0][t] - b.top5[0][t]) for t in shared), 4) if shared else None


async def memo_prompts(tokens: int, url: str | None = None, count: int = 2) -> list[tuple[str, str]]:
    """(recall prompt, code) for `count` memos of about `tokens` tokens (hitproof's own memos)."""
    from ..core.evidence.text import recall_suffix
    from ..core.evidence.memos import build_memo
    from ..core.evidence.tokens import TokenCounter

    counter = TokenCounter(_server_counter(url) if url else None)
    out = []
    for i, code in enumerate(CODES[:count]):
        memo = await build_memo(counter, memo_id=f"lora-m{i}", nonce="loraprobe", code=code,
                                target_tokens=tokens, grid=128, code_position=0.5, seed=7)
        out.append((memo.text + recall_suffix(), code))
    return out


def _server_counter(url: str):
    async def count(text: str) -> int | None:
        async with httpx.AsyncClient(timeout=60) as client:
            # llama.cpp answers the vLLM schema with an empty token list: its own schema first
            for body in ({"content": text, "add_special": True}, {"model": lora.MODEL, "prompt": text}):
                r = await client.post(url.rstrip("/") + "/tokenize", json=body)
                if r.status_code == 200:
                    data = r.json()
                    if isinstance(data.get("count"), int) and data["count"] > 0:
                        return data["count"]
                    if isinstance(data.get("tokens"), list) and data["tokens"]:
                        return len(data["tokens"])
        return None
    return count


# --- LoRA -------------------------------------------------------------------------------------

def measure_lora(url: str, engine: str, memo_tokens: int = 1000) -> dict:
    """Distinct outputs per adapter, same-adapter repeats, cross-adapter reuse, orders, concurrency."""
    memos = asyncio.run(memo_prompts(memo_tokens, url))
    names = [None, *lora.SEEDS]
    label = lambda n: n or "base"  # noqa: E731
    out: dict = {"engine": engine, "prompts": {}}
    prompts = {"short": (SHORT_PROMPT, None), **{f"memo{i}": m for i, m in enumerate(memos)}}
    for pname, (prompt, code) in prompts.items():
        max_tokens = 12 if code is None else 20
        cold = {n: complete(url, engine, prompt, adapter=n, lora_on=True, max_tokens=max_tokens, cache=False)
                for n in names}
        entry = {label(n): {**cold[n].brief(), "recalled": None if code is None else code in cold[n].text}
                 for n in names}
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                entry[f"{label(a)}_vs_{label(b)}"] = {
                    "tokens_differ": tokens_differ(cold[a], cold[b]),
                    "max_logprob_diff": max_logprob_diff(cold[a], cold[b]),
                    "first_top5_diff": first_top5_diff(cold[a], cold[b])}
        out["prompts"][pname] = entry
    # Orders on the first memo: each request sees the previous one's cache.
    prompt, code = memos[0]
    cold = {n: complete(url, engine, prompt, adapter=n, lora_on=True, max_tokens=20, cache=False) for n in names}
    orders = {}
    for order in (["a", "a", "b", "b", None, None], ["b", "a", None, "a", "b"], [None, "b", "a", "b", None]):
        # a new suffix per order so that nothing is left from the previous order
        rows = []
        suffix = f"\n(order {len(orders) + 1})"
        p = prompt.replace("\n\nQuestion:", suffix + "\n\nQuestion:")
        ref = {n: complete(url, engine, p, adapter=n, lora_on=True, max_tokens=20, cache=False) for n in names}
        for n in order:
            ans = complete(url, engine, p, adapter=n, lora_on=True, max_tokens=20)
            rows.append({"adapter": label(n), "cached": ans.cached, "prompt_tokens": ans.prompt_tokens,
                         "same_text_as_cold": ans.text == ref[n].text,
                         "max_logprob_diff_vs_cold": max_logprob_diff(ans, ref[n]),
                         "recalled": code in ans.text})
        orders[" ".join(label(n) for n in order)] = rows
    out["orders"] = orders
    # Concurrently: a, b and base on one prompt at once, twice (the second round can hit).
    p = prompt.replace("\n\nQuestion:", "\n(concurrent)\n\nQuestion:")
    ref = {n: complete(url, engine, p, adapter=n, lora_on=True, max_tokens=20, cache=False) for n in names}
    rounds = []
    with ThreadPoolExecutor(len(names) * 2) as pool:
        for _ in range(2):
            futures = [(n, k, pool.submit(complete, url, engine, p, adapter=n, lora_on=True, max_tokens=20))
                       for n in names for k in (1, 2)]
            rounds.append({f"{label(n)}#{k}": {"cached": f.result().cached,
                                               "same_text_as_cold": f.result().text == ref[n].text}
                           for n, k, f in futures})
    out["concurrent"] = rounds
    if engine == "llamacpp":
        out["no_lora_field_after_adapter"] = llamacpp_default_after_adapter(url, prompt)
    return out


def llamacpp_default_after_adapter(url: str, prompt: str) -> dict:
    """A request under adapter a, then the same prompt *without* a `lora` field (the server's
    default set: every adapter at scale 0 here, i.e. the base model)."""
    p = prompt.replace("\n\nQuestion:", "\n(default after a)\n\nQuestion:")
    base_cold = complete(url, "llamacpp", p, adapter=None, lora_on=True, max_tokens=20, cache=False)
    a_cold = complete(url, "llamacpp", p, adapter="a", lora_on=True, max_tokens=20, cache=False)
    a_warm = complete(url, "llamacpp", p, adapter="a", lora_on=True, max_tokens=20)
    default = complete(url, "llamacpp", p, lora_on=False, max_tokens=20)
    explicit_base = complete(url, "llamacpp", p, adapter=None, lora_on=True, max_tokens=20)
    return {
        "a_then_a": {"cached": a_warm.cached},
        "then_no_field": {"cached": default.cached, "same_text_as_base_cold": default.text == base_cold.text,
                          "same_text_as_a_cold": default.text == a_cold.text,
                          "max_logprob_diff_vs_base_cold": max_logprob_diff(default, base_cold),
                          "max_logprob_diff_vs_a_cold": max_logprob_diff(default, a_cold)},
        "then_explicit_base": {"cached": explicit_base.cached,
                               "same_text_as_base_cold": explicit_base.text == base_cold.text},
        "texts": {"base_cold": base_cold.text, "a_cold": a_cold.text, "no_field": default.text},
    }


def llamacpp_ram_cache_across_adapters(url: str, prompt: str, other: str) -> dict:
    """One slot (--parallel 1): prompt under a; another prompt under b (the slot's prompt goes to
    the RAM prompt cache, the slot now holds b); the first prompt under b. The RAM cache entry was
    computed under a; the slot's adapter set is already b, so nothing clears it."""
    p = prompt.replace("\n\nQuestion:", "\n(ram cache)\n\nQuestion:")
    b_cold = complete(url, "llamacpp", p, adapter="b", lora_on=True, max_tokens=20, cache=False)
    a_cold = complete(url, "llamacpp", p, adapter="a", lora_on=True, max_tokens=20, cache=False)
    first = complete(url, "llamacpp", p, adapter="a", lora_on=True, max_tokens=20)
    middle = complete(url, "llamacpp", other, adapter="b", lora_on=True, max_tokens=4)
    last = complete(url, "llamacpp", p, adapter="b", lora_on=True, max_tokens=20)
    return {"a_first": {"cached": first.cached}, "b_other_prompt": {"cached": middle.cached},
            "b_same_prompt": {"cached": last.cached, "prompt_tokens": last.prompt_tokens,
                              "same_text_as_b_cold": last.text == b_cold.text,
                              "same_text_as_a_cold": last.text == a_cold.text,
                              "max_logprob_diff_vs_b_cold": max_logprob_diff(last, b_cold)},
            "texts": {"a_cold": a_cold.text, "b_cold": b_cold.text, "b_after_ram_restore": last.text}}


def concurrent_mix(url: str, engine: str, prompt: str) -> dict:
    """Cold (never cached) requests sent together in mixed groups of base and adapters: which
    cold single-request answer does each one reproduce? (0.0 log-probability difference = that one.)"""
    p = prompt.replace("\n\nQuestion:", "\n(mix)\n\nQuestion:")
    names = [None, *lora.SEEDS]
    label = lambda n: n or "base"  # noqa: E731
    cold = {n: complete(url, engine, p, adapter=n, lora_on=True, max_tokens=20, cache=False) for n in names}
    out = {}
    for group in ([None, None], [None, "a"], [None, "a", "b"], ["a", "b"]):
        with ThreadPoolExecutor(len(group)) as pool:
            futures = [(n, pool.submit(complete, url, engine, p, adapter=n, lora_on=True, max_tokens=20, cache=False))
                       for n in group]
            rows = []
            for n, f in futures:
                ans = f.result()
                rows.append({"adapter": label(n), "text": ans.text,
                             "max_logprob_diff_vs_cold": {label(m): max_logprob_diff(ans, cold[m]) for m in names}})
        out[" + ".join(label(n) for n in group)] = rows
    return out


# --- drafter ----------------------------------------------------------------------------------

def spec_counters(url: str) -> dict[str, float]:
    text = httpx.get(url.rstrip("/") + "/metrics", timeout=30).text
    out = {}
    for line in text.splitlines():
        if line.startswith(("llamacpp:spec_decode", "vllm:spec_decode")) and " " in line \
                and "_created" not in line.split("{")[0]:  # _created: a timestamp, not a count
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def measure_drafter(url: str, engine: str = "llamacpp", max_tokens: int = 64) -> dict:
    memos = asyncio.run(memo_prompts(600, url, count=1))
    prompts = {
        "lyon": SHORT_PROMPT,
        "count": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,",
        "recall": memos[0][0],
        "repeat": "The cat sat on the mat. The cat sat on the mat. The cat sat on the mat.",
    }
    before = spec_counters(url)
    rows = {}
    for name, prompt in prompts.items():
        start = spec_counters(url)
        ans = complete(url, engine, prompt, max_tokens=max_tokens, cache=False)
        drafted, accepted = ans.timings.get("draft_n"), ans.timings.get("draft_n_accepted")
        if drafted is None:  # vLLM: no per-request counts; the counters' movement for this request alone
            end = spec_counters(url)
            moved = {k.split("{")[0]: end[k] - start.get(k, 0.0) for k in end}
            drafted = int(moved.get("vllm:spec_decode_num_draft_tokens_total", 0))
            accepted = int(moved.get("vllm:spec_decode_num_accepted_tokens_total", 0))
        rows[name] = {"generated": len(ans.tokens), "draft_n": drafted, "draft_n_accepted": accepted,
                      "acceptance": round(accepted / drafted, 3) if drafted else None,
                      "predicted_per_second": round(ans.timings.get("predicted_per_second", 0.0), 1),
                      "text": ans.text[:80]}
    after = spec_counters(url)
    return {"prompts": rows, "metrics_delta": {k: after[k] - before.get(k, 0.0) for k in after}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["lora", "drafter", "ramcache", "mix"])
    parser.add_argument("url")
    parser.add_argument("--engine", choices=["vllm", "llamacpp"], default="llamacpp")
    parser.add_argument("--memo-tokens", type=int, default=1000)
    args = parser.parse_args(argv)
    try:
        if args.what == "lora":
            result = measure_lora(args.url, args.engine, args.memo_tokens)
        elif args.what == "drafter":
            result = measure_drafter(args.url, args.engine)
        elif args.what == "mix":
            memo = asyncio.run(memo_prompts(args.memo_tokens, args.url, count=1))[0][0]
            result = concurrent_mix(args.url, args.engine, memo)
        else:
            memos = asyncio.run(memo_prompts(args.memo_tokens, args.url, count=2))
            result = llamacpp_ram_cache_across_adapters(args.url, memos[0][0], memos[1][0])
    except (httpx.HTTPError, RuntimeError) as exc:
        print(f"measure: error: {exc}", file=sys.stderr)
        return 3
    print(json.dumps(result, indent=1, default=lambda o: asdict(o)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
