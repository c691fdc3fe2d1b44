"""Secrets never written or shown: the API key hitproof sends, a launch command's --api-key, a token in
the launched server's environment - not in the log, any report format, the incident record, the
console, or an app screen (what a screenshot saves), even when the server prints them. And the reference
server listens on 127.0.0.1 unless told otherwise, and warns when it is."""

from __future__ import annotations

import asyncio
import html
import json
import re
import sys

import pytest

from support.cli import ROOT, hitproof_argv, run_hitproof, scenario
from tui.app.app import build_app
from tui.app.replay import ReplaySource
from tui.core.config.redact import REDACTED, Redactor, redact_argv, secrets_of

HITPROOF_KEY = "sk-hitproof-key-0123456789"
LAUNCH_KEY = "sk-launch-key-abcdefghij"
ENV_TOKEN = "hf_envtoken_zyxwvutsrq"
SECRETS = (HITPROOF_KEY, LAUNCH_KEY, ENV_TOKEN)
FORMATS = ("text", "markdown", "json", "junit", "html")
SMALL = '[scenario]\nphases = ["cold_hit", "rotation"]\n[evidence]\nmemo_tokens = 300\n' \
        '[phases.rotation]\nslots = 2\nrounds = 2\nmemo_tokens = 300\n'


def leaks(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


@pytest.fixture(scope="module")
def launched_run(tmp_path_factory):
    """A launched server that takes --api-key and prints its arguments and its environment's token at
    start-up, the way vLLM prints its non-default args, and a trouble line with the key in it."""
    folder = tmp_path_factory.mktemp("secrets")
    wrapper = folder / "server.sh"
    wrapper.write_text(
        "#!/bin/sh\n"
        "echo \"non-default args: {'api_key': ['$2'], 'port': $4}\"\n"
        "echo \"HF_TOKEN=$HF_TOKEN\"\n"
        "echo \"RuntimeError: CUDA error: an illegal memory access was encountered (key $2)\"\n"
        f"exec {sys.executable} -m tui.refserver --port \"$4\"\n")
    wrapper.chmod(0o755)
    profile = folder / "secret.toml"
    profile.write_text(f'name = "secret"\ncommand = "{wrapper} --api-key {LAUNCH_KEY} --port {{port}}"\n'
                       f'[env]\nHF_TOKEN = "{ENV_TOKEN}"\n')
    log = folder / "run.jsonl"

    async def go():
        return await run_hitproof("run", "--profile", str(profile), "--scenario", str(scenario(folder, SMALL)),
                                  "--headless", "--verbose", "--record", str(log),
                                  env={"HITPROOF_API_KEY": HITPROOF_KEY})

    result = asyncio.run(go())
    assert result.code == 1, result.out + result.err          # the trouble line is a fail finding
    return result, log


def test_the_console_never_shows_a_secret(launched_run):
    result, _ = launched_run
    assert leaks(result.out + result.err) == []
    assert f"--api-key {REDACTED}" in result.err                 # the launch line, said without its key


def test_the_log_never_holds_a_secret(launched_run):
    _, log = launched_run
    text = log.read_text()
    assert leaks(text) == []
    events = [json.loads(line) for line in text.splitlines()]
    lines = [e["line"] for e in events if e["type"] == "server_log"]
    assert f"non-default args: {{'api_key': ['{REDACTED}'], " in lines[0]       # the server's line, redacted
    assert f"HF_TOKEN={REDACTED}" in lines
    header = events[0]
    assert f"--api-key {REDACTED}" in header["target"]["launch_command"]
    assert f"--api-key {REDACTED}" in header["target"]["incident"]["launch_command"]
    assert header["target"]["incident"]["env"].get("HF_TOKEN") in (None, REDACTED)
    finding = next(e for e in events if e["type"] == "finding" and e["kind"] == "engine_log")
    assert REDACTED in finding["detail"] and REDACTED in finding["evidence"]["line"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_no_report_format_holds_a_secret(launched_run, fmt):
    import subprocess

    _, log = launched_run
    out = subprocess.run(hitproof_argv("report", str(log), "--format", fmt), cwd=ROOT, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    assert leaks(out.stdout + out.stderr) == []
    if fmt in ("text", "json", "markdown"):              # the incident record is in these
        assert "launch command" in out.stdout or "launch_command" in out.stdout


def screen_text(app) -> str:
    svg = app.export_screenshot()
    return html.unescape("".join(re.findall(r"<text[^>]*>(.*?)</text>", svg, flags=re.S))).replace("\xa0", " ")


async def test_no_app_screen_shows_a_secret(launched_run):
    _, log = launched_run
    app = build_app(ReplaySource(log))
    async with app.run_test(size=(120, 40)) as pilot:
        for _ in range(300):
            if app.source.ready:
                break
            await pilot.pause(0.1)
        await pilot.pause(0.3)
        await pilot.press("l")                           # the server's log pane
        await pilot.pause(0.3)
        shown = screen_text(app)
        assert "non-default args" in shown or any("non-default args" in line for line in app.model.server_log)
        assert leaks(shown) == [] and leaks("\n".join(app.model.server_log)) == []
        await pilot.press("q")


# --- the redactor ------------------------------------------------------------------------------------

def test_secret_flags_and_env_values_are_found_and_replaced():
    argv = ["vllm", "serve", "m", "--api-key", "sk-aaaaaaaa", "--hf-token=hf_bbbbbbbb", "--port", "8000"]
    assert redact_argv(argv) == ["vllm", "serve", "m", "--api-key", REDACTED, f"--hf-token={REDACTED}",
                                 "--port", "8000"]
    found = secrets_of(argv, {"HF_TOKEN": "hf_cccccccc", "TOKENIZERS_PARALLELISM": "false", "PATH": "/usr/bin"},
                       environ={"HITPROOF_API_KEY": "sk-dddddddd"})
    assert set(found) == {"sk-aaaaaaaa", "hf_bbbbbbbb", "hf_cccccccc", "sk-dddddddd"}   # "false" is no secret
    redactor = Redactor(found)
    assert redactor.text("key sk-aaaaaaaa and hf_cccccccc") == f"key {REDACTED} and {REDACTED}"
    assert redactor.line(b'{"line":"sk-dddddddd"}') == b'{"line":"<redacted>"}'
    assert not Redactor(secrets_of([], {}, environ={}))              # nothing to hide: no work per line


def test_without_secrets_nothing_is_touched():
    redactor = Redactor(secrets_of(["llama-server", "--port", "8080"], {"HOME": "/root"}, environ={}))
    assert redactor.text("--port 8080 /root") == "--port 8080 /root"
    assert redactor.command(["llama-server", "--port", "8080"]) == ["llama-server", "--port", "8080"]


def test_the_embedded_engines_launch_lines_are_kept_whole():
    """A boolean flag whose name holds "token" is no secret flag, and a value that is the next flag is
    no secret: a fresh clone's incident record read `--enable-prompt-tokens-details <redacted> 16384`."""
    from tui.embedded import vllm
    from tui.embedded.tiny import launch_argv

    gemma = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--enable-prefix-caching",
             "--enable-prompt-tokens-details", "--max-model-len", "16384", "--enforce-eager"]
    assert redact_argv(gemma) == gemma and secrets_of(gemma, {}, environ={}) == []
    hybrid = vllm._server_argv("/m", "qwen3next-tiny", 8000) + ["--dtype", "bfloat16"]
    llama = launch_argv("llama-server", "/m.gguf", "qwen3next-tiny", 8080)
    for argv in (hybrid, llama):
        assert redact_argv(argv) == argv and secrets_of(argv, {}, environ={}) == []
    # a secret flag with no value (the next word is a flag) hides nothing
    assert redact_argv(["serve", "--api-key", "--port", "1"]) == ["serve", "--api-key", "--port", "1"]
    assert redact_argv(["serve", "--token-file", "/s"]) == ["serve", "--token-file", REDACTED]


# --- the reference server's address ------------------------------------------------------------------

def listening_on(port: int) -> set[str]:
    """Local addresses with a listening TCP socket on this port (/proc/net/tcp, hex little-endian)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            local, state = row.split()[1], row.split()[3]
            address, _, hexport = local.partition(":")
            if state == "0A" and int(hexport, 16) == port:
                found.add(address)
    return found


async def test_the_reference_server_listens_on_loopback_by_default():
    proc = await asyncio.create_subprocess_exec(*hitproof_argv("refserver", "--port", "0"), cwd=ROOT,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        port = int(re.search(r"127\.0\.0\.1:(\d+)", line).group(1))
        assert listening_on(port) == {"0100007F"}                # 127.0.0.1, nothing else
    finally:
        proc.terminate()
        _, err = await proc.communicate()
    assert b"warning" not in err


async def test_the_reference_server_warns_when_told_to_listen_beyond_loopback():
    # 192.0.2.1 (TEST-NET-1) is no address of this machine: the warning comes first, then the bind
    # fails in one line - nothing ever listens beyond loopback here
    result = await run_hitproof("refserver", "--host", "192.0.2.1", "--port", "0")
    lines = result.err.strip().splitlines()
    assert result.code == 1 and len(lines) == 2 and "Traceback" not in result.err
    assert lines[0] == ("refserver: warning: listening on 192.0.2.1, not loopback: anyone who can reach this "
                        "machine can use it (the reference server has no authentication)")
    assert lines[1].startswith("refserver: cannot listen on 192.0.2.1:0: ")
