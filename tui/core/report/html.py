"""`hitproof report LOG --format html`: one self-contained page with inline SVG charts. Pure.

The page needs no network and no script: inline CSS, inline SVG, every text from the log
escaped. It holds the incident record, the phase table, TTFT cold vs hit per phase (dots over a
box of the percentiles), cached tokens per conversation and agent turn, the hit rate and KV
usage over time with each finding marked on the timeline (a link to its entry), and the
findings with their answers, the offending offset in <mark>.

What a RunReport does not keep (metrics samples, turns, answer texts) HtmlFold folds in one
pass next to it: answer texts only in a sliding window of recent requests, pinned when a
finding names one, so a 500 MB log costs a few extra lines decoded, not its texts in memory. A
finding whose request fell out of the window is looked up in a second pass over request ends.
"""

from __future__ import annotations

import html
import json
import math
from array import array
from collections import deque
from pathlib import Path
from typing import Any, Sequence

from ..log.events import Event, Finding, MetricsSample, PhaseFinished, PhaseStarted, RequestFinished, RequestStarted
from . import fmt
from .latency import ARMS, percentile
from ..server.metrics import KV_USAGE, LLAMA_CACHED, LLAMA_PROMPT_TOKENS, PREFIX_HITS, PREFIX_QUERIES
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
    from ..log.recorder import iter_log

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


# --- small helpers ---------------------------------------------------------------------------

def _e(value: Any) -> str:
    """Escaped text; never a raw None."""
    return html.escape("-" if value is None else str(value), quote=True)


def _num(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".") if not float(value).is_integer() else str(int(value))


def _evenly(values: Sequence, limit: int) -> list:
    """At most `limit` items, evenly spaced, first and last kept."""
    if len(values) <= limit:
        return list(values)
    step = (len(values) - 1) / (limit - 1)
    return [values[round(i * step)] for i in range(limit)]


def _nice_step(span: float, target: int = 6) -> float:
    raw = max(span, 1e-9) / target
    magnitude = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if raw <= factor * magnitude:
            return factor * magnitude
    return 10 * magnitude


def _linear_ticks(high: float, target: int = 6) -> list[float]:
    step = _nice_step(high, target)
    ticks, value = [], 0.0
    while value <= high + step * 1e-6:
        ticks.append(value)
        value += step
    return ticks


def _log_ticks(low: float, high: float) -> list[float]:
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    decades = [10.0 ** k for k in range(first, last + 1)]
    if last - first <= 2:
        decades = sorted({d * m for d in decades for m in (1, 2, 5)})
    return [t for t in decades if low / 1.001 <= t <= high * 1.001]


def _svg(width: int, height: int, body: list[str], label: str, chart: str) -> str:
    return (f'<svg class="chart" data-chart="{chart}" xmlns="http://www.w3.org/2000/svg" width="{width}" '
            f'height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="{_e(label)}">'
            + "".join(body) + "</svg>")


# --- chart: TTFT cold vs hit per phase --------------------------------------------------------

