"""The run's cold fingerprints: each prompt's cold greedy tokens and top-k log-probabilities.

A hit is compared with the cold fingerprint of its own prompt and with every other memo's for the
same question: its own (within the tolerance) is a correct restore, another memo's is another
request's state (foreign_state). That only proves something when the memos' fingerprints are
apart: two memos are distinct when their cold fingerprints differ in a token or are more than the
tolerance plus a margin apart in log-probabilities. Distinctness is judged on cold runs only; a
phase that relies on fingerprints re-draws a memo that is not distinct (`retire` drops it).
Pure bookkeeping: no I/O.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from . import detectors as checks
from .detectors import SPIKE_FACTOR, FingerprintMatch


CELL_TOKENS = 3       # chosen tokens whose log-probabilities place a fingerprint in a cell (3**3 cells looked up)


def _cell_width(apart: float) -> float:
    """Cells a little wider than `apart` (the most two alike fingerprints differ by): values that far apart
    fall in the same or neighbouring cells whatever the rounding (distances are rounded to 1e-6). No finite
    width: one cell for all."""
    return apart * 1.001 + 1e-5 if math.isfinite(apart) and apart >= 0 else math.inf


def _apart(a: tuple, b: tuple) -> float:
    """The largest difference of two fingerprints' chosen log-probabilities where both have one."""
    return max((abs(p - q) for p, q in zip(a, b) if p is not None and q is not None), default=0.0)


def parts_before(own_vs_other: FingerprintMatch, run_vs_own: FingerprintMatch, bound: float) -> bool:
    """Do two cold answers (a run's own and another prompt's) part before the run leaves its own: by a token
    earlier than the run's first differing one, or by log-probabilities beyond `bound` on the tokens they
    share? Only then can a run that agrees with the other answer have the other's state; where they part
    only at the token where the run parts from its own (its own state taking the other side of the tie the
    two answers part at), it tells nothing. Measured, vLLM 0.26 on an H200, qwen3next-recall, 128 streams
    (2026-12-04): of 131 calibration memos' 12-token summary answers, about 400 pairs were the same tokens,
    some within 1e-5 nats, and hits that left their own answer at token 7 or 11 met another memo's that parts
    from it exactly there (second-largest deviations 0.035-0.063 before it): five false "another request's
    state" in four clean runs."""
    if own_vs_other.agreeing < run_vs_own.agreeing:
        return True
    return own_vs_other.second > bound or own_vs_other.distance > SPIKE_FACTOR * bound



@dataclass(frozen=True)
class Fingerprint:
    memo: str
    task: str
    request: int
    logprobs: list[list]
    text: str | None = None          # the cold run's whole greedy answer (None: not kept)
    max_tokens: int | None = None    # what it was asked for (a hit asked for as many compares its whole text)


@dataclass(frozen=True)
class Closest:
    """The two live memos whose cold fingerprints are nearest (for the report)."""
    task: str
    a: str
    b: str
    agreeing: int
    distance: float
    distinct: bool


