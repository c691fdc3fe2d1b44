"""Time to first token as a distribution: TTFT cold vs hit per phase, as percentiles. Pure.

Main-arm requests only (control and isolation re-sends are the instrument, not the soak). A
request is *cold* when it is proven to have reused at most the tokens before the run nonce and a
*hit* when it is proven to have reused more (tui.core.report.power.proven_cold / proven_hit: reported by
the server or attributed from its counter); one whose cached tokens are unknown is neither (unknown
is never cold) and is only counted.
Percentiles interpolate linearly between order statistics (numpy's default, statistics'
"inclusive"), so p50 is the median the phase summary already reports as ttft_cold_ms/ttft_hit_ms.
Times are kept in seconds, eight bytes a request; they come out in milliseconds.
"""

from __future__ import annotations

import math
from array import array
from typing import Any, Iterable, Sequence

from . import fmt
from ..log.events import RequestFinished, RequestStarted
from .power import proven_cold, proven_hit

ARMS = ("cold", "hit")
QUANTILES = (("p50", 0.50), ("p90", 0.90), ("p99", 0.99))
STAT_KEYS = ("n", "min", "p50", "p90", "p99", "max")


def percentile(ordered: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of values sorted ascending, linear between order statistics."""
    if not ordered:
        raise ValueError("percentile of no values")
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def distribution(seconds: Iterable[float]) -> dict[str, Any]:
    """{n, min, p50, p90, p99, max} in milliseconds (0.1 ms); the statistics are None when n is 0."""
    ordered = sorted(seconds)
    if not ordered:
        return {"n": 0, "min": None, "p50": None, "p90": None, "p99": None, "max": None}
    out: dict[str, Any] = {"n": len(ordered), "min": fmt.to_ms(ordered[0])}
    for name, q in QUANTILES:
        out[name] = fmt.to_ms(percentile(ordered, q))
    out["max"] = fmt.to_ms(ordered[-1])
    return out


class LatencyFold:
    """Folds RequestStarted / RequestFinished into TTFT samples per phase and path.

    RunReport feeds it; `report` on a large log reads nothing more than it already did."""

    __slots__ = ("_open", "samples", "unknown", "version")

    def __init__(self) -> None:
        self._open: dict[int, str] = {}                    # main-arm request -> phase, until its end
        self.samples: dict[str, dict[str, array]] = {}     # phase -> {"cold": seconds, "hit": seconds}
        self.unknown: dict[str, int] = {}                  # phase -> main requests with unknown cached tokens
        self.version = 0                                   # bumps on every new sample (the app redraws on it)

    def start(self, event: RequestStarted) -> None:
        if event.arm == "main":
            self._open[event.request] = event.phase
            if event.phase not in self.samples:
                self.samples[event.phase] = {"cold": array("d"), "hit": array("d")}

    def end(self, event: RequestFinished) -> None:
        phase = self._open.pop(event.request, None)
        if phase is None:                                  # not main-arm, or a second end of the same request
            return
        ttft = event.ttft
        if not ttft or ttft < 0:                           # no first token (an error, an empty stream)
            return
        if proven_hit(event):
            arm = "hit"
        elif proven_cold(event):
            arm = "cold"
        else:                                              # unknown is never cold
            self.unknown[phase] = self.unknown.get(phase, 0) + 1
            return
        self.samples[phase][arm].append(ttft)
        self.version += 1

    # --- reading -------------------------------------------------------------------------------

    def phases(self) -> list[str]:
        return list(self.samples)

    def values(self, phase: str, arm: str) -> list[float]:
        """TTFT seconds of one phase and path, in arrival order."""
        return list((self.samples.get(phase) or {}).get(arm) or ())

    def all_values(self, arm: str) -> list[float]:
        return [v for by_arm in self.samples.values() for v in by_arm[arm]]

    def phase(self, name: str) -> dict[str, Any]:
        """The JSON report's phases.<name>.ttft: {"cold": {...}, "hit": {...}, "unknown_cached": n}."""
        by_arm = self.samples.get(name) or {}
        out: dict[str, Any] = {arm: distribution(by_arm.get(arm) or ()) for arm in ARMS}
        out["unknown_cached"] = self.unknown.get(name, 0)
        return out

    def to_json(self) -> dict[str, dict[str, Any]]:
        return {name: self.phase(name) for name in self.samples}


def histogram(series: dict[str, Sequence[float]], bins: int = 12) -> tuple[list[float], dict[str, list[int]]]:
    """Counts of each series in `bins` bins shared by all of them, spaced evenly on a log scale
    between the smallest and the largest value (TTFT cold and hit are orders of magnitude apart).
    Returns (bin edges in seconds, bins + 1 of them; {name: counts}). No values: ([], {name: []})."""
    values = [v for vs in series.values() for v in vs if v > 0]
    if not values:
        return [], {name: [] for name in series}
    low, high = math.log10(min(values)), math.log10(max(values))
    if high - low < 1e-9:
        low, high = low - 0.05, high + 0.05              # one value (or all equal): one narrow span
    step = (high - low) / bins
    edges = [10 ** (low + i * step) for i in range(bins + 1)]
    counts: dict[str, list[int]] = {}
    for name, vs in series.items():
        row = [0] * bins
        for v in vs:
            if v <= 0:
                continue
            at = int((math.log10(v) - low) / step)
            row[min(max(at, 0), bins - 1)] += 1
        counts[name] = row
    return edges, counts


def table_lines(fold: LatencyFold, phase_order: Iterable[str] = ()) -> list[str]:
    """The percentile table for text reports, at most 80 columns: one row per phase and path that
    has samples, '-' for what is unknown. Empty when no TTFT was measured at all."""
    names = list(dict.fromkeys([*phase_order, *fold.phases()]))
    rows = []
    for name in names:
        stats = fold.phase(name)
        first = True
        for arm in ARMS:
            d = stats[arm]
            if not d["n"]:
                continue
            rows.append((name if first else "", arm, str(d["n"]), *(fmt.ms(d[k]) for k in STAT_KEYS[1:])))
            first = False
        if stats["unknown_cached"]:
            rows.append((name if first else "", "unknown", str(stats["unknown_cached"]), "-", "-", "-", "-", "-"))
    if not rows:
        return []
    header = ("phase", "path", "n", "min", "p50", "p90", "p99", "max")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    widths[0] = min(widths[0], 20)

    def line(cells: Sequence[str]) -> str:
        left = f"{cells[0][:widths[0]]:<{widths[0]}}  {cells[1]:<{widths[1]}}"
        return (left + "".join(f"  {c:>{w}}" for c, w in zip(cells[2:], widths[2:]))).rstrip()

    return ["TTFT percentiles, ms (main arm; cold and hit as proven):", line(header)] + \
        [line(r) for r in rows]
