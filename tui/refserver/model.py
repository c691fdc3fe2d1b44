"""The reference "model": a pure function of the state it was handed.

The state is the token list the server built for a request: restored blocks for the
cached part, the prompt's own tokens for the rest.  The model never sees the prompt
separately, so a wrong restore changes the answer the way it does on a real server.

Reading order:

1. an EOS token anywhere in the state: the sequence is over, nothing is generated;
2. a degenerate state (a run of identical word tokens, which the tokenizer can never
   produce): one token repeated until ``max_tokens``;
3. otherwise the last question decides the task.  The question is the text after the
   last ``Question:`` or ``User:`` (else after the last blank line; narrowed to the last
   paragraph, or its last lines, when that turn also carries the memo):

   - "reconciliation code" -> recall: `` {code}.`` for the first ``dddd-dddd-dddd`` in
     the state before the question, or a fluent answer with no code if there is none;
   - "summar..." -> summary: every second sentence of the named section ("section 3" or
     "section three", read after ``Section 3.`` in the state) or of the whole memo,
     skipping sentences that carry a code, prefixed with "The memo says";
   - anything else -> a continuation of vocabulary words seeded by a hash of the state
     token ids (identical state => identical text, different state => different text).

Decoding is always greedy: temperature, top_p and seed do not change the output. A LoRA adapter
(``adapters``: who computed the state) moves the continuation's words and the log-probabilities
(``with_adapters``), never a recalled code or a summary: like the real tiny adapters, whose greedy
recall answers barely move while their log-probabilities do.
``jitter`` (an RNG) is the one non-pure input: it stands in for a nondeterministic
kernel (wording drift, rare wrong-task samples) and is ``None`` unless the
``wording_drift`` fault hands one in.
"""

from __future__ import annotations

import hashlib
import random
import re
from array import array
from dataclasses import dataclass
from typing import Sequence

from .tokenizer import EOS_ID, Token, is_word

CODE_RE = re.compile(r"\b\d{4}-\d{4}-\d{4}\b")
PIECE_RE = re.compile(r"\s*(?:\w+|[^\w\s])")
SECTION_Q_RE = re.compile(r"\bsection\s+(\d+|one|two|three|four|five|six|seven|eight|nine|ten)\b", re.I)
SECTION_RE = re.compile(r"Section \d+\.")
SENTENCE_RE = re.compile(r"(?<=[.!?])\s+")
DRIFT_WORD_RE = re.compile(r"\b[A-Za-z]{3,}\b")
NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5,
           "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10}
NO_CODE_ANSWER = " not stated in the memo; the ledger totals were reconciled."
RECALL_WORDS = 10                  # a distinct no-code answer's words (NO_CODE_ANSWER's length)
RECALL_VARIANTS = (" {code}.", " {code}, as stated in the memo.", " {code}. It appears once.")
WRONG_TASK_RATE = 1 / 15
DEGENERATE_RUN = 4

SYNONYMS = {
    "account": "ledger", "ledger": "account", "review": "audit", "audit": "review",
    "team": "group", "group": "team", "quarter": "period", "period": "quarter",
    "report": "statement", "statement": "report", "change": "adjustment",
    "adjustment": "change", "balance": "total", "total": "balance", "vendor": "supplier",
    "supplier": "vendor", "invoice": "bill", "bill": "invoice", "record": "entry",
    "entry": "record", "shows": "indicates", "indicates": "shows", "notes": "records",
    "records": "notes", "careful": "thorough", "thorough": "careful", "early": "prompt",
    "prompt": "early", "large": "sizable", "sizable": "large", "small": "minor",
    "minor": "small", "office": "branch", "branch": "office", "memo": "note",
    "note": "memo", "says": "states", "states": "says", "the": "this", "this": "the",
}
FILLERS = ("also", "notably", "largely", "broadly", "mainly")
VOCAB = tuple(sorted(set(SYNONYMS) | {
    "and", "of", "with", "for", "after", "before", "under", "each", "every", "new",
    "final", "monthly", "regional", "pending", "cleared", "posted", "matched", "filed",
    "approved", "delayed", "budget", "payment", "transfer", "schedule", "summary",
    "figures", "margin", "forecast", "customer", "contract", "committee", "director",
    "warehouse", "shipment", "inventory", "payroll", "tax", "credit", "debit", "cash",
    "reserve", "policy", "deadline", "update", "draft", "signed", "closed", "opened",
}))


@dataclass(frozen=True)
class Generation:
    pieces: list[str]
    finished: bool  # True: the model ended the sequence; False: max_tokens cut it
    task: str       # recall | summary | continue | degenerate | ended


def state_digest(state: Sequence[Token]) -> bytes:
    return hashlib.blake2b(array("I", [t.id for t in state]).tobytes(), digest_size=16).digest()


FINGERPRINT_HEAD = 16   # the memo's identity sits in its first tokens (memo id, run nonce)
QUESTION_MARKS = ("Question", "User")


def fingerprint_digest(state: Sequence[Token]) -> bytes:
    """What the log-probabilities depend on: whose state this is (its head) and what is asked
    (its tail), like a recurrent state summarising the memo. A correct hit gives the cold
    values exactly; a restore of another memo's state gives *that* memo's values for the same
    question; a zeroed state gives values of no memo at all."""
    start = max(FINGERPRINT_HEAD, len(state) - 48)
    for i in range(len(state) - 1, FINGERPRINT_HEAD - 1, -1):
        if state[i].text in QUESTION_MARKS:
            start = i
            break
    return state_digest(list(state[:FINGERPRINT_HEAD]) + list(state[start:]))


