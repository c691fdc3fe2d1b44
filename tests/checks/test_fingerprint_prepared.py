"""The prepared fingerprint comparison (issue 34: read a stored fingerprint once, not once per run) gives
exactly what fingerprint_match gives, on random runs with shared and missing alternatives, ties, floors."""

import random

from tui.core.checks.detectors import classify_fingerprint, fingerprint_match, fingerprint_prepare, prepared_match
from tui.core.checks.fingerprints import Fingerprint, FingerprintBook


def run(rng: random.Random, n: int) -> list[list]:
    out = []
    for _ in range(n):
        tok = rng.choice("abcde")
        lp = rng.choice([None, round(rng.uniform(-6, 0), 3)])
        alts = [[rng.choice("abcdef"), rng.choice([None, round(rng.uniform(-8, 0), 3)])] for _ in range(rng.randint(0, 4))]
        out.append([tok, lp, alts])
    return out


def test_prepared_match_equals_fingerprint_match():
    rng = random.Random(34)
    for _ in range(4000):
        a, b = run(rng, rng.randint(0, 14)), run(rng, rng.randint(0, 14))
        if rng.random() < 0.3:
            b = [list(x) for x in a]             # the same tokens, often the same numbers
            for x in b:
                if x[1] is not None and rng.random() < 0.3:
                    x[1] = round(x[1] + rng.uniform(-0.2, 0.2), 3)
        tokens = rng.randint(1, 12)
        assert prepared_match(fingerprint_prepare(a, tokens), fingerprint_prepare(b, tokens)) == \
            fingerprint_match(a, b, tokens)


def test_book_answers_as_before_with_its_caches():
    rng = random.Random(7)
    book = FingerprintBook(tokens=8, tolerance=0.5)
    fps = [Fingerprint(memo=f"m{i}", task="recall", request=0, logprobs=run(rng, 8)) for i in range(12)]
    fps.append(Fingerprint(memo="twin", task="recall", request=0, logprobs=[list(x) for x in fps[0].logprobs]))
    for i, fp in enumerate(fps):
        book.add(f"k{i}", fp)
    for a in fps:
        for b in fps:
            m = fingerprint_match(a.logprobs, b.logprobs, 8)
            assert book.distinct(a, b) == (not (m.same_tokens and m.distance <= 0.5))
    assert not book.distinct(fps[0], fps[-1])
    probe = [list(x) for x in fps[3].logprobs]
    mine, others, verdict, _ = book.compare(probe, fps[3])
    assert verdict == "match" and others == {}          # a match needs no other memo compared
    mine, others, verdict, owner = book.compare(fps[5].logprobs, fps[3])
    assert (verdict, owner) == ("foreign_state", "m5")
    assert others["m5"] == fingerprint_match(fps[5].logprobs, fps[5].logprobs, 8)


def test_compare_leaves_out_only_memos_that_cannot_be_closer():
    """A run off its own fingerprint is compared only with the memos sharing its first tokens (closer_needs, and
    as many as it shares with its own): the verdict and the closer memo are what comparing every memo gives, on
    random books where runs are copies of one memo's fingerprint, nudged, cut or turned at a token."""
    rng = random.Random(3406)
    seen = set()
    for _ in range(300):
        tokens = rng.randint(3, 12)
        book = FingerprintBook(tokens=tokens, tolerance=0.05)
        stem = run(rng, tokens)                      # memos often share their first tokens, as real answers do
        fps = []
        stored: dict[str, Fingerprint] = {}          # what the book holds, key by key, in the order stored
        for i in range(rng.randint(2, 9)):
            lp = [list(x) for x in stem[:rng.randint(0, tokens)]] + run(rng, tokens)
            fps.append(Fingerprint(memo=f"m{i}", task="recall", request=i, logprobs=lp[:tokens]))
            stored[f"k{i}"] = fps[-1]
            book.add(f"k{i}", fps[-1])
            if rng.random() < 0.3:                   # the same memo on another question: never compared
                other = Fingerprint(memo=f"m{i}", task="summary", request=i, logprobs=[list(x) for x in lp[:tokens]])
                stored[f"s{i}"] = other
                book.add(f"s{i}", other)
        for key in rng.sample(sorted(k for k in stored if k.startswith("k")), rng.randint(0, 2)):
            again = Fingerprint(memo=stored[key].memo, task="recall", request=99,     # a prompt stored again
                                logprobs=([list(x) for x in stem] + run(rng, tokens))[:tokens])
            stored[key] = again
            book.add(key, again)
            fps[int(key[1:])] = again
        for _ in range(10):
            own, source = rng.choice(fps), rng.choice(fps)
            probe = [list(x) for x in source.logprobs]
            for x in probe:
                if x[1] is not None and rng.random() < 0.3:
                    x[1] = round(x[1] + rng.uniform(-0.1, 0.1), 3)
            if probe and rng.random() < 0.3:
                probe[rng.randrange(len(probe))][0] = rng.choice("abcde")
            probe = probe[:rng.randint(0, tokens)] if rng.random() < 0.2 else probe
            mine, others, verdict, owner = book.compare(probe, own)
            every = {fp.memo: fingerprint_match(probe, fp.logprobs, tokens) for fp in stored.values()
                     if fp.task == own.task and fp.memo != own.memo}
            assert (verdict, owner) == classify_fingerprint(mine, every, 0.05, tokens)
            assert all(every[memo] == m for memo, m in others.items())
            seen.add(verdict)
    assert seen == {"match", "mismatch", "foreign_state"}


