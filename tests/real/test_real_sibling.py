"""The sibling control on a real llama.cpp (Gemma 3 270M Q4_K, started here on loopback): llama.cpp has no
salt that keeps caching on, so a hit's reproducible deviation from its cold fingerprint is judged against a
fresh memo's prompt resumed the same way (tui/core/soak/sibling.py).

The tolerance here (0.1 nats, a fifth of quick's) is below what resuming costs on this server (correct hits
0.15-0.27 at the second-largest position, benchmarks/RESULTS.md "False-alarm margin"), so hits leave it
reproducibly: on the clean server each such hit must be explained by its sibling (info, `sibling_same_cost`),
never a FAIL. The fault side (every hit shifted by 0.3 nats, the siblings' hits too: still FAIL, with the
sibling's numbers in the finding) is tests/real/test_real_hybrid.py's fp_alter on llama.cpp."""

from __future__ import annotations

import pytest

from support.cli import report_json, run_hitproof, scenario
from support.servers import BackgroundServer
from tui.core.checks.detectors import SPIKE_FACTOR
from tui.core.soak.sibling import SIBLING_FACTOR


TIGHT = """
[scenario]
name = "sibling-tight"
phases = ["cold_hit"]      # a hit repeating its writer, and one resumed before a new suffix
seed = 7
[evidence]
memo_tokens = 900
codes = false
fingerprints = true
fingerprint_tokens = 12
fingerprint_top_k = 5
fingerprint_tolerance = 0.1    # below this server's own resume cost on purpose (module docstring)
recall_max_tokens = 12
summary_max_tokens = 12
turn_max_tokens = 12
[sampling]
temperature = 0.0
seed = 1234
[phases.cold_hit]
suffix_tokens = 100
"""


@pytest.fixture(scope="module")
def gemma():
    server = BackgroundServer("llamacpp", "gemma3-270m").start()
    try:
        yield server
    finally:
        server.stop()


async def soak(tmp_path, url: str):
    log = tmp_path / "run.jsonl"
    result = await run_hitproof("run", "--attach", url, "--scenario", str(scenario(tmp_path, TIGHT)), "--headless",
                                "--record", str(log), timeout=600)
    return result.code, report_json(log), result.out + result.err


def by_verdict(report: dict, verdict: str) -> list[dict]:
    return [f for f in report["findings"] if (f.get("evidence") or {}).get("twin_verdict") == verdict]


async def test_a_clean_llamacpp_under_a_tolerance_below_its_noise_never_fails(gemma, tmp_path):
    code, report, out = await soak(tmp_path, gemma.url)
    fails = [f for f in report["findings"] if f["severity"] == "fail"]
    assert fails == [], out
    assert code in (0, 4), out
    # The sibling explains the hit's cost in both: "sibling_same_cost" (info), or "sibling_untold" (a warn, the phase
    # inconclusive) where the nearest other prompt's answer is no farther than the hit. Seen once in CI (cc6a496,
    # 2026-12-06: the sibling 0.2385 apart, 0.1192 at the second position, the other prompt's answer as near; the
    # same commit then gave sibling_same_cost four runs in a row here). Neither is a FAIL.
    explained = by_verdict(report, "sibling_same_cost") + by_verdict(report, "sibling_untold")
    assert explained, "no hit left the tolerance: the sibling path did not run (tighten TIGHT)\n" + out
    for f in explained:
        e = f["evidence"]
        assert e["sibling_cached"] > 0 and e["cold_reproduced"] == 5 and e["hit_reproduced"] == 5
        mine = max(e["own_second"], e["own_distance"] / SPIKE_FACTOR)
        assert SIBLING_FACTOR * max(e["sibling_second"], e["sibling_distance"] / SPIKE_FACTOR) >= mine
