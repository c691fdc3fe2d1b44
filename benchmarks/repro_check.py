"""A repro script run as an engine's maintainer would run it: against a server started by hand.

`check(script, bug_log, control_log)` starts the server each log recorded (its header's launch line and
environment, on a free port of 127.0.0.1, its own process group), runs the script with the system Python
(`-I`: nothing of this project or its venv), and stops the server. The control's server is started only
when its launch line differs from the bug's (a control that changes the requests, not the server, cannot
be run by a script written from the bug's requests). Used by benchmarks/real_bugs.py; standard library only.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

SYSTEM_PYTHON = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if Path(p).exists()),
                     shutil.which("python3") or "python3")
READY_S = 420              # vLLM on this CPU: 60-250 s to its first answer
SCRIPT_S = 900


def launch_of(log: str | Path) -> tuple[list[str], dict[str, str]] | None:
    """(argv, env) of the one server a log's header says hitproof launched; None for an attached server,
    replicas, or a log without a launch line."""
    opener = gzip.open if str(log).endswith(".gz") else open
    with opener(log, "rt") as f:
        header = json.loads(f.readline())
    target = header.get("target") or {}
    command = target.get("launch_command")
    if not isinstance(command, str) or not command or target.get("replicas"):
        return None
    return shlex.split(command), {k: str(v) for k, v in (target.get("env") or {}).items()}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/v1/models", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def run_against(script: Path, argv: list[str], env: dict[str, str], out: Path) -> dict[str, Any]:
    """Start the server, run the script against it, stop the server: the script's exit and verdict line."""
    port = _free_port()
    argv = [re.sub(r"^\d+$", str(port), a) if i and argv[i - 1] == "--port" else a for i, a in enumerate(argv)]
    url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    with open(out.with_suffix(".server.log"), "w") as log:
        server = subprocess.Popen(argv, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        while not _ready(url):
            if server.poll() is not None or time.monotonic() - t0 > READY_S:
                return {"exit": None, "line": f"the server did not come up (see {out.with_suffix('.server.log')})"}
            time.sleep(2)
        ready_s = time.monotonic() - t0
        done = subprocess.run([SYSTEM_PYTHON, "-I", str(script), url], capture_output=True, text=True,
                              timeout=SCRIPT_S)
        out.write_text(done.stdout + done.stderr)
        lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
        return {"exit": done.returncode, "line": lines[-1] if lines else "", "ready_s": round(ready_s, 1),
                "output": str(out)}
    except subprocess.TimeoutExpired:
        return {"exit": None, "line": f"the script ran past {SCRIPT_S} s"}
    finally:
        try:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(server.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def replicas_of(log: str | Path) -> str | None:
    """The embedded llama.cpp model a log's two replicas served (the restore phase's runs), else None."""
    opener = gzip.open if str(log).endswith(".gz") else open
    with opener(log, "rt") as f:
        header = json.loads(f.readline())
        server = next((e for e in map(json.loads, f) if e.get("type") == "server"), {})
    target = header.get("target") or {}
    if target.get("engine") != "llamacpp" or len(target.get("replicas") or []) != 2:
        return None
    return re.sub(r"@\d+$", "", server.get("model") or "") or None     # replicas are aliased MODEL@INDEX


def run_pair(script: Path, model: str, out: Path) -> dict[str, Any]:
    """Two llama-servers sharing a fresh slot folder (the embedded launch line plus --slot-save-path), the
    script run with `--to` the second and `--slot-dir` the folder; both stopped after."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tui.embedded import launch_spec      # the launch line the restore phase's replicas had

    folder = Path(tempfile.mkdtemp(prefix="repro-slots-"))
    servers, urls = [], []
    try:
        for i in range(2):
            port = _free_port()
            spec = launch_spec("llamacpp", port=port, model=model, extra_args=("--slot-save-path", str(folder)))
            with open(out.with_suffix(f".server{i}.log"), "w") as log:
                servers.append(subprocess.Popen(spec.argv, env={**os.environ, **spec.env}, stdout=log,
                                                stderr=subprocess.STDOUT, start_new_session=True))
            urls.append(f"http://127.0.0.1:{port}")
        t0 = time.monotonic()
        while not all(_ready(u) for u in urls):
            if any(p.poll() is not None for p in servers) or time.monotonic() - t0 > READY_S:
                return {"exit": None, "line": f"the servers did not come up (see {out.with_suffix('.server0.log')})"}
            time.sleep(1)
        argv = [SYSTEM_PYTHON, "-I", str(script), urls[0], "--to", urls[1]]
        if '"claim": "bad_restore"' in script.read_text():
            argv += ["--slot-dir", str(folder)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=SCRIPT_S)
        out.write_text(done.stdout + done.stderr)
        lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
        return {"exit": done.returncode, "line": lines[-1] if lines else "", "output": str(out),
                "command": " ".join(argv[2:])}
    finally:
        for server in servers:
            try:
                os.killpg(server.pid, signal.SIGTERM)
                server.wait(30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        shutil.rmtree(folder, ignore_errors=True)


def check(script: Path, bug_log: str, control_log: str | None) -> dict[str, Any]:
    """The script against the bug's server and, when it is another server, the control's."""
    bug = launch_of(bug_log)
    if control_log and not Path(control_log).is_file():
        control_log = None
    if bug is None:
        model = replicas_of(bug_log)
        if model is None:
            return {"bug": {"exit": None, "line": "not run: the bug's server is neither one launched server nor "
                                                  "two llama.cpp replicas"}}
        result = {"bug": run_pair(script, model, script.with_suffix(".bug.out"))}
        # a control on another model is no control for the script: its prefill is cut where the bug's
        # model's tokens align with the question's (measured: Qwen3-Next then reuses nothing either)
        result["control"] = {"exit": None, "line": "not run: the control serves another model or changes the requests"}
        return result
    result = {"bug": run_against(script, *bug, script.with_suffix(".bug.out"))}
    control = launch_of(control_log) if control_log else None
    same = control is not None and [a for a in control[0] if not a.isdigit()] == [a for a in bug[0] if not a.isdigit()]
    if control is not None and not same:
        result["control"] = run_against(script, *control, script.with_suffix(".control.out"))
    else:
        result["control"] = {"exit": None, "line": "not run: the control changes the requests, not the server"
                             if control_log else "not run: no control"}
    return result
