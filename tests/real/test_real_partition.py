"""Issue 17 on the real embedded engines (Gemma 3 270M with the two tiny LoRA adapters made here):
the partition phase's paired assertion (cross-identity no reuse, same-identity hit, each answer
against its own identity's cold fingerprint) and the eviction phase on a small-cache vLLM.

Each run is small (partition-quick / eviction-quick, cut down further): CI time is limited. The
real cross-identity faults these engines have (tui/embedded/NOTES-lora-drafter.md) are findings
here, each a test: vLLM's CPU LoRA computes a base request batched with adapter requests with an
adapter's weights; llama.cpp reuses an adapter's slot cache for a request that names no adapter.
"""


import os
import subprocess
import sys

import pytest

from support.cli import ROOT, report_json, run_hitproof, scenario
from support.servers import BackgroundServer

PARTITION = (ROOT / "scenarios" / "partition-quick.toml").read_text()
EVICTION = (ROOT / "scenarios" / "eviction-quick.toml").read_text()


def _partition(tmp_path, *, concurrent: bool, orders: int = 1, selection: str = "explicit", salts: bool = True):
    text = (PARTITION.replace("concurrent = true", f"concurrent = {str(concurrent).lower()}")
            .replace("orders = 2", f"orders = {orders}")
            .replace('base_selection = "explicit"', f'base_selection = "{selection}"')
            .replace("salts = true", f"salts = {str(salts).lower()}"))
    assert text != PARTITION or concurrent
    return str(scenario(tmp_path, text, "partition.toml"))


async def _run(url: str, scenario_path: str, log, timeout: float = 900):
    result = await run_hitproof("run", "--attach", url, "--scenario", scenario_path, "--headless",
                                "--record", str(log), timeout=timeout)
    report = report_json(log)
    print(result.out[-4000:])
    return result, report


def _pairs(report: dict, field: str) -> dict:
    return {tuple(p["pair"]): p for p in report["phases"]["partition"]["pairs"] if p["field"] == field}


def _leaks(report: dict, severity: str = "fail") -> list[dict]:
    return [f for f in report["findings"] if f["kind"] == "partition_leak" and f["severity"] == severity]


def _assert_proven(report: dict, field: str, count: int) -> None:
    pairs = _pairs(report, field)
    assert len(pairs) == count, pairs
    for names, p in pairs.items():
        assert p["status"] == "proven", (names, p)
        assert p["cross_cold"] >= 1 and p["cross_reused"] == 0 and p["fingerprint_leaks"] == 0, (names, p)
        assert all(v["hits"] >= 1 for v in p["same_identity"].values()), (names, p)


# --- vLLM: the server with adapters a and b that tests/real/test_real_lora.py uses (conftest.py) ----------

@pytest.fixture(scope="module")
def vllm(vllm_lora_server):
    return vllm_lora_server


async def test_vllm_partition_sequential_passes_clean(vllm, tmp_path):
    result, report = await _run(vllm.url, _partition(tmp_path, concurrent=False), tmp_path / "run.jsonl")
    assert result.code == 0, result.out + result.err
    _assert_proven(report, "cache_salt", 1)
    _assert_proven(report, "lora", 3)                 # base / a, base / b, a / b
    # Each pair is proven by its reuse counts; its fingerprints add power where the identities answer apart.
    # On one memo an adapter may hardly move Gemma's answer: a fresh-clone CI (2026-12-04) read base / a
    # "indistinct" (within 0.05 nats on that memo), base / b and a / b distinct, verdict PASS. So one pair
    # may be indistinct; at least two must be told apart by fingerprint.
    fingerprints = [p["fingerprints"] for p in _pairs(report, "lora").values()]
    assert set(fingerprints) <= {"distinct", "indistinct"} and fingerprints.count("distinct") >= 2, fingerprints
    assert not _leaks(report)


