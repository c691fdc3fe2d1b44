"""The HTML report's charts as inline SVG (no script): TTFT cold vs hit per phase, cached tokens per
turn, hit rate and KV usage over time with findings marked. Pure: numbers in, SVG text out."""

from __future__ import annotations

import html
import math
from typing import Any, Sequence

from ..log.events import Finding
from . import fmt
from .latency import ARMS, percentile

from .html_fold import COLORS, MAX_DOTS, MAX_TIMELINE, MAX_TURNS, HtmlFold


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


