"""Start and stop a reference server inside the current event loop."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from .config import RefServerConfig
from .pipeline import Pipeline
from .routes import build_app


@dataclass
class RefServerHandle:
    url: str
    port: int
    config: RefServerConfig
    pipeline: Pipeline
    _runner: web.AppRunner

    async def close(self) -> None:
        await self._runner.cleanup()

    async def __aenter__(self) -> "RefServerHandle":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def start_refserver(config: RefServerConfig | None = None, **options: object) -> RefServerHandle:
    """Serve on 127.0.0.1 (or ``host``) and return once listening.

    Pass a ``RefServerConfig`` or its fields as keyword options (``port`` defaults to 0
    here, a free port; the CLI's default is 8100): ``fault``, ``seed``, ``block_size``,
    ``num_blocks``, ``prefill_us_per_token``, ``decode_ms_per_token``, ``model_name``,
    ``drift_min_tokens``, ``num_speculative_tokens``, ``max_model_len``.
    """
    if config is None:
        config = RefServerConfig.from_options(**{"port": 0, **options})
    elif options:
        raise TypeError("pass either a RefServerConfig or keyword options, not both")
    pipeline = Pipeline(config)
    runner = web.AppRunner(build_app(pipeline), access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    port = runner.addresses[0][1]
    host = {"::1": "[::1]", "localhost": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(
        config.host, f"[{config.host}]" if ":" in config.host else config.host)
    return RefServerHandle(f"http://{host}:{port}", port, config, pipeline, runner)
