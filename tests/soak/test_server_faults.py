"""Server faults, each through the real CLI (or the real client) against the reference server behind
tests/support/fault_proxy.py: 429/503 with Retry-After, a server that never answers, a reset
mid-stream, a restart mid-soak, a stream without [DONE]. Each fault fires; the same path with
the fault off stays quiet."""

from __future__ import annotations

import email.utils
import json
import time

import pytest

from support.cli import report_json, run_hitproof, scenario
from support.fault_proxy import FaultProxy
from tui.core.server.client import OpenAIClient, RequestSpec, retry_delay
from tui.core.config.errors import ServerProblem
from tui.core.server.metrics import parse_metrics
from tui.core.server.restarts import RestartWatch
from tui.refserver import start_refserver

SMALL = """
[scenario]
phases = {phases}
request_timeout = {timeout}
[evidence]
memo_tokens = 300
[phases.conversation]
turns = 2
[phases.control]
requests = 2
concurrency = 1
"""
SPEC = RequestSpec(api="completions", prompt="Memo: hello. Question: what?", max_tokens=4, model="refmodel")


@pytest.fixture
async def refserver():
    handle = await start_refserver(port=0, fault="none")
    yield handle
    await handle.close()


async def soak(tmp_path, url, phases='["cold_hit"]', timeout=600):
    log = tmp_path / "run.jsonl"
    path = scenario(tmp_path, SMALL.format(phases=phases, timeout=timeout))
    result = await run_hitproof("run", "--attach", url, "--scenario", str(path), "--headless", "--record", str(log))
    events = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return result, events


def error_lines(result) -> list[str]:
    assert "Traceback" not in result.out + result.err
    return [line for line in result.err.splitlines() if "error:" in line]


def one_error_line(result) -> str:
    lines = error_lines(result)
    assert len(lines) == 1, result.err
    return lines[0]


# --- the proxy itself, and every fault off: a clean soak ---------------------------------------------------

async def test_a_clean_soak_through_the_proxy_passes(refserver, tmp_path):
    proxy = await FaultProxy(refserver.url, "none").start()
    try:
        result, events = await soak(tmp_path, proxy.url, '["cold_hit", "conversation", "control"]')
    finally:
        await proxy.close()
    assert result.code == 0, result.out + result.err
    assert not error_lines(result) and proxy.generations > 5
    assert not [e for e in events if e["type"] == "request_end" and "stream" in e["checks"]]


# --- 429 / 503 with Retry-After ---------------------------------------------------------------------------

@pytest.mark.parametrize("status", [429, 503])
async def test_refusals_are_retried_after_the_delay_the_server_asks(refserver, status):
    proxy = await FaultProxy(refserver.url, "status", status=status, count=2, retry_after="1").start()
    client = OpenAIClient(proxy.url)
    try:
        result = await client.stream(SPEC)
    finally:
        await client.aclose()
        await proxy.close()
    assert result.finish_reason and result.text
    assert client.retries == [(status, 1.0), (status, 1.0)] and proxy.generations == 3


async def test_a_long_retry_after_is_capped_and_a_missing_one_backs_off():
    later = email.utils.formatdate(time.time() + 3600, usegmt=True)
    assert retry_delay(later, 0, cap=30.0) == 30.0
    assert 0 <= retry_delay(email.utils.formatdate(time.time() - 60, usegmt=True), 0, cap=30.0) <= 0.0
    assert [retry_delay(None, n, cap=5.0) for n in range(4)] == [1.0, 2.0, 4.0, 5.0]
    assert retry_delay("soon", 1, cap=30.0) == 2.0 and retry_delay("7", 0, cap=30.0) == 7.0


