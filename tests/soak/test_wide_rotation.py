"""Wide rotation (issue 34): `--streams N` rotates N distinct memos across N concurrent slots on the
reference server; a clean server passes at that width, the foreign-state fault is still caught, and a
width the server cannot hold is one line before the first phase (exit 2). Small widths: seconds each."""

from __future__ import annotations

import json

import pytest

from support.cli import ROOT, kinds, report_json, run_hitproof, scenario
from tui.core.config.scenario import load_scenario
from tui.core.soak.width import width_problem
from tui.refserver import start_refserver

GPU_QUICK = ROOT / "scenarios" / "gpu-quick.toml"


def rotation_only(tmp_path, power: bool = True) -> str:
    text = GPU_QUICK.read_text().replace(
        'phases = ["cold_hit", "conversation", "shared_concurrency", "rotation", "long_prompt", "determinism", "control"]',
        'phases = ["rotation"]')
    assert 'phases = ["rotation"]' in text
    if not power:
        text = text.replace("fault_rate = 0.01 ", "fault_rate = 0.0 ")
    return str(scenario(tmp_path, text))


def rotation_starts(log) -> list[dict]:
    events = [json.loads(line) for line in open(log) if '"request_start"' in line[:40]]
    return [e for e in events if e["phase"] == "rotation" and e["arm"] == "main"]


async def test_clean_server_at_16_streams_passes_with_every_slot_on_another_slots_memo(tmp_path):
    handle = await start_refserver(port=0)
    try:
        log = tmp_path / "run.jsonl"
        result = await run_hitproof("run", "--attach", handle.url, "--scenario", rotation_only(tmp_path),
                                    "--streams", "16", "--headless", "--record", str(log))
    finally:
        await handle.close()
    assert result.code == 0, result.out + result.err
    report = report_json(log)
    assert not kinds(report, "fail") and not kinds(report, "warn"), report["findings"]
    starts = [e for e in rotation_starts(log) if e["round"] is not None]
    first = {e["slot"]: e["memo"] for e in starts if e["round"] == 0}
    assert sorted(first) == list(range(16)) and len(set(first.values())) == 16       # 16 distinct memos
    for e in starts:                                     # slot s, round r: memo (s + r) mod 16
        assert e["memo"] == first[(e["slot"] + e["round"]) % 16]
    rounds = {e["round"] for e in starts}
    assert all(sum(1 for e in starts if e["round"] == r) == 16 for r in rounds)       # every round 16 wide
    # rounds without a barrier (rotation.rotate), yet never one memo on two slots at once, any arm
    events = [json.loads(line) for line in open(log) if '"request_' in line[:40]]
    memo_of = {e["request"]: e["memo"] for e in events if e["type"] == "request_start" and e["phase"] == "rotation"}
    busy: dict[str, int] = {}
    for e in events:
        memo = memo_of.get(e["request"])
        if memo is not None:
            busy[memo] = busy.get(memo, 0) + (1 if e["type"] == "request_start" else -1)
            assert busy[memo] <= 1, f"memo {memo} on two requests at once (request {e['request']})"
    assert report["power"]["evidence"]["fingerprint"]["checked_hits"] >= 299


async def test_foreign_state_is_caught_at_16_streams(tmp_path):
    handle = await start_refserver(port=0, fault="foreign_state")
    try:
        log = tmp_path / "run.jsonl"
        result = await run_hitproof("run", "--attach", handle.url, "--scenario", rotation_only(tmp_path, power=False),
                                    "--streams", "16", "--headless", "--record", str(log))
    finally:
        await handle.close()
    assert result.code == 1, result.out + result.err
    assert "foreign_state" in kinds(report_json(log), "fail")


async def test_a_width_the_cache_cannot_hold_is_one_line_before_the_first_phase(tmp_path):
    handle = await start_refserver(port=0, num_blocks=512)      # 8,192 tokens: 6 memos of 1,200
    try:
        log = tmp_path / "run.jsonl"
        result = await run_hitproof("run", "--attach", handle.url, "--scenario", rotation_only(tmp_path),
                                    "--streams", "32", "--headless", "--record", str(log))
    finally:
        await handle.close()
    assert result.code == 2, result.out + result.err
    line = result.err.strip().splitlines()[-1]
    assert "32 slots" in line and "512" in line and "6 fit (--streams 6" in line, line
    assert "Traceback" not in result.err
    assert not any('"phase_start"' in l[:40] for l in open(log)), "no phase may start"


@pytest.mark.parametrize("bad", ["1", "257", "x"])
async def test_a_bad_width_is_exit_2(tmp_path, bad):
    result = await run_hitproof("run", "--attach", "http://127.0.0.1:9", "--scenario", "gpu-quick",
                                "--streams", bad, "--headless", "--no-record")
    assert result.code == 2 and "--streams" in result.err and "Traceback" not in result.err


def test_width_problem_reads_what_the_server_states():
    s = load_scenario(GPU_QUICK)                                 # rotation 64 slots of 1,200 tokens
    assert width_problem(s, {}) is None                          # nothing stated: nothing checked
    assert width_problem(s, {"num_gpu_blocks": "4800", "block_size": "16"}) is None     # 64 x 75 blocks
    line = width_problem(s, {"num_gpu_blocks": "4799", "block_size": "16"})
    assert line.startswith("rotation: 64 slots") and "63 fit" in line
    assert width_problem(s, {"num_gpu_blocks": "junk", "block_size": "16"}) is None


async def test_mix_at_16_streams_runs_16_workers_on_a_larger_pool(tmp_path):
    handle = await start_refserver(port=0)
    try:
        log = tmp_path / "run.jsonl"
        result = await run_hitproof("run", "--attach", handle.url, "--scenario", "mix-quick", "--streams", "16",
                                    "--headless", "--record", str(log))
    finally:
        await handle.close()
    assert result.code == 0, result.out + result.err
    report = report_json(log)
    assert not kinds(report, "fail"), report["findings"]
    events = [json.loads(line) for line in open(log)]
    start = next(e for e in events if e["type"] == "phase_start" and e["phase"] == "mix")
    assert start["slots"] == 16
    header = events[0]
    mix = header["scenario"]["settings"]["mix"]
    assert mix["workers"] == 16 and mix["memos"] >= 18
