"""Statistical power of a soak: how rare a fault a run could have missed. Pure functions.

The model behind every number: each checked hit independently shows a fault with the same
unknown probability (the per-hit fault rate). Seeing `failures` faults in `n` checked hits,
the one-sided upper confidence bound is the largest rate that still makes so few faults
plausible (Clopper-Pearson, exact). With zero failures that is 1 - (1 - c)^(1/n); the "rule
of three", 3/n, is its familiar approximation at 95% (-ln 0.05 = 2.996). Hits within one run
are not strictly independent (a broken restore may fail in bursts), so read the bound as
"a fault this frequent, spread evenly, would have shown", not as a guarantee.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .fmt import pct
from ..config.phase_registry import hook, providers
from ..log.events import Finding, FingerprintCompared, PhaseFinished, RequestFinished, RequestStarted

# Evidence kinds, in report order: (key, finding kind that fails it, how a sentence names it).
KINDS = (
    ("recall", "recall_miss", "checked for their own code"),
    ("foreign", "foreign_code", "checked for foreign codes"),
    ("empty", "empty_answer", "checked for empty answers"),
    ("repetition", "repetition", "checked for repetition"),
    ("determinism", "cache_path_divergence", "compared with their cold run"),
    ("fingerprint", "fingerprint", "compared with their cold fingerprint"),
)
FAILED_WORD = {"recall": "wrong", "foreign": "seen", "empty": "empty", "repetition": "repeating",
               "determinism": "diverged", "fingerprint": "off"}


def binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), summed in log space (stable for large n)."""
    if k < 0:
        return 0.0
    if k >= n or p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    log_p, log_q = math.log(p), math.log1p(-p)
    head = math.lgamma(n + 1)
    return min(1.0, sum(math.exp(head - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p + (n - i) * log_q)
                        for i in range(k + 1)))


def upper_bound(n_checked: int, failures: int = 0, confidence: float = 0.95) -> float | None:
    """One-sided upper confidence bound on the per-hit fault rate; None when nothing was checked."""
    if n_checked <= 0:
        return None
    if not 0.0 < confidence < 1.0:
        raise ValueError("confidence must be between 0 and 1")
    if failures < 0 or failures > n_checked:
        raise ValueError("failures must be between 0 and n_checked")
    alpha = 1.0 - confidence
    if failures == 0:
        return 1.0 - alpha ** (1.0 / n_checked)     # exact; ~ 3/n at 95% (the rule of three)
    if failures == n_checked:
        return 1.0
    # Clopper-Pearson: the p at which P(X <= failures | n, p) = alpha (the beta quantile
    # Beta(failures + 1, n - failures).ppf(confidence)); the CDF falls as p rises.
    low, high = failures / n_checked, 1.0
    for _ in range(200):
        mid = (low + high) / 2
        if binom_cdf(failures, n_checked, mid) > alpha:
            low = mid
        else:
            high = mid
        if high - low < 1e-12:
            break
    return high


def hits_needed(fault_rate: float, probability: float = 0.95) -> int:
    """Checked hits needed to see at least one fault of this per-hit rate with this probability."""
    if not 0.0 < fault_rate < 1.0 or not 0.0 < probability < 1.0:
        raise ValueError("fault_rate and probability must be between 0 and 1")
    return math.ceil(math.log(1.0 - probability) / math.log(1.0 - fault_rate) - 1e-9)


def rounds_needed(fault_rate: float, probability: float = 0.95, hits_per_round: int = 4) -> int:
    """Rotation rounds for that: round 0 is cold (it writes the blocks), every later round checks
    `hits_per_round` hits (one per slot for foreign codes; recall is asked on every other slot)."""
    if hits_per_round <= 0:
        raise ValueError("hits_per_round must be positive")
    return math.ceil(hits_needed(fault_rate, probability) / hits_per_round) + 1


