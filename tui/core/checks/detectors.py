"""Pure detectors over answer text. No I/O, no state: each is unit-tested with exact offsets."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Mapping

# A four-digit group not glued to other digits.
_GROUP = re.compile(r"(?<!\d)\d{4}(?!\d)")
# A whole code, tolerant of the separators a model might reformat it with.
_SEPARATORS = r"[\s\-\u2010-\u2015.,/]{0,3}"


@dataclass(frozen=True)
class Recall:
    status: str                 # "exact" | "partial" | "missing"
    offset: int | None          # where the code (or its first recognised group) starts
    matched: str | None

    @property
    def exact(self) -> bool:
        return self.status == "exact"


def check_recall(answer: str, code: str) -> Recall:
    at = answer.find(code)
    if at >= 0:
        return Recall("exact", at, code)
    groups = code.split("-")
    loose = re.search(_SEPARATORS.join(groups), answer)
    if loose:
        return Recall("partial", loose.start(), loose.group(0))
    for match in _GROUP.finditer(answer):
        if match.group(0) in groups:
            return Recall("partial", match.start(), match.group(0))
    return Recall("missing", None, None)


@dataclass(frozen=True)
class ForeignCode:
    code: str
    owner: str                  # memo id that owns the code
    offset: int                 # first character of the first matched group
    groups: int                 # how many of its three groups appear (3 = whole code)
    matched: str

    @property
    def whole(self) -> bool:
        return self.groups >= 2


def find_foreign_codes(answer: str, registry: Mapping[str, str], own_code: str | None) -> list[ForeignCode]:
    """Registered codes of other memos that appear in the answer, by character offset.

    Groups are unique across a run, so one group is attributable to exactly one code; two or
    more groups (or the whole code) make the attribution unambiguous. The registry is read only
    when the answer holds a group not of its own code (most answers hold none)."""
    own_groups = own_code.split("-") if own_code else ()
    if not (groups := [m for m in _GROUP.finditer(answer) if m.group(0) not in own_groups]):
        return []
    group_owner = {group: code for code in registry if code != own_code for group in code.split("-")}
    found: dict[str, list[re.Match]] = {}
    for match in groups:
        code = group_owner.get(match.group(0))
        if code is not None:
            found.setdefault(code, []).append(match)
    result = []
    for code, matches in found.items():
        distinct = {m.group(0) for m in matches}
        first = matches[0]
        whole = re.search(_SEPARATORS.join(code.split("-")), answer)
        start = whole.start() if whole else first.start()
        matched = whole.group(0) if whole else first.group(0)
        result.append(ForeignCode(code, registry[code], start, 3 if whole else len(distinct), matched))
    return sorted(result, key=lambda f: f.offset)


def four_digit_numbers(answer: str) -> int:
    """How many four-digit numbers (not glued to other digits) the answer writes."""
    return sum(1 for _ in _GROUP.finditer(answer))


def false_alarm_odds(numbers: int, registered_groups: int) -> float:
    """The chance that an answer writing `numbers` four-digit numbers of its own accord hits at least
    one of `registered_groups` planted groups: 1 - (1 - g/9000)^n. Codes use groups 1000-9999, so a
    number the model makes up is one of 9,000 (the issue's "groups / 10^4" is this, rounded)."""
    if numbers <= 0 or registered_groups <= 0:
        return 0.0
    p = min(1.0, registered_groups / 9000)
    return 1.0 - (1.0 - p) ** numbers


def is_empty(answer: str) -> bool:
    return answer.strip() == ""


@dataclass(frozen=True)
class Repetition:
    unit: str
    count: int
    offset: int


_REPEAT = re.compile(r"(.{1,12}?)\1{7,}", re.DOTALL)


def find_repetition(answer: str, min_repeats: int = 8, max_unit_chars: int = 12) -> Repetition | None:
    """A collapse into one repeated token: a short unit repeated at least `min_repeats` times.

    Whole-phrase loops (a base model repeating a sentence) are not a collapse; the unit is
    capped at one short word so "the the the ..." and "0000..." match and sentences do not.
    """
    if not _may_repeat(answer, min_repeats, max_unit_chars):
        return None                         # no stretch with a short period: the scan below cannot match
    pattern = _REPEAT if (min_repeats, max_unit_chars) == (8, 12) else \
        re.compile(rf"(.{{1,{max_unit_chars}}}?)\1{{{min_repeats - 1},}}", re.DOTALL)
    for match in pattern.finditer(answer):
        unit = match.group(1)
        if unit.strip() == "":
            continue                        # runs of whitespace are layout, not a collapse
        if len(unit.split()) > 1:
            continue
        count = len(match.group(0)) // len(unit)
        return Repetition(unit=unit, count=count, offset=match.start())
    return None


def _may_repeat(answer: str, min_repeats: int, max_unit_chars: int) -> bool:
    """A necessary condition for find_repetition's pattern, several times cheaper than the regex
    on a long answer: a unit of u characters repeated min_repeats times means answer[j] ==
    answer[j + u] for (min_repeats - 1) * u positions in a row. A character is 1 byte in ASCII (most
    answers), 4 in UTF-32, so the answer as one integer XOR itself shifted by u characters has that
    many zero bytes in a row (4 against 10 us for 71 characters, about 1% of a request at 128 streams)."""
    data, width = (answer.encode("ascii"), 1) if answer.isascii() else (answer.encode("utf-32-le"), 4)
    size, whole = len(data), int.from_bytes(data, "little")
    for unit in range(1, max_unit_chars + 1):
        shift, need = width * unit, width * (min_repeats - 1) * unit
        if size - shift < need:
            break
        same = (whole >> (8 * shift)) ^ (whole & ((1 << (8 * (size - shift))) - 1))   # data[shift:] ^ data[:-shift]
        if same.to_bytes(size - shift, "little").find(bytes(need)) >= 0:
            return True
    return False


def first_divergence(a: str, b: str) -> int | None:
    """Index of the first differing character; None when identical."""
    if a == b:
        return None
    limit = min(len(a), len(b))
    for i in range(limit):
        if a[i] != b[i]:
            return i
    return limit


def wrong_task(answer: str, task: str, own_code: str | None) -> int | None:
    """Offset where a non-recall answer gives the memo's own code (a candidate fluke, not a leak)."""
    if task == "recall" or not own_code:
        return None
    recall = check_recall(answer, own_code)
    return recall.offset if recall.status != "missing" else None


@dataclass(frozen=True)
class Determinism:
    kind: str                   # "identical" | "cache_path_divergence" | "kernel_nondeterminism"
    hit_vs_cold: int | None
    hit_vs_hit: int | None
    cold_vs_cold: int | None
    short_control: int | None   # first divergence among the short-memo runs, None if identical


def classify_determinism(cold: str, hits: list[str], cold_again: str, short_runs: list[str]) -> Determinism:
    """Greedy outputs cold, on two hits, and cold again under a fresh salt.

    hit != cold while hit == hit and cold == cold: the cache path diverges (red).
    hit != hit or cold != cold: the kernel is nondeterministic (informational, offsets shown):
    then hit vs cold tells nothing about the cache. The short control says whether the kernel
    is deterministic with no cache involved at all.
    """
    divergences = [d for d in (first_divergence(cold, hit) for hit in hits) if d is not None]
    hit_vs_cold = min(divergences) if divergences else None
    hit_vs_hit = next((d for d in (first_divergence(hits[0], other) for other in hits[1:]) if d is not None), None)
    cold_vs_cold = first_divergence(cold, cold_again)
    short = next((d for d in (first_divergence(short_runs[0], other) for other in short_runs[1:]) if d is not None),
                 None)
    if hit_vs_hit is not None or cold_vs_cold is not None:
        kind = "kernel_nondeterminism"
    elif hit_vs_cold is None:
        kind = "identical"
    else:
        kind = "cache_path_divergence"
    return Determinism(kind, hit_vs_cold, hit_vs_hit, cold_vs_cold, short)


@dataclass(frozen=True)
class LogprobComparison:
    token: int | None           # index of the first output token that differs (None: same tokens)
    max_prefix_delta: float     # largest |logprob difference| over the tokens both paths share
    margin: float | None        # at the first differing token: how far behind, on the first path,
                                # the second path's token was (None: not among the first's top-k)

    def near_tie(self, tolerance: float) -> bool:
        """The paths agree to within `tolerance` until a near-tied choice flips: numerics, not state."""
        return self.max_prefix_delta <= tolerance and self.margin is not None and self.margin <= tolerance


def compare_logprobs(a: list[list], b: list[list]) -> LogprobComparison:
    """Compare two greedy runs token by token ([token, logprob, [[alt, logprob], ...]] each)."""
    delta = 0.0
    for i, (x, y) in enumerate(zip(a, b)):
        if x[0] != y[0]:
            alternatives = {tok: lp for tok, lp in x[2] if lp is not None}
            margin = None
            if y[0] in alternatives and x[1] is not None:
                margin = round(x[1] - alternatives[y[0]], 6)
            return LogprobComparison(i, round(delta, 6), margin)
        if x[1] is not None and y[1] is not None:
            delta = max(delta, abs(x[1] - y[1]))
    return LogprobComparison(None, round(delta, 6), None)


# Alternatives below this log-probability (1%) are left out of the distance: their values move with
# the batch shape while the state is the same. Measured here on llama.cpp Gemma Q4_K, 113 hits cold vs
# hit with all 12 greedy tokens the same: alternatives near -9.5 nats (p 0.0001) moved by up to 0.76
# nats, alternatives above 1% by at most 0.38, the chosen tokens by at most 0.19 (vLLM CPU: 2.7e-5).
# A wrong state moves the tokens the model actually considers, and the chosen one always counts.
# false-alarm margin: it shapes the fingerprint rows of benchmarks/RESULTS.md (issue 26), not a row of its own.
ALTERNATIVE_FLOOR = -4.6

# A fingerprint matches when at most one position deviates beyond the tolerance, and that one by at
# most three times it. Why one spike is allowed: the clean llama.cpp quick soak in CI (2026-12-01) had a
# hit whose first token's runner-up moved 0.65 nats (p 0.08 vs 0.04) with every other position
# within 0.07, reproducibly (the hit's prefill split differs from the cold one); across 1,215 clean
# llama.cpp comparisons here (Gemma and the tiny hybrids) the second-largest position deviated at
# most 0.27 and the largest at most 0.65. A wrong state
# moves many positions: the vLLM mixed-LoRA batch leak deviated 0.51-0.68 at two positions or more
# in 7 of its 8 caught comparisons, and all llama.cpp and reference-server faults did.
# Raised from 2.0 to 3.0 (2026-12-01, third session): the clean llama.cpp quick soak failed on a
# conversation hit whose only deviation was one alternative above 1% at output token 8 (p 0.056 cold,
# 0.020 on the hit: 1.01 nats; second-largest position 0.23, the chosen tokens within 0.06),
# reproduced on 5 re-hits and never cold. The faults this project has caught move a second position
# beyond the tolerance too (llama.cpp's base resuming adapter b's cache: 0.93 and 0.74), and the
# partition phase on vLLM judges at its calibrated 0.05 (a spike may reach 0.15 there).
# false-alarm margin: see benchmarks/RESULTS.md, fingerprint largest: llama.cpp Gemma 3.93x (2nd-largest 1.85x).
SPIKE_FACTOR = 3.0


@dataclass(frozen=True)
class FingerprintMatch:
    """How close a run is to a fingerprint (both [token, logprob, [[alt, logprob], ...]] lists)."""

    agreeing: int               # leading tokens that are the same
    same_tokens: bool           # every compared token the same
    distance: float             # largest |logprob difference| over the chosen tokens and the top-k
                                # entries both share above ALTERNATIVE_FLOOR in either run, up to and
                                # including the first differing token (inf: nothing shared)

    second: float = 0.0         # the second-largest per-position deviation (see SPIKE_FACTOR)

    def matches(self, tolerance: float) -> bool:
        return self.same_tokens and self.second <= tolerance and self.distance <= SPIKE_FACTOR * tolerance

    def closer_than(self, other: "FingerprintMatch") -> bool:
        """More leading tokens in common, or as many and smaller log-probability differences."""
        return (self.agreeing, -self.distance) > (other.agreeing, -other.distance)


def position_entries(position: list) -> dict:
    entries = {tok: lp for tok, lp in position[2] if lp is not None}
    if position[1] is not None:
        entries.setdefault(position[0], position[1])
    return entries


def fingerprint_match(run: list[list], fingerprint: list[list], tokens: int) -> FingerprintMatch:
    a, b = run[:tokens], fingerprint[:tokens]
    agreeing = 0
    deviations = [0.0, 0.0]      # the two largest per-position deviations
    shared = False
    for x, y in zip(a, b):
        mine, theirs = position_entries(x), position_entries(y)
        here = 0.0
        for tok in mine.keys() & theirs.keys():
            chosen = tok in (x[0], y[0])
            if not chosen and max(mine[tok], theirs[tok]) < ALTERNATIVE_FLOOR:
                continue
            shared = True
            here = max(here, abs(mine[tok] - theirs[tok]))
        deviations = sorted([*deviations, here], reverse=True)[:2]
        if x[0] != y[0]:
            break
        agreeing += 1
    same = agreeing == len(a) == len(b)
    if not shared:
        return FingerprintMatch(agreeing, same, float("inf"), float("inf"))
    return FingerprintMatch(agreeing, same, round(deviations[0], 6), round(deviations[1], 6))


def fingerprint_prepare(run: list[list], tokens: int) -> tuple:
    """A run's first `tokens` positions as (chosen token, entries) pairs, made once: a fingerprint
    compared with many runs (FingerprintBook) is not re-read each time. prepared_match(prepare(a),
    prepare(b)) == fingerprint_match(a, b) (tests/checks/test_fingerprint_prepared.py holds them equal;
    fingerprint_match stays as it is: the repro script carries its source)."""
    return tuple((x[0], position_entries(x)) for x in run[:tokens])


def prepared_match(a: tuple, b: tuple) -> FingerprintMatch:
    agreeing = 0
    first = second = 0.0         # the two largest per-position deviations
    shared = False
    floor = ALTERNATIVE_FLOOR
    for (xa, mine), (yb, theirs) in zip(a, b):
        here = 0.0
        # one side's entries looked up in the other's, not a set made of both: 9 against 14 us a pair
        # (12 positions of 5 entries, 2026-12-06); values are never None here (position_entries)
        for tok, m in mine.items():
            t = theirs.get(tok)
            if t is None or (m < floor and t < floor and tok != xa and tok != yb):
                continue
            shared = True
            gap = m - t if m > t else t - m
            if gap > here:
                here = gap
        if here > first:
            first, second = here, first
        elif here > second:
            second = here
        if xa != yb:
            break
        agreeing += 1
    same = agreeing == len(a) == len(b)
    if not shared:
        return FingerprintMatch(agreeing, same, float("inf"), float("inf"))
    return FingerprintMatch(agreeing, same, round(first, 6), round(second, 6))


def closer_needs(tokens: int) -> int:
    """Leading tokens another memo's fingerprint shares with a run to be closer than its own (FingerprintBook too)."""
    return max(2, -(-tokens // 3))


def classify_fingerprint(own: FingerprintMatch, others: dict[str, FingerprintMatch],
                         tolerance: float, tokens: int = 12) -> tuple[str, str | None]:
    """("match", None) | ("foreign_state", memo) when another memo's fingerprint is closer than the
    run's own | ("mismatch", None) when it differs from its own and is closer to no other.

    "Closer" needs real agreement with that other memo: a third of the tokens (at least two) the
    same, and their log-probabilities the same within the tolerance. Continuations often share
    a first word or two ("The memo says"), but not the log-probabilities of another state."""
    if own.matches(tolerance):
        return "match", None
    needed = closer_needs(tokens)
    # A run on its own fingerprint within the tolerance until its tokens part took a tie there: another memo is
    # closer only by more tokens. Measured, vLLM 0.26, H200, 128 streams (run E): a clean hit 11 tokens with its
    # own cold run (0.0357 second-largest, 0.0513 at most) and 11 with another's (0.0445): a false FAIL.
    own_path = own.second <= tolerance and own.distance <= SPIKE_FACTOR * tolerance
    closer = [(memo, m) for memo, m in others.items()
              if m.closer_than(own) and m.agreeing >= needed and m.distance <= tolerance
              and not (own_path and m.agreeing <= own.agreeing)]
    if closer:
        memo, _ = max(closer, key=lambda item: (item[1].agreeing, -item[1].distance))
        return "foreign_state", memo
    return "mismatch", None


def near_tie_explains(match: "FingerprintMatch", flip: LogprobComparison, tolerance: float) -> bool:
    """A fingerprint that differs is numerics when a near-tied token flips *inside it*, after
    log-probabilities that agreed within the tolerance. When every fingerprint token is the same
    the deviation is in the log-probabilities themselves, and a flip later in the answer does not
    explain it (CI, 2026-12-01: llama.cpp's base request resuming adapter b's cache, 12 tokens the
    same and 0.93 nats apart, was excused by a 0.21-nat flip at output token 16)."""
    return (not match.same_tokens and flip.token is not None and flip.token == match.agreeing
            and flip.near_tie(tolerance))


# The partition phase's tolerance, calibrated on the server's own noise: the largest deviation of
# same-identity answers (repeats alone, and the identity twice at once) from the identity's cold
# fingerprint, times CALIBRATION_FACTOR, at least CALIBRATION_FLOOR, never above the scenario's.
# Why: one tolerance cannot fit both engines here. llama.cpp Gemma Q4_K with adapters moves up to
# 0.41 nats between clean cold and hit runs, so the scenario says 0.5; vLLM CPU float32 moves at
# most 2.1e-5, and its real mixed-LoRA batch fault (a base request decoded in a batch with adapter
# requests) moved the base's answers by 0.44-0.46 (second-largest position 0.24-0.40), under 0.5:
# 2 runs of 2 on 2026-12-01 passed with the fault present. Calibrated, vLLM's tolerance is the
# floor, 0.05, and those answers are off by 5-9 times it; llama.cpp's stays 0.5. A fault that moves
# the same-identity answers too only raises the tolerance back towards the scenario's.
# false-alarm margin: not measured yet (benchmarks/RESULTS.md, issue 26: no scenario there runs the partition phase).
CALIBRATION_FACTOR = 10.0
CALIBRATION_FLOOR = 0.05


def calibrated_tolerance(configured: float, clean_distances: list[float]) -> float:
    """The tolerance to judge with, from the distances of answers known to be the same state."""
    finite = [d for d in clean_distances if math.isfinite(d)]
    if not finite or len(finite) < len(clean_distances):
        return configured                   # nothing measured, or an answer unlike its own state
    return min(configured, max(CALIBRATION_FLOOR, CALIBRATION_FACTOR * max(finite)))
