"""`hitproof report LOG --format html`: one self-contained page with inline SVG charts.

Checked the way a person gets it: the `hitproof` command writes the file, html.parser and
ElementTree read it (every chart holds as many points as the log says it should), and a real
headless Chromium renders it into screenshots/ (the pixels of each chart's colour are counted).
Logs: a real quick soak on the embedded vLLM (tests/fixtures/vllm-quick-report.jsonl.gz, the
recorded log less the event types `report` never reads) and soaks recorded here against the
reference server, clean and with foreign state on hits, quick and agent-quick.
"""

import asyncio
import gzip
import html
import json
import math
import re
from pathlib import Path

import pytest

from support.app import SCREENSHOTS
from support.cli import ROOT, run_hitproof
from support.html_page import assert_self_contained, colours, find, parse_page, screenshot
from support.png import crop_rows, first_row_with
from tui.core.soak.engine import Target
from tui.core.log.events import Finding, MetricsSample, RequestFinished, RequestStarted, RunHeader
from tui.core.report.html import (COLORS, MAX_DOTS, MAX_FINDINGS_DETAILED, MAX_FINDINGS_LISTED, MAX_TIMELINE,
                                  HtmlFold, marked_html, marks_for, read_log, timeline_points, to_html, ttft_chart)
from tui.core.log.recorder import encode_line
from tui.core.report.report import RunReport
from tui.core.config.scenario import load_scenario
from tui.refserver import start_refserver
from tui.runner import run

FIXTURE = ROOT / "tests" / "fixtures" / "vllm-quick-report.jsonl.gz"
SCENARIOS = ROOT / "scenarios"


