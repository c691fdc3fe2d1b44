"""A small HTTP/1.1 proxy on 127.0.0.1 in front of a real server (the reference server in the tests)
that breaks the server side the way real servers and networks do, at the socket level:

  status    the first `count` generation requests after `after` get HTTP `status` (429, 503) with
            `Retry-After: retry_after` (none when retry_after is None); the rest pass
  hang      generation requests after `after` are read and never answered (the connection stays open)
  reset     generation request number after+1 gets its head and first `keep` events, then a TCP reset
  no_done   every generation stream loses its `data: [DONE]` event
  cut       generation requests after `after` get their first `keep` events, then a clean end of body
            (no finish_reason, no [DONE])
  restart   at generation request after+1 the "server restarts": it is `down` seconds away (the listener
            closed, every connection dropped: connections are refused), then comes back on the same
            port in front of `spare` (a fresh server: empty cache, counters from zero). down=0: the
            switch happens between two requests, nothing fails.

Only streamed generation requests count as generation requests (the incident probe's plain
completion passes through). Every answer goes back chunked, one SSE event per chunk (as vLLM sends them); other bodies with a
content-length. Plain endpoints (/v1/models, /metrics, /tokenize, ...) always pass through.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct

import httpx

MODES = ("none", "status", "hang", "reset", "no_done", "cut", "restart")
GENERATION = ("/v1/completions", "/v1/chat/completions")


def _streamed(body: bytes) -> bool:
    try:
        return json.loads(body).get("stream") is True
    except (ValueError, AttributeError):
        return False


class FaultProxy:
    def __init__(self, upstream: str, mode: str = "none", *, after: int = 0, count: int = 1, status: int = 503,
                 retry_after: str | None = "1", keep: int = 3, spare: str | None = None, down: float = 1.0):
        assert mode in MODES, mode
        self.upstream = upstream.rstrip("/")
        self.mode, self.after, self.count, self.status, self.retry_after = mode, after, count, status, retry_after
        self.keep, self.spare, self.down = keep, spare, down
        self.generations = 0          # generation requests seen
        self.faulted = 0              # of them, how many the fault hit
        self.answered = 0             # of them, how many got a whole 200 answer
        self.restarted = False
        self.url = ""
        self.port = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self._hung: list[asyncio.Future] = []

    async def start(self) -> "FaultProxy":
        self._http = httpx.AsyncClient(timeout=120)
        await self._listen()
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if getattr(self, "_restarting", None) is not None:
            await self._restarting
        for waiter in self._hung:
            waiter.cancel()
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        await self._server.wait_closed()
        await self._http.aclose()

    # --- one connection, request after request -------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        name, _, value = line.partition(":")
                        headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                if method == "POST" and path in GENERATION and _streamed(body):
                    if not await self._generation(writer, path, headers, body):
                        return
                else:
                    await self._forward(writer, method, path, headers, body)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _upstream(self, method: str, path: str, headers: dict, body: bytes) -> httpx.Response:
        keep = {k: v for k, v in headers.items() if k in ("content-type", "authorization")}
        return await self._http.request(method, self.upstream + path, content=body or None, headers=keep)

    async def _forward(self, writer, method, path, headers, body) -> None:
        up = await self._upstream(method, path, headers, body)
        content = up.content
        head = (f"HTTP/1.1 {up.status_code} {up.reason_phrase}\r\ncontent-type: "
                f"{up.headers.get('content-type', 'application/octet-stream')}\r\n"
                f"content-length: {len(content)}\r\n\r\n").encode("latin-1")
        writer.write(head + content)
        await writer.drain()

    async def _generation(self, writer, path, headers, body) -> bool:
        """Answers one generation request; False when the connection is to go."""
        self.generations += 1
        due = self.generations > self.after
        if self.mode == "status" and due and self.faulted < self.count:
            self.faulted += 1
            error = b'{"error": {"message": "proxy: the server is busy, try again later"}}'
            retry = f"Retry-After: {self.retry_after}\r\n" if self.retry_after is not None else ""
            reason = {429: "Too Many Requests", 503: "Service Unavailable"}.get(self.status, "Error")
            writer.write((f"HTTP/1.1 {self.status} {reason}\r\ncontent-type: application/json\r\n{retry}"
                          f"content-length: {len(error)}\r\n\r\n").encode("latin-1") + error)
            await writer.drain()
            return True
        if self.mode == "hang" and due:
            self.faulted += 1
            waiter = asyncio.get_running_loop().create_future()
            self._hung.append(waiter)
            try:
                await waiter                          # until the proxy closes
            except asyncio.CancelledError:
                pass
            return False
        if self.mode == "restart" and due and not self.restarted:
            self.restarted = True
            self.faulted += 1
            self.upstream = self.spare.rstrip("/")
            if self.down > 0:
                self._server.close()                  # from now on connections are refused
                self._restarting = asyncio.get_running_loop().create_task(self._restart())
                return False                          # this request dies with the "old server"
        up = await self._upstream("POST", path, headers, body)
        if up.status_code != 200:
            writer.write((f"HTTP/1.1 {up.status_code} {up.reason_phrase}\r\ncontent-type: application/json\r\n"
                          f"content-length: {len(up.content)}\r\n\r\n").encode("latin-1") + up.content)
            await writer.drain()
            return True
        events = [e + b"\n\n" for e in up.content.split(b"\n\n") if e.strip()]
        if self.mode == "no_done":
            self.faulted += 1
            events = [e for e in events if e.strip() != b"data: [DONE]"]
        elif self.mode == "cut" and due:
            self.faulted += 1
            events = events[:self.keep]
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        reset = self.mode == "reset" and self.generations == self.after + 1
        for i, event in enumerate(events):
            if reset and i == self.keep:
                self.faulted += 1
                await writer.drain()
                await asyncio.sleep(0.05)             # the first events are read before the reset
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
                return False
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        self.answered += 1
        return True

    async def _restart(self) -> None:
        """The old server goes away (listener and connections), `down` seconds later the new one listens."""
        for writer in list(self._writers):
            writer.transport.abort()
        await self._server.wait_closed()
        await asyncio.sleep(self.down)
        await self._listen()
