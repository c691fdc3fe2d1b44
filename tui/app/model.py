"""What the app shows, folded from the event stream. Plain Python: no Textual here.

Live runs and replays feed the same events into the same model, so both show the same thing.
Widgets read this model at a capped frame rate; nothing here touches a widget.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

from ..core.log import events as ev
from ..core.report.progress import ProgressFold
from ..core.report.report import RunReport

MAX_LOG_LINES = 2000
MAX_METRIC_POINTS = 120
MAX_REQUESTS_KEPT = 4000


@dataclass
class PhaseView:
    name: str
    title: str = ""
    status: str = "pending"      # pending | running | pass | fail | inconclusive
    planned: int = 0
    done: int = 0
    hits: int = 0
    round: int | None = None
    rounds: int = 0
    reasons: list[str] = field(default_factory=list)


@dataclass
class Highlight:
    start: int
    end: int
    style: str                   # own | foreign | repeat | divergence
    label: str = ""


@dataclass
class RequestView:
    request: int
    phase: str
    slot: int | None
    round: int | None
    memo: str | None
    code: str | None
    task: str
    arm: str
    of_request: int | None
    expect: str
    prompt_tail: str
    max_tokens: int
    text: str = ""
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    ttft: float | None = None
    total: float | None = None
    finished: bool = False
    checks: dict[str, Any] = field(default_factory=dict)
    findings: list[ev.Finding] = field(default_factory=list)
    error: str | None = None
    server_id: str | None = None     # the answer's own id: vLLM's log names the request by it
    rev: int = 0                 # bumps on every change, so a panel redraws only when its request changed

    @property
    def badge(self) -> str:
        """pending | ok | fail | warn | info — the worst finding on it, else ok once finished."""
        order = {"fail": 0, "warn": 1, "info": 2}
        if self.findings:
            return min((f.severity for f in self.findings), key=order.__getitem__)
        return "ok" if self.finished else "pending"

    def highlights(self, registry: dict[str, str]) -> list[Highlight]:
        marks: list[Highlight] = []
        recall = self.checks.get("recall")
        if recall and recall.get("offset") is not None and recall.get("matched"):
            start = recall["offset"]
            marks.append(Highlight(start, start + len(recall["matched"]), "own",
                                   "own code" if recall["status"] == "exact" else "partial code"))
        elif self.code:
            at = self.text.find(self.code)
            if at >= 0:
                marks.append(Highlight(at, at + len(self.code), "own", "own code"))
        for foreign in self.checks.get("foreign") or []:
            start = foreign["offset"]
            marks.append(Highlight(start, start + len(foreign["matched"]), "foreign",
                                   f"foreign: {foreign['code']} of {foreign['owner']} @ {start}"))
        rep = self.checks.get("repetition")
        if rep:
            marks.append(Highlight(rep["offset"], rep["offset"] + len(rep["unit"]) * rep["count"], "repeat",
                                   f"{rep['unit']!r} x{rep['count']} @ {rep['offset']}"))
        return sorted(marks, key=lambda h: h.start)


@dataclass
class SlotView:
    slot: int
    request: int | None = None   # the request shown (the latest main-arm one in this slot)


@dataclass
class IsolationView:
    request: int
    kind: str
    k: int
    sent: int = 0
    result: ev.IsolationFinished | None = None


class RunModel:
    """Folds events into the state the widgets draw. `version` bumps on every change."""

    def __init__(self) -> None:
        self.report = RunReport()
        self.progress = ProgressFold(self.report.tally)     # requests done of planned, estimates, power
        self.phases: dict[str, PhaseView] = {}
        self.current_phase: str | None = None
        self.slots: dict[int, SlotView] = {}
        self.requests: collections.OrderedDict[int, RequestView] = collections.OrderedDict()
        self.memos: dict[str, ev.MemoPlanted] = {}
        self.registry: dict[str, str] = {}
        self.findings: list[ev.Finding] = []
        self._flagged: collections.Counter[int] = collections.Counter()   # request -> findings on it
        self._severities: collections.Counter[str] = collections.Counter()
        self.metrics_version = 0
        self.metrics: collections.deque[dict[str, float]] = collections.deque(maxlen=MAX_METRIC_POINTS)
        self.metric_times: collections.deque[float] = collections.deque(maxlen=MAX_METRIC_POINTS)
        self.server_log: collections.deque[str] = collections.deque(maxlen=MAX_LOG_LINES)
        self.server_log_total = 0
        self.isolations: dict[int, IsolationView] = {}
        self.active_isolation: int | None = None
        self.assignment: dict[str, str] = {}
        self.events_seen = 0
        self.last_t = 0.0
        self.version = 0

    # --- folding --------------------------------------------------------------------------

    def apply(self, event: ev.Event) -> None:
        self.events_seen += 1
        if event.t > self.last_t:
            self.last_t = event.t
        self.report.feed(event)
        self.progress.feed(event)
        kind = event.type
        try:
            handler = _HANDLERS[kind]
        except KeyError:
            handler = _HANDLERS[kind] = getattr(RunModel, f"_on_{kind}", None)
        if handler is not None:
            handler(self, event)
        self.version += 1

    def _on_phase_start(self, e: ev.PhaseStarted) -> None:
        self.phases[e.phase] = PhaseView(e.phase, e.title, "running", e.planned_requests, rounds=e.rounds)
        self.current_phase = e.phase
        self.slots = {}
        self.assignment = {}

    def _on_round(self, e: ev.RoundStarted) -> None:
        phase = self.phases.get(e.phase)
        if phase:
            phase.round, phase.rounds = e.round, e.rounds
        self.assignment = dict(e.assignment)

    def _on_phase_end(self, e: ev.PhaseFinished) -> None:
        phase = self.phases.setdefault(e.phase, PhaseView(e.phase))
        phase.status, phase.reasons = e.status, list(e.reasons)
        phase.done = (e.summary or {}).get("requests") or phase.done
        phase.hits = e.summary.get("hits", phase.hits)

    def _on_memo(self, e: ev.MemoPlanted) -> None:
        self.memos[e.memo] = e
        if e.code:
            self.registry[e.code] = e.memo

    def _on_request_start(self, e: ev.RequestStarted) -> None:
        view = RequestView(e.request, e.phase, e.slot, e.round, e.memo, e.code, e.task, e.arm, e.of_request,
                           e.expect, e.prompt_tail, e.max_tokens)
        self.requests[e.request] = view
        while len(self.requests) > MAX_REQUESTS_KEPT:
            oldest = next(iter(self.requests))
            if oldest in self._flagged:
                self.requests.move_to_end(oldest)      # flagged requests stay openable
                if len(self.requests) <= MAX_REQUESTS_KEPT + 64:
                    break
            else:
                del self.requests[oldest]
        if e.arm == "isolation" and e.of_request in self.isolations:
            self.isolations[e.of_request].sent += 1
            return
        if e.arm == "main":
            slot = e.slot if e.slot is not None else 0
            self.slots.setdefault(slot, SlotView(slot)).request = e.request

    def _on_delta(self, e: ev.AnswerDelta) -> None:
        view = self.requests.get(e.request)
        if view is not None:
            view.text += e.text
            view.rev += 1

    def _on_request_end(self, e: ev.RequestFinished) -> None:
        view = self.requests.get(e.request)
        if view is None:
            return
        view.text = e.text
        view.prompt_tokens, view.cached_tokens = e.prompt_tokens, e.cached_tokens
        view.ttft, view.total, view.checks, view.error = e.ttft, e.total, e.checks, e.error
        view.server_id = e.server_id
        view.finished = True
        view.rev += 1
        phase = self.phases.get(e.phase)
        if phase is not None and view.arm == "main":
            phase.done += 1
            if e.cached_tokens:
                phase.hits += 1

    def _on_finding(self, e: ev.Finding) -> None:
        self.findings.append(e)
        self._severities[e.severity] += 1
        if e.request is not None:
            self._flagged[e.request] += 1
        view = self.requests.get(e.request) if e.request is not None else None
        if view is not None:
            view.findings.append(e)
            view.rev += 1

    def _on_metrics(self, e: ev.MetricsSample) -> None:
        self.metrics.append(dict(e.values))
        self.metric_times.append(e.t)
        self.metrics_version += 1

    def _on_server_log(self, e: ev.ServerLog) -> None:
        self.server_log.append(e.line)
        self.server_log_total += 1

    def _on_isolation_start(self, e: ev.IsolationStarted) -> None:
        self.isolations[e.request] = IsolationView(e.request, e.kind, e.k)
        self.active_isolation = e.request

    def _on_isolation_end(self, e: ev.IsolationFinished) -> None:
        view = self.isolations.setdefault(e.request, IsolationView(e.request, e.kind, e.k))
        view.result = e
        if self.active_isolation == e.request:
            self.active_isolation = None

    # --- derived views --------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return self.report.end is not None

    def slot_requests(self) -> list[tuple[int, RequestView | None]]:
        return [(slot, self.requests.get(view.request) if view.request else None)
                for slot, view in sorted(self.slots.items())]

    def metric_series(self, name: str, *, rate: bool = False) -> list[float]:
        values = [m.get(name) for m in self.metrics]
        if not rate:
            return [v for v in values if v is not None]
        out = []
        for a, b in zip(values, values[1:]):
            if a is not None and b is not None:
                out.append(max(0.0, b - a))
        return out

    def hit_rate_series(self) -> list[float]:
        """Per-interval prefix-cache hit rate (hit tokens / queried tokens)."""
        q = self.metric_series("vllm:prefix_cache_queries_total", rate=True)
        h = self.metric_series("vllm:prefix_cache_hits_total", rate=True)
        return [(hits / queries) if queries else 0.0 for hits, queries in zip(h, q)]

    def cumulative_hit_rate(self) -> float | None:
        """Hit tokens / queried tokens since the first sample of the run."""
        first = next((m for m in self.metrics if "vllm:prefix_cache_queries_total" in m), None)
        last = next((m for m in reversed(self.metrics) if "vllm:prefix_cache_queries_total" in m), None)
        if first is None or last is None or "vllm:prefix_cache_hits_total" not in last:
            return None
        queries = last["vllm:prefix_cache_queries_total"] - first["vllm:prefix_cache_queries_total"]
        hits = last["vllm:prefix_cache_hits_total"] - first.get("vllm:prefix_cache_hits_total", 0.0)
        return hits / queries if queries > 0 else None

    def latest(self, name: str) -> float | None:
        for sample in reversed(self.metrics):
            if name in sample:
                return sample[name]
        return None

    def totals(self) -> dict[str, Any]:
        main = [r for r in self.requests.values() if r.arm == "main" and r.finished]
        return {
            "requests": len(self.report.starts),
            "hits": self.report.cache_hits(),
            "cached_tokens": sum(r.cached_tokens or 0 for r in main),
            "fail": self._severities["fail"],
            "warn": self._severities["warn"],
            "info": self._severities["info"],
        }


_HANDLERS: dict[str, Any] = {}       # event type -> RunModel._on_<type> (None: nothing to fold)
