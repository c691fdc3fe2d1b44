"""Local I/O faults, through the real CLI: a full disk (a 64 KiB tmpfs), a log path that cannot be
written, the log's folder removed mid-run. Each stops the run at the first failed write with one
line naming the path, the error and how many events were written, exit 5, the summary still printed
and a launched server stopped. The same runs on a roomy disk stay quiet (exit 0)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.cli import ROOT, hitproof_argv, run_hitproof, scenario
from tui.core.config.errors import EXIT_LOG, LogWriteError
from tui.core.log.events import RunHeader, ServerLog
from tui.core.log.recorder import Recorder, check_writable
from tui.core.log.reader import iter_log

REFSERVER = f"{sys.executable} -m tui.refserver --port {{port}}"
SMALL = """
[scenario]
phases = ["cold_hit", "conversation", "rotation"]
[evidence]
memo_tokens = 400
[phases.conversation]
turns = 3
[phases.rotation]
slots = 4
rounds = {rounds}
memo_tokens = 400
"""


@contextlib.contextmanager
def tmpfs(folder: Path, size: str):
    """A small RAM disk (as root, which the suite and CI are); always unmounted."""
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                             capture_output=True, text=True)
    assert mounted.returncode == 0, f"cannot mount a tmpfs (the test needs root): {mounted.stderr.strip()}"
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def started_pid(stderr: str) -> int:
    match = re.search(r"started .* \(pid (\d+)\)", stderr)
    assert match, stderr
    return int(match.group(1))


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return True
    return stat[stat.rfind(b")") + 2:].split()[0] in (b"Z", b"X")


def error_line(result) -> str:
    assert "Traceback" not in result.out + result.err, result.out + result.err
    lines = [line for line in result.err.splitlines() if "error:" in line]
    assert len(lines) == 1, result.err
    return lines[0]


def whole_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n")


# --- a full disk --------------------------------------------------------------------------------------------

async def test_a_full_disk_stops_the_run_with_one_line_exit_5_and_the_server_stopped(tmp_path):
    with tmpfs(tmp_path / "small", "64k") as disk:
        log = disk / "run.jsonl"
        result = await run_hitproof("run", "--launch", REFSERVER, "--scenario",
                                    str(scenario(tmp_path, SMALL.format(rounds=40))), "--headless",
                                    "--record", str(log), timeout=300)
        line = error_line(result)
        assert result.code == EXIT_LOG == 5, result.out + result.err
        match = re.search(r"could not write the log (\S+): No space left on device \(([\d,]+) events written", line)
        assert match and match.group(1) == str(log), line
        written = int(match.group(2).replace(",", ""))
        assert 0 < written <= whole_lines(log)            # every event it counts is in the file, whole
        # the run stopped at the first failed write, not at the end: far fewer requests than planned
        assert "hitproof summary" in result.out and "verdict: ERROR (exit 5): could not write the log" in result.out
        planned = 3 + 4 + 4 * 40
        requests = int(re.search(r"; (\d+) requests,", result.out).group(1))
        assert requests < planned / 2, result.out
        assert gone(started_pid(result.err)), "the launched server was left running"
        # what was written reads back as a log, up to its last whole event
        warnings: list[str] = []
        events = list(iter_log(log, warnings))
        assert isinstance(events[0], RunHeader) and len(events) >= written


async def test_the_same_run_on_a_roomy_disk_passes_quietly(tmp_path):
    with tmpfs(tmp_path / "roomy", "16m") as disk:
        log = disk / "run.jsonl"
        result = await run_hitproof("run", "--launch", REFSERVER, "--scenario",
                                    str(scenario(tmp_path, SMALL.format(rounds=3))), "--headless",
                                    "--record", str(log), timeout=300)
        assert result.code == 0, result.out + result.err
        assert "error:" not in result.err and "incomplete" not in result.out
        assert f"log: {log}" in result.out and gone(started_pid(result.err))
        assert list(iter_log(log))[-1].type == "run_end"


# --- a log path that cannot be written ----------------------------------------------------------------------

@pytest.mark.parametrize("where", ["parent is a file", "a folder", "under /proc"])
async def test_an_unwritable_log_path_is_exit_5_before_any_server_is_launched(tmp_path, where):
    if where == "parent is a file":
        (tmp_path / "plain").write_text("x")
        log, reason = tmp_path / "plain" / "run.jsonl", f"{tmp_path / 'plain'} is a file, not a folder"
    elif where == "a folder":
        (tmp_path / "dir.jsonl").mkdir()
        log, reason = tmp_path / "dir.jsonl", "Is a directory"
    else:
        log, reason = Path("/proc/hitproof-test/run.jsonl"), "No such file or directory"
    result = await run_hitproof("run", "--launch", REFSERVER, "--scenario",
                                str(scenario(tmp_path, SMALL.format(rounds=2))), "--headless", "--record", str(log),
                                timeout=120)
    line = error_line(result)
    assert result.code == 5, result.out + result.err
    assert line == f"hitproof: error: could not write the log {log}: {reason} (0 events written; the log stops there)"
    assert "started" not in result.err                # checked before the server was launched


def test_check_writable_leaves_nothing_behind(tmp_path):
    log = tmp_path / "new" / "run.jsonl"
    check_writable(log)
    assert log.parent.is_dir() and not log.exists()
    with pytest.raises(LogWriteError) as caught:
        check_writable(tmp_path)
    assert caught.value.exit_code == 5 and str(tmp_path) in str(caught.value)


# --- the log's folder removed mid-run -----------------------------------------------------------------------

async def test_the_log_folder_removed_mid_run_stops_it_with_exit_5(tmp_path):
    folder = tmp_path / "logs"
    log = folder / "run.jsonl"
    proc = await asyncio.create_subprocess_exec(
        *hitproof_argv("run", "--launch", f"{REFSERVER} --decode-ms-per-token 20", "--scenario",
                       str(scenario(tmp_path, SMALL.format(rounds=500))), "--headless", "--record", str(log)),
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "160"})
    communicate = asyncio.create_task(proc.communicate())
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and not communicate.done():   # some requests done: remove the folder
            await asyncio.sleep(0.1)
            if log.exists() and log.read_bytes().count(b'"type":"request_end"') >= 3:
                shutil.rmtree(folder)
                break
        out, err = await asyncio.wait_for(communicate, 120)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    out, err = out.decode(), err.decode()

    class R:
        pass
    result = R()
    result.out, result.err = out, err
    line = error_line(result)
    assert proc.returncode == 5, out + err
    assert re.search(rf"could not write the log {re.escape(str(log))}: the file was removed during the run "
                     r"\(or its folder was\) \([\d,]+ events written", line), line
    assert "hitproof summary" in out and "verdict: ERROR (exit 5)" in out
    requests = int(re.search(r"; (\d+) requests,", out).group(1))
    assert requests < 3 + 4 + 4 * 500
    assert gone(started_pid(err))


# --- the recorder itself ------------------------------------------------------------------------------------

async def test_the_recorder_fails_once_drops_the_rest_and_never_raises():
    failures: list[LogWriteError] = []
    recorder = Recorder("/dev/full", on_failure=failures.append)     # every write: No space left on device
    await recorder.start()
    for _ in range(50):
        recorder(ServerLog(line="x" * 10_000))
        await asyncio.sleep(0)
    await asyncio.sleep(0.2)
    for _ in range(50):
        recorder(ServerLog(line="more"))
    assert recorder._queue.qsize() == 0                     # nothing piles up after the failure
    await recorder.close()                                  # no exception
    assert len(failures) == 1 and failures[0] is recorder.failure
    assert str(failures[0]).startswith("could not write the log /dev/full: No space left on device (0 events")


async def test_the_recorder_on_a_good_file_reports_no_failure(tmp_path):
    failures: list[LogWriteError] = []
    recorder = Recorder(tmp_path / "ok.jsonl", on_failure=failures.append)
    await recorder.start()
    for i in range(100):
        recorder(ServerLog(line=f"line {i}"))
    await recorder.close()
    assert not failures and recorder.failure is None and recorder.written == 100
    assert whole_lines(tmp_path / "ok.jsonl") == 100
