"""benchmarks/gpu/rate.py by width (issue 34) against the reference server: each width its own hitproof
soak (`--streams N`) and raw replay, CPU per request with start-up excluded for both, the TTFT hitproof
adds, the seconds to default's target, and the table appended to --results. No timing is asserted: what
is checked is that every figure is measured from what it says (the real numbers: benchmarks/RESULTS.md)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import evidence_rate  # noqa: E402
import phase_time  # noqa: E402
import rate  # noqa: E402

from test_evidence_rate import refserver, start, stop  # noqa: E402,F401  (the module's server fixture)


def test_quantiles_and_the_ttft_added():
    assert rate.quantile([], 0.5) is None
    assert rate.quantile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert rate.quantile([float(i) for i in range(1, 101)], 0.99) == 99.0
    added = rate.ttft_added([0.010, 0.012, 0.020], [0.009, 0.010, 0.011])
    assert added["added_median_ms"] == pytest.approx(2.0) and added["added_p99_ms"] == pytest.approx(9.0)
    assert rate.ttft_added([], [0.1])["added_median_ms"] is None


def test_phase_shares_split_the_span_where_each_phase_last_ended():
    rows = [("a", 0.0, 1.0), ("a", 0.5, 2.0), ("b", 2.5, 3.0), ("c", 2.6, 2.9), ("d", 4.0, 4.5)]
    # b from a's last end (2.0): its gap before its first request counts against it; c ended inside b: nothing
    assert phase_time.shares(rows) == {"a": 2.0, "b": 1.0, "c": 0.0, "d": 1.5}
    assert phase_time.span(rows) == 4.5 and phase_time.span([]) == 0.0 and phase_time.shares([]) == {}
    raw = [("a", 0.0, 1.5), ("b", 1.6, 2.0), ("c", 2.0, 2.1), ("d", 2.1, 2.6)]
    table = phase_time.phase_time(rows, raw)
    assert [(x["phase"], x["requests"], x["hitproof_s"], x["raw_s"], x["added_s"]) for x in table] == [
        ("a", 2, 2.0, 1.5, 0.5), ("b", 1, 1.0, 0.5, 0.5), ("c", 1, 0.0, 0.1, -0.1), ("d", 1, 1.5, 0.5, 1.0)]
    assert phase_time.line(table) == "d +1.00 s, a +0.50 s, b +0.50 s"
    assert phase_time.phase_time(rows, [])[0]["added_s"] is None and phase_time.line([]) == "none measured"


def test_phase_rows_from_a_log_and_a_replay():
    log = {"order": [1, 2, 3, 4], "ends": {1: {"t": 1.5}, 2: {"t": 2.5}, 3: {"t": 3.0}},
           "starts": {1: {"t": 1.0, "phase": "cold_hit"}, 2: {"t": 2.0, "phase": "rotation", "round": 0},
                      3: {"t": 2.6, "phase": "rotation", "round": 2, "arm": "isolation"},
                      4: {"t": 3.1, "phase": "control"}}}       # 4 never ended: it ends where it began
    replay = [{"key": "probe0", "start": 0.0, "end": 0.1}, {"key": "3", "start": 0.9, "end": 1.0},
              {"key": "1", "start": 0.1, "end": 0.4}, {"key": "2", "start": 0.5, "end": None},
              {"key": "4", "start": None, "end": None}]
    h, r = phase_time.rows_of(log, replay)
    assert h == [("cold_hit", 1.0, 1.5), ("rotation 0", 2.0, 2.5), ("rotation 1+", 2.6, 3.0), ("control", 3.1, 3.1)]
    assert r == [("cold_hit", 0.1, 0.4), ("rotation 0", 0.5, 0.5), ("rotation 1+", 0.9, 1.0)]    # the probe left out


@pytest.mark.parametrize("text", ["1", "4,x", "300", ""])
def test_bad_widths_are_exit_2(text):
    if not text:
        assert rate.parse_streams(text) == [None]
        return
    with pytest.raises(evidence_rate.Problem) as caught:
        rate.parse_streams(text)
    assert caught.value.code == 2


def rotation_only(tmp_path: Path) -> Path:
    """gpu-quick with its rotation alone and no power target: a short soak for these tests."""
    text = (ROOT / "scenarios" / "gpu-quick.toml").read_text().replace(
        'phases = ["cold_hit", "conversation", "shared_concurrency", "rotation", "long_prompt", "determinism", "control"]',
        'phases = ["rotation"]').replace("fault_rate = 0.01 ", "fault_rate = 0.0 ")
    scenario = tmp_path / "wide.toml"
    scenario.write_text(text)
    return scenario


def test_two_widths_measured_side_by_side(refserver, tmp_path):
    scenario = rotation_only(tmp_path)
    results = tmp_path / "RESULTS.md"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "rate.py"), "--attach", refserver,
                           "--scenario", str(scenario), "--streams", "4,6", "--out", str(tmp_path / "out"),
                           "--results", str(results)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    widths = json.loads(done.stdout.strip().splitlines()[-1])["widths"]
    assert [w["streams"] for w in widths] == [4, 6]
    for w in widths:
        h, r = w["hitproof"], w["raw"]
        out = tmp_path / "out" / f"streams-{w['streams']}"
        log = evidence_rate.read_log(out / "H.jsonl")
        assert h["requests"] == len(log["order"]) == h["steady_requests"]        # every request sent, counted
        assert r["requests"] == h["requests"] + 1                                 # and the cache-report probe
        assert w["plan"]["original_max_in_flight"] == w["streams"] == r["max_in_flight"]
        assert 0 < h["steady_cpu_s"] <= h["cpu_s"] and 0 < r["steady_cpu_s"] <= r["cpu_s"]   # start-up excluded
        assert w["steady_cpu_ratio"] == pytest.approx(h["steady_cpu_s_per_request"] / r["steady_cpu_s_per_request"])
        assert w["ttft"]["n_hitproof"] == h["requests"] and w["ttft"]["n_raw"] == h["requests"]
        assert w["seconds_to_default_target"] == pytest.approx(299 * 60 / h["checked_per_min"])
        phases = w["phases"]                     # rotation alone: its memos' cold round, then the rounds after
        assert [p["phase"] for p in phases] == ["rotation 0", "rotation 1+"]
        assert sum(p["requests"] for p in phases) == h["requests"]
        # each side's shares and what it spent outside its requests add up to its whole soak
        assert sum(p["hitproof_s"] for p in phases) + w["outside_requests_s"]["hitproof"] == \
            pytest.approx(h["soak_s"], abs=0.02)
        assert sum(p["raw_s"] for p in phases) + w["outside_requests_s"]["raw"] == pytest.approx(r["seconds"], abs=0.02)
        assert all(p["added_s"] == pytest.approx(p["hitproof_s"] - p["raw_s"], abs=0.002) for p in phases)
    table = results.read_text()
    assert table.count("## rate.py by width (issue 34)") == 1 and "--streams 4,6" in table
    assert [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ") and "streams" not in line] \
        == ["4", "6"]


def test_profile_soak_profiles_the_steady_window_and_says_where_the_time_went(refserver, tmp_path):
    """benchmarks/gpu/profile_soak.py: a soak's CPU by function, from its first request to run_end."""
    scenario = rotation_only(tmp_path)
    out = tmp_path / "prof"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "profile_soak.py"), "--out", str(out), "--",
                           "run", "--attach", refserver, "--scenario", str(scenario), "--streams", "4", "--headless",
                           "--record", str(tmp_path / "soak.jsonl")], capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 4), done.stderr[-2000:]
    summary = (out / "summary.txt").read_text()
    assert done.stdout.endswith(summary)                                # after hitproof's own console lines
    requests = int(summary.split("requests ", 1)[1].split(",", 1)[0])
    started = sum(1 for line in (tmp_path / "soak.jsonl").open() if line.startswith('{"type":"request_start"'))
    assert requests == started > 0
    assert "tui/core/soak" in summary and "tui/core/server" in summary
    assert "requester.py" in summary and "client.py" in summary     # the requests' own code was profiled
    assert (out / "soak.prof").stat().st_size > 0


