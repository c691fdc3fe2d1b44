"""The long soak: one `hitproof run` against the reference server for an hour, rotation only, with
hitproof's resident memory and open file descriptors sampled every minute.

    python benchmarks/long_soak.py                      # 60 minutes, a sample a minute
    python benchmarks/long_soak.py --minutes 3 --sample-s 10 --json out.json   # a short try
    python benchmarks/long_soak.py --minutes 120 --decode-ms 160 --json benchmarks/long_soak_2h.json   # issue 26

What runs: the reference server (`python -m tui refserver --port 0`, 127.0.0.1, its own process) and
`python -m tui run --attach URL --headless --record LOG` (its own process, the one sampled) on a
scenario of the rotation phase alone (4 slots, a recall on every slot). A per-hit power target far
beyond reach keeps rotation going until its time budget (the run's length) is spent, so the run ends
by itself with exit 4 ("power target not reached"): that exit is expected here. The reference server
answers one piece every --decode-ms milliseconds, so an hour stays under the rotation phase's bound of
10,000 rounds (about 8,500 rounds an hour at 80 ms: two hours need 160 ms).

Sampled from /proc/PID/status (VmRSS, and RssAnon: the process's own memory, without the file pages
of its code and libraries, which the kernel drops and reads back under memory pressure: on 2026-12-02
both soaks lost 6.3 MB of VmRSS at once that way) and /proc/PID/fd every --sample-s seconds. Warm-up
is the first 10% of the samples (at least one); growth = (last - warm-up) / warm-up, for both, and
the peak after warm-up is given too. Flat means the anonymous memory's growth <= --flat (2% by
default, issue 26's target; issue 16's was 5%, on VmRSS) and no more open descriptors at the end than
at warm-up. The log is complete when every request_start has its request_end and the log ends with
run_end. Prints one JSON object on the last line; --json also writes it to a file.
Bounded: the run is stopped (SIGINT, then SIGKILL) if it outlives its budget by 5 minutes, and both
processes are always stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]

SCENARIO = """\
[scenario]
name = "long-rotation"
description = "rotation only, for the long soak (benchmarks/long_soak.py)"
api = "completions"
phases = ["rotation"]
seed = 7

[evidence]
memo_tokens = 800
recall_max_tokens = 20
fingerprints = false

[phases.rotation]
slots = 4
rounds = 6
memo_tokens = 800
tasks = ["recall"]