def split_question(text: str) -> tuple[str, str]:
    """(context before the last question, the question).

    The question starts after the last ``Question:`` or ``User:``; when that turn also
    carries the memo (one long user message), it starts after the turn's last blank
    line, or else at its last (up to three) lines that hold no section heading.
    """
    cut = max(text.rfind("Question:"), text.rfind("User:"))
    if cut < 0:
        cut = max(text.rfind("\n\n"), 0)
    question = text[cut:]
    if len(question) > 600 or SECTION_RE.search(question):
        blank = question.rfind("\n\n")
        if blank >= 0:
            cut += blank
        else:
            tail: list[str] = []
            for line in reversed(question.split("\n")):
                if len(tail) == 3 or SECTION_RE.search(line):
                    break
                tail.insert(0, line)
            cut += len(question) - len("\n".join(tail))
    return text[:cut], text[cut:]


def classify(question: str) -> str:
    q = question.lower()
    if "reconciliation code" in q:
        return "recall"
    if "summar" in q:
        return "summary"
    return "continue"


def degenerate_word(state: Sequence[Token]) -> str | None:
    prev, run = None, 0
    for token in state:
        run = run + 1 if token == prev else 1
        prev = token
        if run >= DEGENERATE_RUN and is_word(token):
            return token.text
    return None


def with_adapters(digest: bytes, adapters: Sequence[str]) -> bytes:
    """A digest as computed under LoRA adapters: `adapters` lists, in order, who computed the state
    (the adapters of the restored blocks, then the request's own). Only the base model (all "")
    leaves it unchanged; any adapter, or a mix, moves it (a restore of another adapter's blocks
    gives values of neither adapter)."""
    signature = tuple(dict.fromkeys(adapters))
    if signature in ((), ("",)):
        return digest
    return hashlib.blake2b(digest + "\x00".join(signature).encode(), digest_size=16).digest()


def generate(state: Sequence[Token], max_tokens: int, jitter: random.Random | None = None,
             adapters: Sequence[str] = (), distinct_no_code: bool = False) -> Generation:
    if any(t.id == EOS_ID for t in state):
        return Generation([], True, "ended")
    word = degenerate_word(state)
    if word is not None:
        return Generation([" " + word] * max_tokens, False, "degenerate")
    context, question = split_question("".join(t.text for t in state))
    task = classify(question)
    if task == "recall":
        answer = _recall(context, jitter)
        if answer == NO_CODE_ANSWER and distinct_no_code:       # the memo's own continuation (config.py)
            answer = _continuation(hashlib.blake2b(context.encode(), digest_size=16).digest(), RECALL_WORDS)
    elif task == "summary":
        answer = _summary(context, question, jitter)
    else:
        answer = _continuation(with_adapters(state_digest(state), adapters), max_tokens)
    pieces = PIECE_RE.findall(answer)
    finished = task != "continue" and len(pieces) <= max_tokens
    if jitter is not None and task != "recall":
        pieces = PIECE_RE.findall(_drift("".join(pieces[:max_tokens]), jitter))
    return Generation(pieces[:max_tokens], finished, task)


def _recall(context: str, jitter: random.Random | None) -> str:
    match = CODE_RE.search(context)
    if match is None:
        return NO_CODE_ANSWER
    variant = jitter.choice(RECALL_VARIANTS) if jitter is not None else RECALL_VARIANTS[0]
    return variant.format(code=match.group(0))


def _section(context: str, question: str) -> str | None:
    matches = list(SECTION_Q_RE.finditer(question))
    if not matches:
        return None
    named = matches[-1]
    raw = named.group(1).lower()
    number = NUMBERS.get(raw) or int(raw)
    start = re.search(rf"Section {number}\.", context)
    if start is None:
        return None
    end = SECTION_RE.search(context, start.end())
    return context[start.end():end.start() if end else len(context)]


def _summary(context: str, question: str, jitter: random.Random | None) -> str:
    if jitter is not None and jitter.random() < WRONG_TASK_RATE:
        own = CODE_RE.search(context)
        if own is not None:
            return " " + own.group(0)  # a sampling fluke: the memo's own code
    source = _section(context, question) or context
    sentences = [" ".join(s.split()) for s in SENTENCE_RE.split(source)]
    picked = [s for s in sentences if s and not CODE_RE.search(s)][::2]
    if not picked:
        return " The memo says little that can be summarized."
    head, _, rest = picked[0].partition(" ")
    first = head.lower() + (" " + rest if rest else "")
    return " The memo says " + " ".join([first, *picked[1:]])


def _continuation(digest: bytes, max_tokens: int) -> str:
    rng = random.Random(digest)
    words: list[str] = []
    until_stop = rng.randint(6, 12)
    while len(words) < max_tokens:
        word = rng.choice(VOCAB)
        words.append(word.capitalize() if not words or words[-1].endswith(".") else word)
        until_stop -= 1
        if until_stop == 0:
            words[-1] += "."
            until_stop = rng.randint(6, 12)
    return " " + " ".join(words)


def _drift(text: str, rng: random.Random) -> str:
    """Swap one or two words (after character ~60) for a synonym, or insert a filler."""
    start = 60 if len(text) > 100 else len(text) // 3
    spots = [m for m in DRIFT_WORD_RE.finditer(text) if m.start() >= start]
    if not spots:
        return text
    for m in sorted(rng.sample(spots, min(len(spots), rng.choice((1, 2)))), key=lambda m: -m.start()):
        word = m.group(0)
        swap = SYNONYMS.get(word.lower())
        if swap is not None:
            new = swap.capitalize() if word[0].isupper() else swap
        else:
            new = rng.choice(FILLERS) + " " + word
        text = text[:m.start()] + new + text[m.end():]
    return text
