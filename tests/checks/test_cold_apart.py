"""A hit equal to its twin, far from its first cold run, where the twin equals a cold re-send
(twin_judge._resume_cost, "cold_apart").

Measured, vLLM 0.26 on an H200, qwen3next-recall, gpu-quick at 4 streams (run F, 2026-12-04; the requests
in tests/fixtures/h200-cold-apart.json): the rotation hit was 0.0557 from its first cold run (written among
4 concurrent prefills) at the second-largest position, beyond the 0.05 bound; its twin, made at low load,
equal to a cold re-send within 0.0000, and the hit within 0.036 of that re-send. far_with_twin called it a
restore wrong every time: a false FAIL. A twin as far from the cold re-sends as from the first cold run (a
zero state) still fails."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from tui.core.checks.detectors import FingerprintMatch, compare_logprobs
from tui.core.checks.fingerprints import FingerprintBook
from tui.core.soak.twin_judge import TwinJudge

DATA = json.loads((Path(__file__).parents[1] / "fixtures" / "h200-cold-apart.json").read_text())


class Sender:
    def __init__(self):
        self.scenario = SimpleNamespace(evidence=SimpleNamespace(fingerprint_tolerance=0.05))
        self.findings = []

    def finding(self, state, kind, severity, record, **facts):
        self.findings.append((kind, severity, facts.get("twin_verdict")))


def judged(twin_lp: list, fresh: list, hit: list | None = None) -> tuple[str, str, str]:
    rq = Sender()
    book = FingerprintBook(12, 0.05, 0.0)
    judge = TwinJudge(rq, book)
    judge.chain_bound = lambda record: 0.05          # the run's calibration: resumes alone exact, the floor
    hit, own = hit or DATA["hit"], DATA["own"]
    record = SimpleNamespace(request=55, cached=1152)
    twin = SimpleNamespace(record=SimpleNamespace(request=74, completion=SimpleNamespace(logprobs=twin_lp)))
    mine, vs_twin = book.match(hit, own), book.match(hit, twin_lp)
    yard = FingerprintMatch(3, False, 0.316723, 0.0)  # the nearest other prompt's, as the run had it
    judge._resume_cost(SimpleNamespace(), record, twin, mine, vs_twin, yard, {}, compare_logprobs(own, hit), fresh)
    return rq.findings[-1]


def shifted(lp: list, by: float) -> list:
    return [[tok, value - by, [[alt, v - by] for alt, v in top]] for tok, value, top in lp]


def test_a_twin_equal_to_a_cold_resend_puts_the_first_cold_run_apart_not_the_restore():
    book = FingerprintBook(12, 0.05, 0.0)
    assert book.match(DATA["hit"], DATA["own"]).second > 0.05             # beyond the bound: far by itself
    assert book.match(DATA["twin"], DATA["control"]).matches(0.05)
    assert judged(DATA["twin"], [DATA["control"]]) == ("resume_cost", "info", "cold_apart")
    # without the cold re-send it is the false FAIL the run had
    assert judged(DATA["twin"], []) == ("fingerprint_mismatch", "fail", "far_with_twin")


def test_a_twin_as_wrong_as_the_hit_still_fails():
    # every restore 0.3 nats off at every position (the proxy's fp_alter shape), the twin too: far from the
    # cold re-send as well
    assert judged(shifted(DATA["twin"], 0.3), [DATA["control"]], hit=shifted(DATA["hit"], 0.3))[1:] == \
        ("fail", "far_with_twin")