def ttft_chart(series: dict[str, dict[str, Sequence[float]]], width: int = 900) -> str:
    """Per phase two lanes (cold, hit) on one log-scale time axis: a dot per request (at most
    MAX_DOTS, evenly spaced ranks beyond), a line from min to max, a bar from p50 to p90 and ticks
    at p50 and p99. `series`: phase -> {"cold": seconds, "hit": seconds}."""
    lanes = [(phase, arm, sorted(v for v in values[arm] if v > 0)) for phase, values in series.items()
             for arm in ARMS if any(v > 0 for v in values.get(arm) or ())]
    if not lanes:
        return '<p class="none">No TTFT was measured on a request with known cached tokens.</p>'
    every = [v for _, _, vs in lanes for v in vs]
    low = 10 ** (math.floor(math.log10(min(every)) * 2) / 2)
    high = 10 ** (math.ceil(math.log10(max(every)) * 2) / 2)
    if high <= low:
        high = low * 10
    left, right, top, lane_h, gap = 215, 20, 28, 20, 8
    plot = width - left - right
    phases = list(dict.fromkeys(p for p, _, _ in lanes))
    height = top + len(lanes) * lane_h + len(phases) * gap + 34

    def x(seconds: float) -> float:
        seconds = min(max(seconds, low), high)
        return left + (math.log10(seconds) - math.log10(low)) / (math.log10(high) - math.log10(low)) * plot

    body = [f'<text x="{left}" y="14" class="axis-title">time to first token (log scale); '
            f'bar p50 to p90, ticks p50 and p99, line min to max</text>']
    bottom = height - 30
    for tick in _log_ticks(low, high):
        tx = x(tick)
        body.append(f'<line class="grid" x1="{tx:.1f}" y1="{top - 4}" x2="{tx:.1f}" y2="{bottom}"/>'
                    f'<text class="tick" x="{tx:.1f}" y="{bottom + 14}" text-anchor="middle">'
                    f'{_e(fmt.seconds(tick))}</text>')
    y = top
    last_phase = None
    for phase, arm, values in lanes:
        if phase != last_phase:
            if last_phase is not None:
                y += gap
            body.append(f'<text class="label" x="8" y="{y + lane_h / 2 + 4:.1f}">{_e(phase)}</text>')
            last_phase = phase
        mid = y + lane_h / 2
        color = COLORS[arm]
        n = len(values)
        p50, p90, p99 = (percentile(values, q) for q in (0.5, 0.9, 0.99))
        body.append(f'<g class="lane" data-phase="{_e(phase)}" data-arm="{arm}" data-n="{n}">')
        body.append(f'<text class="arm" x="{left - 8}" y="{mid + 4:.1f}" text-anchor="end" fill="{color}">'
                    f'{arm} ({n})</text>')
        body.append(f'<line x1="{x(values[0]):.1f}" y1="{mid:.1f}" x2="{x(values[-1]):.1f}" y2="{mid:.1f}" '
                    f'stroke="{color}" stroke-width="1.5" opacity="0.6"/>')
        body.append(f'<rect class="box" x="{x(p50):.1f}" y="{mid - 6:.1f}" width="{max(x(p90) - x(p50), 1.5):.1f}" '
                    f'height="12" fill="{color}" opacity="0.22"/>')
        for value, thick in ((p50, 3), (p99, 1.5)):
            body.append(f'<line x1="{x(value):.1f}" y1="{mid - 8:.1f}" x2="{x(value):.1f}" y2="{mid + 8:.1f}" '
                        f'stroke="{color}" stroke-width="{thick}"/>')
        shown = _evenly(values, MAX_DOTS)
        for i, value in enumerate(shown):
            jitter = ((i * 7) % 5 - 2) * 1.6
            body.append(f'<circle class="dot {arm}" cx="{x(value):.1f}" cy="{mid + jitter:.1f}" r="3.5" '
                        f'fill="{color}"><title>{_e(phase)} {arm}: {_e(fmt.seconds(value))}</title></circle>')
        if len(shown) < n:
            body.append(f'<text class="tick" x="{width - right}" y="{mid + 4:.1f}" text-anchor="end">'
                        f'{len(shown)} of {n} dots</text>')
        body.append("</g>")
        y += lane_h
    return _svg(width, height, body, "TTFT cold vs hit per phase", "ttft")


# --- chart: cached tokens per turn ------------------------------------------------------------

