"""The pure detectors, with exact offsets."""

import math
import random
import re

import pytest

from tui.core.checks.detectors import (check_recall, classify_determinism, find_foreign_codes, find_repetition,
                                       first_divergence, is_empty, wrong_task)

CODE = "7395-2841-6620"
OTHER = "4817-3590-2764"
REGISTRY = {CODE: "m01", OTHER: "m02"}


def test_recall_exact_with_offset():
    r = check_recall(" 7395-2841-6620.", CODE)
    assert (r.status, r.offset, r.matched) == ("exact", 1, CODE)


def test_recall_reformatted_is_partial_at_its_offset():
    r = check_recall("code: 7395 2841 6620", CODE)
    assert (r.status, r.offset) == ("partial", 6)


def test_recall_one_group_is_partial():
    r = check_recall("it starts with 2841 I think", CODE)
    assert (r.status, r.offset, r.matched) == ("partial", 15, "2841")


def test_recall_missing():
    assert check_recall("not stated in the memo", CODE).status == "missing"
    # a longer digit run containing a group is not that group
    assert check_recall("x 73951 y", CODE).status == "missing"


def test_foreign_code_whole_with_offset_and_owner():
    found = find_foreign_codes("The code is 4817-3590-2764.", REGISTRY, CODE)
    assert len(found) == 1
    f = found[0]
    assert (f.code, f.owner, f.offset, f.groups, f.whole) == (OTHER, "m02", 12, 3, True)


def test_own_code_is_not_foreign():
    assert find_foreign_codes("7395-2841-6620", REGISTRY, CODE) == []


def test_a_foreign_group_beside_the_own_code_is_still_found():
    found = find_foreign_codes("7395-2841-6620, then 3590", REGISTRY, CODE)
    assert [(f.code, f.offset, f.groups) for f in found] == [(OTHER, 21, 1)]


def test_foreign_single_group_is_partial_attribution():
    found = find_foreign_codes("about 3590 pallets", REGISTRY, CODE)
    assert [(f.code, f.offset, f.groups, f.whole) for f in found] == [(OTHER, 6, 1, False)]


def test_foreign_two_groups_reformatted_are_whole():
    found = find_foreign_codes("4817 / 2764", REGISTRY, CODE)
    assert found[0].groups == 2 and found[0].whole


def test_foreign_codes_sorted_by_offset():
    third = "5163-8247-9305"
    registry = dict(REGISTRY, **{third: "m03"})
    found = find_foreign_codes(f"{third} then {OTHER}", registry, CODE)
    assert [f.owner for f in found] == ["m03", "m02"]
    assert found[1].offset == len(third) + 6


def test_empty():
    assert is_empty("") and is_empty(" \n\t") and not is_empty(" a")


def test_repetition_single_token_collapse():
    text = "The answer is" + " the" * 12
    rep = find_repetition(text)
    assert rep is not None and rep.unit.strip() == "the" and rep.offset == 13 and rep.count >= 8


def test_repetition_digits():
    rep = find_repetition("code 0000000000000000")
    assert rep.unit == "0" and rep.offset == 5 and rep.count == 16


def test_repetition_ignores_phrase_loops_and_short_runs():
    loop = "The 10-year history of the 10-year history of the 10-year history of the 10-year history"
    assert find_repetition(loop) is None
    assert find_repetition("ha ha ha") is None
    assert find_repetition("a" + " " * 40 + "b") is None


def test_first_divergence():
    assert first_divergence("abc", "abc") is None
    assert first_divergence("abcd", "abXd") == 2
    assert first_divergence("abc", "abcdef") == 3
    assert first_divergence("", "x") == 0


def test_wrong_task():
    assert wrong_task(" 7395-2841-6620", "summary", CODE) == 1
    assert wrong_task(" 7395-2841-6620", "recall", CODE) is None
    assert wrong_task("section three is about pallets", "summary", CODE) is None


def test_determinism_identical():
    d = classify_determinism("abc", ["abc", "abc"], "abc", ["s", "s", "s"])
    assert d.kind == "identical" and d.short_control is None


