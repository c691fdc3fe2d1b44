"""``python -m tui.refserver.router``: the reference router (tui/refserver/replicas.py) as a process, in
front of workers that are already running (a launch profile's [replicas], in the fast tests)."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from .replicas import POLICIES, start_router


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tui.refserver.router")
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0 = pick a free one)")
    parser.add_argument("--worker-urls", nargs="+", required=True, metavar="URL", help="the servers behind it")
    parser.add_argument("--policy", choices=POLICIES, default="round_robin")
    parser.add_argument("--served-by-header", action="store_true",
                        help="add x-served-by: HOST:PORT (the worker) to every answer")
    ns = parser.parse_args(argv)

    async def serve() -> None:
        handle = await start_router(ns.worker_urls, policy=ns.policy, served_by=ns.served_by_header, port=ns.port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        print(f"router listening on {handle.url} in front of {' '.join(handle.worker_urls)} "
              f"(policy {ns.policy}; its metrics: {handle.metrics_url})", flush=True)
        try:
            await stop.wait()
        finally:
            await handle.close()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        return 0
    except (OSError, ValueError) as exc:
        print(f"router: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
