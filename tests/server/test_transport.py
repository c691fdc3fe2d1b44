"""The answer-stream transport (tui/core/server/transport.py) against a loopback server that writes raw
HTTP: chunk framing cut at awkward places, other body framings, keep-alive reuse, a server that
hangs up mid-body, and the arrival stamp taken by the kernel rather than by a busy event loop."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
import time

import pytest

from tui.core.server.client import OpenAIClient, RequestSpec, StreamError
from tui.core.config.errors import ServerProblem


def sse_events(texts: list[str], finish: str = "stop") -> list[bytes]:
    events = []
    for i, text in enumerate(texts):
        choice = {"index": 0, "text": text, "finish_reason": finish if i == len(texts) - 1 else None}
        events.append(b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return events


def chunked(pieces: list[bytes], extension: bool = False) -> bytes:
    out = b""
    for piece in pieces:
        out += b"%x%s\r\n%s\r\n" % (len(piece), b";name=x" if extension else b"", piece)
    return out + b"0\r\n\r\n"


class RawServer:
    """Answers each request on a connection with the next scripted reply: a list of (delay s, bytes)."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.connections = 0
        self.requests = 0
        self.heads: list[bytes] = []

    async def __aenter__(self):
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc):
        self.server.close()
        await self.server.wait_closed()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.connections += 1
        try:
            while self.replies:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                length = int(next((line.split(b":")[1] for line in head.split(b"\r\n")
                                   if line.lower().startswith(b"content-length")), b"0"))
                await reader.readexactly(length)
                self.requests += 1
                for delay, data in self.replies.pop(0):
                    if delay:
                        await asyncio.sleep(delay)
                    if data is None:
                        writer.close()
                        return
                    writer.write(data)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
SPEC = RequestSpec(api="completions", prompt="hello", max_tokens=8)


def split_everywhere(data: bytes, sizes=(1, 2, 3, 5, 7, 11)) -> list[tuple[float, bytes]]:
    """The bytes in small writes with tiny pauses, so reads end inside size lines, data and CRLFs."""
    out, i, k = [], 0, 0
    while i < len(data):
        size = sizes[k % len(sizes)]
        out.append((0.001, data[i:i + size]))
        i += size
        k += 1
    return out


async def stream_once(server_replies, spec=SPEC):
    async with RawServer(server_replies) as server:
        client = OpenAIClient(server.url)
        try:
            result = await client.stream(spec)
        finally:
            await client.aclose()
        return result, server


async def test_chunk_framing_cut_anywhere_gives_the_exact_text():
    body = chunked(sse_events([" 7395", "-2841", " and a long tail" * 20]), extension=True)
    result, _ = await stream_once([[(0, CHUNKED_HEAD)] + split_everywhere(body)])
    assert result.text == " 7395-2841" + " and a long tail" * 20
    assert result.finish_reason == "stop"


async def test_content_length_and_close_delimited_bodies():
    payload = b"".join(sse_events(["a", "b"]))
    fixed = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(payload) + payload
    result, _ = await stream_once([[(0, fixed)]])
    assert result.text == "ab"
    closing = b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n" + payload
    result, _ = await stream_once([[(0, closing), (0.01, None)]])
    assert result.text == "ab"


async def test_a_kept_alive_connection_serves_the_next_stream():
    body = CHUNKED_HEAD + chunked(sse_events(["x"]))
    async with RawServer([[(0, body)], [(0, body)]]) as server:
        client = OpenAIClient(server.url)
        try:
            first = await client.stream(SPEC)
            second = await client.stream(SPEC)
        finally:
            await client.aclose()
    assert (first.text, second.text) == ("x", "x")
    assert server.requests == 2 and server.connections == 1


async def test_an_answer_read_leaves_no_garbage_for_the_cyclic_collector():
    """llhttp's parser holds the response's callbacks and the response holds the parser: released when the
    body closes, every answer's objects go by reference counting, not in the cyclic collector's walks."""
    import gc
    from tui.core.server.transport import _Response
    body = CHUNKED_HEAD + chunked(sse_events(["x", "y"]))
    async with RawServer([[(0, body)]] * 3) as server:
        client = OpenAIClient(server.url)
        try:
            gc.collect()
            gc.disable()
            try:
                for _ in range(3):
                    assert (await client.stream(SPEC)).text == "xy"
                alive = sum(1 for o in gc.get_objects() if type(o) is _Response)
            finally:
                gc.enable()
        finally:
            await client.aclose()
    assert alive == 0


