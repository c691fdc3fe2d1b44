"""What one phase has seen, as running totals, and what it concludes: pass, fail or inconclusive."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..server.metrics import LLAMA_CACHED, PREEMPTIONS, PREFIX_HITS, PREFIX_QUERIES, MetricSnapshot, cached_tokens_delta, delta
from ..report import fmt
from ..report.latency import Series
from .proof import quantum
from .record import Record
from .results import HitClaims, PhaseResult, Reuse


@dataclass
class PhaseState:
    """What a phase has seen, as running totals: a night-long phase keeps its memory flat."""

    name: str
    requests: int = 0                 # main arm
    hit_count: int = 0                # main-arm requests proven to hit
    unknown_cached: int = 0           # main-arm requests neither proven hit nor proven cold
    cached_tokens: int = 0            # proven cached tokens (exact, or the proven lower bound)
    prompt_tokens: int = 0
    control_requests: int = 0
    reported_cached: int = 0          # main + control + isolation, for the metric comparison
    reported_unknown: bool = False    # some request's cached tokens were not reported by the server
    proven_by: dict[str, int] = field(default_factory=lambda: {"request": 0, "counter": 0})   # hits
    counter_members: int = 0          # main-arm requests that needed the counter
    counter_attributed: int = 0       # ... and came out proven hit or proven cold
    # TTFT seconds, bounded (issue 26: as lists they grew 32 bytes a main request for the whole run);
    # the median is Series.quantile(0.5), the same number as the report's p50
    ttft_cold: Series = field(default_factory=Series)
    ttft_hit: Series = field(default_factory=Series)
    last: Record | None = None
    inconclusive: list[str] = field(default_factory=list)
    findings: dict[str, int] = field(default_factory=lambda: {"fail": 0, "warn": 0, "info": 0})
    expected_hits: int = 0
    unproven_expected: int = 0        # requests that should have hit whose hit is not proven
    routing_misses: int = 0           # ... sent to a replica that had never served their memo (re-sent)
    cold_failures: int = 0
    model_failures: int = 0
    hits_required: bool = True
    redraws_memos: bool = False       # the phase re-draws memos whose fingerprints are not distinct
    # memos alike by fingerprint (what was noted) and the hits judged by fingerprint whose memo had no
    # look-alike: the phase proved nothing by fingerprint only when it noted some and told none apart
    lookalikes: list[str] = field(default_factory=list)
    told_apart: int = 0
    # memos whose cold run missed their own code while the phase re-draws such memos (rotation's round 0);
    # None: a cold miss leaves the phase inconclusive at once
    unrecalled: list[str] | None = None
    no_report_fix: str = ""           # the server option that makes it report cached tokens
    metrics_before: MetricSnapshot | None = None
    metrics_after: MetricSnapshot | None = None
    # what the phase found beyond these totals: its own typed result (a dataclass of its module), and the
    # two results phases share (a hit's claims, reuse lost); each adds its keys to the summary
    result: PhaseResult | None = None
    claims: HitClaims = field(default_factory=HitClaims)
    reuse: Reuse = field(default_factory=Reuse)
    finished: bool = False

    def missed_cold(self, record: Record) -> None:
        """A cold run missed its own code (the model, not the cache): re-drawn while the phase re-draws such
        memos, else the phase's recall evidence has no baseline."""
        if self.unrecalled is not None and record.memo is not None:
            self.unrecalled.append(record.memo.memo_id)
        else:
            self.mark_inconclusive(f"cold baseline failed on request {record.request} (recall_miss)")

    def note(self, record: Record, arm: str) -> None:
        proof = record.proof
        if proof.source == "request":
            self.reported_cached += proof.low
        else:
            self.reported_unknown = True
        if arm != "main":
            self.control_requests += arm == "control"
            return
        self.requests += 1
        self.last = record
        self.cached_tokens += proof.low
        self.prompt_tokens += record.completion.prompt_tokens or 0
        if proof.source == "counter":
            self.counter_members += 1
        ttft = record.completion.ttft_s
        if record.hit:
            self.hit_count += 1
            self.proven_by[proof.source] = self.proven_by.get(proof.source, 0) + 1
            self.counter_attributed += proof.source == "counter"
            if ttft:
                self.ttft_hit.append(ttft)
        elif record.cold:
            self.counter_attributed += proof.source == "counter"
            if ttft:
                self.ttft_cold.append(ttft)
        else:
            self.unknown_cached += 1      # unknown is never zero: neither a hit nor a cold request

    @property
    def fail_findings(self) -> int:
        return self.findings["fail"]

    def mark_inconclusive(self, reason: str) -> None:
        if reason not in self.inconclusive:
            self.inconclusive.append(reason)

    def status(self) -> tuple[str, list[str]]:
        reasons = list(self.inconclusive)
        if self.hits_required and self.requests and not self.hit_count:
            # a phase that needed hits and proved none is never a pass, whatever the reason
            if self.unknown_cached:
                reasons.append(f"no cache hit proven: cached tokens unknown on {self.unknown_cached} of "
                               f"{self.requests} requests" + (f" ({self.no_report_fix})" if self.no_report_fix else ""))
            else:
                reasons.append("no request got a cache hit")
        if self.lookalikes and not self.told_apart:
            reasons.append(f"{self.lookalikes[0]}; no hit of this phase was told apart from every other memo: "
                           f"leak detection by fingerprint is inconclusive")
        if self.fail_findings:
            return "fail", reasons
        return ("inconclusive", reasons) if reasons else ("pass", [])

    def proof_sentence(self) -> str:
        """How this phase's hits were proven, in words ("per request", "by counter, N of M attributed")."""
        if not self.hit_count and not self.counter_members:
            return "no hits" if not self.unknown_cached else "unproven"
        parts = []
        if self.proven_by.get("request"):
            parts.append("per request")
        if self.counter_members:
            parts.append(f"by counter, {self.counter_attributed} of {self.counter_members} attributed")
        return ", ".join(parts) or "unproven"

    def summary(self) -> dict[str, Any]:
        reported_sum = None if self.reported_unknown else self.reported_cached
        metric_hits = cached_tokens_delta(self.metrics_before, self.metrics_after)
        summary = {
            "requests": self.requests,
            "control_requests": self.control_requests,
            "hits": self.hit_count,
            "expected_hits": self.expected_hits,
            "unproven_hits": self.unproven_expected,
            "unknown_cached": self.unknown_cached,
            "hits_proven": self.proof_sentence(),
            "proven_by": {"request": self.proven_by.get("request", 0), "counter": self.proven_by.get("counter", 0),
                          "counter_attributed": self.counter_attributed, "counter_members": self.counter_members},
            # unknown is never zero: a phase where no request's cached tokens were known proved no sum
            "cached_tokens": None if self.requests and self.unknown_cached == self.requests else self.cached_tokens,
            "prompt_tokens": self.prompt_tokens,
            "ttft_cold_ms": fmt.to_ms(self.ttft_cold.quantile(0.5)) if self.ttft_cold else None,
            "ttft_hit_ms": fmt.to_ms(self.ttft_hit.quantile(0.5)) if self.ttft_hit else None,
            "cold_failures": self.cold_failures,
            "model_failures": self.model_failures,
            "findings": dict(self.findings),
            "metrics": {
                "prefix_cache_queries": delta(self.metrics_before, self.metrics_after, PREFIX_QUERIES),
                "prefix_cache_hits": metric_hits,
                "preemptions": delta(self.metrics_before, self.metrics_after, PREEMPTIONS),
            },
            "reported_cached_tokens": reported_sum,
            "hits_agree": self.hits_agree(),
        }
        if self.routing_misses:
            summary["routing_misses"] = self.routing_misses
        for result in (self.claims, self.reuse, self.result):
            if result is not None:
                summary.update(result.summary())
        return summary

    def hits_agree(self) -> bool | None:
        """Per-request cached tokens against the server counter's delta over the phase; None when either
        is unknown. A counter printed with 6 significant digits (llama.cpp) agrees within its steps."""
        reported_sum = None if self.reported_unknown else self.reported_cached
        metric_hits = cached_tokens_delta(self.metrics_before, self.metrics_after)
        if metric_hits is None or reported_sum is None:
            return None
        step = quantum(max(_counter_value(self.metrics_before), _counter_value(self.metrics_after)))
        return abs(metric_hits - reported_sum) <= 2 * step


def _counter_value(snapshot: MetricSnapshot | None) -> float:
    if snapshot is None:
        return 0.0
    return max(snapshot.get(PREFIX_HITS) or 0.0, snapshot.get(LLAMA_CACHED) or 0.0)
