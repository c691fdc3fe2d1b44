"""A real speculative drafter on the embedded engines: llama.cpp with Gemma 3 270M drafting for
itself (-md), whose every response carries timings.draft_n / draft_n_accepted and whose /metrics
spec-decode counters move by exactly those amounts; the same server without the drafter reports
no drafts. vLLM's n-gram (prompt lookup) speculation on the CPU build reports its counters too.
"""


import pytest

from support.cli import ROOT, report_json, run_hitproof
from support.servers import BackgroundServer
from tui.embedded.measure_lora_drafter import SHORT_PROMPT, complete, spec_counters

pytestmark = pytest.mark.realserver
PROMPTS = [SHORT_PROMPT, "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,",
           "The cat sat on the mat. The cat sat on the mat. The cat sat on the mat."]
DRAFTS = "llamacpp:spec_decode_num_drafts_total"
ACCEPTED = "llamacpp:spec_decode_num_accepted_tokens_total"
DRAFTED = "llamacpp:spec_decode_num_draft_tokens_total"


@pytest.fixture(scope="module")
def drafter():
    server = BackgroundServer("llamacpp", drafter=True).start()
    yield server
    server.stop()


def test_llamacpp_drafter_reports_drafted_and_accepted_tokens(drafter):
    before = spec_counters(drafter.url)
    drafted = accepted = 0
    for prompt in PROMPTS:
        answer = complete(drafter.url, "llamacpp", prompt, max_tokens=48, cache=False)
        n, k = answer.timings.get("draft_n"), answer.timings.get("draft_n_accepted")
        assert isinstance(n, int) and isinstance(k, int), answer.timings
        assert n > 0 and 0 <= k <= n, (prompt, n, k)
        # the model drafting for itself: nearly every drafted token is accepted (measured 0.9-1.0)
        assert k >= 0.5 * n, (prompt, n, k)
        drafted += n
        accepted += k
    after = spec_counters(drafter.url)
    assert after.get(DRAFTED, 0) - before.get(DRAFTED, 0) == drafted, (before, after)
    assert after.get(ACCEPTED, 0) - before.get(ACCEPTED, 0) == accepted, (before, after)
    assert after.get(DRAFTS, 0) > before.get(DRAFTS, 0)


def test_llamacpp_without_drafter_reports_no_drafts():
    server = BackgroundServer("llamacpp").start()
    try:
        answer = complete(server.url, "llamacpp", SHORT_PROMPT, max_tokens=24, cache=False)
        assert answer.timings.get("draft_n", 0) == 0 and answer.timings.get("draft_n_accepted", 0) == 0
        counters = spec_counters(server.url)
        assert counters.get(DRAFTED, 0) == 0 and counters.get(ACCEPTED, 0) == 0, counters
    finally:
        server.stop()


def test_vllm_ngram_speculation_runs_on_the_cpu_and_counts_drafts():
    """vLLM's prompt-lookup speculation (`--speculative-config {"method": "ngram", ...}`) runs on
    the CPU build. It reports no per-request counts: only the vllm:spec_decode_* counters move.
    Measured on four prompts: 75 drafts, 225 draft tokens, 126 accepted (per position 54/38/34)."""
    server = BackgroundServer("vllm", drafter=True).start()
    try:
        before = spec_counters(server.url)
        answer = complete(server.url, "vllm", PROMPTS[2], max_tokens=48, cache=False)
        after = spec_counters(server.url)
        assert "The cat sat on the mat" in answer.text and len(answer.tokens) == 48
        moved = {k.split("{")[0]: after[k] - before.get(k, 0.0) for k in after}
        drafts = moved["vllm:spec_decode_num_drafts_total"]
        drafted = moved["vllm:spec_decode_num_draft_tokens_total"]
        accepted = moved["vllm:spec_decode_num_accepted_tokens_total"]
        assert drafts > 0 and drafted == 3 * drafts      # num_speculative_tokens = 3
        assert 0 < accepted <= drafted, moved
    finally:
        server.stop()


async def _agent_through_proxy(drafter, mode, tmp_path):
    from support.drafter_proxy import DraftStrippingProxy

    proxy = await DraftStrippingProxy(drafter.url, mode).start()
    log = tmp_path / f"agent-{mode}.jsonl"
    try:
        result = await run_hitproof("run", "--attach", proxy.url, "--scenario",
                                    str(ROOT / "scenarios" / "agent-quick.toml"), "--headless",
                                    "--record", str(log), timeout=1800)
    finally:
        await proxy.close()
    return result, report_json(log), log, proxy


async def test_llamacpp_drafter_acceptance_per_turn_is_in_the_report(drafter, tmp_path):
    """Clean: the agent replay on the real drafter passes, every turn (hit and control arm) carries
    the acceptance length from the server's counters, and the text and html reports show it;
    acceptance_collapse stays quiet (through the proxy in its no-fault mode, the same path)."""
    result, report, log, proxy = await _agent_through_proxy(drafter, "none", tmp_path)
    assert result.code == 0, result.out + result.err
    assert proxy.hits >= 4 and proxy.accepted_seen > 0
    assert not [f for f in report["findings"] if f["kind"] == "acceptance_collapse"]
    turns = report["phases"]["agent_replay"]["turns"]
    assert len(turns) == 6 and all(t["acceptance"] > 2.0 and t["control"]["acceptance"] > 2.0 for t in turns), turns
    text = await run_hitproof("report", str(log), "--format", "text")
    assert "agent replay, turn by turn" in text.out and f"{turns[-1]['acceptance']:.2f}" in text.out
    html = await run_hitproof("report", str(log), "--format", "html")
    assert html.out.count("data-acceptance=") == 12 and "status-fail" not in html.out.split('id="agent-turns"')[1] \
        .split("</table>")[0]
    print("acceptance per turn (hit, control):",
          [(t["acceptance"], t["control"]["acceptance"]) for t in turns])


async def test_llamacpp_drafter_stripped_on_hits_is_acceptance_collapse(drafter, tmp_path):
    """The proxy rejects every draft of a hit (counters and timings.draft_n_accepted, the text as it
    is, as a server whose drafter lost its state on reuse): acceptance_collapse, fail-class, the
    control arm's acceptance above the threshold; nothing else fails."""
    result, report, log, proxy = await _agent_through_proxy(drafter, "strip_on_hit", tmp_path)
    assert result.code == 1, result.out + result.err
    assert proxy.stripped_requests >= 4
    collapse = [f for f in report["findings"] if f["kind"] == "acceptance_collapse"]
    assert len(collapse) == 1 and collapse[0]["severity"] == "fail", collapse
    assert collapse[0]["evidence"]["acceptance"] == 1.0 and collapse[0]["evidence"]["control_acceptance"] > 2.0
    assert {f["kind"] for f in report["findings"] if f["severity"] == "fail"} == {"acceptance_collapse"}
    markdown = await run_hitproof("report", str(log), "--format", "markdown")
    assert "### Agent replay, turn by turn" in markdown.out and "| 1.00 |" in markdown.out
    print("acceptance per turn (hit, control):",
          [(t["acceptance"], t["control"]["acceptance"]) for t in report["phases"]["agent_replay"]["turns"]])