async def test_a_server_hanging_up_mid_body_is_a_stream_error():
    body = chunked(sse_events(["partial", "rest"]))
    with pytest.raises(StreamError, match="broke"):
        await stream_once([[(0, CHUNKED_HEAD + body[:40]), (0.01, None)]])


async def test_bad_chunk_framing_is_a_stream_error():
    with pytest.raises(StreamError, match="chunk"):
        await stream_once([[(0, CHUNKED_HEAD + b"zz\r\nnot a chunk\r\n"), (0.05, None)]])


async def test_an_http_error_status_keeps_the_server_message():
    error = b'{"error": {"message": "model not loaded"}}'
    reply = b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: %d\r\n\r\n" % len(error) + error
    with pytest.raises(ServerProblem, match="HTTP 500.*model not loaded"):
        await stream_once([[(0, reply)]])


async def test_first_token_is_stamped_on_arrival_even_when_the_loop_is_busy():
    """A server in its own thread answers 20 ms after the request; the client's loop is blocked for
    300 ms right after sending (as by hundreds of other streams being judged). On Linux the reported
    first byte is the kernel's arrival time, not the moment the loop got round to reading; elsewhere
    (no kernel stamps) it is the read, and the test shows that difference."""
    body = CHUNKED_HEAD + chunked(sse_events(["first", "second"]))
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = listener.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            time.sleep(0.02)
            conn.sendall(body)
            time.sleep(0.5)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = OpenAIClient(f"http://127.0.0.1:{listener.getsockname()[1]}")

    async def block_the_loop():
        await asyncio.sleep(0.005)              # the request is on the wire by now
        time.sleep(0.3)

    try:
        blocker = asyncio.create_task(block_the_loop())
        result = await client.stream(SPEC)
        await blocker
    finally:
        await client.aclose()
        listener.close()
    assert result.text == "firstsecond"
    if sys.platform == "linux":
        assert 0.015 <= result.first_byte_s < 0.2, result.first_byte_s
    else:
        assert result.first_byte_s >= 0.3, result.first_byte_s
    assert result.ttft_s == result.first_byte_s


@pytest.mark.parametrize("size", [b"0x5", b"+5", b"1_0", b"-5", b" 5", b"5\n", b"", b"g"])
async def test_chunk_sizes_the_grammar_forbids_are_a_one_line_stream_error(size):
    """RFC 9112 7.1: chunk-size = 1*HEXDIG. int(x, 16) takes "0x5", "+5", "1_0" and " 5"; llhttp does not."""
    payload = b'data: {"choices": [{"text": "hello"}]}\n\n'
    bad = CHUNKED_HEAD + b"%s\r\n%s\r\n0\r\n\r\n" % (size, payload)
    with pytest.raises(StreamError, match="bad HTTP framing: (Invalid character in chunk size|Missing expected CR)") as caught:
        await stream_once([[(0, bad), (0.05, None)]])
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 300


async def test_a_chunk_extension_and_trailers_are_accepted():
    body = chunked(sse_events(["a", "b"]), extension=True)[:-2] + b"x-trailer: 1\r\n\r\n"
    result, _ = await stream_once([[(0, CHUNKED_HEAD + body)]])
    assert result.text == "ab"


async def test_bytes_after_the_body_end_reuse_of_the_connection():
    body = CHUNKED_HEAD + chunked(sse_events(["x"]))
    async with RawServer([[(0, body + b"garbage")], [(0, body)]]) as server:
        client = OpenAIClient(server.url)
        try:
            first = await client.stream(SPEC)
            second = await client.stream(SPEC)
        finally:
            await client.aclose()
    assert (first.text, second.text) == ("x", "x")
    assert server.connections == 2                    # the first connection was not reused


async def test_a_connection_reset_mid_body_says_reset():
    """The server resets (RST, SO_LINGER 0) after part of the answer: a stream error naming the reset,
    not a clean end, even on a body that only the close would delimit."""
    payload = b"".join(sse_events(["partial", "rest"]))
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = listener.accept()
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n" + payload[:60])
        time.sleep(0.05)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = OpenAIClient(f"http://127.0.0.1:{listener.getsockname()[1]}")
    try:
        with pytest.raises(StreamError, match="reset the connection") as caught:
            await client.stream(SPEC)
    finally:
        await client.aclose()
        listener.close()
        thread.join(5)
    assert "\n" not in str(caught.value)


