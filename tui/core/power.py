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
from typing import Any

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
    return (f"To catch a fault on 1 hit in {_one_in(fault_rate)} with {_pct(probability)} probability a soak "
            f"must check {n} hits: {rounds_needed(fault_rate, probability, slots)} rotation rounds at {slots} "
            f"slots for foreign codes ({slots} checked hits a round after the cold round 0), "
            f"{rounds_needed(fault_rate, probability, recall_slots)} for recall ({recall_slots} a round).")


def evidence_counts(report, confidence: float = 0.95) -> dict[str, dict[str, Any]]:
    """Hits checked per kind of evidence, the fail-class faults among them, and the bound.

    Only main-arm requests that got a cache hit (cached tokens > 0) count; controls and
    isolation re-runs are cold or repeat a request already counted. Definitions:
      recall      hits asked for their own code (task recall) whose recall check ran;
      foreign     hits whose foreign-code check ran while the run had already put at least one
                  code other than the hit's own on the wire (a code carried by a request that
                  started earlier): before that there is nothing foreign to recognise. This
                  undercounts slightly (a code is registered when its memo is planted, a little
                  before its first request), never overcounts;
      empty, repetition  hits whose check of that name ran;
      determinism greedy hits compared with their cold run, when the phase classified them
                  (kernel nondeterminism makes the comparison unable to tell: none counted).
    failures: checked hits carrying a fail-class finding of the matching kind (warn and info,
    e.g. a single foreign group or a model fault on both paths, do not count).
    """
    # every report format asks more than once; the answer holds until the report sees more events
    state = (confidence, len(report.starts), len(report.ends), len(report.findings), len(report.fingerprints),
             report.end is not None)
    cached = getattr(report, "_evidence_counts", None)
    if cached is not None and cached[0] == state:
        return cached[1]
    counts = _evidence_counts(report, confidence)
    report._evidence_counts = (state, counts)
    return counts


def _evidence_counts(report, confidence: float) -> dict[str, dict[str, Any]]:
    key = f"upper_bound_{round(confidence * 100)}"
    failed: dict[str, set[int]] = {}
    for f in report.findings:
        if f.severity == "fail" and f.request is not None:
            failed.setdefault(f.kind, set()).add(f.request)
    # a fingerprint fails as a foreign state or as a mismatch
    failed["fingerprint"] = failed.get("foreign_state", set()) | failed.get("fingerprint_mismatch", set())
    checked: dict[str, set[int]] = {name: set() for name, _, _ in KINDS}
    foreign_ok = foreign_checkable(report)
    for rid, start in report.starts.items():
        end = report.ends.get(rid)
        if start.arm != "main" or end is None or not end.cached_tokens or end.error:
            continue
        checks = end.checks or {}
        if start.task == "recall" and "recall" in checks:
            checked["recall"].add(rid)
        if rid in foreign_ok:
            checked["foreign"].add(rid)
        for name in ("empty", "repetition"):
            if name in checks:
                checked[name].add(rid)
        if rid in getattr(report, "fingerprints", {}):
            checked["fingerprint"].add(rid)
        if start.task == "determinism" and start.phase == "determinism":
            if _determinism_kind(report) in ("identical", "cache_path_divergence"):
                checked["determinism"].add(rid)
    out: dict[str, dict[str, Any]] = {}
    for name, finding_kind, _ in KINDS:
        n = len(checked[name])
        fails = len(checked[name] & failed.get(finding_kind, set()))
        if name == "determinism" and _determinism_kind(report) == "cache_path_divergence":
            fails = n                   # hit == hit != cold: every compared hit diverged
        bound = upper_bound(n, fails, confidence)
        out[name] = {"checked_hits": n, "failures": fails, key: None if bound is None else round(bound, 4),
                     "sentence": kind_sentence(name, n, fails, confidence)}
    return out


def foreign_checkable(report) -> set[int]:
    """Requests (any arm) whose foreign-code check ran while another code was already on the wire:
    a code carried by a request that started earlier, other than the request's own."""
    seen: set[str] = set()
    out: set[int] = set()
    for rid, start in sorted(report.starts.items(), key=lambda item: item[1].seq):
        end = report.ends.get(rid)
        if end is not None and "foreign" in (end.checks or {}) and seen - {start.code}:
            out.add(rid)
        if start.code:
            seen.add(start.code)
    return out


def kind_sentence(name: str, n: int, failures: int, confidence: float = 0.95) -> str:
    label = dict((k, words) for k, _, words in KINDS)[name]
    unit = "greedy hits" if name == "determinism" else "hits"
    if n == 0:
        return f"no {unit} {label}: no bound on that fault rate"
    bound = upper_bound(n, failures, confidence)
    if failures == 0:
        return (f"{n} {unit} {label}, 0 {FAILED_WORD[name]}: a per-hit fault rate above {_pct(bound)} "
                f"would have shown with {_pct(confidence)} confidence")
    return (f"{n} {unit} {label}, {failures} {FAILED_WORD[name]} ({_pct(failures / n)}): the per-hit fault "
            f"rate is at most {_pct(bound)} ({_pct(confidence)} upper bound)")


def power_line(report, confidence: float = 0.95) -> str:
    """One sentence for a summary: every kind of evidence, its count and its bound."""
    counts = evidence_counts(report, confidence)
    parts = []
    for name, _, label in KINDS:
        c = counts[name]
        n, fails = c["checked_hits"], c["failures"]
        unit = "greedy hits" if name == "determinism" else "hits"
        if n == 0:
            parts.append(f"no {unit} {label}")
            continue
        bound = _pct(upper_bound(n, fails, confidence))
        tail = f"above {bound} would have shown" if fails == 0 else f"{_pct(fails / n)}, at most {bound}"
        parts.append(f"{n} {unit} {label}, {fails} {FAILED_WORD[name]} ({tail})")
    return f"power at {_pct(confidence)} confidence (per-hit fault rate): " + "; ".join(parts) + "."


def power_json(report, confidence: float = 0.95) -> dict[str, Any]:
    """The "power" object of the JSON report: per-kind counts and bounds, the line, and sizing."""
    slots = rotation_slots(report)
    return {
        "confidence": confidence,
        "model": "independent checked hits, one-sided exact (Clopper-Pearson) upper bound",
        "evidence": evidence_counts(report, confidence),
        "line": power_line(report, confidence),
        "sizing": {"fault_rate": 0.01, "probability": 0.95, "slots": slots,
                   "hits": hits_needed(0.01, 0.95), "rotation_rounds": rounds_needed(0.01, 0.95, slots),
                   "sentence": sizing_sentence(0.01, 0.95, slots)},
    }


def _determinism_kind(report) -> str | None:
    return ((report.phases.get("determinism") or {}).get("determinism") or {}).get("kind")


def rotation_slots(report) -> int:
    settings = ((report.header.scenario if report.header else None) or {}).get("settings") or {}
    slots = (settings.get("rotation") or {}).get("slots")
    return slots if isinstance(slots, int) and slots > 0 else 4


def _pct(value: float) -> str:
    text = f"{value * 100:.1f}".rstrip("0").rstrip(".")
    return f"{text}%"


def _one_in(rate: float) -> str:
    inverse = 1.0 / rate
    return f"{inverse:.0f}" if abs(inverse - round(inverse)) < 1e-6 else f"{inverse:.1f}"
