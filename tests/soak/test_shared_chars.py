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
