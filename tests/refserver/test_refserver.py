"""The reference fault server over HTTP: vLLM shapes, a real prefix cache, each fault."""

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tui.refserver import FAULTS, start_refserver

CODE_A, CODE_B = "7395-2841-6620", "1836-5072-9914"
RECALL_Q = "\n\nQuestion: What is the reconciliation code in this memo?\nAnswer: The reconciliation code is"
SUMMARY_Q = "\n\nQuestion: Summarize section three in about 100 words.\nAnswer:"
FILLER = ("The {name} office reviewed vendor invoice {i} for the quarter and found the balance "
          "matched the ledger. The team noted a minor adjustment to the payroll schedule. ")


def memo(code: str = CODE_A, name: str = "north", repeats: int = 1) -> str:
    """Sections 1..6, the code once in section 3 (about 450 tokens; 4x longer at repeats=4)."""
    parts = [f"Memo {name}: quarterly reconciliation notes."]
    for s in range(1, 7):
        body = "".join(FILLER.format(name=name, i=f"{s}{j}") for j in range(repeats))
        if s == 3:
            body += f"The reconciliation code is {code}. Keep it verbatim. "
        parts.append(f"Section {s}. {body}")
    return "\n\n".join(parts)


@pytest.fixture
async def server(request):
    options = dict(port=0, prefill_us_per_token=0, decode_ms_per_token=0)
    options.update(getattr(request, "param", {}))
    handle = await start_refserver(**options)
    try:
        yield handle
    finally:
        await handle.close()


@pytest.fixture
async def client(server):
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as c:
        yield c


async def complete(client, prompt, **kw):
    body = {"model": "refmodel", "prompt": prompt, "max_tokens": 40, "temperature": 0, **kw}
    r = await client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    return out["choices"][0]["text"], out["usage"], out["choices"][0]


async def chat(client, messages, **kw):
    body = {"model": "refmodel", "messages": messages, "max_tokens": 40, **kw}
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    return out["choices"][0]["message"]["content"], out["usage"], out["choices"][0]


def sse_events(raw: str) -> list:
    assert raw.endswith("data: [DONE]\n\n")
    frames = raw.split("\n\n")
    assert all(f.startswith("data: ") for f in frames if f)
    return [json.loads(f[6:]) for f in frames if f and f != "data: [DONE]"]


async def metric_values(client) -> dict:
    text = (await client.get("/metrics")).text
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values.setdefault(sample.name, 0.0)
            values[sample.name] += sample.value
            if family.name == "vllm:cache_config_info":
                values["cache_config_labels"] = sample.labels
    return values


# --- endpoints and shapes ----------------------------------------------------------

async def test_health_version_models(client):
    assert (await client.get("/health")).status_code == 200
    assert (await client.get("/version")).json()["version"].startswith("refserver-")
    models = (await client.get("/v1/models")).json()
    assert models["object"] == "list" and models["data"][0]["id"] == "refmodel"


async def test_streaming_completion_chunks_and_usage(client):
    r = await client.post("/v1/completions", json={
        "model": "refmodel", "prompt": memo() + RECALL_Q, "max_tokens": 30, "stream": True,
        "stream_options": {"include_usage": True}})
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    *chunks, last = events
    for c in chunks:
        assert set(c) == {"id", "object", "created", "model", "choices", "usage"}
        assert c["object"] == "text_completion" and c["usage"] is None
        assert set(c["choices"][0]) == {"index", "text", "logprobs", "finish_reason", "stop_reason"}
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["stop"]
    assert "".join(c["choices"][0]["text"] for c in chunks) == f" {CODE_A}."
    assert last["choices"] == [] and last["object"] == "text_completion"
    usage = last["usage"]
    assert usage["completion_tokens"] == len(chunks)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
    assert len({c["id"] for c in events}) == 1