def test_profile_soak_without_a_command_or_without_requests(tmp_path):
    script = str(ROOT / "benchmarks" / "gpu" / "profile_soak.py")
    missing = subprocess.run([sys.executable, script, "--out", str(tmp_path)], capture_output=True, text=True)
    assert missing.returncode == 2 and "after --" in missing.stderr
    nothing = subprocess.run([sys.executable, script, "--out", str(tmp_path), "--", "run", "--attach",
                              "http://127.0.0.1:9", "--scenario", "quick", "--headless",
                              "--record", str(tmp_path / "none.jsonl")],
                             capture_output=True, text=True, timeout=120)
    assert nothing.returncode == 3 and "no request ran" in nothing.stderr


def test_pairs_alternate_hitproof_and_the_raw_client_and_give_their_medians(refserver, tmp_path):
    """A GPU server's own rate moved from 54 to 40 requests a second between two pairs on one H100 (run J):
    --pairs N measures H then R N times at a width, a row each, and the median ratios over them."""
    scenario = rotation_only(tmp_path)
    results = tmp_path / "RESULTS.md"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "rate.py"), "--attach", refserver,
                           "--scenario", str(scenario), "--streams", "4", "--pairs", "2", "--out", str(tmp_path / "out"),
                           "--results", str(results), "--warm-up"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # the warm-up soak ran first, at the width, and is in no figure
    assert done.stdout.index("[rate] warm-up: exit 0 after") < done.stdout.index("[rate] H: ")
    warm = tmp_path / "out" / "warm-up" / "W.jsonl"
    assert evidence_rate.read_log(warm)["starts"]
    assert json.loads(warm.open().readline())["tool"]["argv"][-2:] == ["--streams", "4"]
    pairs = json.loads(done.stdout.strip().splitlines()[-1])["widths"]
    assert [(p["streams"], p["pair"]) for p in pairs] == [(4, 1), (4, 2)]
    for p in pairs:
        assert (tmp_path / "out" / "streams-4" / f"pair-{p['pair']}" / "result.json").is_file()
    rates = sorted(p["rate_ratio"] for p in pairs)
    line = next(x for x in done.stdout.splitlines() if "median of 2 pairs" in x)
    assert f"request-rate ratio {rate.fmt(sum(rates) / 2, 3)}" in line
    table = results.read_text()
    assert "--streams 4 --pairs 2" in table and "median of 2 pairs" in table
    assert [row.split("|")[1].strip() for row in table.splitlines() if row.startswith("| 4")] == ["4 #1", "4 #2"]
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "rate.py"), "--attach", refserver,
                          "--pairs", "0"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.strip() == "rate: error: --pairs: between 1 and 20 (got 0)"
    dead = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "rate.py"), "--attach", "http://127.0.0.1:9",
                           "--warm-up", "--out", str(tmp_path / "dead")], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert dead.returncode == 3 and dead.stderr.startswith("rate: error: the warm-up soak ended with exit 3")
