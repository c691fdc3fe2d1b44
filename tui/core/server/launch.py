"""Start a server command, tail its output, wait until it answers, stop it with no orphan.

Generic: knows nothing about vLLM or llama.cpp (see tui/embedded for those). The server
runs in its own session, hence its own process group, so stop() can signal the server and
every child it spawned (vLLM forks an engine-core process) at once.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import os
import re
import shlex
import signal
import socket
import time
from typing import Callable

import httpx

__all__ = ["LaunchError", "ServerProcess", "free_port"]

_POLL = 0.5  # seconds between readiness probes
_PROGRESS_EVERY = 2.0  # seconds between progress() calls in wait_ready
_MAX_LINE = 8000  # longer output lines are cut (a runaway progress bar must not eat RAM)
_LINE_SPLIT = re.compile(rb"\r\n|\r|\n")  # bare \r too: progress bars redraw with it

# Servers started and not yet stopped: killed at interpreter exit so that an
# exception or sys.exit in the caller does not leave a model server running.
_LIVE: set["ServerProcess"] = set()


class LaunchError(Exception):
    """str(e) is a single human-readable line."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _group_alive(pgid: int) -> bool:
    """True while any non-zombie process is in group pgid.

    Zombies do not count: orphans are reparented to PID 1, which on some machines
    (containers, microVMs) never reaps them, so a dead child can stay a zombie forever.
    """
    try:
        entries = os.listdir("/proc")
    except OSError:  # no procfs: ask the kernel (zombies count there, never mind)
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # After "pid (comm) ": state ppid pgrp ... ; comm may contain spaces and ')'.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


@atexit.register
def _kill_leftovers() -> None:
    for server in list(_LIVE):
        if server.pid is not None:
            _killpg(server.pid, signal.SIGKILL)


