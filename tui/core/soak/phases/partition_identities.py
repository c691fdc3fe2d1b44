"""The partition phase's bookkeeping and judging: the paired assertion over identities (a cache_salt,
a LoRA adapter, the base model), one-sided like every other judgement.

- Cross-identity half: a request under identity I on tokens that only *other* identities have
  computed may reuse at most the tokens before the run nonce. More is `partition_leak` (fail): no
  cache that keys on the identity can serve it, so it needs no control.
- Same-identity half: a repeat under the same identity must hit. A proven miss is
  `partition_no_reuse` (warn), and the pair's "no reuse" above then proves nothing (a cache that is
  off reuses nothing across identities either): the phase is inconclusive for that pair.
- Answers: each identity's own cold fingerprint of the memo (a solo request under a fresh salt, or
  `cache_prompt: false` on llama.cpp) is its reference. An answer closer to another identity's
  reference than to its own is `partition_leak` (fail; the references are solo cold runs, and no
  cold path of one identity writes another's log-probabilities). One that is close to none is a
  leak only when it reproduces: more cold runs give its own reference back and more runs of the
  same path (alone, or the same concurrent group) repeat the deviation; otherwise it is `info`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from ...checks import detectors
from ...log.events import FingerprintCompared
from ...server.adapters import Identity
from ..record import Record, cached_words
from ..state import PhaseState

REPRODUCE = 2               # more cold runs, and more runs of the same path, before a deviation is a leak


@dataclass
class PairTally:
    """One pair of identities, as the report lists it."""
    field: str                       # "cache_salt" | "lora"
    names: tuple[str, str]
    cross: int = 0                   # requests under one on tokens only the other (or others) had computed
    cross_cold: int = 0              # ... proven to reuse nothing beyond the shared pre-nonce tokens
    cross_reused: int = 0            # ... that reused more: leaks
    fingerprint_leaks: int = 0       # answers carrying the other identity's fingerprint (or a reproducible deviation)
    fingerprints: str = "not compared"   # "distinct" | "indistinct" | "not compared"
    same: dict[str, list[int]] = field(default_factory=dict)   # identity -> [repeats, proven hits, proven misses]

    def status(self) -> tuple[str, str]:
        """("leak" | "proven" | "unproven", why)."""
        if self.cross_reused or self.fingerprint_leaks:
            return "leak", (f"{self.cross_reused} cross-identity request(s) reused cached tokens, "
                            f"{self.fingerprint_leaks} answer(s) carried the other identity's state")
        missing = [n for n in self.names if not self.same.get(n, [0, 0, 0])[1]]
        if missing:
            return "unproven", (f"no repeat under {' or '.join(missing)} hit: no reuse across identities proves "
                                f"nothing without the matching pair hitting")
        if not self.cross_cold:
            return "unproven", "no cross-identity request was proven to reuse nothing (cached tokens unknown)"
        return "proven", ""

    def to_dict(self) -> dict[str, Any]:
        status, why = self.status()
        same = {n: {"repeats": v[0], "hits": v[1], "misses": v[2]} for n, v in self.same.items()}
        return {"field": self.field, "pair": list(self.names), "status": status, "why": why,
                "cross_requests": self.cross, "cross_cold": self.cross_cold, "cross_reused": self.cross_reused,
                "fingerprint_leaks": self.fingerprint_leaks, "fingerprints": self.fingerprints,
                "same_identity": same}


@dataclass
class Sent:
    """One main-arm request of the phase, for the fingerprint judgement once the references exist."""
    identity: Identity
    record: Record
    step: str          # "first" | "repeat" | "return" | "concurrent" | "revisit" | "concurrent_cold"
    group: tuple[str, ...] = ()             # identities sent at the same moment (concurrent steps)
    rerun: Callable[[], Awaitable[Record]] | None = None   # the same path once more (alone, or its group)


class PairBook:
    def __init__(self, rq, state: PhaseState, field_name: str, names: list[str]):
        self.rq, self.state, self.field = rq, state, field_name
        self.pairs: dict[frozenset, PairTally] = {}
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                self.pairs[frozenset((a, b))] = PairTally(field_name, (a, b))
        self.leaks = 0
        self.tolerance = rq.scenario.evidence.fingerprint_tolerance   # lowered by calibrate()

    def calibrate(self, refs: dict[str, Record], clean: list[tuple[str, Record]]) -> dict[str, Any]:
        """Judge answers with a tolerance from this server's own noise: `clean` are answers of the same
        state as their identity's reference (repeats alone, the identity twice at once)."""
        configured = self.rq.scenario.evidence.fingerprint_tolerance
        distances = [self.rq.fingerprints.match(r.completion.logprobs, refs[name].completion.logprobs).distance
                     for name, r in clean
                     if name in refs and refs[name].cold and refs[name].completion.logprobs and r.completion.logprobs]
        self.tolerance = detectors.calibrated_tolerance(configured, distances)
        finite = [d for d in distances if math.isfinite(d)]
        return {"scenario": configured, "used": self.tolerance, "answers": len(distances),
                "unlike": len(distances) - len(finite),       # sharing nothing with their state: no calibration
                "noise": round(max(finite), 6) if finite else None,
                "factor": detectors.CALIBRATION_FACTOR, "floor": detectors.CALIBRATION_FLOOR}

    def _pairs_of(self, name: str, others) -> list[PairTally]:
        return [self.pairs[frozenset((name, o))] for o in others if frozenset((name, o)) in self.pairs]

    # --- the two halves ----------------------------------------------------------------------

    def cross(self, record: Record, who: Identity, computed_by: set[str], *, step: str,
              with_: tuple[str, ...] = ()) -> None:
        """A request under `who` on tokens that identities `computed_by` (not `who`) computed before or
        alongside it: it may reuse nothing beyond the pre-nonce tokens."""
        others = sorted(computed_by - {who.name})
        if not others or who.name in computed_by:
            return
        tallies = self._pairs_of(who.name, others)
        for t in tallies:
            t.cross += 1
        if record.cold:
            for t in tallies:
                t.cross_cold += 1
            return
        if record.proof.low <= record.cold_tolerance:
            return                                       # unknown: neither proven cold nor a leak
        for t in tallies:
            t.cross_reused += 1
        self.leaks += 1
        concurrent = f", sent at the same time as {', '.join(with_)}" if with_ else ""
        self.rq.finding(self.state, "partition_leak", "fail", record,
                        detail=f"{who.describe()} reused {cached_words(record.proof)} of a prompt only "
                               f"{', '.join(others)} had computed{concurrent} (at most {record.cold_tolerance} "
                               f"may be shared before the run nonce): the cache key leaves out the "
                               f"{'salt' if self.field == 'cache_salt' else 'adapter'}",
                        field=self.field, identity=who.name, computed_by=others, cached_tokens=record.proof.low,
                        tolerance=record.cold_tolerance, step=step, concurrent_with=list(with_), via="cache")

    def same(self, record: Record, who: Identity) -> None:
        """A repeat under the identity that computed the prompt: it must hit."""
        tallies = [t for t in self.pairs.values() if who.name in t.names]
        for t in tallies:
            entry = t.same.setdefault(who.name, [0, 0, 0])
            entry[0] += 1
            entry[1] += record.hit
            entry[2] += record.cold
        if record.cold:
            self.rq.finding(self.state, "partition_no_reuse", "warn", record,
                            detail=f"the identical repeat under {who.describe()} reused nothing "
                                   f"({cached_words(record.proof)}): the matching pair must hit, or "
                                   f"'no reuse across identities' proves nothing (is prefix caching on?)",
                            field=self.field, identity=who.name, cached_tokens=record.proof.low)

    # --- answers against each identity's own cold fingerprint ----------------------------------

    async def judge_answers(self, refs: dict[str, Record], sent: list[Sent],
                            cold_ref: Callable[[Identity], Awaitable[Record]], compare_refs: bool = True) -> None:
        """Each answer against its identity's reference and the others'; `compare_refs`: also say
        (once per memo) whether the references can be told apart."""
        e = self.rq.scenario.evidence
        fp = self.rq.fingerprints
        usable = {n: r for n, r in refs.items() if r.cold and r.completion.logprobs}
        names = sorted(usable)
        alike: set[frozenset] = set()
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                m = fp.match(usable[a].completion.logprobs, usable[b].completion.logprobs)
                distinct = not m.matches(e.fingerprint_tolerance + e.fingerprint_margin)
                tally = self.pairs.get(frozenset((a, b)))
                if not compare_refs:
                    if not distinct:
                        alike.add(frozenset((a, b)))
                    continue
                if tally is not None and tally.fingerprints != "indistinct":
                    tally.fingerprints = "distinct" if distinct else "indistinct"
                if not distinct:
                    alike.add(frozenset((a, b)))
                    self.rq.finding(self.state, "fingerprint_indistinct", "info", usable[b],
                                    detail=f"{a} and {b} give the same cold fingerprint on memo "
                                           f"{usable[b].memo.memo_id if usable[b].memo else '?'} (log-probabilities "
                                           f"{m.distance:.4f} apart): on this memo their answers cannot be told apart",
                                    field=self.field, pair=[a, b], distance=m.distance)
        for s in sent:
            own = usable.get(s.identity.name)
            if own is None or not s.record.completion.logprobs or s.record.request == own.request:
                continue
            others = {n: fp.match(s.record.completion.logprobs, r.completion.logprobs) for n, r in usable.items()
                      if n != s.identity.name and frozenset((n, s.identity.name)) not in alike}
            mine = fp.match(s.record.completion.logprobs, own.completion.logprobs)
            verdict, owner = detectors.classify_fingerprint(mine, others, self.tolerance, e.fingerprint_tokens)
            s.record.checks["identity"] = {"identity": s.identity.name, "verdict": verdict, "closest": owner,
                                           "own_distance": mine.distance, "own_agreeing": mine.agreeing}
            self.rq.emit(FingerprintCompared(request=s.record.request, own_request=own.request, verdict=verdict,
                                             agreeing=mine.agreeing, distance=mine.distance, closest=owner))
            if verdict == "foreign_state":
                self._foreign(s, own, owner, mine, others[owner])
            elif verdict == "mismatch":
                await self._mismatch(s, own, mine, cold_ref)

    def _where(self, s: Sent) -> str:
        cached = cached_words(s.record.proof)
        if s.group:
            return f"sent at the same time as {', '.join(n for n in s.group if n != s.identity.name)}, {cached}"
        return f"sent alone ({s.step}), {cached}"

    def _via(self, s: Sent) -> str:
        """What carried another state in: a hit alone, the cache; nothing reused in a batch of identities,
        the batch; a hit in such a batch, either (its own identity's blocks, the rest computed batched)."""
        if s.group:
            return "cache or batch" if s.record.hit else "batch"
        return "cache" if s.record.hit else "unknown"

    def _foreign(self, s: Sent, own: Record, owner: str, mine, theirs) -> None:
        self.leaks += 1
        tally = self.pairs.get(frozenset((s.identity.name, owner)))
        if tally is not None:
            tally.fingerprint_leaks += 1
        how = {"cache": "a cached state computed under it",
               "batch": "no reuse: the request was computed with its weights (a batch that mixes identities)",
               "cache or batch": "a hit, in a batch that mixes identities: the restored state or the batch",
               "unknown": "no reuse proven"}[self._via(s)]
        self.rq.finding(self.state, "partition_leak", "fail", s.record,
                        detail=f"{s.identity.describe()} answered with {owner}'s cold fingerprint ({theirs.agreeing} "
                               f"tokens agree, log-probabilities within {theirs.distance:.4f}) rather than its own "
                               f"({mine.agreeing} tokens, {mine.distance:.4f} apart); {self._where(s)}; {how}",
                        field=self.field, identity=s.identity.name, owner=owner, own_request=own.request,
                        own_distance=mine.distance, owner_distance=theirs.distance, step=s.step,
                        concurrent_with=[n for n in s.group if n != s.identity.name],
                        cached_tokens=s.record.proof.low, via=self._via(s))

    async def _mismatch(self, s: Sent, own: Record, mine, cold_ref) -> None:
        tolerance = self.tolerance
        fp = self.rq.fingerprints
        run = s.record.completion.logprobs
        flip = detectors.compare_logprobs(own.completion.logprobs, run)
        base = dict(field=self.field, identity=s.identity.name, own_request=own.request, own_distance=mine.distance,
                    step=s.step, concurrent_with=[n for n in s.group if n != s.identity.name])
        if detectors.near_tie_explains(mine, flip, tolerance):
            self.rq.finding(self.state, "partition_leak", "info", s.record,
                            detail=f"{s.identity.describe()} flips a near-tied token at output token {flip.token} "
                                   f"({flip.margin:.4f} nats behind on its cold run): numerics, not another state",
                            **base)
            return
        # the same path first: a cold run in between may overwrite the state it resumes from
        # (llama.cpp's `cache_prompt: false` recomputes the slot it lands on)
        reruns = [await s.rerun() for _ in range(REPRODUCE)] if s.rerun is not None else []
        colds = [await cold_ref(s.identity) for _ in range(REPRODUCE)]
        cold_same = sum(bool(c.completion.logprobs) and fp.match(c.completion.logprobs,
                                                                 own.completion.logprobs).matches(tolerance)
                        for c in colds)
        still_off = sum(bool(r.completion.logprobs) and not fp.match(r.completion.logprobs,
                                                                     own.completion.logprobs).matches(tolerance)
                        for r in reruns)
        where = (f"{s.identity.describe()}'s answer is close to no identity's cold fingerprint (first "
                 f"{mine.agreeing} tokens agree with its own, log-probabilities {mine.distance:.4f} apart; "
                 f"{self._where(s)})")
        evidence = dict(base, cold_requests=[c.request for c in colds], rerun_requests=[r.request for r in reruns],
                        cold_reproduced=cold_same, rerun_deviated=still_off, cached_tokens=s.record.proof.low,
                        via=self._via(s))
        if reruns and cold_same == REPRODUCE and still_off == len(reruns):
            self.leaks += 1
            for t in self.pairs.values():
                if s.identity.name in t.names and (not s.group or set(t.names) <= set(s.group)):
                    t.fingerprint_leaks += 1
            self.rq.finding(self.state, "partition_leak", "fail", s.record,
                            detail=f"{where}; {REPRODUCE} more cold runs give its own fingerprint back and "
                                   f"{len(reruns)} more runs of the same path deviate again: it resumes from, or "
                                   f"is computed with, a state that is not its own", **evidence)
        else:
            self.rq.finding(self.state, "partition_leak", "info", s.record,
                            detail=f"{where}; not reproducible ({cold_same}/{REPRODUCE} cold runs match its own, "
                                   f"{still_off}/{len(reruns)} re-runs deviate again): the kernel rather than "
                                   f"another identity's state", **evidence)

    # --- the outcome ---------------------------------------------------------------------------

    def conclude(self) -> list[dict[str, Any]]:
        """Each pair tried, as the report lists it; a pair not proven makes the phase inconclusive."""
        out = []
        for tally in self.pairs.values():
            entry = tally.to_dict()
            out.append(entry)
            if entry["status"] == "unproven":
                self.state.mark_inconclusive(f"{self.field} pair {' / '.join(tally.names)}: {entry['why']}")
        return out


def under(spec, who: Identity):
    """The request spec sent as `who` (model and adapter fields)."""
    return dataclasses.replace(spec, model=who.model, extra=dict(who.extra) or None)
