"""Where the long soak's memory goes: the long soak's scenario (benchmarks/long_soak.py: the reference
server, rotation only) with `hitproof run --attach ... --headless` started in this process under
tracemalloc, and the allocation sites that grew between two snapshots written out.

    python benchmarks/soak_tracemalloc.py --minutes 12 --first 3 --second 11 --out growth.txt

A diagnostic only: tracemalloc slows the run (so fewer requests than the real soak) and stays out of
the product's normal path. The report gives, per site (by traceback, --depth frames), the bytes and
blocks added between the snapshots, and the number of requests the run made between them (counted
from the recorded log), so bytes per request can be read off. Every --every seconds the traced total
(what Python allocated and still holds) and the process's RSS go to OUT's .json: traced flat while
RSS grows means the growth is in the allocators, not in a structure that holds on. Snapshots are taken
from a thread, so a few hundred bytes of a request in flight can show up as noise.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import long_soak  # noqa: E402


def count_requests(log: Path) -> int:
    count = 0
    try:
        with open(log, "rb") as handle:
            for line in handle:
                if line.startswith(b'{"kind":"request_end"') or b'"request_end"' in line[:30]:
                    count += 1
    except FileNotFoundError:
        pass
    return count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=12.0)
    parser.add_argument("--first", type=float, default=3.0, help="minute of the first snapshot")
    parser.add_argument("--second", type=float, default=11.0, help="minute of the second snapshot")
    parser.add_argument("--depth", type=int, default=12)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--decode-ms", type=float, default=80.0)
    parser.add_argument("--out", default="soak-tracemalloc.txt")
    parser.add_argument("--every", type=float, default=60.0,
                        help="seconds between samples of traced memory and RSS (written next to --out, .json)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="hitproof-tracemalloc-"))
    scenario = folder / "long-rotation.toml"
    scenario.write_text(long_soak.SCENARIO.format(budget=args.minutes * 60))
    log = folder / "run.jsonl"
    out = Path(args.out).resolve()
    server, url = long_soak.start_refserver(args.decode_ms)
    tracemalloc.start(args.depth)
    snaps: list = []

    def take(label: str) -> None:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        path = out.with_suffix(f".{label}.snapshot")
        # dumped and dropped at once: the snapshot's own objects must not count as the run's growth
        tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)]).dump(str(path))
        snaps.append((label, time.monotonic(), count_requests(log), path, before))
        print(f"soak_tracemalloc: snapshot {label} at {time.monotonic() - started:.0f} s, "
              f"traced {before / 2**20:.2f} MB", file=sys.stderr, flush=True)

    def write_report() -> None:
        (l1, t1, r1, p1, m1), (l2, t2, r2, p2, m2) = snaps
        s1, s2 = tracemalloc.Snapshot.load(str(p1)), tracemalloc.Snapshot.load(str(p2))
        requests = max(1, r2 - r1)
        lines = [f"snapshots {l1} -> {l2}: {t2 - t1:.0f} s, {r2 - r1} requests, traced "
                 f"{m1 / 2**20:.3f} -> {m2 / 2**20:.3f} MB ({(m2 - m1) / requests:.1f} B/request)", ""]
        for key in ("lineno", "traceback"):
            lines.append(f"== by {key} ==")
            for stat in s2.compare_to(s1, key)[:args.top]:
                if stat.size_diff <= 0:
                    continue
                lines.append(f"+{stat.size_diff:9d} B {stat.count_diff:+7d} blocks "
                             f"({stat.size_diff / requests:7.2f} B/req) total {stat.size:9d} B")
                frames = stat.traceback.format(limit=args.depth if key == "traceback" else 1, most_recent_first=True)
                lines.extend("      " + f for f in frames)
            lines.append("")
        out.write_text("\n".join(lines))
        print(f"soak_tracemalloc: wrote {out}", file=sys.stderr, flush=True)

    series: list[dict] = []

    def sample() -> None:
        with open("/proc/self/status") as handle:
            rss = next(int(line.split()[1]) for line in handle if line.startswith("VmRSS:"))
        series.append({"t_s": round(time.monotonic() - started), "requests": count_requests(log),
                       "traced_mb": round(tracemalloc.get_traced_memory()[0] / 2**20, 3),
                       "rss_mb": round(rss / 1024, 2)})
        out.with_suffix(".json").write_text(json.dumps(series, indent=1) + "\n")

    def wait_until(at: float) -> None:
        while time.monotonic() < at and not finished.is_set():
            time.sleep(min(args.every, max(0.0, at - time.monotonic())))
            if time.monotonic() - started >= len(series) * args.every:
                sample()

    def watcher() -> None:
        wait_until(started + args.first * 60)
        take("first")
        wait_until(started + args.second * 60)
        take("second")
        wait_until(started + args.minutes * 60 + 120)

    finished = threading.Event()

    started = time.monotonic()
    thread = threading.Thread(target=watcher, daemon=True)
    thread.start()
    os.chdir(folder)
    os.environ["COLUMNS"] = "100"
    from tui.cli import main as cli_main
    sys.argv = ["hitproof", "run", "--attach", url, "--scenario", str(scenario), "--headless", "--record", str(log)]
    try:
        code = cli_main()
    except SystemExit as exc:
        code = exc.code
    finally:
        long_soak.stop(server)
    print(f"soak_tracemalloc: hitproof exited {code}; requests {count_requests(log)}", file=sys.stderr, flush=True)
    finished.set()
    thread.join(timeout=300)
    if len(snaps) < 2:
        print("soak_tracemalloc: the run ended before the second snapshot", file=sys.stderr)
        return 1
    tracemalloc.stop()
    write_report()
    return 0


if __name__ == "__main__":
    sys.exit(main())