def sizing_sentence(fault_rate: float, probability: float = 0.95, slots: int = 4) -> str:
    """The scenario sizing, said: e.g. 1 corrupt hit in 100, 95% -> 299 hits -> 76 rounds at 4 slots."""
    n = hits_needed(fault_rate, probability)
    recall_slots = max(1, (slots + 1) // 2)
    return (f"To catch a fault on 1 hit in {_one_in(fault_rate)} with {pct(probability)} probability a soak "
            f"must check {n} hits: {rounds_needed(fault_rate, probability, slots)} rotation rounds at {slots} "
            f"slots for foreign codes ({slots} checked hits a round after the cold round 0), "
            f"{rounds_needed(fault_rate, probability, recall_slots)} for recall ({recall_slots} a round).")


@dataclass(frozen=True)
class WidthRow:
    """What one rotation width buys toward a power target (issue 34: `hitproof size --streams`)."""
    slots: int
    checked_per_round: int         # hits checked a round after the cold round 0
    rounds: int                    # rounds to the target, round 0 included
    requests: int                  # rounds x slots
    seconds: float | None          # requests / the measured requests per second (None: no rate given)


def width_rows(fault_rate: float, probability: float, widths: list[int], rates: list[float] | None = None,
               every_slot: bool = True) -> list[WidthRow]:
    """One row per width. `every_slot`: every slot's hit is checked (fingerprints, or recall asked on every
    slot as quick and gpu-quick do); else recall on every other slot. `rates`: requests per second measured
    at each width (one value: the same for all); the seconds are rounds x slots / rate."""
    rows = []
    for i, slots in enumerate(widths):
        per_round = slots if every_slot else max(1, (slots + 1) // 2)
        rounds = rounds_needed(fault_rate, probability, per_round)
        rate = (rates[i] if len(rates) > 1 else rates[0]) if rates else None
        rows.append(WidthRow(slots, per_round, rounds, rounds * slots, rounds * slots / rate if rate else None))
    return rows


def proven_hit(e) -> bool:
    """A request end proves a hit: more cached tokens (reported, or the lower bound a counter proved)
    than the template a cold request may share before the run nonce."""
    proven = e.cached_tokens if e.cached_tokens is not None else (e.cached_min or 0)
    return proven > (e.cold_tolerance or 0)


def proven_cold(e) -> bool:
    """A request end proves a cold request: it reused at most the tokens before the run nonce
    (its exact count, or the upper bound a counter proved)."""
    known = e.cached_tokens if e.cached_tokens is not None else e.cached_max
    return known is not None and known <= (e.cold_tolerance or 0)


class EvidenceTally:
    """Hits checked per kind of evidence and the fail-class faults among them, folded from the event
    stream as it goes (the engine's power target and every report count with this one definition).

    Only main-arm requests with a proven cache hit count (cached tokens > 0, reported or attributed
    from the server's counter); controls and isolation re-runs are cold or repeat a request already
    counted. Definitions:
      recall      hits asked for their own code (task recall) whose recall check ran;
      foreign     hits whose foreign-code check ran while the run had already put at least one
                  code other than the hit's own on the wire (a code carried by a request that
                  started earlier): before that there is nothing foreign to recognise. This
                  undercounts slightly (a code is registered when its memo is planted, a little
                  before its first request), never overcounts;
      empty, repetition  hits whose check of that name ran;
      determinism greedy hits compared with their cold run: the determinism phase's, when it classified
                  them (kernel nondeterminism makes the comparison unable to tell: none counted), and every
                  other hit whose whole greedy answer the judge held against its prompt's cold answer
                  (FingerprintCompared.text_same set: soak/greedy.py);
      fingerprint hits compared with their own cold fingerprint.
    failures: checked hits carrying a fail-class finding of the matching kind (warn and info, e.g.
    a single foreign group too likely by chance, a model fault on both paths, or a near-tied flip,
    do not count). Per request one byte of flags: 100,000 requests cost 200 KB.
    """

    _BIT = {name: 1 << i for i, (name, _, _) in enumerate(KINDS)}
    _FAILS = {"recall_miss": "recall", "foreign_code": "foreign", "empty_answer": "empty",
              "repetition": "repetition", "foreign_state": "fingerprint", "fingerprint_mismatch": "fingerprint",
              "cache_path_divergence": "determinism"}

    def __init__(self) -> None:
        self._codes: set[str] = set()
        self._started: dict[int, tuple[str, str, bool, bool]] = {}   # in flight: phase, task, foreign-able, main
        self.ran: dict[str, set[str]] = {}                     # phase -> names of the checks that ran in it
        self._checked = bytearray()                            # request id -> flags of kinds checked
        self._failed = bytearray()                             # request id -> flags of kinds failed
        self.checked = {name: 0 for name, _, _ in KINDS}
        self.failures = {name: 0 for name, _, _ in KINDS}
        # evidence a phase counts itself (its POWER_EVIDENCE kind): its proven main-arm hits of its
        # POWER_TASK, its summary, whether a fail-class finding of its POWER_FAILS kind came
        self._phase_hits: dict[str, int] = {}
        self._phase_summary: dict[str, dict] = {}
        self._phase_failed: set[str] = set()

    def feed(self, event) -> None:
        handler = self._HANDLERS.get(type(event))
        if handler is not None:
            handler(self, event)

    def _on_start(self, e) -> None:
        others = len(self._codes) - (e.code in self._codes)    # codes other than its own (no copy of the set)
        self._started[e.request] = (e.phase, e.task, others > 0, e.arm == "main")
        if e.code:
            self._codes.add(e.code)

    def _on_end(self, e) -> None:
        started = self._started.pop(e.request, None)
        if started is None:
            return
        phase, task, foreign_able, main = started
        checks = e.checks or {}
        ran = self.ran.setdefault(phase, set())
        ran.update(name for name in checks if name != "foreign")
        if foreign_able and "foreign" in checks:
            ran.add("foreign")       # before a second code exists there is nothing foreign to see
        if not main or e.error or not proven_hit(e):
            return
        kinds = []
        if task == "recall" and "recall" in checks:
            kinds.append("recall")
        if foreign_able and "foreign" in checks:
            kinds.append("foreign")
        kinds += [name for name in ("empty", "repetition") if name in checks]
        for name in kinds:
            self._mark(self._checked, e.request, name)
            self.checked[name] += 1
        if task == hook(phase, "POWER_TASK"):
            self._phase_hits[phase] = self._phase_hits.get(phase, 0) + 1

    def _on_fingerprint(self, e) -> None:
        if getattr(e, "told_apart", None) is False:
            return        # its memo has a look-alike: neither comparison shows a state it was given (judge.py)
        if not self._flag(self._checked, e.request, "fingerprint"):
            self._mark(self._checked, e.request, "fingerprint")
            self.checked["fingerprint"] += 1
        if getattr(e, "text_same", None) is not None and not self._flag(self._checked, e.request, "determinism"):
            self._mark(self._checked, e.request, "determinism")      # its whole greedy answer against cold
            self.checked["determinism"] += 1

    def _on_finding(self, f) -> None:
        if f.severity != "fail":
            return
        if f.phase and f.kind == hook(f.phase, "POWER_FAILS"):
            self._phase_failed.add(f.phase)
        name = self._FAILS.get(f.kind)
        if name is None or f.request is None:
            return
        if self._flag(self._checked, f.request, name) and not self._flag(self._failed, f.request, name):
            self._mark(self._failed, f.request, name)
            self.failures[name] += 1

    def _on_phase_end(self, e) -> None:
        if hook(e.phase, "power_evidence") is not None:
            self._phase_summary[e.phase] = e.summary or {}

    _HANDLERS = {RequestStarted: _on_start, RequestFinished: _on_end, FingerprintCompared: _on_fingerprint,
                 Finding: _on_finding, PhaseFinished: _on_phase_end}

    def _mark(self, flags: bytearray, rid: int, name: str) -> None:
        if rid < 0:
            return
        if rid >= len(flags):
            flags.extend(bytes(max(rid + 1 - len(flags), 1024)))
        flags[rid] |= self._BIT[name]

    def _flag(self, flags: bytearray, rid: int, name: str) -> bool:
        return 0 <= rid < len(flags) and bool(flags[rid] & self._BIT[name])

    def counts(self, confidence: float = 0.95) -> dict[str, dict[str, Any]]:
        key = f"upper_bound_{round(confidence * 100)}"
        out: dict[str, dict[str, Any]] = {}
        for name, _, _ in KINDS:
            n, fails = self.checked[name], self.failures[name]
            counted_by = providers("POWER_EVIDENCE", name)
            if counted_by:                     # a phase's own evidence (added to the judge's): it says what its hits prove
                for phase, module in counted_by.items():
                    hits = self._phase_hits.get(phase, 0)
                    got = module.power_evidence(hits, self._phase_summary.get(phase) or {}, phase in self._phase_failed)
                    n, fails = n + got[0], fails + got[1]
            bound = upper_bound(n, fails, confidence)
            out[name] = {"checked_hits": n, "failures": fails, key: None if bound is None else round(bound, 4),
                         "sentence": kind_sentence(name, n, fails, confidence)}
        return out


def evidence_counts(report, confidence: float = 0.95) -> dict[str, dict[str, Any]]:
    """Hits checked per kind of evidence, the fail-class faults among them, and the bound (the
    report's EvidenceTally: see its docstring for the definitions)."""
    return report.tally.counts(confidence)


def target_sentence(evidence: str, checked: int, failures: int, fault_rate: float, confidence: float) -> tuple[bool, str]:
    """(reached, the verdict line's words) for a power target: zero faults in n checked hits rule out
    a rate p when n >= ln(1/(1-c)) / -ln(1-p) (about 300 hits for 1% at 95%)."""
    needed = hits_needed(fault_rate, confidence)
    label = dict((k, words) for k, _, words in KINDS)[evidence]
    bound = upper_bound(checked, failures, confidence)
    if failures == 0 and checked >= needed:
        return True, (f"rules out per-hit fault rates above {pct(bound)} at {pct(confidence)} "
                      f"({checked} hits {label}, 0 failed)")
    got = "nothing" if bound is None else f"only rates above {pct(bound)}"
    return False, (f"power target not reached: {checked} of {needed} hits {label} needed to rule out "
                   f"{pct(fault_rate)} at {pct(confidence)} (rules out {got}; {needed - checked} short)")


def kind_sentence(name: str, n: int, failures: int, confidence: float = 0.95) -> str:
    label = dict((k, words) for k, _, words in KINDS)[name]
    unit = _unit(name)
    if n == 0:
        return f"no {unit} {label}: no bound on that fault rate"
    bound = upper_bound(n, failures, confidence)
    if failures == 0:
        return (f"{n} {unit} {label}, 0 {FAILED_WORD[name]}: a per-hit fault rate above {pct(bound)} "
                f"would have shown with {pct(confidence)} confidence")
    return (f"{n} {unit} {label}, {failures} {FAILED_WORD[name]} ({pct(failures / n)}): the per-hit fault "
            f"rate is at most {pct(bound)} ({pct(confidence)} upper bound)")


def power_line(report, confidence: float = 0.95) -> str:
    """One sentence for a summary: every kind of evidence, its count and its bound."""
    counts = evidence_counts(report, confidence)
    parts = []
    for name, _, label in KINDS:
        c = counts[name]
        n, fails = c["checked_hits"], c["failures"]
        unit = _unit(name)
        if n == 0:
            parts.append(f"no {unit} {label}")
            continue
        bound = pct(upper_bound(n, fails, confidence))
        tail = f"above {bound} would have shown" if fails == 0 else f"{pct(fails / n)}, at most {bound}"
        parts.append(f"{n} {unit} {label}, {fails} {FAILED_WORD[name]} ({tail})")
    return f"power at {pct(confidence)} confidence (per-hit fault rate): " + "; ".join(parts) + "."


def power_json(report, confidence: float = 0.95) -> dict[str, Any]:
    """The "power" object of the JSON report: per-kind counts and bounds, the line, sizing, and the
    scenario's target with whether it was reached (`target`, null when none was asked for)."""
    slots = rotation_slots(report)
    target = getattr(report, "power_target", None)
    rate = target.fault_rate if target is not None else 0.01
    probability = target.confidence if target is not None else 0.95
    return {
        "confidence": confidence,
        "model": "independent checked hits, one-sided exact (Clopper-Pearson) upper bound",
        "evidence": evidence_counts(report, confidence),
        "line": power_line(report, confidence),
        "sizing": {"fault_rate": rate, "probability": probability, "slots": slots,
                   "hits": hits_needed(rate, probability), "rotation_rounds": rounds_needed(rate, probability, slots),
                   "sentence": sizing_sentence(rate, probability, slots)},
        "target": None if target is None else {
            "evidence": target.evidence, "fault_rate": target.fault_rate, "confidence": target.confidence,
            "checked_hits": target.checked, "failures": target.failures, "needed": target.needed,
            "reached": target.reached, "upper_bound": target.upper_bound, "sentence": target.sentence},
    }


def rotation_slots(report) -> int:
    settings = ((report.header.scenario if report.header else None) or {}).get("settings") or {}
    slots = (settings.get("rotation") or {}).get("slots")
    return slots if isinstance(slots, int) and slots > 0 else 4


def _unit(kind: str) -> str:
    """What a kind of evidence counts: hits, or what the phase counting it calls them ("greedy hits")."""
    return next((getattr(m, "POWER_UNIT", "hits") for m in providers("POWER_EVIDENCE", kind).values()), "hits")


def _one_in(rate: float) -> str:
    inverse = 1.0 / rate
    return f"{inverse:.0f}" if abs(inverse - round(inverse)) < 1e-6 else f"{inverse:.1f}"
