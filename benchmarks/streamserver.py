"""A streaming OpenAI-completions server that answers on a known schedule, for the benchmarks.

Runs in its own process on 127.0.0.1 (asyncio streams, no framework). The schedule comes in
the request's `model` field, so every client (hitproof, the raw client, vLLM's bench client)
asks for it the same way:

    "bench:d=20,r=50,n=100"   first byte of the answer 20 ms after the request was read,
                              then 100 text chunks at 50 chunks/s (r=0: as fast as it can write)

Headers go out at once (as uvicorn does); each SSE event is one HTTP chunk (chunked encoding,
as vLLM sends them); after the text chunks come a finish chunk, a usage chunk with
`prompt_tokens_details.cached_tokens`, and `data: [DONE]`. Flood answers are encoded once and
written whole, so the server is never what limits a client.

    python benchmarks/streamserver.py --port 0      # prints "listening on 127.0.0.1:PORT"
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys

WORDS = [" pallet", " invoice", " 7395", "-2841", "-6620", " the", " ledger", " was", " reconciled", " on",
         " Tuesday", " by", " the", " night", " shift", "."]
HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ncache-control: no-cache\r\n"
        b"transfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n")


def frame(payload: bytes) -> bytes:
    """One SSE event as one HTTP chunk."""
    event = b"data: " + payload + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(event), event)


def text_event(i: int) -> bytes:
    return json.dumps({"id": "cmpl-bench", "object": "text_completion", "created": 1700000000, "model": "bench",
                       "choices": [{"index": 0, "text": WORDS[i % len(WORDS)], "logprobs": None,
                                    "finish_reason": None, "stop_reason": None}], "usage": None},
                      separators=(",", ":")).encode()


TEXT_FRAMES = [frame(text_event(i)) for i in range(len(WORDS))]


def tail_frames(n: int, prompt_chars: int) -> bytes:
    finish = json.dumps({"id": "cmpl-bench", "object": "text_completion", "created": 1700000000, "model": "bench",
                         "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length",
                                      "stop_reason": None}], "usage": None}, separators=(",", ":")).encode()
    prompt_tokens = max(1, prompt_chars // 4)
    usage = json.dumps({"id": "cmpl-bench", "object": "text_completion", "created": 1700000000, "model": "bench",
                        "choices": [], "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + n,
                                                 "completion_tokens": n,
                                                 "prompt_tokens_details": {"cached_tokens": prompt_tokens // 2}}},
                       separators=(",", ":")).encode()
    return frame(finish) + frame(usage) + frame(b"[DONE]") + b"0\r\n\r\n"


_flood_cache: dict[int, bytes] = {}


def flood_body(n: int) -> bytes:
    body = _flood_cache.get(n)
    if body is None:
        body = b"".join(TEXT_FRAMES[i % len(TEXT_FRAMES)] for i in range(n))
        _flood_cache[n] = body
    return body


def parse_schedule(model: str) -> tuple[float, float, int]:
    delay, rate, n = 0.02, 50.0, 20
    if model.startswith("bench:"):
        for part in model[6:].split(","):
            key, _, value = part.partition("=")
            if key == "d":
                delay = float(value) / 1000
            elif key == "r":
                rate = float(value)
            elif key == "n":
                n = int(value)
    return delay, rate, n


async def answer(writer: asyncio.StreamWriter, body: dict, received: float) -> None:
    loop = asyncio.get_running_loop()
    delay, rate, n = parse_schedule(str(body.get("model", "")))
    prompt_chars = len(body.get("prompt") or "")
    writer.write(HEAD)
    start = received + delay
    wait = start - loop.time()
    if wait > 0:
        await asyncio.sleep(wait)
    if rate <= 0:
        writer.write(flood_body(n))
        await writer.drain()
    else:
        for i in range(n):
            due = start + i / rate
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(TEXT_FRAMES[i % len(TEXT_FRAMES)])
        await writer.drain()
    writer.write(tail_frames(n, prompt_chars))
    await writer.drain()


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    loop = asyncio.get_running_loop()
    try:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            lines = head.decode("latin-1").split("\r\n")
            method, path = lines[0].split(" ")[:2]
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    key, _, value = line.partition(":")
                    headers[key.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0"))
            raw = await reader.readexactly(length) if length else b""
            received = loop.time()
            if method == "POST" and path.endswith("/completions"):
                await answer(writer, json.loads(raw) if raw else {}, received)
            else:
                payload = json.dumps({"object": "list", "data": [{"id": "bench"}]}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                             % (len(payload), payload))
                await writer.drain()
            if headers.get("connection", "").lower() == "close":
                return
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def serve(port: int) -> None:
    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=2048, limit=1 << 20)
    bound = server.sockets[0].getsockname()[1]
    print(f"listening on 127.0.0.1:{bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    try:
        asyncio.run(serve(args.port))
    except KeyboardInterrupt:
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
