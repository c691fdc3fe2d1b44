"""tui.core.server.launch.ServerProcess against a tiny fake server (tests/fixtures/fake_server.py)."""

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tui.core.server.launch import LaunchError, ServerProcess, free_port

FAKE = Path(__file__).resolve().parents[1] / "fixtures" / "fake_server.py"


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


# -- tui.embedded: setup machinery and launch specs (no real install) ----------------

import json  # noqa: E402
import threading  # noqa: E402

from tui import embedded as engines  # noqa: E402
from tui.embedded.common import Setup, Step  # noqa: E402


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HITPROOF_CACHE", str(tmp_path))
    return tmp_path


def test_cache_dir_follows_env(cache, monkeypatch):
    assert engines.cache_dir() == cache
    monkeypatch.delenv("HITPROOF_CACHE")
    assert engines.cache_dir().name == "hitproof"


def test_unknown_engine_and_missing_setup(cache):
    with pytest.raises(engines.SetupError, match="unknown engine 'nope'"):
        engines.prepare("nope")
    for engine in engines.ENGINES:
        with pytest.raises(engines.SetupError, match=rf"run prepare\('{engine}'\) first"):
            engines.launch_spec(engine, port=1234)


def test_steps_run_once_fail_cleanly_and_cascade(cache):
    said, ran = [], []
    fail = {"on": True}

    def flaky():
        ran.append("b")
        code = f"print('Collecting thing'); print('noise'); print('ERROR: no such package'); exit({int(fail['on'])})"
        setup.run("step b", [sys.executable, "-c", code])

    steps = [Step("step a", "k1", lambda: ran.append("a")), Step("step b", "k1", flaky)]
    with Setup("fake", said.append) as setup:
        with pytest.raises(engines.SetupError) as err:
            setup.steps(steps)
    log = cache / "logs" / "setup-fake.log"
    assert str(err.value) == f"step b failed: ERROR: no such package; full log: {log}"
    assert "noise" in log.read_text()  # everything is logged...
    assert "[fake]   Collecting thing" in said and not any("noise" in s for s in said)  # ...pip highlights shown
    assert ran == ["a", "b"]

    fail["on"] = False
    with Setup("fake", said.append) as setup:
        setup.steps(steps)  # a done, b redone
    assert ran == ["a", "b", "b"]
    assert any(s.startswith("[fake] step b: done in ") for s in said)

    with Setup("fake", said.append) as setup:
        setup.steps(steps)  # all done: nothing runs
    assert ran == ["a", "b", "b"]

    steps[0] = Step("step a", "k2", lambda: ran.append("a"))  # recipe changed: a and everything after
    with Setup("fake", said.append) as setup:
        setup.steps(steps)
    assert ran == ["a", "b", "b", "a", "b"]


def test_setup_lock_serialises_processes(cache):
    said = []
    with Setup("fake", said.append):
        entered = threading.Event()

        def other():
            with Setup("fake", said.append):
                entered.set()

        t = threading.Thread(target=other)
        t.start()
        time.sleep(0.5)
        assert not entered.is_set()
    t.join(5)
    assert entered.is_set()
    assert "[fake] another hitproof process is setting up fake; waiting for it" in said


def test_launch_specs_from_recorded_setup(cache):
    hf = cache / "models" / "gemma3-270m-hf"
    hf.mkdir(parents=True)
    (hf / "config.json").write_text("{}")
    gguf = cache / "models" / "gemma-3-270m-q4_k_m.gguf"
    gguf.write_bytes(b"GGUF")
    (cache / "vllm").mkdir()
    (cache / "vllm" / "info.json").write_text(json.dumps(
        {"engine_version": "0.32.0", "gemma3-270m": {"model_path": str(hf), "gguf": str(gguf)}}))
    (cache / "llamacpp").mkdir()
    (cache / "llamacpp" / "info.json").write_text(json.dumps(
        {"binary": "/bin/true", "engine_version": "x", "gemma3-270m": {"gguf": str(gguf)}}))

    v = engines.launch_spec("vllm", port=8001)
    assert v.url == "http://127.0.0.1:8001" and v.model == "gemma3-270m"
    assert v.argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    for flag in ("--enable-prefix-caching", "--enable-prompt-tokens-details", "--enforce-eager"):
        assert flag in v.argv
    assert v.argv[v.argv.index("--chat-template") + 1].endswith("gemma_chat.jinja")
    assert v.env_of_interest["TMPDIR"] == str(cache / "tmp") and (cache / "tmp").is_dir()
    assert v.env["VLLM_CPU_KVCACHE_SPACE"] == "2" and "PATH" in v.env
    assert v.facts["engine_version"] == "0.32.0"

    ll = engines.launch_spec("llamacpp", port=8002)
    assert ll.argv[:3] == ["/bin/true", "-m", str(gguf)]
    assert ll.argv[ll.argv.index("-c") + 1] == "65536" and ll.argv[ll.argv.index("--parallel") + 1] == "4"
    assert "--metrics" in ll.argv and ll.env_of_interest == {}
    assert ll.facts["context_per_slot"] == 16384
