"""Evidence rate and time-to-first-token fidelity on a real server (`benchmarks/run.py --only evidence`).

    python benchmarks/evidence_rate.py                  # the embedded vLLM, 24 minutes on a loaded machine
    python benchmarks/evidence_rate.py --attach URL     # a server that is already running

One server (the embedded vLLM on 127.0.0.1 and a free port, started once and always stopped) serves,
one after another:

  A  `hitproof run --attach URL --scenario benchmarks/quick-before.toml --headless --record A`: the
     quick soak as it was before recall on every rotation slot and the power target (the baseline);
  B  the same with `--scenario quick`, with `/metrics` scraped just before and just after it. B runs
     the hitproof command line itself in a fresh process (`record` below) that also keeps every
     request body it sends: no proxy, nothing between hitproof and the server;
  R  a raw asyncio client (`replay` below) sending B's request bodies again at B's concurrency, with
     its own `/metrics` scrapes.

Evidence rate: for A and B, the hits checked for their own code (`hitproof report --format json`:
power.evidence.recall.checked_hits, the EvidenceTally's recall count), the soak's seconds (first
phase_start to run_end in its log), checked hits per minute, and the per-hit fault rate ruled out at
95% (upper_bound_95).

Fidelity: the mean time to first token hitproof logged in B, minus the server's own mean over the same
requests (the delta of `vllm:time_to_first_token_seconds_sum` / `_count`); beside it the raw client's
mean over R minus the server's mean over R. The server counts from its front end's render step to the
first token leaving the engine core; what hitproof adds on top is HTTP, the front end's own work and
hitproof's client, what the raw client adds is HTTP and the front end alone.

The replay: every request of B (plus the one cache-report probe hitproof sends before its first phase,
which is not in the log but is in the server's histogram) is sent once, in B's order. A request waits
for exactly the requests that had finished before it started in B: the slots of a round go together,
the rest one after another, as in B. Rotation's rounds after the cold one have no barrier in hitproof
(a slot waits for its own last request and its memo's): there a request waits for every request
started before those rounds and for the last one of its slot and of its memo that had finished before
it started, not for others that merely happened to finish first. The run's nonce in every body (memo
headers, cache salts) is replaced by a fresh one of the same length, so the replay's prompts are new to the cache and its
cold/hit pattern is B's (checked: the usage chunk's cached_tokens, both counts reported). The raw
client builds every request's bytes before its clock starts, takes the first network read carrying a
`data:` line with non-empty text as the first token, and parses nothing until the replay is over.

The last line on stdout is one JSON object (benchmarks/run.py reads it); progress goes to stderr.
Exit codes: 0 measured, 2 bad arguments, 3 the server or a soak failed (one line says which),
130 interrupted. A soak whose verdict is fail or inconclusive is still measured (its verdict is in
the JSON). Logs, bodies and the replay's results stay in --out (default logs/evidence-STAMP/).

Internal modes, each run in its own process by the main one:
  record BODIES -- HITPROOF_ARGS...   the hitproof command line, keeping each request body
  replay PLAN RESULT                  the raw client
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

BEFORE = HERE / "quick-before.toml"
REQUEST_TIMEOUT = 600.0        # seconds one replayed request may take (hitproof's own request timeout)
SOAK_TIMEOUT = 1500.0          # seconds one soak or the replay may take (a loaded machine is slow)
TTFT_SUM = "vllm:time_to_first_token_seconds_sum"
TTFT_COUNT = "vllm:time_to_first_token_seconds_count"
NONCE_LETTERS = "abcdefghijkmnpqrstuvwxyz"      # the alphabet of tui.core.evidence.codes.new_nonce


class Problem(Exception):
    """One line for the user; the process exits with `code`."""

    def __init__(self, message: str, code: int = 3):
        super().__init__(message)
        self.code = code


def say(line: str) -> None:
    print(f"[evidence] {line}", file=sys.stderr, flush=True)


# --- record: the hitproof command line, keeping every request body ---------------------------------

def record_main(bodies: Path, hitproof_argv: list[str]) -> int:
    """Run `hitproof HITPROOF_ARGV` in this process; write one JSON line per generation request:
    {"request": id (None for the cache-report probe), "body": the exact bytes sent, "ttft", "cached"}.

    A request's id comes from its RequestStarted event, which the Requester emits in the same task
    just before it streams the request (a context variable carries it across the awaits between)."""
    import contextvars

    from tui.cli import main as hitproof
    from tui.core.server import client as client_module
    from tui.core.log.events import EventBus, RequestStarted, RunFinished

    current: contextvars.ContextVar[int | None] = contextvars.ContextVar("hp_bench_request", default=None)
    sending: contextvars.ContextVar[dict | None] = contextvars.ContextVar("hp_bench_sending", default=None)
    kept: list[dict] = []
    emit, json_bytes, stream = EventBus.emit, client_module._json_bytes, client_module.OpenAIClient.stream

    steady: dict = {}          # CPU seconds of this process at the first request and at the run's end

    def emit_noting(self, event):
        out = emit(self, event)
        if isinstance(event, RequestStarted):
            current.set(event.request)
            if "cpu_first_request" not in steady:     # read once: a clock read per request is the bench's cost
                steady["cpu_first_request"] = time.process_time()
            steady["requests"] = steady.get("requests", 0) + 1
        elif isinstance(event, RunFinished):
            steady["cpu_run_end"] = time.process_time()
        return out

    def bytes_kept(body):
        made = json_bytes(body)
        entry = sending.get()
        if entry is not None:                 # a re-send of an unanswered request keeps the last bytes
            entry["body"] = made              # the bytes sent, as they are: decoded after the run (no second encoding)
        return made

    async def stream_noting(self, spec, *args, **kwargs):
        entry = {"request": current.get(), "order": len(kept)}
        kept.append(entry)
        token = sending.set(entry)
        try:
            completion = await stream(self, spec, *args, **kwargs)
        finally:
            sending.reset(token)
        entry["ttft"] = completion.ttft_s
        entry["cached"] = completion.cached_tokens
        return completion

    EventBus.emit = emit_noting
    client_module._json_bytes = bytes_kept
    client_module.OpenAIClient.stream = stream_noting
    try:
        return hitproof(hitproof_argv)
    finally:
        with bodies.open("w") as out:
            for entry in kept:
                if isinstance(entry.get("body"), bytes):
                    entry["body"] = entry["body"].decode("utf-8")
                out.write(json.dumps(entry) + "\n")
        if "cpu_first_request" in steady and "cpu_run_end" in steady:
            # start-up (imports, discovery, memo sizing before the first request) and shutdown excluded
            steady["cpu_s"] = steady["cpu_run_end"] - steady["cpu_first_request"]
        steady_path(bodies).write_text(json.dumps(steady))


def steady_path(bodies: Path) -> Path:
    """Where record mode keeps its steady-state CPU seconds (first request to run end)."""
    return bodies.with_name(bodies.name + ".cpu.json")


# --- replay: the raw client --------------------------------------------------------------------------

TEXT = re.compile(rb'"text":\s*"(?!")')         # a chunk carrying non-empty text
CACHED = re.compile(rb'"cached_tokens":\s*(\d+)')
PROMPT = re.compile(rb'"prompt_tokens":\s*(\d+)')
END = b"\r\n0\r\n\r\n"                          # the last chunk of a chunked response


class Pool:
    """Kept-alive connections to 127.0.0.1:port, opened before any clock starts; a connection the
    server has closed (uvicorn closes idle ones after 5 s) is replaced, outside the clock."""

    def __init__(self, port: int):
        self.port = port
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def open(self):
        return await asyncio.open_connection("127.0.0.1", self.port, limit=1 << 22)

    async def fill(self, n: int) -> None:
        for _ in range(n):
            self.idle.append(await self.open())

    async def acquire(self):
        while self.idle:
            reader, writer = self.idle.pop()
            if not reader.at_eof() and not writer.is_closing():
                return reader, writer
            writer.close()
        return await self.open()

    def release(self, conn) -> None:
        self.idle.append(conn)

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()


async def raw_one(pool: Pool, request: bytes) -> dict:
    """One request on a kept-alive connection; times only from the write to the first text."""
    for attempt in (1, 2):
        reader, writer = await pool.acquire()
        parts: list[bytes] = []
        first = None
        tail = b""
        started = time.perf_counter_ns()
        writer.write(request)
        async with asyncio.timeout(REQUEST_TIMEOUT):
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    break
                arrived = time.perf_counter_ns()
                window = tail + data
                if first is None and TEXT.search(window):
                    first = arrived
                if not parts and not data.startswith(b"HTTP/1.1 200"):
                    parts.append(data)
                    break                        # an error answer: not read to its end, not reused
                parts.append(data)
                tail = window[-24:]
                if tail.endswith(END):
                    break
        if not parts and attempt == 1:           # closed before answering: the request never ran
            writer.close()
            continue
        whole = b"".join(parts)
        if not tail.endswith(END) or not whole.startswith(b"HTTP/1.1 200"):
            writer.close()
            status = whole.split(b"\r\n", 1)[0].decode("latin-1", "replace") or "no answer"
            return {"error": f"{status} ({len(whole)} bytes)", "resent": attempt > 1}
        pool.release((reader, writer))
        return {"ttft": None if first is None else (first - started) / 1e9, "raw": whole, "resent": attempt > 1}
    raise AssertionError("unreachable")


async def replay(plan: dict) -> dict:
    port = plan["port"]
    reqs = plan["requests"]
    wire = []
    for r in reqs:                                     # every request's bytes, before any clock
        body = r["body"].encode("utf-8")
        wire.append(b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1:%d\r\ncontent-type: application/json\r\n"
                    b"accept: text/event-stream\r\ncontent-length: %d\r\n\r\n%s" % (port, len(body), body))
    done = [asyncio.Event() for _ in reqs]
    # Before any clock: request i waits for what request i-1 waited for (ready[i-1]) and for its own new
    # deps only, when those contain i-1's (they do: the requests finished before a start only grow).
    # The same waits as the full lists, without thousands of checks per request in a wide run.
    ready = [asyncio.Event() for _ in reqs]
    waits: list[tuple[bool, list[int]]] = []
    for i, r in enumerate(reqs):
        mine, before = set(r["deps"]), set(reqs[i - 1]["deps"]) if i else set()
        chained = bool(i) and before <= mine
        waits.append((chained, sorted(mine - before) if chained else list(r["deps"])))
    # "after": every request before that index has ended (a barrier-free round's start, build_plan)
    prefix = {"ended": 0, "events": {r["after"]: asyncio.Event() for r in reqs if r.get("after")}}

    def advance() -> None:
        while prefix["ended"] < len(reqs) and done[prefix["ended"]].is_set():
            prefix["ended"] += 1
        for after, event in prefix["events"].items():
            if after <= prefix["ended"]:
                event.set()

    results: list[dict] = [{} for _ in reqs]
    pool = Pool(port)
    await pool.fill(max(1, plan.get("max_in_flight", 1)))
    state = {"in_flight": 0, "max_in_flight": 0}

    async def one(i: int) -> None:
        chained, deps = waits[i]
        if reqs[i].get("after"):
            await prefix["events"][reqs[i]["after"]].wait()
        if chained:
            await ready[i - 1].wait()
        for j in deps:
            await done[j].wait()
        ready[i].set()
        began = time.monotonic()
        state["in_flight"] += 1
        state["max_in_flight"] = max(state["max_in_flight"], state["in_flight"])
        try:
            results[i] = await raw_one(pool, wire[i])
        except (OSError, TimeoutError) as exc:
            results[i] = {"error": f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__}
        state["in_flight"] -= 1
        results[i]["span"] = (began - started, time.monotonic() - started)    # the replay's clock, for phase_time
        done[i].set()
        if prefix["events"] and i == prefix["ended"]:
            advance()

    started, cpu_started = time.monotonic(), time.process_time()
    await asyncio.gather(*(one(i) for i in range(len(reqs))))
    seconds = time.monotonic() - started
    pool.close()
    out = []
    for r, res in zip(reqs, results):                  # parsed only now, with every clock stopped
        raw = res.pop("raw", b"")
        cached = CACHED.findall(raw)
        prompt = PROMPT.findall(raw)
        span = res.get("span") or (None, None)
        out.append({"key": r["key"], "ttft": res.get("ttft"), "error": res.get("error"),
                    "resent": res.get("resent", False), "start": span[0], "end": span[1],
                    "cached": int(cached[-1]) if cached else None, "prompt_tokens": int(prompt[-1]) if prompt else None})
    # CPU from the first request to the last one parsed (its start-up, the connections, excluded)
    return {"requests": out, "seconds": seconds, "max_in_flight": state["max_in_flight"],
            "cpu_s": time.process_time() - cpu_started}


def replay_main(plan_path: Path, result_path: Path) -> int:
    plan = json.loads(plan_path.read_text())
    result = asyncio.run(replay(plan))
    result_path.write_text(json.dumps(result))
    return 0


# --- reading logs --------------------------------------------------------------------------------

def read_log(path: Path) -> dict:
    """The parts of a hitproof log this benchmark needs: nonce, soak seconds, requests in start order."""
    import orjson

    nonce = ""
    first_phase = end = None
    verdict = None
    starts: dict[int, dict] = {}
    order: list[int] = []
    ends: dict[int, dict] = {}
    with path.open("rb") as handle:
        for line in handle:
            kind = line[8:30]
            if not (kind.startswith(b'"header"') or kind.startswith(b'"phase_start"') or kind.startswith(b'"run_end"')
                    or kind.startswith(b'"request_start"') or kind.startswith(b'"request_end"')):
                continue
            e = orjson.loads(line)
            t = e["type"]
            if t == "header":
                nonce = e.get("nonce") or ""
            elif t == "phase_start" and first_phase is None:
                first_phase = e["t"]
            elif t == "run_end":
                end, verdict = e["t"], e.get("verdict")
            elif t == "request_start":
                starts[e["request"]] = {"seq": e["seq"], "t": e.get("t"), "phase": e["phase"], "slot": e.get("slot"),
                                        "round": e.get("round"), "arm": e.get("arm"), "memo": e.get("memo")}
                order.append(e["request"])
            elif t == "request_end":
                ends[e["request"]] = {"seq": e["seq"], "t": e.get("t"), "ttft": e.get("ttft"),
                                      "cached": e.get("cached_tokens"), "error": e.get("error")}
    if first_phase is None or end is None:
        raise Problem(f"{path}: the log has no phase or no run_end: the soak did not finish")
    return {"nonce": nonce, "soak_s": end - first_phase, "verdict": verdict, "order": order, "starts": starts,
            "ends": ends}


def max_in_flight(log: dict) -> int:
    events = sorted([(log["starts"][r]["seq"], 1) for r in log["order"]] +
                    [(log["ends"][r]["seq"], -1) for r in log["order"] if r in log["ends"]])
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def unbarriered(start: dict) -> bool:
    """A request of rotation's rounds 1 on, which hitproof sends with no barrier between rounds."""
    return start["phase"] == "rotation" and (start.get("round") or 0) >= 1