def test_determinism_cache_path_divergence():
    d = classify_determinism("abcdef", ["abXdef", "abXdef"], "abcdef", ["s", "s"])
    assert (d.kind, d.hit_vs_cold, d.hit_vs_hit, d.cold_vs_cold) == ("cache_path_divergence", 2, None, None)
    from tui.core.soak.phases.determinism import divergence_offsets
    assert divergence_offsets(d) == "hit vs cold at 2, hit vs hit the same, cold vs cold the same, short control the same"


def test_determinism_hits_that_disagree_with_each_other_are_the_kernel():
    # cold == cold by chance while the hits vary: still nondeterminism, never a red verdict
    d = classify_determinism("abcdef", ["abcXef", "abcdeY"], "abcdef", ["s", "s"])
    assert (d.kind, d.hit_vs_cold, d.hit_vs_hit, d.cold_vs_cold) == ("kernel_nondeterminism", 3, 3, None)


def test_determinism_kernel_nondeterminism_shows_both_offsets():
    d = classify_determinism("abcdef", ["abcXef", "abcdeY"], "abcdeZ", ["s", "t"])
    assert (d.kind, d.hit_vs_cold, d.hit_vs_hit, d.cold_vs_cold, d.short_control) == \
        ("kernel_nondeterminism", 3, 3, 5, 0)
    d = classify_determinism("abcdef", ["abcdef", "abcdef"], "abZdef", ["s", "s"])
    assert (d.kind, d.cold_vs_cold) == ("kernel_nondeterminism", 2)


def test_isolation_classification_counts():
    from tui.core.soak.isolation import classify
    assert classify("foreign_code", 4, 0, 0)[0] == "leak"
    assert classify("foreign_code", 4, 4, 0)[0] == "leak"
    verdict, detail = classify("recall_miss", 4, 3, 0)
    assert verdict == "hit_path_corruption" and "3/4 hits" in detail
    assert classify("recall_miss", 4, 0, 0)[0] == "fluke"
    verdict, detail = classify("repetition", 4, 2, 2)
    assert verdict == "fluke" and "the model, not the cache" in detail
    assert classify("wrong_task", 4, 0, 0)[0] == "fluke"
    # another request's state seen by fingerprint: a leak only when it reproduces on hits, never cold
    assert classify("foreign_state", 4, 2, 0)[0] == "leak"
    assert classify("foreign_state", 4, 0, 0)[0] == "fluke"
    assert classify("foreign_state", 4, 2, 1)[0] == "fluke"
    # one foreign group too likely by chance: like a fingerprint, it must reproduce
    assert classify("foreign_code", 4, 0, 0, whole_code=False)[0] == "fluke"
    assert classify("foreign_code", 4, 3, 0, whole_code=False)[0] == "leak"


def test_isolation_is_only_for_kinds_about_one_answer():
    from tui.core.soak.isolation import why_not_isolated
    for kind in ("foreign_code", "foreign_state", "recall_miss", "empty_answer", "repetition", "wrong_task",
                 "cache_path_divergence", "fingerprint_mismatch"):
        assert why_not_isolated(kind) is None, kind
    for kind in ("cold_not_cold", "no_hits", "hits_disagree", "hit_not_faster", "server_error", "engine_log"):
        assert why_not_isolated(kind), kind


def test_false_alarm_odds_of_one_foreign_group():
    from tui.core.checks.detectors import false_alarm_odds, four_digit_numbers
    assert four_digit_numbers(" 7395-2841-6620. Also 12345 and 1999.") == 4
    assert false_alarm_odds(0, 60) == 0.0 and false_alarm_odds(3, 0) == 0.0
    assert abs(false_alarm_odds(1, 90) - 0.01) < 1e-12
    assert abs(false_alarm_odds(3, 9) - (1 - (1 - 9 / 9000) ** 3)) < 1e-12