async def test_refusals_without_end_are_a_server_problem_after_the_bounded_retries(refserver):
    proxy = await FaultProxy(refserver.url, "status", status=503, count=100, retry_after="0").start()
    client = OpenAIClient(proxy.url, max_retries=3)
    try:
        with pytest.raises(ServerProblem, match=r"HTTP 503 from /v1/completions: proxy: the server is busy, try "
                                                r"again later; still refused after 3 retries") as caught:
            await client.stream(SPEC)
    finally:
        await client.aclose()
        await proxy.close()
    assert proxy.generations == 4 and "\n" not in str(caught.value)


async def test_a_soak_whose_server_keeps_refusing_exits_3_with_one_line(refserver, tmp_path):
    proxy = await FaultProxy(refserver.url, "status", status=429, after=1, count=100, retry_after="0").start()
    try:
        result, events = await soak(tmp_path, proxy.url)
    finally:
        await proxy.close()
    assert result.code == 3, result.out + result.err
    line = one_error_line(result)
    assert "request 1 (cold_hit): HTTP 429 from /v1/completions" in line and "still refused after 4 retries" in line
    assert events[-1]["type"] == "run_end" and events[-1]["exit_code"] == 3


async def test_a_few_refusals_do_not_change_the_verdict(refserver, tmp_path):
    proxy = await FaultProxy(refserver.url, "status", status=503, after=2, count=2, retry_after="0").start()
    try:
        result, _ = await soak(tmp_path, proxy.url)
    finally:
        await proxy.close()
    assert result.code == 0, result.out + result.err
    assert proxy.faulted == 2 and not error_lines(result)


# (Every `after` counts the cache-report probe: hitproof's first completion, before the first phase.)

# --- a server that accepts and never answers ----------------------------------------------------------

async def test_a_server_that_never_answers_times_out_naming_the_request(refserver, tmp_path):
    proxy = await FaultProxy(refserver.url, "hang", after=3).start()
    try:
        result, events = await soak(tmp_path, proxy.url, timeout=2)
    finally:
        await proxy.close()
    assert result.code == 3, result.out + result.err
    line = one_error_line(result)
    assert "request 3 (cold_hit): stream from /v1/completions timed out: no response within 2 s" in line, line
    assert sum(e["type"] == "request_end" for e in events) == 2 and events[-1]["type"] == "run_end"


# --- a reset in the middle of a stream -------------------------------------------------------------------

async def test_a_reset_mid_stream_exits_3_with_one_line(refserver, tmp_path):
    proxy = await FaultProxy(refserver.url, "reset", after=2, keep=3).start()
    try:
        result, events = await soak(tmp_path, proxy.url)
    finally:
        await proxy.close()
    assert result.code == 3, result.out + result.err
    line = one_error_line(result)
    assert "request 2 (cold_hit): stream from /v1/completions broke: the server reset the connection" in line, line
    assert proxy.faulted == 1 and sum(e["type"] == "request_end" for e in events) == 1


# --- a stream that ends without [DONE] -------------------------------------------------------------------

async def test_no_done_after_the_finish_reason_is_tolerated_and_noted(refserver, tmp_path):
    proxy = await FaultProxy(refserver.url, "no_done").start()
    try:
        result, events = await soak(tmp_path, proxy.url)
    finally:
        await proxy.close()
    assert result.code == 0, result.out + result.err
    ends = [e for e in events if e["type"] == "request_end"]
    assert ends and all(e["checks"]["stream"] == ["the stream ended without data: [DONE] (after its finish_reason)"]
                        for e in ends)


async def test_a_stream_cut_before_its_finish_reason_exits_3(refserver, tmp_path):
    proxy = await FaultProxy(refserver.url, "cut", after=2, keep=2).start()
    try:
        result, _ = await soak(tmp_path, proxy.url)
    finally:
        await proxy.close()
    assert result.code == 3, result.out + result.err
    line = one_error_line(result)
    assert "request 2 (cold_hit): stream from /v1/completions ended without [DONE] and without a finish_reason" \
        in line, line


# --- a server that restarts mid-soak ---------------------------------------------------------------------