def build_plan(log: dict, kept: list[dict], port: int, rng: random.Random) -> tuple[dict, dict]:
    """The replay plan: the probe(s) first, then every logged request in start order, each waiting for
    the requests that had finished before it started; the run's nonce swapped for a fresh one."""
    nonce = log["nonce"]
    if len(nonce) < 4:
        raise Problem("soak B's log has no run nonce: cannot make the replay's prompts new to the cache")
    fresh = nonce
    while fresh == nonce:
        fresh = "".join(rng.choice(NONCE_LETTERS) for _ in range(len(nonce)))
    by_request: dict[int, dict] = {}
    probes = []
    for entry in kept:
        if "body" not in entry:
            continue
        if entry["request"] is None:
            probes.append(entry)
        else:
            by_request[entry["request"]] = entry        # a re-send keeps the last one
    missing = [r for r in log["order"] if r not in by_request]
    if missing:
        raise Problem(f"soak B sent {len(missing)} logged request(s) whose body was not kept (first: {missing[0]})")
    requests = []
    with_nonce = 0

    def add(key: str, body: str, deps: list[int], after: int = 0) -> None:
        nonlocal with_nonce
        with_nonce += nonce in body
        requests.append({"key": key, "body": body.replace(nonce, fresh), "deps": deps, "after": after})

    for i, entry in enumerate(probes):
        add(f"probe{i}", entry["body"], list(range(i)))
    base = len(probes)
    ends, starts, order = log["ends"], log["starts"], log["order"]
    first = next((i for i, rid in enumerate(order) if unbarriered(starts[rid])), len(order))
    end = next((i for i in range(first, len(order)) if starts[order[i]]["phase"] != "rotation"
                or starts[order[i]]["arm"] == "isolation"), len(order))     # re-runs: after every phase
    wave = [i for i in range(first, end) if starts[order[i]]["slot"] is not None]    # the phase's own slots
    in_wave = set(wave)
    # rotation's rounds 1 on have no barrier (rotation.rotate): such a request waits for every request
    # started before them (all had ended) and for the last request of its slot and of its memo that had
    # ended before it started, as hitproof's own slot did; not for the others that happened to end first,
    # or the replay would take hitproof's own pace as dependencies
    wave_ends = sorted((ends[order[j]]["seq"], j) for j in wave if order[j] in ends)
    ended_at, last = 0, {}
    for i, rid in enumerate(order):
        seq = starts[rid]["seq"]
        if i in in_wave:
            while ended_at < len(wave_ends) and wave_ends[ended_at][0] < seq:
                j = wave_ends[ended_at][1]
                for key in ("slot", "memo"):
                    if starts[order[j]][key] is not None:
                        last[key, starts[order[j]][key]] = base + j
                ended_at += 1
            deps = {last[key, starts[rid][key]] for key in ("slot", "memo") if (key, starts[rid][key]) in last}
            add(str(rid), by_request[rid]["body"], sorted(deps), after=base + first)
            continue
        deps = list(range(base)) + [base + j for j, other in enumerate(order[:i])
                                    if other in ends and ends[other]["seq"] < seq]
        add(str(rid), by_request[rid]["body"], deps)
    facts = {"nonce_replaced": with_nonce, "probes": len(probes), "original_max_in_flight": max_in_flight(log)}
    return {"port": port, "max_in_flight": facts["original_max_in_flight"], "requests": requests}, facts


