"""Does llama-server load a GGUF? Start it on one, ask for 4 tokens, stop it (tiny.py's setup step)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable

import httpx

from .common import Setup, child_env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def verify_loads(s: Setup, step: str, argv_for: Callable[[int], list[str]], gguf: Path, log: Path,
                 startup_timeout: float, answer_timeout: float) -> str:
    """Start llama-server (`argv_for(port)`) on the GGUF, ask for 4 tokens, stop it: the model really loads.
    The answer, or a setup failure naming the server's last error line (its output in `log`)."""
    port = free_port()
    argv = argv_for(port)
    argv[argv.index("-lv") + 1] = "2"  # warnings and errors are enough here
    log.parent.mkdir(parents=True, exist_ok=True)
    s.log("$ " + " ".join(argv))
    url = f"http://127.0.0.1:{port}"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=child_env(), start_new_session=True)
        try:
            deadline = time.monotonic() + startup_timeout
            no_reuse = httpx.Limits(max_keepalive_connections=0)  # llama-server may drop kept-alive ones
            with httpx.Client(timeout=answer_timeout, trust_env=False, limits=no_reuse) as client:
                while True:
                    if proc.poll() is not None:
                        break
                    try:
                        if client.get(url + "/health").status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.25)
                if proc.poll() is None and time.monotonic() <= deadline:
                    r = client.post(url + "/completion", json={"prompt": "llama.cpp serves", "n_predict": 4,
                                                                "temperature": 0, "cache_prompt": False})
                    if r.status_code == 200:
                        content = r.json().get("content", "")
                        s.log(f"verify: {r.json().get('tokens_predicted')} tokens: {content!r}")
                        return content
                    s.log(f"verify: HTTP {r.status_code}: {r.text[:500]}")
        finally:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, 15)
                    proc.wait(timeout=15)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    os.killpg(proc.pid, 9)
                    proc.wait()
    lines = log.read_text(errors="replace").splitlines()
    s.log("\n".join(lines[-40:]))
    why = next((line.strip() for line in reversed(lines) if "error" in line.lower()), lines[-1] if lines else "(no output)")
    raise s.fail(step, f"llama-server did not serve {gguf.name}: {why}")