class ServerProcess:
    """Run a server command in its own process group, tail its output, wait for health, stop with no orphan."""

    def __init__(
        self,
        argv: list[str],
        *,
        url: str,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        on_line: Callable[[str], None] | None = None,
        on_line_error: Callable[[Exception, str], None] | None = None,
        keep_lines: int = 400,
    ) -> None:
        self.argv = list(argv)
        self.command_line = shlex.join(self.argv)
        self.url = url.rstrip("/")
        self.env = env
        self.cwd = cwd
        self.on_line = on_line
        # on_line raising is never dropped: the first error (and the line) goes to on_line_error and
        # stays in line_error; the tail goes on (a pipe nobody drains would stall the server)
        self.on_line_error = on_line_error
        self.line_error: tuple[Exception, str] | None = None
        self.line_errors = 0
        self.pid: int | None = None
        self.recent_lines: collections.deque[str] = collections.deque(maxlen=keep_lines)
        self.exited = asyncio.Event()
        self.returncode: int | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task | None = None
        self._watcher: asyncio.Task | None = None
        self._stopping: asyncio.Future | None = None

    # -- start and output ---------------------------------------------------------

    async def start(self) -> None:
        if self._proc is not None:
            raise LaunchError(f"server already started (pid {self.pid})")
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,  # own process group: stop() signals all of it
            )
        except OSError as e:
            raise LaunchError(f"cannot start {self.argv[0]}: {e.strerror or e}") from e
        self.pid = self._proc.pid
        _LIVE.add(self)
        self._reader = asyncio.create_task(self._read_output())
        self._watcher = asyncio.create_task(self._watch_exit())

    async def _read_output(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        buf = b""
        while chunk := await self._proc.stdout.read(65536):
            buf += chunk
            keep_cr = buf.endswith(b"\r")  # may be the first half of a \r\n split across chunks
            *lines, buf = _LINE_SPLIT.split(buf[:-1] if keep_cr else buf)
            if keep_cr:
                buf += b"\r"
            if len(buf) > _MAX_LINE:
                lines.append(buf)
                buf = b""
            for raw in lines:
                self._add_line(raw)
        if buf.rstrip(b"\r"):
            self._add_line(buf.rstrip(b"\r"))

    def _add_line(self, raw: bytes) -> None:
        line = raw[:_MAX_LINE].decode("utf-8", errors="replace")
        self.recent_lines.append(line)
        if self.on_line is not None:
            try:
                self.on_line(line)
            except Exception as exc:  # must not stop the tail, must not be lost either
                self.line_errors += 1
                if self.line_error is None:
                    self.line_error = (exc, line)
                    if self.on_line_error is not None:
                        self.on_line_error(exc, line)

    async def _watch_exit(self) -> None:
        # Poll returncode instead of awaiting proc.wait(): since Python 3.12, wait()
        # also waits for the output pipe to close, which a surviving grandchild can
        # hold open forever.
        assert self._proc is not None
        while self._proc.returncode is None:
            await asyncio.sleep(0.1)
        if self._reader is not None:  # let the last lines arrive before announcing the exit
            await asyncio.wait({self._reader}, timeout=1.0)
        self.returncode = self._proc.returncode
        self.exited.set()

    def last_line(self) -> str:
        """The last non-empty output line, or '(no output)'."""
        for line in reversed(self.recent_lines):
            if line.strip():
                return line.strip()
        return "(no output)"

    # -- readiness ------------------------------------------------------------------

    async def wait_ready(self, timeout: float, progress: Callable[[str], None] | None = None) -> None:
        if self._proc is None:
            raise LaunchError("server not started")
        started = time.monotonic()
        next_progress = started + _PROGRESS_EVERY
        async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:  # no proxy for loopback
            while True:
                if self.exited.is_set():
                    raise LaunchError(
                        f"server exited with code {self.returncode} before it was ready: {self.last_line()}"
                    )
                if await self._answers(client):
                    return
                now = time.monotonic()
                if now - started >= timeout:
                    raise LaunchError(f"server not ready after {timeout:.0f}s: {self.last_line()}")
                if progress is not None and now >= next_progress:
                    next_progress = now + _PROGRESS_EVERY
                    progress(f"waiting for {self.url} ({now - started:.0f}s): {self.last_line()}")
                try:  # sleep, but wake at once if the process dies
                    await asyncio.wait_for(self.exited.wait(), _POLL)
                except asyncio.TimeoutError:
                    pass

    async def _answers(self, client: httpx.AsyncClient) -> bool:
        """Both /health and /v1/models answer 200 (health alone can come before the model is served)."""
        try:
            for path in ("/health", "/v1/models"):
                if (await client.get(self.url + path)).status_code != 200:
                    return False
            return True
        except httpx.HTTPError:
            return False

    # -- stop -----------------------------------------------------------------------

    async def stop(self, grace: float = 15.0) -> None:
        """SIGTERM the whole group, SIGKILL what is left after grace; idempotent and safe to call concurrently."""
        if self._proc is None:
            return
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop(grace))
        await asyncio.shield(self._stopping)

    async def _stop(self, grace: float) -> None:
        pgid = self.pid  # start_new_session: the group id is the leader's pid
        assert pgid is not None
        if not await self._wait_gone(pgid, 0):
            _killpg(pgid, signal.SIGTERM)
            if not await self._wait_gone(pgid, grace):
                _killpg(pgid, signal.SIGKILL)
                await self._wait_gone(pgid, 10.0)
        if self._reader is not None and not self._reader.done():
            try:                    # the reader ends at EOF once every holder of the pipe is gone
                await asyncio.wait_for(asyncio.shield(self._reader), 2.0)
            except (asyncio.TimeoutError, Exception):
                self._reader.cancel()  # some escaped process still holds the pipe
        # Close the pipes now, inside the loop: left to the garbage collector after the loop has
        # closed, asyncio prints "Exception ignored ... Event loop is closed" at exit.
        transport = getattr(self._proc, "_transport", None)
        if transport is not None:
            transport.close()
        _LIVE.discard(self)

    async def _wait_gone(self, pgid: int, wait: float) -> bool:
        """Wait up to `wait` seconds for the leader to be reaped and its group to be empty."""
        deadline = time.monotonic() + wait
        while not (self.exited.is_set() and not _group_alive(pgid)):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.1)
        return True

    async def __aenter__(self) -> "ServerProcess":
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
