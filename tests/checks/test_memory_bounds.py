"""Memory over long soaks (issue 26): what a run keeps per request is bounded. A night's soak sends
hundreds of thousands of requests; TTFT samples (the report's LatencyFold and each PhaseState) stop
growing after Series.EXACT values a phase and path, and their percentiles stay exact below that and
within a bin's width above it."""

import random
import statistics
import tracemalloc

import pytest

from tui.core.log.events import RequestFinished, RequestStarted
from tui.core.report.latency import LatencyFold, Series, distribution, percentile
from tui.core.soak.proof import CacheProof
from tui.core.soak.state import PhaseState


def _values(n: int, seed: int = 7) -> list[float]:
    rng = random.Random(seed)
    return [rng.lognormvariate(-2.5, 0.6) for _ in range(n)]


def _size(series: Series) -> int:
    return (series.exact.buffer_info()[1] * 8 if series.exact is not None else 0) + \
        (len(series.bins) * series.bins.itemsize if series.bins is not None else 0)


def test_series_is_exact_up_to_its_cap():
    values = _values(Series.EXACT)
    series = Series(values)
    assert not series.approximate and len(series) == Series.EXACT
    assert series.distribution() == distribution(values)
    assert series.quantile(0.5) == percentile(sorted(values), 0.5)
    assert series.values() == values                          # arrival order
    small = [0.9, 0.1, 0.5, 0.3]
    assert Series(small).quantile(0.5) == statistics.median(small)


def test_series_size_is_fixed_past_its_cap():
    series = Series(_values(Series.EXACT + 1))
    assert series.approximate and series.exact is None
    cap = _size(series)
    assert cap == Series._span() * 4 <= 48_000                 # one histogram of 4-byte counts
    for value in _values(200_000, seed=8):
        series.append(value)
    assert _size(series) == cap and len(series) == Series.EXACT + 1 + 200_000


def test_series_percentiles_past_the_cap_are_within_a_bin():
    values = _values(50_000)
    series = Series(values)
    exact = distribution(values)
    got = series.distribution()
    assert got["n"] == exact["n"] and got["min"] == exact["min"] and got["max"] == exact["max"]
    width = 10 ** (1 / Series.BINS_PER_DECADE) - 1               # a bin's relative width, 0.23%
    ordered = sorted(values)
    for q in (0.0, 0.1, 0.5, 0.9, 0.99, 1.0):
        assert series.quantile(q) == pytest.approx(percentile(ordered, q), rel=width)
    counts = series.values()
    assert len(counts) == len(values) and counts == sorted(counts)
    assert series.quantile(0.5) == pytest.approx(statistics.median(values), rel=width)


def test_series_one_value_repeated_and_out_of_range():
    series = Series([0.25] * (Series.EXACT + 10))
    assert series.distribution() == {"n": Series.EXACT + 10, "min": 250.0, "p50": 250.0, "p90": 250.0,
                                     "p99": 250.0, "max": 250.0}
    series = Series([1e-9] * Series.EXACT + [1e6])               # beyond the bins: clamped, min and max exact
    assert series.quantile(0.0) == 1e-9 and series.quantile(1.0) == 1e6


def test_latency_fold_memory_is_flat_over_many_requests():
    fold = LatencyFold()

    def requests(first: int, n: int) -> None:
        for rid in range(first, first + n):
            fold.start(RequestStarted(request=rid, phase="rotation", arm="main"))
            fold.end(RequestFinished(request=rid, phase="rotation", ttft=0.05 + (rid % 97) / 1000,
                                     cached_tokens=800 if rid % 4 else 0))

    requests(0, 5 * Series.EXACT)                               # both paths past the cap (warm-up)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        requests(5 * Series.EXACT, 50_000)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 2_000, grown                                 # was 8 bytes a request (400 KB here)
    assert fold.phase("rotation")["hit"]["n"] + fold.phase("rotation")["cold"]["n"] == 5 * Series.EXACT + 50_000


class _Completion:
    def __init__(self, ttft: float):
        self.ttft_s, self.prompt_tokens = ttft, 900


class _Record:
    def __init__(self, ttft: float, hit: bool):
        self.completion = _Completion(ttft)
        self.proof = CacheProof("request", 800 if hit else 0, 800 if hit else 0)
        self.hit, self.cold = hit, not hit


