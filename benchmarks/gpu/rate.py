"""hitproof's speed against a raw client on the same server, in the same run (issue 24: "on the H200 the
soak, not the server, may be the limit").

    python3 benchmarks/gpu/rate.py --attach http://127.0.0.1:8321                      # hybrid-quick
    python3 benchmarks/gpu/rate.py --attach URL --scenario scenarios/mix-quick.toml --out DIR
    python3 benchmarks/gpu/rate.py --attach URL --scenario gpu-quick --streams 4,32,128 --power 0.3% \
        --results benchmarks/RESULTS.md                                                 # issue 34

Runs against any server already running (the GPU run's vLLM, the reference server, ...):

  H  `hitproof run --attach URL --scenario S --headless --record H.jsonl`, through evidence_rate.py's
     `record` mode (the hitproof command line in a fresh process that keeps every request body it sends);
     its CPU seconds (user + system, the process and its children) from the operating system;
  R  evidence_rate.py's raw asyncio client replaying H's request bodies (the run's nonce swapped, so its
     prompts are new to the cache and its cold/hit pattern is H's) at H's concurrency: a request waits
     for exactly the requests that had finished before it started in H (in rotation's barrier-free
     rounds: for its slot's and its memo's last finished request, evidence_rate.build_plan); its CPU
     seconds the same way.

Printed, one `[rate]` line each: requests per second of H (logged requests over the soak's seconds, first
phase_start to run_end) and of R (replayed requests over the replay's seconds), their ratio (the goal:
hitproof within 10% of the raw client); hits per minute of both (a hit: cached_tokens > 0) and H's
checked hits per minute (hits compared with their own cold fingerprint or asked for their own code:
`hitproof report --format json` power.evidence); CPU seconds per request of both; the minutes H would
need at that rate for default's power target (299 checked hits: a 1% per-hit fault rate ruled out at
95%). The last stdout line is one JSON object; everything is also kept in --out (default
logs/rate-STAMP/). Exit 0 measured, 3 a soak or the replay failed.

With `--streams 4,32,128` (issue 34) the pair H, R runs once per width, H as `hitproof run --streams N`
(rotation N slots wide, the mix phase N workers), each into --out/streams-N/; beside the figures above:
CPU per request of both with start-up excluded (H: the hitproof process's CPU seconds from its first
request to its run_end event, over the requests it sent; R: from the replay's first request to its last
one parsed; "n" says over how many requests: the issue asks for at least 1,000, `--power 0.3%` makes
gpu-quick long enough), the TTFT median and p99 hitproof adds (its distribution's minus the raw
client's, the same requests), and the seconds of soak to default's target at H's checked-hit rate.
One table row per width is printed and, with --results FILE, appended to FILE under a dated heading
with the machine (benchmarks/RESULTS.md keeps them).

Each measurement also says where hitproof's soak took longer than the replay, phase by phase (phase_time.py:
result key "phases"), and what each side spent outside its requests' span ("outside_requests_s"). `--warm-up`
soaks once, not measured, before the first measurement: a server's first soak after its start ran slower on the
server's side, and H always runs before its R.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import statistics
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import evidence_rate  # noqa: E402  (record, replay, read_log, build_plan: reused as they are)
import phase_time  # noqa: E402

DEFAULT_TARGET = 299          # scenarios/default.toml: 1% at 95%


def say(line: str) -> None:
    print(f"[rate] {line}", flush=True)


def cpu_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_child(argv: list[str], timeout: float, console: Path) -> tuple[int, float, float]:
    """(exit code, wall seconds, CPU seconds) of one child process, bounded in time."""
    cpu0, t0 = cpu_children(), time.monotonic()
    with console.open("wb") as out:
        try:
            code = subprocess.run(argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            code = 124
    return code, time.monotonic() - t0, cpu_children() - cpu0


def per(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def quantile(values: list[float], q: float) -> float | None:
    """The q-quantile (nearest rank) of values; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def ttft_added(h: list[float], r: list[float]) -> dict:
    """Median and p99 of hitproof's TTFTs minus the raw client's, over the same requests (ms)."""
    out = {"n_hitproof": len(h), "n_raw": len(r)}
    for name, q in (("median", 0.5), ("p99", 0.99)):
        a, b = quantile(h, q), quantile(r, q)
        out[f"hitproof_{name}_ms"] = None if a is None else a * 1000
        out[f"raw_{name}_ms"] = None if b is None else b * 1000
        out[f"added_{name}_ms"] = None if a is None or b is None else (a - b) * 1000
    return out


