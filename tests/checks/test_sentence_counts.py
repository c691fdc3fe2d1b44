"""A filler sentence's estimate added up from its template and its words (SentenceSource.next_sized) equals
encoding it: for every word in every slot of every template, and for random sentences; the sentences are
the ones next() gives, so memo texts stay what they were."""

import random

from tui.core.evidence.text import _SLOTS, _TEMPLATES, SentenceSource, _fill
from tui.core.evidence.tokens import estimate_tokens


def test_every_word_in_every_slot_counts_as_encoded():
    reference = [choices[0] for _, choices in _SLOTS]
    checked = 0
    for template in _TEMPLATES:
        for i, (name, choices) in enumerate(_SLOTS):
            if "{" + name + "}" not in template:
                continue
            for word in choices:
                words = list(reference)
                words[i] = word
                sentence = _fill(template, tuple(words))
                source = SentenceSource("x")
                source._draw = lambda t=template, w=tuple(words): (t, w)
                assert source.next_sized() == (sentence, estimate_tokens(" " + sentence))
                checked += 1
    assert checked > 300


def test_random_sentences_are_next_and_count_as_encoded():
    for seed in ("a", "b", "17:m3"):
        plain, sized = SentenceSource(seed), SentenceSource(seed)
        for _ in range(500):
            sentence, tokens = sized.next_sized()
            assert sentence == plain.next()
            assert tokens == estimate_tokens(" " + sentence)


def test_next_draws_as_it_always_did():
    """The stream a seed gives is the one it gave before next_sized existed (memo texts unchanged)."""
    r = random.Random("seed")
    want = [r.choice(_TEMPLATES).format(team=r.choice(_SLOTS[0][1]), place=r.choice(_SLOTS[1][1]),
                                        items=r.choice(_SLOTS[2][1]), adj=r.choice(_SLOTS[3][1]),
                                        name=r.choice(_SLOTS[4][1]), num=r.choice(_SLOTS[5][1])) for _ in range(50)]
    source = SentenceSource("seed")
    assert [source.next() for _ in range(50)] == want