def turns_chart(title: str, rows: Sequence[tuple[int, int, int | None, int | None]],
                control: Sequence[tuple[int, int, int | None, int | None]] = (), width: int = 900) -> str:
    """Per turn a grey bar of prompt tokens and a green bar of cached tokens (main arm); with a
    control arm (fresh salt per request) its cached tokens as an orange tick. rows: (turn,
    request, cached, prompt), in order."""
    rows = sorted(rows)
    if not rows:
        return f'<p class="none">{_e(title)}: no turns in this run.</p>'
    bucketed = len(rows) > MAX_TURNS
    rows = _evenly(rows, MAX_TURNS)
    ctrl = {turn: cached for turn, _, cached, _ in control}
    top_value = max([r[3] or 0 for r in rows] + [r[2] or 0 for r in rows] + [c or 0 for c in ctrl.values()] + [1])
    ticks = _linear_ticks(top_value, 5)
    top_value = max(top_value, ticks[-1])
    left, right, top, bottom = 70, 20, 28, 36
    height = 230
    plot_w, plot_h = width - left - right, height - top - bottom
    slot = plot_w / len(rows)

    def y(tokens: float) -> float:
        return top + plot_h - tokens / top_value * plot_h

    body = [f'<text x="{left}" y="14" class="axis-title">{_e(title)}: prompt tokens (grey), cached tokens '
            f'(green){", control arm cached (orange)" if ctrl else ""}</text>']
    for tick in ticks:
        body.append(f'<line class="grid" x1="{left}" y1="{y(tick):.1f}" x2="{width - right}" y2="{y(tick):.1f}"/>'
                    f'<text class="tick" x="{left - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">{tick:,.0f}</text>')
    label_every = max(1, math.ceil(len(rows) / 30))
    for i, (turn, request, cached, prompt) in enumerate(rows):
        x0 = left + i * slot
        bar = max(min(slot * 0.7, 48), 1.0)
        cx = x0 + slot / 2
        tip = (f"turn {turn} (request {request}): {'unknown' if cached is None else f'{cached:,}'} cached of "
               f"{'unknown' if prompt is None else f'{prompt:,}'} prompt tokens")
        body.append(f'<g class="turn" data-turn="{turn}" data-cached="{"" if cached is None else cached}">'
                    f'<title>{_e(tip)}</title>')
        if prompt is not None:
            body.append(f'<rect class="prompt" x="{cx - bar / 2:.1f}" y="{y(prompt):.1f}" width="{bar:.1f}" '
                        f'height="{y(0) - y(prompt):.1f}" fill="{COLORS["prompt"]}"/>')
        if cached is not None:
            inner = bar * 0.6
            body.append(f'<rect class="cached" x="{cx - inner / 2:.1f}" y="{y(cached):.1f}" width="{inner:.1f}" '
                        f'height="{y(0) - y(cached):.1f}" fill="{COLORS["cached"]}"/>')
        else:
            body.append(f'<text class="tick" x="{cx:.1f}" y="{y(0) - 4:.1f}" text-anchor="middle">?</text>')
        if turn in ctrl and ctrl[turn] is not None:
            body.append(f'<line class="control" x1="{cx - bar / 2:.1f}" y1="{y(ctrl[turn]):.1f}" '
                        f'x2="{cx + bar / 2:.1f}" y2="{y(ctrl[turn]):.1f}" stroke="{COLORS["control"]}" '
                        f'stroke-width="3"/>')
        if i % label_every == 0:
            body.append(f'<text class="tick" x="{cx:.1f}" y="{y(0) + 14:.1f}" text-anchor="middle">{turn}</text>')
        body.append("</g>")
    body.append(f'<text class="tick" x="{left + plot_w / 2:.1f}" y="{height - 4}" text-anchor="middle">'
                f'turn{" (evenly spaced sample of the turns)" if bucketed else ""}</text>')
    return _svg(width, height, body, title, "turns")


# --- chart: hit rate and KV usage over time, findings marked ----------------------------------

def timeline_points(fold: HtmlFold) -> dict[str, list[tuple[float, float]]]:
    """(t, percent) series: the cumulative hit rate since the first sample, the per-interval hit
    rate (intervals with queried tokens only: no queries is no rate, not 0%), KV cache usage
    (samples that report it). Each at most MAX_TIMELINE points."""
    t, hits, queries, kv = fold.metric_t, fold.hits, fold.queries, fold.kv
    n = len(t)
    idx = list(range(n))
    if n > MAX_TIMELINE:                                   # bucket: the last sample of each bucket
        idx = [min(n - 1, round((i + 1) * n / MAX_TIMELINE) - 1) for i in range(MAX_TIMELINE)]
        idx = sorted(set(idx))
    known = [i for i in idx if not (math.isnan(hits[i]) or math.isnan(queries[i]))]
    cumulative, interval = [], []
    if known:
        h0, q0 = hits[known[0]], queries[known[0]]
        for i in known:
            if queries[i] - q0 > 0:
                cumulative.append((t[i], 100.0 * (hits[i] - h0) / (queries[i] - q0)))
        for a, b in zip(known, known[1:]):
            dq = queries[b] - queries[a]
            if dq > 0:
                interval.append((t[b], max(0.0, min(100.0, 100.0 * (hits[b] - hits[a]) / dq))))
    usage = []
    if n > MAX_TIMELINE:                                   # KV: the highest sample of each bucket
        start = 0
        for end in idx:
            chunk = [kv[j] for j in range(start, end + 1) if not math.isnan(kv[j])]
            if chunk:
                usage.append((t[end], 100.0 * max(chunk)))
            start = end + 1
    else:
        usage = [(t[i], 100.0 * kv[i]) for i in range(n) if not math.isnan(kv[i])]
    return {"cumulative": cumulative, "interval": interval, "kv": usage}


