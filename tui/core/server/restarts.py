"""Telling that the server restarted during a soak.

hitproof watches the process of a server it launched; a server it attached to can restart under
it (a supervisor, an operator, an out-of-memory kill and a restart). The cache is empty then, so
hits turn cold and counters reset: whatever the soak concluded from there on would be about
another server. Two signs, each enough:

- the server's counters go backwards between two scrapes of /metrics (a counter only ever grows
  while its process lives), or its process start time changes;
- after a request failed, the server refused connections for a while, then answered again.

The engine feeds every /metrics snapshot to `observe`; a restart sets `seen`, and the soak ends
(exit 3) with `message`, the log keeping every event observed before.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from .metrics import COUNTERS, MetricSnapshot, parse_metrics

# Counters known to be counters (a gauge that happens to end in _total must not pass for a restart).
WATCHED = frozenset(COUNTERS + (
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
    "sglang:prompt_tokens_total", "sglang:generation_tokens_total", "sglang:num_requests_total",
    "llamacpp:n_decode_total", "llamacpp:prompt_seconds_total", "llamacpp:tokens_predicted_seconds_total",
))
START_TIME = "process_start_time_seconds"


class RestartWatch:
    def __init__(self) -> None:
        self._counters: dict[str, float] | None = None
        self._start: float | None = None
        self.message: str | None = None
        self.seen = asyncio.Event()

    def observe(self, snapshot: MetricSnapshot | None) -> str | None:
        """Compare a scrape with the previous one; the message when it shows a restart."""
        if snapshot is None or snapshot.error is not None or not snapshot.values:
            return None
        counters = {name: value for name, value in snapshot.values.items() if name in WATCHED}
        start = snapshot.values.get(START_TIME)
        why = None
        if self._counters is not None:
            if start is not None and self._start is not None and start != self._start:
                why = f"its {START_TIME} changed from {self._start:.0f} to {start:.0f}"
            else:
                for name in sorted(counters):
                    before = self._counters.get(name)
                    if before is not None and counters[name] < before:
                        why = f"its counter {name} went back from {before:g} to {counters[name]:g}"
                        break
        self._counters, self._start = counters, start
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
        refused = False
        deadline = time.monotonic() + wait
        while True:
            try:
                response = await http.get("/metrics", timeout=2.0)
                if response.status_code != 200:
                    response = await http.get("/v1/models", timeout=2.0)
            except httpx.ConnectError:
                refused = True                      # nothing listens (or a reset at connect)
            except httpx.HTTPError:
                pass                                # it listens but does not answer: no sign either way
            else:
                if response.status_code == 200 and response.url.path.endswith("/metrics"):
                    self.observe(parse_metrics(response.text))
                if self.message is not None:
                    return self.message
                if refused:
                    self.flag("it refused connections after a failed request, then answered again")
                    return self.message
                return None
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(interval)
