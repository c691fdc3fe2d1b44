"""Build memos of a stated token size with the code between the first and last alignment boundary."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator

from ..config.errors import BadInput
from .text import MemoText, SentenceSource, code_sentence, memo_heading, section_heading
from .tokens import TokenCounter, estimate_tokens


@dataclass(frozen=True)
class Memo:
    memo_id: str
    code: str | None
    text: str
    tokens: int                 # measured (server) or estimated, see `sizing`
    sizing: str                 # "server" | "estimate"
    code_offset: int | None     # character offset of the code in `text`
    code_token_start: int | None
    code_token_end: int | None
    grid: int                   # alignment block size in tokens used for placement

    def header(self) -> dict:
        return {"memo": self.memo_id, "code": self.code, "tokens": self.tokens, "sizing": self.sizing,
                "code_offset": self.code_offset, "code_tokens": [self.code_token_start, self.code_token_end],
                "grid": self.grid}


@lru_cache(maxsize=1)
def calibration_sample() -> str:
    """The text whose server and tiktoken counts give the ratio between them (made once)."""
    return " ".join(SentenceSource("calibration").next() for _ in range(40))


async def build_memo(counter: TokenCounter, *, memo_id: str, nonce: str, code: str | None,
                     target_tokens: int, grid: int, code_position: float, seed: int,
                     code_position_max: float = 0.0) -> Memo:
    """`code_position_max` above `code_position`: this memo's code sits at a place drawn between the two,
    seeded by the memo and the run's nonce (a restore that skips a stretch of the prompt anywhere in that
    range loses some memo's code, not only a stretch over one fixed place; each run draws other places,
    the log keeps where each code sat)."""
    drawn = code_position_max > code_position
    if drawn:
        code_position = random.Random(f"{seed}:{memo_id}:{nonce}:code").uniform(
            *_drawable(code_position, code_position_max, target_tokens, grid))
    source = SentenceSource(f"{seed}:{memo_id}")
    memo = MemoText(memo_id=memo_id, nonce=nonce, code=code)
    ratio = await counter.ratio(calibration_sample())
    learned = counter.fill_ratio()          # earlier memos' own, once there are some
    if learned is not None:
        ratio = learned

    # the first fill leaves room for the code sentence, so that it lands near the target with it
    tolerance = max(8, target_tokens // 100)
    room = target_tokens - estimate_tokens(memo.render()) * ratio
    if code is not None:
        room -= estimate_tokens(" " + code_sentence(code)) * ratio
    while room > 0:
        room -= _append(memo, *source.next_sized(), ratio)
    if learned is not None and room < -tolerance / 2:
        # The last sentence overshot by up to its size (25-60 tokens, more than the tolerance): one that fits
        # instead, so that the first count usually lands (the reference server, gpu-quick at 128 streams: 238
        # of 266 memos needed a second count, a round trip to /tokenize each; with this, 45). Only at a ratio
        # learned from memos: at the calibration sample's, off by up to a fifth on a small vocabulary, fitting
        # the last sentence to it lands no closer than the overshoot does (tests/checks/test_evidence.py).
        last = memo.sentences.pop()
        room += _sentence_tokens(memo, len(memo.sentences), last, ratio, memo.spaced.get(last))
        room -= _resize(memo, source, room, tolerance / 2, ratio)
    filled = (target_tokens - room) / ratio         # the fill's own estimate of the memo, as fill_ratio divides it
    if code is not None:
        memo.code_index = max(1, min(len(memo.sentences) - 1, round(len(memo.sentences) * code_position)))
        memo.sentences.insert(memo.code_index, code_sentence(code))

    # The text before the code and through it stays as it is from here (sizing adds or drops sentences
    # after the code only): counted beside the first full count, one round trip, not three in a row
    # (a wide rotation sizes 128 memos before its first round: the client's idle time, issue 34).
    before, through = memo.render_until_code() if code is not None else ("", "")
    counted = await asyncio.gather(counter.count(memo.render()),
                                   *((counter.count(before), counter.count(through)) if code is not None else ()))
    measured = counted[0]
    if counter.source == "server":
        counter.note_memo(measured, filled)
    if drawn and code is not None:      # moved first: sizing then adds or drops only after it
        measured, counted[1], counted[2] = await _move_code(counter, memo, code_position * target_tokens, measured,
                                                            counted[1], counted[2])
    for _ in range(SIZING_RECOUNTS):
        if abs(measured - target_tokens) <= tolerance:
            break
        # this memo's own server tokens per estimated token: closer than the calibration sample's, so one
        # change usually lands it (the old add-or-drop loop swung by a sentence around the target, 4-10
        # counts a memo on Gemma's and qwen3next-recall's tokenizers, some never within the tolerance)
        own_ratio = measured / max(1, estimated(memo))
        _resize(memo, source, target_tokens - measured, tolerance / 2, own_ratio)
        measured = await counter.count(memo.render())
    start = end = offset = None
    if code is not None:
        start, end = counted[1], counted[2]
        offset = len(memo.render_until_code()[0])
    text = memo.render()
    if code is not None:
        last_boundary = (measured // grid) * grid
        if start < grid or end > last_boundary:
            raise BadInput(
                f"memo of {target_tokens} tokens is too short for an alignment grid of {grid} tokens: "
                f"the code (tokens {start}-{end}) must sit between the first boundary ({grid}) and the "
                f"last ({last_boundary}); raise memo_tokens to at least {3 * grid}")
    return Memo(memo_id=memo_id, code=code, text=text, tokens=measured, sizing=counter.source,
                code_offset=offset, code_token_start=start, code_token_end=end, grid=grid)


SIZING_RECOUNTS = 6          # counts after the first before a memo keeps the size it has
FITTING_CANDIDATES = 12      # filler sentences drawn to choose the one that fits what is missing


def _sentence_tokens(memo: MemoText, index: int, sentence: str, ratio: float, spaced: int | None = None) -> float:
    """Estimated server tokens of a sentence at `index`, with what joins it (a space, or the heading of
    the section it opens). `spaced`: estimate_tokens(" " + sentence), known already (SentenceSource.next_sized)."""
    per_section = memo.sentences_per_section
    if index % per_section == 0:
        if not sentence[:1].isalpha():
            return estimate_tokens(section_heading(index // per_section + 1) + sentence) * ratio
        # the heading ends in ". " and the sentence starts with a word: cl100k encodes the heading up to its
        # space, then the word with the space before it, as it encodes " " + sentence alone (each heading with
        # random, cut and code sentences held equal to the encoder: tests/checks/test_sentence_counts.py)
        return (_heading_tokens(index // per_section + 1)
                + (spaced if spaced is not None else estimate_tokens(" " + sentence))) * ratio
    return (spaced if spaced is not None else estimate_tokens(" " + sentence)) * ratio


@lru_cache(maxsize=512)
def _heading_tokens(number: int) -> int:
    """Estimated tokens of section `number`'s heading without its last space (see _sentence_tokens)."""
    return estimate_tokens(section_heading(number).rstrip(" "))