def steady_cpu(bodies: Path) -> dict:
    """H's CPU seconds from its first request to its run_end (record mode's sidecar), and over how many."""
    path = evidence_rate.steady_path(bodies)
    facts = json.loads(path.read_text()) if path.is_file() else {}
    return {"cpu_s": facts.get("cpu_s"), "requests": facts.get("requests")}


def measure(url: str, scenario: str, out: Path, timeout: float, streams: int | None = None,
            power: str | None = None) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    log, bodies = out / "H.jsonl", out / "H.bodies.jsonl"
    extra = (["--streams", str(streams)] if streams else []) + (["--power", power] if power else [])
    say(f"H: hitproof run --attach {url} --scenario {scenario} {' '.join(extra)} (bodies kept)")
    code, wall, cpu = timed_child([sys.executable, str(ROOT / "benchmarks" / "evidence_rate.py"), "record", str(bodies),
                                   "--", "run", "--attach", url, "--scenario", scenario, "--headless", "--record",
                                   str(log), *extra], timeout, out / "H.console.txt")
    if code not in (0, 1, 4) or not log.is_file():
        raise evidence_rate.Problem(f"soak H ended with exit {code}: {evidence_rate.tail_of(out / 'H.console.txt')}")
    report = json.loads(subprocess.run([sys.executable, "-m", "tui", "report", str(log), "--format", "json"],
                                       cwd=ROOT, capture_output=True, text=True, timeout=300).stdout)
    facts = evidence_rate.read_log(log)
    kept = [json.loads(line) for line in bodies.read_text().splitlines() if line.strip()]
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    plan, plan_facts = evidence_rate.build_plan(facts, kept, port, random.Random())
    plan_path, result_path = out / "R.plan.json", out / "R.result.json"
    plan_path.write_text(json.dumps(plan))
    say(f"R: the raw client replays {len(plan['requests'])} requests (at most {plan['max_in_flight']} at once, as in H)")
    code_r, wall_r, cpu_r = timed_child([sys.executable, str(ROOT / "benchmarks" / "evidence_rate.py"), "replay",
                                         str(plan_path), str(result_path)], timeout, out / "R.console.txt")
    if code_r != 0:
        raise evidence_rate.Problem(f"the raw replay ended with exit {code_r}: {evidence_rate.tail_of(out / 'R.console.txt')}")
    replay = json.loads(result_path.read_text())
    ev = (report.get("power") or {}).get("evidence") or {}
    checked = max((ev.get(k) or {}).get("checked_hits") or 0 for k in ("recall", "fingerprint"))
    requests_h = len(facts["order"])
    hits_h = sum(1 for e in facts["ends"].values() if (e.get("cached") or 0) > 0)
    raw = replay["requests"]
    hits_r = sum(1 for r in raw if (r["cached"] or 0) > 0)
    soak_s, replay_s = facts["soak_s"], replay["seconds"]
    result = {
        "url": url, "scenario": scenario, "exit_code": code, "verdict": report.get("verdict"),
        "verdict_reasons": evidence_rate.verdict_reasons(report), "verdict_message": report.get("message"),
        "hitproof": {"requests": requests_h, "hits": hits_h, "checked_hits": checked,
                     "checked": {k: (ev.get(k) or {}).get("checked_hits") for k in ("recall", "fingerprint")},
                     "soak_s": round(soak_s, 2), "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                     "requests_per_s": per(requests_h, soak_s), "hits_per_min": per(hits_h * 60, soak_s),
                     "checked_per_min": per(checked * 60, soak_s), "cpu_s_per_request": per(cpu, requests_h)},
        "raw": {"requests": len(raw), "hits": hits_r, "errors": sum(1 for r in raw if r["error"]),
                "seconds": round(replay_s, 2), "cpu_s": round(cpu_r, 2), "requests_per_s": per(len(raw), replay_s),
                "hits_per_min": per(hits_r * 60, replay_s), "cpu_s_per_request": per(cpu_r, len(raw)),
                "max_in_flight": replay["max_in_flight"]},
        "plan": plan_facts, "streams": streams, "power": power,
    }
    steady = steady_cpu(bodies)
    h_ttft = [e["ttft"] for e in facts["ends"].values() if e.get("ttft") is not None]
    r_ttft = [x["ttft"] for x in raw if x.get("ttft") is not None and not x["key"].startswith("probe")]
    result["hitproof"].update({"steady_cpu_s": steady["cpu_s"], "steady_requests": steady["requests"],
                               "steady_cpu_s_per_request": per(steady["cpu_s"], steady["requests"])})
    result["raw"].update({"steady_cpu_s": replay.get("cpu_s"),
                          "steady_cpu_s_per_request": per(replay.get("cpu_s"), len(raw))})
    result["steady_cpu_ratio"] = per(result["hitproof"]["steady_cpu_s_per_request"],
                                     result["raw"]["steady_cpu_s_per_request"])
    result["ttft"] = ttft_added(h_ttft, r_ttft)
    h_rows, r_rows = phase_time.rows_of(facts, raw)
    result["phases"] = phase_time.phase_time(h_rows, r_rows)
    # H's soak runs from its first phase_start to its run_end, R's from its first request (the probe) to its last
    # end: what each spent outside its requests' span (H: a phase's set-up before its first request, the verdict)
    result["outside_requests_s"] = {"hitproof": round(soak_s - phase_time.span(h_rows), 3),
                                    "raw": round(replay_s - phase_time.span(r_rows), 3)}
    result["seconds_to_default_target"] = per(DEFAULT_TARGET * 60, result["hitproof"]["checked_per_min"])
    h, r = result["hitproof"], result["raw"]
    result["rate_ratio"] = per(h["requests_per_s"], r["requests_per_s"])
    result["hits_per_min_ratio"] = per(h["hits_per_min"], r["hits_per_min"])
    result["minutes_to_default_target"] = per(DEFAULT_TARGET, h["checked_per_min"])
    say(f"hitproof: {requests_h} requests in {soak_s:.1f} s = {fmt(h['requests_per_s'])}/s, {hits_h} hits = "
        f"{fmt(h['hits_per_min'])}/min, {checked} checked = {fmt(h['checked_per_min'])}/min; verdict {report.get('verdict')}"
        + (f" ({why})" if (why := evidence_rate.verdict_reasons(report)) else ""))
    say(f"raw client: {len(raw)} requests in {replay_s:.1f} s = {fmt(r['requests_per_s'])}/s, {hits_r} hits = "
        f"{fmt(r['hits_per_min'])}/min, {r['errors']} errors")
    say(f"ratio hitproof/raw: requests/s {fmt(result['rate_ratio'], 3)}, hits/min {fmt(result['hits_per_min_ratio'], 3)} "
        f"(goal: within 10%, >= 0.9)")
    say(f"CPU per request: hitproof {fmt(per(cpu * 1000, requests_h))} ms ({cpu:.1f} s), raw client "
        f"{fmt(per(cpu_r * 1000, len(raw)))} ms ({cpu_r:.1f} s); ratio {fmt(per(h['cpu_s_per_request'], r['cpu_s_per_request']), 1)}")
    say(f"default's target ({DEFAULT_TARGET} checked hits) at this rate: "
        f"{fmt(result['minutes_to_default_target'], 2)} min of soak (goal: within 1 min)")
    hs, rs = result["hitproof"], result["raw"]
    say(f"CPU per request, start-up excluded: hitproof {fmt(per(hs['steady_cpu_s'], 1e-3 * (hs['steady_requests'] or 0)), 2)} "
        f"ms over {hs['steady_requests']} requests, raw client {fmt(per(rs['steady_cpu_s'], 1e-3 * len(raw)), 2)} ms over "
        f"{len(raw)}; ratio {fmt(result['steady_cpu_ratio'], 2)} (goal: at most 2, over at least 1,000 requests)")
    t = result["ttft"]
    say(f"TTFT added by hitproof: median {fmt(t['added_median_ms'], 2)} ms, p99 {fmt(t['added_p99_ms'], 2)} ms "
        f"(hitproof {fmt(t['hitproof_median_ms'], 2)} / {fmt(t['hitproof_p99_ms'], 2)} ms, raw "
        f"{fmt(t['raw_median_ms'], 2)} / {fmt(t['raw_p99_ms'], 2)} ms)")
    say("time by phase, hitproof / raw client s (hitproof's extra): " + ", ".join(
        f"{p['phase']} {p['hitproof_s']:.2f} / {fmt(p['raw_s'], 2)} ({fmt(p['added_s'], 2)})" for p in result["phases"])
        + f"; outside the requests: hitproof {result['outside_requests_s']['hitproof']:.2f} s, raw client "
          f"{result['outside_requests_s']['raw']:.2f} s")
    (out / "result.json").write_text(json.dumps(result, indent=1))
    return result


