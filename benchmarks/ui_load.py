"""UI under load: the Textual app (headless driver) fed by a synthetic soak of 64 slots streaming
2,000 chunks a second in total.

    python benchmarks/ui_load.py --seconds 10 [--slots 64 --rate 2000 --frame-rate N] [--no-app] [--idle]

A synthetic Source emits RequestStarted, one AnswerDelta per chunk (2,000 a second: harsher than a
live run, where the Requester coalesces deltas to at most 10 a second per request), RequestFinished
with its checks, a metrics sample a second and a finding now and then. Prints one JSON object:

  frames          screen updates (the compositor's output, rendered to ANSI as a terminal would get it)
  interval_p50/p95/max   seconds between screen updates
  lag_p95/max     how late a 10 ms timer fires: what a key press would wait for
  frame_cost_p95  seconds per frame spent folding events, updating widgets and compositing
  cpu             process CPU time / wall time while the load runs (all threads)

--no-app runs the same source into a listener that drops the events: the baseline CPU.
--idle runs the app with no load: the baseline frame interval.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tui.core.log import events as ev

WORDS = [" pallet", " invoice", " the", " ledger", " was", " reconciled", " on", " Tuesday", " by", " night", "."]
CHUNKS_PER_ANSWER = 120


def code_of(i: int) -> str:
    return f"{1000 + i * 7:04d}-{2000 + i * 11:04d}-{3000 + i * 13:04d}"


class SyntheticSoak:
    """A Source: `rate` chunks a second over `slots` slots for `seconds`, through an EventBus."""

    live = True

    def __init__(self, slots: int, rate: float, seconds: float, idle: bool = False):
        self.slots, self.rate, self.seconds, self.idle = slots, rate, seconds, idle
        self.started = self.finished = 0.0
        self.chunks = 0

    async def run(self, app) -> int | None:
        await self.drive(app.feed)
        return None

    async def drive(self, listener) -> None:
        bus = ev.EventBus()
        bus.subscribe(listener)
        emit = bus.emit
        emit(ev.RunHeader(run_id="ui-load", nonce="uiload00", scenario={"name": "ui-load"},
                          target={"url": "http://127.0.0.1:0"}))
        emit(ev.ServerInfo(url="http://127.0.0.1:0", dialect="vllm", version="synthetic", model="m", grid=16,
                           grid_source="server"))
        for s in range(self.slots):
            emit(ev.MemoPlanted(memo=f"m{s:02d}", phase="rotation", code=code_of(s), tokens=1200, grid=16))
        emit(ev.PhaseStarted(phase="rotation", title="rotation", slots=self.slots, rounds=10 ** 6,
                             planned_requests=10 ** 6))
        loop = asyncio.get_running_loop()
        request = 0
        current: list[int] = [0] * self.slots
        texts: list[list[str]] = [[] for _ in range(self.slots)]

        def start(slot: int, round_: int) -> None:
            nonlocal request
            request += 1
            current[slot] = request
            texts[slot] = []
            memo = (slot + round_) % self.slots
            emit(ev.RequestStarted(request=request, phase="rotation", slot=slot, round=round_, memo=f"m{memo:02d}",
                                   code=code_of(memo), task="recall", expect="hit", prompt_chars=5000,
                                   prompt_tail="Question: what is the reconciliation code?", max_tokens=CHUNKS_PER_ANSWER))

        def finish(slot: int, round_: int) -> None:
            memo = (slot + round_) % self.slots
            text = "".join(texts[slot]) + " " + code_of(memo)
            emit(ev.RequestFinished(request=current[slot], phase="rotation", slot=slot, round=round_, text=text,
                                    prompt_tokens=1240, cached_tokens=1232, ttft=0.05, total=2.0, output_tokens=121,
                                    finish_reason="length",
                                    checks={"recall": {"status": "exact", "offset": len(text) - 14, "matched": code_of(memo)},
                                            "foreign": [], "empty": False, "repetition": None, "wrong_task": None}))
            if current[slot] % 997 == 0:
                emit(ev.Finding(kind="wrong_task", severity="warn", phase="rotation", slot=slot, round=round_,
                                request=current[slot], offset=3, detail="synthetic finding"))

        rounds = [0] * self.slots
        for s in range(self.slots):
            start(s, 0)
        self.started = loop.time()
        next_metrics = self.started
        sent = 0
        cursor = 0
        while True:
            await asyncio.sleep(0.01)
            now = loop.time()
            if now - self.started >= self.seconds:
                break
            if self.idle:
                continue
            due = int((now - self.started) * self.rate) - sent
            for _ in range(due):
                slot = cursor % self.slots
                cursor += 1
                word = WORDS[sent % len(WORDS)]
                texts[slot].append(word)
                emit(ev.AnswerDelta(request=current[slot], text=word))
                sent += 1
                if len(texts[slot]) >= CHUNKS_PER_ANSWER:
                    finish(slot, rounds[slot])
                    rounds[slot] += 1
                    start(slot, rounds[slot])
            if now >= next_metrics:
                next_metrics += 1.0
                emit(ev.MetricsSample(values={"vllm:prefix_cache_hits_total": request * 1100.0,
                                              "vllm:prefix_cache_queries_total": request * 1200.0,
                                              "vllm:num_requests_running": float(self.slots)}))
        self.finished = loop.time()
        self.chunks = sent

    async def isolate(self, request: int, kind: str | None) -> bool:
        return False

    def set_paused(self, paused: bool) -> None:
        pass


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def lag_probe(samples: list[float], stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        due = loop.time() + 0.01
        await asyncio.sleep(0.01)
        samples.append(max(0.0, loop.time() - due))


async def with_app(args) -> dict:
    from textual.screen import Screen

    from tui.app.app import build_app

    source = SyntheticSoak(args.slots, args.rate, args.seconds, idle=args.idle)
    app = build_app(source, frame_rate=args.frame_rate)
    displays: list[float] = []
    costs: list[float] = []
    original_display = app._display
    original_draw = app.draw_frame
    original_refresh = Screen._compositor_refresh
    original_layout = Screen._refresh_layout
    layouts = [0]

    def refresh_layout(screen, *args, **kwargs):
        layouts[0] += 1
        return original_layout(screen, *args, **kwargs)
    pending_cost = [0.0]
    parts = {"draw": 0.0, "compose": 0.0, "ansi": 0.0}

    def draw_frame() -> None:
        t = time.perf_counter()
        original_draw()
        spent = time.perf_counter() - t
        pending_cost[0] += spent
        parts["draw"] += spent

    def compositor_refresh(screen) -> None:
        t = time.perf_counter()
        original_refresh(screen)
        spent = time.perf_counter() - t
        pending_cost[0] += spent
        parts["compose"] += spent

    def display(screen, update) -> None:
        # headless skips the terminal: render the update to ANSI anyway, as a terminal would get it
        t = time.perf_counter()
        if update is not None and hasattr(update, "render_segments"):
            update.render_segments(app.console)
        spent = time.perf_counter() - t
        pending_cost[0] += spent
        parts["ansi"] += spent
        displays.append(time.perf_counter())
        costs.append(pending_cost[0])
        pending_cost[0] = 0.0
        original_display(screen, update)

    app._display = display
    app.draw_frame = draw_frame
    Screen._compositor_refresh = compositor_refresh
    Screen._refresh_layout = refresh_layout
    lags: list[float] = []
    stop = asyncio.Event()
    try:
        async with app.run_test(size=(160, 50)) as pilot:
            await pilot.pause(0.5)                   # start-up is not part of the load
            probe = asyncio.get_running_loop().create_task(lag_probe(lags, stop))
            displays.clear()
            costs.clear()
            layouts[0] = 0
            parts.update(draw=0.0, compose=0.0, ansi=0.0)
            cpu = time.process_time()
            wall = time.perf_counter()
            while source.finished == 0.0:
                await asyncio.sleep(0.05)
            wall = time.perf_counter() - wall
            cpu = time.process_time() - cpu
            stop.set()
            await probe
            await pilot.press("q")
    finally:
        Screen._compositor_refresh = original_refresh
        Screen._refresh_layout = original_layout
    intervals = [b - a for a, b in zip(displays, displays[1:])]
    return {"mode": "idle" if args.idle else "app", "frame_rate": args.frame_rate, "frames": len(displays),
            "chunks": source.chunks, "seconds": wall, "cpu": cpu / wall,
            "interval_p50": quantile(intervals, 0.5), "interval_p95": quantile(intervals, 0.95),
            "interval_max": max(intervals) if intervals else float("nan"),
            "lag_p95": quantile(lags, 0.95), "lag_max": max(lags) if lags else float("nan"),
            "frame_cost_p50": quantile(costs, 0.5), "frame_cost_p95": quantile(costs, 0.95),
            "model_requests": len(app.model.requests),
            "cpu_parts": {name: spent / wall for name, spent in parts.items()}, "layouts": layouts[0]}


async def without_app(args) -> dict:
    source = SyntheticSoak(args.slots, args.rate, args.seconds)
    received = [0]

    def drop(event) -> None:
        received[0] += 1

    lags: list[float] = []
    stop = asyncio.Event()
    probe = asyncio.get_running_loop().create_task(lag_probe(lags, stop))
    cpu = time.process_time()
    wall = time.perf_counter()
    await source.drive(drop)
    wall = time.perf_counter() - wall
    cpu = time.process_time() - cpu
    stop.set()
    await probe
    return {"mode": "no-app", "chunks": source.chunks, "events": received[0], "seconds": wall, "cpu": cpu / wall,
            "lag_p95": quantile(lags, 0.95), "lag_max": max(lags) if lags else float("nan")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--frame-rate", type=float, default=None, help="the app's FRAME_RATE by default")
    parser.add_argument("--no-app", action="store_true")
    parser.add_argument("--idle", action="store_true")
    args = parser.parse_args()
    if args.frame_rate is None:
        from tui.app.app import FRAME_RATE
        args.frame_rate = float(FRAME_RATE)
    result = asyncio.run(without_app(args) if args.no_app else with_app(args))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
