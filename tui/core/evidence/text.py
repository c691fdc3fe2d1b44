"""Planted evidence: run nonce, codes, the registry of who owns which code, memo text.

The memo's wording is built for a small base model read completion-style: plain
sections, one code sentence, no other four-digit numbers (so any four-digit group
in an answer is attributable to exactly one registered code).
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass, field

RECALL_QUESTION = "What is the reconciliation code in this memo?"
RECALL_ANSWER_LEAD = "The reconciliation code is"
SUMMARY_QUESTION = "Summarize section three of this memo in about 100 words."
DETERMINISM_QUESTION = "Summarize this memo."


def recall_suffix() -> str:
    return f"\n\nQuestion: {RECALL_QUESTION}\nAnswer: {RECALL_ANSWER_LEAD}"


def summary_suffix() -> str:
    return f"\n\nQuestion: {SUMMARY_QUESTION}\nAnswer:"


def determinism_suffix() -> str:
    return f"\n\nQuestion: {DETERMINISM_QUESTION}\nAnswer:"


# --- memo text ---------------------------------------------------------------------

_TEAMS = ["audit", "logistics", "treasury", "procurement", "payroll", "facilities", "compliance",
          "inventory", "billing", "vendor", "customs", "archive", "field", "tax"]
_PLACES = ["the north warehouse", "the harbour office", "the river depot", "the east annex",
           "the main plant", "the hill branch", "the coastal yard", "the old mill", "the airport store",
           "the market hall", "the south terminal", "the valley site"]
_ITEMS = ["pallets", "invoices", "crates", "purchase orders", "delivery notes", "spare parts",
          "fuel receipts", "freight bills", "sample kits", "service tickets", "timber loads",
          "paper rolls", "cable drums", "seed bags"]
_ADJ = ["overdue", "duplicated", "unsigned", "misfiled", "partial", "rerouted", "damaged",
        "late", "unmatched", "provisional", "corrected", "pending"]
_NAMES = ["Alma", "Bruno", "Chiara", "Dmitri", "Elif", "Farah", "Goran", "Hana", "Ivo", "Jonas",
          "Keiko", "Lena", "Marek", "Nadia", "Oskar", "Priya", "Quentin", "Rosa", "Stefan", "Tomas"]
_NUMBER_WORDS = ["two", "three", "four", "five", "six", "seven", "eight", "nine", "eleven", "twelve"]
_TEMPLATES = [
    "The {team} team at {place} counted {num} {adj} {items} and logged each one by hand.",
    "{name} checked the {items} from {place} against the ledger and marked {num} of them as {adj}.",
    "Because several {items} were {adj}, {name} asked the {team} team to hold the weekly report.",
    "At {place}, the {adj} {items} were moved to a separate shelf until the {team} team signed them.",
    "{name} noted that {num} {items} had arrived {adj} and that the carrier had not been told.",
    "The {team} desk sent {num} {adj} {items} back to {place} with a short note from {name}.",
    "A second count at {place} found the same {num} {adj} {items}, so the figure was kept.",
    "{name} and the {team} team agreed to close the {items} file once {place} confirmed it.",
]
_ORDINALS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
             "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
             "eighteen", "nineteen", "twenty"]


_SLOTS = (("team", _TEAMS), ("place", _PLACES), ("items", _ITEMS), ("adj", _ADJ), ("name", _NAMES),
          ("num", _NUMBER_WORDS))      # in the order a sentence draws them


_DRAWS = tuple((choices, len(choices), len(choices).bit_length()) for choices in (_TEMPLATES, *(c for _, c in _SLOTS)))


class SentenceSource:
    """An endless, deterministic stream of filler sentences for one memo."""

    def __init__(self, seed: str):
        self._rng = random.Random(seed)
        self._bits = self._rng.getrandbits

    def next(self) -> str:
        template, words = self._draw()
        return _fill(template, words)

    def next_sized(self) -> tuple[str, int]:
        """The next sentence (the one next() would give) and estimate_tokens(" " + sentence), added up from
        its template's and its words' counts (spaced_counts) instead of encoding it: a memo's sizing estimates
        60-110 sentences (the encodes were a twentieth of hitproof's profiled CPU at 128 streams on an H100, and
        sizing memos a fifth: cProfile, 2026-12-06, run T)."""
        template, words = self._draw()
        base, used, counts = spaced_counts()
        return _fill(template, words), base[template] + sum(counts[i][words[i]] for i in used[template])

    def _draw(self) -> tuple[str, tuple[str, ...]]:
        """A template, then a word for each slot: each as random.choice draws it (an index of as many bits as
        the list's length has, drawn again while it is past the end), without its two calls a draw (seven
        draws a sentence, 60-110 sentences a memo: a quarter of sizing one, 2026-12-06; test_sentence_counts.py
        holds the stream equal to random.choice's). Written out draw by draw: 0.5 against 1.0 us as a loop
        over _DRAWS (a wide soak draws about 11,000 sentences, 2026-12-07)."""
        bits = self._bits
        (ct, nt, kt), (c0, n0, k0), (c1, n1, k1), (c2, n2, k2), (c3, n3, k3), (c4, n4, k4), (c5, n5, k5) = _DRAWS
        t = bits(kt)
        while t >= nt:
            t = bits(kt)
        a = bits(k0)
        while a >= n0:
            a = bits(k0)
        b = bits(k1)
        while b >= n1:
            b = bits(k1)
        c = bits(k2)
        while c >= n2:
            c = bits(k2)
        d = bits(k3)
        while d >= n3:
            d = bits(k3)
        e = bits(k4)
        while e >= n4:
            e = bits(k4)
        f = bits(k5)
        while f >= n5:
            f = bits(k5)
        return ct[t], (c0[a], c1[b], c2[c], c3[d], c4[e], c5[f])


def _fill(template: str, words: tuple[str, ...]) -> str:
    positional = _POSITIONAL.get(template)
    if positional is not None:
        return positional.format(*words)
    return template.format(**{name: word for (name, _), word in zip(_SLOTS, words)})


# Each template with its slots numbered in _SLOTS' order: format(*words) builds no dict of names (0.4 against
# 1.4 us a sentence; a wide soak's memos draw about 20,000, 2026-12-07). The same text: only the names changed.
_POSITIONAL = {template: template.format(**{name: "{%d}" % i for i, (name, _) in enumerate(_SLOTS)})
               for template in _TEMPLATES}


@functools.lru_cache(maxsize=1)
def spaced_counts() -> tuple[dict[str, int], dict[str, tuple[int, ...]], list[dict[str, int]]]:
    """(per template: its tokens after a space less its words', the slots it uses; per slot: each word's
    tokens after a space). The estimate's tokenizer (cl100k) splits text into words, each with the space
    before it, and punctuation, before it encodes each piece alone; every word a template takes stands between
    a space and a space or a punctuation mark, so a sentence's count is its template's plus its words'
    (tests/checks/test_sentence_counts.py holds every word in every slot of every template equal to the
    encoder, and random sentences)."""
    from .tokens import estimate_tokens
    counts = [{word: estimate_tokens(" " + word) for word in choices} for _, choices in _SLOTS]
    reference = tuple(choices[0] for _, choices in _SLOTS)
    base, used = {}, {}
    for template in _TEMPLATES:
        used[template] = tuple(i for i, (name, _) in enumerate(_SLOTS) if "{" + name + "}" in template)
        base[template] = estimate_tokens(" " + _fill(template, reference)) - sum(
            counts[i][reference[i]] for i in used[template])
    return base, used, counts


def code_sentence(code: str) -> str:
    return f"The reconciliation code for this memo is {code}. Keep it verbatim."


def memo_heading(memo_id: str, nonce: str) -> str:
    # Memo id first: the first block of every memo is unique, so nothing starts warm.
    return (f"Memo {memo_id}, run {nonce}. Internal reconciliation record, "
            f"kept by the accounts office.\n")


def section_heading(number: int) -> str:
    return f"\nSection {number}. "


@dataclass
class MemoText:
    """A memo assembled from sentences; the code sentence sits at `code_index`."""

    memo_id: str
    nonce: str
    code: str | None
    sentences: list[str] = field(default_factory=list)
    code_index: int | None = None
    sentences_per_section: int = 6
    spaced: dict[str, int] = field(default_factory=dict)    # sentence -> estimate_tokens(" " + it), where known

    def render(self) -> str:
        parts = [memo_heading(self.memo_id, self.nonce)]
        for i, sentence in enumerate(self.sentences):
            if i % self.sentences_per_section == 0:
                parts.append(section_heading(i // self.sentences_per_section + 1))
            else:
                parts.append(" ")
            parts.append(sentence)
        return "".join(parts)

    def render_until_code(self) -> tuple[str, str]:
        """(text before the code, text through the end of the code)."""
        full = self.render()
        if self.code is None:
            return full, full
        at = full.index(self.code)
        return full[:at], full[: at + len(self.code)]
