"""Replay scale: a synthetic log of SIZE MB; time to the app's first frame, to the final state,
and for `report`, each next to a baseline measured in the same run (one plain sequential read
of the file, line by line, no parsing).

    python benchmarks/replay_scale.py --mb 500
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tui.core import events as ev  # noqa: E402


def synthesize(path: Path, megabytes: float, slots: int = 4) -> int:
    """A rotation-shaped log: per request a start, ten deltas, an end; metrics; a finding now and then."""
    target = int(megabytes * 1024 * 1024)
    seq = 0
    t = 0.0

    def line(event: ev.Event) -> str:
        nonlocal seq
        seq += 1
        event.seq, event.t = seq, round(t, 3)
        return ev.encode(event) + "\n"

    codes = [f"{7000 + i * 13:04d}-{3000 + i * 17:04d}-{5000 + i * 19:04d}" for i in range(slots)]
    with open(path, "w", encoding="utf-8") as out:
        out.write(line(ev.RunHeader(run_id="synthetic", nonce="synthetic", scenario={"name": "synthetic"},
                                    target={"url": "http://127.0.0.1:0"})))
        out.write(line(ev.ServerInfo(url="http://127.0.0.1:0", dialect="vllm", version="synthetic", model="m",
                                     grid=128, grid_source="server")))
        for slot, code in enumerate(codes):
            out.write(line(ev.MemoPlanted(memo=f"m{slot}", phase="rotation", code=code, tokens=1200, grid=128,
                                          text="Memo text. " * 300)))
        out.write(line(ev.PhaseStarted(phase="rotation", title="rotation", slots=slots, rounds=10 ** 9,
                                       planned_requests=10 ** 9)))
        request = 0
        answer = " The reconciliation code is {code}. The memo goes on about pallets and invoices."
        while out.tell() < target:
            round_ = request // slots
            if request % slots == 0:
                out.write(line(ev.RoundStarted(phase="rotation", round=round_, rounds=10 ** 9)))
                out.write(line(ev.MetricsSample(values={"vllm:prefix_cache_hits_total": request * 1100.0,
                                                        "vllm:prefix_cache_queries_total": request * 1200.0})))
            slot = request % slots
            request += 1
            code = codes[(slot + round_) % slots]
            text = answer.format(code=code)
            out.write(line(ev.RequestStarted(request=request, phase="rotation", slot=slot, round=round_,
                                             memo=f"m{(slot + round_) % slots}", code=code, task="recall",
                                             expect="hit", prompt_chars=5000, prompt_tail="Question: ...")))
            for i in range(10):
                t += 0.005
                out.write(line(ev.AnswerDelta(request=request, text=text[i * 9:(i + 1) * 9])))
            out.write(line(ev.RequestFinished(request=request, phase="rotation", slot=slot, round=round_,
                                              text=text, prompt_tokens=1240, cached_tokens=1152, ttft=0.05,
                                              total=0.6, output_tokens=24, finish_reason="length",
                                              checks={"recall": {"status": "exact", "offset": 28,
                                                                 "matched": code}, "foreign": []})))
            if request % 5000 == 0:
                out.write(line(ev.Finding(kind="wrong_task", severity="warn", phase="rotation", slot=slot,
                                          round=round_, request=request, offset=1, detail="synthetic")))
        out.write(line(ev.PhaseFinished(phase="rotation", status="pass", summary={"requests": request})))
        out.write(line(ev.RunFinished(verdict="pass", exit_code=0, message="synthetic")))
    return seq


def raw_read(path: Path) -> float:
    start = time.perf_counter()
    with open(path, "rb") as handle:
        for _ in handle:
            pass
    return time.perf_counter() - start


async def app_times(path: Path) -> tuple[float, float]:
    from tui.app.app import build_app
    from tui.app.replay import ReplaySource

    start = time.perf_counter()
    app = build_app(ReplaySource(path))
    first = final = None
    async with app.run_test(size=(100, 30)) as pilot:
        while first is None or final is None:
            await pilot.pause(0.01)
            now = time.perf_counter() - start
            if first is None and app.frames >= 1:
                first = now
            if final is None and app.source.ready and app.model.finished:
                final = now
        await pilot.press("q")
    return first, final


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=500.0)
    parser.add_argument("--keep", metavar="FILE", help="write the synthetic log here and keep it")
    args = parser.parse_args()
    path = Path(args.keep) if args.keep else Path(tempfile.mkstemp(suffix=".jsonl")[1])
    try:
        events = synthesize(path, args.mb)
        size_mb = path.stat().st_size / 2 ** 20
        baseline = raw_read(path)
        first, final = asyncio.run(app_times(path))
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "tui", "report", str(path), "--format", "json"], cwd=ROOT,
                       check=True, stdout=subprocess.DEVNULL)
        report = time.perf_counter() - start
        print(f"replay scale: {size_mb:.0f} MB, {events:,} events")
        print(f"  baseline: one sequential read of the file        {baseline:7.2f} s")
        print(f"  replay: first frame                                {first:7.2f} s  ({first / baseline:5.2f}x baseline)")
        print(f"  replay: final state (index + fold, no deltas)      {final:7.2f} s  ({final / baseline:5.2f}x baseline)")
        print(f"  report --format json                               {report:7.2f} s  ({report / baseline:5.2f}x baseline)")
    finally:
        if not args.keep:
            os.unlink(path)


if __name__ == "__main__":
    main()
