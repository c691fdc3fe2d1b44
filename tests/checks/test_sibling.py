"""The sibling control (tui/core/soak/sibling.py): where no salt keeps caching on (llama.cpp), a hit's
reproducible deviation from its cold fingerprint is a FAIL only when it is more than SIBLING_FACTOR (3) times
what a restore of the same shape on a fresh memo costs, measured in the same run. Exact rules here; the
real llama.cpp runs (a clean server under a tolerance below its own noise, and a wrong state) are in
tests/real/test_real_sibling.py."""

from tui.core.checks.detectors import FingerprintMatch
from tui.core.server.wire import RequestSpec
from tui.core.soak.sibling import SIBLING_FACTOR, cost, sibling_explains, with_memo


def test_cost_is_the_second_largest_or_the_spike_over_its_allowance():
    assert cost(FingerprintMatch(12, True, 0.3, 0.27)) == 0.27            # llama.cpp Gemma's largest clean
    assert abs(cost(FingerprintMatch(12, True, 1.2, 0.1)) - 0.4) < 1e-12   # one spike of 1.2 / SPIKE_FACTOR 3
    assert cost(FingerprintMatch(0, False, float("inf"), 0.0)) == float("inf")


def test_a_hit_is_explained_only_by_a_sibling_at_least_a_third_as_far_whose_tokens_part_no_later():
    hit = FingerprintMatch(12, True, 0.7, 0.6)
    assert SIBLING_FACTOR == 3.0          # llama.cpp Gemma, clean: hit / sibling at most 1.44 (9 comparisons)
    assert sibling_explains(hit, FingerprintMatch(12, True, 0.25, 0.2))        # exactly a third: explained
    assert not sibling_explains(hit, FingerprintMatch(12, True, 0.2, 0.19))    # under a third: the FAIL stands
    assert not sibling_explains(hit, FingerprintMatch(12, True, 0.0, 0.0))     # a clean sibling: the FAIL stands
    assert sibling_explains(FingerprintMatch(12, True, 0.3, 0.247), FingerprintMatch(12, True, 0.2, 0.172))  # 1.44
    parted = FingerprintMatch(5, False, 0.4, 0.2)
    assert not sibling_explains(parted, FingerprintMatch(12, True, 0.6, 0.5))  # the sibling's tokens did not part
    assert sibling_explains(parted, FingerprintMatch(4, False, 0.4, 0.2))
    gone = FingerprintMatch(0, False, float("inf"), 0.0)
    assert sibling_explains(gone, gone) and not sibling_explains(gone, FingerprintMatch(12, True, 2.0, 1.0))


def test_the_memo_is_swapped_in_a_prompt_or_in_chat_messages_and_nowhere_else():
    spec = RequestSpec(api="completions", prompt="Memo A text.\n\nQuestion: the code?\nAnswer:", max_tokens=4)
    assert with_memo(spec, "Memo A text.", "Memo B text!").prompt == "Memo B text!\n\nQuestion: the code?\nAnswer:"
    assert with_memo(spec, "not there", "x") is None
    chat = RequestSpec(api="chat", messages=[{"role": "system", "content": "tools"}, {"role": "user", "content": "Memo A text. Hi"},
                                 {"role": "assistant", "content": None}], max_tokens=4)
    swapped = with_memo(chat, "Memo A text.", "Memo B.")
    assert [m["content"] for m in swapped.messages] == ["tools", "Memo B. Hi", None]
    assert with_memo(RequestSpec(api="chat", messages=[{"role": "user", "content": "other"}], max_tokens=4), "Memo A", "B") is None
