"""TTFT as a distribution (tui/core/report/latency.py): percentiles cold vs hit per phase, in the JSON
report, the text and markdown reports and the app's histogram. From a real vLLM log (the quick
soak on the embedded vLLM, tests/fixtures/vllm-quick-report.jsonl.gz: the recorded log less the
event types `report` never reads), from a live reference-server soak, and from hand-built events
for the edge cases."""

import gzip
import json
import statistics
from pathlib import Path

import pytest

from support.app import text_of
from support.cli import ROOT, run_hitproof
from tui.app.app import build_app
from tui.app.replay import ReplaySource
from tui.app.widgets import TTFT_STYLE, TtftHistogram, ttft_histogram
from tui.core.log.events import PhaseFinished, PhaseStarted, RequestFinished, RequestStarted, RunFinished, RunHeader
from tui.core.report.formats import to_markdown
from tui.core.report.latency import LatencyFold, distribution, histogram, percentile, table_lines
from tui.core.log.reader import iter_log
from tui.core.report.report import FED_TYPES, RunReport
from tui.headless import report_text

FIXTURE = ROOT / "tests" / "fixtures" / "vllm-quick-report.jsonl.gz"


@pytest.fixture
def vllm_log(tmp_path) -> Path:
    path = tmp_path / "vllm-quick.jsonl"
    path.write_bytes(gzip.decompress(FIXTURE.read_bytes()))
    return path


def _raw(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _expected(events: list[dict]) -> dict[str, dict[str, list[float]]]:
    """TTFT seconds per phase and path, straight from the log's JSON (main arm; unknown: neither)."""
    arm = {e["request"]: e["arm"] for e in events if e["type"] == "request_start"}
    out: dict[str, dict[str, list[float]]] = {}
    for e in events:
        if e["type"] == "request_end" and arm.get(e["request"]) == "main" and e["ttft"] and \
                e["cached_tokens"] is not None:
            out.setdefault(e["phase"], {"cold": [], "hit": []})["hit" if e["cached_tokens"] > 0 else "cold"].append(
                e["ttft"])
    return out


# --- the statistics -----------------------------------------------------------------------

def test_percentiles_interpolate_like_numpy_and_p50_is_the_median():
    values = [0.9, 0.1, 0.5, 0.3, 10.0]
    ordered = sorted(values)
    assert percentile(ordered, 0.5) == statistics.median(values) == 0.5
    assert percentile(ordered, 0.9) == pytest.approx(0.9 + (10.0 - 0.9) * 0.6)   # 60% of the way from 0.9 to 10.0
    assert percentile(ordered, 0.0) == 0.1 and percentile(ordered, 1.0) == 10.0
    inclusive = statistics.quantiles(values, n=100, method="inclusive")
    assert percentile(ordered, 0.99) == pytest.approx(inclusive[98])
    assert percentile(ordered, 0.90) == pytest.approx(inclusive[89])
    d = distribution(values)
    assert d == {"n": 5, "min": 100.0, "p50": 500.0, "p90": pytest.approx(6360.0), "p99": pytest.approx(9636.0),
                 "max": 10000.0}
    assert distribution([]) == {"n": 0, "min": None, "p50": None, "p90": None, "p99": None, "max": None}
    with pytest.raises(ValueError):
        percentile([], 0.5)


def _start(request, phase="rotation", arm="main"):
    return RequestStarted(request=request, phase=phase, arm=arm)


def _end(request, ttft, cached, phase="rotation"):
    return RequestFinished(request=request, phase=phase, ttft=ttft, cached_tokens=cached)


def test_fold_counts_main_arm_only_and_unknown_cached_tokens_as_neither():
    fold = LatencyFold()
    events = [(_start(1), _end(1, 2.0, 0)), (_start(2), _end(2, 0.2, 128)), (_start(3), _end(3, 0.3, 256)),
              (_start(4, arm="control"), _end(4, 9.0, 0)),          # a control re-send: the instrument
              (_start(5, arm="isolation"), _end(5, 9.0, 128)),
              (_start(6), _end(6, 5.0, None)),                     # unknown cached tokens: never cold
              (_start(7), _end(7, None, 0)),                       # no first token: no TTFT
              (_start(8, phase="control"), _end(8, 1.5, 0, phase="control"))]
    for start, end in events:
        fold.start(start)
        fold.end(end)
    fold.end(_end(2, 50.0, 128))                                   # a second end of the same request
    rotation = fold.phase("rotation")
    assert rotation["cold"]["n"] == 1 and rotation["cold"]["p50"] == 2000.0
    assert rotation["hit"] == {"n": 2, "min": 200.0, "p50": 250.0, "p90": 290.0, "p99": 299.0, "max": 300.0}
    assert rotation["unknown_cached"] == 1
    assert fold.phase("control")["hit"]["n"] == 0 and fold.phase("control")["cold"]["n"] == 1
    assert fold.values("rotation", "cold") == [2.0] and sorted(fold.all_values("cold")) == [1.5, 2.0]
    assert fold.version == 4
    lines = table_lines(fold, ["rotation", "control"])
    assert any(line.split()[:3] == ["rotation", "cold", "1"] for line in lines)
    unknown = next(line for line in lines if "unknown" in line)
    assert unknown.split() == ["unknown", "1", "-", "-", "-", "-", "-"]
    assert all("None" not in line and len(line) <= 80 for line in lines)
    assert table_lines(LatencyFold()) == []


def test_histogram_bins_are_shared_and_log_spaced():
    edges, counts = histogram({"cold": [1.0, 2.0, 10.0], "hit": [0.01, 0.02, 0.1, 0.1]}, bins=6)
    assert len(edges) == 7 and edges[0] == pytest.approx(0.01) and edges[-1] == pytest.approx(10.0)
    ratios = [b / a for a, b in zip(edges, edges[1:])]
    assert max(ratios) == pytest.approx(min(ratios))               # evenly spaced on a log scale
    assert sum(counts["cold"]) == 3 and sum(counts["hit"]) == 4
    assert counts["hit"][0] == 2 and counts["cold"][-1] == 1       # the largest value lands in the last bin
    assert histogram({"cold": [], "hit": []}) == ([], {"cold": [], "hit": []})
    edges, counts = histogram({"cold": [0.5], "hit": []}, bins=4)    # one value: one narrow span
    assert sum(counts["cold"]) == 1 and edges[0] < 0.5 < edges[-1]


# --- a real vLLM log -----------------------------------------------------------------------

def test_json_report_extends_phases_with_ttft_percentiles_from_a_real_vllm_log(vllm_log):
    report = RunReport.from_events(iter_log(vllm_log, only=FED_TYPES))
    data = report.to_json()
    expected = _expected(_raw(vllm_log))
    assert set(data["phases"]) == set(expected) | {"control"} >= {"cold_hit", "rotation", "long_prompt"}
    for name, phase in data["phases"].items():
        ttft = phase["ttft"]
        assert set(ttft) == {"cold", "hit", "unknown_cached"} and ttft["unknown_cached"] == 0
        for arm in ("cold", "hit"):
            values = expected.get(name, {}).get(arm, [])
            assert ttft[arm] == distribution(values), (name, arm)
            assert ttft[arm]["n"] == len(values)
            if values:
                assert ttft[arm]["min"] == round(min(values) * 1000, 1)
                assert ttft[arm]["max"] == round(max(values) * 1000, 1)
        # the existing medians stay, and agree with the new p50
        assert phase["ttft_cold_ms"] == ttft["cold"]["p50"] and phase["ttft_hit_ms"] == ttft["hit"]["p50"], name
    assert data["phases"]["rotation"]["ttft"]["cold"]["n"] == 4 and data["phases"]["rotation"]["ttft"]["hit"]["n"] == 20
    assert report.phases["rotation"].get("ttft") is None            # the fold's view is added, not stored


async def test_text_and_markdown_reports_show_the_percentile_table(vllm_log):
    result = await run_hitproof("report", str(vllm_log))
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("TTFT percentiles, ms"))
    table = lines[at:at + 13]
    assert table[1].split() == ["phase", "path", "n", "min", "p50", "p90", "p99", "max"]
    assert all(len(line) <= 80 for line in table)
    rotation = next(line for line in table if line.startswith("rotation"))
    hit = table[table.index(rotation) + 1].split()
    assert rotation.split()[:3] == ["rotation", "cold", "4"] and hit[:2] == ["hit", "20"]
    assert all("None" not in line for line in table)
    assert "None" not in result.out.split("incident record:")[0]    # (the server's own labels may say None)
    md = await run_hitproof("report", str(vllm_log), "--format", "markdown")
    section = md.out.split("### TTFT percentiles (ms)")[1].split("###")[0]
    assert "| rotation | hit | 20 |" in section and "| control | cold | 4 |" in section
    assert "| conversation | cold |" not in section                  # no cold request there: no row
    assert "None" not in section