def test_distinct_tells_different_tokens_apart_without_values_and_equals_its_definition():
    """distinct(a, b) skips the comparison when the chosen tokens differ; it stays what it was: not (the same
    tokens and values within tolerance + margin), on random books where alike pairs occur."""
    rng = random.Random(11)
    seen = set()
    for _ in range(200):
        tokens = rng.randint(2, 10)
        book = FingerprintBook(tokens=tokens, tolerance=0.05)
        stem = run(rng, tokens)
        fps = []
        for i in range(rng.randint(2, 8)):
            if rng.random() < 0.4:                  # the stem's tokens, values moved a little or a lot
                lp = [list(x) for x in stem]
                for x in lp:
                    if x[1] is not None:
                        x[1] = round(x[1] + rng.choice([0.0, 0.01, 0.3]), 3)
            else:
                lp = [list(x) for x in stem[:rng.randint(0, tokens)]] + run(rng, tokens)
            fps.append(Fingerprint(memo=f"m{i}", task="recall", request=i, logprobs=lp[:tokens]))
        for i, fp in enumerate(fps):
            alike = book.add(f"k{i}", fp)
            expected = []
            for other in fps[:i]:
                m = fingerprint_match(fp.logprobs, other.logprobs, tokens)
                is_distinct = not (m.same_tokens and m.distance <= book.tolerance + book.margin)
                assert book.distinct(fp, other) is is_distinct and book.distinct(other, fp) is is_distinct
                seen.add(is_distinct)
                if not is_distinct:
                    expected.append(other)
            assert alike == expected
    assert seen == {True, False}


def test_pair_is_match_either_way_and_kept():
    """book.pair(a, b), which the twin judge's yardstick now asks for every other memo, is match(a, b) and
    match(b, a) exactly, and asking again compares nothing."""
    rng = random.Random(2606)
    for _ in range(100):
        book = FingerprintBook(tokens=rng.choice([4, 8, 12]), tolerance=0.1)
        stem = run(rng, 12)
        fps = []
        for i in range(6):
            lp = [[x[0], x[1], list(x[2])] for x in stem] if rng.random() < 0.4 else run(rng, rng.randint(0, 12))
            fp = Fingerprint(f"m{i}", "recall", i, lp)
            book.add(f"k{i}", fp)
            fps.append(fp)
        for a in fps:
            for b in fps:
                expected = book.match(a.logprobs, b.logprobs)
                assert book.pair(a, b) == expected == book.match(b.logprobs, a.logprobs) == book.pair(b, a)
        kept = len(book._pairs)
        for a in fps:
            for b in fps:
                book.pair(a, b)
        assert len(book._pairs) == kept


def naive_indistinct(book: FingerprintBook, memo: str, task: str) -> list[str]:
    own = [fp for fp in book.live(task) if fp.memo == memo]
    return sorted({other.memo for fp in own for other in book.live(task)
                   if other.memo != memo and not book.distinct(fp, other)})


def naive_closest(book: FingerprintBook, memos=None):
    best = None
    fps = [fp for fp in book.live() if memos is None or fp.memo in memos]
    for i, a in enumerate(fps):
        for b in fps[i + 1:]:
            if a.task != b.task or a.memo == b.memo:
                continue
            m = fingerprint_match(a.logprobs, b.logprobs, book.tokens)
            if best is None or (m.agreeing, -m.distance) > (best[3], -best[4]):
                best = (a.task, a.memo, b.memo, m.agreeing, m.distance, book.distinct(a, b))
    return best