def warm_up(url: str, scenario: str, out: Path, timeout: float, streams: int | None) -> None:
    """One soak not measured, before the first: the first soak after a vLLM's start ran slower on the server's side
    (runs W and Z: request-rate ratio 0.845 and 0.683, TTFT p99 1.7 and 1.4 s more than the replay's, which came
    after it; the soaks after were at 0.92-1.10), and the replay always comes second."""
    out.mkdir(parents=True, exist_ok=True)
    extra = ["--streams", str(streams)] if streams else []
    say(f"warm-up: {' '.join(['hitproof run --attach', url, '--scenario', scenario, *extra])}, not measured")
    code, wall, _ = timed_child([sys.executable, "-m", "tui", "run", "--attach", url, "--scenario", scenario,
                                 "--headless", "--record", str(out / "W.jsonl"), *extra], timeout, out / "W.console.txt")
    if code not in (0, 1, 4):
        raise evidence_rate.Problem(f"the warm-up soak ended with exit {code}: {evidence_rate.tail_of(out / 'W.console.txt')}")
    say(f"warm-up: exit {code} after {wall:.1f} s")


COLUMNS = ("streams", "requests H / R", "requests/s H / R", "ratio", "hits/min H / R", "ratio",
           "CPU ms/request H / R (start-up excluded)", "ratio", "TTFT added median / p99 ms", "s to 1% target")


