"""The reference server's tokenizer: a regex split with hashed, process-stable ids.

Text is split with ``\\s+|\\w+|[^\\w\\s]``: whitespace runs, word runs and single
punctuation marks, so the code ``7395-2841-6620`` becomes ``7395``, ``-``, ``2841``,
``-``, ``6620``.  Because ``\\w+`` is greedy, two word tokens are never adjacent in a
real tokenization; the model relies on that to recognise a degenerate state.

Ids are a BLAKE2 hash of the token text folded into ``FIRST_ID..VOCAB_SIZE`` (stable
across processes; collisions are harmless because every token keeps its text).
Reserved ids: 0 = an all-zero state slot, 1 = BOS (prepended to every prompt),
2 = EOS (only a faulty restore ever puts it into a state).
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from typing import NamedTuple

ZERO_ID = 0
BOS_ID = 1
EOS_ID = 2
FIRST_ID = 3
VOCAB_SIZE = 50_000

TOKEN_RE = re.compile(r"\s+|\w+|[^\w\s]")
WORD_RE = re.compile(r"\w+")


class Token(NamedTuple):
    id: int
    text: str


ZERO = Token(ZERO_ID, "")
BOS = Token(BOS_ID, "")
EOS = Token(EOS_ID, "")

_seen: dict[int, str] = {}


@lru_cache(maxsize=65536)
def token_for(text: str) -> Token:
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    tid = FIRST_ID + int.from_bytes(digest, "big") % (VOCAB_SIZE - FIRST_ID + 1)
    _seen.setdefault(tid, text)
    return Token(tid, text)


def tokenize(text: str, *, add_bos: bool = True) -> list[Token]:
    tokens = [token_for(piece) for piece in TOKEN_RE.findall(text)]
    for token in tokens:        # the latest text wins a hash collision: ids just handed out map back
        _seen[token.id] = token.text
    return [BOS, *tokens] if add_bos else tokens


def detokenize(ids: list[int]) -> str:
    """Best effort: ids this process has seen map back to their latest text (two texts can share an
    id: with a 50,000-id vocabulary, a long test process meets collisions among 4-digit code groups)."""
    return "".join(_seen.get(i, "") for i in ids)


def is_word(token: Token) -> bool:
    return token.id >= FIRST_ID and WORD_RE.fullmatch(token.text) is not None
