"""Failures that used to be dropped reach the user as one line and an exit code (6, "hitproof's own
machinery failed"): the relay of a launched server's output (it emits the engine_log findings) raising,
the app's soak worker raising, the soak not ending after the user quits. Each with a real launched or
attached reference server; each next to the same run without the fault, which stays quiet."""

from __future__ import annotations

import asyncio
import json
import os
import sys

from support.app import wait_for
from support.cli import run_hitproof
from tui.app.app import build_app
from tui.app.sources import LiveSource
from tui.core.config.errors import EXIT_INTERNAL
from tui.core.config.scenario import parse_scenario
from tui.core.log.events import RequestFinished, ServerLog
from tui.core.server.profiles import adhoc_plan
from tui.core.soak.engine import Target
from tui.refserver import start_refserver
from tui.runner import RunHooks, run

SMALL = """
[scenario]
phases = ["cold_hit", "rotation"]
[evidence]
memo_tokens = 300
[phases.rotation]
slots = 2
rounds = {rounds}
memo_tokens = 300
"""
TROUBLE = "RuntimeError: CUDA error: an illegal memory access was encountered"


def wrapper(tmp_path, *, later: bool) -> str:
    """A launched reference server that logs an illegal memory access at start-up, or a moment later."""
    script = tmp_path / "server.sh"
    say = f"(sleep 1.5; echo '{TROUBLE}') &" if later else f"echo '{TROUBLE}'"
    script.write_text(f"#!/bin/sh\n{say}\nexec {sys.executable} -m tui.refserver --port \"$1\" "
                      f"--decode-ms-per-token 5\n")
    script.chmod(0o755)
    return f"{script} {{port}}"


def group_gone(pid: int) -> bool:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2:].split()
            if int(fields[2]) == pid and fields[0] not in (b"Z", b"X"):
                return False
    return True


class BrokenDisplay:
    """A consumer of the event stream that breaks on the server's trouble line: the relay's emit raises
    before the engine_log finding is made, which a swallowing relay turned into a silent PASS."""

    def __init__(self, broken: bool):
        self.broken = broken

    def __call__(self, event) -> None:
        if self.broken and isinstance(event, ServerLog) and "illegal memory" in event.line:
            raise RuntimeError("display broke")


async def launched(tmp_path, *, later: bool, broken: bool, rounds: int):
    plan = adhoc_plan(wrapper(tmp_path, later=later), None, 60)
    servers = []
    log = tmp_path / f"run-{later}-{broken}.jsonl"
    outcome = await run(parse_scenario(SMALL.format(rounds=rounds), "s.toml"), plan,
                        RunHooks(listeners=[BrokenDisplay(broken)], on_server=servers.append), record=log)
    events = [json.loads(line) for line in log.read_text().splitlines()]
    return outcome, events, servers[0]


async def test_a_relay_failure_on_a_start_up_line_stops_the_run_with_exit_6(tmp_path):
    outcome, events, server = await launched(tmp_path, later=False, broken=True, rounds=2)
    assert (outcome.verdict, outcome.exit_code) == ("error", EXIT_INTERNAL), outcome
    assert "relaying the server's output failed" in outcome.message and "display broke" in outcome.message
    assert "illegal memory access" in outcome.message and "\n" not in outcome.message
    assert events[-1]["type"] == "run_end" and events[-1]["exit_code"] == EXIT_INTERNAL
    assert server.line_error is None           # start-up lines wait for the header: they fail in the flush
    assert group_gone(server.pid)


async def test_a_relay_failure_mid_run_stops_the_run_with_exit_6(tmp_path):
    outcome, events, server = await launched(tmp_path, later=True, broken=True, rounds=200)
    assert (outcome.verdict, outcome.exit_code) == ("error", EXIT_INTERNAL), outcome
    assert "relaying the server's output failed" in outcome.message
    assert server.line_error is not None and "illegal memory" in server.line_error[1]
    assert events[-1]["type"] == "run_end" and events[-1]["exit_code"] == EXIT_INTERNAL
    assert sum(e["type"] == "request_end" for e in events) < 2 + 2 * 200     # it stopped early
    assert group_gone(server.pid)


async def test_the_same_runs_with_a_working_display_make_the_finding(tmp_path):
    outcome, events, server = await launched(tmp_path, later=False, broken=False, rounds=2)
    assert outcome.exit_code == 1 and server.line_error is None
    assert [e["evidence"]["match"] for e in events if e["type"] == "finding" and e["kind"] == "engine_log"] == \
        ["illegal_memory_access"]


