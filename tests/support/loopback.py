"""What the test proxies share: an upstream session and a catch-all aiohttp server on 127.0.0.1."""

import aiohttp
from aiohttp import web


async def serve_catch_all(handle) -> tuple[aiohttp.ClientSession, web.AppRunner, str]:
    """(upstream session, runner, url) of a server on a free loopback port routing every path to
    `handle`. A fresh upstream connection per request: llama-server drops kept-alive ones after 5 s."""
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900),
                                    connector=aiohttp.TCPConnector(force_close=True))
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return session, runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
