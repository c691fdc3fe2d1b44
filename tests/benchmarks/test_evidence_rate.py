"""benchmarks/evidence_rate.py end to end against the reference server (a real server in its own
process on 127.0.0.1), and its raw replay client against benchmarks/streamserver.py.

Nothing here asserts a timing figure: the real numbers come from the real vLLM (benchmarks/RESULTS.md).
What is checked is that the pipeline measures what it says: every request of soak B is kept and
replayed once, at B's concurrency, with the nonce swapped so that the replay's cold/hit pattern is
B's; and that the pattern check fires when the nonce is not swapped."""

import asyncio
import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))

import evidence_rate  # noqa: E402
import run as bench_run  # noqa: E402


def start(argv: list[str], pattern: str) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = process.stdout.readline()
    found = re.search(pattern, line)
    if not found:
        process.kill()
        process.wait()
        raise RuntimeError(f"server did not start: {line!r}")
    return process, found.group(1)


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    process.stdout.close()


@pytest.fixture(scope="module")
def refserver():
    # a cache that holds soak B while both replays run: with the default 65,536 tokens the stale replay found
    # no more hits than B once a run also calibrates what resuming costs at its start (issue 32: 3 more memos)
    process, url = start([sys.executable, "-m", "tui.refserver", "--port", "0", "--num-blocks", "16384"],
                         r"listening on (http://\S+)")
    yield url
    stop(process)


