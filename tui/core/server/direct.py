"""An answer stream sent straight to StreamingTransport.exchange, without httpx's Request and Response.

httpx.Request and httpx.Response cost about 50 us an answer here (header objects built, copied and
normalised; a 1,204-request soak on the reference server, 2026-12-06: Request.__init__ 34 us,
Response.__init__ 14 us), for a request head that is the same bytes every time but for two values. So the
head is built once per endpoint from the request httpx would send (the same header lines in the same order:
tests/server/test_direct.py compares the bytes), and each answer adds its X-Request-Id and Content-Length.
The response is a small Answer with what OpenAIClient reads of an httpx.Response: status_code, headers
(the dict httpx's headers make: names lower-cased, repeated ones joined by ", "), extensions[CLOCK], the
body stream and aread().
"""

from __future__ import annotations

import httpx

from .transport import CLOCK, StreamingTransport, _Body, request_head

REQUEST_ID_HEADER = "X-Request-Id"


def header_dict(raw: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """dict(httpx.Headers(raw)): names lower-cased, values of a repeated name joined with ", ", decoded as
    ASCII, else UTF-8, else ISO-8859-1 (httpx's Headers.encoding: one encoding for all of them)."""
    for encoding in ("ascii", "utf-8", "iso-8859-1"):      # the first that decodes every name and value
        out: dict[str, str] = {}
        try:
            for name, value in raw:
                key, text = name.decode(encoding).lower(), value.decode(encoding)
                out[key] = f"{out[key]}, {text}" if key in out else text
        except UnicodeDecodeError:
            continue
        return out
    raise AssertionError("ISO-8859-1 decodes any byte")


class StreamHead:
    """The fixed part of one endpoint's answer requests: what httpx would send for a POST of JSON to `url`
    with the client's `headers`, up to (not including) its X-Request-Id and Content-Length lines."""

    __slots__ = ("key", "prefix", "url")

    def __init__(self, url: httpx.URL, headers: httpx.Headers):
        self.url = url
        self.key = (url.host, url.port or 80)
        probe = httpx.Request("POST", url, headers=headers, content=b"{}")
        self.prefix = request_head("POST", url.raw_path, [(name, value) for name, value in probe.headers.raw
                                                           if name.lower() != b"content-length"])

    def request(self, content: bytes, request_id: str | None) -> bytes:
        """The whole request: head and JSON body."""
        named = b"" if request_id is None else b"%s: %s\r\n" % (REQUEST_ID_HEADER.encode("ascii"),
                                                                 request_id.encode("ascii"))
        return b"%s%sContent-Length: %d\r\n\r\n%s" % (self.prefix, named, len(content), content)


def plain_request_id(request_id: str | None) -> bool:
    """Can the id go on the head as it is (printable ASCII)? Anything else goes through httpx, which says why not."""
    return request_id is None or (request_id.isascii() and request_id.isprintable())


class _Sent:
    """The request as httpx's errors name it (their `request`), without building an httpx.Request."""

    __slots__ = ("method", "url")

    def __init__(self, url: httpx.URL):
        self.method, self.url = "POST", url


class Answer:
    """The response to one answer request, as OpenAIClient reads it (see the module's note)."""

    __slots__ = ("status_code", "headers", "extensions", "stream")

    def __init__(self, body: _Body):
        self.status_code = body.response.status
        self.headers = header_dict(body.response.headers)
        self.extensions = {CLOCK: body.clock}
        self.stream = body

    async def aread(self) -> bytes:
        return b"".join([part async for part in self.stream])


class DirectStream:
    """`async with`: the Answer to one request, its body closed on the way out (the connection given back,
    or dropped when the body was not read to its end)."""

    __slots__ = ("transport", "head", "data", "timeouts", "fresh", "answer")

    def __init__(self, transport: StreamingTransport, head: StreamHead, data: bytes, timeouts: dict, fresh: bool):
        self.transport, self.head, self.data, self.timeouts, self.fresh = transport, head, data, timeouts, fresh
        self.answer: Answer | None = None

    async def __aenter__(self) -> Answer:
        body = await self.transport.exchange(self.head.key, self.data, self.timeouts, self.fresh,
                                             _Sent(self.head.url))
        self.answer = Answer(body)
        return self.answer

    async def __aexit__(self, *exc) -> None:
        await self.answer.stream.aclose()
