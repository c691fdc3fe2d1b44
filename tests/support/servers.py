"""Real servers for the real-server tier: started by the suite, on loopback, always stopped.

The server runs in a background thread with its own event loop, so its output pipe is
drained for as long as the tests run, whatever loop each test uses.
"""

from __future__ import annotations

import asyncio
import os
import threading

from tui.core.server.launch import ServerProcess, free_port


class BackgroundServer:
    def __init__(self, engine: str, model: str = "gemma3-270m", *, without: tuple[str, ...] = (),
                 env: dict[str, str] | None = None, **launch):
        self.engine = engine
        self.model = model
        self.without = without            # flags of the embedded command to leave out
        self.env = env or {}              # variables added to the server's environment
        self.launch = launch  # launch_spec options: lora=True, drafter=True, small_cache=True, extra_args=(...)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=f"{engine}-server", daemon=True)
        self.server: ServerProcess | None = None
        self.url = ""

    def _call(self, coro, timeout: float):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self) -> "BackgroundServer":
        from tui.embedded import launch_spec, prepare

        prepare(self.engine, model=self.model, progress=lambda line: print(f"[setup {self.engine}] {line}"),
                lora=bool(self.launch.get("lora")))
        spec = launch_spec(self.engine, port=free_port(), model=self.model, **self.launch)
        self.spec = spec
        self.thread.start()
        argv = [arg for arg in spec.argv if arg not in self.without]
        env = {**(spec.env if spec.env is not None else os.environ), **self.env} if self.env else spec.env
        self.server = ServerProcess(argv, url=spec.url, env=env, keep_lines=20000)  # tests read its output back
        self.url = spec.url
        self._call(self.server.start(), 60)
        try:
            self._call(self.server.wait_ready(spec.startup_timeout), spec.startup_timeout + 30)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.server is not None:
            self._call(self.server.stop(), 60)
            self.server = None
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)

    def output(self) -> list[str]:
        return list(self.server.recent_lines) if self.server else []
