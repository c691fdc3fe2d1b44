"""Long validations of the partition and eviction phases on the real engines, moved out of CI (its time
budget): the fault proxies on real answers (the reference server's salt_ignored, adapter_ignored and
evict_stale faults prove the same detectors in the fast tier) and llama.cpp's clean partition. CI keeps
one real case per engine: vLLM's clean partition, its batched-base LoRA bug, and
llama.cpp's base-without-a-lora-field bug (tests/real/test_real_partition.py). Run: see README.md here."""

import json

import pytest

from support.cli import scenario
from support.corrupting_proxy import CorruptingProxy
from support.servers import BackgroundServer
from test_real_partition import EVICTION, _assert_proven, _leaks, _partition, _run

pytestmark = pytest.mark.realserver


@pytest.fixture(scope="module")
def vllm():
    """Adapters a and b and the small cache the eviction cases need (CI's partition tests share a vLLM
    without it since eviction moved here)."""
    server = BackgroundServer("vllm", lora=True, small_cache=True).start()
    yield server
    server.stop()


async def _lora_swap_is_caught(url: str, tmp_path, **partition) -> None:
    """A proxy answering adapter b with adapter a's last answer to the same prompt: a partition leak of b."""
    proxy = await CorruptingProxy(url, "lora_swap").start()
    try:
        result, report = await _run(proxy.url, _partition(tmp_path, concurrent=False, **partition),
                                    tmp_path / "run.jsonl")
    finally:
        await proxy.close()
    assert proxy.corrupted >= 1
    assert result.code == 1, result.out + result.err
    leaks = _leaks(report)
    assert leaks and all(f["evidence"]["identity"] == "b" and f["evidence"]["owner"] == "a" for f in leaks), leaks


async def test_vllm_partition_catches_a_proxy_giving_b_the_answer_of_a(vllm, tmp_path):
    await _lora_swap_is_caught(vllm.url, tmp_path, salts=False)


async def test_vllm_eviction_catches_a_proxy_corrupting_readmitted_hits(vllm, tmp_path):
    text = EVICTION.replace("cycles = 2", "cycles = 1")
    proxy = await CorruptingProxy(vllm.url, "readmitted", limit=3).start()   # each caught hit costs cold controls
    try:
        result, report = await _run(proxy.url, str(scenario(tmp_path, text, "eviction.toml")), tmp_path / "run.jsonl")
    finally:
        await proxy.close()
    assert proxy.corrupted == 3          # (the judge's hit-path re-sends of a caught hit are re-admitted hits too)
    assert result.code == 1, result.out + result.err
    fails = [f for f in report["findings"] if f["severity"] == "fail"]
    assert {f["kind"] for f in fails} & {"foreign_code", "recall_miss"}, fails
    assert all(f["phase"] == "eviction" for f in fails)
    events = {(e["type"], e.get("request")): e for e in map(json.loads, (tmp_path / "run.jsonl").read_text().splitlines())}
    assert all(events[("request_end", f["request"])]["cached_tokens"] > 0 for f in fails)   # re-admitted hits only


@pytest.fixture(scope="module")
def llamacpp():
    server = BackgroundServer("llamacpp", lora=True).start()
    yield server
    server.stop()


async def test_llamacpp_partition_passes_clean_with_the_base_named(llamacpp, tmp_path):
    result, report = await _run(llamacpp.url, _partition(tmp_path, concurrent=True), tmp_path / "run.jsonl")
    assert result.code == 0, result.out + result.err
    assert [n["field"] for n in report["phases"]["partition"]["not_tried"]] == ["cache_salt"]  # llama.cpp has none
    _assert_proven(report, "lora", 3)
    assert not _leaks(report)


async def test_llamacpp_partition_catches_a_proxy_giving_b_the_answer_of_a(llamacpp, tmp_path):
    await _lora_swap_is_caught(llamacpp.url, tmp_path)
