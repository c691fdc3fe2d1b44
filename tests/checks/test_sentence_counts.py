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


def test_a_sentence_opening_a_section_counts_as_the_heading_and_the_sentence_encoded_together():
    """memos._sentence_tokens adds a heading's count (without its last space) to the sentence's spaced count:
    equal to encoding both together, for every heading a memo has, with random, cut-short and code sentences;
    a sentence that does not start with a word is encoded with its heading."""
    from tui.core.evidence.memos import _sentence_tokens
    from tui.core.evidence.text import MemoText, code_sentence, section_heading

    memo = MemoText(memo_id="m1", nonce="n", code=None)
    source = SentenceSource("headings")
    rng = random.Random(3)
    for number in range(1, 121):
        index = (number - 1) * memo.sentences_per_section
        sentence, spaced = source.next_sized()
        words = sentence.split()
        cut = " ".join(words[:rng.randint(2, len(words) - 1)]).rstrip(".,;") + "."
        for text, known in ((sentence, spaced), (sentence, None), (cut, None),
                            (code_sentence(f"{rng.randint(1000, 9999)}-0042-{number:04d}"), None),
                            ("1234 opens it.", None), ("(a) note.", None)):
            assert _sentence_tokens(memo, index, text, 1.0, known) == estimate_tokens(section_heading(number) + text)


def test_a_memos_estimate_added_up_from_its_parts_is_the_encoders():
    """memos.estimated: the heading's, the section headings' and the sentences' counts, less one a section,
    equal to encoding the whole memo, for memos of 0 to 80 sentences with code and cut-short sentences among
    them and ids of every shape; a sentence that does not end in a word and a full stop makes it encode all."""
    from tui.core.evidence.memos import estimated
    from tui.core.evidence.text import MemoText, code_sentence

    rng = random.Random(5)
    for m in range(250):
        memo = MemoText(memo_id=rng.choice([f"m{m:02d}", f"m{m}-rot{m % 7}-redraw2", f"m{m}-shared"]),
                        nonce=rng.choice(["tsjeygbs", "a1b2c3d4"]), code=None)
        source = SentenceSource(f"7:m{m}")
        for _ in range(rng.randint(0, 80)):
            sentence, spaced = source.next_sized()
            if rng.random() < 0.1:
                words = sentence.split()
                sentence, spaced = " ".join(words[:rng.randint(2, len(words) - 1)]).rstrip(".,;") + ".", None
            elif rng.random() < 0.05:
                sentence, spaced = code_sentence(f"{rng.randint(1000, 9999)}-{rng.randint(1000, 9999)}-0042"), None
            memo.sentences.append(sentence)
            if spaced is not None and rng.random() < 0.8:
                memo.spaced[sentence] = spaced
        assert estimated(memo) == estimate_tokens(memo.render()), memo.memo_id
    odd = MemoText(memo_id="m1", nonce="n", code=None, sentences=["It ends here!", "Then this."])
    assert estimated(odd) == estimate_tokens(odd.render())


def test_a_template_filled_by_position_is_the_template_filled_by_name():
    """_fill formats each template's positional form (its slots numbered in _SLOTS' order): the sentence is the
    one the named slots give, for every template and random words."""
    rng = random.Random(7)
    names = [name for name, _ in _SLOTS]
    for template in _TEMPLATES:
        for _ in range(50):
            words = tuple(rng.choice(choices) for _, choices in _SLOTS)
            assert _fill(template, words) == template.format(**dict(zip(names, words)))
    assert _fill("{name} of {team}", tuple(c[0] for _, c in _SLOTS)) == "Alma of audit"   # not a template: by name


def test_every_cut_of_a_filler_sentence_counts_as_encoded():
    """memos._cuts: each way _resize cuts a sentence short (after its second word to its last but one, a full
    stop for the rest), in the order it tries them, with the words' counts added up equal to encoding the cut;
    also for words ending in stops and a word that is nothing but stops (that cut is encoded)."""
    from tui.core.evidence.memos import _cuts

    source = SentenceSource("cuts")
    sentences = [source.next() for _ in range(300)] + ["Rosa said so, then; later. the end.", "A b ,. c d."]
    checked = 0
    for sentence in sentences:
        words = sentence.split()
        want = [" ".join(words[:n]).rstrip(".,;") + "." for n in range(2, len(words))]
        got = list(_cuts(sentence))
        assert [cut for cut, _ in got] == want
        for cut, spaced in got:
            assert spaced == estimate_tokens(" " + cut), cut
            checked += 1
    assert checked > 2000
