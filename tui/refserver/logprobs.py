"""Log-probabilities that are a pure function of the state, like a fingerprint.

Position *i* of an answer gets numbers derived from ``H(state digest, i)``: a correct
hit reproduces the cold request's values exactly, a restore of another state lands on
different ones.  The generated piece is always the top-1 (decoding is greedy).  The alternatives
at a position are the same words whatever the state (they depend on the piece and the position),
their values are the state's: two states that write the same text (two adapters recalling the same
code) still differ by up to a few nats, as real models do.  A kernel RNG (``wording_drift``)
nudges each value by up to 0.002.
"""

from __future__ import annotations

import hashlib
import random

from .model import VOCAB

Entry = tuple[str, float, list[tuple[str, float]]]  # piece, logprob, top alternatives


def compute(digest: bytes, pieces: list[str], k: int, jitter: random.Random | None,
            resume_cost: float = 0.0, writer_cost: float = 0.0, shift: float = 0.0,
            wide_cost: float = 0.0) -> list[Entry]:
    """`resume_cost`: a hit's values move by up to that many nats, the same for every hit of the state;
    `writer_cost`: up to that many more (a state written by a chunked prefill); `shift`: exactly that many
    (the early_change fault)."""
    entries: list[Entry] = []
    for i, piece in enumerate(pieces):
        rng = random.Random(hashlib.blake2b(digest + i.to_bytes(4, "big"), digest_size=8).digest())
        chosen = -rng.random() * 0.3 - shift
        if resume_cost:
            chosen -= random.Random(hashlib.blake2b(b"resume" + digest + i.to_bytes(4, "big"),
                                                    digest_size=8).digest()).random() * resume_cost
        if writer_cost:
            chosen -= random.Random(hashlib.blake2b(b"writer" + digest + i.to_bytes(4, "big"),
                                                    digest_size=8).digest()).random() * writer_cost
        if wide_cost:
            chosen -= random.Random(hashlib.blake2b(b"wide" + digest + i.to_bytes(4, "big"),
                                                    digest_size=8).digest()).random() * wide_cost
        if jitter is not None:
            chosen -= jitter.random() * 0.002
        top = [(piece, round(chosen, 6))]
        value = chosen
        words = random.Random(hashlib.blake2b(f"{i}:{piece}".encode(), digest_size=8).digest()).sample(VOCAB, k + 1)
        for word in words:
            if len(top) >= max(k, 1):
                break
            if " " + word != piece:
                value -= 0.5 + rng.random()
                top.append((" " + word, round(value, 6)))
        entries.append((piece, round(chosen, 6), top))
    return entries


def completion_format(entries: list[Entry], offset: int) -> dict:
    offsets, pos = [], offset
    for piece, _, _ in entries:
        offsets.append(pos)
        pos += len(piece)
    return {"text_offset": offsets,
            "token_logprobs": [lp for _, lp, _ in entries],
            "tokens": [p for p, _, _ in entries],
            "top_logprobs": [dict(top) for _, _, top in entries]}


def chat_format(entries: list[Entry]) -> dict:
    def item(token: str, lp: float) -> dict:
        return {"token": token, "logprob": lp, "bytes": list(token.encode("utf-8"))}
    return {"content": [{**item(p, lp), "top_logprobs": [item(t, v) for t, v in top]}
                        for p, lp, top in entries]}