# --- the orchestrator ------------------------------------------------------------------------------

async def scrape(url: str) -> dict[str, float]:
    import httpx

    from tui.core.server.metrics import parse_metrics

    async with httpx.AsyncClient(timeout=30.0, trust_env=False) as client:
        try:
            response = await client.get(url + "/metrics")
        except httpx.HTTPError as exc:
            raise Problem(f"cannot read {url}/metrics: {type(exc).__name__}") from None
    if response.status_code != 200:
        return {}
    snapshot = parse_metrics(response.text)
    return {} if snapshot.error else snapshot.values


def ttft_delta(before: dict, after: dict) -> dict | None:
    if TTFT_SUM not in before or TTFT_SUM not in after:
        return None
    count = after[TTFT_COUNT] - before[TTFT_COUNT]
    total = after[TTFT_SUM] - before[TTFT_SUM]
    return {"count": int(round(count)), "sum_s": total, "mean_ms": total / count * 1000 if count else None}


async def child(argv: list[str], timeout: float, log_to: Path | None = None, what: str = "") -> tuple[int, str]:
    """A child process, bounded in time; terminated (then killed) if it overruns or we are cancelled."""
    out = log_to.open("wb") if log_to else None
    process = await asyncio.create_subprocess_exec(*argv, cwd=ROOT, stdin=asyncio.subprocess.DEVNULL,
                                                   stdout=out or asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.STDOUT)
    try:
        if out is None:
            stdout, _ = await asyncio.wait_for(process.communicate(), timeout)
            text = stdout.decode("utf-8", "replace")
        else:
            await asyncio.wait_for(process.wait(), timeout)
            text = ""
        return process.returncode, text
    except (asyncio.TimeoutError, asyncio.CancelledError) as exc:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 15)
            except asyncio.TimeoutError:
                process.kill()
                await process.wait()
        if isinstance(exc, asyncio.TimeoutError):
            raise Problem(f"{what or argv[0]} took longer than {timeout:.0f} s: stopped") from None
        raise
    finally:
        if out is not None:
            out.close()


