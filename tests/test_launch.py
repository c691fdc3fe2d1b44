"""tui.core.launch.ServerProcess against a tiny fake server (tests/fixtures/fake_server.py)."""

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tui.core.launch import LaunchError, ServerProcess, free_port

FAKE = Path(__file__).parent / "fixtures" / "fake_server.py"


def alive(pid: int) -> bool:
    """Running and not a zombie (orphans may stay zombies forever where PID 1 does not reap)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def fake(*extra: str, on_line=None) -> ServerProcess:
    port = free_port()
    argv = [sys.executable, str(FAKE), str(port), *extra]
    return ServerProcess(argv, url=f"http://127.0.0.1:{port}", on_line=on_line)


async def child_pid(server: ServerProcess) -> int:
    for _ in range(100):
        for line in list(server.recent_lines):
            if line.startswith("child pid "):
                return int(line.split()[-1])
        await asyncio.sleep(0.05)
    raise AssertionError(f"no child pid in {list(server.recent_lines)}")


async def test_ready_captures_lines_and_calls_on_line():
    seen = []

    def on_line(line):
        seen.append(line)
        raise RuntimeError("a broken callback must not stop the reader")

    server = fake("--delay", "2.5", on_line=on_line)
    progress = []
    async with server:
        t0 = time.monotonic()
        await server.wait_ready(30, progress=progress.append)
        assert time.monotonic() - t0 >= 2.0
        lines = list(server.recent_lines)
        assert lines[0] == "fake server starting"
        assert "crlf line" in lines
        assert "bad utf-8: \ufffd" in lines
        assert any(line.startswith("listening on 127.0.0.1:") for line in lines)
        assert seen == lines
        assert progress and progress[0].startswith(f"waiting for {server.url} (2s): ")
        assert server.command_line.startswith(sys.executable)
        kid = await child_pid(server)
        assert alive(server.pid) and alive(kid)
    assert server.exited.is_set()
    assert not alive(server.pid) and not alive(kid)


async def test_exits_before_ready():
    server = fake("--delay", "100", "--exit-after", "0.5", "3")
    await server.start()
    try:
        kid = await child_pid(server)
        with pytest.raises(LaunchError) as err:
            await server.wait_ready(30)
        assert str(err.value) == "server exited with code 3 before it was ready: fatal: giving up with code 3"
        assert server.returncode == 3
        assert alive(kid)  # the leader is gone but its child is still in the group...
    finally:
        await server.stop(grace=5)
    assert not alive(kid)  # ...and stop() kills it all the same


async def test_timeout_leaves_it_running():
    server = fake("--delay", "100", "--no-child")
    await server.start()
    try:
        with pytest.raises(LaunchError) as err:
            await server.wait_ready(1)
        assert str(err.value).startswith("server not ready after 1s: ")
        assert "\n" not in str(err.value)
        assert not server.exited.is_set() and alive(server.pid)
    finally:
        await server.stop()
    assert server.exited.is_set() and not alive(server.pid)


async def test_stop_kills_the_whole_group_even_if_it_ignores_sigterm():
    server = fake("--ignore-term")
    await server.start()
    await server.wait_ready(30)
    kid = await child_pid(server)
    t0 = time.monotonic()
    await server.stop(grace=1.0)
    assert time.monotonic() - t0 >= 1.0  # waited the grace period, then SIGKILL
    assert server.returncode == -signal.SIGKILL
    assert not alive(server.pid) and not alive(kid)


async def test_stop_is_idempotent():
    await ServerProcess(["true"], url="http://127.0.0.1:1").stop()  # never started: no-op
    server = fake()
    await server.start()
    await server.wait_ready(30)
    kid = await child_pid(server)
    t0 = time.monotonic()
    await asyncio.gather(server.stop(), server.stop())
    await server.stop()
    assert time.monotonic() - t0 < 5  # SIGTERM was enough
    assert server.returncode == -signal.SIGTERM
    assert not alive(server.pid) and not alive(kid)


async def test_exited_is_set_when_killed_externally():
    server = fake()
    await server.start()
    try:
        await server.wait_ready(30)
        kid = await child_pid(server)
        os.kill(server.pid, signal.SIGKILL)
        await asyncio.wait_for(server.exited.wait(), 5)
        assert server.returncode == -signal.SIGKILL
        with pytest.raises(LaunchError, match=r"^server exited with code -9 before it was ready"):
            await server.wait_ready(5)
    finally:
        await server.stop(grace=5)
    assert not alive(kid)


async def test_missing_binary():
    server = ServerProcess(["/nonexistent/llama-server"], url="http://127.0.0.1:1")
    with pytest.raises(LaunchError, match=r"^cannot start /nonexistent/llama-server: "):
        await server.start()
    await server.stop()


def test_free_port():
    port = free_port()
    assert 1024 <= port <= 65535