def estimated(memo: MemoText) -> int:
    """estimate_tokens(memo.render()), added up from the heading's, the section headings' and the sentences'
    counts (a full encode of a 1,200-token memo was 0.33 ms, half of sizing one, once for each memo resized).
    cl100k encodes the parts as they come, but for one merge at each section: a heading's first line end joins
    the full stop before it (".\n"); so a sentence must start with a word and end in a word and a full stop,
    else the whole memo is encoded (tests/checks/test_sentence_counts.py holds it equal to the encoder)."""
    total = estimate_tokens(memo_heading(memo.memo_id, memo.nonce))
    per_section = memo.sentences_per_section
    for index, sentence in enumerate(memo.sentences):
        if not (sentence[:1].isalpha() and sentence.endswith(".") and sentence[-2:-1].isalnum()):
            return estimate_tokens(memo.render())
        spaced = memo.spaced.get(sentence)
        if spaced is None:
            spaced = memo.spaced[sentence] = estimate_tokens(" " + sentence)
        total += int(_sentence_tokens(memo, index, sentence, 1.0, spaced)) - (index % per_section == 0)
    return total


def _append(memo: MemoText, sentence: str, spaced: int | None, ratio: float) -> float:
    memo.sentences.append(sentence)
    if spaced is not None:
        memo.spaced[sentence] = spaced
    return _sentence_tokens(memo, len(memo.sentences) - 1, sentence, ratio, spaced)


