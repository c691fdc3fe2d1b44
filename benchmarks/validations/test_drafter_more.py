"""Long validations of the drafter, moved out of CI (its time budget): the agent replay's matrix row
with and without the drafter (two more servers), the acceptance per turn in the report, and vLLM's n-gram
speculation counters (one more vLLM). CI keeps the drafter's counters and the stripped-drafter collapse
(tests/real/test_real_drafter.py). Run: see README.md here."""

import json

import pytest

from support.cli import ROOT, report_json, run_hitproof
from support.servers import BackgroundServer
from test_real_drafter import PROMPTS, _agent_through_proxy, drafter  # noqa: F401  (drafter: a fixture)
from tui.embedded.measure_lora_drafter import complete, spec_counters

pytestmark = pytest.mark.realserver


async def test_matrix_row_with_and_without_the_drafter(tmp_path):
    """The agent replay on llamacpp-drafter.toml and llamacpp-no-drafter.toml: both pass; the
    drafter row's turns carry an acceptance length (measured 4.75-5.0 of 5 with 4 draft tokens),
    the other none, and each header names its speculative method."""
    profiles = ROOT / "scenarios" / "profiles"
    out = tmp_path / "matrix"
    result = await run_hitproof("matrix", "--profile", str(profiles / "llamacpp-drafter.toml"),
                                "--profile", str(profiles / "llamacpp-no-drafter.toml"),
                                "--scenario", str(ROOT / "scenarios" / "agent-quick.toml"),
                                "--out", str(out), "--headless", timeout=1800)
    assert result.code == 0, result.out + result.err
    rows = {row["profile"]: row for row in json.loads((out / "matrix.json").read_text())}
    assert rows["llamacpp-drafter"]["verdict"] == rows["llamacpp-no-drafter"]["verdict"] == "pass"
    with_drafter = report_json(out / "llamacpp-drafter.jsonl")["phases"]["agent_replay"]["turns"]
    without = report_json(out / "llamacpp-no-drafter.jsonl")["phases"]["agent_replay"]["turns"]
    assert with_drafter and all(turn["acceptance"] > 2.0 for turn in with_drafter), with_drafter
    assert all(turn.get("acceptance") is None for turn in without), without
    header = json.loads((out / "llamacpp-drafter.jsonl").read_text().splitlines()[0])
    assert header["target"]["incident"]["speculative"]["method"] == "draft-simple"


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