def tail_of(path: Path) -> str:
    """hitproof's own error line from a soak's console output, else its last line."""
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "(no output)"
    errors = [line for line in lines if line.startswith("hitproof: error:")]
    return (errors[-1].removeprefix("hitproof: error:").strip() if errors else lines[-1] if lines else "(no output)")[:300]


def verdict_reasons(report: dict, most: int = 3) -> str:
    """Why a soak ended INCONCLUSIVE, from its JSON report: each inconclusive phase with its first reasons
    ("" when none was; a failed phase's findings say why it failed). A clean server's INCONCLUSIVE is read,
    not guessed at (runs N to Q left two of ten rate soaks INCONCLUSIVE with the reason on the GPU host)."""
    parts = []
    for name, phase in (report.get("phases") or {}).items():
        if isinstance(phase, dict) and phase.get("status") == "inconclusive":
            reasons = phase.get("reasons") or []
            more = f" (+{len(reasons) - most} more)" if len(reasons) > most else ""
            parts.append(f"{name} {phase.get('status')}: " + ("; ".join(reasons[:most]) + more if reasons else
                                                             "no reason given"))
    return " | ".join(parts)


def throttled(every: float = 20.0):
    """A progress callback that speaks at most every `every` seconds (startup polls every 2 s)."""
    last = [0.0]

    def progress(line: str) -> None:
        now = time.monotonic()
        if now - last[0] >= every:
            last[0] = now
            say(line)
    return progress