def _resize(memo: MemoText, source: SentenceSource, change: float, within: float, ratio: float) -> float:
    """Sentences after the code dropped from the end, or filler added, so that the memo's estimated size
    moves by `change` tokens give or take `within`; by how much it moved. Each added sentence is the one of
    the next few drawn whose size best fits what is still missing (the filler's order carries nothing)."""
    wanted = change
    keep = (memo.code_index or 0) + 2
    while change < -within and len(memo.sentences) > keep:
        index = len(memo.sentences) - 1
        last = memo.sentences.pop()
        change += _sentence_tokens(memo, index, last, ratio, memo.spaced.get(last))
    while change > within:
        index = len(memo.sentences)
        sized = [(_sentence_tokens(memo, index, sentence, ratio, spaced), sentence, spaced)
                 for sentence, spaced in (source.next_sized() for _ in range(FITTING_CANDIDATES))]
        size, best, spaced = min(sized, key=lambda entry: abs(change - entry[0]))
        if size > change + within:
            # every whole sentence overshoots (a sentence is 25-60 tokens on a small vocabulary, more than
            # twice the tolerance): the best one cut short at a word
            best, spaced = min(_cuts(best), key=lambda cut: abs(change - _sentence_tokens(memo, index, cut[0], ratio, cut[1])))
        change -= _append(memo, best, spaced, ratio)
    return wanted - change


def _cuts(sentence: str) -> Iterator[tuple[str, int]]:
    """The sentence cut short after each of its words from the second to the last but one, a full stop for
    the words' own end, each with estimate_tokens(" " + cut): the words' counts added up, each encoded once
    a process (the estimate's tokenizer encodes each word with the space before it, and a full stop, on its
    own: spaced_counts; tests/checks/test_sentence_counts.py holds every cut equal to the encoder). Encoding
    each cut was most of the estimates a wide soak made (3,856 of 4,237 on the reference server, 2026-12-07)."""
    words = sentence.split()
    total = 0
    for count, word in enumerate(words[:-1], start=1):
        if count >= 2:
            cut = " ".join(words[:count]).rstrip(".,;") + "."
            # rstrip reaches into the words before only when this one is all stops: encode that rare cut
            last = word.rstrip(".,;")
            yield cut, (total + _spaced_word(last + ".") if last else estimate_tokens(" " + cut))
        total += _spaced_word(word)


@lru_cache(maxsize=4096)
def _spaced_word(word: str) -> int:
    return estimate_tokens(" " + word)


async def _move_code(counter: TokenCounter, memo: MemoText, want: float, measured: int, start: int,
                     end: int) -> tuple[int, int, int]:
    """The code sentence moved to start near token `want` (give or take a sentence), before sizing: placed by
    its share of the first fill's sentences, it lands early wherever that fill fell short and sizing added
    sentences after it (measured on vLLM's tokenizer: codes drawn at 0.64-0.92 sat at 0.55-0.68 of their
    memos, 2026-12-05), and a drawn place must be where it says. (counted tokens, code start, code end)."""
    for _ in range(3):
        per_sentence = measured / max(1, len(memo.sentences))
        index = max(1, min(len(memo.sentences) - 1, memo.code_index + round((want - start) / per_sentence)))
        if index == memo.code_index:
            break
        memo.sentences.insert(index, memo.sentences.pop(memo.code_index))
        memo.code_index = index
        before, through = memo.render_until_code()
        measured, start, end = await asyncio.gather(counter.count(memo.render()), counter.count(before),
                                                    counter.count(through))
    return measured, start, end


def _drawable(low: float, high: float, target_tokens: int, grid: int) -> tuple[float, float]:
    """The part of [low, high] where a code sentence lands between the first and last grid line (a restore
    must hold it); margins of a sentence's tokens, since the code sits inside a sentence at a sentence break."""
    first = (grid + 24) / target_tokens
    last = ((target_tokens // grid) * grid - 48) / target_tokens
    fits = (max(low, first), min(high, last))
    return fits if fits[0] < fits[1] else (low, high)      # nothing fits: the size check below says so


async def filler_text(counter: TokenCounter, *, seed: str, tokens: int) -> str:
    """Plain sentences of about `tokens` tokens (conversation turns, longer suffixes)."""
    source = SentenceSource(seed)
    ratio = await counter.ratio(calibration_sample())
    parts: list[str] = []
    total = 0.0
    while total < tokens:
        sentence = source.next()
        parts.append(sentence)
        total += (estimate_tokens(sentence) + 1) * ratio
    return " ".join(parts)