def _raw(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def _record(fault: str, scenario: str, path: Path, isolate: bool = False) -> None:
    handle = await start_refserver(port=0, fault=fault, seed=0, decode_ms_per_token=2.0)
    try:
        await run(load_scenario(SCENARIOS / scenario), Target(url=handle.url), record=path, isolate=isolate)
    finally:
        await handle.close()


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    """The real vLLM log, and reference-server soaks recorded concurrently (seconds)."""
    folder = tmp_path_factory.mktemp("html-logs")
    paths = {"vllm": folder / "vllm-quick.jsonl", "foreign": folder / "quick-foreign.jsonl",
             "clean": folder / "quick-clean.jsonl", "agent": folder / "agent-zero-state.jsonl"}
    paths["vllm"].write_bytes(gzip.decompress(FIXTURE.read_bytes()))

    async def record_all():
        await asyncio.gather(_record("foreign_state", "quick.toml", paths["foreign"], isolate=True),
                             _record("none", "quick.toml", paths["clean"]),
                             _record("zero_state", "agent-quick.toml", paths["agent"]))

    asyncio.run(record_all())
    return paths


async def _html(log: Path, out: Path):
    result = await run_hitproof("report", str(log), "--format", "html", "--output", str(out))
    assert result.code == 0 and result.out == "" and "Traceback" not in result.err, result.err
    json_result = await run_hitproof("report", str(log), "--format", "json")
    return parse_page(out.read_text(encoding="utf-8")), json.loads(json_result.out)


def _chart(page, name: str, index: int = 0):
    assert name in page.charts, (name, list(page.charts))
    return page.charts[name][index]


def _expected_timeline(events: list[dict]) -> dict[str, int]:
    """Points each timeline series should have, computed from the log's JSON independently."""
    samples = [e for e in events if e["type"] == "metrics"]
    kv = sum(1 for s in samples if "vllm:kv_cache_usage_perc" in s["values"])
    known = [s["values"] for s in samples if "vllm:prefix_cache_queries_total" in s["values"]]
    cumulative = sum(1 for v in known if v["vllm:prefix_cache_queries_total"] > known[0]["vllm:prefix_cache_queries_total"])
    interval = sum(1 for a, b in zip(known, known[1:])
                   if b["vllm:prefix_cache_queries_total"] > a["vllm:prefix_cache_queries_total"])
    return {"kv": kv, "rate": cumulative, "interval": interval}


def _points(polyline) -> list[tuple[float, float]]:
    return [tuple(map(float, pair.split(","))) for pair in polyline.get("points").split()]


# --- a real vLLM run ----------------------------------------------------------------------------

async def test_real_vllm_log_page_is_self_contained_and_its_charts_hold_the_log(logs, tmp_path):
    events = _raw(logs["vllm"])
    page, report = await _html(logs["vllm"], tmp_path / "vllm.html")
    assert_self_contained(page)
    assert "PASS (exit 0)" in page.text and "None" not in page.text

    # the incident record and the phase table
    incident = next(e for e in events if e["type"] == "header")["target"]["incident"]
    assert incident["server"]["system_fingerprint"] in page.text and "launch command" in page.text
    rows = re.findall(r"<tr><td>([a-z_]+)</td><td class=\"status-", page.html)
    assert rows == list(report["phases"])

    # TTFT: one lane per phase and path with samples, one dot per request (main arm, cached known)
    ttft = _chart(page, "ttft")
    lanes = find(ttft, "g", "lane")
    expected = {(name, arm): phase["ttft"][arm]["n"] for name, phase in report["phases"].items()
                for arm in ("cold", "hit") if phase["ttft"][arm]["n"]}
    assert {(g.get("data-phase"), g.get("data-arm")): int(g.get("data-n")) for g in lanes} == expected
    for g in lanes:
        assert len(find(g, "circle", g.get("data-arm"))) == int(g.get("data-n"))
    assert len(find(ttft, "circle", "cold")) == 15 and len(find(ttft, "circle", "hit")) == 41
    # log scale: the slowest cold dot is right of the fastest hit dot, by the ratio of the times
    xs = {arm: sorted(float(c.get("cx")) for c in find(ttft, "circle", arm)) for arm in ("cold", "hit")}
    assert xs["cold"][-1] > xs["hit"][0]

    # cached tokens per conversation turn: a bar per turn, the heights the log's cached tokens
    turns = _chart(page, "turns")
    bars = find(turns, "g", "turn")
    assert [int(g.get("data-cached")) for g in bars] == report["phases"]["conversation"]["cached_by_turn"]
    assert [int(g.get("data-turn")) for g in bars] == list(range(1, 8))
    heights = [float(r.get("height")) for r in find(turns, "rect", "cached")]
    assert heights == sorted(heights) and len(heights) == 7          # cached tokens rise turn over turn

    # the timeline: every metrics sample that carries the value is a point
    timeline = _chart(page, "timeline")
    want = _expected_timeline(events)
    (kv,) = find(timeline, "polyline", "kv")
    (rate,) = find(timeline, "polyline", "rate")
    assert int(kv.get("data-points")) == len(_points(kv)) == want["kv"] == 142
    assert len(_points(rate)) == want["rate"] and len(find(timeline, "circle", "interval")) == want["interval"]
    assert find(timeline, "line", "finding") == [] and "Findings (0 fail, 0 warn, 0 info)" in page.text
    bands = find(timeline, "rect", "phase-band")
    assert len(bands) == len(report["phases"])
    # y is a percentage: the last cumulative point is the run's hit rate from the counters
    known = [e["values"] for e in events if e["type"] == "metrics"]
    first, last = known[0], known[-1]
    overall = 100 * (last["vllm:prefix_cache_hits_total"] - first["vllm:prefix_cache_hits_total"]) / \
        (last["vllm:prefix_cache_queries_total"] - first["vllm:prefix_cache_queries_total"])
    grid = {int(g.get("data-pct")): float(g.get("y1")) for g in find(timeline, "line", "grid") if g.get("data-pct")}
    top, bottom = grid[100], grid[0]
    assert _points(rate)[-1][1] == pytest.approx(bottom - overall / 100 * (bottom - top), abs=0.1)


async def test_chromium_renders_the_real_vllm_report_with_its_charts(logs, tmp_path):
    out = tmp_path / "vllm.html"
    await _html(logs["vllm"], out)
    png = screenshot(out, SCREENSHOTS / "report-html.png")
    seen = colours(png)
    # every chart drew: the pixels of each series' own colour (solid fills and strokes)
    for name in ("cold", "hit", "prompt", "cached", "rate", "kv"):
        assert seen[COLORS[name]] >= 100, (name, COLORS[name], seen[COLORS[name]])
    assert seen["#ffffff"] < sum(seen.values()) * 0.97                 # not a blank page


# --- findings on the page and on the timeline --------------------------------------------------

async def test_foreign_codes_are_marked_at_their_offsets_and_on_the_timeline(logs, tmp_path):
    events = _raw(logs["foreign"])
    page, report = await _html(logs["foreign"], tmp_path / "foreign.html")
    assert_self_contained(page)
    assert "FAIL (exit 1)" in page.text
    findings = [e for e in events if e["type"] == "finding"]
    answers = {e["request"]: e["text"] for e in events if e["type"] == "request_end"}
    foreign = [(i, f) for i, f in enumerate(findings) if f["kind"] == "foreign_code" and f["severity"] == "fail"]
    assert foreign and len(findings) == len(report["findings"])
    for index, f in foreign:
        block = re.search(rf'<div class="finding fail" id="finding-{index}">(.*?)</div>', page.html, re.S).group(1)
        marks = re.findall(r'<mark class="bad" data-offset="(\d+)"[^>]*>(.*?)</mark>', block)
        assert (str(f["offset"]), f["evidence"]["matched"]) in [(o, html.unescape(t)) for o, t in marks]
        answer = re.search(r'<pre class="answer">(.*?)</pre>', block, re.S).group(1)
        plain = html.unescape(re.sub(r"<[^>]+>", "", answer))
        assert plain == answers[f["request"]]                      # the whole answer, the mark inside it
        assert plain[f["offset"]:].startswith(f["evidence"]["matched"])
        said = html.unescape(re.sub(r"<[^>]+>", "", block))
        assert re.search(rf"isolation of request {f['request']} \(re-run for foreign_code\): leak, reproduced on "
                         rf"\d/4 hits and 0/4 cold", said), said
    timeline = _chart(page, "timeline")
    lines = find(timeline, "line", "finding")
    assert len(lines) == len(findings)
    anchors = [a.get("href") for a in find(timeline, "a")]
    ids = set(re.findall(r'id="(finding-\d+)"', page.html))
    assert sorted(anchors) == sorted(f"#{i}" for i in ids) and len(ids) == len(findings)
    by_t = sorted(zip((f["t"] for f in findings), (float(line.get("x1")) for line in lines)))
    assert [x for _, x in by_t] == sorted(x for _, x in by_t)      # later findings further right
    assert all("fail" in line.get("class") for line in lines if line.get("stroke") == COLORS["fail"])
    full = screenshot(tmp_path / "foreign.html", tmp_path / "foreign.png", height=3800)
    assert colours(full)[COLORS["fail"]] >= 100
    # the picture for the manual (docs/ci.md): from the timeline (the first row of the hit-rate line, less its
    # heading) down through the first findings
    top = first_row_with(full, COLORS["rate"])
    assert top is not None
    crop_rows(full, SCREENSHOTS / "report-html-findings.png", top - 110, 1100)
    assert colours(SCREENSHOTS / "report-html-findings.png")[COLORS["fail"]] >= 100


async def test_a_clean_run_page_marks_nothing(logs, tmp_path):
    page, report = await _html(logs["clean"], tmp_path / "clean.html")
    assert report["verdict"] == "pass" and report["findings"] == []
    assert "PASS (exit 0)" in page.text and "Findings (0 fail, 0 warn, 0 info)" in page.text
    assert '<mark class="bad"' not in page.html and find(_chart(page, "timeline"), "line", "finding") == []
    assert find(_chart(page, "timeline"), "polyline", "rate")          # the charts are there all the same
    assert len(find(_chart(page, "ttft"), "circle")) == sum(
        p["ttft"]["cold"]["n"] + p["ttft"]["hit"]["n"] for p in report["phases"].values())


async def test_agent_turns_chart_holds_every_turn_and_the_control_arm(logs, tmp_path):
    page, report = await _html(logs["agent"], tmp_path / "agent.html")
    assert_self_contained(page)
    turns = report["phases"]["agent_replay"]["turns"]
    chart = _chart(page, "turns")
    assert chart.get("aria-label") == "agent turns"
    bars = find(chart, "g", "turn")
    assert [int(g.get("data-turn")) for g in bars] == [t["turn"] for t in turns] == list(range(1, 7))
    assert [int(g.get("data-cached")) for g in bars] == [t["cached_tokens"] for t in turns]
    assert len(find(chart, "line", "control")) == len([t for t in turns if t["control"]["cached_tokens"] is not None])
    first_bad = next(f for f in report["findings"] if f["kind"] == "recall_miss" and f["severity"] == "fail")
    assert f"request {first_bad['request']}" in page.text and "Findings (1 fail" in page.text


# --- the pieces ----------------------------------------------------------------------------------

def test_log_text_is_escaped_and_marks_sit_at_their_offsets():
    answer = "<b>x</b> & the code 1111-2222-3333 then <script>alert(1)</script>"
    at = answer.index("1111")
    events = [RunHeader(run_id="<script>r</script>", scenario={"name": "s<i>"}),
              RequestStarted(request=1, phase="rotation", code="4444-5555-6666"),
              RequestFinished(request=1, phase="rotation", text=answer, cached_tokens=64, ttft=0.1,
                              checks={"foreign": [{"offset": at, "matched": "1111-2222-3333", "code": "1111-2222-3333",
                                                   "owner": "m1", "groups": 3}]}),
              Finding(t=0.2, kind="foreign_code", severity="fail", phase="rotation", request=1, offset=at,
                      detail="detail <img src=x onerror=alert(1)>", evidence={"matched": "1111-2222-3333"})]
    report, fold = RunReport(), HtmlFold()
    for e in events:
        report.feed(e)
        fold.feed(e)
    text = to_html(report, fold)
    page = parse_page(text)
    assert_self_contained(page)
    assert "<script>" not in text and "<img" not in text and "<b>x" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text and "detail &lt;img src=x" in text
    assert f'<mark class="bad" data-offset="{at}"' in text
    assert text.count('<mark class="bad"') == 1


def test_mark_spans_per_kind():
    text = "abc 1111-2222-3333 def def def def def def own 4444-5555-6666."
    foreign = Finding(kind="foreign_code", offset=4, evidence={"matched": "1111-2222-3333"})
    assert marks_for(foreign, text, {}, "4444-5555-6666") == [(4, 18, "bad"), (47, 61, "own")]
    rep = Finding(kind="repetition", offset=19)
    assert marks_for(rep, text, {"repetition": {"offset": 19, "unit": "def ", "count": 6}}) == [(19, 43, "bad")]
    divergence = Finding(kind="cache_path_divergence", offset=19)       # the word at the first differing char
    assert marks_for(divergence, text, {}) == [(19, 22, "bad")]
    miss = Finding(kind="recall_miss", offset=None)
    assert marks_for(miss, text, {}) == []
    wrong = Finding(kind="wrong_task", offset=47)
    assert marks_for(wrong, text, {}, "4444-5555-6666") == [(47, 61, "bad")]    # the bad mark wins an overlap
    assert marks_for(Finding(kind="foreign_code", offset=999), text, {}) == []  # an offset outside the answer
    long = "x" * 10_000 + "HERE" + "y" * 10_000
    shown = marked_html(long, [(10_000, 10_004, "bad")], limit=400)
    assert '<mark class="bad" data-offset="10000"' in shown and "characters before" in shown
    assert "characters after" in shown and len(shown) < 800


def test_many_samples_are_capped_and_the_caps_keep_the_totals():
    fold = HtmlFold()
    n = MAX_TIMELINE * 3 + 7
    for i in range(n):
        fold.feed(MetricsSample(t=i * 0.5, values={"vllm:prefix_cache_queries_total": 100.0 * i,
                                                   "vllm:prefix_cache_hits_total": 75.0 * i,
                                                   "vllm:kv_cache_usage_perc": 0.9 if i == 1000 else 0.1}))
    points = timeline_points(fold)
    assert all(len(series) <= MAX_TIMELINE for series in points.values())
    assert points["cumulative"][-1] == (fold.metric_t[-1], 75.0)         # the last sample is always kept
    assert max(v for _, v in points["kv"]) == pytest.approx(90.0)        # a peak survives the bucketing
    assert all(v == pytest.approx(75.0) for _, v in points["interval"])
    chart = parse_page(ttft_chart({"rotation": {"cold": [1.0 + i / 1000 for i in range(1000)], "hit": [0.1]}}))
    svg = chart.charts["ttft"][0]
    assert len(find(svg, "circle", "cold")) == MAX_DOTS and len(find(svg, "circle", "hit")) == 1
    assert f"{MAX_DOTS} of 1000 dots" in ''.join(svg.itertext())


def test_a_flood_of_findings_is_capped_on_the_page():
    n = MAX_FINDINGS_LISTED + 150
    report = RunReport()
    report.feed(RequestStarted(request=1, phase="rotation"))
    report.feed(RequestFinished(request=1, phase="rotation", text="answer", cached_tokens=16))
    fold = HtmlFold()
    for i in range(n):
        severity = "fail" if i % 10 == 0 else "info"
        event = Finding(seq=i, t=i * 0.01, kind="wrong_task", severity=severity, phase="rotation", request=1, offset=0)
        report.feed(event)
        fold.feed(event)
    page = parse_page(to_html(report, fold))
    assert page.html.count('<div class="finding') == MAX_FINDINGS_DETAILED
    # the detailed ones are the fail-class ones first (there are 215 of them)
    assert n // 10 > MAX_FINDINGS_DETAILED and page.html.count('<div class="finding fail"') == MAX_FINDINGS_DETAILED
    assert len(re.findall(r'<tr id="finding-\d+">', page.html)) == MAX_FINDINGS_LISTED - MAX_FINDINGS_DETAILED
    assert f"{n - MAX_FINDINGS_LISTED} more findings are in the log" in page.text
    lines = find(page.charts["timeline"][0], "line", "finding")
    assert len(lines) == MAX_FINDINGS_LISTED
    ids = set(re.findall(r'id="(finding-\d+)"', page.html))
    assert {a.get("href")[1:] for a in find(page.charts["timeline"][0], "a")} == ids


def test_llamacpp_counters_and_a_server_without_metrics():
    fold = HtmlFold()
    for i, (cached, processed) in enumerate([(0, 100), (300, 200), (300, 200)]):
        fold.feed(MetricsSample(t=float(i), values={"llamacpp:prompt_tokens_cached_total": cached,
                                                    "llamacpp:prompt_tokens_total": processed}))
    points = timeline_points(fold)
    assert fold.counters == "llamacpp" and points["kv"] == []
    assert points["cumulative"] == [(1.0, 75.0), (2.0, 75.0)]   # 300 cached of 400 more prompt tokens
    assert points["interval"] == [(1.0, 75.0)]                  # the interval without tokens has no rate
    text = to_html(RunReport(), fold)
    assert "KV cache usage: not reported by this server" in text
    assert "no metrics samples in this log" in to_html(RunReport(), HtmlFold())


def _write_log(path: Path, events) -> None:
    with open(path, "wb") as out:
        for seq, event in enumerate(events, start=1):
            event.seq, event.t = seq, seq * 0.01
            out.write(encode_line(event))


def test_a_finding_after_its_answer_left_the_window_is_found_in_a_second_pass(tmp_path):
    events = [RunHeader(run_id="r")]
    for request in range(1, 21):
        events += [RequestStarted(request=request, phase="rotation"),
                   RequestFinished(request=request, phase="rotation", text=f"answer {request}", cached_tokens=8)]
    events.append(Finding(kind="wrong_task", severity="warn", phase="rotation", request=2, offset=0))
    path = tmp_path / "late.jsonl"
    _write_log(path, events)
    report, fold = read_log(path, window=5)
    assert fold.answers[2][0] == "answer 2" and not fold.missing
    report, fold = read_log(path)
    assert fold.answers[2][0] == "answer 2"
    page = parse_page(to_html(report, fold))
    assert "answer of request 2" in page.text and "answer 2" in page.text


async def test_bad_input_is_one_line_and_exit_2(logs, tmp_path):
    missing = await run_hitproof("report", str(tmp_path / "nope.jsonl"), "--format", "html")
    assert missing.code == 2 and missing.err.strip().count("\n") == 0 and "Traceback" not in missing.err
    assert "cannot open log" in missing.err
    unwritable = await run_hitproof("report", str(logs["clean"]), "--format", "html", "--output",
                                    str(tmp_path / "no" / "such" / "dir" / "r.html"))
    assert unwritable.code == 2 and "cannot write" in unwritable.err and "Traceback" not in unwritable.err
    newer = tmp_path / "newer.jsonl"
    newer.write_text('{"type":"header","seq":1,"t":0,"schema":99}\n')
    bad = await run_hitproof("report", str(newer), "--format", "html")
    assert bad.code == 2 and "newer than this hitproof" in bad.err and "Traceback" not in bad.err


def test_nan_free_geometry():
    """Every coordinate a chart writes is a finite number (an unknown value is left out, not NaN)."""
    fold = HtmlFold()
    fold.feed(MetricsSample(t=1.0, values={"vllm:num_requests_running": 1.0}))
    fold.feed(MetricsSample(t=2.0, values={"vllm:prefix_cache_queries_total": 0.0, "vllm:prefix_cache_hits_total": 0.0}))
    page = parse_page(to_html(RunReport(), fold))
    for svg in (s for charts in page.charts.values() for s in charts):
        for element in svg.iter():
            for name in ("x", "y", "x1", "x2", "y1", "y2", "cx", "cy", "width", "height"):
                if element.get(name) is not None:
                    assert math.isfinite(float(element.get(name))), (element.tag, name, element.get(name))
