"""Time to first token as a distribution: TTFT cold vs hit per phase, as percentiles. Pure.

Main-arm requests only (control and isolation re-sends are the instrument, not the soak). A
request is *cold* when it is proven to have reused at most the tokens before the run nonce and a
*hit* when it is proven to have reused more (tui.core.report.power.proven_cold / proven_hit: reported by
the server or attributed from its counter); one whose cached tokens are unknown is neither (unknown
is never cold) and is only counted.
Percentiles interpolate linearly between order statistics (numpy's default, statistics'
"inclusive"), so p50 is the median the phase summary already reports as ttft_cold_ms/ttft_hit_ms.
Times are kept in seconds, eight bytes a request up to Series.EXACT a phase and path, then in a
fixed histogram (bounded memory); they come out in milliseconds.
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


class Series:
    """TTFT seconds of one phase and path, in bounded memory: a night's soak keeps it flat (issue 26).

    The first EXACT values are kept exactly (eight bytes each; every percentile exact, in arrival
    order). Past that they all move to a fixed log-spaced histogram (BINS_PER_DECADE bins a decade
    from LOW to HIGH seconds: one bin is 0.23% wide) with the exact count, min and max, and the array
    is dropped: memory stops growing at EXACT values plus one histogram (about 72 KB), whatever the
    run's length. A percentile then comes from the bins (each order statistic at its bin's geometric
    middle, clamped to min and max), within 0.12% of the exact one: at the report's 0.1 ms
    resolution, TTFTs under ~90 ms read the same. Before that the soak's hour-long runs kept every
    TTFT twice (here and in the phase state, 40 bytes a main request: ~1.4 MB an hour)."""

    EXACT = 4096
    LOW, HIGH, BINS_PER_DECADE = 1e-6, 1e4, 1000
    __slots__ = ("exact", "bins", "n", "lowest", "highest")

    def __init__(self, values: Iterable[float] = ()) -> None:
        self.exact: array | None = array("d")
        self.bins: array | None = None
        self.n = 0
        self.lowest = math.inf
        self.highest = -math.inf
        for value in values:
            self.append(value)

    def __len__(self) -> int:
        return self.n

    def __bool__(self) -> bool:
        return self.n > 0

    @property
    def approximate(self) -> bool:
        return self.bins is not None

    def append(self, value: float) -> None:
        self.n += 1
        if value < self.lowest:
            self.lowest = value
        if value > self.highest:
            self.highest = value
        if self.bins is None:
            self.exact.append(value)
            if len(self.exact) <= self.EXACT:
                return
            self.bins = array("I", bytes(4 * self._span()))
            for kept in self.exact:
                self.bins[self._bin(kept)] += 1
            self.exact = None
            return
        self.bins[self._bin(value)] += 1

    @classmethod
    def _span(cls) -> int:
        return round(math.log10(cls.HIGH / cls.LOW) * cls.BINS_PER_DECADE)

    def _bin(self, value: float) -> int:
        if value <= self.LOW:
            return 0
        return min(self._span() - 1, int(math.log10(value / self.LOW) * self.BINS_PER_DECADE))

    def _middle(self, index: int) -> float:
        value = self.LOW * 10 ** ((index + 0.5) / self.BINS_PER_DECADE)
        return min(max(value, self.lowest), self.highest)

    def _order(self, ranks: Sequence[int]) -> list[float]:
        """The values at these 0-based ranks (ascending ranks), from the bins."""
        out, seen, at = [], 0, 0
        bins = self.bins
        for index, count in enumerate(bins):
            if not count:
                continue
            seen += count
            while at < len(ranks) and ranks[at] < seen:
                rank = ranks[at]
                out.append(self.lowest if rank == 0 else self.highest if rank == self.n - 1 else self._middle(index))
                at += 1
            if at == len(ranks):
                break
        return out

    def quantile(self, q: float) -> float:
        """As percentile() over the sorted values (exact while they are kept)."""
        if self.bins is None:
            return percentile(sorted(self.exact), q)
        if not self.n:
            raise ValueError("percentile of no values")
        position = (self.n - 1) * q
        low = math.floor(position)
        high = min(low + 1, self.n - 1)
        a, b = self._order([low, high]) if high != low else self._order([low]) * 2
        return a + (b - a) * (position - low)

    def distribution(self) -> dict[str, Any]:
        """As distribution() of the values."""
        if self.bins is None:
            return distribution(self.exact)
        out: dict[str, Any] = {"n": self.n, "min": fmt.to_ms(self.lowest)}
        for name, q in QUANTILES:
            out[name] = fmt.to_ms(self.quantile(q))
        out["max"] = fmt.to_ms(self.highest)
        return out

    def values(self) -> list[float]:
        """The values: exact, in arrival order, while they are kept; past EXACT, each bin's middle as
        many times as it counted, ascending (for a chart: the counts are exact, the values within a
        bin's width)."""
        if self.bins is None:
            return list(self.exact)
        out: list[float] = []
        for index, count in enumerate(self.bins):
            if count:
                out += [self._middle(index)] * count
        return out


class LatencyFold:
    """Folds RequestStarted / RequestFinished into TTFT samples per phase and path.

    RunReport feeds it; `report` on a large log reads nothing more than it already did."""

    __slots__ = ("_open", "samples", "unknown", "version")

    def __init__(self) -> None:
        self._open: dict[int, str] = {}                    # main-arm request -> phase, until its end
        self.samples: dict[str, dict[str, Series]] = {}    # phase -> {"cold": seconds, "hit": seconds}, bounded
        self.unknown: dict[str, int] = {}                  # phase -> main requests with unknown cached tokens
        self.version = 0                                   # bumps on every new sample (the app redraws on it)

    def start(self, event: RequestStarted) -> None:
        if event.arm == "main":
            self._open[event.request] = event.phase
            if event.phase not in self.samples:
                self.samples[event.phase] = {"cold": Series(), "hit": Series()}

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
        """TTFT seconds of one phase and path, in arrival order (past Series.EXACT: see Series.values)."""
        series = (self.samples.get(phase) or {}).get(arm)
        return series.values() if series is not None else []

    def all_values(self, arm: str) -> list[float]:
        return [v for by_arm in self.samples.values() for v in by_arm[arm].values()]

    def phase(self, name: str) -> dict[str, Any]:
        """The JSON report's phases.<name>.ttft: {"cold": {...}, "hit": {...}, "unknown_cached": n}."""
        by_arm = self.samples.get(name) or {}
        out: dict[str, Any] = {arm: by_arm[arm].distribution() if arm in by_arm else distribution(())
                               for arm in ARMS}
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