async def test_streaming_chat_chunks_and_usage(client):
    messages = [{"role": "system", "content": memo()},
                {"role": "user", "content": "What is the reconciliation code in this memo?"}]
    r = await client.post("/v1/chat/completions", json={
        "model": "refmodel", "messages": messages, "stream": True,
        "stream_options": {"include_usage": True}})
    *chunks, last = sse_events(r.text)
    assert chunks[0]["object"] == "chat.completion.chunk"
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == f" {CODE_A}."
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == len(chunks) - 1


async def test_streaming_without_include_usage_has_no_usage_chunk(client):
    r = await client.post("/v1/completions", json={"prompt": "Hello there", "max_tokens": 5, "stream": True})
    events = sse_events(r.text)
    assert len(events) == 5 and all(e["choices"] for e in events)
    assert events[-1]["choices"][0]["finish_reason"] == "length"


async def test_non_streaming_usage_max_tokens_and_stop(client):
    text, usage, choice = await complete(client, "Once upon a time", max_tokens=12)
    assert choice["finish_reason"] == "length" and usage["completion_tokens"] == 12
    word = text.split()[3]
    stopped, usage2, choice2 = await complete(client, "Once upon a time", max_tokens=12, stop=[word])
    assert choice2["finish_reason"] == "stop" and choice2["stop_reason"] == word
    assert text.startswith(stopped) and word not in stopped
    assert usage2["prompt_tokens_details"]["cached_tokens"] == 0  # 9 tokens: under one block


