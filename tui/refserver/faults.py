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
``mixed_state``    on a hit, with probability 0.5, one four-digit group of the memo's code is
                   restored from another stored sequence's code: a state mixed from two requests.
``salt_ignored``   the block hash leaves out ``cache_salt``: a request under another salt (a
                   control, another tenant) reuses the blocks of the same tokens: "cache_salt
                   dropped by a connector".
``adapter_ignored`` the block hash leaves out the LoRA adapter: the same tokens under another
                   adapter (or the base model) resume from blocks another adapter computed:
                   "silently contaminated by the previous adapter".
``evict_stale``    a block that was evicted and is stored again (re-admitted) restores, on a
                   later hit, the stale state of another memo evicted before it, at the same
                   position: "garbled output only under load", "serving another request's KV".
``partial_concurrent`` only a short partial-prefix hit (at most half its prompt reused) admitted while
                   another request is served restores another sequence's blocks: what fixed scripts
                   (whole repeats, one shared memo) never exercise, and the mix phase does.
``early_change``   every hit (never a cold one): the first word among output tokens 2..8 becomes one the cold
                   path never lists in its top-k, every log-probability 0.4 nats lower: a restore wrong the
                   same way on every hit, a hit's twin included (issue 32).
``slow_hits``, ``unaligned_report``, ``counter_drift``: the restore is right, the bookkeeping
                   is not: a hit that saves no prefill time; cached tokens reported one short of
                   whole blocks; a /metrics counter that adds each hit twice.
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

FAULTS = ("none", "zero_state", "foreign_state", "repeat_token", "empty_turn", "wording_drift",
          "mixed_state", "slow_hits", "unaligned_report", "counter_drift", "partial_concurrent", "salt_ignored",
          "adapter_ignored", "evict_stale", "early_change",
          "slot_noop", "slot_trust")   # the slot faults act on /slots restores (tui/refserver/slots.py)


@dataclass
class Restore:
    """What the cache matched for one hit, and where it is going."""

    blocks: list[BlockState]
    prompt: list[Token]
    request_id: str
    hit_number: int  # 1-based count of hits in the server's life, this one included
    cache: PrefixCache
    hashes: tuple[bytes, ...] = ()   # the hashes of `blocks`
    running: int = 0  # other requests being served when this one was admitted

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

    # What the server says about a hit, apart from the restore itself (the bookkeeping faults).
    def reported(self, cached: int) -> int:
        """Cached tokens the response reports."""
        return cached

    def counted(self, cached: int) -> int:
        """Cached tokens the /metrics counter adds."""
        return cached

    def prefill_tokens(self, prompt_tokens: int, cached: int) -> int:
        """Tokens the prefill is timed for."""
        return prompt_tokens - cached

    def key(self, salt: str, adapter: str) -> tuple[str, str]:
        """What the block hash is keyed on besides the tokens."""
        return salt, adapter

    # What a hit's answer comes out as, apart from the state (early_change).
    def answer(self, pieces: list[str], cached: int) -> list[str]:
        return pieces

    def shift(self, cached: int) -> float:
        """Nats every log-probability of the answer moves down by."""
        return 0.0


EARLY_WORDS = (" meanwhile", " harbor", " violet", " granite")   # not in the model's VOCAB: never an alternative
EARLY_SHIFT = 0.4


class EarlyChange(Fault):
    """Every hit: the first word among output tokens 2..8 replaced, every log-probability 0.4 nats lower."""
    name = "early_change"

    def answer(self, pieces: list[str], cached: int) -> list[str]:
        if not cached:
            return pieces
        for i in range(2, min(len(pieces), 9)):
            if pieces[i].strip().isalpha():
                word = next(w for w in EARLY_WORDS if w.strip() != pieces[i].strip())
                return pieces[:i] + [word] + pieces[i + 1:]
        return pieces

    def shift(self, cached: int) -> float:
        return EARLY_SHIFT if cached else 0.0


class SaltIgnored(Fault):
    name = "salt_ignored"

    def key(self, salt: str, adapter: str) -> tuple[str, str]:
        return "", adapter


class AdapterIgnored(Fault):
    name = "adapter_ignored"

    def key(self, salt: str, adapter: str) -> tuple[str, str]:
        return salt, ""


