"""hitproof's benchmarks: every figure next to its baseline measured in the same run, as a ratio.

    python benchmarks/run.py                 # the full run (about 5 minutes on 2 cores)
    python benchmarks/run.py --quick         # small sizes, a minute: the smoke test runs this
    python benchmarks/run.py --only fidelity,throughput --json results.json --markdown results.md

Sections (see benchmarks/README.md):
  fidelity    time to first token through OpenAIClient.stream vs a raw asyncio client (and vLLM's
              bench client), 1 and 256 streams at 50 chunks/s, 100- and 100,000-character prompts
  throughput  chunks/s with every check running (coalesced deltas + evaluate) vs the raw client and
              vLLM's bench client, 1 / 64 / 256 streams flooding
  ui          the Textual app (headless) with 64 slots streaming 2,000 chunks/s vs the same load
              without the app
  replay      a 500 MB log: first frame, final state, `report`, vs one plain read of the file
  memory      100,000 requests through the app's model and the recorder: resident memory growth
  evidence    opt-in (--only evidence; the real vLLM, 15-25 minutes): checked hits per minute and the
              fault rate ruled out, quick soak now vs before (benchmarks/quick-before.toml), and the TTFT
              hitproof adds over vLLM's own histogram vs a raw client replaying the same requests

Every server runs in its own process on 127.0.0.1 and is stopped at the end; every client runs in a
fresh process of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SECTIONS = ("fidelity", "throughput", "ui", "replay", "memory")
OPT_IN = ("evidence",)        # run only when named in --only: it needs the real vLLM and 15-25 minutes
VLLM_PYTHON = Path.home() / ".cache" / "hitproof" / "vllm" / "venv" / "bin" / "python"


@dataclass
class Row:
    section: str
    figure: str
    value: float
    unit: str
    baseline_name: str
    baseline: float
    ratio: float | None
    target: str
    ok: bool | None             # None: no target, shown for context
    note: str = ""
    baseline_unit: str = ""     # when the baseline is not in the figure's unit

    def line(self) -> str:
        status = "info" if self.ok is None else ("ok" if self.ok else "SHORT")
        ratio = "-" if self.ratio is None else f"{self.ratio:.3g}"
        text = (f"[{self.section}] {self.figure}: {_fmt(self.value)} {self.unit} | baseline {self.baseline_name} "
                f"{_fmt(self.baseline)} {self.baseline_unit or self.unit} | ratio {ratio} | target {self.target}: "
                f"{status}")
        return text + (f"  ({self.note})" if self.note else "")


def _fmt(value: float) -> str:
    if value != value:                       # nan
        return "nan"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}" if abs(value) < 1 else f"{value:.2f}"


def ratio(a: float, b: float) -> float | None:
    return a / b if b else None


# --- processes ---------------------------------------------------------------------------------------

class StreamServer:
    """benchmarks/streamserver.py in its own process on 127.0.0.1."""

    def __enter__(self) -> "StreamServer":
        self.process = subprocess.Popen([sys.executable, str(HERE / "streamserver.py"), "--port", "0"],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        if not line.startswith("listening on 127.0.0.1:"):
            self.__exit__()
            raise RuntimeError(f"stream server did not start: {line!r} {self.process.stderr.read()[-500:]}")
        self.port = int(line.rsplit(":", 1)[1])
        return self

    def __exit__(self, *exc) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process.stdout.close()
        self.process.stderr.close()


def run_json(argv: list[str], timeout: float) -> dict:
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])} failed ({done.returncode}): {done.stderr.strip()[-800:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def client(kind: str, port: int, mode: str, vllm_python: Path | None, timeout: float = 300, **options) -> dict:
    if kind == "vllm":
        argv = [str(vllm_python), str(HERE / "vllm_client.py")]
    else:
        argv = [sys.executable, str(HERE / "clients.py"), "--client", kind]
    argv += ["--mode", mode, "--port", str(port)]
    for key, value in options.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    return run_json(argv, timeout)


# --- 1. timing fidelity ---------------------------------------------------------------------------------

def fidelity(quick: bool, vllm_python: Path | None) -> list[Row]:
    rows: list[Row] = []
    delay_ms = 20
    plans = [(1, dict(requests=8 if quick else 40, chunks=5)),
             (16 if quick else 256, dict(requests=1 if quick else 3, chunks=10 if quick else 50))]
    kinds = ["raw", "hitproof"] + (["vllm"] if vllm_python else [])
    rounds = 1 if quick else 2
    with StreamServer() as server:
        for streams, plan in plans:
            for prompt in (100, 100_000):
                ttft: dict[str, list[float]] = {k: [] for k in kinds}
                failed: dict[str, int] = {k: 0 for k in kinds}
                for _ in range(rounds):
                    for kind in kinds:            # interleaved: drift in the machine's load hits every client
                        out = client(kind, server.port, "ttft", vllm_python, streams=streams, rate=50,
                                     delay_ms=delay_ms, prompt_chars=prompt, **plan)
                        ttft[kind] += out["ttft"]
                        failed[kind] += out.get("failed", 0)
                raw = statistics.median(ttft["raw"]) * 1000
                where = f"{streams} stream{'s' if streams > 1 else ''} at 50 chunks/s, {prompt:,}-char prompt"
                for kind in kinds[1:]:
                    med = statistics.median(ttft[kind]) * 1000
                    p95 = _q(ttft[kind], 0.95) * 1000 - _q(ttft["raw"], 0.95) * 1000
                    name = "hitproof" if kind == "hitproof" else "vLLM bench client"
                    note = f"p95 added {p95:+.2f} ms; {len(ttft[kind])} requests; server delay {delay_ms} ms"
                    if failed[kind]:
                        note += f"; {failed[kind]} requests failed"
                    rows.append(Row("fidelity", f"TTFT added by {name}, {where}", med - raw, "ms",
                                    "raw client median TTFT", raw, ratio(med, raw),
                                    "<= 1 ms added" if kind == "hitproof" else "-",
                                    (med - raw <= 1.0) if kind == "hitproof" else None, note))
    return rows


def _q(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --- 2. stream throughput -------------------------------------------------------------------------------------

def throughput(quick: bool, vllm_python: Path | None) -> list[Row]:
    rows: list[Row] = []
    chunks = 500 if quick else 2000
    plans = [(1, 4 if quick else 60), (8 if quick else 64, 1 if quick else 4), (16 if quick else 256, 1)]
    kinds = ["raw", "hitproof"] + (["vllm"] if vllm_python else [])
    rounds = 1 if quick else 2
    targets = {1: 50_000, 64: 150_000}
    with StreamServer() as server:
        for streams, requests in plans:
            best: dict[str, float] = {}
            failed: dict[str, int] = {k: 0 for k in kinds}
            for _ in range(rounds):
                for kind in kinds:
                    out = client(kind, server.port, "flood", vllm_python, streams=streams, requests=requests,
                                 chunks=chunks, timeout=600)
                    rate = out["chunks"] / out["wall"]
                    best[kind] = max(best.get(kind, 0.0), rate)
                    failed[kind] += out.get("failed", 0)
            hp = best["hitproof"]
            where = f"{streams} stream{'s' if streams > 1 else ''}"
            others = [k for k in kinds if k not in ("raw", "hitproof")]
            target = targets.get(streams)
            if others:
                rival = max(others, key=lambda k: best[k])
                note = f"best of {rounds} runs of {streams * requests} answers x {chunks} chunks"
                if failed[rival]:
                    note += (f"; vLLM's client dropped {failed[rival]} of {rounds * streams * requests} answers "
                             f"(it strips whitespace from every network read: a read ending at 'data:' loses the "
                             f"space and the next chunk no longer parses)")
                ok = hp >= best[rival] and (target is None or hp >= target)
                rows.append(Row("throughput", f"chunks/s with every check, {where}", hp, "chunks/s",
                                "vLLM bench client", best[rival], ratio(hp, best[rival]),
                                f">= vLLM client{f' and >= {target:,}' if target else ''}", ok, note))
            elif target:
                rows.append(Row("throughput", f"chunks/s with every check, {where}", hp, "chunks/s",
                                "target", target, ratio(hp, target), f">= {target:,}", hp >= target))
            rows.append(Row("throughput", f"chunks/s with every check vs no parsing at all, {where}", hp, "chunks/s",
                            "raw client (counts chunks, parses nothing)", best["raw"], ratio(hp, best["raw"]), "-", None))
    return rows


# --- 3. UI under load -------------------------------------------------------------------------------------------------

def ui(quick: bool) -> list[Row]:
    seconds = 2 if quick else 10
    base = [sys.executable, str(HERE / "ui_load.py"), "--seconds", str(seconds), "--slots", "64", "--rate", "2000"]
    without = run_json(base + ["--no-app"], 120)
    app = run_json(base, 300)
    nominal = 1000 / app["frame_rate"]
    rows = [
        Row("ui", "CPU share of a core, app with 64 slots at 2,000 chunks/s", app["cpu"] * 100, "%",
            "the same load without the app", without["cpu"] * 100, ratio(app["cpu"], without["cpu"]),
            "<= 50%", app["cpu"] <= 0.5, f"{app['frames']} frames in {app['seconds']:.1f} s"),
        Row("ui", "frame interval p95", app["interval_p95"] * 1000, "ms",
            f"the frame cap ({app['frame_rate']:g} fps)", nominal, ratio(app["interval_p95"] * 1000, nominal),
            "<= 50 ms", app["interval_p95"] * 1000 <= 50,
            f"p50 {app['interval_p50'] * 1000:.0f} ms, max {app['interval_max'] * 1000:.0f} ms"),
        Row("ui", "frame lateness p95 (interval beyond the cap)", app["interval_p95"] * 1000 - nominal, "ms",
            f"the frame cap ({app['frame_rate']:g} fps)", nominal, ratio(app["interval_p95"] * 1000 - nominal, nominal),
            "<= 50 ms", app["interval_p95"] * 1000 - nominal <= 50),
        Row("ui", "frame cost p95 (fold + widgets + compositor + ANSI)", app["frame_cost_p95"] * 1000, "ms",
            f"the frame cap ({app['frame_rate']:g} fps)", nominal, ratio(app["frame_cost_p95"] * 1000, nominal),
            "<= 50 ms", app["frame_cost_p95"] * 1000 <= 50, f"p50 {app['frame_cost_p50'] * 1000:.1f} ms"),
        Row("ui", "input lag p95 (a 10 ms timer's lateness)", app["lag_p95"] * 1000, "ms",
            "the same timer without the app", without["lag_p95"] * 1000,
            ratio(app["lag_p95"], without["lag_p95"]),
            "<= 50 ms", app["lag_p95"] * 1000 <= 50, f"max {app['lag_max'] * 1000:.0f} ms"),
    ]
    if not quick:
        slow = run_json(base + ["--frame-rate", "12"], 300)
        rows.append(Row("ui", "CPU share of a core with the cap lowered to 12 fps", slow["cpu"] * 100, "%",
                        "the same load without the app", without["cpu"] * 100, ratio(slow["cpu"], without["cpu"]),
                        "-", None, f"frame interval p95 {slow['interval_p95'] * 1000:.0f} ms"))
    return rows


# --- 4. replay scale ----------------------------------------------------------------------------------------------------

def replay(quick: bool) -> list[Row]:
    mb = 5 if quick else 500
    out = run_json([sys.executable, str(HERE / "replay_scale.py"), "--mb", str(mb), "--json"], 900)
    base = out["baseline_read_s"]
    size = f"{out['mb']:.0f} MB log ({out['events']:,} events)"
    return [
        Row("replay", f"first frame, {size}", out["first_frame_s"], "s", "one plain read of the file", base,
            ratio(out["first_frame_s"], base), "<= 1 s", out["first_frame_s"] <= 1.0),
        Row("replay", f"final state (index + fold), {size}", out["final_state_s"], "s", "one plain read of the file",
            base, ratio(out["final_state_s"], base), "-", None),
        Row("replay", f"`hitproof report --format json`, {size}", out["report_s"], "s", "one plain read of the file",
            base, ratio(out["report_s"], base), "<= 10 s", out["report_s"] <= 10.0),
    ]


# --- 5. memory -----------------------------------------------------------------------------------------------------------

def memory(quick: bool) -> list[Row]:
    requests = 5000 if quick else 100_000
    out = run_json([sys.executable, str(HERE / "memory.py"), "--requests", str(requests)], 900)
    return [Row("memory", f"resident memory growth after warm-up, {requests:,} requests", out["growth"] * 100, "%",
                f"RSS at warm-up ({out['warm_at']:,} requests)", out["rss_warm_mb"],
                ratio(out["rss_final_mb"], out["rss_warm_mb"]), "<= 10%", out["growth"] <= 0.10,
                f"{out['bytes_per_request']:.0f} bytes a request; final {out['rss_final_mb']:.1f} MB; "
                f"the app keeps {out['model_requests_kept']:,} requests", baseline_unit="MB")]


# --- 6. evidence rate and TTFT fidelity on the real vLLM (opt-in) -------------------------------------------

def evidence(timeout: float = 5400.0) -> list[Row]:
    """benchmarks/evidence_rate.py in its own process (its progress goes straight to stderr); it starts
    and stops the embedded vLLM itself. Stopped with SIGTERM (so it stops vLLM) if it overruns."""
    process = subprocess.Popen([sys.executable, str(HERE / "evidence_rate.py")], cwd=ROOT, stdout=subprocess.PIPE,
                               text=True)
    try:
        stdout, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.terminate()
        try:
            process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
        raise RuntimeError(f"evidence_rate.py took longer than {timeout:.0f} s: stopped")
    if process.returncode != 0:
        raise RuntimeError(f"evidence_rate.py failed (exit {process.returncode}; its error is above)")
    return evidence_rows(json.loads(stdout.strip().splitlines()[-1]))


def evidence_rows(out: dict) -> list[Row]:
    a, b, f = out["before"], out["current"], out["fidelity"]
    load = (f"load average {out['load_before'][0]:.1f} at the start, {out['load_after_a'][0]:.1f} after the soak "
            f"before, {out['load_after_b'][0]:.1f} after the soak now, {out['load_after'][0]:.1f} at the end")

    def bound(x: dict) -> float:
        return float("nan") if x["upper_bound_95"] is None else x["upper_bound_95"] * 100

    def soak(x: dict) -> str:
        per = f" ({x['checked_hits'] / x['requests']:.2f} a request)" if x["requests"] else ""
        return (f"{x['checked_hits']} hits checked in {x['soak_s']:.0f} s, {x['requests']} requests{per}, "
                f"{x['verdict']}")

    rows = [
        Row("evidence", "checked hits per minute, quick soak", b["checked_per_min"], "hits/min",
            "the quick soak before (quick-before.toml)", a["checked_per_min"],
            ratio(b["checked_per_min"], a["checked_per_min"]), "higher than before",
            b["checked_per_min"] > a["checked_per_min"], f"now {soak(b)}; before {soak(a)}; {load}"),
        Row("evidence", "per-hit fault rate ruled out, quick soak", bound(b), "%",
            "the quick soak before (quick-before.toml)", bound(a),
            None if b["upper_bound_95"] is None or not a["upper_bound_95"] else
            b["upper_bound_95"] / a["upper_bound_95"], "lower than before (lower is better)",
            None if b["upper_bound_95"] is None or a["upper_bound_95"] is None else
            b["upper_bound_95"] < a["upper_bound_95"],
            f"95% upper bound after {b['soak_s']:.0f} s of soak now, {a['soak_s']:.0f} s before; "
            f"{b['failures']} and {a['failures']} failed"),
    ]
    server_b, server_r = f.get("server_b"), f.get("server_r")
    if "hitproof_added_ms" in f and "raw_added_ms" in f:
        added, raw_added = f["hitproof_added_ms"], f["raw_added_ms"]
        counts = (f"hitproof {f['hitproof_ttft_n']} requests vs the server's {server_b['count']}, raw client "
                  f"{f['raw_ttft_n']} vs {server_r['count']}")
        if f["probes"]:
            counts += (f" (with the {f['probes']} cache-report probe{'s' if f['probes'] > 1 else ''} hitproof sends "
                       f"before its first phase, not in the log; the log's {f['logged_ttft_n']} alone: "
                       f"{f['logged_added_ms']:+.1f} ms)")
        if f["hitproof_ttft_n"] != server_b["count"] or f["raw_ttft_n"] != server_r["count"]:
            counts += "; the counts differ"
        note = (f"means: hitproof {f['hitproof_ttft_mean_ms']:.1f} ms, server {server_b['mean_ms']:.1f} ms in soak B; "
                f"raw {f['raw_ttft_mean_ms']:.1f} ms, server {server_r['mean_ms']:.1f} ms in the replay; {counts}; "
                f"hits {f['hits_b']} in B, {f['hits_replay']} in the replay ({f['hit_pattern_differs']} requests "
                f"cold in one and hit in the other); at most {f['max_in_flight_b']} in flight in B, "
                f"{f['max_in_flight_replay']} in the replay; {load}")
        if f["raw_errors"]:
            note += f"; {f['raw_errors']} replayed requests failed ({f['raw_first_error']})"
        rows.append(Row("evidence", "TTFT added over the server's own, quick soak on vLLM", added, "ms",
                        "raw client replay - server", raw_added, ratio(added, raw_added),
                        "<= the raw client's + 1 ms", added <= raw_added + 1.0, note))
    return rows


# --- the runner ----------------------------------------------------------------------------------------------------------

def machine() -> dict:
    load = os.getloadavg()
    return {"date": time.strftime("%Y-%m-%d %H:%M"), "python": platform.python_version(), "cores": os.cpu_count(),
            "load": [round(v, 2) for v in load]}


def markdown(rows: list[Row]) -> str:
    out = ["| section | figure | hitproof | baseline | ratio | target | |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        status = "" if r.ok is None else ("ok" if r.ok else "**short**")
        ratio_text = "-" if r.ratio is None else f"{r.ratio:.3g}"
        out.append(f"| {r.section} | {r.figure} | {_fmt(r.value)} {r.unit} | {r.baseline_name}: {_fmt(r.baseline)} "
                   f"{r.baseline_unit or r.unit} | {ratio_text} | {r.target} | {status} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (the smoke test)")
    parser.add_argument("--only", help=f"comma-separated sections: {','.join(SECTIONS)} (and the opt-in "
                                       f"{','.join(OPT_IN)})")
    parser.add_argument("--json", metavar="FILE", help="write every row as JSON")
    parser.add_argument("--markdown", metavar="FILE", help="write the table as markdown")
    parser.add_argument("--vllm-python", default=str(VLLM_PYTHON),
                        help="interpreter with vLLM installed, for its bench client ('' to skip)")
    args = parser.parse_args(argv)
    sections = args.only.split(",") if args.only else list(SECTIONS)
    unknown = set(sections) - set(SECTIONS) - set(OPT_IN)
    if unknown:
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")
    vllm_python = Path(args.vllm_python) if args.vllm_python and Path(args.vllm_python).exists() else None
    info = machine()
    print(f"hitproof benchmarks {'(quick) ' if args.quick else ''}{info['date']}: python {info['python']}, "
          f"{info['cores']} cores, load average {info['load']}"
          + ("" if vllm_python else "; vLLM's bench client skipped (no vLLM venv)"), flush=True)
    rows: list[Row] = []
    failures = []
    started = time.perf_counter()
    for name in sections:
        t = time.perf_counter()
        try:
            if name == "fidelity":
                new = fidelity(args.quick, vllm_python)
            elif name == "throughput":
                new = throughput(args.quick, vllm_python)
            elif name == "ui":
                new = ui(args.quick)
            elif name == "replay":
                new = replay(args.quick)
            elif name == "memory":
                new = memory(args.quick)
            else:                                        # evidence: one size only (--quick does not shrink it)
                new = evidence()
        except Exception as exc:                          # one broken section does not hide the others
            failures.append(name)
            print(f"[{name}] FAILED: {exc}", flush=True)
            continue
        for row in new:
            print(row.line(), flush=True)
        print(f"[{name}] {time.perf_counter() - t:.0f} s", flush=True)
        rows += new
    info["load_after"] = [round(v, 2) for v in os.getloadavg()]
    info["seconds"] = round(time.perf_counter() - started)
    short = [r for r in rows if r.ok is False]
    print(f"done in {info['seconds']} s: {len(rows)} figures, {len(short)} short of target"
          + (f", sections failed: {', '.join(failures)}" if failures else "")
          + f"; load average {info['load_after']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "quick": args.quick,
                                               "rows": [asdict(r) for r in rows]}, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(markdown(rows))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
