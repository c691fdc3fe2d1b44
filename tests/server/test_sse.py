"""The SSE decoder (tui/core/server/sse.py): the WHATWG standard's own examples and rules, then property
tests that it decodes exactly as httpx-sse (a standard decoder) on random re-chunkings of real
recorded streams (tests/fixtures/streams/) and of generated ones, and the client on top of it."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from httpx_sse import EventSource
from hypothesis import HealthCheck, given, settings, strategies as st

from tui.core.server.client import OpenAIClient, RequestSpec, StreamError
from tui.core.server.sse import Event, SSEDecoder

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "streams"
RECORDED = sorted(FIXTURES.glob("*.sse"))
PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def decode(*parts: bytes, strict: bool = False) -> list[Event]:
    decoder = SSEDecoder()
    out = []
    for part in parts:
        out += decoder.feed(part)
    return out + (decoder.strict_close() if strict else decoder.close())


def triples(events) -> list[tuple]:
    return [(e.event or "message", e.data, e.id, e.retry) for e in events]


def reference(parts: list[bytes]) -> list[tuple]:
    """httpx-sse's reading of the same bytes, delivered in the same pieces."""
    response = httpx.Response(200, headers={"content-type": "text/event-stream"}, content=iter(parts))
    return triples(EventSource(response).iter_sse())


def cut(data: bytes, points: list[int]) -> list[bytes]:
    points = sorted({p % (len(data) + 1) for p in points} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:]) if b > a]


# --- the standard's examples (HTML, "Server-sent events", 9.2.6) ---------------------------------

def test_multi_line_data_is_joined_with_newlines():
    events = decode(b"data: YHOO\ndata: +2\ndata: 10\n\n")
    assert triples(events) == [("message", "YHOO\n+2\n10", "", None)]


def test_comments_ids_and_one_leading_space():
    stream = b": test stream\n\ndata: first event\nid: 1\n\ndata:second event\nid\n\ndata:  third event\n\n"
    assert triples(decode(stream)) == [("message", "first event", "1", None),
                                       ("message", "second event", "", None),    # `id` alone resets it
                                       ("message", " third event", "", None)]   # only one space goes


def test_empty_data_lines_and_an_unfinished_last_event():
    stream = b"data\n\ndata\ndata\n\ndata:"
    assert [e.data for e in decode(stream, strict=True)] == ["", "\n"]          # the standard drops the last
    assert [e.data for e in decode(stream)] == ["", "\n", ""]                   # hitproof's close() keeps it


def test_the_space_after_the_colon_is_optional():
    assert [e.data for e in decode(b"data:test\n\ndata: test\n\n")] == ["test", "test"]


# --- the rules, one by one ---------------------------------------------------------------------

@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"])
def test_every_line_ending(end):
    stream = end.join([b"event: add", b"data: a", b"data: b", b"", b"data: c", b"", b""])
    assert triples(decode(stream)) == [("add", "a\nb", "", None), ("message", "c", "", None)]


def test_a_crlf_cut_between_two_reads_is_one_line_end():
    # "a" CR | LF "data: b": one line end, so one event "a\nb" (not "a" dispatched by a blank line)
    assert [e.data for e in decode(b"data: a\r", b"\ndata: b\r\n\r\n")] == ["a\nb"]
    assert [e.data for e in decode(b"data: a\r", b"\r\n")] == ["a"]


def test_a_bom_at_the_start_is_dropped_even_when_cut():
    assert [e.data for e in decode(b"\xef\xbb\xbfdata: x\n\n")] == ["x"]
    assert [e.data for e in decode(b"\xef", b"\xbb", b"\xbfdata: x\n\n")] == ["x"]
    # only at the very start: a BOM later is part of the field name, so the line is ignored
    assert [e.data for e in decode(b"data: x\n\n\xef\xbb\xbfdata: y\n\n")] == ["x"]


def test_an_event_without_data_is_not_dispatched_and_its_type_is_dropped():
    assert triples(decode(b"event: ping\n\ndata: x\n\n")) == [("message", "x", "", None)]
    assert decode(b"id: 7\n\n\n\n") == []