class EvictStale(Fault):
    """A re-admitted block (evicted once, stored again) restores, on a hit, the stale state another
    writer's evicted block left at the same position: the newest such writer whose tokens differ,
    up to the first trailing question (this request keeps its own question)."""
    name = "evict_stale"

    def restore(self, r: Restore) -> list[Token]:
        good = r.correct()
        stale = [i for i, h in enumerate(r.hashes) if h in r.cache.readmitted]
        if not stale:
            return good
        writers = {b.request_id for b in r.blocks}
        best: list[BlockState] | None = None
        best_cover = 0
        for writer, by_index in reversed(list(r.cache.evicted_states.items())):   # newest first
            cover = sum(i in by_index for i in stale)
            if writer in writers or cover <= best_cover:
                continue
            blocks = [by_index[i] if i in stale and i in by_index else b for i, b in enumerate(r.blocks)]
            if [t.id for b in blocks for t in b.tokens] != [t.id for t in good]:
                best, best_cover = blocks, cover
        if best is None:
            return good
        tokens = [t for b in best for t in b.tokens]
        cut = min(_question_start(tokens), _question_start(good))
        return tokens[:cut] + good[cut:]


class PartialConcurrent(Fault):
    """Only a short partial-prefix hit (at most half the prompt reused) admitted while another request
    is being served goes wrong: its cached part is restored from another stored sequence (different
    tokens), as a block table read from the wrong row would. Full hits, long partial hits and hits
    alone are right, so scripted phases (whole repeats, one memo shared by every stream) never see it."""
    name = "partial_concurrent"

    def restore(self, r: Restore) -> list[Token]:
        good = r.correct()
        if r.running < 1 or 2 * r.cached_tokens > len(r.prompt):
            return good
        k = len(r.blocks)
        own = [t.id for t in good]
        for request_id, chain in reversed(list(r.cache.sequences())):
            if request_id == r.request_id or len(chain) < k:
                continue
            states = [r.cache.peek(h) for h in chain[:k]]
            if any(st is None for st in states):
                continue
            tokens = [t for st in states for t in st.tokens]
            if [t.id for t in tokens] != own:
                return tokens
        return good


class MixedState(Fault):
    """On a hit, with probability 0.5 (seeded), the restored state is this request's own except one
    four-digit group of its code, which comes from another stored sequence's code: a restore that
    mixed two requests' blocks. The answer then carries one group of a foreign code."""
    name = "mixed_state"

    def __init__(self, seed: int, rate: float = 0.5) -> None:
        self.rng = random.Random(f"mixed:{seed}")
        self.rate = rate

    def restore(self, r: Restore) -> list[Token]:
        good = r.correct()
        if self.rng.random() >= self.rate:
            return good
        mine = _code_at(good)
        if mine is None:
            return good
        for request_id, chain in reversed(list(r.cache.sequences())):
            if request_id == r.request_id:
                continue
            states = [r.cache.peek(h) for h in chain]
            tokens = [t for st in states if st is not None for t in st.tokens]
            theirs = _code_at(tokens)
            if theirs is not None and tokens[theirs + 2].text != good[mine + 2].text:
                mixed = list(good)
                mixed[mine + 2] = tokens[theirs + 2]        # the middle group of the other code
                return mixed
        return good


def _code_at(tokens: list[Token]) -> int | None:
    """Index of the first token of the first dddd-dddd-dddd in the tokens."""
    for i in range(len(tokens) - 4):
        window = tokens[i:i + 5]
        if (all(len(t.text) == 4 and t.text.isdigit() for t in window[0::2])
                and all(t.text == "-" for t in window[1::2])):
            return i
    return None


class SlowHits(Fault):
    """A hit is found and restored correctly, but costs more than it saves: the cached blocks are
    read back one by one and the prompt is prefilled in full anyway (a cache that is consulted and
    then ignored), so a hit is slower than a cold request."""
    name = "slow_hits"

    def prefill_tokens(self, prompt_tokens: int, cached: int) -> int:
        return prompt_tokens + cached


class UnalignedReport(Fault):
    """The restore is right, but the report and the counter both say one token less than the
    blocks reused: cached tokens that are not whole blocks (bookkeeping off by one)."""
    name = "unaligned_report"

    def reported(self, cached: int) -> int:
        return cached - 1 if cached else 0

    def counted(self, cached: int) -> int:
        return self.reported(cached)


class CounterDrift(Fault):
    """The restore and the per-request report are right; the /metrics counter adds every hit twice
    (a counter that disagrees with the responses)."""
    name = "counter_drift"

    def counted(self, cached: int) -> int:
        return 2 * cached


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
    if name in ("none", "slot_noop", "slot_trust"):
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
    if name == "mixed_state":
        return MixedState(seed)
    if name == "partial_concurrent":
        return PartialConcurrent()
    if name == "slow_hits":
        return SlowHits()
    if name == "unaligned_report":
        return UnalignedReport()
    if name == "counter_drift":
        return CounterDrift()
    if name == "salt_ignored":
        return SaltIgnored()
    if name == "adapter_ignored":
        return AdapterIgnored()
    if name in ("evict_stale", "early_change"):
        return EvictStale() if name == "evict_stale" else EarlyChange()
    raise ValueError(f"unknown fault {name!r}; choose from {', '.join(FAULTS)}")
