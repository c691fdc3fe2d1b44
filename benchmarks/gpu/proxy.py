"""The test suite's corrupting proxy (tests/support/corrupting_proxy.py) as a process of its own, for the
GPU run: `python3 benchmarks/gpu/proxy.py MODE UPSTREAM --port-file F --stats S`. It listens on a free
loopback port (written to F once it listens) and runs until SIGTERM/SIGINT, then writes
{"mode", "generations", "corrupted"} to S."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from support.corrupting_proxy import MODES, CorruptingProxy  # noqa: E402


async def serve(args) -> None:
    proxy = await CorruptingProxy(args.upstream, args.mode).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    Path(args.port_file).write_text(proxy.url + "\n")
    try:
        await stop.wait()
    finally:
        await proxy.close()
        Path(args.stats).write_text(json.dumps({"mode": args.mode, "generations": proxy.generations,
                                                "corrupted": proxy.corrupted}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=MODES)
    parser.add_argument("upstream")
    parser.add_argument("--port-file", required=True, help="where the proxy's URL is written once it listens")
    parser.add_argument("--stats", required=True, help="where the counts are written at the end")
    asyncio.run(serve(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
