"""The event loop a run goes on: uvloop's (libuv, in C) where it is installed, else asyncio's own.

Against a fast server the soak's client is the slow part (issue 34), and a large share of what it spends a
request is the event loop's own bookkeeping: every network read of an answer (about 13 an answer) is one
pass of the selector loop and one callback, and asyncio's are written in Python. uvloop runs the same
callbacks (the transport's add_reader, timers, futures) from C. Measured here (2 cores, reference server,
gpu-quick at 32 streams, 2,196 requests a soak, alternating, 2026-12-06): CPU a request 0.802 ms with
asyncio's loop, 0.748 ms with uvloop's (7 soaks each); benchmarks/gpu/RESULTS.md has the GPU's figures.

Nothing else changes: the arrival stamps come from the kernel (SO_TIMESTAMPNS) or perf_counter, never from
the loop's clock; timeouts are whole seconds (uvloop's clock counts milliseconds). HITPROOF_EVENT_LOOP=asyncio
picks asyncio's loop (a problem to rule out, or a platform uvloop does not build on: Windows).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from typing import Coroutine, TypeVar

from ..config.errors import BadInput

LOOP_ENV = "HITPROOF_EVENT_LOOP"
T = TypeVar("T")

try:
    import uvloop as _uvloop
except ImportError:                 # not built for this platform (Windows), or not installed
    _uvloop = None


def loop_kind(env: dict[str, str] | None = None) -> str:
    """"uvloop" or "asyncio": what new_event_loop makes, as HITPROOF_EVENT_LOOP and the install allow
    (unset: uvloop where installed). BadInput for another value, or uvloop asked for where it is not."""
    wanted = (os.environ if env is None else env).get(LOOP_ENV, "").strip().lower()
    if wanted not in ("", "asyncio", "uvloop"):
        raise BadInput(f"{LOOP_ENV} must be asyncio or uvloop, not {wanted!r}")
    if wanted == "uvloop" and _uvloop is None:
        raise BadInput(f"{LOOP_ENV}=uvloop, but uvloop is not installed here (pip install uvloop; it does not "
                       f"build on Windows)")
    return "asyncio" if wanted == "asyncio" or _uvloop is None else "uvloop"


def new_event_loop() -> asyncio.AbstractEventLoop:
    return _uvloop.new_event_loop() if loop_kind() == "uvloop" else asyncio.new_event_loop()


class _StopSignals:
    """SIGTERM and SIGHUP (a CI job's timeout, a closed terminal) stop the run as asyncio's runner stops it on
    Ctrl-C: the main task is cancelled, its cleanup runs (the log's run_end, every launched server stopped),
    then KeyboardInterrupt. The runner does that for SIGINT only where SIGINT has Python's default handler;
    where it is ignored (nohup, a background job of a script, some CI runners) the CLI's handler raised
    KeyboardInterrupt in whatever task was running, and the run took 25 s to end (a launched soak, SIGTERM
    with SIGINT ignored, 2026-12-06: 25.3 s against 0.4 s). A second signal raises at once, as a second
    Ctrl-C does. A signal left ignored on purpose stays ignored."""

    SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))

    def __init__(self):
        self.task: asyncio.Task | None = None
        self.signalled = False
        self._before: dict[int, object] = {}

    def __enter__(self) -> "_StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                before = signal.getsignal(sig)
                if before not in (signal.SIG_IGN, None):
                    self._before[sig] = before
                    signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        for sig, before in self._before.items():
            signal.signal(sig, before)

    async def watch(self, main: Coroutine[object, object, T]) -> T:
        self.task = asyncio.current_task()
        return await main

    def _on_signal(self, signum, frame) -> None:
        if self.signalled or self.task is None or self.task.done():
            raise KeyboardInterrupt
        self.signalled = True
        self.task.cancel()
        self.task.get_loop().call_soon_threadsafe(lambda: None)     # wake a loop waiting in select


def run(main: Coroutine[object, object, T]) -> T:
    """asyncio.run(main), on new_event_loop()'s loop (BadInput before anything runs: see loop_kind); SIGTERM
    and SIGHUP end it as Ctrl-C does (_StopSignals)."""
    try:
        loop_kind()
    except BadInput:
        main.close()
        raise
    with asyncio.Runner(loop_factory=new_event_loop) as runner, _StopSignals() as stops:
        try:
            return runner.run(stops.watch(main))
        except asyncio.CancelledError:
            if stops.signalled:
                raise KeyboardInterrupt from None
            raise