def test_the_text_report_of_an_empty_run_has_no_table_and_no_none():
    events = [RunHeader(run_id="r", scenario={"name": "s", "settings": {"seed": 1}}), PhaseStarted(phase="cold_hit"), _start(1, "cold_hit"),
              RequestFinished(request=1, phase="cold_hit", ttft=None, cached_tokens=None, error="boom"),
              PhaseFinished(phase="cold_hit", status="inconclusive", summary={"requests": 1}),
              RunFinished(verdict="inconclusive", exit_code=4, message="nothing proven")]
    report = RunReport.from_events(events)
    text = report_text(report)
    assert "TTFT percentiles" not in text and "None" not in text
    assert "TTFT percentiles" not in to_markdown(report)
    assert report.to_json()["phases"]["cold_hit"]["ttft"]["cold"]["n"] == 0


# --- the app ---------------------------------------------------------------------------------

async def test_app_shows_the_ttft_histogram_of_a_real_vllm_run(vllm_log):
    expected = _expected(_raw(vllm_log))
    n_cold = sum(len(v["cold"]) for v in expected.values())
    n_hit = sum(len(v["hit"]) for v in expected.values())
    app = build_app(ReplaySource(vllm_log))
    async with app.run_test(size=(100, 30)) as pilot:
        while not (app.source.ready and app.model.finished):
            await pilot.pause(0.05)
        await pilot.pause(0.3)
        widget = app.query_one(TtftHistogram)
        text = text_of(widget)
        lines = text.splitlines()
        assert lines[0].startswith("TTFT ") and ".." in lines[0]
        cold, hit = lines[1].split(), lines[2].split()
        assert cold[0] == "cold" and int(cold[-1]) == n_cold == 15
        assert hit[0] == "hit" and int(hit[-1]) == n_hit == 41
        # a column per bin, its height the bin's count: the fullest bin of each path is a full block
        assert "█" in cold[1] and "█" in hit[1] and len(cold[1]) == len(hit[1]) == 12
        # the hits sit left of (faster than) the colds: the hit row's mass is in its first bins
        assert hit[1][-1] == "·" and hit[1][0] != "·"
        assert lines[3].startswith("p50 ")
        styles = {str(span.style) for span in widget.content.spans}
        assert TTFT_STYLE["cold"] in styles and TTFT_STYLE["hit"] in styles
        assert widget.region.height == 4 and widget.region.width <= 26
        await pilot.press("q")


def test_histogram_text_before_any_ttft():
    assert ttft_histogram(LatencyFold()).plain == "TTFT none yet"