@pytest.mark.parametrize("down", [1.0, 0.0], ids=["refused-for-a-second", "switched-between-requests"])
async def test_a_restart_mid_soak_ends_the_run_and_keeps_the_log(refserver, tmp_path, down):
    spare = await start_refserver(port=0, fault="none")
    # Generation requests: the cache-report probe, the resume calibration's 9 (3 prompts, each cold and
    # resumed twice), cold_hit's 3 to 5 (it re-runs some), conversation's 3. The switch must come after
    # cold_hit's closing scrape: cold_hit's opening one, before the calibration, is the old server's only
    # reading, and a new server's counters pass it within one request (a fast-tier run under load,
    # 2026-12-06: cold_hit ran 5, after=14 switched inside it, no counter went back, the run passed).
    # after=15: inside conversation whether cold_hit ran 3 or 5.
    proxy = await FaultProxy(refserver.url, "restart", after=15, spare=spare.url, down=down).start()
    try:
        result, events = await soak(tmp_path, proxy.url, '["cold_hit", "conversation", "control"]')
    finally:
        await proxy.close()
        await spare.close()
    assert result.code == 3, result.out + result.err
    line = one_error_line(result)
    assert "the server restarted during the soak" in line, line
    assert proxy.restarted
    ends = [e for e in events if e["type"] == "request_end"]
    assert len(ends) >= 4 and len(ends) == len({e["request"] for e in ends})
    finding = [e for e in events if e["type"] == "finding" and e["kind"] == "server_error"]
    assert len(finding) == 1 and "restarted" in finding[0]["detail"]
    assert events[0]["type"] == "header" and events[-1]["type"] == "run_end" and events[-1]["exit_code"] == 3
    assert report_json(tmp_path / "run.jsonl")["verdict"] == "error"
    assert "fail" not in {e.get("severity") for e in events if e["type"] == "finding" and e is not finding[0]}


def metrics(**values) -> str:
    lines = []
    for name, value in values.items():
        name = name.replace("__", ":")
        kind = "counter" if name.endswith("_total") else "gauge"
        family = name[:-6] if kind == "counter" else name
        lines += [f"# TYPE {family} {kind}", f"{name} {value}"]
    return "\n".join(lines) + "\n"


def test_restart_watch_on_counters():
    watch = RestartWatch()
    for text in (metrics(vllm__prompt_tokens_total=10, vllm__num_requests_running=3),
                 metrics(vllm__prompt_tokens_total=50, vllm__num_requests_running=0),   # a gauge may fall
                 metrics(vllm__prompt_tokens_total=50)):
        assert watch.observe(parse_metrics(text)) is None
    assert not watch.seen.is_set() and watch.message is None
    why = watch.observe(parse_metrics(metrics(vllm__prompt_tokens_total=4)))
    assert why == "its counter vllm:prompt_tokens_total went back from 50 to 4" and watch.seen.is_set()
    assert watch.message.startswith("the server restarted during the soak (its counter")


def test_restart_watch_on_the_process_start_time():
    watch = RestartWatch()
    assert watch.observe(parse_metrics(metrics(process_start_time_seconds=1000, vllm__prompt_tokens_total=1))) is None
    assert watch.observe(parse_metrics(metrics(process_start_time_seconds=1000, vllm__prompt_tokens_total=9))) is None
    assert "process_start_time_seconds changed" in watch.observe(
        parse_metrics(metrics(process_start_time_seconds=2000, vllm__prompt_tokens_total=90)))


def test_restart_watch_ignores_unknown_names_and_bad_scrapes():
    watch = RestartWatch()
    assert watch.observe(parse_metrics(metrics(my_gauge_total=9))) is None
    assert watch.observe(parse_metrics(metrics(my_gauge_total=1))) is None        # not a known counter
    assert watch.observe(parse_metrics("not metrics {")) is None and watch.observe(None) is None
