"""Does a served model's recall of a planted code survive its prefix-cache hits? (issue 33), without hitproof.

Each memo (hitproof's own text: sections of filler, one code sentence at a random place, a fresh nonce in its
heading so nothing before it was ever cached) is sent once cold and then REPEATS times as it was, one request
at a time, greedy; each answer is checked for the memo's own code and the server's cached-token count is kept.
On a server whose restore is broken (`HITPROOF_VLLM_FAULT=zero_state` on the embedded vLLM, say) a model whose
copy goes through the recurrent state loses the code on its hits; one whose attention copies it does not.

    .venv/bin/python benchmarks/recall_state.py --url http://127.0.0.1:8000 --lengths 1500,3000,4500 --per-length 4

Prints one line per request and a table by length: own code exact cold / on hits (cached tokens > 0), repeats
that hit nothing and repeats whose cached count the server did not report;
`--json FILE` keeps every request. Plain HTTP to /v1/completions and /tokenize (vLLM, llama.cpp), no cache_salt.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tui.core.evidence.codes import CodeBook, new_nonce  # noqa: E402
from tui.core.evidence.text import MemoText, SentenceSource, code_sentence, recall_suffix  # noqa: E402


def count_tokens(http: httpx.Client, model: str, text: str) -> int:
    r = http.post("/tokenize", json={"model": model, "prompt": text, "content": text})
    r.raise_for_status()
    body = r.json()
    return int(body.get("count") or len(body.get("tokens") or []))


def memo_of(rng: random.Random, codes: CodeBook, sentences: int, index: int) -> tuple[MemoText, str]:
    code = codes.new_code()
    m = MemoText(memo_id=f"m{index:02d}", nonce=new_nonce(), code=code)
    source = SentenceSource(f"{rng.random()}")
    m.sentences = [source.next() for _ in range(sentences)]
    m.code_index = max(1, min(sentences - 1, round(sentences * rng.uniform(0.1, 0.9))))
    m.sentences.insert(m.code_index, code_sentence(code))
    return m, code


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True)
    p.add_argument("--lengths", default="1500,3000,4500", help="memo lengths in the server's tokens")
    p.add_argument("--per-length", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2, help="sends after the cold one")
    p.add_argument("--max-tokens", type=int, default=20)
    p.add_argument("--seed", type=int, default=33)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    rng, codes = random.Random(args.seed), CodeBook(random.Random(args.seed + 1))
    rows = []
    with httpx.Client(base_url=args.url.rstrip("/"), timeout=600) as http:
        try:
            model = http.get("/v1/models").json()["data"][0]["id"]
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
            print(f"recall_state: no model at {args.url}/v1/models ({e})", file=sys.stderr)
            return 3
        sample = " ".join(SentenceSource("calibration").next() for _ in range(40))
        per_sentence = count_tokens(http, model, sample) / 40
        for length in [int(x) for x in args.lengths.split(",") if x]:
            for i in range(args.per_length):
                m, code = memo_of(rng, codes, max(2, round(length / per_sentence)), len(rows))
                prompt = m.render() + recall_suffix()
                for send in range(1 + args.repeats):
                    r = http.post("/v1/completions", json={"model": model, "prompt": prompt, "temperature": 0,
                                                          "max_tokens": args.max_tokens})
                    r.raise_for_status()
                    body = r.json()
                    usage = body.get("usage") or {}
                    details = usage.get("prompt_tokens_details") or {}
                    cached = details.get("cached_tokens")
                    if cached is None:                         # llama.cpp: timings.cache_n
                        cached = (body.get("timings") or {}).get("cache_n")
                    text = body["choices"][0]["text"]
                    row = {"length": length, "memo": i, "send": send, "prompt_tokens": usage.get("prompt_tokens"),
                           "cached": cached, "code": code, "exact": text.strip().startswith(code), "answer": text}
                    rows.append(row)
                    print(f"{length:5d} memo {i} send {send}: cached {'unknown' if cached is None else cached:>7} of "
                          f"{row['prompt_tokens'] if row['prompt_tokens'] is not None else 'unknown'}, "
                          f"{'exact' if row['exact'] else 'WRONG'}: {text.strip()[:40]!r} (code {code})", flush=True)
    # a repeat whose cached count the server did not report is neither a hit nor a miss: its own column
    print("\n| memo tokens | own code exact, cold | own code exact, hits (cached > 0) | repeats that hit nothing "
          "| repeats, cached unknown |")
    print("|---|---|---|---|---|")
    for length in sorted({r["length"] for r in rows}):
        repeats = [r for r in rows if r["length"] == length and r["send"] > 0]
        cold = [r for r in rows if r["length"] == length and r["send"] == 0]
        hits = [r for r in repeats if r["cached"] is not None and r["cached"] > 0]
        missed = [r for r in repeats if r["cached"] == 0]
        unknown = [r for r in repeats if r["cached"] is None]
        print(f"| {length} | {sum(r['exact'] for r in cold)} of {len(cold)} | {sum(r['exact'] for r in hits)} of "
              f"{len(hits)} | {len(missed)} | {len(unknown)} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
