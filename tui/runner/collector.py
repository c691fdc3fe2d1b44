"""The cyclic garbage collector's settings while a soak runs.

Measured on the reference server (gpu-quick at 32 streams, 1,204 requests, 2026-12-05): the collector took
0.13 s of the soak's 1.0-1.3 s of CPU, 200 young collections and one full one that walked every object
start-up had made (Textual, httpx, the scenario). Start-up's objects are frozen out of its walks
(gc.freeze: they live as long as the process anyway) and the young generation collects after 20,000
allocations instead of 700, so answers' short-lived lists are freed by their reference counts first: 0.025 s.
Garbage cycles are still collected, later; everything is restored when the soak ends, so a process that
runs several soaks (the matrix, the tests) does not keep earlier ones' objects frozen.

At 128 streams a young collection walks 26,000-59,000 objects (the answers kept for the judge and the twins,
their log-probabilities' lists) in 9-38 ms, and a soak grows by about 37 tracked objects a request: with
collections after 20,000, a 3,764-request soak on the reference server spent 148-154 ms of CPU in 7 of them
(gc.callbacks, gpu-quick --streams 128, 2026-12-06), about 4% of hitproof's; after 100,000, one, 32-67 ms
(35-38 against 95-118 ms in 1,716-request soaks). Cyclic garbage waits longer: a few MB at most."""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator

SOAK_THRESHOLDS = (100_000, 20, 20)
_depth = 0                          # soaks running in this process (the matrix runs several at once)
_saved: tuple[int, int, int] | None = None


@contextlib.contextmanager
def soak_collector() -> Iterator[None]:
    global _depth, _saved
    if _depth == 0:
        _saved = gc.get_threshold()
        gc.freeze()
        gc.set_threshold(*SOAK_THRESHOLDS)
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            gc.set_threshold(*_saved)
            gc.unfreeze()
