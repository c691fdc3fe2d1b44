"""A real gateway for the tests: Debian's nginx as a reverse proxy on loopback (issue 26).

Started as a subprocess (`daemon off;`, `nginx -c CONF -p PREFIX -e ERRLOG`) with everything it
writes (pid, logs, temp files) under a temporary folder, on a free port, in its common settings:
keep-alive to the upstream (`upstream { keepalive 8; }`, `proxy_http_version 1.1`, an empty
`Connection` header) and `proxy_buffering` on or off. `drop="usage"` makes it drop the usage of every
answer (a `sub_filter` that renames the `"usage":` key, so the final chunk carries none), as a
gateway rewriting streamed answers can; `drop="cached"` only the per-request cached tokens (it
renames `"prompt_tokens_details":`), so hits are proven by the server's counter; `hide_metrics`
answers /metrics with 404.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import urllib.parse
from pathlib import Path

import httpx

from tui.core.server.launch import free_port

CONF = """daemon off;
worker_processes 1;
{user}
pid {prefix}/nginx.pid;
error_log {prefix}/logs/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log {prefix}/logs/access.log;
    client_body_temp_path {prefix}/temp/body;
    proxy_temp_path {prefix}/temp/proxy;
    fastcgi_temp_path {prefix}/temp/fastcgi;
    uwsgi_temp_path {prefix}/temp/uwsgi;
    scgi_temp_path {prefix}/temp/scgi;
    client_max_body_size 64m;
    client_body_buffer_size 64m;
    upstream backend {{
        server {upstream};
        keepalive 8;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_buffering {buffering};
            proxy_read_timeout 900s;
            proxy_send_timeout 900s;
{extra}        }}
{metrics}    }}
}}
"""
DROP = """            proxy_set_header Accept-Encoding "";
            sub_filter_types text/event-stream application/json;
            sub_filter_once off;
            sub_filter '"{key}":' '"{key}_dropped_by_the_gateway":';
"""
KEYS = {"usage": "usage", "cached": "prompt_tokens_details"}
HIDE_METRICS = """        location = /metrics { return 404; }
"""


def available() -> bool:
    return shutil.which("nginx") is not None


class Nginx:
    def __init__(self, upstream: str, *, buffering: bool = True, drop: str = "", hide_metrics: bool = False):
        assert drop in ("", *KEYS)
        parsed = urllib.parse.urlsplit(upstream)
        self.upstream = parsed.netloc
        self.buffering = buffering
        self.drop = drop
        self.hide_metrics = hide_metrics
        self.prefix = Path(tempfile.mkdtemp(prefix="hitproof-nginx-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: asyncio.subprocess.Process | None = None

    def config(self) -> str:
        return CONF.format(
            user="user root;" if os.geteuid() == 0 else "", prefix=self.prefix, upstream=self.upstream,
            port=self.port, buffering="on" if self.buffering else "off",
            extra=DROP.format(key=KEYS[self.drop]) if self.drop else "",
            metrics=HIDE_METRICS if self.hide_metrics else "")

    async def start(self, timeout: float = 15.0) -> "Nginx":
        for sub in ("logs", "temp"):
            (self.prefix / sub).mkdir(parents=True, exist_ok=True)
        conf = self.prefix / "nginx.conf"
        conf.write_text(self.config(), encoding="utf-8")
        self.proc = await asyncio.create_subprocess_exec(
            shutil.which("nginx") or "nginx", "-c", str(conf), "-p", str(self.prefix),
            "-e", str(self.prefix / "logs" / "error.log"),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        deadline = asyncio.get_running_loop().time() + timeout
        async with httpx.AsyncClient(trust_env=False) as http:
            while True:
                if self.proc.returncode is not None:
                    raise RuntimeError(f"nginx exited {self.proc.returncode}: {self.errors()}")
                try:
                    response = await http.get(self.url + "/v1/models", timeout=2.0)
                    if response.status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
                if asyncio.get_running_loop().time() > deadline:
                    await self.close()
                    raise RuntimeError(f"nginx did not answer on {self.url}: {self.errors()}")
                await asyncio.sleep(0.1)

    def errors(self) -> str:
        path = self.prefix / "logs" / "error.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def requests(self) -> list[str]:
        path = self.prefix / "logs" / "access.log"
        return path.read_text(errors="replace").splitlines() if path.exists() else []

    async def close(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()                    # SIGTERM: nginx's fast shutdown
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except asyncio.TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        self.proc = None
        shutil.rmtree(self.prefix, ignore_errors=True)
