"""The answer requests sent past httpx's Request/Response (tui.core.server.direct): the same bytes on the wire
as httpx would send, the same header dict as httpx's Response gives."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import given, strategies as st

from tui.core.server.client import OpenAIClient
from tui.core.server.direct import StreamHead, header_dict, plain_request_id
from tui.core.server.wire import RequestSpec

from test_transport import RawServer, chunked, sse_events

CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def httpx_bytes(url: str, headers: httpx.Headers, content: bytes, request_id: str | None) -> bytes:
    """What the streaming transport sent for an httpx.Request before direct.py (handle_async_request's head)."""
    if request_id is not None:
        headers = headers.copy()
        headers["X-Request-Id"] = request_id
    request = httpx.Request("POST", url, headers=headers, content=content)
    head = [b"%s %s HTTP/1.1\r\n" % (request.method.encode("ascii"), request.url.raw_path)]
    head += [b"%s: %s\r\n" % (name, value) for name, value in request.headers.raw]
    return b"".join(head) + b"\r\n" + content


@pytest.mark.parametrize("request_id", [None, "hitproof-abc-12"])
@pytest.mark.parametrize("key", [None, "sk-test"])
@pytest.mark.parametrize("base", ["http://127.0.0.1:8400", "http://localhost:9/prefix"])
def test_head_is_the_bytes_httpx_would_send(monkeypatch, request_id, key, base):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    if key:
        monkeypatch.setenv("HITPROOF_API_KEY", key)
    else:
        monkeypatch.delenv("HITPROOF_API_KEY", raising=False)
    client = OpenAIClient(base)
    content = b'{"model":"m","prompt":"caf\xc3\xa9","stream":true}'
    for path in ("/v1/completions", "/v1/chat/completions"):
        url = client._urls[path]
        assert StreamHead(url, client._json_headers).request(content, request_id) == \
            httpx_bytes(str(url), client._json_headers, content, request_id)


def test_only_printable_ascii_ids_go_on_the_head_directly():
    assert plain_request_id(None) and plain_request_id("hitproof-x-1")
    assert not plain_request_id("a\r\nInjected: 1") and not plain_request_id("caf\u00e9")


_names = st.sampled_from([b"Content-Type", b"content-type", b"X-A", b"x-a", b"Retry-After", b"Set-Cookie"])
_values = st.binary(max_size=12).filter(lambda v: b"\r" not in v and b"\n" not in v)


@given(st.lists(st.tuples(_names, _values), max_size=8))
def test_header_dict_is_httpx_dict(raw):
    assert header_dict(raw) == dict(httpx.Headers(raw))


def test_header_dict_decodes_as_httpx_does():
    raw = [(b"X-Name", "café".encode("utf-8")), (b"x-name", b"b")]
    assert header_dict(raw) == dict(httpx.Headers(raw)) == {"x-name": "café, b"}
    latin = [(b"X-Name", b"caf\xe9")]
    assert header_dict(latin) == dict(httpx.Headers(latin)) == {"x-name": "café"}


async def test_the_server_gets_the_request_id_and_the_answer_its_headers():
    replies = [[(0, CHUNKED_HEAD.replace(b"\r\n\r\n", b"\r\nX-Extra: 1\r\nx-extra: 2\r\n\r\n")
                 + chunked(sse_events(["a", "b"])))]]
    async with RawServer(replies) as server:
        client = OpenAIClient(server.url, timeout=2.0)
        try:
            result = await client.stream(RequestSpec(api="completions", prompt="p", max_tokens=2, model="m",
                                                     request_id="hitproof-n-7"))
        finally:
            await client.aclose()
    assert result.text == "ab"
    assert b"\r\nX-Request-Id: hitproof-n-7\r\n" in server.heads[0]
    assert result.headers["x-extra"] == "1, 2" and result.headers["content-type"] == "text/event-stream"


async def test_a_refusal_by_the_direct_path_is_retried_after_its_retry_after():
    refusal = b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 0\r\ncontent-length: 2\r\n\r\n{}"
    replies = [[(0, refusal)], [(0, CHUNKED_HEAD + chunked(sse_events(["ok"])))]]
    async with RawServer(replies) as server:
        client = OpenAIClient(server.url, timeout=2.0)
        try:
            result = await client.stream(RequestSpec(api="completions", prompt="p", max_tokens=2, model="m"))
        finally:
            await client.aclose()
    assert result.text == "ok" and client.retries == [(429, 0.0)]
