"""Replay scale: a synthetic log of SIZE MB; time to the app's first frame, to the final state,
and for `report`, each next to a baseline measured in the same run (one plain sequential read
of the file, line by line, no parsing).

    python benchmarks/replay_scale.py --mb 500 [--json] [--keep FILE]

The log is rotation-shaped: per request a start, ten deltas and an end with its checks, a round
and a metrics sample per round of four, a finding every 5,000 requests. Every line is what the
recorder writes (the events are encoded once, then stamped into templates, so 500 MB take
seconds to write, not minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tui.core.log import events as ev

SLOTS = 4
# sentinels stamped into the encoded events, then replaced by format fields
_SEQ, _T, _REQ, _ROUND, _HITS, _QUERIES = 918273001, 918273.002, 918273003, 918273004, 918273005.0, 918273006.0


def _template(event: ev.Event) -> str:
    event.seq, event.t = _SEQ, _T
    line = ev.encode(event) + "\n"
    line = line.replace("%", "%%")
    for sentinel, field in ((repr(_T), "%(t)s"), (repr(_HITS), "%(hits)s"), (repr(_QUERIES), "%(queries)s"),
                            (str(_SEQ), "%(seq)d"), (str(_REQ), "%(request)d"), (str(_ROUND), "%(round)d")):
        line = line.replace(sentinel, field)
    return line


def synthesize(path: Path, megabytes: float) -> int:
    target = int(megabytes * 1024 * 1024)
    codes = [f"{7000 + i * 13:04d}-{3000 + i * 17:04d}-{5000 + i * 19:04d}" for i in range(SLOTS)]
    answer = " The reconciliation code is {code}. The memo goes on about pallets and invoices."
    round_line = _template(ev.RoundStarted(phase="rotation", round=_ROUND, rounds=10 ** 9))
    metrics_line = _template(ev.MetricsSample(values={"vllm:prefix_cache_hits_total": _HITS,
                                                      "vllm:prefix_cache_queries_total": _QUERIES}))
    finding_line = _template(ev.Finding(kind="wrong_task", severity="warn", phase="rotation", slot=0, round=_ROUND,
                                        request=_REQ, offset=1, detail="synthetic"))
    # per (slot, memo): the start, the ten deltas and the end, as templates
    per_request: dict[tuple[int, int], list[str]] = {}
    for slot in range(SLOTS):
        for memo in range(SLOTS):
            code = codes[memo]
            text = answer.format(code=code)
            lines = [_template(ev.RequestStarted(request=_REQ, phase="rotation", slot=slot, round=_ROUND,
                                                 memo=f"m{memo}", code=code, task="recall", expect="hit",
                                                 prompt_chars=5000, prompt_tail="Question: ..."))]
            lines += [_template(ev.AnswerDelta(request=_REQ, text=text[i * 9:(i + 1) * 9])) for i in range(10)]
            lines.append(_template(ev.RequestFinished(
                request=_REQ, phase="rotation", slot=slot, round=_ROUND, text=text, prompt_tokens=1240,
                cached_tokens=1152, ttft=0.05, total=0.6, output_tokens=24, finish_reason="length",
                checks={"recall": {"status": "exact", "offset": 28, "matched": code}, "foreign": []})))
            per_request[slot, memo] = lines
    seq = 0
    t = 0.0

    def stamp(template: str, **fields) -> str:
        nonlocal seq
        seq += 1
        return template % dict(fields, seq=seq, t=repr(round(t, 3)))

    with open(path, "w", encoding="utf-8") as out:
        out.write(stamp(_template(ev.RunHeader(run_id="synthetic", nonce="synthetic", scenario={"name": "synthetic"},
                                               target={"url": "http://127.0.0.1:0"}))))
        out.write(stamp(_template(ev.ServerInfo(url="http://127.0.0.1:0", dialect="vllm", version="synthetic",
                                                model="m", grid=128, grid_source="server"))))
        for memo, code in enumerate(codes):
            out.write(stamp(_template(ev.MemoPlanted(memo=f"m{memo}", phase="rotation", code=code, tokens=1200,
                                                     grid=128, text="Memo text. " * 300))))
        out.write(stamp(_template(ev.PhaseStarted(phase="rotation", title="rotation", slots=SLOTS, rounds=10 ** 9,
                                                  planned_requests=10 ** 9))))
        request = 0
        written = out.tell()
        while written < target:
            round_ = request // SLOTS
            block = [stamp(round_line, round=round_),
                     stamp(metrics_line, hits=repr(request * 1100.0), queries=repr(request * 1200.0))]
            for slot in range(SLOTS):
                request += 1
                for line in per_request[slot, (slot + round_) % SLOTS]:
                    t += 0.005
                    block.append(stamp(line, request=request, round=round_))
                if request % 5000 == 0:
                    block.append(stamp(finding_line, request=request, round=round_))
            chunk = "".join(block)
            out.write(chunk)
            written += len(chunk)
        out.write(stamp(_template(ev.PhaseFinished(phase="rotation", status="pass", summary={"requests": request}))))
        out.write(stamp(_template(ev.RunFinished(verdict="pass", exit_code=0, message="synthetic"))))
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


def measure(path: Path) -> dict:
    baseline = raw_read(path)
    first, final = asyncio.run(app_times(path))
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tui", "report", str(path), "--format", "json"], cwd=ROOT,
                   check=True, stdout=subprocess.DEVNULL)
    report = time.perf_counter() - start
    return {"baseline_read_s": baseline, "first_frame_s": first, "final_state_s": final, "report_s": report}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=500.0)
    parser.add_argument("--keep", metavar="FILE", help="write the synthetic log here and keep it")
    parser.add_argument("--log", metavar="FILE", help="measure this log instead of writing one")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = parser.parse_args()
    if args.log:
        path, events, synth = Path(args.log), None, 0.0
    else:
        path = Path(args.keep) if args.keep else Path(tempfile.mkstemp(suffix=".jsonl")[1])
    try:
        if not args.log:
            start = time.perf_counter()
            events = synthesize(path, args.mb)
            synth = time.perf_counter() - start
        result = {"mb": path.stat().st_size / 2 ** 20, "events": events, "synthesis_s": synth, **measure(path)}
        if args.json:
            print(json.dumps(result))
            return
        baseline = result["baseline_read_s"]
        print(f"replay scale: {result['mb']:.0f} MB, {events or 0:,} events (written in {synth:.1f} s)")
        print(f"  baseline: one sequential read of the file        {baseline:7.2f} s")
        for key, label in (("first_frame_s", "replay: first frame"),
                           ("final_state_s", "replay: final state (index + fold, no deltas)"),
                           ("report_s", "report --format json")):
            print(f"  {label:<50} {result[key]:7.2f} s  ({result[key] / baseline:5.2f}x baseline)")
    finally:
        if not args.keep and not args.log:
            os.unlink(path)


if __name__ == "__main__":
    main()