def test_the_last_event_id_carries_over_and_a_nul_id_is_ignored():
    events = decode(b"id: 7\ndata: a\n\ndata: b\n\nid: 8\x009\ndata: c\n\n")
    assert [(e.data, e.id) for e in events] == [("a", "7"), ("b", "7"), ("c", "7")]


@pytest.mark.parametrize("value,taken", [(b"3000", 3000), (b"+5", None), (b"1_0", None), (b"-1", None),
                                         (b" 5", None), (b"", None), (b"\xd9\xa3", None)])
def test_retry_takes_ascii_digits_only(value, taken):
    decoder = SSEDecoder()
    events = decoder.feed(b"retry: " + value + b"\ndata: x\n\n")
    assert events[0].retry == taken and decoder.reconnection_time == taken


def test_unknown_fields_and_lines_without_colon():
    assert triples(decode(b"foo: bar\nbaz\ndata: x\n\n")) == [("message", "x", "", None)]


def test_invalid_utf8_becomes_replacement_characters():
    assert decode(b"data: \xff\xfe ok\n\n")[0].data == "\ufffd\ufffd ok"


# --- against httpx-sse, on real streams re-chunked at random --------------------------------------

def test_there_are_recorded_streams():
    names = {p.name for p in RECORDED}
    assert {"refserver-completions.sse", "refserver-chat.sse"} <= names, names
    for path in RECORDED:
        data = path.read_bytes()
        assert data.endswith(b"data: [DONE]\n\n") and data.count(b"data:") > 5, path.name


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.name)
@PROPERTY
@given(points=st.lists(st.integers(min_value=0, max_value=1 << 16), max_size=40))
def test_recorded_streams_decode_as_httpx_sse_does(path, points):
    data = path.read_bytes()
    parts = cut(data, points)
    assert triples(decode(*parts)) == reference(parts) == reference([data])


def _line_text():
    return st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"), max_size=20)


@st.composite
def event_streams(draw):
    """Streams of events with 1-3 data lines each, and at random comments, event types, ids (NUL
    included) and retry fields, the lines of each event ended by LF, CRLF or CR (one kind per event:
    a CR line end followed by an LF one would be one CRLF). Every event has data (httpx-sse
    dispatches data-less events the standard drops) and is closed by one blank line."""
    lines = []
    for _ in range(draw(st.integers(1, 6))):
        ending = st.just(draw(st.sampled_from(["\n", "\r\n", "\r"])))
        fields = []
        if draw(st.booleans()):
            fields.append(":" + draw(_line_text()))
        if draw(st.booleans()):
            fields.append("event:" + draw(st.sampled_from(["", " "])) + draw(st.from_regex(r"[a-z]{1,8}", fullmatch=True)))
        if draw(st.booleans()):
            fields.append("id: " + draw(_line_text()))
        if draw(st.booleans()):
            fields.append("retry: " + str(draw(st.integers(0, 10 ** 6))))
        for _ in range(draw(st.integers(1, 3))):
            fields.append(draw(st.sampled_from(["data:", "data: ", "data:  "])) + draw(_line_text()))
        order = draw(st.permutations(fields))
        lines += [line + draw(ending) for line in order] + [draw(ending)]
    return "".join(lines).encode("utf-8")


@PROPERTY
@given(stream=event_streams(), points=st.lists(st.integers(min_value=0, max_value=4096), max_size=30))
def test_generated_streams_decode_as_httpx_sse_does(stream, points):
    parts = cut(stream, points)
    # a CR first in a read after a CR last in the one before is two line ends, not a CRLF
    assert triples(decode(*parts)) == reference(parts) == triples(decode(stream))


@PROPERTY
@given(stream=event_streams(), points=st.lists(st.integers(min_value=0, max_value=4096), max_size=10))
def test_a_bom_changes_nothing(stream, points):
    assert triples(decode(*cut(b"\xef\xbb\xbf" + stream, points))) == reference([stream])


# --- the client on top of it ---------------------------------------------------------------------------

class Chunks(httpx.AsyncByteStream):
    def __init__(self, parts):
        self.parts = parts

    async def __aiter__(self):
        for part in self.parts:
            yield part