@pytest.fixture(scope="module")
def measured(refserver, tmp_path_factory):
    out = tmp_path_factory.mktemp("evidence")
    done = subprocess.run([sys.executable, str(BENCH / "evidence_rate.py"), "--attach", refserver, "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), out, done.stderr


def report(log: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "tui", "report", log, "--format", "json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    return json.loads(done.stdout)


def test_both_soaks_are_counted_from_their_own_logs(measured):
    result, out, _ = measured
    for name, scenario in (("before", str(BENCH / "quick-before.toml")), ("current", "quick")):
        soak = result[name]
        assert soak["scenario"] == scenario
        recall = report(soak["log"])["power"]["evidence"]["recall"]
        assert soak["checked_hits"] == recall["checked_hits"] > 0
        assert soak["upper_bound_95"] == recall["upper_bound_95"]
        facts = evidence_rate.read_log(Path(soak["log"]))
        assert soak["soak_s"] == round(facts["soak_s"], 1) > 0
        assert soak["checked_per_min"] == pytest.approx(soak["checked_hits"] / facts["soak_s"] * 60)
    # the current quick scenario asks every rotation slot for its code until 99 hits were checked
    assert result["current"]["checked_hits"] >= 99 > result["before"]["checked_hits"]
    assert result["current"]["upper_bound_95"] < 0.03 < result["before"]["upper_bound_95"]


def test_every_request_of_soak_b_is_replayed_once_at_its_concurrency(measured):
    result, out, _ = measured
    f = result["fidelity"]
    log = evidence_rate.read_log(Path(result["current"]["log"]))
    assert f["logged_requests"] == len(log["order"]) == result["current"]["requests"]
    assert f["probes"] == 1                               # the cache-report probe, not in the log
    assert f["replayed"] == f["logged_requests"] + f["probes"] == f["raw_ttft_n"]
    assert f["raw_errors"] == 0 and f["nonce_replaced"] == f["replayed"]
    plan = json.loads((out / "replay-plan.json").read_text())
    assert not any(log["nonce"] in r["body"] for r in plan["requests"])
    assert f["max_in_flight_b"] == 4 == f["max_in_flight_replay"]    # rotation's and shared_concurrency's 4 slots
    # fresh nonce, same pattern: every request cold or hit as in B, with the same cached tokens
    assert f["hits_b"] == f["hits_replay"] == result["current"]["cache_hits"]
    assert f["hit_pattern_differs"] == 0 and f["cached_tokens_differ"] == 0
    replayed = json.loads((out / "replay-result.json").read_text())["requests"]
    assert [r["key"] for r in replayed] == ["probe0"] + [str(r) for r in log["order"]]


def test_no_ttft_histogram_means_no_fidelity_row_and_says_so(measured):
    result, _, stderr = measured
    assert result["fidelity"]["server_b"] is None and "hitproof_added_ms" not in result["fidelity"]
    assert "no vllm:time_to_first_token_seconds histogram" in stderr
    rows = bench_run.evidence_rows(result)
    assert [r.figure for r in rows] == ["checked hits per minute, quick soak", "per-hit fault rate ruled out, quick soak"]
    assert rows[0].ok is True and rows[1].ok is True and all(r.ratio is not None for r in rows)
    assert "lower is better" in rows[1].target


def test_the_pattern_check_fires_when_the_replay_reuses_the_nonce(measured, refserver):
    """The same bodies with the old nonce are no longer new to the cache: cold requests come back hits."""
    result, out, _ = measured
    log = evidence_rate.read_log(Path(result["current"]["log"]))
    kept = [json.loads(line) for line in (out / "B.bodies.jsonl").read_text().splitlines()]
    plan, _ = evidence_rate.build_plan(log, kept, int(refserver.rsplit(":", 1)[1]), random.Random(1))
    original = [e["body"] for e in kept if e["request"] is None]
    original += [next(e["body"] for e in kept if e["request"] == rid) for rid in log["order"]]
    stale = [dict(r, body=body) for r, body in zip(plan["requests"], original)]
    replayed = asyncio.run(evidence_rate.replay(dict(plan, requests=stale)))
    facts = evidence_rate.fidelity_facts(log, kept, None, replayed, None, plan)
    assert facts["hit_pattern_differs"] > 0 and facts["hits_replay"] > facts["hits_b"]


def test_raw_client_first_token_is_the_first_text_not_the_headers():
    """streamserver.py sends its headers at once and the first text after 20 ms."""
    process, port = start([sys.executable, str(BENCH / "streamserver.py"), "--port", "0"], r"127\.0\.0\.1:(\d+)")
    try:
        body = json.dumps({"model": "bench:d=20,r=50,n=5", "prompt": "p", "max_tokens": 5, "stream": True,
                           "stream_options": {"include_usage": True}})
        plan = {"port": int(port), "max_in_flight": 2,
                "requests": [{"key": "a", "body": body, "deps": []}, {"key": "b", "body": body, "deps": []},
                             {"key": "c", "body": body, "deps": [0, 1]}]}
        out = asyncio.run(evidence_rate.replay(plan))
    finally:
        stop(process)
    assert [r["error"] for r in out["requests"]] == [None, None, None]
    assert all(r["ttft"] >= 0.020 for r in out["requests"])       # the server waits 20 ms before any text
    assert [r["cached"] for r in out["requests"]] == [0, 0, 0]    # streamserver: prompt_tokens // 2 of 1 token
    assert out["max_in_flight"] == 2


def test_ttft_histogram_delta_parser():
    from tui.core.server.metrics import parse_metrics

    def text(total: float, count: int) -> str:
        return ("# HELP vllm:time_to_first_token_seconds TTFT\n# TYPE vllm:time_to_first_token_seconds histogram\n"
                f'vllm:time_to_first_token_seconds_bucket{{le="+Inf",model_name="m"}} {count}\n'
                f'vllm:time_to_first_token_seconds_count{{model_name="m"}} {count}\n'
                f'vllm:time_to_first_token_seconds_sum{{model_name="m"}} {total}\n')

    before, after = parse_metrics(text(1.5, 3)).values, parse_metrics(text(4.0, 8)).values
    assert evidence_rate.ttft_delta(before, after) == {"count": 5, "sum_s": 2.5, "mean_ms": 500.0}
    assert evidence_rate.ttft_delta({}, after) is None


def test_bad_input_and_an_unreachable_server_are_one_line(tmp_path):
    bad = subprocess.run([sys.executable, str(BENCH / "evidence_rate.py"), "--attach", "http://10.1.2.3:80"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "loopback only" in bad.stderr and "Traceback" not in bad.stderr
    from tui.core.server.launch import free_port

    gone = subprocess.run([sys.executable, str(BENCH / "evidence_rate.py"), "--attach",
                           f"http://127.0.0.1:{free_port()}", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = [line for line in gone.stderr.splitlines() if line.startswith("evidence_rate: error:")]
    assert gone.returncode == 3 and len(lines) == 1 and "soak A ended with exit 3" in lines[0]
    assert "Traceback" not in gone.stderr and "None" not in lines[0]


def test_an_inconclusive_soak_says_which_phase_and_why():
    report = {"verdict": "inconclusive", "phases": {
        "cold_hit": {"status": "pass", "reasons": []},
        "rotation": {"status": "inconclusive", "reasons": [f"request {n} differs from a twin" for n in range(5)]},
        "control": {"status": "fail", "reasons": []},
        "determinism": {"status": "inconclusive"}}}
    assert evidence_rate.verdict_reasons(report) == (
        "rotation inconclusive: request 0 differs from a twin; request 1 differs from a twin; request 2 differs "
        "from a twin (+2 more) | determinism inconclusive: no reason given")
    assert evidence_rate.verdict_reasons({"verdict": "pass", "phases": {"rotation": {"status": "pass"}}}) == ""