def test_phase_state_ttft_is_bounded_and_its_median_is_the_reports_p50():
    state = PhaseState("rotation")
    ttfts = _values(Series.EXACT + 5_000)
    for i, ttft in enumerate(ttfts):
        state.note(_Record(ttft, hit=i % 8 != 0), "main")
    assert state.ttft_hit.approximate and not state.ttft_cold.approximate
    assert _size(state.ttft_hit) == Series._span() * 4
    summary = state.summary()
    colds = [t for i, t in enumerate(ttfts) if i % 8 == 0]
    assert summary["ttft_cold_ms"] == round(statistics.median(colds) * 1000, 1)
    assert summary["ttft_hit_ms"] == state.ttft_hit.distribution()["p50"]


# --- the report's per-request tables ------------------------------------------------------------

from tui.core.log.events import Finding  # noqa: E402
from tui.core.report.report import RunReport  # noqa: E402
from tui.core.report.tables import EndTable, StartTable  # noqa: E402


def _feed(report: RunReport, first: int, n: int, finding_every: int = 0) -> None:
    for rid in range(first, first + n):
        report.feed(RequestStarted(request=rid, seq=2 * rid, phase="rotation", slot=rid % 4, round=rid // 4,
                                   code=f"{rid % 4:04d}-0000-0000", task="recall", arm="main"))
        report.feed(RequestFinished(request=rid, phase="rotation", ttft=0.05, cached_tokens=800 if rid % 4 else 0,
                                    checks={"recall": {}}))
        if finding_every and rid % finding_every == 0:
            report.feed(Finding(kind="recall_miss", severity="warn", phase="rotation", request=rid))


def _table_bytes(table) -> int:
    return sum(c.buffer_info()[1] * c.itemsize for c in table._cols) + len(table._present)


def test_tables_keep_a_window_of_rows_the_counts_and_every_findings_row():
    report = RunReport()
    n = 5 * StartTable.WINDOW + 123
    _feed(report, 1, n, finding_every=1000)
    assert len(report.starts) == n and len(report.ends) == n
    assert report.cache_hits() == sum(1 for rid in range(1, n + 1) if rid % 4)
    assert report.to_json()["requests"] == n
    # the latest WINDOW rows are there, whole
    last = report.starts.get(n)
    assert last is not None and (last.seq, last.slot, last.round, last.code) == (2 * n, n % 4, n // 4,
                                                                                 f"{n % 4:04d}-0000-0000")
    assert report.ends.get(n).cached_tokens == (800 if n % 4 else 0)
    assert n - StartTable.WINDOW + 1 in report.starts
    # an old row is gone, unless a finding named its request
    assert report.starts.get(1001) is None and 1001 not in report.ends
    kept = report.starts.get(1000)
    assert kept is not None and kept.code == "0000-0000-0000" and kept.round == 250
    assert report.ends.get(1000).cached_tokens == 0
    rows = list(report.starts)
    assert rows == sorted(rows) and rows[0] == 1000 and rows[-1] == n      # pinned first, then in order
    assert len(rows) <= 2 * StartTable.WINDOW + n // 1000


def test_tables_stop_growing_past_their_window():
    report = RunReport()
    _feed(report, 1, 3 * StartTable.WINDOW)                    # warm: a slide has happened
    starts, ends = _table_bytes(report.starts), _table_bytes(report.ends)
    for first in range(3 * StartTable.WINDOW + 1, 12 * StartTable.WINDOW, StartTable.WINDOW):
        _feed(report, first, StartTable.WINDOW)
        assert _table_bytes(report.starts) <= 1.2 * starts and _table_bytes(report.ends) <= 1.2 * ends
    assert len(report.starts) == len(report.ends) == 12 * StartTable.WINDOW


def test_tables_out_of_order_or_late_keep_every_row():
    table = EndTable()
    for rid in range(1, 3 * EndTable.WINDOW):
        if rid != 5:                                        # request 5 is still streaming
            table.add(RequestFinished(request=rid, cached_tokens=800))
    table.add(RequestFinished(request=5, cached_tokens=800))  # it ends after its offset was dropped
    assert len(table) == 3 * EndTable.WINDOW - 1 and table.hits == len(table)
    assert table.get(5).cached_tokens == 800
    starts = StartTable()
    for rid in [3, 1, 2, *range(4, 3 * StartTable.WINDOW)]:     # ids out of order: nothing dropped
        starts.add(RequestStarted(request=rid, phase="p", arm="main"))
    assert len(list(starts)) == len(starts) == 3 * StartTable.WINDOW - 1 and 1 in starts
