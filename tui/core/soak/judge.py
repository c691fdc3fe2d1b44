"""Judging a main-arm request, one-sidedly: a fail-class finding needs the hit path wrong where the
cold path of the same request (re-sent under a fresh salt) is right. A foreign code needs no
control: no cold path can produce a code the request never saw. Fingerprints (cold greedy tokens
and log-probabilities) are judged the same way, with the near-tie rule for numerics.

The judge sends its controls through the Requester (the `Sender` protocol), keeps the cold fingerprints."""

from __future__ import annotations

import dataclasses

from ..checks import detectors as checks
from ..checks.answers import hit_path_problems
from ..checks.fingerprints import Fingerprint, FingerprintBook
from ..checks.rehits import may_vary_on_hits, varies_on_hits
from ..log.events import FingerprintCompared
from ..report.fmt import pct
from .record import Record, Sender, cached_words, prompt_key
from .state import PhaseState
from . import greedy
from .resume import ResumeBook
from .sibling import sibling_control
from .twin_judge import TwinJudge

REPRODUCE = 5                # re-runs each way before a fingerprint deviation is called the cache's
DEFAULT_ALARM_RATE = 0.01    # a single foreign group is fail-class below these odds when no power target is set


class Judge:
    def __init__(self, rq: Sender):
        self.rq = rq
        e = rq.scenario.evidence
        self.fingerprints = FingerprintBook(e.fingerprint_tokens, e.fingerprint_tolerance, e.fingerprint_margin)
        self._fingerprint_notes: set[str] = set()
        self.twins = TwinJudge(rq, self.fingerprints)
        self.resume = ResumeBook()      # what resuming costs here, calibrated at the first hit (resume.py)

    async def judge(self, state: PhaseState, record: Record, expect: str, judges: tuple[str, ...],
                    control: bool = True, fingerprints: bool = True) -> None:
        """Judge a main-arm request: foreign codes at once; hit-path problems against a cold control."""
        if record.hit and self.twins.calibration is None:     # a judge used without the engine's calibrate()
            await self.calibrate(state)
        single_groups = self._foreign_codes(state, record)
        self._expectations(state, record, expect)
        if control and fingerprints and self.rq.scenario.evidence.fingerprints and record.memo is not None:
            await self._judge_fingerprint(state, record)      # (a phase with its own control judges these too)
        problems = hit_path_problems(record.checks)
        if not (problems or single_groups) or not control:
            for foreign in single_groups:         # no control to judge it by: a warning
                self._single_group(state, record, foreign, None)
            return
        if record.cold:
            self._on_cold(state, record, expect, problems, single_groups)
            return
        cold = await self.rq.send(state, dataclasses.replace(record.spec, salt=self.rq.fresh_salt()),
                                  task=record.task, memo=record.memo, slot=record.slot, round=record.round,
                                  turn=record.turn, expect="cold", arm="control", of_request=record.request,
                                  judges=judges)
        await self._against_control(state, record, cold, problems, single_groups)

    async def calibrate(self, state: PhaseState) -> None:
        """What resuming costs on this server (resume.py): measured once, before the run's first phase runs."""
        self.twins.calibration = await self.resume.ensure(self.rq, state)

    def _foreign_codes(self, state: PhaseState, record: Record) -> list[dict]:
        """Whole foreign codes are fail-class at once; single groups are returned for the control."""
        c = record.checks
        single_groups = []
        for foreign in c.get("foreign", []):
            if foreign["groups"] >= 2:
                self.rq.finding(state, "foreign_code", "fail", record, offset=foreign["offset"],
                                detail=f"answer carries code {foreign['code']} owned by memo {foreign['owner']} "
                                       f"at offset {foreign['offset']}",
                                code=foreign["code"], owner=foreign["owner"], matched=foreign["matched"])
            else:
                single_groups.append(foreign)
        if c.get("wrong_task") is not None:
            self.rq.finding(state, "wrong_task", "warn", record, offset=c["wrong_task"],
                            detail=f"a {record.task} request answered with its own code (a candidate fluke, not a "
                                   f"leak)")
        return single_groups

    def _expectations(self, state: PhaseState, record: Record, expect: str) -> None:
        """A request meant to be cold must be proven cold; one meant to hit is counted, hit or not."""
        if expect == "cold" and not record.cold:
            if record.proof.low > record.cold_tolerance:
                state.mark_inconclusive(f"request {record.request} should be cold but had {record.proof.low} "
                                        f"cached tokens")
                self.rq.finding(state, "cold_not_cold", "warn", record,
                                detail=f"expected a cold request, got {record.proof.low} cached tokens (at most "
                                       f"{record.cold_tolerance} may be shared before the run nonce)",
                                cached_tokens=record.proof.low, tolerance=record.cold_tolerance)
            else:
                state.mark_inconclusive("cold requests are not proven cold: their cached tokens are unknown"
                                        + (f" ({state.no_report_fix})" if state.no_report_fix else ""))
        if expect == "hit":
            state.expected_hits += 1
            if record.routed_away:        # the router sent it where its memo never was: not the cache's miss
                return
            if not record.hit:
                state.unproven_expected += 1
            miss = (record.checks.get("checkpoint") or {}).get("full_reprocess")
            if miss and not record.hit:
                self.rq.finding(state, "checkpoint_miss", "info", record,
                                detail="a shared prefix got no hit: the server had no usable checkpoint inside it "
                                       "(neither a pass nor a fail)", line=miss)

    def _on_cold(self, state: PhaseState, record: Record, expect: str, problems: list, single_groups: list) -> None:
        """Problems on a cold request are the model's, never the cache's."""
        state.cold_failures += bool(problems)
        # A model that cannot give its own code back cold proves nothing by recall; one that
        # loops or stops on its own still leaves the other evidence (codes elsewhere, fingerprints).
        if expect == "cold" and any(kind == "recall_miss" for kind, _, _ in problems):
            state.missed_cold(record)     # the phase re-draws the memo (rotation.py) or proves nothing
        for kind, offset, detail in problems:
            self.rq.finding(state, kind, "info", record, offset=offset,
                            detail=f"{detail}; on a cold request (no hit): the model, not the cache")
        for foreign in single_groups:
            self.rq.finding(state, "foreign_code", "info", record, offset=foreign["offset"],
                            detail=f"one group ({foreign['matched']}) of code {foreign['code']} of memo "
                                   f"{foreign['owner']} on a cold request: the model wrote that number itself",
                            code=foreign["code"], owner=foreign["owner"], matched=foreign["matched"])

    async def _against_control(self, state: PhaseState, record: Record, control: Record, problems: list,
                               single_groups: list) -> None:
        """Fail-class only where the hit is wrong and the cold control right; info where both are wrong."""
        control_problems = {kind for kind, _, _ in hit_path_problems(control.checks)}
        control_cold = control.cold
        for foreign in control.checks.get("foreign", []):
            if foreign["groups"] >= 2:
                self.rq.finding(state, "foreign_code", "fail", control, offset=foreign["offset"],
                                detail=f"the cold control carries code {foreign['code']} of memo {foreign['owner']}",
                                code=foreign["code"], owner=foreign["owner"])
        for foreign in single_groups:
            self._single_group(state, record, foreign, control if control_cold else None)
        on_what = (f"on a hit ({cached_words(record.proof)})" if record.hit
                   else "on a request whose cache use is unknown")
        for kind, offset, detail in problems:
            if not control_cold:
                self.rq.finding(state, kind, "warn", record, offset=offset,
                                detail=f"{detail}; no cold control possible (the salted re-send is not proven cold: "
                                       f"{cached_words(control.proof)})", control_request=control.request)
            elif kind in control_problems:
                state.model_failures += 1
                self.rq.finding(state, kind, "info", record, offset=offset,
                                detail=f"{detail}; the cold control (request {control.request}) fails the same "
                                       f"way: the model, not the cache", control_request=control.request)
            elif (record.hit and greedy.took_a_tie(record, control, self.twins.calibration)
                  and await self.twins.same_problem(state, record, kind)):
                state.model_failures += 1       # resuming at a grid line leads the model there too
            elif record.hit and self._cold_unsteady(record):
                # The cold path is no fixed point here (batch-dependent kernels): a right control says
                # nothing of the hit's greedy path. Measured, vLLM 0.26 on an H200, the tiny Qwen3-Next:
                # a hit under 4 concurrent streams looped into '-' x32 where its control did not, and
                # 0 of 5 cold re-runs reproduced the cold fingerprint (2026-12-02).
                state.mark_inconclusive(f"request {record.request}: {kind.replace('_', ' ')} on a hit whose cold path "
                                        f"does not reproduce itself: not told from the kernel's nondeterminism")
                self.rq.finding(state, kind, "warn", record, offset=offset,
                                detail=f"{detail} {on_what}, while the cold control (request {control.request}) is "
                                       f"right; but on this server the cold run does not reproduce itself "
                                       f"(fewer than {REPRODUCE} of {REPRODUCE} cold re-runs matched its fingerprint): "
                                       f"not told from the kernel's nondeterminism",
                                control_request=control.request, cached_tokens=record.proof.low)
            else:
                self.rq.finding(state, kind, "fail" if record.hit else "warn", record, offset=offset,
                                detail=f"{detail} {on_what}, while the cold control (request {control.request}) "
                                       f"is right",
                                control_request=control.request, cached_tokens=record.proof.low,
                                control_text=control.text[:400])

    @staticmethod
    def _cold_unsteady(record: Record) -> bool:
        """This hit's cold path did not reproduce itself when re-run (the fingerprint judge's re-runs)."""
        return bool((record.checks.get("fingerprint") or {}).get("cold_unsteady"))

    def _single_group(self, state: PhaseState, record: Record, foreign: dict, control: Record | None) -> None:
        """One four-digit group of another memo's code: a mixed state, or a number the model wrote
        by chance. Its false-alarm odds are the chance that the four-digit numbers the answer holds
        hit one of the run's registered groups; below the run's power target, with a cold control
        that does not write it, it is fail-class."""
        groups = 3 * max(0, len(self.rq.registry.owners) - (1 if record.memo and record.memo.code else 0))
        numbers = checks.four_digit_numbers(record.text)
        odds = checks.false_alarm_odds(numbers, groups)
        threshold = self.rq.scenario.power.fault_rate or DEFAULT_ALARM_RATE
        where = dict(code=foreign["code"], owner=foreign["owner"], matched=foreign["matched"], odds=round(odds, 6),
                     numbers=numbers, registered_groups=groups)
        base = (f"one group ({foreign['matched']}) of code {foreign['code']} owned by memo {foreign['owner']} at "
                f"offset {foreign['offset']}; false-alarm odds {pct(odds, 2)} ({numbers} four-digit number(s) "
                f"against {groups} registered groups)")
        if control is None:
            self.rq.finding(state, "foreign_code", "warn", record, offset=foreign["offset"],
                         detail=f"{base}; no cold control to compare with", **where)
            return
        echoed = any(f["code"] == foreign["code"] for f in control.checks.get("foreign", []))
        if echoed:
            self.rq.finding(state, "foreign_code", "info", record, offset=foreign["offset"],
                         detail=f"{base}; the cold control (request {control.request}) writes it too: the model, "
                                f"not the cache", control_request=control.request, **where)
        elif odds < threshold:
            self.rq.finding(state, "foreign_code", "fail", record, offset=foreign["offset"],
                         detail=f"{base}, below the run's {pct(threshold, 2)} target, and the cold control (request "
                                f"{control.request}) is clean: a mixed state", control_request=control.request,
                         **where)
        else:
            self.rq.finding(state, "foreign_code", "warn", record, offset=foreign["offset"],
                         detail=f"{base}, not below the run's {pct(threshold, 2)} target: too likely by chance to "
                                f"call a leak", control_request=control.request, **where)

    # --- fingerprints ------------------------------------------------------------------------

    async def _cold_fingerprint(self, state: PhaseState, record: Record) -> Fingerprint | None:
        """The cold run of this exact prompt: this record if it was cold, else one more request."""
        if record.cold and self.fingerprints.get(prompt_key(record.spec)) is None:
            return self._keep_fingerprint(state, record, record)
        return await self.cold_fingerprint(state, record.spec, task=record.task, memo=record.memo, slot=record.slot,
                                           round=record.round, turn=record.turn, of=record)

    async def cold_fingerprint(self, state: PhaseState, spec, *, task: str, memo, slot: int | None = None,
                               round: int | None = None, turn: int | None = None,
                               of: Record | None = None) -> Fingerprint | None:
        """The prompt's cold fingerprint: the one kept, else a cold request under a fresh salt (None: no cold
        run to be had, cold_not_cold or unknown, or no log-probabilities)."""
        known = self.fingerprints.get(prompt_key(spec))
        if known is not None:
            return known
        source = await self.rq.send(state, dataclasses.replace(spec, salt=self.rq.fresh_salt()), task=task, memo=memo,
                                    slot=slot, round=round, turn=turn, expect="cold", arm="control",
                                    of_request=of.request if of is not None else None)
        return self._keep_fingerprint(state, source, of or source) if source.cold else None

    def _keep_fingerprint(self, state: PhaseState, source: Record, record: Record) -> Fingerprint | None:
        if not source.completion.logprobs:
            self._note_once(state, "no_logprobs", "the server returned no log-probabilities: fingerprints "
                            "cannot be compared", record)
            return None
        fingerprint = Fingerprint(source.memo.memo_id, source.task, source.request, source.completion.logprobs,
                                  text=source.text, max_tokens=source.spec.max_tokens)
        alike = self.fingerprints.add(prompt_key(source.spec), fingerprint)
        if alike and not state.redraws_memos:    # a phase that re-draws memos judges distinctness itself
            self.note_indistinct(state, alike[0], fingerprint, record)
        return fingerprint

    def note_indistinct(self, state: PhaseState, a: Fingerprint, b: Fingerprint, record: Record | None) -> None:
        """Two memos alike: their hits are not counted toward power (told_apart); the phase proved nothing by
        fingerprint only if none of its hits was told apart (PhaseState.status)."""
        self._note_once(state, f"indistinct:{state.name}",
                        f"memos {a.memo} and {b.memo} have the same fingerprint (requests {a.request} and "
                        f"{b.request}): hits of a memo with a look-alike are not counted toward power", record,
                        lookalike=True)

    def _note_once(self, state: PhaseState, key: str, detail: str, record: Record | None,
                   lookalike: bool = False) -> None:
        if key in self._fingerprint_notes:
            return
        self._fingerprint_notes.add(key)
        if lookalike:
            state.lookalikes.append(detail)
        self.rq.finding(state, "fingerprint_indistinct" if lookalike else "fingerprint_unavailable", "info",
                     record, detail=detail)

    def fingerprint_verdict(self, record: Record) -> str | None:
        """match | foreign_state | mismatch for any re-send (isolation), against the cold fingerprints
        seen so far; None when the prompt has no cold fingerprint or the answer no log-probabilities."""
        own = self.fingerprints.get(prompt_key(record.spec))
        if own is None or not record.completion.logprobs:
            return None
        return self.fingerprints.compare(record.completion.logprobs, own)[2]

    async def _judge_fingerprint(self, state: PhaseState, record: Record) -> None:
        tolerance = self.rq.scenario.evidence.fingerprint_tolerance
        own = await self._cold_fingerprint(state, record)
        if own is None or not record.hit or own.request == record.request:
            return
        run = record.completion.logprobs
        mine, others, verdict, owner = self.fingerprints.compare(run, own)
        if verdict == "foreign_state" and self.fingerprints.alike(own.memo, owner, own.task):
            return            # the two memos look alike: no telling them apart (noted when seen)
        if verdict == "foreign_state" and not self.fingerprints.told_apart(own, owner, mine, self.twins.bound):
            verdict, owner = "mismatch", None     # its own state taking a tie: judged as a deviation, below
        whole = greedy.comparable(state, record, own)
        told = self.fingerprints.told_apart_from_all(own.memo, own.task)
        state.told_apart += told
        record.checks["fingerprint"] = {"verdict": verdict, "own_distance": mine.distance,
                                        "own_agreeing": mine.agreeing, "closest": owner}
        if whole:
            record.checks["fingerprint"]["text_same"] = record.text == own.text
        self.rq.emit(FingerprintCompared(request=record.request, own_request=own.request, verdict=verdict,
                                             agreeing=mine.agreeing, distance=mine.distance, closest=owner,
                                             second=mine.second, text_same=(record.text == own.text) if whole else None,
                                             phase=state.name, told_apart=told))
        if verdict == "match":
            if whole:           # its first tokens are right: is the rest of its answer? (greedy.py)
                await greedy.judge_text(self, state, record, own, REPRODUCE)
            return
        if verdict == "foreign_state":
            theirs = others[owner]
            self.rq.finding(state, "foreign_state", "fail", record,
                         detail=(f"the hit's continuation is closer to memo {owner}'s cold fingerprint ({theirs.agreeing} "
                                 f"tokens agree, log-probabilities within {theirs.distance:.4f}) than to its own "
                                 f"({mine.agreeing} tokens, {mine.distance:.4f}): another request's state"),
                         owner=owner, own_request=own.request, own_distance=mine.distance,
                         owner_distance=theirs.distance)
            return
        # Differs from its own fingerprint. A near-tied choice that flips after log-probabilities that
        # agreed within the tolerance is numerics (prefill from cache runs other batch shapes), not a
        # wrong state: info, as in the determinism phase.
        flip = checks.compare_logprobs(own.logprobs, run)
        if checks.near_tie_explains(mine, flip, tolerance):
            record.checks["fingerprint"]["near_tie_token"] = flip.token
            self.rq.finding(state, "fingerprint_mismatch", "info", record,
                         detail=f"the hit flips a near-tied token at output token {flip.token} ({flip.margin:.4f} nats "
                                f"behind on the cold path; log-probabilities before it agree to "
                                f"{flip.max_prefix_delta:.4f}): numerics of prefill from cache, not a wrong state",
                         own_request=own.request, token=flip.token, margin=flip.margin)
            return
        # Fail only if both paths reproduce themselves, REPRODUCE times each: every cold re-run matches
        # the fingerprint and every re-hit repeats the same deviation. Kernel nondeterminism (top-k
        # ties, batch-dependent numerics, sparse-attention selection) does neither reliably: measured on
        # the reference server's wording drift, one cold and one re-hit reproduced a drift by chance in
        # 3 of 8 quick soaks; with three of each it still happened once (CI, 2026-12-01: one fail among
        # 15 mismatches of one wording-drift quick soak), so five of each.
        colds, rehits = [], []
        for _ in range(REPRODUCE):
            colds.append(await self.rq.send(state, dataclasses.replace(record.spec, salt=self.rq.fresh_salt()),
                                            task=record.task, memo=record.memo, slot=record.slot, round=record.round,
                                            turn=record.turn, expect="cold", arm="control", of_request=record.request))
        for _ in range(REPRODUCE):
            rehits.append(await self.rq.send(state, record.spec, task=record.task, memo=record.memo, slot=record.slot,
                                             round=record.round, turn=record.turn, expect="hit", arm="control",
                                             of_request=record.request))
        match_all = self.fingerprints.match_all
        cold_same = sum(m.matches(tolerance) for m in match_all([c.completion.logprobs for c in colds], own.logprobs))
        hit_same = sum(r.hit and m.matches(tolerance) for r, m in zip(rehits, match_all([r.completion.logprobs
                                                                                        for r in rehits], run)))
        where = f"first {mine.agreeing} tokens agree, log-probabilities {mine.distance:.4f} apart"
        evidence = dict(own_request=own.request, control_requests=[c.request for c in colds],
                        rehit_requests=[r.request for r in rehits], own_distance=mine.distance,
                        cold_reproduced=cold_same, hit_reproduced=hit_same)
        reproduced = cold_same == REPRODUCE and hit_same == REPRODUCE
        # A reproducible deviation may still be only what resuming at a grid line costs, within the cost calibrated
        # in the run (resume.py): there its twin (twin.py) tells that from a wrong state. Elsewhere it is a fail.
        resumes = self.twins.allowed
        # Every re-hit off beyond what resuming costs at its own point, never the same way, while every cold run
        # writes the cold fingerprint: no kernel (its noise reaches the cold runs too) but a restore handing a new
        # wrong state each time (issue 33; checks/rehits.py: why re-hits may resume elsewhere than the hit).
        calibration = self.twins.calibration
        beyond = max(tolerance, calibration.bound) if resumes else tolerance
        def resumed_right(hit: Record) -> bool:   # within what resuming costs (each restore of its lineage), or
            lp = hit.completion.logprobs          # parting from cold the way resuming can
            bound = max(beyond, self.twins.chain_bound(hit)) if resumes else beyond
            return match_all([lp], own.logprobs)[0].matches(bound) or (
                resumes and calibration.explains_parting(checks.compare_logprobs(own.logprobs, lp)))
        # asked only where it can say yes: a reproduced deviation walked six lineages for nothing (7% of a soak's CPU,
        # cProfile, 128 streams, the reference server with --resume-cost 0.06, 2026-12-07)
        varies = may_vary_on_hits(cold_same, reproduced, REPRODUCE) and varies_on_hits(resumed_right(record), [
            resumed_right(r) if r.hit else None for r in rehits], cold_same, reproduced, REPRODUCE)
        points = sorted({r.cached for r in rehits if r.cached is not None})
        at = (f"at the same {record.cached} tokens" if points == [record.cached] else
              f"at {', '.join(map(str, points))} tokens (the hit at {record.cached})")
        if varies:
            self.rq.finding(state, "fingerprint_mismatch", "fail", record, twin_verdict="varies_on_hits",
                            detail=(f"the hit differs from its own cold fingerprint ({where}); {REPRODUCE} more cold "
                                    f"runs reproduce the fingerprint, and {REPRODUCE} more hits resuming {at} all "
                                    f"deviate beyond {beyond:.4f}, never the same way: a "
                                    f"restore that hands a different wrong state each time"), **evidence)
        elif reproduced and not resumes:
            self.rq.finding(state, "fingerprint_mismatch", "fail", record, twin_verdict="no_resume_excuse",
                            detail=(f"the hit differs from its own cold fingerprint ({where}); {REPRODUCE} more cold "
                                    f"runs reproduce the fingerprint and {REPRODUCE} more hits the deviation: "
                                    f"corruption on the hit path ("
                                    + (calibration.words() if calibration is not None else "no resume cost measured")
                                    + ")"), **evidence)
        elif reproduced and self.rq.server.salts == "cache_salt" and await self.twins.judge(state, record, own, mine, evidence, colds):
            return
        elif reproduced and self.rq.server.salts == "cache_salt":
            # a server with salts whose hit got no twin: resuming at a grid line may be all it is
            state.mark_inconclusive(f"request {record.request}'s deviation from its cold fingerprint reproduces, "
                                    f"but no twin could be made to tell resuming arithmetic from a wrong state")
            self.rq.finding(state, "fingerprint_mismatch", "warn", record,
                            detail=(f"the hit differs from its own cold fingerprint ({where}), reproducibly, and no "
                                    f"twin could be made: resuming arithmetic or a wrong state, not told apart"),
                            **evidence)
        elif reproduced:
            # no salt that keeps caching on (llama.cpp): a restore of the same shape on a fresh memo (sibling.py)
            # measures what resuming costs here before the value alone is called a wrong state
            control = await sibling_control(self, state, record, own, mine, evidence)
            if control is None:
                return
            self.rq.finding(state, "fingerprint_mismatch", "fail", record,
                            detail=(f"the hit differs from its own cold fingerprint ({where}); {REPRODUCE} more cold "
                                    f"runs reproduce the fingerprint and {REPRODUCE} more hits the deviation"
                                    f"{control}: corruption on the hit path"), **evidence)
        else:
            if cold_same < REPRODUCE:
                record.checks["fingerprint"]["cold_unsteady"] = True
            why = (f"only {cold_same} of {REPRODUCE} more cold runs reproduce the fingerprint"
                   if cold_same < REPRODUCE else f"only {hit_same} of {REPRODUCE} more hits repeat the deviation")
            self.rq.finding(state, "fingerprint_mismatch", "info", record,
                            detail=f"the hit differs from its cold fingerprint ({where}), but {why}: "
                                   f"not reproducible, the kernel rather than the cache", **evidence)
