"""Memory: a synthetic run of N requests through everything that lives as long as the run, with
resident memory sampled as it goes.

    python benchmarks/memory.py --requests 100000

The process has the app, the engine and the HTTP client loaded, as a live run does. Each request
is what a rotation soak emits: request_start, ten answer deltas, request_end with its
checks, a metrics sample every 16 requests, a finding every 500. The events go through an
EventBus to what a live run keeps: the app's RunModel (which holds the RunReport the summary is
built from; a headless run keeps the same RunReport) and the JSONL Recorder (its queue drains as
it writes). RSS is read from /proc/self/statm after a gc every 1,000 requests; the
warm-up is the first 10% (by then the app's window of 4,000 kept requests is full). Prints one
JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# what a live `hitproof run` process has loaded (the app, the engine, the HTTP client): the base
# the growth is measured against is that process's, not a bare interpreter's
import tui.app.app  # noqa: E402,F401
import tui.runner  # noqa: E402,F401
from tui.app.model import RunModel  # noqa: E402
from tui.core.log import events as ev
from tui.core.log.recorder import Recorder  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")
SLOTS = 4


def rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * PAGE / 2 ** 20


def code_of(i: int) -> str:
    return f"{1000 + i * 7:04d}-{2000 + i * 11:04d}-{3000 + i * 13:04d}"


async def run(requests: int, sample_every: int = 1000) -> dict:
    bus = ev.EventBus()
    model = RunModel()
    report = model.report
    path = Path(tempfile.mkstemp(suffix=".jsonl")[1])
    recorder = Recorder(path)
    await recorder.start()
    for listener in (model.apply, recorder):
        bus.subscribe(listener)
    emit = bus.emit
    emit(ev.RunHeader(run_id="memory", nonce="memory00", scenario={"name": "memory"}, target={"url": "x"}))
    emit(ev.ServerInfo(url="x", dialect="vllm", version="synthetic", model="m", grid=16, grid_source="server"))
    for s in range(SLOTS):
        emit(ev.MemoPlanted(memo=f"m{s}", phase="rotation", code=code_of(s), tokens=1200, grid=16,
                            text="Memo text. " * 100))
    emit(ev.PhaseStarted(phase="rotation", title="rotation", slots=SLOTS, rounds=requests // SLOTS,
                         planned_requests=requests))
    samples: list[tuple[int, float]] = []
    started = time.perf_counter()
    for rid in range(1, requests + 1):
        slot = (rid - 1) % SLOTS
        round_ = (rid - 1) // SLOTS
        memo = (slot + round_) % SLOTS
        if slot == 0:
            emit(ev.RoundStarted(phase="rotation", round=round_, rounds=requests // SLOTS,
                                 assignment={str(s): f"m{(s + round_) % SLOTS}" for s in range(SLOTS)}))
        emit(ev.RequestStarted(request=rid, phase="rotation", slot=slot, round=round_, memo=f"m{memo}",
                               code=code_of(memo), task="recall", expect="hit", prompt_chars=5200,
                               prompt_tail="Question: what is the reconciliation code? Answer:", max_tokens=48))
        text = f" The reconciliation code is {code_of(memo)}. The memo goes on about pallets, invoices and {rid}."
        for i in range(10):
            emit(ev.AnswerDelta(request=rid, text=text[i * 10:(i + 1) * 10]))
        emit(ev.RequestFinished(request=rid, phase="rotation", slot=slot, round=round_, text=text,
                                prompt_tokens=1300, cached_tokens=1280, ttft=0.05 + rid % 7 / 1000, total=0.8,
                                output_tokens=30, finish_reason="length",
                                checks={"foreign": [], "recall": {"status": "exact", "offset": 28, "matched": code_of(memo)},
                                        "empty": False, "repetition": None, "wrong_task": None,
                                        "block_aligned": True}))
        if rid % 16 == 0:
            emit(ev.MetricsSample(values={"vllm:prefix_cache_hits_total": rid * 1280.0,
                                          "vllm:prefix_cache_queries_total": rid * 1300.0,
                                          "vllm:num_requests_running": 4.0}))
        if rid % 500 == 0:
            emit(ev.Finding(kind="wrong_task", severity="warn", phase="rotation", slot=slot, round=round_,
                            request=rid, offset=28, detail="synthetic finding", memo=f"m{memo}"))
        if rid % 64 == 0:
            await asyncio.sleep(0)                     # the recorder writes
        if rid % sample_every == 0:
            while not recorder._queue.empty():
                await asyncio.sleep(0)
            gc.collect()
            samples.append((rid, rss_mb()))
    seconds = time.perf_counter() - started
    await recorder.close()
    log_mb = path.stat().st_size / 2 ** 20
    path.unlink()
    warm_index = max(0, len(samples) // 10 - 1)
    warm = samples[warm_index][1]
    final = samples[-1][1]
    return {"requests": requests, "events": bus._seq, "seconds": seconds, "log_mb": log_mb,
            "warm_at": samples[warm_index][0], "rss_warm_mb": warm, "rss_final_mb": final,
            "rss_peak_mb": max(v for _, v in samples), "growth": (final - warm) / warm,
            "bytes_per_request": (final - warm) * 2 ** 20 / (requests - samples[warm_index][0]),
            "model_requests_kept": len(model.requests), "report_requests": len(report.starts),
            "report_hits": report.cache_hits(), "findings": len(report.findings),
            "samples": samples[::max(1, len(samples) // 20)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args.requests))))


if __name__ == "__main__":
    main()