def test_compare_logprobs_near_tie_and_real_divergence():
    from tui.core.checks.detectors import compare_logprobs
    cold = [[" a", -0.1, [[" a", -0.1]]], [" b", -0.50, [[" b", -0.50], [" c", -0.52]]], [" d", -1.0, []]]
    hit_tie = [[" a", -0.1004, []], [" c", -0.51, []], [" e", -1.0, []]]
    cmp = compare_logprobs(cold, hit_tie)
    assert (cmp.token, cmp.max_prefix_delta, cmp.margin) == (1, 0.0004, 0.02)
    assert cmp.near_tie(0.05) and not cmp.near_tie(0.01)
    hit_far = [[" a", -2.5, []], [" c", -0.51, []]]
    assert not compare_logprobs(cold, hit_far).near_tie(0.05)          # the state before it differs
    hit_unlisted = [[" a", -0.1, []], [" z", -0.2, []]]
    cmp = compare_logprobs(cold, hit_unlisted)
    assert cmp.margin is None and not cmp.near_tie(1.0)               # not even among cold's top-k
    assert compare_logprobs(cold, cold).token is None


def test_parse_logprobs_both_shapes():
    from tui.core.server.wire import parse_logprobs
    content = {"content": [{"token": " the", "logprob": -1.59, "top_logprobs": [{"token": " the", "logprob": -1.59},
                                                                              {"token": " a", "logprob": -2.29}]}]}
    assert parse_logprobs(content) == [[" the", -1.59, [[" the", -1.59], [" a", -2.29]]]]
    with_ids = {"content": [{"id": 506, "token": "", "logprob": -1.0, "top_logprobs": [{"id": 506, "token": "", "logprob": -1.0}]}]}
    assert parse_logprobs(with_ids) == [[506, -1.0, [[506, -1.0]]]]
    legacy = {"tokens": [" the"], "token_logprobs": [-1.59], "top_logprobs": [{" the": -1.59, " a": -2.29}]}
    assert parse_logprobs(legacy) == [[" the", -1.59, [[" the", -1.59], [" a", -2.29]]]]


def _fp(*tokens):
    """[token, logprob, top] entries from (token, logprob, {alt: logprob}) triples."""
    return [[t, lp, [[k, v] for k, v in top.items()]] for t, lp, top in tokens]


A = _fp(("x", -0.1, {"x": -0.1, "y": -2.0}), ("z", -0.5, {"z": -0.5, "w": -1.0}))
B = _fp(("x", -0.3, {"x": -0.3, "y": -1.5}), ("z", -0.2, {"z": -0.2, "w": -2.0}))     # same tokens, other lps


def test_fingerprint_exact_match_and_tolerance():
    from tui.core.checks.detectors import fingerprint_match
    m = fingerprint_match(A, A, 12)
    assert (m.agreeing, m.same_tokens, m.distance) == (2, True, 0.0) and m.matches(0.0)
    m = fingerprint_match(B, A, 12)
    assert m.same_tokens and (m.distance, m.second) == (1.0, 0.5)       # position 1 moved 1.0, position 0 0.5
    assert not m.matches(0.45) and m.matches(0.5) and m.matches(1.0)


def test_fingerprint_allows_one_spike_up_to_three_times_the_tolerance():
    from tui.core.checks.detectors import fingerprint_match
    cold = _fp(*[("x", -0.1, {"x": -0.1, "y": -3.0})] * 12)
    # one runner-up moved 0.65 at the first token, the rest within 0.05 (llama.cpp's prefill split)
    spike = _fp(("x", -0.15, {"x": -0.15, "y": -2.35}), *[("x", -0.12, {"x": -0.12, "y": -3.05})] * 11)
    m = fingerprint_match(spike, cold, 12)
    assert (m.distance, m.second) == (0.65, 0.05) and m.matches(0.5)
    # the same spike beyond three times the tolerance is a deviation
    assert m.matches(0.22) and not m.matches(0.2)
    # two positions beyond the tolerance: a state that moves many tokens
    two = _fp(*[("x", -0.15, {"x": -0.15, "y": -2.35})] * 2, *[("x", -0.1, {"x": -0.1, "y": -3.0})] * 10)
    m = fingerprint_match(two, cold, 12)
    assert (m.distance, m.second) == (0.65, 0.65) and not m.matches(0.5)