async def test_a_clean_launched_run_passes():
    plan = adhoc_plan(f"{sys.executable} -m tui.refserver --port {{port}}", None, 60)
    outcome = await run(parse_scenario(SMALL.format(rounds=2), "s.toml"), plan,
                        RunHooks(listeners=[BrokenDisplay(True)]))
    assert (outcome.verdict, outcome.exit_code) == ("pass", 0)


# --- the app ---------------------------------------------------------------------------------------

def app_on(url: str, *, break_on_request: bool = False, hold_s: float | None = None):
    """The live app on an attached reference server; the soak's consumer breaks on the first answer,
    or the soak, once done, takes hold_s seconds to let go after the user quits."""
    scen = parse_scenario(SMALL.format(rounds=2), "s.toml")

    def broken(event) -> None:
        if break_on_request and isinstance(event, RequestFinished):
            raise RuntimeError("the consumer broke")

    async def slow(engine, outcome) -> None:
        await asyncio.sleep(hold_s)

    def start(hooks: RunHooks):
        hooks.listeners.append(broken)
        if hold_s is not None:
            hooks.after_run = slow
        return run(scen, Target(url=url), hooks)

    return build_app(LiveSource(start))


async def test_the_app_says_when_its_soak_fails_and_exits_6():
    handle = await start_refserver(port=0)
    try:
        app = app_on(handle.url, break_on_request=True)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.failure is not None, timeout=60)
            assert app.model.report.end is not None and app.model.report.end.exit_code == EXIT_INTERNAL
            await pilot.press("q")
        assert app.return_code == EXIT_INTERNAL
        assert app.failure.startswith("the soak failed: RuntimeError: the consumer broke")
    finally:
        await handle.close()


async def test_the_app_says_when_the_soak_does_not_end_after_quitting():
    handle = await start_refserver(port=0)
    try:
        app = app_on(handle.url, hold_s=5.0)
        app.quit_timeout = 0.3
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.model.finished, timeout=60)
            await pilot.press("q")
            await pilot.pause(0.5)
        assert app.return_code == EXIT_INTERNAL
        assert app.failure == "the soak did not finish within 0.3 s of quitting; the log may lack its last events"
    finally:
        await handle.close()


async def test_a_clean_app_run_quits_with_the_verdicts_code():
    handle = await start_refserver(port=0)
    try:
        app = app_on(handle.url)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.model.finished, timeout=60)
            await pilot.press("q")
        assert app.return_code == 0 and app.failure is None
    finally:
        await handle.close()


async def test_an_unexpected_error_in_the_cli_is_one_line_and_exit_6(tmp_path):
    """A bug met by the command line (here a report of a log whose header is a list where an object
    belongs) is one line and exit 6, not a traceback."""
    log = tmp_path / "odd.jsonl"
    log.write_text('{"type": "header", "schema": 1, "scenario": ["not", "an", "object"]}\n')
    result = await run_hitproof("report", str(log), "--format", "markdown")
    assert "Traceback" not in result.err and result.code in (2, EXIT_INTERNAL), result.err
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("hitproof: error:"), result.err


async def test_an_isolation_that_fails_is_said_and_frees_the_next_one():
    """The server goes away after the soak; an isolation re-run then fails: a notice says so (it used to
    vanish in the worker, leaving "an isolation re-run is already in progress" for good)."""
    handle = await start_refserver(port=0)
    app = app_on(handle.url)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.model.finished, timeout=60)
        await handle.close()                                   # the server is gone
        request = next(iter(app.model.requests))
        notices = []
        app.notify = lambda message, **kw: notices.append((message, kw.get("severity")))
        app.isolate_request(request, "recall_miss")
        await wait_for(pilot, lambda: any("failed" in m for m, _ in notices), timeout=60)
        assert app.model.active_isolation is None and app.failure is None
        message, severity = next((m, s) for m, s in notices if "failed" in m)
        assert message.startswith(f"isolation of request {request} failed: ") and severity == "error"
        await pilot.press("escape")
        await pilot.press("q")
    assert app.return_code == 0                     # the soak's verdict stands


async def test_an_isolation_on_a_live_server_ends_with_its_verdict():
    handle = await start_refserver(port=0, fault="zero_state")
    try:
        app = app_on(handle.url)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.model.finished, timeout=60)
            flagged = next(f.request for f in app.model.findings if f.severity == "fail")
            app.isolate_request(flagged)
            await wait_for(pilot, lambda: (app.model.isolations.get(flagged) or None) is not None
                           and app.model.isolations[flagged].result is not None, timeout=60)
            assert app.model.active_isolation is None and app.failure is None
            await pilot.press("escape")
            await pilot.press("q")
        assert app.return_code == 1
    finally:
        await handle.close()