def test_the_books_groups_answer_as_comparing_every_stored_fingerprint():
    """add's alike list, indistinct_from, alike and closest read only fingerprints with the same chosen tokens
    (or the most leading tokens in common): on random books with look-alike memos, prompts stored again,
    memos with several prompts and retired memos, each equals comparing every stored fingerprint."""
    rng = random.Random(3407)
    for _ in range(150):
        # tolerances the cells must hold at: none (alike only when equal), tight, wide, wider than every value
        book = FingerprintBook(tokens=rng.randint(2, 6), tolerance=rng.choice([0.0, 0.05, 0.4, 3.0]),
                               margin=rng.choice([0.0, 0.013]))
        base = [run(rng, 6) for _ in range(4)]
        for step in range(rng.randint(2, 30)):
            lps = [list(x) for x in rng.choice(base)] if rng.random() < 0.6 else run(rng, 6)
            for x in lps:
                if x[1] is not None and rng.random() < 0.3:
                    x[1] = round(x[1] + rng.uniform(-0.6, 0.6), 3)
            fp = Fingerprint(memo=f"m{rng.randint(0, 9)}", task=rng.choice(["recall", "summary"]), request=step,
                             logprobs=lps)
            key = f"k{rng.randint(0, 14)}"
            alike = book.add(key, fp)
            assert alike == [o for o in book.live(fp.task) if o.memo != fp.memo and not book.distinct(fp, o)]
            if rng.random() < 0.15:
                book.retire(f"m{rng.randint(0, 9)}")
            for memo in {f.memo for f in book._by_prompt.values()}:
                for task in ("recall", "summary"):
                    assert book.indistinct_from(memo, task) == naive_indistinct(book, memo, task)
                    other = f"m{rng.randint(0, 9)}"
                    mine = [f for f in book._by_prompt.values() if f.memo == memo and f.task == task]
                    theirs = [f for f in book._by_prompt.values() if f.memo == other and f.task == task]
                    assert book.alike(memo, other, task) == any(not book.distinct(a, b) for a in mine for b in theirs)
            subset = {f"m{i}" for i in range(10) if rng.random() < 0.6}
            for memos in (None, subset):
                got = book.closest(memos)
                want = naive_closest(book, memos)
                assert (None if got is None else (got.task, got.a, got.b, got.agreeing, got.distance, got.distinct)) \
                    == want


def test_closest_compares_only_the_pairs_with_the_most_tokens_in_common():
    """128 memos whose answers part at their first token but for one pair sharing three: one comparison, not
    8,128 (every pair of 128 was 0.37 s of a 128-stream soak's CPU on an H100)."""
    book = FingerprintBook(tokens=6, tolerance=0.05)
    for i in range(128):
        head = ["x", "y", "z"] if i in (40, 90) else [f"t{i}"]
        lps = [[tok, -0.1, [[tok, -0.1]]] for tok in head + [f"u{i}", "v", "w"]][:6]
        book.add(f"k{i}", Fingerprint(memo=f"m{i}", task="summary", request=i, logprobs=lps))
    asked = []
    pair = book.pair
    book.pair = lambda a, b: asked.append((a.memo, b.memo)) or pair(a, b)
    best = book.closest()
    assert (best.a, best.b, best.agreeing) == ("m40", "m90", 3) and asked == [("m40", "m90")]


def test_a_fingerprint_is_compared_only_with_those_near_it_in_value():
    """128 memos whose cold answers are the same words ("not stated in the memo"), their log-probabilities
    spread over 0.3 nats as on the reference server: a new fingerprint is compared only with those in its
    cells, not with all (a sixth of hitproof's CPU at 128 streams, 2026-12-06); the two alike are found."""
    rng = random.Random(12)
    book = FingerprintBook(tokens=12, tolerance=0.05, margin=0.0)
    asked = []
    pair = book.pair
    book.pair = lambda a, b: asked.append((a.memo, b.memo)) or pair(a, b)
    found = []
    for i in range(128):
        values = [round(rng.uniform(-0.3, 0.0), 6) for _ in range(12)] if i != 99 else first
        lps = [[tok, v, [[tok, v]]] for tok, v in zip("abcdefghijkl", values)]
        if i == 0:
            first = [v + 0.01 for v in values]
        found += book.add(f"k{i}", Fingerprint(memo=f"m{i}", task="summary", request=i, logprobs=lps))
    assert [fp.memo for fp in found] == ["m0"]
    assert len(asked) < 128 * 127 / 2 / 10
    asked.clear()
    best = book.closest()
    assert (best.a, best.b, best.distance, best.distinct) == ("m0", "m99", 0.01, False)
    assert len(asked) < 128 * 127 / 2 / 10


def test_match_all_is_match_for_each_run_against_a_stored_fingerprint_or_any_run():
    """FingerprintBook.match_all (a judged deviation's re-runs against its cold fingerprint, its re-hits against
    the hit) equals match(run, b) run by run, whether b is a stored fingerprint's list (kept prepared) or not."""
    rng = random.Random(3407)
    book = FingerprintBook(tokens=12, tolerance=0.05)
    stored = Fingerprint(memo="m0", task="summary", request=1, logprobs=run(rng, 12))
    book.add("k0", stored)
    for _ in range(200):
        runs = [run(rng, rng.randint(0, 14)) for _ in range(rng.randint(0, 6))]
        runs += [[[x[0], None if x[1] is None else x[1] + rng.uniform(-0.1, 0.1), x[2]] for x in stored.logprobs]]
        loose = run(rng, rng.randint(0, 14))
        for b in (stored.logprobs, loose):
            assert book.match_all(runs, b) == [book.match(r, b) for r in runs]