def test_fingerprint_same_text_different_logprobs_is_told_apart():
    from tui.core.checks.detectors import classify_fingerprint, fingerprint_match
    run = B                                  # a hit that reproduces memo B's state, asked as memo A
    own, other = fingerprint_match(run, A, 12), fingerprint_match(run, B, 12)
    assert other.distance == 0.0
    assert classify_fingerprint(own, {"mB": other}, 0.0, tokens=2) == ("foreign_state", "mB")
    # the same words as another memo, but not its log-probabilities: not its state
    shifted = _fp(("x", -0.31, {"x": -0.31}), ("z", -0.2, {"z": -0.2}))
    assert classify_fingerprint(own, {"mB": fingerprint_match(shifted, B, 12)}, 0.0, tokens=2) == ("mismatch", None)
    # one agreeing token is chance, not another memo's state
    assert classify_fingerprint(own, {"mB": other}, 0.0, tokens=12) == ("mismatch", None)


def test_fingerprint_mismatch_when_closer_to_no_other():
    from tui.core.checks.detectors import classify_fingerprint, fingerprint_match
    altered = _fp(("x", -0.1, {"x": -0.1, "y": -2.0}), ("q", -0.4, {"q": -0.4, "z": -0.9}))
    own = fingerprint_match(altered, A, 12)
    assert (own.agreeing, own.same_tokens) == (1, False) and own.distance == 0.4
    other = fingerprint_match(altered, B, 12)
    assert classify_fingerprint(own, {"mB": other}, 0.0, tokens=2) == ("mismatch", None)
    assert classify_fingerprint(fingerprint_match(A, A, 12), {"mB": other}, 0.0) == ("match", None)


def test_a_run_on_its_own_path_until_a_tie_is_not_another_memos_state():
    """Run E's false FAIL at 128 streams: 11 tokens with its own cold run (0.0357 second, 0.0513 at most) and
    11 with another memo's (0.0445): its own state taking a tie, not the other memo's. A foreign state that
    agrees on more tokens, or a run off its own path before its tokens part, is still foreign_state."""
    from tui.core.checks.detectors import FingerprintMatch, classify_fingerprint
    own = FingerprintMatch(11, False, 0.0513, 0.0357)
    other = FingerprintMatch(11, False, 0.0445, 0.03)
    assert classify_fingerprint(own, {"m72": other}, 0.05) == ("mismatch", None)
    assert classify_fingerprint(own, {"m72": FingerprintMatch(12, True, 0.02, 0.01)}, 0.05) == ("foreign_state", "m72")
    off_path = FingerprintMatch(11, False, 0.31, 0.2)        # its own prefix beyond the tolerance
    assert classify_fingerprint(off_path, {"m72": other}, 0.05) == ("foreign_state", "m72")


def test_fingerprint_only_compares_the_leading_tokens():
    from tui.core.checks.detectors import fingerprint_match
    longer = A + _fp(("tail", -3.0, {}))
    assert fingerprint_match(longer, A, 2).same_tokens
    assert not fingerprint_match(longer, A, 3).same_tokens