def timeline_chart(fold: HtmlFold, findings: Sequence[Finding], duration: float, width: int = 900,
                   anchors: dict[int, str] | None = None) -> str:
    """Hit rate (cumulative line, per-interval dots) and KV usage (line) in percent over run time,
    phases as bands, each finding a vertical line in its severity's colour linking to its entry."""
    points = timeline_points(fold)
    end = max([duration] + [p[0] for s in points.values() for p in s] + [f.t for f in findings] + [1e-3])
    # the axis starts where the soak does (a launched server's start-up comes before the first phase)
    firsts = [span[0] for span in fold.phase_spans.values() if span[0] is not None] + \
        ([fold.metric_t[0]] if len(fold.metric_t) else []) + [f.t for f in findings]
    begin = min(firsts) if firsts else 0.0
    begin = _nice_step(end - begin, 8) * math.floor(begin / _nice_step(end - begin, 8)) if begin > 0 else 0.0
    span_s = max(end - begin, 1e-3)
    left, right, top, bottom = 50, 20, 58, 36
    height = 294
    plot_w, plot_h = width - left - right, height - top - bottom

    def x(t: float) -> float:
        return left + (min(max(t, begin), end) - begin) / span_s * plot_w

    def y(pct: float) -> float:
        return top + plot_h - pct / 100 * plot_h

    rate_name = {"vllm": "vllm:prefix_cache_hits / queries", "llamacpp": "llamacpp: cached / (cached + processed) "
                 "prompt tokens"}.get(fold.counters or "", "no hit counters reported")
    kv_note = "KV cache usage (teal)" if points["kv"] else "KV cache usage: not reported by this server"
    body = [f'<text x="{left}" y="14" class="axis-title">hit rate (purple): cumulative line, per-interval dots; '
            f'from {_e(rate_name)}</text>',
            f'<text x="{left}" y="29" class="axis-title">{_e(kv_note)}; each finding a vertical line in its '
            f'severity\'s colour, linked to its entry</text>']
    for i, (phase, (start, stop)) in enumerate(fold.phase_spans.items()):
        x0, x1 = x(start or 0.0), x(stop if stop is not None else end)
        body.append(f'<rect class="phase-band" x="{x0:.1f}" y="{top}" width="{max(x1 - x0, 0.5):.1f}" '
                    f'height="{plot_h}" fill="{"#f1f3f5" if i % 2 == 0 else "#ffffff"}"><title>{_e(phase)}: '
                    f'{start or 0:.1f} s to {"-" if stop is None else f"{stop:.1f} s"}</title></rect>')
        if x1 - x0 > 30:
            label = phase if (x1 - x0) / 6.5 >= len(phase) else phase[:max(3, int((x1 - x0) / 6.5) - 1)] + "."
            body.append(f'<text class="tick phase-name" x="{(x0 + x1) / 2:.1f}" y="{top - 6}" '
                        f'text-anchor="middle">{_e(label)}</text>')
    for pct in (0, 25, 50, 75, 100):
        body.append(f'<line class="grid" data-pct="{pct}" x1="{left}" y1="{y(pct):.1f}" x2="{width - right}" '
                    f'y2="{y(pct):.1f}"/><text class="tick" x="{left - 6}" y="{y(pct) + 4:.1f}" '
                    f'text-anchor="end">{pct}%</text>')
    step = _nice_step(span_s, 8)
    for tick in [begin + i * step for i in range(int(span_s / step + 1e-6) + 1)]:
        body.append(f'<text class="tick" x="{x(tick):.1f}" y="{top + plot_h + 14}" text-anchor="middle">'
                    f'{_num(tick)}</text>')
    body.append(f'<text class="tick" x="{left + plot_w / 2:.1f}" y="{height - 4}" text-anchor="middle">'
                f'seconds since the run started</text>')
    if points["kv"]:
        body.append(_polyline(points["kv"], x, y, COLORS["kv"], "kv"))
    if points["cumulative"]:
        body.append(_polyline(points["cumulative"], x, y, COLORS["rate"], "rate"))
    for t, pct in points["interval"]:
        body.append(f'<circle class="interval" cx="{x(t):.1f}" cy="{y(pct):.1f}" r="2.5" fill="{COLORS["interval"]}" '
                    f'opacity="0.55"><title>{t:.1f} s: {pct:.0f}% of queried tokens hit</title></circle>')
    for index, f in enumerate(findings):
        target = (anchors or {}).get(index, f"finding-{index}")
        color = COLORS.get(f.severity, COLORS["info"])
        body.append(f'<a href="#{target}"><line class="finding {_e(f.severity)}" x1="{x(f.t):.1f}" y1="{top}" '
                    f'x2="{x(f.t):.1f}" y2="{top + plot_h}" stroke="{color}" stroke-width="2"><title>'
                    f'{_e(f.severity.upper())} {_e(f.kind)} at {f.t:.1f} s: {_e(f.detail[:200])}</title></line></a>')
    if not any(points.values()):
        body.append(f'<text class="tick" x="{left + plot_w / 2:.1f}" y="{top + plot_h / 2:.1f}" '
                    f'text-anchor="middle">no metrics samples in this log</text>')
    return _svg(width, height, body, "hit rate and KV usage over time", "timeline")


