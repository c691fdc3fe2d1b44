"""Unit tests of the reference server's own parts: tokenizer, prefix cache, model, faults."""

import random

import pytest

from tui.refserver.cache import PrefixCache, block_hashes
from tui.refserver.config import RefServerConfig
from tui.refserver.pipeline import Pipeline
from tui.refserver.model import generate, split_question
from tui.refserver.tokenizer import BOS_ID, tokenize, token_for


def toks(n: int, start: int = 0):
    """Exactly n distinct tokens."""
    return [token_for(f"w{start + i}") for i in range(n)]


def ids(tokens):
    return [t.id for t in tokens]


def stored(cache: PrefixCache, tokens, salt: str = "", rid: str = "r"):
    hashes = cache.hashes(ids(tokens), salt)
    cache.store(hashes, tokens, rid)
    return hashes


# --- tokenizer ---------------------------------------------------------------------

def test_tokenizer_splits_codes_and_prepends_bos():
    tokens = tokenize("The code is 7395-2841-6620.")
    assert tokens[0].id == BOS_ID
    assert [t.text for t in tokens[1:]] == ["The", " ", "code", " ", "is", " ",
                                            "7395", "-", "2841", "-", "6620", "."]
    assert "".join(t.text for t in tokens) == "The code is 7395-2841-6620."


def test_token_ids_are_stable_across_processes():
    # pinned values: a hash of the text, never Python's salted hash()
    assert token_for("7395").id == token_for("7395").id
    assert [token_for(w).id for w in ("the", "7395", "-")] == [16587, 24940, 19584]
    assert all(3 <= token_for(f"x{i}").id <= 50_000 for i in range(200))


# --- prefix cache ------------------------------------------------------------------

def test_hash_chaining_same_block_after_different_prefix_does_not_match():
    a = toks(8, 0) + toks(8, 100)          # blocks: A0, X
    b = toks(8, 50) + toks(8, 100)         # blocks: B0, X (same content, other parent)
    ha, hb = block_hashes(ids(a), 8), block_hashes(ids(b), 8)
    assert ha[0] != hb[0] and ha[1] != hb[1]
    cache = PrefixCache(block_size=8, num_blocks=64)
    stored(cache, a)
    assert cache.lookup(hb, len(b) + 1) == []


def test_lookup_stops_at_first_miss_and_shares_common_prefix():
    cache = PrefixCache(block_size=4, num_blocks=64)
    a = toks(16)
    stored(cache, a, rid="A")
    b = a[:8] + toks(8, 500)
    found = cache.lookup(cache.hashes(ids(b)), len(b) + 1)
    assert [s.index for s in found] == [0, 1]
    assert all(s.request_id == "A" for s in found)
    assert [t for s in found for t in s.tokens] == a[:8]


def test_salt_isolation():
    cache = PrefixCache(block_size=4, num_blocks=64)
    prompt = toks(20)
    stored(cache, prompt, salt="")
    assert len(cache.lookup(cache.hashes(ids(prompt), "s1"), len(prompt))) == 0
    stored(cache, prompt, salt="s1")
    assert len(cache.lookup(cache.hashes(ids(prompt), "s1"), len(prompt))) == 4
    assert len(cache.lookup(cache.hashes(ids(prompt), "s2"), len(prompt))) == 0
    assert len(cache.lookup(cache.hashes(ids(prompt), ""), len(prompt))) == 4


@pytest.mark.parametrize("n, expected_blocks", [(37, 2), (33, 2), (32, 1), (31, 1), (16, 0), (17, 1), (1, 0)])
def test_cached_tokens_block_quantized_and_last_token_recomputed(n, expected_blocks):
    cache = PrefixCache(block_size=16, num_blocks=64)
    prompt = toks(n)
    hashes = stored(cache, prompt)
    assert len(hashes) == n // 16
    found = cache.lookup(hashes, n)
    assert len(found) == expected_blocks
    assert len(found) * 16 < n or n == 0


def test_lru_evicts_least_recently_used_and_tails_first():
    cache = PrefixCache(block_size=2, num_blocks=6)
    a, b, c = toks(4, 0), toks(4, 100), toks(4, 200)
    ha, hb = stored(cache, a, rid="A"), stored(cache, b, rid="B")
    hc = stored(cache, c, rid="C")
    assert len(cache) == 6 and cache.evictions == 0
    assert len(cache.lookup(ha, 5)) == 2  # touch A: B is now least recently used
    d = toks(2, 300)
    stored(cache, d, rid="D")
    assert len(cache) == 6 and cache.evictions == 1
    assert hb[0] in cache and hb[1] not in cache  # B lost its tail, kept its head
    assert len(cache.lookup(hb, 5)) == 1  # touches B's head
    assert all(h in cache for h in ha)
    stored(cache, toks(4, 400))
    assert hc[0] not in cache and hc[1] not in cache and hb[0] in cache


def test_store_keeps_first_writer_and_records_sequences():
    cache = PrefixCache(block_size=4, num_blocks=64)
    prompt = toks(8)
    h = stored(cache, prompt, rid="first")
    stored(cache, prompt, rid="second")
    assert cache.peek(h[0]).request_id == "first"
    assert [(rid, chain) for rid, chain in cache.sequences()] == [("second", tuple(h))]
    assert cache.usage() == 2 / 64


# --- model -------------------------------------------------------------------------