def table_row(r: dict) -> str:
    h, w, t = r["hitproof"], r["raw"], r["ttft"]
    width = str(r.get("streams") or "scenario") + (f" #{r['pair']}" if r.get("pair") else "")
    cells = [width, f"{h['requests']} / {w['requests']}",
             f"{fmt(h['requests_per_s'])} / {fmt(w['requests_per_s'])}", fmt(r["rate_ratio"], 3),
             f"{fmt(h['hits_per_min'], 0)} / {fmt(w['hits_per_min'], 0)}", fmt(r["hits_per_min_ratio"], 3),
             f"{fmt(per(h['steady_cpu_s'], 1e-3 * (h['steady_requests'] or 0)), 2)} / "
             f"{fmt(per(w['steady_cpu_s'], 1e-3 * w['requests']), 2)}", fmt(r["steady_cpu_ratio"], 2),
             f"{fmt(t['added_median_ms'], 2)} / {fmt(t['added_p99_ms'], 2)}", fmt(r["seconds_to_default_target"], 1)]
    return "| " + " | ".join(cells) + " |"


def table(results: list[dict]) -> str:
    return "\n".join(["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS),
                      *(table_row(r) for r in results)])


def machine() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{platform.node() or 'this machine'}: {os.cpu_count()} cores, Python {platform.python_version()}, " \
           f"{platform.system()} {platform.release()}, load average {load}"