async def test_repeat_is_a_block_quantized_hit_and_salt_makes_it_cold(client):
    prompt = memo() + RECALL_Q
    text1, usage1, _ = await complete(client, prompt)
    text2, usage2, _ = await complete(client, prompt)
    n = usage1["prompt_tokens"]
    assert usage1["prompt_tokens_details"]["cached_tokens"] == 0
    cached = usage2["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached < n and cached % 16 == 0 and cached >= (n - 1) // 16 * 16
    assert text1 == text2 == f" {CODE_A}."
    _, salted, _ = await complete(client, prompt, cache_salt="fresh-1")
    assert salted["prompt_tokens_details"]["cached_tokens"] == 0
    _, salted2, _ = await complete(client, prompt, cache_salt="fresh-1")
    assert salted2["prompt_tokens_details"]["cached_tokens"] == cached
    _, longer, _ = await complete(client, prompt + " and it reads")
    assert longer["prompt_tokens_details"]["cached_tokens"] >= cached


async def test_metrics_parse_with_prometheus_client_and_hits_grow(client):
    before = await metric_values(client)
    assert before["vllm:prefix_cache_hits_total"] == 0
    for name in ("vllm:prefix_cache_queries_total", "vllm:num_preemptions_total",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                 "vllm:request_success_total", "vllm:num_requests_running",
                 "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert name in before, name
    labels = before["cache_config_labels"]
    assert labels["block_size"] == "16" and labels["enable_prefix_caching"] == "True"
    assert labels["mamba_cache_mode"] == "align" and labels["mamba_block_size"] == "16"
    text = (await client.get("/metrics")).text
    assert 'vllm:prefix_cache_hits_total{engine="0",model_name="refmodel"} 0.0' in text
    assert "# TYPE vllm:prefix_cache_queries_total counter" in text
    prompt = memo() + RECALL_Q
    _, u1, _ = await complete(client, prompt)
    _, u2, _ = await complete(client, prompt)
    after = await metric_values(client)
    assert after["vllm:prefix_cache_hits_total"] == u2["prompt_tokens_details"]["cached_tokens"] > 0
    assert after["vllm:prefix_cache_queries_total"] == u1["prompt_tokens"] + u2["prompt_tokens"]
    assert after["vllm:request_success_total"] == 2
    assert after["vllm:generation_tokens_total"] == u1["completion_tokens"] + u2["completion_tokens"]
    assert 0 < after["vllm:kv_cache_usage_perc"] <= 1


@pytest.mark.parametrize("server", [{"decode_ms_per_token": 20}], indirect=True)
async def test_running_gauge_counts_requests_in_flight(client):
    task = asyncio.create_task(complete(client, "Tell me a story", max_tokens=15))
    await asyncio.sleep(0.1)
    assert (await metric_values(client))["vllm:num_requests_running"] == 1
    await task
    assert (await metric_values(client))["vllm:num_requests_running"] == 0


@pytest.mark.parametrize("server", [{"prefill_us_per_token": 200}], indirect=True)
async def test_time_to_first_token_follows_uncached_tokens(client):
    body = {"prompt": memo(repeats=2) + RECALL_Q, "max_tokens": 5, "stream": True}
    ttft = []
    for _ in range(2):
        t0 = time.perf_counter()
        async with client.stream("POST", "/v1/completions", json=body) as r:
            async for _chunk in r.aiter_bytes():
                ttft.append(time.perf_counter() - t0)
                break
    assert ttft[0] > 0.08 and ttft[1] < ttft[0] / 3


async def test_tokenize_vllm_llamacpp_and_chat_schemas(client):
    vllm = (await client.post("/tokenize", json={"model": "refmodel", "prompt": "code 7395-2841-6620"})).json()
    assert vllm["count"] == len(vllm["tokens"]) == 8 and vllm["tokens"][0] == 1
    assert vllm["max_model_len"] == 32768
    assert (await client.post("/tokenize", json={"prompt": "code 7395-2841-6620"})).json() == vllm
    llama = (await client.post("/tokenize", json={"content": "code 7395-2841-6620"})).json()
    assert llama["tokens"] == vllm["tokens"]
    msgs = [{"role": "user", "content": "hi"}]
    chat_tokens = (await client.post("/tokenize", json={"model": "refmodel", "messages": msgs})).json()
    text, usage, _ = await chat(client, msgs)
    assert chat_tokens["count"] == usage["prompt_tokens"]


@pytest.mark.parametrize("path, payload", [
    ("/v1/completions", b"{not json"),
    ("/v1/completions", b'{"model": "refmodel"}'),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 0}'),
    ("/v1/completions", b'{"prompt": "x", "cache_salt": 5}'),
    ("/v1/chat/completions", b'{"messages": []}'),
    ("/v1/chat/completions", b"[1, 2]"),
    ("/tokenize", b"{oops"),
])
async def test_bad_requests_get_openai_errors(client, path, payload):
    r = await client.post(path, content=payload, headers={"content-type": "application/json"})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == 400 and error["type"] == "BadRequestError" and error["message"]


async def test_unknown_model_is_404(client):
    r = await client.post("/v1/completions", json={"model": "gpt-9", "prompt": "x"})
    assert r.status_code == 404 and r.json()["error"]["code"] == 404


async def test_logprobs_fingerprint_reproduces_on_a_correct_hit(client):
    prompt = memo() + "\n\nContinue the memo:"
    _, _, cold = await complete(client, prompt, logprobs=3, max_tokens=8)
    _, usage, hit = await complete(client, prompt, logprobs=3, max_tokens=8)
    assert usage["prompt_tokens_details"]["cached_tokens"] > 0
    assert cold["logprobs"] == hit["logprobs"]
    assert len(cold["logprobs"]["top_logprobs"][0]) == 3
    _, _, other = await complete(client, memo(name="south") + "\n\nContinue the memo:", logprobs=3, max_tokens=8)
    assert other["logprobs"]["token_logprobs"] != cold["logprobs"]["token_logprobs"]
    _, _, chat_choice = await chat(client, [{"role": "user", "content": "hi"}], logprobs=True, top_logprobs=2)
    first = chat_choice["logprobs"]["content"][0]
    assert set(first) == {"token", "logprob", "bytes", "top_logprobs"} and len(first["top_logprobs"]) == 2


# --- faults ------------------------------------------------------------------------

def fault(name: str, **extra):
    return pytest.mark.parametrize("server", [{"fault": name, **extra}], indirect=True)


@fault("none")
async def test_fault_none_recalls_cold_and_on_hits(client):
    prompt = memo() + RECALL_Q
    for i in range(4):
        text, usage, _ = await complete(client, prompt)
        assert text == f" {CODE_A}."
        assert (usage["prompt_tokens_details"]["cached_tokens"] > 0) == (i > 0)
    summary, _, _ = await complete(client, memo() + SUMMARY_Q, max_tokens=120)
    assert summary.startswith(" The memo says") and CODE_A not in summary


@fault("zero_state")
async def test_fault_zero_state_forgets_the_code_on_a_hit(client):
    prompt = memo() + RECALL_Q
    cold, _, _ = await complete(client, prompt)
    hit, usage, choice = await complete(client, prompt)
    assert cold == f" {CODE_A}."
    assert usage["prompt_tokens_details"]["cached_tokens"] > 0
    assert hit and not re.search(r"\d{4}-\d{4}-\d{4}", hit) and choice["finish_reason"] == "stop"
    salted, _, _ = await complete(client, prompt, cache_salt="control")
    assert salted == f" {CODE_A}."  # the control arm stays right


@fault("foreign_state", seed=0)
async def test_fault_foreign_state_returns_another_memos_code(client):
    prompts = {CODE_A: memo(CODE_A, "north") + RECALL_Q, CODE_B: memo(CODE_B, "south") + RECALL_Q}
    foreign = 0
    for rnd in range(10):
        for own, prompt in prompts.items():
            text, usage, _ = await complete(client, prompt)
            other = CODE_B if own == CODE_A else CODE_A
            if usage["prompt_tokens_details"]["cached_tokens"] == 0:
                assert text == f" {own}."
            foreign += other in text
    assert foreign >= 3


@fault("repeat_token")
async def test_fault_repeat_token_after_hits(client):
    prompt = memo() + RECALL_Q
    outs = [await complete(client, prompt, max_tokens=20) for _ in range(5)]
    assert [t for t, _, _ in outs[:3]] == [f" {CODE_A}."] * 3
    for text, usage, choice in outs[3:]:
        words = text.split()
        assert len(words) == 20 and len(set(words)) == 1
        assert usage["completion_tokens"] == 20 and choice["finish_reason"] == "length"


@fault("repeat_token", num_speculative_tokens=4)
async def test_repeat_token_collapses_acceptance_length(client):
    prompt = memo() + "\n\nContinue:"
    for _ in range(3):
        await complete(client, prompt, max_tokens=40)
    m = await metric_values(client)
    healthy = 1 + m["vllm:spec_decode_num_accepted_tokens_total"] / m["vllm:spec_decode_num_drafts_total"]
    for _ in range(3):
        await complete(client, prompt, max_tokens=40)
    m2 = await metric_values(client)
    drafts = m2["vllm:spec_decode_num_drafts_total"] - m["vllm:spec_decode_num_drafts_total"]
    accepted = m2["vllm:spec_decode_num_accepted_tokens_total"] - m["vllm:spec_decode_num_accepted_tokens_total"]
    assert healthy > 3 and 1 + accepted / drafts == 1.0


@fault("empty_turn")
async def test_fault_empty_turn_on_a_multi_turn_hit(client):
    turn1 = [{"role": "system", "content": memo()},
             {"role": "user", "content": "Summarize section three."}]
    first, _, _ = await chat(client, turn1)
    assert first
    again, usage, _ = await chat(client, turn1)  # a single-turn hit is fine
    assert usage["prompt_tokens_details"]["cached_tokens"] > 0 and again == first
    turn2 = turn1 + [{"role": "assistant", "content": first},
                     {"role": "user", "content": "What is the reconciliation code in this memo?"}]
    text, usage, choice = await chat(client, turn2)
    assert usage["prompt_tokens_details"]["cached_tokens"] > 0
    assert text == "" and usage["completion_tokens"] == 0 and choice["finish_reason"] == "stop"
    r = await client.post("/v1/chat/completions", json={"messages": turn2, "stream": True})
    chunks = sse_events(r.text)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == ""
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    cold, _, _ = await chat(client, turn2, cache_salt="control")
    assert cold == f" {CODE_A}."


@fault("wording_drift", seed=3)
async def test_fault_wording_drift_long_prompts_only(client):
    short = memo() + SUMMARY_Q
    shorts = {(await complete(client, short, max_tokens=120))[0] for _ in range(3)}
    assert len(shorts) == 1
    long_memo = memo(repeats=4)
    longs = [(await complete(client, long_memo + SUMMARY_Q, max_tokens=120)) for _ in range(2)]
    assert longs[0][1]["prompt_tokens"] > 1000
    assert longs[0][0] != longs[1][0]
    for _ in range(4):
        text, _, _ = await complete(client, long_memo + RECALL_Q)
        assert CODE_A in text
    wrong_task = 0
    for i in range(45):
        text, _, _ = await complete(client, long_memo + SUMMARY_Q, max_tokens=120)
        wrong_task += text.strip() == CODE_A
    assert 1 <= wrong_task <= 10


# --- the package boundary and the CLI ----------------------------------------------

def test_refserver_never_imports_the_core():
    root = Path(__file__).resolve().parents[2] / "tui" / "refserver"
    for path in root.rglob("*.py"):
        source = path.read_text()
        assert not re.search(r"^\s*(from|import)\s+(tui\.core|\.\.)", source, re.M), path


def test_fault_list_matches_the_cli():
    assert FAULTS == ("none", "zero_state", "foreign_state", "repeat_token", "empty_turn", "wording_drift",
                      "mixed_state", "slow_hits", "unaligned_report", "counter_drift", "partial_concurrent",
                      "salt_ignored", "adapter_ignored", "evict_stale", "early_change", "slot_noop", "slot_trust")


def test_python_dash_m_serves_and_stops_on_sigterm():
    proc = subprocess.Popen([sys.executable, "-m", "tui.refserver", "--port", "0", "--fault", "zero_state",
                             "--seed", "7"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[2], env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        line = proc.stdout.readline()
        m = re.fullmatch(r"refserver listening on (http://127\.0\.0\.1:(\d+)) \(fault=zero_state, seed=7\)\n", line)
        assert m, line + proc.stderr.read() if proc.poll() is not None else line
        assert httpx.get(m.group(1) + "/health", timeout=5).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_completion_prompt_as_token_ids_from_tokenize(client):
    prompt = memo() + RECALL_Q
    ids = (await client.post("/tokenize", json={"prompt": prompt})).json()["tokens"]
    text, usage, _ = await complete(client, ids)
    assert text == f" {CODE_A}." and usage["prompt_tokens"] == len(ids)


def test_cli_flags_and_defaults():
    import argparse

    from tui.refserver.cli import configure, main

    parser = argparse.ArgumentParser()
    configure(parser)
    ns = parser.parse_args([])
    assert (ns.port, ns.fault, ns.seed, ns.block_size, ns.num_blocks) == (8100, "none", 0, 16, 4096)
    assert (ns.prefill_us_per_token, ns.decode_ms_per_token, ns.model_name) == (20.0, 1.0, "refmodel")
    with pytest.raises(SystemExit):
        parser.parse_args(["--fault", "melted"])
    assert main(parser.parse_args(["--block-size", "0"])) == 2


async def test_start_refserver_rejects_unknown_options():
    with pytest.raises(TypeError):
        await start_refserver(colour="blue")
    with pytest.raises(ValueError):
        await start_refserver(fault="melted")


def test_ids_map_back_to_the_text_just_tokenized_when_two_texts_share_an_id():
    """ "2645" and "6620" hash to the same id: a process that met "2645" first must still detokenize a
    prompt it just tokenized with "6620" in it (a long test process met this; a code came back wrong)."""
    from tui.refserver.tokenizer import detokenize, token_for, tokenize

    assert token_for("2645").id == token_for("6620").id
    tokenize("2645")
    ids = [t.id for t in tokenize(f"the code is {CODE_A}.")]
    assert detokenize(ids) == f"the code is {CODE_A}."