MEMO = ("Memo 1.\n\nSection 1. Opening words here.\n\nSection 2. More words.\n\n"
        "Section 3. The vendor review was early. The code is 7395-2841-6620. "
        "The office closed the quarter. The team filed the bill.\n\nSection 4. End.")


def text_of(prompt: str, max_tokens: int = 64, jitter=None) -> str:
    return "".join(generate(tokenize(prompt), max_tokens, jitter).pieces)


def test_model_recall_summary_and_continuation():
    recall = MEMO + "\n\nQuestion: What is the reconciliation code?\nAnswer:"
    assert text_of(recall) == " 7395-2841-6620."
    summary = text_of(MEMO + "\n\nQuestion: Summarize section three.\nAnswer:")
    assert summary == " The memo says the vendor review was early. The team filed the bill."
    cont1, cont2 = text_of("Once upon a time"), text_of("Once upon a time.")
    assert cont1 == text_of("Once upon a time") and cont1 != cont2
    assert len(generate(tokenize("Once upon a time"), 7).pieces) == 7


def test_a_memo_without_a_code_answers_its_own_continuation_when_asked():
    """--distinct-no-code: a recall question about a code-less memo answers a continuation of that memo
    (the same every time, another for another memo) instead of one sentence for every memo; a memo with a
    code answers its code either way."""
    from tui.refserver.model import NO_CODE_ANSWER

    plain = [MEMO.replace("The code is 7395-2841-6620. ", word) for word in ("", "The vendor paid. ")]
    asked = [memo + "\n\nQuestion: What is the reconciliation code?\nAnswer:" for memo in plain]

    def answer(prompt: str, distinct: bool) -> str:
        return "".join(generate(tokenize(prompt), 12, distinct_no_code=distinct).pieces)

    assert [answer(a, False) for a in asked] == [NO_CODE_ANSWER] * 2
    first, second = (answer(a, True) for a in asked)
    assert first != second and NO_CODE_ANSWER not in (first, second) and answer(asked[0], True) == first
    coded = MEMO + "\n\nQuestion: What is the reconciliation code?\nAnswer:"
    assert answer(coded, True) == answer(coded, False) == " 7395-2841-6620."
    import argparse

    from tui.refserver.cli import _config, configure
    parser = argparse.ArgumentParser()
    configure(parser)
    assert _config(parser.parse_args(["--distinct-no-code"])).distinct_no_code
    assert not _config(parser.parse_args([])).distinct_no_code


def test_model_question_inside_a_long_user_turn():
    chat = "User: " + MEMO.replace("\n\n", "\n") + "\nWhat is the reconciliation code?\nAssistant:"
    context, question = split_question(chat)
    assert "7395" in context and "reconciliation" in question
    assert text_of(chat) == " 7395-2841-6620."


def test_model_drift_changes_wording_not_codes():
    long_summary = MEMO * 3 + "\n\nQuestion: Summarize the memo.\nAnswer:"
    rng = random.Random(1)
    outs = {text_of(long_summary, 120, rng) for _ in range(6)}
    assert len(outs) >= 5
    assert all("7395" in text_of(MEMO + "\nQuestion: the reconciliation code?", 30, rng) for _ in range(5))


# --- faults at the restore step ----------------------------------------------------

def pipeline(fault: str, **kw) -> Pipeline:
    return Pipeline(RefServerConfig(fault=fault, block_size=4, **kw))


def run(eng: Pipeline, prompt: str, rid: str, max_tokens: int = 32):
    adm = eng.admit(prompt, "", max_tokens, rid)
    eng.commit(adm)
    return adm


RECALL = MEMO + "\n\nQuestion: What is the reconciliation code?\nAnswer:"


def test_restore_builds_state_from_cache_not_prompt():
    eng = pipeline("zero_state")
    cold = run(eng, RECALL, "a")
    hit = run(eng, RECALL, "b")
    assert cold.cached_tokens == 0 and hit.cached_tokens > 0
    assert all(t.id == 0 for t in hit.state[:hit.cached_tokens])
    assert hit.state[hit.cached_tokens:] == hit.prompt[hit.cached_tokens:]
    assert "".join(cold.generation.pieces) == " 7395-2841-6620."
    assert "7395" not in "".join(hit.generation.pieces)


def test_repeat_token_starts_on_third_hit():
    eng = pipeline("repeat_token")
    tasks = [run(eng, RECALL, f"r{i}").generation.task for i in range(5)]
    assert tasks == ["recall", "recall", "recall", "degenerate", "degenerate"]


def test_foreign_state_restores_another_memo_but_keeps_this_question():
    eng = pipeline("foreign_state", seed=0)
    memo_b = MEMO.replace("7395-2841-6620", "1836-5072-9914").replace("Memo 1.", "Memo 2, a longer title.")
    summary_b = memo_b + "\n\nQuestion: Summarize section three.\nAnswer:"
    run(eng, RECALL, "a0")
    run(eng, summary_b, "b0")
    foreign = 0
    for i in range(12):
        adm = run(eng, RECALL, f"a{i + 1}")
        text = "".join(t.text for t in adm.state)
        assert text.endswith("Question: What is the reconciliation code?\nAnswer:")
        answer = "".join(adm.generation.pieces)
        assert answer in (" 7395-2841-6620.", " 1836-5072-9914.")
        foreign += answer == " 1836-5072-9914."
        run(eng, summary_b, f"b{i + 1}")
    assert 2 <= foreign <= 10
