"""acceptance_collapse: a drafter that contributes nothing after prefix reuse (every draft
rejected on a hit, none in the salted control arm) fails the agent replay. The fault comes from
tests/support/drafter_proxy.py in front of the reference server with its pretend drafter
(vllm:spec_decode_* counters); the proxy leaves every answer as it is, as a real server with
this fault would. Clean, through the same proxy, the check stays quiet. The per-turn acceptance
length is in every report format. (tests/real/test_real_drafter.py does the same on llama.cpp.)"""

import json

from support.cli import ROOT, report_json, run_hitproof
from support.drafter_proxy import DraftStrippingProxy, accepted_series
from tui.core.log.events import decode
from tui.core.report.html import to_html
from tui.core.report.markdown import to_markdown
from tui.core.report.report import RunReport
from tui.refserver import start_refserver

AGENT = str(ROOT / "scenarios" / "agent-quick.toml")


async def _run(mode, tmp_path):
    handle = await start_refserver(port=0, fault="none", num_speculative_tokens=4)
    proxy = await DraftStrippingProxy(handle.url, mode).start()
    log = tmp_path / f"{mode}.jsonl"
    try:
        result = await run_hitproof("run", "--attach", proxy.url, "--scenario", AGENT, "--headless",
                                    "--record", str(log))
    finally:
        await proxy.close()
        await handle.close()
    return result, report_json(log), log, proxy


def _report(log) -> RunReport:
    report = RunReport()
    for line in log.read_text().splitlines():
        report.feed(decode(line))
    return report


async def test_stripped_drafts_on_hits_are_caught_as_acceptance_collapse(tmp_path):
    result, report, log, proxy = await _run("strip_on_hit", tmp_path)
    assert result.code == 1, result.out + result.err
    assert proxy.stripped_requests >= 4 and proxy.stripped       # the replay's hits lost their accepted drafts
    collapse = [f for f in report["findings"] if f["kind"] == "acceptance_collapse"]
    assert len(collapse) == 1 and collapse[0]["severity"] == "fail", collapse
    turns = report["phases"]["agent_replay"]["turns"]
    first_hit = next(t for t in turns if t["cached_tokens"])
    assert collapse[0]["request"] == first_hit["request"]
    assert collapse[0]["evidence"]["acceptance"] == 1.0 and collapse[0]["evidence"]["control_acceptance"] > 2.0
    # the answers themselves were right: nothing else fails
    assert {f["kind"] for f in report["findings"] if f["severity"] == "fail"} == {"acceptance_collapse"}
    for turn in turns:
        assert turn["acceptance"] == (1.0 if turn["cached_tokens"] else turn["acceptance"])
        assert turn["control"]["acceptance"] > 2.0 and turn["control"]["cached_tokens"] == 0
    # every format shows the acceptance length per turn, the collapsed ones marked
    run = _report(log)
    markdown = to_markdown(run)
    assert "### Agent replay, turn by turn" in markdown and "| accept hit | accept ctl |" in markdown
    assert "| 1.00 |" in markdown
    html = to_html(run)
    assert html.count('data-acceptance="1.00"') == sum(1 for t in turns if t["cached_tokens"])
    assert 'class="n status-fail" data-acceptance="1.00"' in html
    text = await run_hitproof("report", str(log), "--format", "text")
    assert "agent replay, turn by turn" in text.out and "1.00" in text.out


async def test_a_clean_drafter_through_the_same_proxy_stays_quiet(tmp_path):
    result, report, log, proxy = await _run("none", tmp_path)
    assert result.code == 0, result.out + result.err
    assert proxy.hits >= 4 and proxy.stripped_requests == 0 and proxy.accepted_seen > 0
    assert not [f for f in report["findings"] if f["kind"] == "acceptance_collapse"]
    turns = report["phases"]["agent_replay"]["turns"]
    assert all(t["acceptance"] > 2.0 and t["control"]["acceptance"] > 2.0 for t in turns), turns
    markdown = to_markdown(_report(log))
    assert "accept hit" in markdown and "| 1.00 |" not in markdown


def test_the_proxy_rewrites_accepted_series_only():
    proxy = DraftStrippingProxy("http://127.0.0.1:1")
    proxy.stripped = {"llamacpp:spec_decode_num_accepted_tokens_total": 40.0,
                      'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"}': 10.0}
    page = ("# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter\n"
            "llamacpp:spec_decode_num_accepted_tokens_total 96\n"
            'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 24\n'
            "llamacpp:spec_decode_num_drafts_total 24\n")
    out = proxy._rewrite_metrics(page)
    assert accepted_series(out) == {"llamacpp:spec_decode_num_accepted_tokens_total": 56.0,
                                    'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"}': 14.0}
    assert "llamacpp:spec_decode_num_drafts_total 24" in out and out.startswith("# TYPE")
    assert json.dumps(accepted_series("vllm:spec_decode_num_accepted_tokens_created 1.7e9\n")) == "{}"