class FingerprintBook:
    def __init__(self, tokens: int, tolerance: float, margin: float = 0.0):
        self.tokens = tokens
        self.tolerance = tolerance
        self.margin = margin
        self._by_prompt: dict[str, Fingerprint] = {}
        self.retired: set[str] = set()
        # Made once per stored fingerprint and once per pair (issue 34: at 128 slots a round of cold runs
        # compares every memo with every other, and a phase asks again which pairs are alike): the list
        # is kept beside its entries so that its id cannot be reused while the entry lives.
        self._prepared: dict[int, tuple[list, tuple, tuple]] = {}   # id -> (logprobs, prepared, chosen tokens)
        self._pairs: dict[tuple[int, int], FingerprintMatch] = {}
        self._told: dict[tuple[str, str], bool] = {}     # (memo, task) -> told apart from all; cleared on add, retire
        # Stored keys by memo, and by (task, chosen tokens) and cell: only fingerprints with the same chosen tokens
        # can be alike (distinct), so "which memos is this one alike to" reads one small group instead of every
        # fingerprint (120,075 `distinct` asks in a 128-stream soak on an H100, 2026-12-06)
        self._keys_of_memo: dict[str, dict[str, None]] = {}
        # Stored keys by (task, first closer_needs(tokens) chosen tokens): the only ones compare() may find closer
        # than a run's own (they must lead with the run's first tokens); it read every stored fingerprint per run
        # off its own (0.68 ms a call under cProfile, 886 calls; the reference server with --resume-cost 0.06,
        # 2026-12-07)
        self._leads: dict[tuple[str, tuple], dict[str, None]] = {}
        self._position: dict[str, int] = {}               # key -> its place in _by_prompt (kept on a re-store)
        # Within a group, keys by the cells their first chosen tokens' log-probabilities fall in: two fingerprints
        # alike are at most tolerance + margin apart on every chosen token, so in neighbouring cells. A question
        # whose cold answer is the same words for every memo ("not stated in the memo") made one group of every
        # memo, each new fingerprint compared with all: a sixth of hitproof's CPU at 128 streams on the
        # reference server (py-spy, 2026-12-06). None: a fingerprint without those values, compared with all.
        self._cell_width = _cell_width(tolerance + margin)
        self._cells: dict[tuple[str, tuple], dict[tuple | None, dict[str, None]]] = {}

    def get(self, key: str) -> Fingerprint | None:
        return self._by_prompt.get(key)

    def live(self, task: str | None = None) -> list[Fingerprint]:
        return [fp for fp in self._by_prompt.values()
                if fp.memo not in self.retired and (task is None or fp.task == task)]

    def match(self, a: list[list], b: list[list]) -> FingerprintMatch:
        """fingerprint_match(a, b), the prepared way (equal by test; about half the time: the re-runs of every
        mismatch compare ten runs each, 2,742 comparisons in a 2,566-request soak on an H100, 2026-12-05)."""
        return checks.prepared_match(checks.fingerprint_prepare(a, self.tokens),
                                     checks.fingerprint_prepare(b, self.tokens))

    def match_all(self, runs: list[list[list]], b: list[list]) -> list[FingerprintMatch]:
        """[match(run, b) for run in runs], `b` prepared once (kept prepared when it is a stored fingerprint's: a
        judged deviation compares ten re-runs and the hit's every re-hit with the same cold fingerprint)."""
        kept = self._kept_already(b)
        ready = kept[1] if kept is not None else checks.fingerprint_prepare(b, self.tokens)
        return [checks.prepared_match(checks.fingerprint_prepare(run, self.tokens), ready) for run in runs]

    def _kept_already(self, logprobs: list[list]) -> tuple[list, tuple, tuple] | None:
        """The kept entry of these very lists (an id of a list no longer kept may name another), else None."""
        kept = self._prepared.get(id(logprobs))
        return kept if kept is not None and kept[0] is logprobs else None

    def _kept(self, logprobs: list[list]) -> tuple[list, tuple, tuple]:
        kept = self._kept_already(logprobs)
        if kept is None:
            ready = checks.fingerprint_prepare(logprobs, self.tokens)
            kept = self._prepared[id(logprobs)] = (logprobs, ready, tuple(x for x, _ in ready))
        return kept

    def _ready(self, logprobs: list[list]) -> tuple:
        return self._kept(logprobs)[1]

    def _match_stored(self, run: tuple, fp: Fingerprint) -> FingerprintMatch:
        """match(run, fp.logprobs), with the stored side read once (`run` prepared by the caller)."""
        return checks.prepared_match(run, self._ready(fp.logprobs))

    def pair(self, a: Fingerprint, b: Fingerprint) -> FingerprintMatch:
        """match(a.logprobs, b.logprobs) for two stored fingerprints, once per pair (the comparison is
        symmetric). A pair is stored only after both lists are kept in _prepared, for good, so a stored
        pair's ids still name its lists: looked up first (at 128 slots, 100,000 asks a soak, 2026-12-05)."""
        x, y = id(a.logprobs), id(b.logprobs)
        key = (x, y) if x <= y else (y, x)
        known = self._pairs.get(key)
        if known is None:
            known = self._pairs[key] = checks.prepared_match(self._ready(a.logprobs), self._ready(b.logprobs))
        return known

    def _leads_with(self, fp: Fingerprint, head: list, lead: int) -> bool:
        """Do fp's first `lead` chosen tokens exist and equal `head` (a run's first tokens; shorter: no)?"""
        ready = self._ready(fp.logprobs)
        return len(head) == lead <= len(ready) and all(ready[i][0] == tok for i, tok in enumerate(head))

    def distinct(self, a: Fingerprint, b: Fingerprint) -> bool:
        """Not the same chosen tokens, or values further apart than tolerance + margin. Different tokens are told
        without comparing values: each cold fingerprint added was compared with every live one of its question
        (at 128 slots on the reference server, a fifth of hitproof's CPU, 2026-12-06); equal tokens are rare."""
        if self._chosen(a.logprobs) != self._chosen(b.logprobs):
            return True                             # prepared_match's same_tokens: every chosen token equal
        m = self.pair(a, b)
        return not (m.same_tokens and m.distance <= self.tolerance + self.margin)

    def _chosen(self, logprobs: list[list]) -> tuple:
        """The chosen tokens of a stored fingerprint's first `tokens` positions, kept beside its prepared form."""
        return self._kept(logprobs)[2]

    def add(self, key: str, fingerprint: Fingerprint) -> list[Fingerprint]:
        """Store a cold fingerprint; the live fingerprints of other memos (same question) it is not
        distinct from."""
        old = self._by_prompt.get(key)
        if old is not None:                      # a prompt stored again: its old fingerprint leaves its groups
            self._keys_of_memo[old.memo].pop(key, None)
            self._cells[old.task, self._chosen(old.logprobs)][self._cell(old)].pop(key, None)
            self._leads.get(self._lead_key(old), {}).pop(key, None)
        self._position.setdefault(key, len(self._position))
        self._by_prompt[key] = fingerprint
        self._keys_of_memo.setdefault(fingerprint.memo, {})[key] = None
        group = (fingerprint.task, self._chosen(fingerprint.logprobs))
        self._cells.setdefault(group, {}).setdefault(self._cell(fingerprint), {})[key] = None
        if len(group[1]) >= checks.closer_needs(self.tokens):     # shorter: it never leads with enough tokens
            self._leads.setdefault(self._lead_key(fingerprint), {})[key] = None
        self._told.clear()
        return [other for other in self._could_be_alike(fingerprint)
                if other.memo != fingerprint.memo and not self.distinct(fingerprint, other)]

    def _lead_key(self, fp: Fingerprint) -> tuple[str, tuple]:
        return fp.task, self._chosen(fp.logprobs)[:checks.closer_needs(self.tokens)]

    def _cell(self, fp: Fingerprint) -> tuple | None:
        """Which cell fp's first CELL_TOKENS chosen tokens' log-probabilities fall in (None: one is missing)."""
        values = self._chosen_values(fp, CELL_TOKENS)
        if None in values:
            return None
        return tuple(int(math.floor(value / self._cell_width)) for value in values)

    def _could_be_alike(self, fp: Fingerprint) -> list[Fingerprint]:
        """The live fingerprints of fp's question with fp's chosen tokens (fp's own too) in fp's cell or a
        neighbouring one, or without a cell, in the order stored: the only ones that can be alike to it
        (a superset of them: `distinct` decides)."""
        cells = self._cells.get((fp.task, self._chosen(fp.logprobs)), {})
        mine = self._cell(fp)
        if mine is None:
            keys = [key for members in cells.values() for key in members]
        elif len(cells) < 3 ** len(mine):
            # fewer cells in the group than neighbours to look up (the usual case: a group is one memo's
            # answers, or a few look-alikes'): each cell checked, not 27 tuples built and probed (added
            # fingerprints and told-apart checks: 6% of hitproof's CPU at 128 streams, cProfile 2026-12-07)
            keys = [key for cell, members in cells.items()
                    if cell is None or (len(cell) == len(mine) and all(-1 <= c - m <= 1 for c, m in zip(cell, mine)))
                    for key in members]
        else:
            keys = list(cells.get(None, ()))
            for offsets in itertools.product((-1, 0, 1), repeat=len(mine)):
                keys.extend(cells.get(tuple(c + o for c, o in zip(mine, offsets)), ()))
        keys.sort(key=self._position.get)
        return [other for other in map(self._by_prompt.__getitem__, keys) if other.memo not in self.retired]

    def _stored_of(self, memo: str, task: str) -> list[Fingerprint]:
        """A memo's fingerprints on a question, retired or not, in the order stored."""
        keys = sorted(self._keys_of_memo.get(memo, ()), key=self._position.get)
        return [fp for fp in map(self._by_prompt.__getitem__, keys) if fp.task == task]

    def retire(self, memo: str) -> None:
        """A memo re-drawn for not being distinct: its fingerprints no longer count."""
        self.retired.add(memo)
        self._told.clear()

    def told_apart(self, own: Fingerprint, owner: str, run_vs_own: checks.FingerprintMatch, bound: float) -> bool:
        """Does `owner`'s cold answer part from `own`'s before the run leaves its own (parts_before), by
        more than `bound` on values? Else a run agreeing with it is its own state taking a tie, not the other's.
        Memos whose fingerprints are alike (not `distinct`) are never told apart."""
        theirs = self._of_memo(owner, own.task)
        return theirs is None or parts_before(self.pair(theirs, own), run_vs_own,
                                                     max(bound, self.tolerance + self.margin))

    def _of_memo(self, memo: str, task: str) -> Fingerprint | None:
        """A memo's cold fingerprint on a question, retired or not (a retired memo's blocks are still in the
        server's cache: another request can be restored from them)."""
        return next(iter(self._stored_of(memo, task)), None)

    def alike(self, memo: str, other: str, task: str) -> bool:
        """Is any cold fingerprint of one memo on a question not distinct from any of the other's (retired or
        not; a memo asked with several prompts, a conversation's turns, has one per prompt)?"""
        theirs = self._stored_of(other, task)
        return any(not self.distinct(a, b) for a in self._stored_of(memo, task) for b in theirs)

    def indistinct_from(self, memo: str, task: str) -> list[str]:
        own = [fp for fp in self._stored_of(memo, task) if memo not in self.retired]
        return sorted({other.memo for fp in own for other in self._could_be_alike(fp)
                       if other.memo != memo and not self.distinct(fp, other)})

    def told_apart_from_all(self, memo: str, task: str) -> bool:
        """No other live memo's fingerprint on this question is alike to this memo's (asked per judged hit:
        kept until a fingerprint is added or a memo retired)."""
        key = (memo, task)
        told = self._told.get(key)
        if told is None:
            told = self._told[key] = not self.indistinct_from(memo, task)
        return told

    def compare(self, run: list[list], own: Fingerprint) -> tuple[FingerprintMatch, dict[str, FingerprintMatch], str,
                                                                   str | None]:
        """(match with its own, matches with the other memos that could be closer, verdict, the closer other
        memo). A run that matches its own fingerprint is a match whatever the others are (classify_fingerprint):
        the other memos are compared only when it does not, so a clean hit costs one comparison however many
        memos are live (at 128 slots, 128 times fewer). When it does not, only the memos whose first tokens are
        the run's are compared: another memo is closer only with at least closer_needs(tokens) leading tokens
        in common and as many as the run's own (closer_than), and `agreeing` counts leading tokens. Measured,
        H100, 128 streams (2026-12-06, run M): 210 of 1,172 clean hits took a near tie (numerics, an info),
        each compared with 127 other memos:
        by the comparison's cost (20-50 us), an estimated tenth of hitproof's 5.6 s of CPU there."""
        ready = checks.fingerprint_prepare(run, self.tokens)
        mine = self._match_stored(ready, own)
        if mine.matches(self.tolerance):
            return mine, {}, "match", None
        need = checks.closer_needs(self.tokens)
        lead = max(need, mine.agreeing)
        head = [x for x, _ in ready[:lead]]
        # retired memos too: re-drawn for looking like another, their blocks still sit in the server's cache, and
        # a hit restored from them is another request's state (reference server, foreign_state beside a pair of
        # look-alikes: a hit answered with a re-drawn memo's state, named by no live memo, was excused as a
        # deviation no re-hit repeated). Those of the question leading with the run's first tokens, in the order
        # stored (_leads: the same as reading every stored fingerprint)
        keys = sorted(self._leads.get((own.task, tuple(head[:need])), ()), key=self._position.get)
        others = {fp.memo: self._match_stored(ready, fp) for fp in map(self._by_prompt.__getitem__, keys)
                  if fp.memo != own.memo and self._leads_with(fp, head, lead)}
        verdict, owner = checks.classify_fingerprint(mine, others, self.tolerance, self.tokens)
        return mine, others, verdict, owner

    def closest(self, memos: set[str] | None = None) -> Closest | None:
        """The nearest pair of live memos (among `memos` when given), per question, over all questions: the most
        leading tokens in common, then the smallest distance; of equal pairs the first in the order stored.
        Only the pairs with a question's most leading tokens in common are compared (each group sharing a prefix
        that long): comparing every pair of 128 memos took 0.37 s of a 128-stream soak's CPU on an H100
        (cProfile, 2026-12-06), most of those pairs compared nowhere else."""
        fps = [fp for fp in self.live() if memos is None or fp.memo in memos]
        by_task: dict[str, list[int]] = {}
        for i, fp in enumerate(fps):
            by_task.setdefault(fp.task, []).append(i)
        found = []                                   # (-agreeing, distance, i, j, match)
        for indices in by_task.values():
            most = self._most_in_common(fps, indices)
            groups: dict[tuple, list[int]] = {}
            for i in indices if most is not None else ():
                groups.setdefault(self._chosen(fps[i].logprobs)[:most], []).append(i)
            for group in groups.values():
                nearest = self._nearest_in(fps, group, most)
                if nearest is not None:
                    found.append(nearest)
        if not found:
            return None
        _, _, i, j, m = min(found, key=lambda f: f[:4])
        return Closest(fps[i].task, fps[i].memo, fps[j].memo, m.agreeing, m.distance, self.distinct(fps[i], fps[j]))

    def _nearest_in(self, fps: list[Fingerprint], group: list[int], shared: int) -> tuple | None:
        """A group's nearest pair of different memos, (-agreeing, distance, i, j, match) with i < j (None: one
        memo). Every pair in a group has as many leading tokens in common (`shared`, the most two have), so
        distance ranks them, and a pair's distance is at least the largest difference of their log-probabilities
        on those tokens: a pair further apart there than the nearest found yet is not compared, and swept in
        order of the first token's, the rest of a row is not looked at (a question answered in the same words
        for every memo, "not stated in the memo", compared every pair of 137 memos: a twelfth of hitproof's CPU
        at 128 streams on the reference server, py-spy, 2026-12-06)."""
        values = {i: self._chosen_values(fps[i], shared) for i in group}
        first = {i: v[0] for i, v in values.items() if v and v[0] is not None}
        best = None

        def consider(i: int, j: int) -> None:
            nonlocal best
            # distances are rounded to 1e-6: a pair apart by more than that cannot tie
            if fps[i].memo == fps[j].memo or (best is not None and _apart(values[i], values[j]) > best[1] + 1e-6):
                return
            a, b = min(i, j), max(i, j)
            m = self.pair(fps[a], fps[b])
            found = (-m.agreeing, m.distance, a, b, m)
            if best is None or found[:4] < best[:4]:
                best = found

        for x, i in enumerate(group):              # no first value: looked at beside every other
            if i not in first:
                for j in group[x + 1:] + [j for j in group[:x] if j in first]:
                    consider(i, j)
        swept = sorted(first, key=first.__getitem__)
        for x, i in enumerate(swept):
            for j in swept[x + 1:]:
                if best is not None and first[j] - first[i] > best[1] + 1e-6:
                    break
                consider(i, j)
        return best

    def _chosen_values(self, fp: Fingerprint, n: int) -> tuple:
        """The log-probabilities of fp's first n chosen tokens as compared (None where missing or not finite)."""
        return tuple(value if value is not None and math.isfinite(value) else None
                     for value in (entries.get(token) for token, entries in self._ready(fp.logprobs)[:n]))

    def _most_in_common(self, fps: list[Fingerprint], indices: list[int]) -> int | None:
        """The most leading chosen tokens two of these fingerprints of different memos share (None: one memo).
        Sorted by their tokens, a fingerprint shares the most with the next one of another memo."""
        ordered = sorted(indices, key=lambda i: tuple(map(repr, self._chosen(fps[i].logprobs))))
        most = None
        for x, i in enumerate(ordered):
            for j in ordered[x + 1:]:
                if fps[j].memo != fps[i].memo:
                    a, b = self._chosen(fps[i].logprobs), self._chosen(fps[j].logprobs)
                    common = next((n for n, (p, q) in enumerate(zip(a, b)) if p != q), min(len(a), len(b)))
                    most = common if most is None else max(most, common)
                    break
        return most


def position_deviations(run: list[list], fingerprint: list[list], tokens: int) -> list[float]:
    """Each position's deviation as fingerprint_match measures it (the chosen tokens and the alternatives
    above checks.ALTERNATIVE_FLOOR both runs list), over the first `tokens`, up to and including the first token
    that differs: the profile behind its largest and second-largest."""
    out = []
    for x, y in zip(run[:tokens], fingerprint[:tokens]):
        mine, theirs = checks.position_entries(x), checks.position_entries(y)
        here = 0.0
        for tok in mine.keys() & theirs.keys():
            if tok not in (x[0], y[0]) and max(mine[tok], theirs[tok]) < checks.ALTERNATIVE_FLOOR:
                continue
            here = max(here, abs(mine[tok] - theirs[tok]))
        out.append(round(here, 6))
        if x[0] != y[0]:
            break
    return out


def typical_deviation(deviations: list[float]) -> float:
    """The median position's deviation: what moves everywhere, not at a spike or two (inf: nothing)."""
    if not deviations:
        return float("inf")
    ordered = sorted(deviations)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
