"""The streaming client's parsing: SSE split anywhere, every dialect's cached tokens, broken streams."""

import json

import httpx
import pytest

from tui.core.server.client import OpenAIClient, RequestSpec, StreamError, leading_count
from tui.core.config.errors import ServerProblem


class Chunks(httpx.AsyncByteStream):
    def __init__(self, parts):
        self.parts = parts

    async def __aiter__(self):
        for part in self.parts:
            yield part


def client_with(parts, status=200, dialect="vllm", seen=None):
    def handler(request):
        if seen is not None:
            seen.append(json.loads(request.content))
        return httpx.Response(status, stream=Chunks(parts))

    c = OpenAIClient("http://test", dialect=dialect)
    c.use_http(httpx.AsyncClient(base_url="http://test", transport=httpx.MockTransport(handler)))
    return c


def sse(*objs):
    return b"".join(b"data: " + json.dumps(o).encode() + b"\n\n" for o in objs) + b"data: [DONE]\n\n"


def text_chunk(text, finish=None):
    return {"choices": [{"index": 0, "text": text, "finish_reason": finish}]}


async def test_completion_split_mid_line_and_vllm_usage():
    body = sse(text_chunk(" 7395"), text_chunk("-2841", "length"),
               {"choices": [], "usage": {"prompt_tokens": 1628, "completion_tokens": 2,
                                         "prompt_tokens_details": {"cached_tokens": 1536}}})
    parts = [body[i:i + 7] for i in range(0, len(body), 7)]          # split everywhere
    seen_text = []
    result = await client_with(parts).stream(RequestSpec(api="completions", prompt="p", max_tokens=4),
                                             seen_text.append)
    # the listener gets the first text at once; the rest came within 0.1 s: only the Completion has it
    assert result.text == " 7395-2841" and seen_text == [" 7395"]
    assert (result.prompt_tokens, result.cached_tokens, result.finish_reason) == (1628, 1536, "length")
    assert result.ttft_s is not None and result.first_byte_s <= result.ttft_s <= result.total_s


async def test_llamacpp_timings_cache_n():
    body = sse(text_chunk("ok", "stop") | {"timings": {"cache_n": 2996, "prompt_n": 4}})
    result = await client_with([body], dialect="llamacpp").stream(
        RequestSpec(api="completions", prompt="p", max_tokens=4))
    assert result.cached_tokens == 2996 and result.prompt_tokens == 3000


async def test_chat_deltas_and_unknown_cache():
    body = sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
               {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]})
    result = await client_with([body]).stream(RequestSpec(api="chat", messages=[], max_tokens=4))
    assert result.text == "hi" and result.cached_tokens is None     # unknown, not zero


async def test_malformed_chunk_is_a_stream_error():
    with pytest.raises(StreamError, match="malformed stream chunk"):
        await client_with([b"data: {not json\n\n"]).stream(RequestSpec(api="completions", prompt="p",
                                                                        max_tokens=1))


async def test_error_event_in_stream():
    with pytest.raises(StreamError, match="server error in stream"):
        await client_with([sse({"error": {"message": "boom"}})]).stream(
            RequestSpec(api="completions", prompt="p", max_tokens=1))


async def test_http_500_is_a_server_problem_with_message():
    with pytest.raises(ServerProblem, match="HTTP 500 from /v1/completions: engine dead"):
        await client_with([b'{"error": {"message": "engine dead"}}'], status=500).stream(
            RequestSpec(api="completions", prompt="p", max_tokens=1))


async def test_salt_per_dialect():
    seen = []
    spec = RequestSpec(api="completions", prompt="p", max_tokens=1, salt="s1", seed=3)
    await client_with([sse(text_chunk("a", "stop"))], seen=seen).stream(spec)
    await client_with([sse(text_chunk("a", "stop"))], dialect="llamacpp", seen=seen).stream(spec)
    assert seen[0]["cache_salt"] == "s1" and "cache_prompt" not in seen[0]
    assert seen[1]["cache_prompt"] is False and "cache_salt" not in seen[1]
    assert seen[0]["stream_options"] == {"include_usage": True} and seen[0]["seed"] == 3


