"""The clients the benchmarks compare, each run in its own fresh process against streamserver.py.

    python benchmarks/clients.py --client hitproof|raw --mode ttft|flood --port P [options]

prints one JSON object: per-request time to first token (s), text chunks received, wall and
CPU time. The same workload runs on every client:

  ttft   S streams (one kept-alive connection each), R requests each after one warm-up request,
         starts spread over one answer's duration so every request starts while the others stream;
         the server answers after --delay-ms, then --chunks chunks at --rate chunks/s.
  flood  S streams, R requests each of --chunks chunks written as fast as the server can.

`raw` is the floor: asyncio streams, the request bytes built before the clock starts, the first
read that carries a `data:` line is the first token, chunks are counted, nothing is parsed.
`hitproof` is the real path: OpenAIClient.stream, the Requester's delta coalescing into
AnswerDelta events, and every check (`evaluate`) on the final text; its time to first token is
the one hitproof itself reports (Completion.ttft_s). vllm_client.py runs vLLM's own bench client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workload import parse_workload  # noqa: E402  (benchmarks/ is the script's own directory)

REGISTRY_SIZE = 64          # codes planted in the run: the foreign-code check scans for all of them


def model_name(args) -> str:
    return f"bench:d={args.delay_ms:g},r={args.rate:g},n={args.chunks}"


def prompt_of(chars: int, stream: int) -> str:
    base = f"Memo {stream:04d}. The ledger lists pallets, invoices and the night shift. "
    return (base * (chars // len(base) + 1))[:chars]


def spread(args) -> float:
    """Seconds between stream starts so the S streams overlap evenly across one answer."""
    if args.mode != "ttft" or args.streams <= 1:
        return 0.0
    answer = args.delay_ms / 1000 + (args.chunks / args.rate if args.rate > 0 else 0.0)
    return answer / args.streams


# --- raw: asyncio streams, no parsing --------------------------------------------------------------

async def raw_stream(args, stream: int, out: dict) -> None:
    import orjson

    reader, writer = await asyncio.open_connection("127.0.0.1", args.port, limit=1 << 20)
    body = orjson.dumps({"model": model_name(args), "prompt": prompt_of(args.prompt_chars, stream),
                         "max_tokens": args.chunks, "temperature": 0.0, "stream": True,
                         "stream_options": {"include_usage": True}})
    request = (b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
               b"content-length: %d\r\n\r\n" % len(body)) + body
    try:
        for index in range(args.requests + 1):               # the first one warms the connection
            if index == 1:
                await out["barrier"].wait()                  # every stream is connected: the clock starts
                if out["stagger"]:
                    await asyncio.sleep(stream * out["stagger"])
            started = time.perf_counter_ns()
            writer.write(request)
            first = None
            count = 0
            tail = b""
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    raise ConnectionError("server closed the stream")
                arrived = time.perf_counter_ns()
                window = tail + data
                seen = window.count(b"data:")
                if seen and first is None:
                    first = arrived
                count += seen
                tail = window[-7:]
                if tail.endswith(b"\r\n0\r\n\r\n"):
                    break
            if index:
                out["ttft"].append((first - started) / 1e9)
                out["chunks"] += count - 3                      # finish, usage and [DONE] are not text
    finally:
        writer.close()


# --- hitproof: the real streaming path with every check -------------------------------------------------

def codes_registry() -> dict[str, str]:
    return {f"{1000 + i * 7:04d}-{2000 + i * 11:04d}-{3000 + i * 13:04d}": f"m{i:02d}" for i in range(REGISTRY_SIZE)}


async def hitproof_stream(args, stream: int, out: dict, client, bus, registry) -> None:
    from tui.core.server.client import RequestSpec
    from tui.core.checks.answers import evaluate
    from tui.core.soak.record import DeltaCoalescer

    own = next(iter(registry))
    spec = RequestSpec(api="completions", prompt=prompt_of(args.prompt_chars, stream), max_tokens=args.chunks,
                       model=model_name(args))
    for index in range(args.requests + 1):                   # the first one warms the connection
        if index == 1:
            await out["barrier"].wait()                      # every stream is connected: the clock starts
            if out["stagger"]:
                await asyncio.sleep(stream * out["stagger"])
        coalesce = DeltaCoalescer(bus.emit, stream * 1000 + index)
        completion = await client.stream(spec, coalesce)     # no last delta: the Requester sends none either
        evaluate(completion.text, "recall", own, registry)
        if index:
            out["ttft"].append(completion.ttft_s)
            out["chunks"] += completion.chunks - 2              # finish and usage are not text


async def run(args) -> dict:
    out = {"client": args.client, "ttft": [], "chunks": 0, "stagger": spread(args),
           "barrier": asyncio.Barrier(args.streams + 1)}
    if args.client == "raw":
        tasks = [raw_stream(args, s, out) for s in range(args.streams)]
        closer = None
    else:
        from tui.core.server.client import OpenAIClient
        from tui.core.log.events import EventBus

        client = OpenAIClient(f"http://127.0.0.1:{args.port}")
        bus = EventBus()
        bus.subscribe(lambda event: None)
        registry = codes_registry()
        tasks = [hitproof_stream(args, s, out, client, bus, registry) for s in range(args.streams)]
        closer = client.aclose
    running = asyncio.gather(*tasks)
    await out["barrier"].wait()
    cpu = time.process_time()
    wall = time.perf_counter()
    await running
    out["wall"] = time.perf_counter() - wall
    out["cpu"] = time.process_time() - cpu
    if closer is not None:
        await closer()
    return out


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--client", choices=("raw", "hitproof"), required=True)
    return parse_workload(parser, argv)


def main() -> None:
    args = parse()
    result = asyncio.run(run(args))
    result.pop("stagger", None)
    result.pop("barrier", None)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