[power]
fault_rate = 0.000001        # out of reach on purpose: rotation keeps going for budget_s
budget_s = {budget}
"""


def proc_sample(pid: int) -> tuple[float, float, int]:
    """(resident MB, anonymous resident MB, open descriptors) of a live process."""
    found = {"VmRSS:": 0, "RssAnon:": 0}
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            key = line.split(maxsplit=1)[0]
            if key in found:
                found[key] = int(line.split()[1])
    return found["VmRSS:"] / 1024, found["RssAnon:"] / 1024, len(os.listdir(f"/proc/{pid}/fd"))


def start_refserver(decode_ms: float) -> tuple[subprocess.Popen, str]:
    server = subprocess.Popen([sys.executable, "-m", "tui", "refserver", "--port", "0",
                               "--decode-ms-per-token", str(decode_ms)],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = server.stdout.readline()
        found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line or "")
        if found:
            return server, found.group(1)
        if server.poll() is not None:
            break
    stop(server)
    raise SystemExit("long_soak: the reference server did not start")


def stop(process: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def check_log(path: Path) -> dict:
    """Every request_start has its request_end; the log ends with run_end."""
    started, ended, last = set(), set(), None
    events = 0
    with open(path, "rb") as handle:
        for line in handle:
            if not line.strip():
                continue
            events += 1
            kind = line[9:line.find(b'"', 9)]
            if kind in (b"request_start", b"request_end"):
                request = orjson.loads(line)["request"]
                (started if kind == b"request_start" else ended).add(request)
            last = kind.decode()
    missing = sorted(started - ended)
    return {"events": events, "requests": len(started), "request_ends": len(ended),
            "missing_ends": len(missing), "first_missing": missing[:5], "last_event": last,
            "complete": not missing and last == "run_end", "log_bytes": path.stat().st_size}


def run(minutes: float, sample_s: float, decode_ms: float, log: Path, flat: float = 0.02) -> dict:
    budget = minutes * 60
    folder = Path(tempfile.mkdtemp(prefix="hitproof-long-soak-"))
    scenario = folder / "long-rotation.toml"
    scenario.write_text(SCENARIO.format(budget=budget))
    server, url = start_refserver(decode_ms)
    soak = None
    samples: list[dict] = []
    try:
        soak = subprocess.Popen([sys.executable, "-m", "tui", "run", "--attach", url, "--scenario", str(scenario),
                                 "--headless", "--record", str(log)],
                                cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "COLUMNS": "100", "PYTHONPATH": str(ROOT)})
        started = time.monotonic()
        deadline = started + budget + 300
        next_at = started + sample_s
        while soak.poll() is None and time.monotonic() < deadline:
            time.sleep(min(1.0, max(0.0, next_at - time.monotonic())))
            if time.monotonic() >= next_at and soak.poll() is None:
                try:
                    rss, anon, fds = proc_sample(soak.pid)
                except (FileNotFoundError, ProcessLookupError):
                    break
                samples.append({"t_s": round(time.monotonic() - started, 1), "rss_mb": round(rss, 2),
                                "anon_mb": round(anon, 2), "fds": fds})
                print(f"long_soak: {samples[-1]['t_s']:7.0f} s  rss {rss:7.2f} MB  anon {anon:7.2f} MB  fds {fds}",
                      file=sys.stderr,
                      flush=True)
                next_at += sample_s
        if soak.poll() is None:
            stop(soak, signal.SIGINT)
        output = soak.stdout.read()
        elapsed = time.monotonic() - started
    finally:
        if soak is not None:
            stop(soak, signal.SIGINT)
        stop(server)
    if not samples:
        raise SystemExit("long_soak: no sample taken (the run ended before the first one)\n" + output[-2000:])
    warm_index = max(0, len(samples) // 10 - 1) if len(samples) >= 10 else 0
    warm = samples[warm_index]
    after = samples[warm_index:]
    last = samples[-1]
    growth = (last["rss_mb"] - warm["rss_mb"]) / warm["rss_mb"]
    anon_growth = (last["anon_mb"] - warm["anon_mb"]) / warm["anon_mb"] if warm["anon_mb"] else 0.0
    peak = max(s["rss_mb"] for s in after)
    result = {
        "minutes": minutes, "elapsed_s": round(elapsed, 1), "decode_ms": decode_ms, "exit_code": soak.returncode,
        "verdict_line": next((line for line in output.splitlines() if line.startswith("verdict:")), ""),
        "samples": len(samples), "warm_at_s": warm["t_s"], "rss_warm_mb": warm["rss_mb"],
        "rss_final_mb": last["rss_mb"], "rss_peak_after_warm_mb": peak, "rss_growth": round(growth, 4),
        "rss_peak_growth": round((peak - warm["rss_mb"]) / warm["rss_mb"], 4),
        "anon_warm_mb": warm["anon_mb"], "anon_final_mb": last["anon_mb"], "anon_growth": round(anon_growth, 4),
        "anon_peak_after_warm_mb": max(s["anon_mb"] for s in after),
        "fds_warm": warm["fds"], "fds_final": last["fds"], "fds_max": max(s["fds"] for s in samples),
        "flat_limit": flat, "flat": anon_growth <= flat and last["fds"] <= warm["fds"],
        "log": check_log(log), "log_path": str(log), "series": samples,
    }
    return result


def _interrupted(signum, frame):
    raise KeyboardInterrupt


def main() -> int:
    # started in the background by a shell, SIGINT comes in ignored, and children would inherit that:
    # put Ctrl-C back, and make SIGTERM stop the run the same way (both processes stopped)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupted)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--sample-s", type=float, default=60.0)
    parser.add_argument("--decode-ms", type=float, default=80.0,
                        help="reference server: milliseconds between output pieces (paces the rounds)")
    parser.add_argument("--log", default=str(ROOT / "logs" / f"long-soak-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"))
    parser.add_argument("--json", metavar="FILE", help="also write the result here")
    parser.add_argument("--flat", type=float, default=0.02, help="largest growth after warm-up called flat (0.02: 2%%)")
    args = parser.parse_args()
    log = Path(args.log).resolve()
    log.parent.mkdir(parents=True, exist_ok=True)
    result = run(args.minutes, args.sample_s, args.decode_ms, log, args.flat)
    text = json.dumps(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(text)
    return 0 if result["flat"] and result["log"]["complete"] else 1


if __name__ == "__main__":
    sys.exit(main())