async def soak(name: str, scenario: str, url: str, out: Path, timeout: float, bodies: Path | None = None) -> dict:
    log = out / f"{name}.jsonl"
    console = out / f"{name}.console.txt"
    hitproof_args = ["run", "--attach", url, "--scenario", scenario, "--headless", "--record", str(log)]
    if bodies is None:
        argv = [sys.executable, "-m", "tui", *hitproof_args]
    else:
        argv = [sys.executable, str(Path(__file__).resolve()), "record", str(bodies), "--", *hitproof_args]
    say(f"soak {name}: hitproof {' '.join(hitproof_args)}")
    started = time.monotonic()
    code, _ = await child(argv, timeout, log_to=console, what=f"soak {name}")
    wall = time.monotonic() - started
    if code not in (0, 1, 4) or not log.exists():
        raise Problem(f"soak {name} ended with exit {code}: {tail_of(console)} (output: {console})")
    code_r, text = await child([sys.executable, "-m", "tui", "report", str(log), "--format", "json"], 300,
                               what=f"report of soak {name}")
    if code_r not in (0, 1, 4):
        raise Problem(f"hitproof report {log} ended with exit {code_r}: {text.strip()[-300:]}")
    report = json.loads(text)
    recall = report["power"]["evidence"]["recall"]
    facts = read_log(log)
    checked = recall["checked_hits"]
    result = {"scenario": scenario, "log": str(log), "exit_code": code, "verdict": report.get("verdict"),
              "requests": report.get("requests"), "cache_hits": report.get("cache_hits"),
              "checked_hits": checked, "failures": recall["failures"], "upper_bound_95": recall["upper_bound_95"],
              "soak_s": round(facts["soak_s"], 1), "wall_s": round(wall, 1),
              "checked_per_min": checked / facts["soak_s"] * 60 if facts["soak_s"] > 0 else 0.0,
              "target": (report["power"].get("target") or {}).get("sentence")}
    bound = "none" if result["upper_bound_95"] is None else f"{result['upper_bound_95'] * 100:.1f}%"
    say(f"soak {name}: {result['verdict']} (exit {code}), {checked} hits checked for their own code in "
        f"{result['soak_s']:.0f} s = {result['checked_per_min']:.1f}/min, rules out {bound}")
    return result