async def test_api_key_from_environment_only(monkeypatch):
    monkeypatch.setenv("HITPROOF_API_KEY", "sekrit")
    c = OpenAIClient("http://x")
    assert c._http.headers["authorization"] == "Bearer sekrit"
    await c.aclose()


async def test_unreachable_server():
    c = OpenAIClient("http://127.0.0.1:9")
    with pytest.raises(ServerProblem, match="cannot reach"):
        await c.get("/v1/models")
    await c.aclose()


async def test_a_closed_keepalive_connection_is_retried_once():
    calls = []

    def handler(request):
        calls.append(1)
        if len(calls) == 1:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        return httpx.Response(200, stream=Chunks([sse(text_chunk("ok", "stop"))]))

    c = OpenAIClient("http://test")
    c.use_http(httpx.AsyncClient(base_url="http://test", transport=httpx.MockTransport(handler)))
    result = await c.stream(RequestSpec(api="completions", prompt="p", max_tokens=1))
    assert result.text == "ok" and len(calls) == 2


async def test_a_plain_request_whose_connection_was_reset_is_retried_once():
    calls = []

    def handler(request):
        calls.append(1)
        if len(calls) == 1:
            raise httpx.ReadError("Connection reset by peer")
        return httpx.Response(200, json={"count": 7})

    c = OpenAIClient("http://test")
    c.use_http(httpx.AsyncClient(base_url="http://test", transport=httpx.MockTransport(handler)))
    assert await c.tokenize("p", "m") == 7 and len(calls) == 2
    calls.clear()

    def always(request):
        calls.append(1)
        raise httpx.ReadError("Connection reset by peer")

    c.use_http(httpx.AsyncClient(base_url="http://test", transport=httpx.MockTransport(always)))
    with pytest.raises(ServerProblem, match="cannot reach"):
        await c.tokenize("p", "m")
    assert len(calls) == 2
    await c.aclose()


@pytest.mark.parametrize("body, count", [
    (b'{"count":2471,"max_model_len":32768,"tokens":[1,33771,48003],"token_strs":null}', 2471),   # vLLM's
    (b'{ "count" : 12 }\n', 12),
    (b'{"tokens":[1,2,3]}', None),                     # llama.cpp's: parsed whole
    (b'{"max_model_len":5,"count":3}', None),          # count not first: parsed whole
    (b'{"count":3,"tokens":[1,', None),                # cut short: parsed whole (and refused there)
    (b'{"count":-3}', None),
    (b'{"count":3.5}', None),
])
def test_the_leading_count_of_a_tokenize_answer(body, count):
    assert leading_count(body) == count


async def test_a_stream_cut_after_bytes_is_not_retried():
    class Cut(httpx.AsyncByteStream):
        async def __aiter__(self):
            yield b'data: {"choices": [{"text": "a"}]}\n\n'
            raise httpx.RemoteProtocolError("peer closed connection")

    calls = []

    def handler(request):
        calls.append(1)
        return httpx.Response(200, stream=Cut())

    c = OpenAIClient("http://test")
    c.use_http(httpx.AsyncClient(base_url="http://test", transport=httpx.MockTransport(handler)))
    with pytest.raises(StreamError, match="broke"):
        await c.stream(RequestSpec(api="completions", prompt="p", max_tokens=1))
    assert len(calls) == 1


def test_a_spec_sent_under_its_own_id_is_dataclasses_replace():
    """RequestSpec.with_request_id (once a request, on the requester's path) equals dataclasses.replace for
    every field, and leaves the spec it copies as it was (one spec is sent by several slots at once)."""
    import dataclasses

    from tui.core.server.wire import RequestSpec
    spec = RequestSpec(api="chat", max_tokens=7, messages=[{"role": "user", "content": "x"}], temperature=0.5,
                       seed=3, salt="s", stop=["."], model="m", logprobs=5, tools=[{"type": "function"}],
                       slot_id=2, extra={"lora": []}, request_id="old")
    copy = spec.with_request_id("new")
    assert copy == dataclasses.replace(spec, request_id="new") and type(copy) is RequestSpec
    assert spec.request_id == "old" and copy is not spec
    assert [f.name for f in dataclasses.fields(RequestSpec)] == list(vars(copy))      # every field, in order