async def test_vllm_partition_catches_the_batched_base_request(vllm, tmp_path):
    """vLLM CPU LoRA (NOTES-lora-drafter.md): a base request batched with adapter requests is computed
    with an adapter's weights. No cache is involved (nothing reused): the fingerprint catches it.

    The fault needs the base request in the same batch as adapter requests, which the scheduler
    decides. Sent together, the base's first token is often computed alone (it reaches the engine
    first) and only its later tokens with adapter weights: its answers then moved 0.34-0.53 nats,
    under partition-quick's 0.5 (2 runs of 2 passed, 2026-12-01). The calibrated tolerance (0.05 on
    this server, whose clean answers move 2e-5) caught every batched base request: 3 of 3 in each of
    2 runs. One order (one batch of identities on a memo they computed, one on a fresh memo) and up
    to three runs, the first that catches it judged (a batch is the scheduler's choice)."""
    for attempt in range(3):
        log = tmp_path / f"run-{attempt}.jsonl"
        result, report = await _run(vllm.url, _partition(tmp_path, concurrent=True, orders=1, salts=False), log)
        if result.code != 0:
            break
    assert result.code == 1, result.out + result.err
    leaks = _leaks(report)
    assert leaks, report["findings"]
    assert all(f["evidence"]["concurrent_with"] for f in leaks), leaks            # only when batched
    assert {f["evidence"]["identity"] for f in leaks} == {"base"}, leaks
    assert all(f["evidence"]["via"] in ("batch", "cache or batch") for f in leaks), leaks
    # The cache itself is right: no identity reused another's blocks. A batched leak can land on the
    # all-at-once cold memo or on a batched hit of the base's own prefix (CI, 2026-12-01: both leaks of
    # the caught run were "concurrent" hits, 512 tokens cached from the base's own first request, none
    # on the one concurrent_cold batch), so which batched step caught it is not asserted. The judge
    # already required the base's cold reference (sent alone) to differ and the batch re-run to repeat.
    assert all(p["cross_reused"] == 0 for p in _pairs(report, "lora").values())
    assert all(f["evidence"]["step"] in ("concurrent", "concurrent_cold") for f in leaks), leaks
    # The bug report (issue 27): a standalone script from the log, run alone against the same vLLM, sends
    # the base request with its batch mates at once and shows the base off its cold fingerprint again.
    # Up to two script runs of 5 batches each: whether a batch forms is the scheduler's choice.
    number = next(i for i, f in enumerate([f for f in report["findings"] if f["severity"] == "fail"], start=1)
                  if f["kind"] == "partition_leak")
    script = tmp_path / "repro.py"
    made = await run_hitproof("repro", str(log), "--finding", str(number), "--output", str(script))
    assert made.code == 0, made.out + made.err
    for _ in range(2):
        shown = subprocess.run([sys.executable, str(script), vllm.url, "--repeats", "5"], capture_output=True,
                               text=True, timeout=600, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
        if shown.returncode != 0:
            break
    assert shown.returncode == 1, shown.stdout + shown.stderr
    assert "FAULT SHOWS" in shown.stdout and "together with" in shown.stdout, shown.stdout


# --- llama.cpp ---------------------------------------------------------------------------------

async def test_llamacpp_partition_catches_the_base_without_a_lora_field(tmp_path):
    """llama.cpp (NOTES-lora-drafter.md): a request with no `lora` list keeps the slot's cache computed
    under another adapter. With one slot every identity shares it: the base model asked for that way
    after adapter b resumes from b's cache, and its fingerprint (re-run first: it deviates again) shows
    it. With 4 slots it shows too (real_bugs.py, 2026-12-02: 5 partition_leak fails); one slot is
    enough to show it every run."""
    server = BackgroundServer("llamacpp", lora=True, extra_args=("--parallel", "1")).start()
    try:
        result, report = await _run(server.url, _partition(tmp_path, concurrent=False, selection="default"),
                                    tmp_path / "run.jsonl")
    finally:
        server.stop()
    assert result.code == 1, result.out + result.err
    leaks = _leaks(report)
    assert leaks and {f["evidence"]["identity"] for f in leaks} == {"base"}, leaks
    assert all(f["evidence"]["via"] == "cache" and f["evidence"]["cached_tokens"] > 0 for f in leaks), leaks