def _polyline(points: Sequence[tuple[float, float]], x, y, color: str, name: str) -> str:
    coords = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in points)
    return (f'<polyline class="{name}" data-points="{len(points)}" points="{coords}" fill="none" '
            f'stroke="{color}" stroke-width="2.2" stroke-linejoin="round"/>')


# --- answers with their marks -----------------------------------------------------------------

def marks_for(finding: Finding, text: str, checks: dict, own_code: str | None = None) -> list[tuple[int, int, str]]:
    """(start, end, class) spans in the answer: the offending span of this finding ("bad"), and the
    request's own code where it appears ("own"). Non-overlapping, sorted."""
    spans: list[tuple[int, int, str]] = []
    offset, kind, ev = finding.offset, finding.kind, finding.evidence or {}
    if offset is not None and 0 <= offset <= len(text):
        length = 0
        if kind == "foreign_code":
            length = len(str(ev.get("matched") or ev.get("code") or ""))
        elif kind == "repetition" and checks.get("repetition"):
            rep = checks["repetition"]
            length = len(str(rep.get("unit") or "")) * int(rep.get("count") or 1)
        elif kind == "recall_miss" and (checks.get("recall") or {}).get("matched"):
            length = len(checks["recall"]["matched"])
        elif kind == "wrong_task" and own_code and text.startswith(own_code, offset):
            length = len(own_code)
        if not length:                                   # a divergence, or no span known: the word at the offset
            stop = offset
            while stop < len(text) and not text[stop].isspace():
                stop += 1
            length = max(stop - offset, 1)
        spans.append((offset, min(offset + length, len(text)), "bad"))
    for foreign in checks.get("foreign") or []:           # every foreign code in the answer, whatever the kind
        at, matched = foreign.get("offset"), str(foreign.get("matched") or "")
        if isinstance(at, int) and matched and 0 <= at < len(text):
            spans.append((at, min(at + len(matched), len(text)), "bad"))
    if own_code:
        at = text.find(own_code)
        if at >= 0:
            spans.append((at, at + len(own_code), "own"))
    spans.sort(key=lambda s: (s[0], s[2] != "bad", -s[1]))
    out: list[tuple[int, int, str]] = []
    for span in spans:
        if span[0] < span[1] and (not out or span[0] >= out[-1][1]):
            out.append(span)
    return out


