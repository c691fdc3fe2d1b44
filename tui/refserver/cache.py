"""A real block prefix cache: chained block hashes, salt isolation, LRU eviction.

A prompt's token ids are cut into full blocks of ``block_size``.  Block *i*'s hash is
``H(hash of block i-1, salt, ids of block i)``, so a block matches only if everything
before it matches too, and a different ``cache_salt`` never shares a block.  The cache
maps a hash to the *state* stored for that block: the tokens as the model saw them when
the block was written, and which request wrote it.

A LoRA adapter is part of the key the same way (vLLM hashes the adapter's name into every block),
and each stored block records the adapter that computed it.  Evicted blocks are remembered (a
bounded history) so that a fault can restore a re-admitted block from another memo's stale state.

Lookup walks from the first block and stops at the first miss.  Like vLLM, at least the
last prompt token is always recomputed, so the hit is ``min(matched, (n - 1) // bs)``
blocks.  Eviction is LRU over blocks; a finished request touches its blocks tail first
(vLLM frees blocks in reverse order), so an old prompt loses its tail before its head.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterator, Sequence

from .tokenizer import Token

_MAX_SEQUENCES = 256
_MAX_EVICTED = 64          # writers whose evicted blocks are remembered
_MAX_EVICTED_HASHES = 1 << 16


@dataclass(frozen=True)
class BlockState:
    tokens: tuple[Token, ...]
    request_id: str
    index: int
    adapter: str = ""      # the LoRA adapter that computed it ("": the base model)


def block_hashes(ids: Sequence[int], block_size: int, salt: str = "", adapter: str = "") -> list[bytes]:
    """Chained hashes of the full blocks of ``ids``; the adapter, if any, is keyed like the salt."""
    if adapter:
        salt = f"{salt}\x00lora:{adapter}"
    salt_bytes = salt.encode("utf-8")
    salt_part = len(salt_bytes).to_bytes(4, "big") + salt_bytes
    hashes: list[bytes] = []
    parent = b"\x00" * 16
    for start in range(0, len(ids) - block_size + 1, block_size):
        payload = array("I", ids[start:start + block_size]).tobytes()
        parent = hashlib.blake2b(parent + salt_part + payload, digest_size=16).digest()
        hashes.append(parent)
    return hashes


class PrefixCache:
    def __init__(self, block_size: int = 16, num_blocks: int = 4096) -> None:
        if block_size < 1 or num_blocks < 1:
            raise ValueError("block_size and num_blocks must be >= 1")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.evictions = 0
        self._blocks: OrderedDict[bytes, BlockState] = OrderedDict()
        self._sequences: OrderedDict[tuple[bytes, ...], str] = OrderedDict()
        self._evicted_hashes: OrderedDict[bytes, None] = OrderedDict()
        self.readmitted: set[bytes] = set()             # stored again after having been evicted
        # writer request -> its evicted block states by index (newest writers last)
        self.evicted_states: OrderedDict[str, dict[int, BlockState]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self._blocks

    def hashes(self, ids: Sequence[int], salt: str = "", adapter: str = "") -> list[bytes]:
        return block_hashes(ids, self.block_size, salt, adapter)

    def peek(self, block_hash: bytes) -> BlockState | None:
        """The stored state without touching LRU order."""
        return self._blocks.get(block_hash)

    def lookup(self, hashes: Sequence[bytes], prompt_len: int) -> list[BlockState]:
        """States of the longest reusable prefix (block-quantized, < prompt_len)."""
        limit = min(len(hashes), max(prompt_len - 1, 0) // self.block_size)
        found: list[BlockState] = []
        for block_hash in hashes[:limit]:
            state = self._blocks.get(block_hash)
            if state is None:
                break
            found.append(state)
        for block_hash in reversed(hashes[:len(found)]):
            self._blocks.move_to_end(block_hash)
        return found

    def store(self, hashes: Sequence[bytes], tokens: Sequence[Token], request_id: str, adapter: str = "",
              adapters: Sequence[str] = ()) -> None:
        """Store every full block not already cached, touch all, then evict LRU. `adapters`: who computed
        each block of `tokens` (restored blocks keep theirs); the rest were computed under `adapter`."""
        bs = self.block_size
        for i, block_hash in enumerate(hashes):
            if block_hash not in self._blocks:
                if block_hash in self._evicted_hashes:
                    self.readmitted.add(block_hash)
                who = adapters[i] if i < len(adapters) else adapter
                self._blocks[block_hash] = BlockState(tuple(tokens[i * bs:(i + 1) * bs]), request_id, i, who)
        for block_hash in reversed(hashes):
            self._blocks.move_to_end(block_hash)
        if hashes:
            key = tuple(hashes)
            self._sequences[key] = request_id
            self._sequences.move_to_end(key)
            while len(self._sequences) > _MAX_SEQUENCES:
                self._sequences.popitem(last=False)
        while len(self._blocks) > self.num_blocks:
            block_hash, state = self._blocks.popitem(last=False)
            self.evictions += 1
            self._remember_evicted(block_hash, state)

    def _remember_evicted(self, block_hash: bytes, state: BlockState) -> None:
        self._evicted_hashes[block_hash] = None
        while len(self._evicted_hashes) > _MAX_EVICTED_HASHES:
            self._evicted_hashes.popitem(last=False)
        by_index = self.evicted_states.setdefault(state.request_id, {})
        by_index[state.index] = state
        self.evicted_states.move_to_end(state.request_id)
        while len(self.evicted_states) > _MAX_EVICTED:
            self.evicted_states.popitem(last=False)

    def sequences(self) -> Iterator[tuple[str, tuple[bytes, ...]]]:
        """Recently stored block chains (newest last) with the request that stored them."""
        for key, request_id in list(self._sequences.items()):
            yield request_id, key

    def usage(self) -> float:
        return len(self._blocks) / self.num_blocks
