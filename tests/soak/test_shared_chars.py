"""shared_chars (tui/core/soak/record.py): the leading characters two prompts share, found by galloping and
halving in place; held equal to a character-by-character count."""

from __future__ import annotations

import random

import pytest

from tui.core.soak.record import shared_chars


def counted(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@pytest.mark.parametrize("a, b, expected", [
    ("", "", 0), ("", "abc", 0), ("abc", "abc", 3), ("abc", "abcd", 3), ("abcd", "abc", 3),
    ("xbc", "abc", 0), ("abx", "aby", 2), ("m" * 9000 + "A", "m" * 9000 + "B", 9000),
    ("m" * 64 + "A", "m" * 64 + "B", 64), ("m" * 63 + "A", "m" * 63 + "B", 63), ("m" * 65 + "A", "m" * 65, 65),
])
def test_exact_counts_at_the_edges_of_each_stretch(a, b, expected):
    assert shared_chars(a, b) == expected == shared_chars(b, a)


def test_agrees_with_a_character_by_character_count_on_random_prompts():
    rng = random.Random(7)
    for _ in range(5000):
        base = "".join(rng.choice("ab") for _ in range(rng.randint(0, 700)))
        a = base + "".join(rng.choice("abc") for _ in range(rng.randint(0, 40)))
        b = base[:rng.randint(0, len(base))] + "".join(rng.choice("abc") for _ in range(rng.randint(0, 40)))
        assert shared_chars(a, b) == counted(a, b) == shared_chars(b, a)


def test_prompt_key_is_kept_per_spec_and_tells_prompts_and_identities_apart():
    import dataclasses

    from tui.core.server.client import RequestSpec
    from tui.core.soak.record import prompt_key

    spec = RequestSpec(api="completions", max_tokens=12, prompt="memo " * 100, model="m")
    key = prompt_key(spec)
    assert prompt_key(spec) == key
    assert prompt_key(dataclasses.replace(spec, salt="s")) == key                 # a salted re-send: the same prompt
    assert prompt_key(dataclasses.replace(spec, prompt=spec.prompt + "Q")) != key
    assert prompt_key(dataclasses.replace(spec, model="other")) != key
    assert prompt_key(dataclasses.replace(spec, extra={"lora": [1]})) != key
    chat = RequestSpec(api="chat", max_tokens=12, messages=[{"role": "user", "content": "hi"}])
    assert prompt_key(chat) != prompt_key(dataclasses.replace(chat, messages=[{"role": "user", "content": "ho"}]))


def test_prompt_key_of_a_copy_holding_the_same_prompt_string_is_the_hashed_one():
    """Each send copies its spec (its own request id): the key is kept by the prompt string too, and
    still tells models, adapter fields and an equal prompt in another string apart exactly as hashing does."""
    import dataclasses
    import hashlib

    from tui.core.server.client import RequestSpec
    from tui.core.soak import record

    text = "memo two " * 100
    spec = RequestSpec(api="completions", max_tokens=12, prompt=text, model="m")
    key = record.prompt_key(spec)
    assert key == hashlib.sha1((text + "\x00model:m").encode()).hexdigest()
    copies = [dataclasses.replace(spec, request_id=f"r{i}") for i in range(3)]
    assert [record.prompt_key(c) for c in copies] == [key] * 3
    assert id(text) in record._keys_by_text
    other_model = dataclasses.replace(spec, model="n", request_id="r9")
    assert record.prompt_key(other_model) == hashlib.sha1((text + "\x00model:n").encode()).hexdigest()
    assert record.prompt_key(dataclasses.replace(spec, extra={"lora": [1]}, request_id="r8")) not in (key,)
    equal_text = "".join(["memo two "] * 100)          # equal, another object: hashed, the same key
    assert equal_text is not text and record.prompt_key(dataclasses.replace(spec, prompt=equal_text)) == key


def test_a_memo_asked_the_same_question_again_is_the_same_prompt_string():
    """joined_prompt gives one string object for a memo's text and a question, so prompt_key finds a
    rotation round's prompt by its string instead of hashing it again; another text, another question, or
    an equal text in another object is joined anew, and every join equals context + suffix."""
    from tui.core.soak import record

    memo = "A memo. " * 500
    first = record.joined_prompt(memo, " Q: the code?")
    assert first == memo + " Q: the code?" and record.joined_prompt(memo, " Q: the code?") is first
    assert record.joined_prompt(memo, " Q: a summary?") == memo + " Q: a summary?"
    twin = "".join(["A memo. "] * 500)
    again = record.joined_prompt(twin, " Q: the code?")
    assert again == first and again is not first
    for i in range(record.KEEP_JOINED + 5):                   # bounded: the oldest go first
        record.joined_prompt(f"memo {i}", "?")
    assert len(record._joined) == record.KEEP_JOINED
