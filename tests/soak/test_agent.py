"""Agent-conversation replay: the generator, user captures, and the phase against the refserver."""

import json

import pytest

from support.cli import ROOT, report_json, run_hitproof, scenario
from tui.core.evidence.agent import generate, load_capture
from tui.core.config.errors import BadInput
from tui.core.evidence.tokens import estimate_tokens
from tui.refserver import start_refserver

AGENT = str(ROOT / "scenarios" / "agent-quick.toml")
CODE = "7395-2841-6620"


def test_generator_grows_every_turn_and_plants_one_code():
    convo = generate(tools=8, turns=6, growth_tokens=160, integrity_every=2, code=CODE, seed="s", nonce="qwertyui", max_tokens=16,
                     recall_max_tokens=20)
    prompts = [t.prompt for t in convo.turns]
    assert [t.task for t in convo.turns] == ["turn", "turn", "recall", "turn", "recall", "recall"]
    for earlier, later in zip(prompts, prompts[1:]):
        assert later.startswith(earlier.rsplit("Assistant:", 1)[0])        # each request reuses the last prefix
        assert estimate_tokens(later) - estimate_tokens(earlier) >= 100     # and grows by more than a block
    assert prompts[0].count('"name": "lookup_order"') == 1 and prompts[0].count('"parameters"') == 8
    earlier_recalls = sum(1 for t in convo.turns[:-1] if t.task == "recall")
    assert prompts[-1].count(CODE) == 1 + earlier_recalls      # the first tool result + the canonical answers
    assert prompts[1].count(CODE) == 1
    assert all(p.endswith("Assistant: The reconciliation code is") for p, t in zip(prompts, convo.turns)
               if t.task == "recall")
    assert CODE in convo.opening
    assert prompts[0].startswith("System: Session qwertyui.")                 # the nonce in the first block


def test_capture_errors_name_file_and_line(tmp_path):
    bad = tmp_path / "cap.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n{"messages": "nope"}\n')
    with pytest.raises(BadInput, match=r"cap.jsonl:2: each line must be a chat request"):
        load_capture(bad, max_tokens=8)
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}]}\nnot json\n')
    with pytest.raises(BadInput, match=r"cap.jsonl:2: not a JSON object"):
        load_capture(bad, max_tokens=8)
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    with pytest.raises(BadInput, match="at least two requests"):
        load_capture(bad, max_tokens=8)


async def _run(fault, scen, tmp_path, **options):
    handle = await start_refserver(port=0, fault=fault, **options)
    log = tmp_path / f"{fault}.jsonl"
    try:
        result = await run_hitproof("run", "--attach", handle.url, "--scenario", str(scen), "--headless",
                                    "--record", str(log))
    finally:
        await handle.close()
    return result, report_json(log), [json.loads(line) for line in log.read_text().splitlines()]


async def test_clean_replay_passes_with_cached_tokens_rising(tmp_path):
    result, report, _ = await _run("none", AGENT, tmp_path)
    assert result.code == 0, result.out + result.err
    phase = report["phases"]["agent_replay"]
    cached = phase["cached_by_turn"]
    assert cached[0] == 0 and all(b > a for a, b in zip(cached, cached[1:]))
    assert all(t["control"]["cached_tokens"] == 0 for t in phase["turns"])     # the control arm is cold


async def test_repeat_token_names_the_first_bad_request(tmp_path):
    result, report, events = await _run("repeat_token", AGENT, tmp_path, num_speculative_tokens=3)
    assert result.code == 1
    rep = [f for f in report["findings"] if f["kind"] == "repetition" and f["severity"] == "fail"]
    assert len(rep) == 1 and rep[0]["phase"] == "agent_replay"
    starts = {e["request"]: e for e in events if e["type"] == "request_start"}
    ends = [e for e in events if e["type"] == "request_end" and starts[e["request"]]["arm"] == "main"]
    first_bad = next(e["request"] for e in ends if e["checks"].get("repetition"))
    assert rep[0]["request"] == first_bad == rep[0]["evidence"]["first_bad_request"]
    collapse = [f for f in report["findings"] if f["kind"] == "acceptance_collapse"]
    assert collapse and collapse[0]["severity"] == "fail"


async def test_empty_turn_on_reuse_fails(tmp_path):
    result, report, _ = await _run("empty_turn", AGENT, tmp_path)
    assert result.code == 1
    assert any(f["kind"] == "empty_answer" and f["phase"] == "agent_replay" and f["severity"] == "fail"
               for f in report["findings"])


async def test_a_user_capture_replays_in_order(tmp_path):
    tools = [{"type": "function", "function": {"name": "lookup_order", "parameters": {"type": "object"}}}]
    history = [{"role": "system", "content": "You are an agent. " + "Policy text. " * 150},
               {"role": "user", "content": "Find order 17."}]
    lines = []
    for turn in range(4):
        lines.append(json.dumps({"model": "any", "messages": list(history), "tools": tools, "max_tokens": 512}))
        history += [{"role": "assistant", "content": f"Calling lookup_order for step {turn}."},
                    {"role": "user", "content": f"Result {turn}: " + "the order shipped late. " * 40}]
    capture = tmp_path / "capture.jsonl"
    capture.write_text("\n".join(lines) + "\n")
    scen = scenario(tmp_path, '[scenario]\nphases = ["agent_replay"]\napi = "chat"\n'
                              '[phases.agent_replay]\nsource = "capture.jsonl"\nmax_tokens = 8\n')
    result, report, events = await _run("none", scen, tmp_path)
    assert result.code == 0, result.out + result.err
    phase = report["phases"]["agent_replay"]
    assert phase["source"].endswith("capture.jsonl") and len(phase["turns"]) == 4
    cached = phase["cached_by_turn"]
    assert cached[0] == 0 and all(b > a for a, b in zip(cached, cached[1:]))
