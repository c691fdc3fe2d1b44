"""Run the real `hitproof` command in a subprocess, as a user would."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Result:
    code: int
    out: str
    err: str

    def report(self, log: Path) -> dict:
        return report_json(log)


def hitproof_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "tui", *args]


def ctrl_c_reaches_it() -> None:
    """preexec_fn for a child the test will Ctrl-C: as in a terminal. A suite started in the
    background of a non-interactive shell (`.ci/run &`) has SIGINT ignored, and its children inherit
    that, so SIGINT would never reach them (Python keeps an inherited SIG_IGN)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def run_hitproof(*args: str, timeout: float = 900, interrupt_after: float | None = None,
                       env: dict | None = None) -> Result:
    proc = await asyncio.create_subprocess_exec(
        *hitproof_argv(*args), cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "160", **(env or {})},
        preexec_fn=ctrl_c_reaches_it if interrupt_after is not None else None)
    if interrupt_after is not None:
        await asyncio.sleep(interrupt_after)
        proc.send_signal(signal.SIGINT)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
        raise AssertionError(f"hitproof {' '.join(args)} timed out\n{out.decode()}\n{err.decode()}")
    return Result(proc.returncode, out.decode(), err.decode())


def report_json(log: Path) -> dict:
    import subprocess
    out = subprocess.run(hitproof_argv("report", str(log), "--format", "json"), cwd=ROOT, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout)


def scenario(tmp_path: Path, text: str, name: str = "s.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def kinds(report: dict, severity: str = "fail") -> set[str]:
    return {f["kind"] for f in report["findings"] if f["severity"] == severity}
