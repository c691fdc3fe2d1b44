"""vLLM's own benchmark client (`vllm bench serve`) on the benchmarks' workload.

Run with the vLLM venv's interpreter (it needs vLLM's aiohttp, regex and tqdm, not hitproof):

    ~/.cache/hitproof/vllm/venv/bin/python benchmarks/vllm_client.py --mode ttft|flood --port P [options]

It loads `vllm/benchmarks/lib/endpoint_request_func.py` by path (importing the vllm package
would take seconds and start nothing we need) and calls its `async_request_openai_completions`
exactly as `vllm bench serve` does: one aiohttp session, a TCPConnector limited to the
concurrency, the request function per request. Same options and the same JSON output as
clients.py (time to first token as vLLM measures it, after parsing the chunk).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import sys
import sysconfig
import time
from pathlib import Path


def load_request_func():
    candidates = [Path(p) / "vllm" / "benchmarks" / "lib" / "endpoint_request_func.py"
                  for p in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *sys.path} if p]
    for path in candidates:
        if path.is_file():
            spec = importlib.util.spec_from_file_location("vllm_endpoint_request_func", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module, path
    raise SystemExit("vllm/benchmarks/lib/endpoint_request_func.py not found in this interpreter's site-packages")


def model_name(args) -> str:
    return f"bench:d={args.delay_ms:g},r={args.rate:g},n={args.chunks}"


def prompt_of(chars: int, stream: int) -> str:
    base = f"Memo {stream:04d}. The ledger lists pallets, invoices and the night shift. "
    return (base * (chars // len(base) + 1))[:chars]


async def run(args) -> dict:
    import aiohttp

    module, path = load_request_func()
    request_func = module.async_request_openai_completions
    out = {"client": "vllm", "source": str(path), "ttft": [], "chunks": 0, "failed": 0}
    answer = args.delay_ms / 1000 + (args.chunks / args.rate if args.rate > 0 else 0.0)
    stagger = answer / args.streams if args.mode == "ttft" and args.streams > 1 else 0.0
    connector = aiohttp.TCPConnector(limit=args.streams, limit_per_host=args.streams, ttl_dns_cache=300,
                                     use_dns_cache=True, keepalive_timeout=60, enable_cleanup_closed=True,
                                     force_close=False, ssl=False)
    session = aiohttp.ClientSession(connector=connector, trust_env=True,
                                    timeout=aiohttp.ClientTimeout(total=6 * 60 * 60))

    async def stream(index: int) -> None:
        request = module.RequestFuncInput(prompt=prompt_of(args.prompt_chars, index),
                                          api_url=f"http://127.0.0.1:{args.port}/v1/completions",
                                          prompt_len=args.prompt_chars // 4, output_len=args.chunks,
                                          model=model_name(args))
        for n in range(args.requests + 1):                   # the first one warms the connection
            if n == 1:
                await barrier.wait()                         # every stream is connected: the clock starts
                if stagger:
                    await asyncio.sleep(index * stagger)
            output = await request_func(request, session)
            if not output.success:
                out["failed"] += 1
                out["error"] = output.error[-300:]
                continue
            if n:
                out["ttft"].append(output.ttft)
                out["chunks"] += len(output.itl)          # every chunk with choices after the first, less the finish one

    barrier = asyncio.Barrier(args.streams + 1)
    running = asyncio.gather(*(stream(i) for i in range(args.streams)))
    await barrier.wait()
    cpu = time.process_time()
    wall = time.perf_counter()
    await running
    out["wall"] = time.perf_counter() - wall
    out["cpu"] = time.process_time() - cpu
    await session.close()
    return out


def main() -> None:
    from workload import parse_workload     # benchmarks/, the script's own directory

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--client", default="vllm")       # accepted for symmetry with clients.py
    args = parse_workload(parser)
    print(json.dumps(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
