"""A client that goes away before the answer's headers (a run stopped mid-request: a full disk, Ctrl-C)
is no error of the reference server: without that, a launched server's log showed a traceback that
hitproof reported as an engine_log finding of the phase (seen under load in test_local_faults)."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct

from tui.refserver import start_refserver


async def test_a_client_gone_before_the_headers_leaves_no_traceback(caplog):
    handle = await start_refserver(port=0)
    port = int(handle.url.rsplit(":", 1)[1])
    body = json.dumps({"model": "refmodel", "prompt": "hello there " * 50, "max_tokens": 8, "stream": True}).encode()
    request = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n" \
              b"content-length: %d\r\n\r\n%s" % (len(body), body)
    caplog.set_level(logging.ERROR)
    try:
        for i in range(60):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request)
            await writer.drain()
            await asyncio.sleep(0.0005 * (i % 6))
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))   # a reset, at once
            writer.close()
        await asyncio.sleep(0.3)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)        # and it still serves
        writer.write(request)
        answer = await asyncio.wait_for(reader.read(1 << 16), 10)
        writer.close()
    finally:
        await handle.close()
    assert answer.startswith(b"HTTP/1.1 200")
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors[0].getMessage() + "\n" + str(errors[0].exc_info)
