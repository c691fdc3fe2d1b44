"""Faults, injected where a cache hit's state is restored (never in the output text).

Each fault reproduces a symptom from the field reports (../../shared/seeds/ in the
project notes; see README.md for the table):

``none``           correct restore.
``zero_state``     a hit restores zeros for the cached blocks: "a restored state of
                   exactly zero ... a model that has forgotten what was in the first
                   1,600 tokens while sounding entirely confident".  Recall answers come
                   back fluent and without the code.
``foreign_state``  on a hit, with probability 0.5 (seeded RNG), the restore returns the
                   stored blocks of one of the 4 most recently stored other sequences
                   (different tokens, another request), up to that sequence's trailing
                   question (this request keeps its own): "a request served from a state
                   that belonged to another request".  Another memo's code comes back.
                   No other sequence: correct restore.
``repeat_token``   from the 3rd hit of the server's life on, the restored state is one
                   token at every position; reading it, the model emits that token until
                   max_tokens: "one repeated token instead of coherent text".
``empty_turn``     a hit on a multi-turn prompt (``User:`` at least twice) restores a
                   state whose last slot is end-of-sequence: the answer is empty,
                   finish_reason "stop": "a conversation would come back empty on turn two".
``wording_drift``  no cache fault: prompts longer than ``drift_min_tokens`` (cold or hit
                   alike) get a kernel RNG that swaps a word or two after character ~60
                   and, on about 1 summary in 15, answers with the memo's own code:
                   "sparse attention top-k ... varies from launch to launch on any prompt
                   long enough to engage it, with or without a cache" and "stream 3
                   answered the wrong question".  The RNG is seeded once per server by
                   ``--seed``, so requests differ from each other but a run is replayable.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .cache import BlockState, PrefixCache
from .tokenizer import EOS, ZERO, Token, is_word, token_for

FAULTS = ("none", "zero_state", "foreign_state", "repeat_token", "empty_turn", "wording_drift")


@dataclass
class Restore:
    """What the cache matched for one hit, and where it is going."""

    blocks: list[BlockState]
    prompt: list[Token]
    request_id: str
    hit_number: int  # 1-based count of hits in the server's life, this one included
    cache: PrefixCache

    @property
    def cached_tokens(self) -> int:
        return sum(len(b.tokens) for b in self.blocks)

    def correct(self) -> list[Token]:
        return [t for b in self.blocks for t in b.tokens]


class Fault:
    name = "none"

    def restore(self, r: Restore) -> list[Token]:
        return r.correct()

    def jitter(self, prompt_len: int) -> random.Random | None:
        return None


class ZeroState(Fault):
    name = "zero_state"

    def restore(self, r: Restore) -> list[Token]:
        return [ZERO] * r.cached_tokens


class ForeignState(Fault):
    name = "foreign_state"

    def __init__(self, seed: int, rate: float = 0.5, recent: int = 4) -> None:
        self.rng = random.Random(f"foreign:{seed}")
        self.rate = rate
        self.recent = recent  # choose among the newest few other sequences

    def restore(self, r: Restore) -> list[Token]:
        if self.rng.random() >= self.rate:
            return r.correct()
        k = len(r.blocks)
        good = r.correct()
        own = [t.id for t in good]
        candidates: list[list[Token]] = []
        for request_id, chain in reversed(list(r.cache.sequences())):
            if len(candidates) == self.recent:
                break
            if request_id == r.request_id or len(chain) < k:
                continue
            states = [r.cache.peek(h) for h in chain[:k]]
            if any(s is None for s in states):
                continue
            tokens = [t for s in states for t in s.tokens]
            if [t.id for t in tokens] != own:
                candidates.append(tokens)
        if not candidates:
            return good
        tokens = self.rng.choice(candidates)
        cut = min(_question_start(tokens), _question_start(good))
        return tokens[:cut] + good[cut:]


def _question_start(tokens: list[Token]) -> int:
    """Where a trailing question (``Question:``/``User:`` in the second half) begins.

    On a real align-mode server the question sits past the last checkpoint and is never
    restored; on this fine block grid it can be, so the foreign restore stops at the first
    of the two questions (the other request's, this request's own) and keeps this
    request's tokens from there on: another request's memo, this request's question.
    """
    for i in range(len(tokens) - 2, len(tokens) // 2, -1):
        if tokens[i].text in ("Question", "User") and tokens[i + 1].text == ":":
            return i
    return len(tokens)


class RepeatToken(Fault):
    name = "repeat_token"

    def __init__(self, from_hit: int = 3) -> None:
        self.from_hit = from_hit

    def restore(self, r: Restore) -> list[Token]:
        good = r.correct()
        if r.hit_number < self.from_hit:
            return good
        word = next((t for t in good if is_word(t)), token_for("the"))
        return [word] * len(good)


class EmptyTurn(Fault):
    name = "empty_turn"

    def restore(self, r: Restore) -> list[Token]:
        good = r.correct()
        if "".join(t.text for t in r.prompt).count("User:") < 2:
            return good
        return good[:-1] + [EOS]


class WordingDrift(Fault):
    name = "wording_drift"

    def __init__(self, seed: int, min_tokens: int = 1000) -> None:
        self.rng = random.Random(f"drift:{seed}")
        self.min_tokens = min_tokens

    def jitter(self, prompt_len: int) -> random.Random | None:
        return self.rng if prompt_len > self.min_tokens else None


def make_fault(name: str, seed: int = 0, drift_min_tokens: int = 1000) -> Fault:
    if name == "none":
        return Fault()
    if name == "zero_state":
        return ZeroState()
    if name == "foreign_state":
        return ForeignState(seed)
    if name == "repeat_token":
        return RepeatToken()
    if name == "empty_turn":
        return EmptyTurn()
    if name == "wording_drift":
        return WordingDrift(seed, drift_min_tokens)
    raise ValueError(f"unknown fault {name!r}; choose from {', '.join(FAULTS)}")