def marked_html(text: str, spans: Sequence[tuple[int, int, str]], limit: int = MAX_ANSWER) -> str:
    """The answer escaped, each span in <mark class=...>; long answers cut around the first span."""
    start = 0
    if len(text) > limit:
        first = spans[0][0] if spans else 0
        start = max(0, min(first - limit // 4, len(text) - limit))
    stop = min(len(text), start + limit)
    out, at = [], start
    if start:
        out.append('<span class="cut">[... %d characters before]</span>' % start)
    for s, e, cls in spans:
        if e <= start or s >= stop:
            continue
        s, e = max(s, start), min(e, stop)
        out.append(html.escape(text[at:s]))
        label = "the offending span" if cls == "bad" else "the request's own code"
        out.append(f'<mark class="{cls}" data-offset="{s}" title="{label} at character {s}">{html.escape(text[s:e])}</mark>')
        at = e
    out.append(html.escape(text[at:stop]))
    if stop < len(text):
        out.append('<span class="cut">[... %d characters after]</span>' % (len(text) - stop))
    return "".join(out)


# --- the page --------------------------------------------------------------------------------

CSS = """
body{font-family:"DejaVu Sans","Liberation Sans",Arial,sans-serif;margin:0;padding:16px 24px;color:#1b1f24;
background:#fff;font-size:14px;max-width:960px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:22px 0 8px;border-bottom:1px solid #d0d7de;padding-bottom:3px}
h3{font-size:15px;margin:14px 0 6px}
.verdict{display:inline-block;padding:2px 10px;border-radius:4px;font-weight:bold;color:#fff;background:#868e96}
.verdict.pass{background:#2b8a3e}.verdict.fail,.verdict.error{background:#d00000}
.verdict.inconclusive,.verdict.interrupted,.verdict.incomplete{background:#d9a100;color:#000}
table{border-collapse:collapse;margin:6px 0}td,th{border:1px solid #d0d7de;padding:3px 7px;text-align:left;
vertical-align:top}th{background:#f6f8fa}td.n{text-align:right;font-variant-numeric:tabular-nums}
table.facts td:first-child{white-space:nowrap;color:#57606a}table.facts td{word-break:break-all}
.status-pass{color:#2b8a3e;font-weight:bold}.status-fail{color:#d00000;font-weight:bold}
.status-inconclusive{color:#9a6700;font-weight:bold}
svg.chart{display:block;margin:6px 0 2px;background:#fff}
svg .grid{stroke:#e6e8eb;stroke-width:1}svg text{font-family:inherit;fill:#1b1f24}
svg .tick{font-size:11px;fill:#57606a}svg .axis-title{font-size:12px;fill:#57606a}svg .label{font-size:12px;font-weight:bold}
svg .arm{font-size:11px}
.finding{border-left:5px solid #868e96;padding:4px 10px;margin:10px 0;background:#f6f8fa}
.finding.fail{border-color:#d00000}.finding.warn{border-color:#d9a100}
.sev{font-weight:bold;text-transform:uppercase}.sev.fail{color:#d00000}.sev.warn{color:#9a6700}.sev.info{color:#57606a}
pre.answer{white-space:pre-wrap;word-break:break-word;background:#fff;border:1px solid #d0d7de;padding:6px;
margin:4px 0;font-family:"DejaVu Sans Mono",monospace;font-size:12.5px}
mark.bad{background:#ffc9c9;outline:2px solid #d00000}mark.own{background:#d3f9d8}
.cut{color:#868e96}.none{color:#57606a;font-style:italic}.small{color:#57606a;font-size:12px}
"""


def to_html(report: RunReport, fold: HtmlFold | None = None) -> str:
    """The whole page as one string."""
    from .formats import _where, incident_rows, ttft_rows
    from .power import KINDS, evidence_counts

    fold = fold or HtmlFold()
    verdict = report.verdict
    header, server = report.header, report.server
    message = report.end.message if report.end else (report.warning or "the log ends before the run did")
    title = f"hitproof: {verdict.upper()} (exit {report.exit_code})"
    out = [f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
           f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{CSS}</style></head><body>']
    scenario = header.scenario.get("name") if header else None
    out.append(f'<h1>hitproof report <span class="verdict {_e(verdict)}">{_e(verdict.upper())} '
               f'(exit {report.exit_code})</span></h1>')
    out.append(f'<p>{_e(message)}; {len(report.starts)} requests, {report.cache_hits()} cache hits, '
               f'{report.last_t:.1f} s; scenario {_e(scenario)}'
               + (f'; {_e(server.dialect)} {_e(server.version or "version unknown")}, model {_e(server.model)} '
                  f'at {_e(server.url)}' if server else "")
               + (f'; run {_e(header.run_id)}' if header and header.run_id else "")
               + (f', started {_e(header.started_at)}' if header and header.started_at else "") + '.</p>')
    if report.warning:
        out.append(f'<p class="status-inconclusive">Warning: {_e(report.warning)}</p>')

    # incident record
    rows = incident_rows(report)
    if not rows and server is not None:
        rows = [("URL", server.url), ("dialect", server.dialect), ("server version", server.version or "unknown"),
                ("model", server.model), ("grid", f"{server.grid} tokens ({server.grid_source})"),
                ("launch command", (header.target.get("launch_command") if header else None)
                 or "attached (not launched by hitproof)")]
    out.append('<h2 id="incident">Incident record</h2>')
    if rows:
        out.append('<table class="facts">' + "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in rows)
                   + "</table>")
    else:
        out.append('<p class="none">The log has no incident record.</p>')

    # phases
    out.append('<h2 id="phases">Phases</h2><table class="phases"><tr><th>phase</th><th>status</th><th>requests</th>'
               '<th>hits</th><th>cached tokens</th><th>TTFT cold p50</th><th>TTFT hit p50</th>'
               '<th>findings f/w/i</th><th>reasons</th></tr>')
    for name, phase in report.phases.items():
        counts = {"fail": 0, "warn": 0, "info": 0}
        for f in report.findings:
            if f.phase == name and f.severity in counts:
                counts[f.severity] += 1
        lat = report.latency.phase(name)
        status = phase.get("status", "running")
        out.append(f'<tr><td>{_e(name)}</td><td class="status-{_e(status)}">{_e(status)}</td>'
                   f'<td class="n">{_e(phase.get("requests"))}</td><td class="n">{_e(phase.get("hits"))}</td>'
                   f'<td class="n">{_e(_thousands(phase.get("cached_tokens")))}</td>'
                   f'<td class="n">{_e(_ms_cell(lat["cold"]["p50"]))}</td><td class="n">{_e(_ms_cell(lat["hit"]["p50"]))}</td>'
                   f'<td class="n">{counts["fail"]}/{counts["warn"]}/{counts["info"]}</td>'
                   f'<td>{_e("; ".join(phase.get("reasons") or []) or "")}</td></tr>')
    out.append("</table>")

    # TTFT
    out.append('<h2 id="ttft">Time to first token, cold vs hit</h2>')
    series = {name: {arm: report.latency.values(name, arm) for arm in ARMS} for name in report.latency.phases()}
    out.append(ttft_chart(series))
    percentile_rows = ttft_rows(report)
    if percentile_rows:
        out.append('<table class="percentiles"><tr>' + "".join(f"<th>{h}</th>" for h in
                   ("phase", "path", "n", "min ms", "p50 ms", "p90 ms", "p99 ms", "max ms")) + "</tr>")
        for row in percentile_rows:
            out.append("<tr>" + "".join(f'<td{"" if i < 2 else " class=n"}>{_e(c)}</td>' for i, c in enumerate(row))
                       + "</tr>")
        out.append("</table>")
    out.append('<p class="small">Main-arm requests only; cold = 0 cached tokens, hit = more; a request whose '
               'cached tokens are unknown is neither.</p>')

    # turns
    out.append('<h2 id="turns">Cached tokens per turn</h2>')
    multi = [phase for phase, arm in fold.turns if arm == "main"]
    if not multi:
        out.append('<p class="none">No conversation or agent turns in this run.</p>')
    for phase in dict.fromkeys(multi):
        label = {"conversation": "conversation turns", "agent_replay": "agent turns"}.get(phase, f"{phase} turns")
        out.append(turns_chart(label, fold.turns.get((phase, "main"), []),
                               fold.turns.get((phase, "control"), []) if phase == "agent_replay" else ()))

    # timeline
    ordered = sorted(range(len(report.findings)),
                     key=lambda i: ({"fail": 0, "warn": 1, "info": 2}.get(report.findings[i].severity, 3),
                                    report.findings[i].seq))
    out.append('<h2 id="timeline">Hit rate and KV usage over time</h2>')
    detailed, listed = ordered[:MAX_FINDINGS_DETAILED], ordered[MAX_FINDINGS_DETAILED:MAX_FINDINGS_LISTED]
    marked = sorted(detailed + listed)                     # on the timeline: every finding the page shows
    out.append(timeline_chart(fold, [report.findings[i] for i in marked], report.last_t,
                              anchors={k: f"finding-{i}" for k, i in enumerate(marked)}))

    # findings
    c = {s: sum(1 for f in report.findings if f.severity == s) for s in ("fail", "warn", "info")}
    out.append(f'<h2 id="findings">Findings ({c["fail"]} fail, {c["warn"]} warn, {c["info"]} info)</h2>')
    if not ordered:
        out.append('<p class="none">No findings.</p>')
    for index in detailed:
        f = report.findings[index]
        out.append(f'<div class="finding {_e(f.severity)}" id="finding-{index}"><p><span class="sev {_e(f.severity)}">'
                   f'{_e(f.severity)}</span> <b>{_e(f.kind)}</b> at {_e(_where(f))}, {f.t:.1f} s: {_e(f.detail)}</p>')
        answer = fold.answers.get(f.request) if f.request is not None else None
        start = report.starts.get(f.request) if f.request is not None else None
        if answer is not None:
            text, checks = answer
            if text:
                spans = marks_for(f, text, checks or {}, start.code if start else None)
                where = "" if f.offset is None else f", offending span at character {f.offset}"
                out.append(f'<p class="small">answer of request {f.request}{where}:</p>'
                           f'<pre class="answer">{marked_html(text, spans)}</pre>')
            else:
                out.append(f'<p class="small">request {f.request} answered nothing (an empty answer).</p>')
        elif f.request is not None:
            out.append(f'<p class="none">The answer of request {f.request} is not in the log.</p>')
        control = (f.evidence or {}).get("control_text")
        if control:
            out.append(f'<p class="small">the cold control (request {_e(f.evidence.get("control_request"))}) '
                       f'answered:</p><pre class="answer">{html.escape(str(control))}</pre>')
        iso = report.isolations.get(f.request) if f.request is not None else None
        if iso is not None and f.severity in ("fail", "warn"):
            out.append(f'<p>isolation of request {f.request} (re-run for {_e(iso.kind)}): <b>{_e(iso.verdict)}</b>, '
                       f'reproduced on {iso.reproduced}/{iso.hit_runs} hits and {iso.cold_reproduced}/{iso.cold_runs} '
                       f'cold; {_e(iso.detail)}</p>')
        if f.evidence:
            out.append(f'<details><summary class="small">evidence</summary><pre class="answer">'
                       f'{_e(json.dumps(f.evidence, ensure_ascii=False, indent=1, default=str))}</pre></details>')
        out.append("</div>")

    if listed:
        out.append(f'<p class="small">{len(listed)} more findings, without their answers:</p><table class="more">'
                   '<tr><th>severity</th><th>kind</th><th>where</th><th>t</th><th>detail</th></tr>')
        for index in listed:
            f = report.findings[index]
            out.append(f'<tr id="finding-{index}"><td class="sev {_e(f.severity)}">{_e(f.severity)}</td>'
                       f'<td>{_e(f.kind)}</td><td>{_e(_where(f))}</td><td class="n">{f.t:.1f} s</td>'
                       f'<td>{_e(f.detail[:300])}</td></tr>')
        out.append("</table>")
    if len(ordered) > MAX_FINDINGS_LISTED:
        out.append(f'<p class="none">{len(ordered) - MAX_FINDINGS_LISTED} more findings are in the log and in '
                   f'`hitproof report --format json`; not on this page.</p>')

    # power
    counts = evidence_counts(report)
    out.append('<h2 id="power">Statistical power</h2><ul>'
               + "".join(f"<li><b>{_e(name)}</b>: {_e(counts[name]['sentence'])}</li>" for name, _, _ in KINDS)
               + "</ul>")
    tool = header.tool.get("version") if header else None
    out.append(f'<p class="small">hitproof{" " + _e(tool) if tool else ""}: a self-contained page, no script, '
               "no network.</p></body></html>\n")
    return "".join(out)


def _thousands(value: Any) -> Any:
    return f"{value:,}" if isinstance(value, int) else value


def _ms_cell(value: float | None) -> str:
    return "-" if value is None else f"{fmt.ms(value)} ms"
