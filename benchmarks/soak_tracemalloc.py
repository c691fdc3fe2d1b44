"""Where the long soak's memory goes: the long soak's scenario (benchmarks/long_soak.py: the reference
server, rotation only) with `hitproof run --attach ... --headless` started in this process under
tracemalloc, and the allocation sites that grew between two snapshots written out.

    python benchmarks/soak_tracemalloc.py --minutes 12 --first 3 --second 11 --out growth.txt

A diagnostic only: tracemalloc slows the run (so fewer requests than the real soak) and stays out of
the product's normal path. The report gives, per site (by traceback, --depth frames), the bytes and
blocks added between the snapshots, and the number of requests the run made between them (counted
from the recorded log), so bytes per request can be read off.
"""

from __future__ import annotations

import argparse
import gc
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
        snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        snaps.append((label, time.monotonic(), count_requests(log), snap, tracemalloc.get_traced_memory()))
        print(f"soak_tracemalloc: snapshot {label} at {time.monotonic() - started:.0f} s, "
              f"traced {tracemalloc.get_traced_memory()[0] / 2**20:.2f} MB", file=sys.stderr, flush=True)
        if len(snaps) == 2:
            write_report()

    def write_report() -> None:
        (l1, t1, r1, s1, m1), (l2, t2, r2, s2, m2) = snaps
        requests = max(1, r2 - r1)
        lines = [f"snapshots {l1} -> {l2}: {t2 - t1:.0f} s, {r2 - r1} requests, traced "
                 f"{m1[0] / 2**20:.3f} -> {m2[0] / 2**20:.3f} MB ({(m2[0] - m1[0]) / requests:.1f} B/request)", ""]
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

    def watcher() -> None:
        time.sleep(max(0.0, started + args.first * 60 - time.monotonic()))
        take("first")
        time.sleep(max(0.0, started + args.second * 60 - time.monotonic()))
        take("second")

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
    thread.join(timeout=600 if len(snaps) else 0)      # the report is written from the watcher thread
    if len(snaps) < 2:
        print("soak_tracemalloc: the run ended before the second snapshot", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