def mean_ms(values: list[float]) -> float | None:
    return sum(values) / len(values) * 1000 if values else None


def fidelity_facts(log: dict, kept: list[dict], server_b: dict | None, replayed: dict, server_r: dict | None,
                   plan: dict) -> dict:
    keys = [r["key"] for r in plan["requests"]]
    ends = log["ends"]
    logged = [ends[r]["ttft"] for r in log["order"] if r in ends and ends[r]["ttft"] is not None]
    probes = [e for e in kept if e["request"] is None and "body" in e]
    probe_ttft = [e["ttft"] for e in probes if e.get("ttft") is not None]
    raw = [r for r in replayed["requests"]]
    raw_ttft = [r["ttft"] for r in raw if r["ttft"] is not None]
    original_cached = {f"probe{i}": e.get("cached") for i, e in enumerate(probes)}
    original_cached.update({str(r): ends.get(r, {}).get("cached") for r in log["order"]})
    hits_b = sum(1 for k in keys if (original_cached.get(k) or 0) > 0)
    hits_r = sum(1 for r in raw if (r["cached"] or 0) > 0)
    differ = sum(1 for r in raw if ((r["cached"] or 0) > 0) != ((original_cached.get(r["key"]) or 0) > 0))
    cached_differ = sum(1 for r in raw if r["cached"] != original_cached.get(r["key"]))
    out = {
        "logged_requests": len(log["order"]), "logged_ttft_n": len(logged), "logged_ttft_mean_ms": mean_ms(logged),
        "probes": len(probes), "probe_ttft_n": len(probe_ttft),
        "hitproof_ttft_n": len(logged) + len(probe_ttft), "hitproof_ttft_mean_ms": mean_ms(logged + probe_ttft),
        "server_b": server_b, "server_r": server_r,
        "replayed": len(raw), "raw_ttft_n": len(raw_ttft), "raw_ttft_mean_ms": mean_ms(raw_ttft),
        "raw_errors": sum(1 for r in raw if r["error"]), "raw_resent": sum(1 for r in raw if r["resent"]),
        "raw_first_error": next((r["error"] for r in raw if r["error"]), None),
        "hits_b": hits_b, "hits_replay": hits_r, "hit_pattern_differs": differ, "cached_tokens_differ": cached_differ,
        "max_in_flight_b": plan["max_in_flight"], "max_in_flight_replay": replayed["max_in_flight"],
        "replay_s": round(replayed["seconds"], 1),
    }
    if server_b and server_b["mean_ms"] is not None and out["hitproof_ttft_mean_ms"] is not None:
        out["hitproof_added_ms"] = out["hitproof_ttft_mean_ms"] - server_b["mean_ms"]
        out["logged_added_ms"] = out["logged_ttft_mean_ms"] - server_b["mean_ms"]
    if server_r and server_r["mean_ms"] is not None and out["raw_ttft_mean_ms"] is not None:
        out["raw_added_ms"] = out["raw_ttft_mean_ms"] - server_r["mean_ms"]
    return out