def _repetition_by_regex_alone(text: str, min_repeats: int = 8, max_unit: int = 12):
    pattern = re.compile(rf"(.{{1,{max_unit}}}?)\1{{{min_repeats - 1},}}", re.DOTALL)
    for match in pattern.finditer(text):
        unit = match.group(1)
        if unit.strip() and len(unit.split()) == 1:
            return (unit, len(match.group(0)) // len(unit), match.start())
    return None


@pytest.mark.parametrize("alphabet", [["a", "b", " ", "é", "7", "-", "\U0001F600", "\n"], ["a", "b", " ", "7", "-", "\n"]],
                         ids=["unicode", "ascii"])
def test_repetition_prefilter_never_hides_what_the_scan_finds(alphabet):
    """find_repetition skips its regex when no stretch of the answer has a short period; on random
    answers over a small alphabet (many near-misses: 7 repeats, units of 12 and 13, repeats cut by
    one character, non-ASCII, or ASCII only: the prefilter's one-byte path) its result equals the
    regex's alone."""
    rng = random.Random(7)
    found = 0
    for case in range(600):
        pieces = []
        for _ in range(rng.randint(1, 6)):
            if rng.random() < 0.5:
                unit = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 13)))
                run = unit * rng.randint(5, 9)
                if rng.random() < 0.3:
                    cut = rng.randrange(len(run))
                    run = run[:cut] + "Z" + run[cut + 1:]
                pieces.append(run)
            else:
                pieces.append("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))))
        text = "".join(pieces)
        expected = _repetition_by_regex_alone(text)
        got = find_repetition(text)
        assert (None if got is None else (got.unit, got.count, got.offset)) == expected, (case, text)
        found += expected is not None
    assert 100 < found < 500                # both outcomes were exercised


def test_fingerprint_distance_leaves_out_unlikely_alternatives():
    from tui.core.checks.detectors import fingerprint_match
    cold = _fp(("x", -0.1, {"x": -0.1, "y": -3.0, "t": -9.5}))
    # the rare alternative moved by 0.8 nats (batch-shape numerics, measured on llama.cpp): same state
    hit = _fp(("x", -0.12, {"x": -0.12, "y": -3.1, "t": -8.7}))
    assert fingerprint_match(hit, cold, 12).distance == 0.1
    # an alternative the model considers (above 1%) counts
    moved = _fp(("x", -0.12, {"x": -0.12, "y": -2.2, "t": -9.5}))
    assert fingerprint_match(moved, cold, 12).distance == 0.8
    # the chosen token always counts, however unlikely
    unlikely = _fp(("x", -6.0, {"x": -6.0})), _fp(("x", -7.0, {"x": -7.0}))
    assert fingerprint_match(*unlikely, 12).distance == 1.0


def test_the_calibrated_tolerance_follows_the_servers_noise_within_the_scenarios():
    from tui.core.checks.detectors import CALIBRATION_FACTOR, CALIBRATION_FLOOR, calibrated_tolerance
    assert calibrated_tolerance(0.5, [2.1e-5, 0.0, 1.3e-5]) == CALIBRATION_FLOOR      # vLLM CPU: the floor
    assert calibrated_tolerance(0.5, [0.02, 0.01]) == pytest.approx(0.02 * CALIBRATION_FACTOR)
    assert calibrated_tolerance(0.5, [0.41, 0.2]) == 0.5                            # llama.cpp: the scenario's
    assert calibrated_tolerance(0.5, []) == 0.5                                     # nothing measured
    assert calibrated_tolerance(0.5, [0.0, math.inf]) == 0.5                        # an answer unlike its state
    assert calibrated_tolerance(0.03, [0.0]) == 0.03                                # never above the scenario's


def test_a_near_tie_explains_a_fingerprint_only_when_it_flips_inside_it():
    from tui.core.checks.detectors import compare_logprobs, fingerprint_match, near_tie_explains

    def pos(tok, lp, alt, alt_lp):
        return [tok, lp, [[tok, lp], [alt, alt_lp]]]
    cold = [pos("x", -0.1, "y", -3.0)] * 4 + [pos("p", -0.70, "q", -0.72)]
    drifted = [pos("x", -0.1, "y", -2.1)] * 4 + [pos("q", -0.70, "p", -0.71)]     # 0.9 off, flip at 4
    flipped = [pos("x", -0.1, "y", -3.0)] * 2 + [pos("y", -0.70, "x", -0.71)] + cold[3:]  # near tie at 2
    cold_tie = [pos("x", -0.1, "y", -3.0)] * 2 + [pos("x", -0.70, "y", -0.71)] + cold[3:]
    # the fingerprint is the first 4 tokens, all the same: 0.8 nats off, and a flip after it excuses nothing
    window = fingerprint_match(drifted, cold, 4)
    assert window.same_tokens and not window.matches(0.5) and window.distance == pytest.approx(0.9)
    later = compare_logprobs(cold, drifted)
    assert later.token == 4 and later.near_tie(0.5)          # the answer's flip is a near tie ...
    assert not near_tie_explains(window, later, 0.5)         # ... which does not explain this fingerprint
    # a near-tied flip inside the fingerprint, after agreeing log-probabilities: numerics
    inside = fingerprint_match(flipped, cold_tie, 4)
    assert not inside.same_tokens and inside.agreeing == 2
    assert near_tie_explains(inside, compare_logprobs(cold_tie, flipped), 0.5)
    # the same flip with a margin beyond the tolerance is not a near tie
    assert not near_tie_explains(inside, compare_logprobs(cold_tie, flipped), 0.005)
