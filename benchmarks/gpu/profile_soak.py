"""Where hitproof's CPU goes during a soak, by function, from its first request to its run's end (issue 34).

    python3 benchmarks/gpu/profile_soak.py --out DIR -- run --attach http://127.0.0.1:8321 \\
        --scenario scenarios/gpu-quick.toml --streams 32 --power 0.3% --headless --record DIR/soak.jsonl

Runs the hitproof command line given after `--` in this process, with cProfile on from the first request's
RequestStarted event to the RunFinished event (start-up and the report after it left out, as rate.py's steady
figures leave them out). Writes DIR/soak.prof (pstats) and DIR/summary.txt, and prints the summary: profiled
CPU outside the event loop's waits, by package or folder of tui/; the tui functions by cumulative time; every
function by its own time. The profiler slows call-heavy code more than the rest: its figures say where the
time goes, not how long a request takes (rate.py does). Exit: hitproof's own code; 3 when no request ran.

Run I's last call on a GPU showed with this (as a copy outside the tree) that the twin lineages' record scans
and prometheus_client's /metrics parser were 59% of hitproof's CPU (benchmarks/RESULTS.md, run I)."""

from __future__ import annotations

import argparse
import cProfile
import collections
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

TOP = 40
BLOCKING = ("poll", "select", "'acquire' of '_thread.lock'", "'get' of '_queue.SimpleQueue'")


def profile(hitproof_argv: list[str], prof: Path) -> tuple[int, dict]:
    from tui.cli import main as hitproof
    from tui.core.log.events import EventBus, RequestStarted, RunFinished

    profiler = cProfile.Profile()
    window: dict = {"requests": 0}
    emit = EventBus.emit

    def emit_profiled(self, event):
        if isinstance(event, RequestStarted):
            window["requests"] += 1
            if "cpu_start" not in window:
                window["cpu_start"], window["wall_start"] = time.process_time(), time.monotonic()
                profiler.enable()
        out = emit(self, event)
        if isinstance(event, RunFinished) and "cpu_end" not in window and "cpu_start" in window:
            profiler.disable()
            window["cpu_end"], window["wall_end"] = time.process_time(), time.monotonic()
        return out

    EventBus.emit = emit_profiled
    try:
        code = hitproof(hitproof_argv)
    finally:
        EventBus.emit = emit
        profiler.disable()
    profiler.dump_stats(str(prof))
    return code, window


def where(filename: str) -> str:
    """A function's file as its package, or its folder of tui/ (tui/core/soak, ...)."""
    if filename == "~":
        return "builtins"
    if "site-packages/" in filename:
        return filename.split("site-packages/", 1)[1].split("/", 1)[0]
    if "/tui/" in filename:
        return "tui/" + "/".join(filename.split("/tui/", 1)[1].split("/")[:-1])
    return "stdlib " + filename.rsplit("/", 1)[-1]


def summary(prof: Path, window: dict) -> str:
    stats = pstats.Stats(str(prof)).stats
    # the loop's waits, and the log thread's (since 2823eb2 it writes from a thread of its own, which cProfile
    # sees too here: its blocking get and its lock waits are no CPU)
    waits = {key for key in stats if (key[0] == "~" and any(w in key[2] for w in BLOCKING))
             or (key[0].endswith("threading.py") and key[2] == "wait")}
    total = sum(v[2] for key, v in stats.items() if key not in waits)
    by_place: collections.Counter = collections.Counter()
    for key, (_, _, own, _, _) in stats.items():
        if key not in waits:
            by_place[where(key[0])] += own
    cpu = window.get("cpu_end", 0.0) - window.get("cpu_start", 0.0)
    lines = [f"requests {window['requests']}, CPU {cpu:.2f} s from the first request to run_end "
             f"({window.get('wall_end', 0.0) - window.get('wall_start', 0.0):.1f} s); profiled CPU outside "
             f"the loop's waits {total:.2f} s", "", "by place (own time):"]
    lines += [f"  {seconds:8.3f} s {100 * seconds / max(total, 1e-9):5.1f}%  {place}"
              for place, seconds in by_place.most_common(20)]

    def name(key) -> str:
        return f"{key[0].rsplit('/', 1)[-1]}:{key[1]} {key[2]}"

    ours = sorted(((v[3], v[1], key) for key, v in stats.items() if "/tui/" in key[0]), reverse=True)[:TOP]
    lines += ["", "tui by cumulative time (s, calls; a coroutine's every resumption is a call):"]
    lines += [f"  {seconds:8.3f} {calls:9d}  {name(key)}" for seconds, calls, key in ours]
    own = sorted(((v[2], v[1], key) for key, v in stats.items() if key not in waits), reverse=True)[:TOP]
    lines += ["", "every function by its own time (s, calls):"]
    lines += [f"  {seconds:8.3f} {calls:9d}  {name(key)}" for seconds, calls, key in own]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("profile_soak.py: give the hitproof command line after --", file=sys.stderr)
        return 2
    split = argv.index("--")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, metavar="DIR", help="where soak.prof and summary.txt go")
    args = parser.parse_args(argv[:split])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prof = out / "soak.prof"
    code, window = profile(argv[split + 1:], prof)
    if not window["requests"]:
        print(f"profile_soak.py: no request ran (hitproof exit {code}): nothing to profile", file=sys.stderr)
        return 3
    text = summary(prof, window)
    (out / "summary.txt").write_text(text)
    print(text, end="")
    return code


if __name__ == "__main__":
    sys.exit(main())