async def orchestrate(args) -> dict:
    out = Path(args.out) if args.out else ROOT / "logs" / f"evidence-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    result: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "cores": os.cpu_count(),
                    "load_before": [round(v, 2) for v in os.getloadavg()], "out": str(out)}
    server = None
    try:
        if args.attach:
            url = args.attach.rstrip("/").removesuffix("/v1")
            result["server"] = {"url": url, "engine": "attached"}
        else:
            from tui.core.server.launch import LaunchError, ServerProcess, free_port
            from tui.embedded import SetupError, launch_spec, prepare

            try:
                prepare("vllm", progress=lambda line: say(f"setup: {line}"))
                spec = launch_spec("vllm", port=free_port())
            except SetupError as exc:
                raise Problem(f"vLLM setup: {exc}") from None
            server_log = (out / "vllm.log").open("w")
            server = ServerProcess(spec.argv, url=spec.url, env=spec.env,
                                   on_line=lambda line: server_log.write(line + "\n"))
            url = spec.url
            started = time.monotonic()
            try:
                await server.start()
                say(f"started vLLM (pid {server.pid}) on {url}")
                await server.wait_ready(spec.startup_timeout, progress=throttled())
            except LaunchError as exc:
                raise Problem(f"vLLM: {exc}") from None
            result["server"] = {"url": url, "engine": "vllm", "model": spec.model,
                                "ready_s": round(time.monotonic() - started, 1), "version": spec.facts.get("engine_version")}
            say(f"vLLM ready after {result['server']['ready_s']:.0f} s")
        result["before"] = await soak("A", args.before, url, out, args.timeout)
        result["load_after_a"] = [round(v, 2) for v in os.getloadavg()]
        bodies = out / "B.bodies.jsonl"
        metrics_before = await scrape(url)
        result["current"] = await soak("B", args.current, url, out, args.timeout, bodies=bodies)
        metrics_after = await scrape(url)
        result["load_after_b"] = [round(v, 2) for v in os.getloadavg()]
        server_b = ttft_delta(metrics_before, metrics_after)
        log = read_log(Path(result["current"]["log"]))
        kept = [json.loads(line) for line in bodies.read_text().splitlines() if line.strip()]
        plan, facts = build_plan(log, kept, int(url.rsplit(":", 1)[1].split("/")[0]), random.Random())
        plan_path, replay_path = out / "replay-plan.json", out / "replay-result.json"
        plan_path.write_text(json.dumps(plan))
        say(f"replay: {len(plan['requests'])} requests of soak B through the raw client "
            f"(at most {plan['max_in_flight']} at once, as in B)")
        metrics_before = await scrape(url)
        code, text = await child([sys.executable, str(Path(__file__).resolve()), "replay", str(plan_path),
                                  str(replay_path)], args.timeout, what="the raw replay")
        if code != 0:
            raise Problem(f"the raw replay ended with exit {code}: {text.strip()[-300:]}")
        metrics_after = await scrape(url)
        server_r = ttft_delta(metrics_before, metrics_after)
        replayed = json.loads(replay_path.read_text())
        result["fidelity"] = fidelity_facts(log, kept, server_b, replayed, server_r, plan) | facts
        f = result["fidelity"]
        if server_b is None:
            say("fidelity: the server has no vllm:time_to_first_token_seconds histogram: nothing to compare with")
        else:
            say(f"fidelity: hitproof {_ms(f.get('hitproof_ttft_mean_ms'))} over {f['hitproof_ttft_n']} requests, "
                f"server {_ms(server_b['mean_ms'])} over {server_b['count']}")
            say(f"fidelity: raw client {_ms(f.get('raw_ttft_mean_ms'))} over {f['raw_ttft_n']}, server "
                f"{_ms((server_r or {}).get('mean_ms'))} over {(server_r or {}).get('count', 0)}; "
                f"hits {f['hits_b']} in B, {f['hits_replay']} in the replay")
    except Problem as exc:
        if server is not None and server.exited.is_set():
            raise Problem(f"{exc}; vLLM exited with code {server.returncode}: {server.last_line()[:200]} "
                          f"(its output: {out / 'vllm.log'})") from None
        raise
    finally:
        if server is not None:
            await server.stop()
            server_log.close()
            say("vLLM stopped")
    result["load_after"] = [round(v, 2) for v in os.getloadavg()]
    (out / "result.json").write_text(json.dumps(result, indent=1))
    return result


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} ms"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["record"]:
        if len(argv) < 3 or argv[2] != "--":
            print("evidence_rate: error: usage: record BODIES -- HITPROOF_ARGS...", file=sys.stderr)
            return 2
        return record_main(Path(argv[1]), argv[3:])
    if argv[:1] == ["replay"]:
        if len(argv) != 3:
            print("evidence_rate: error: usage: replay PLAN RESULT", file=sys.stderr)
            return 2
        return replay_main(Path(argv[1]), Path(argv[2]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attach", metavar="URL", help="a running server instead of the embedded vLLM")
    parser.add_argument("--before", default=str(BEFORE), help="the baseline scenario (default: %(default)s)")
    parser.add_argument("--current", default="quick", help="the current scenario (default: %(default)s)")
    parser.add_argument("--out", metavar="DIR", help="where the logs go (default: logs/evidence-STAMP/)")
    parser.add_argument("--timeout", type=float, default=SOAK_TIMEOUT,
                        help="seconds one soak or the replay may take (default: %(default)g)")
    parser.add_argument("--json", metavar="FILE", help="also write the result here")
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error("--timeout must be more than 0 seconds")
    if args.attach and not re.match(r"^http://(127\.\d+\.\d+\.\d+|localhost|\[::1\]):\d+(/v1)?/?$", args.attach):
        parser.error("--attach takes http://127.0.0.1:PORT (this benchmark sends traffic to loopback only)")

    async def run() -> dict:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        return await orchestrate(args)

    try:
        result = asyncio.run(run())
    except Problem as exc:
        print(f"evidence_rate: error: {exc}", file=sys.stderr)
        return exc.code
    except (asyncio.CancelledError, KeyboardInterrupt):
        print("evidence_rate: interrupted (every process it started was stopped)", file=sys.stderr)
        return 130
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
