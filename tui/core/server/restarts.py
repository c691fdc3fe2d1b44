"""Telling that the server restarted during a soak, and never mistaking a late answer for a restart.

hitproof watches the process of a server it launched; a server it attached to can restart under
it (a supervisor, an operator, an out-of-memory kill and a restart). The cache is empty then, so
hits turn cold and counters reset: whatever the soak concluded from there on would be about
another server. Two signs, each enough:

- the server's process start time (`process_start_time_seconds`) changes; where the server exports
  it, it decides: a counter going back under the same start time is an old answer, not a restart.
  Without it, the server's counters going backwards between two scrapes of /metrics (a counter only
  ever grows while its process lives);
- after a request failed, the server refused connections for a while, then answered again.

Ordering cannot fake the first sign (issue 26: behind a gateway that sends each request on its own
upstream connection, two scrapes in flight came back out of order and a soak ended "restarted"):
`in_order` takes one server's scrapes one at a time, stamps each with when it was sent, and when one
shows a restart sign (or a counter gone back) it reads /metrics again at once, returning that fresh scrape; `observe` ignores
a scrape sent before one it has already judged.

The engine feeds every /metrics snapshot to `observe`; a restart sets `seen`, and the soak ends
(exit 3) with `message`, the log keeping every event observed before.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import weakref
from typing import Awaitable, Callable

import httpx

from .metrics import COUNTERS, MetricSnapshot, parse_metrics

# Counters known to be counters (a gauge that happens to end in _total must not pass for a restart).
WATCHED = frozenset(COUNTERS + (
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
    "sglang:prompt_tokens_total", "sglang:generation_tokens_total", "sglang:num_requests_total",
    "llamacpp:n_decode_total", "llamacpp:prompt_seconds_total", "llamacpp:tokens_predicted_seconds_total",
))
START_TIME = "process_start_time_seconds"


def counters(snapshot: MetricSnapshot) -> dict[str, float]:
    return {name: value for name, value in snapshot.values.items() if name in WATCHED}


def counter_back(before: MetricSnapshot, after: MetricSnapshot) -> str | None:
    """The first watched counter (by name) lower in `after` than in `before`, in words; None if none."""
    now = counters(after)
    for name, value in sorted(counters(before).items()):
        if name in now and now[name] < value:
            return f"its counter {name} went back from {value:g} to {now[name]:g}"
    return None


def restart_sign(before: MetricSnapshot, after: MetricSnapshot) -> str | None:
    """Why `after` (scraped later) says the server restarted since `before`, or None. The process start
    time decides where both carry it; otherwise a watched counter that went back."""
    start, was = after.values.get(START_TIME), before.values.get(START_TIME)
    if start is not None and was is not None:
        return None if start == was else f"its {START_TIME} changed from {was:.0f} to {start:.0f}"
    return counter_back(before, after)


def _usable(snapshot: MetricSnapshot | None) -> bool:
    return snapshot is not None and snapshot.error is None and bool(snapshot.values)


class _Line:
    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.last: MetricSnapshot | None = None


_LINES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


async def in_order(server: object, fetch: Callable[[], Awaitable[MetricSnapshot | None]]) -> MetricSnapshot | None:
    """`fetch()` (one scrape of /metrics) for `server` (its client: the key of its line), never two in
    flight at once, stamped with when it was sent. A scrape showing a restart sign or a counter gone back
    against the last one is read again at once and the fresh scrape returned: a reply that came late (a
    gateway's cached copy) says nothing of now, and counter windows must not take deltas from it."""
    line = _LINES.get(server)
    if line is None:
        line = _LINES[server] = _Line()
    async with line.lock:
        sent = time.monotonic_ns()
        snapshot = await fetch()
        if _usable(snapshot) and _usable(line.last) and (counter_back(line.last, snapshot) is not None
                                                         or restart_sign(line.last, snapshot) is not None):
            sent = time.monotonic_ns()
            snapshot = await fetch()
        if snapshot is not None:
            snapshot = dataclasses.replace(snapshot, sent=sent)
        if _usable(snapshot):
            line.last = snapshot
        return snapshot


class RestartWatch:
    def __init__(self) -> None:
        self._last: MetricSnapshot | None = None
        self.message: str | None = None
        self.seen = asyncio.Event()

    def observe(self, snapshot: MetricSnapshot | None) -> str | None:
        """Compare a scrape with the latest one judged; the message when it shows a restart. A scrape sent
        before that one is ignored; under an unchanged process start time, so is a counter gone back."""
        if not _usable(snapshot):
            return None
        last = self._last
        if last is not None and snapshot.sent is not None and last.sent is not None and snapshot.sent < last.sent:
            return None                                     # an older answer that arrived late
        why = restart_sign(last, snapshot) if last is not None else None
        if why is None and last is not None and counter_back(last, snapshot) is not None:
            return None               # the same process start time, counters behind: an older answer, not news
        self._last = snapshot
        if why is not None:
            self.flag(why)
        return why

    def flag(self, why: str) -> None:
        if self.message is None:
            self.message = f"the server restarted during the soak ({why}); the soak ends here"
        self.seen.set()

    async def confirm(self, client, wait: float = 10.0, interval: float = 0.25) -> str | None:
        """After a request failed: did the server restart? Probes /metrics (else /v1/models) for up
        to `wait` seconds. A restart: counters gone back, or connections refused and then accepted
        again. None: the server answers as before (the failure stands as it is), or never again."""
        if self.message is not None:
            return self.message
        http: httpx.AsyncClient = client._http

        async def fetch() -> MetricSnapshot | None:
            response = await http.get("/metrics", timeout=2.0)
            if response.status_code == 200:
                return parse_metrics(response.text)
            await http.get("/v1/models", timeout=2.0)
            return None

        refused = False
        deadline = time.monotonic() + wait
        while True:
            try:
                snapshot = await in_order(client, fetch)
            except httpx.ConnectError:
                refused = True                      # nothing listens (or a reset at connect)
            except httpx.HTTPError:
                pass                                # it listens but does not answer: no sign either way
            else:
                self.observe(snapshot)
                if self.message is not None:
                    return self.message
                if refused:
                    self.flag("it refused connections after a failed request, then answered again")
                    return self.message
                return None
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(interval)
