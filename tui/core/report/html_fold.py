"""What the HTML report needs beyond a RunReport, folded from the log in one pass: metrics samples,
conversation and agent turns, and answer texts (only in a sliding window of recent requests,
pinned when a finding names one), so a 500 MB log costs a few extra lines decoded, not its texts
in memory. A finding whose request fell out of the window is looked up in a second pass."""

from __future__ import annotations

from array import array
from collections import deque
from pathlib import Path

from ..log.events import Event, Finding, MetricsSample, PhaseFinished, PhaseStarted, RequestFinished, RequestStarted
from ..log.metric_names import KV_USAGE, LLAMA_CACHED, LLAMA_PROMPT_TOKENS, PREFIX_HITS, PREFIX_QUERIES
from .report import FED_TYPES, RunReport


READ_TYPES = FED_TYPES | {MetricsSample.type}      # what `report --format html` reads from a log
TEXT_WINDOW = 4096            # recent answers kept, for findings that name a request after its end
MAX_DOTS = 300                # dots per phase and path in the TTFT chart (more: evenly spaced ranks)
MAX_TIMELINE = 1200           # points per line on the timeline (more: bucketed)
MAX_TURNS = 400               # bars per turn chart (more: bucketed)
MAX_ANSWER = 4000             # characters of an answer shown (around the first mark)
MAX_FINDINGS_DETAILED = 200   # findings shown with their answers (fail first); the next ones as table rows
MAX_FINDINGS_LISTED = 2000    # findings on the page (and on the timeline) at most
NAN = float("nan")

COLORS = {"cold": "#1f5fbf", "hit": "#e8590c", "prompt": "#c9d1d9", "cached": "#37b24d", "control": "#e8590c",
          "rate": "#6f42c1", "interval": "#6f42c1", "kv": "#0b7285", "fail": "#d00000", "warn": "#d9a100",
          "info": "#868e96"}


# --- the fold --------------------------------------------------------------------------------

class HtmlFold:
    """What the page needs beyond a RunReport, folded from the same events (see READ_TYPES)."""

    def __init__(self, window: int = TEXT_WINDOW) -> None:
        self.metric_t = array("d")
        self.hits = array("d")               # cumulative prefix-cache hit tokens (NaN: unknown)
        self.queries = array("d")            # cumulative queried tokens (NaN: unknown)
        self.kv = array("d")                 # KV cache usage, 0..1 (NaN: unknown)
        self.counters: str | None = None     # "vllm" | "llamacpp": whose counters the hit rate uses
        self.phase_spans: dict[str, list[float | None]] = {}    # phase -> [start t, end t or None]
        self._turn_of: dict[int, tuple[str, str, int]] = {}     # request -> (phase, arm, turn), until its end
        self.turns: dict[tuple[str, str], list[tuple[int, int, int | None, int | None]]] = {}
        self._window = window
        self._recent: dict[int, tuple[str, dict]] = {}
        self._order: deque[int] = deque()
        self.answers: dict[int, tuple[str, dict]] = {}           # request -> (text, checks), for findings
        self.missing: set[int] = set()

    def feed(self, event: Event) -> None:
        handler = _HANDLERS.get(type(event))
        if handler is not None:
            handler(self, event)

    def _on_metrics(self, e: MetricsSample) -> None:
        v = e.values
        if PREFIX_QUERIES in v:
            hits, queries, kind = v.get(PREFIX_HITS, NAN), v[PREFIX_QUERIES], "vllm"
        elif LLAMA_PROMPT_TOKENS in v:
            # llama.cpp counts processed prompt tokens apart from the cached ones
            cached = v.get(LLAMA_CACHED, NAN)
            hits, queries, kind = cached, v[LLAMA_PROMPT_TOKENS] + cached, "llamacpp"
        else:
            hits, queries, kind = NAN, NAN, None
        if kind is not None and self.counters is None:
            self.counters = kind
        self.metric_t.append(e.t)
        self.hits.append(hits)
        self.queries.append(queries)
        self.kv.append(v.get(KV_USAGE, NAN))

    def _on_phase_start(self, e: PhaseStarted) -> None:
        self.phase_spans[e.phase] = [e.t, None]

    def _on_phase_end(self, e: PhaseFinished) -> None:
        self.phase_spans.setdefault(e.phase, [e.t, None])[1] = e.t

    def _on_request_start(self, e: RequestStarted) -> None:
        if e.turn is not None:
            self._turn_of[e.request] = (e.phase, e.arm, e.turn)

    def _on_request_end(self, e: RequestFinished) -> None:
        turn = self._turn_of.pop(e.request, None)
        if turn is not None:
            phase, arm, number = turn
            self.turns.setdefault((phase, arm), []).append((number, e.request, e.cached_tokens, e.prompt_tokens))
        recent = self._recent
        if e.request not in recent:
            self._order.append(e.request)
        recent[e.request] = (e.text, e.checks)
        if len(self._order) > self._window:
            recent.pop(self._order.popleft(), None)
        if e.request in self.missing:                       # a second pass
            self.answers[e.request] = (e.text, e.checks)
            self.missing.discard(e.request)

    def _on_finding(self, e: Finding) -> None:
        if e.request is None or e.request in self.answers:
            return
        answer = self._recent.get(e.request)
        if answer is not None:
            self.answers[e.request] = answer
        else:
            self.missing.add(e.request)


_HANDLERS = {MetricsSample: HtmlFold._on_metrics, PhaseStarted: HtmlFold._on_phase_start,
             PhaseFinished: HtmlFold._on_phase_end, RequestStarted: HtmlFold._on_request_start,
             RequestFinished: HtmlFold._on_request_end, Finding: HtmlFold._on_finding}


def read_log(path: str | Path, warnings: list[str] | None = None,
             window: int = TEXT_WINDOW) -> tuple[RunReport, HtmlFold]:
    """One pass for the report and the fold; a second, over request ends only, when a finding
    names a request that had left the answer window (rare: findings follow their request)."""
    from ..log.reader import iter_log

    report, fold = RunReport(), HtmlFold(window)
    for event in iter_log(path, warnings, only=READ_TYPES):
        report.feed(event)
        fold.feed(event)
    if fold.missing:
        second = HtmlFold(window=0)
        second.missing = set(fold.missing)
        for event in iter_log(path, None, only={RequestFinished.type}):
            second.feed(event)
            if not second.missing:
                break
        fold.answers.update(second.answers)
        fold.missing = second.missing
    return report, fold