async def test_each_block_carries_the_arrival_of_its_own_read():
    """Two reads apart in time: the text of the second is stamped with the second read, not the first
    (what one read completed is handed over as one block, with that read's stamp)."""
    events = sse_events(["first", "second"])
    first, rest = chunked(events[:1])[:-5], chunked(events[1:])
    stamps = []
    async with RawServer([[(0, CHUNKED_HEAD + first), (0.15, rest)]]) as server:
        client = OpenAIClient(server.url)
        try:
            async with client._http.stream("POST", "/v1/completions", content=b"{}",
                                           extensions={"hitproof.sse": True}) as response:
                clock = response.extensions["hitproof.clock"]
                async for block in response.aiter_raw():
                    stamps.append((block, clock.arrived))
        finally:
            await client.aclose()
    assert [block for block, _ in stamps] == [events[0], b"".join(events[1:])]
    assert 0 < stamps[0][1] < stamps[1][1]                   # the second read's own arrival


async def test_the_retry_of_an_unanswered_request_goes_on_a_new_connection():
    """A server that has closed every idle connection (its keep-alive timeout passed for all of them at once):
    a request on one of them is unanswered, and its retry must not take the next stale one."""
    body = CHUNKED_HEAD + chunked(sse_events(["x"]))
    connections = []

    async def handle(reader, writer):
        connections.append(writer)
        first = True
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(next((line.split(b":")[1] for line in head.split(b"\r\n")
                                   if line.lower().startswith(b"content-length")), b"0"))
                await reader.readexactly(length)
                if not first:         # a kept-alive connection: this server had already closed it
                    break
                first = False
                await asyncio.sleep(0.05)      # long enough for the two first requests to overlap
                writer.write(body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    client = OpenAIClient(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
    try:
        both = await asyncio.gather(client.stream(SPEC), client.stream(SPEC))    # two connections, both kept
        third = await client.stream(SPEC)
    finally:
        await client.aclose()
        server.close()
        await server.wait_closed()
    assert [r.text for r in both] + [third.text] == ["x", "x", "x"]
    assert len(connections) == 3          # the two kept ones (the third request tried one), then a new one


async def test_plain_requests_and_streams_share_the_direct_pool_with_httpx_headers(monkeypatch):
    """To a plain-http origin /tokenize and the answer streams go to the transport directly, past httpx's
    client: the headers are the ones httpx sends (the API key among them), one kept-alive connection."""
    monkeypatch.setenv("HITPROOF_API_KEY", "sekrit")
    count = b'{"count": 7}'
    replies = [[(0, b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                 % (len(count), count))],
               [(0, CHUNKED_HEAD + chunked(sse_events(["ok"])))]]
    async with RawServer(replies) as server:
        client = OpenAIClient(server.url)
        try:
            assert client._direct is not None
            assert await client.tokenize("some text", "m") == 7
            assert (await client.stream(SPEC)).text == "ok"
        finally:
            await client.aclose()
    assert server.connections == 1 and len(server.heads) == 2
    for head in server.heads:
        lines = [line.lower() for line in head.split(b"\r\n")]
        assert b"authorization: bearer sekrit" in lines
        assert b"content-type: application/json" in lines
        assert any(line.startswith(b"user-agent: python-httpx/") for line in lines)
        assert any(line.startswith(b"host: 127.0.0.1:") for line in lines)
    assert server.heads[0].startswith(b"POST /tokenize HTTP/1.1") and server.heads[1].startswith(b"POST /v1/completions")


async def test_a_direct_plain_request_the_server_closed_unanswered_is_sent_once_more():
    """/tokenize goes past httpx (client.post_for_bytes): a kept-alive connection the server closed before
    answering is retried once, as httpx's path retries it; a body whose count is not its first member is
    parsed whole."""
    count = b'{"max_model_len": 8192, "count": 7, "tokens": [1, 2, 3, 4, 5, 6, 7]}'
    replies = [[(0, None)],
               [(0, b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                 % (len(count), count))]]
    async with RawServer(replies) as server:
        client = OpenAIClient(server.url)
        try:
            assert client._direct is not None
            assert await client.tokenize("some text", "m") == 7
        finally:
            await client.aclose()
    assert server.connections == 2 and server.requests == 2


async def test_a_direct_plain_request_closed_twice_is_one_line():
    async with RawServer([[(0, None)], [(0, None)]]) as server:
        client = OpenAIClient(server.url)
        try:
            with pytest.raises(ServerProblem, match=r"^cannot reach http://127\.0\.0\.1:\d+/tokenize: "):
                await client.tokenize("some text", "m")
        finally:
            await client.aclose()
    assert server.requests == 2


async def test_nothing_listening_is_said_in_words():
    client = OpenAIClient("http://127.0.0.1:9")
    try:
        with pytest.raises(ServerProblem, match=r"connection refused: nothing listens at 127\.0\.0\.1:9"):
            await client.get("/v1/models")
    finally:
        await client.aclose()


async def test_a_server_silent_longer_than_the_read_timeout_mid_body_is_a_timed_out_stream():
    """One watchdog timer per connection (not one per read): a wait that outlasts the timeout still ends."""
    events = sse_events(["a", "b"])
    body = chunked(events)
    cut = body.index(b"data", 20)
    replies = [[(0, CHUNKED_HEAD + body[:cut]), (3.0, body[cut:])]]
    async with RawServer(replies) as server:
        client = OpenAIClient(server.url, timeout=0.3)
        started = time.monotonic()
        try:
            with pytest.raises(StreamError, match="timed out"):
                await client.stream(SPEC)
        finally:
            await client.aclose()
    assert 0.25 < time.monotonic() - started < 2.0


async def test_reads_each_within_the_timeout_finish_however_long_the_whole_answer_takes():
    """The timeout counts from each wait's start: five reads 0.15 s apart (0.75 s in all) under a 0.3 s
    read timeout finish; the watchdog set for the first wait moves on to the later ones' deadlines."""
    texts = ["a", "b", "c", "d", "e"]
    pieces = [(0, CHUNKED_HEAD)] + [(0.15, chunked([event])[:-5]) for event in sse_events(texts)] + [(0, b"0\r\n\r\n")]
    async with RawServer([pieces, [(0, CHUNKED_HEAD + chunked(sse_events(["x"])))]]) as server:
        client = OpenAIClient(server.url, timeout=0.3)
        try:
            result = await client.stream(SPEC)
            again = await client.stream(SPEC)          # the same connection, the watchdog left from before
        finally:
            await client.aclose()
    assert result.text == "abcde" and again.text == "x"
    assert server.connections == 1


async def _blocks(replies, holds):
    """The body of one streamed answer as (block, arrival) pairs, the i-th block asked for with holds[i](first
    block's arrival) (None: one read's bytes)."""
    out = []
    async with RawServer(replies) as server:
        client = OpenAIClient(server.url, timeout=2.0)
        try:
            async with client._open_stream("/v1/completions", b"{}", False) as response:
                clock, body = response.extensions["hitproof.clock"], response.stream
                for hold in holds:
                    block = await body.next_block(None if hold is None or not out else hold(out[0][1]))
                    out.append((block, clock.arrived))
                    if block is None:
                        break
        finally:
            await client.aclose()
    return out


async def test_gathered_reads_come_as_one_block_stamped_with_the_last_read():
    """After the first block, reads gathered by the connection's read callback until the body ends: one block,
    byte for byte what the reads brought, with the arrival of the last read (issue 34: no task wake per read)."""
    events = sse_events(["a", "b", "c", "d"])
    first = chunked(events[:1])[:-5]
    later = [chunked([e])[:-5] for e in events[1:]]
    replies = [[(0, CHUNKED_HEAD + first)] + [(0.03, piece) for piece in later] + [(0.03, b"0\r\n\r\n")]]
    out = await _blocks(replies, [None, lambda _: 1 << 62, lambda _: 1 << 62])
    assert [block for block, _ in out] == [events[0], b"".join(events[1:]), None]
    assert out[1][1] - out[0][1] >= 0.1e9                    # the last read's arrival (4 reads 30 ms apart)


async def test_a_read_arriving_after_the_hold_releases_the_block_it_ends():
    """Reads 50 ms apart, held until 120 ms after the first: the block released holds the reads up to the first one
    at or after that time; the rest comes in the next block."""
    events = sse_events(["a", "b", "c", "d", "e"])
    pieces = [chunked([e])[:-5] for e in events]
    replies = [[(0, CHUNKED_HEAD + pieces[0])] + [(0.05, p) for p in pieces[1:]] + [(0.0, b"0\r\n\r\n")]]
    out = await _blocks(replies, [None, lambda t: t + 120_000_000, lambda _: 1 << 62, lambda _: 1 << 62])
    blocks = [block for block, _ in out]
    assert blocks[0] == events[0] and blocks[-1] is None
    assert blocks[1] == b"".join(events[1:4])                 # 50, 100 and 150 ms: the last one crossed 120 ms
    assert blocks[2] == b"".join(events[4:])


async def test_bad_framing_while_gathering_is_a_one_line_stream_error():
    events = sse_events(["a", "b"])
    replies = [[(0, CHUNKED_HEAD + chunked(events[:1])[:-5]), (0.03, b"zz\r\nnot a chunk\r\n"), (0.3, None)]]
    with pytest.raises(StreamError, match="bad HTTP framing") as caught:
        await stream_once(replies)
    assert "\n" not in str(caught.value)
