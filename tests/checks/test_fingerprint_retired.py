"""A re-drawn (retired) memo's blocks are still in the server's cache: a hit restored from them is another
request's state, named as such, although the memo no longer counts toward distinctness or power."""

from __future__ import annotations

from tui.core.checks.fingerprints import Fingerprint, FingerprintBook


def answer(first: int, spread: float = 0.0, shared: int = 0) -> list:
    """12 greedy tokens, the first `shared` of them memo-a's (100, 101, ...) and the rest from `first` on, each
    with one alternative, log-probabilities moved by `spread` (another state: the same first words, other values)."""
    tokens = [100 + i if i < shared else first + i for i in range(12)]
    return [[tok, -0.1 - spread, [[tok, -0.1 - spread], [900 + i, -2.5 + spread]]] for i, tok in enumerate(tokens)]


def book_with(retired_like_own: bool) -> FingerprintBook:
    book = FingerprintBook(12, 0.05, 0.05)
    book.add("a", Fingerprint("memo-a", "summary", 1, answer(100)))
    book.add("c", Fingerprint("memo-c", "summary", 3, answer(300)))
    book.add("b", Fingerprint("memo-b", "summary", 2, answer(100, 0.03) if retired_like_own else answer(200, 0.6, shared=4)))
    book.retire("memo-b")
    return book


def test_a_hit_restored_from_a_retired_memo_is_another_requests_state():
    book = book_with(retired_like_own=False)
    own = book.get("a")
    mine, _, verdict, owner = book.compare(answer(200, 0.6, shared=4), own)
    assert (verdict, owner) == ("foreign_state", "memo-b")
    assert book.told_apart(own, owner, mine, 0.05) and not book.alike("memo-a", "memo-b", "summary")
    assert [fp.memo for fp in book.live("summary")] == ["memo-a", "memo-c"]     # retired: no longer counted
    assert book.compare(answer(100), own)[2] == "match"


def test_a_retired_memo_alike_to_the_hits_own_is_not_told_apart():
    book = book_with(retired_like_own=True)
    assert book.alike("memo-a", "memo-b", "summary")         # the judge leaves such a hit alone
    assert not book.alike("memo-a", "memo-c", "summary")


def test_memos_with_several_prompts_are_alike_when_any_pair_is():
    book = FingerprintBook(12, 0.05, 0.05)
    book.add("a1", Fingerprint("memo-a", "summary", 1, answer(100)))
    book.add("a2", Fingerprint("memo-a", "summary", 2, answer(300)))      # the memo's second prompt
    book.add("b", Fingerprint("memo-b", "summary", 3, answer(300, 0.01)))
    assert book.alike("memo-a", "memo-b", "summary") and book.alike("memo-b", "memo-a", "summary")
    assert not book.alike("memo-a", "memo-c", "summary")                  # a memo with no fingerprint