async def stream_parts(parts, api="completions"):
    client = OpenAIClient("http://test")
    client.use_http(httpx.AsyncClient(base_url="http://test", transport=httpx.MockTransport(
        lambda request: httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Chunks(parts)))))
    try:
        return await client.stream(RequestSpec(api=api, prompt="p", messages=[], max_tokens=8))
    finally:
        await client.aclose()


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.name)
async def test_the_client_reads_recorded_streams_however_they_are_cut(path):
    data = path.read_bytes()
    api = "chat" if "chat" in path.name else "completions"
    whole = await stream_parts([data], api)
    assert whole.text and whole.finish_reason and whole.cached_tokens is not None and not whole.notes
    assert whole.logprobs                                  # the fixtures asked for log-probabilities
    for size in (1, 2, 3, 7, 64):
        cut_up = await stream_parts([data[i:i + size] for i in range(0, len(data), size)], api)
        assert (cut_up.text, cut_up.finish_reason, cut_up.cached_tokens, cut_up.logprobs) == \
            (whole.text, whole.finish_reason, whole.cached_tokens, whole.logprobs)
    crlf = await stream_parts([data.replace(b"\n", b"\r\n")], api)
    assert crlf.text == whole.text


def chunk(text, finish=None):
    return json.dumps({"choices": [{"index": 0, "text": text, "finish_reason": finish}]}).encode()


async def test_a_last_data_line_without_its_blank_line_is_still_read():
    for tail in (b"data: " + chunk("b", "stop"), b"data: " + chunk("b", "stop") + b"\n"):
        result = await stream_parts([b"data: " + chunk("a") + b"\n\n", tail])
        assert result.text == "ab" and result.finish_reason == "stop"


async def test_no_done_after_a_finish_reason_is_tolerated_with_a_note():
    result = await stream_parts([b"data: " + chunk("a") + b"\n\ndata: " + chunk("b", "length") + b"\n\n"])
    assert result.text == "ab" and result.notes == ["the stream ended without data: [DONE] (after its finish_reason)"]


async def test_no_done_and_no_finish_reason_is_a_cut_stream():
    with pytest.raises(StreamError, match=r"ended without \[DONE\] and without a finish_reason, after 2 chunks"):
        await stream_parts([b"data: " + chunk("a") + b"\n\ndata: " + chunk("b") + b"\n\n"])


async def test_multi_line_data_and_comments_reach_the_json_parser_whole():
    body = json.dumps({"choices": [{"index": 0, "text": "x", "finish_reason": "stop"}]}, indent=1).encode()
    stream = b": keep-alive\n\n" + b"\n".join(b"data: " + line for line in body.split(b"\n")) + b"\n\ndata: [DONE]\n\n"
    assert b"\n" in body
    result = await stream_parts([stream])
    assert result.text == "x" and result.finish_reason == "stop"


async def test_an_error_event_is_a_stream_error_and_other_types_are_skipped():
    ok = b"event: ping\ndata: {}\n\ndata: " + chunk("a", "stop") + b"\n\ndata: [DONE]\n\n"
    assert (await stream_parts([ok])).text == "a"
    with pytest.raises(StreamError, match="server error in stream: overloaded"):
        await stream_parts([b'event: error\ndata: {"error": {"message": "overloaded"}}\n\n'])


def test_plain_data_takes_the_usual_block_and_declines_the_rest():
    decoder = SSEDecoder()
    assert decoder.plain_data(b"data: {}\n\n") is None            # the first read: a BOM may come (feed)
    decoder.feed(b"data: {}\n\n")
    assert decoder.plain_data(b'data: {"a":1}\n\ndata: [DONE]\n\n') == [b'{"a":1}', b"[DONE]"]
    for odd in (b"data: a\r\n\r\n", b": ping\n\ndata: a\n\n", b"data: a\ndata: b\n\n", b"event: e\ndata: a\n\n",
                b"data: a\n\n\n", b"data: a\n", b"data:a\n\n", b"id: 3\ndata: a\n\n", b""):
        assert decoder.plain_data(odd) is None, odd
    decoder.feed(b"data: half")                                    # a line held from an earlier read
    assert decoder.plain_data(b"data: a\n\n") is None