def append_results(path: Path, results: list[dict], url: str, scenario: str, power: str | None) -> None:
    section = (f"\n## rate.py by width (issue 34), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n\n"
               f"`benchmarks/gpu/rate.py --attach {url} --scenario {scenario}"
               f"{' --power ' + power if power else ''} --streams "
               f"{','.join(str(w) for w in dict.fromkeys(r.get('streams') for r in results))}"
               f"{' --pairs %d' % max(r.get('pair') or 1 for r in results) if any(r.get('pair') for r in results) else ''}"
               f"` on {machine()}. H is hitproof, R the raw "
               f"client replaying H's requests at H's concurrency, in the same run; CPU from the first request "
               f"to the last (start-up excluded).\n\n{table(results)}\n"
               + "".join(f"\n{line}\n" for line in medians(results)))
    with path.open("a") as f:
        f.write(section)


def medians(results: list[dict]) -> list[str]:
    """One line per width measured in several pairs: the median request-rate and CPU ratios over its pairs (a GPU
    server's own rate moved from 54 to 40 requests a second between two pairs on one H100: one pair says little)."""
    lines = []
    for width in dict.fromkeys(r.get("streams") for r in results):
        pairs = [r for r in results if r.get("streams") == width]
        if len(pairs) < 2:
            continue
        rates = [r["rate_ratio"] for r in pairs if r["rate_ratio"] is not None]
        cpus = [r["steady_cpu_ratio"] for r in pairs if r["steady_cpu_ratio"] is not None]
        lines.append(f"{width or 'the scenario'} streams, median of {len(pairs)} pairs: request-rate ratio "
                     f"{fmt(statistics.median(rates) if rates else None, 3)} (each {', '.join(fmt(x, 3) for x in rates)}), steady CPU ratio "
                     f"{fmt(statistics.median(cpus) if cpus else None, 2)} (each {', '.join(fmt(x, 2) for x in cpus)})")
    return lines


def parse_streams(text: str | None) -> list[int | None]:
    if not text:
        return [None]
    try:
        widths = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise evidence_rate.Problem(f"--streams takes widths like 4,32,128 (got {text!r})", 2) from None
    if not widths or any(not 2 <= w <= 256 for w in widths):
        raise evidence_rate.Problem(f"--streams: every width between 2 and 256 (got {text!r})", 2)
    return widths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attach", required=True, metavar="URL", help="a running server (http://127.0.0.1:PORT)")
    parser.add_argument("--scenario", default=str(ROOT / "scenarios" / "hybrid-quick.toml"),
                        help="the scenario soaked (default: %(default)s)")
    parser.add_argument("--streams", metavar="N,N,...", help="widths, each its own H and R: hitproof run --streams N")
    parser.add_argument("--power", metavar="RATE", help="hitproof run --power RATE (a lower rate: more requests)")
    parser.add_argument("--results", metavar="FILE", help="append the table, dated, with the machine, to FILE")
    parser.add_argument("--out", metavar="DIR", help="where logs and result.json go (default logs/rate-STAMP/)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds each of H and R may take (default %(default)g)")
    parser.add_argument("--pairs", type=int, default=1, metavar="N",
                        help="H then R, N times at each width (a row each, then their medians; default %(default)s)")
    parser.add_argument("--warm-up", action="store_true",
                        help="one hitproof soak at the first width before any measured, not measured (a server's first "
                             "requests after its start run slower)")
    args = parser.parse_args(argv)
    url = args.attach.rstrip("/").removesuffix("/v1")
    out = Path(args.out) if args.out else ROOT / "logs" / f"rate-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        widths = parse_streams(args.streams)
        if not 1 <= args.pairs <= 20:
            raise evidence_rate.Problem(f"--pairs: between 1 and 20 (got {args.pairs})", 2)
        if args.warm_up:
            warm_up(url, args.scenario, out / "warm-up", args.timeout, widths[0])
        results = []
        for n in widths:
            where = out / f"streams-{n}" if n else out
            for k in range(1, args.pairs + 1):
                result = measure(url, args.scenario, where / f"pair-{k}" if args.pairs > 1 else where, args.timeout,
                                 n, args.power)
                if args.pairs > 1:
                    result["pair"] = k
                results.append(result)
    except evidence_rate.Problem as exc:
        print(f"rate: error: {exc}", file=sys.stderr)
        return exc.code
    for line in table(results).splitlines() + medians(results):
        say(line)
    if args.results:
        append_results(Path(args.results), results, url, args.scenario, args.power)
    print(json.dumps(results[0] if len(results) == 1 else {"widths": results}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
