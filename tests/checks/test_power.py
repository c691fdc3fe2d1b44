"""Statistical power on known counts: exact bounds, sizing, and what counts as a checked hit."""

import math

import pytest

from tui.core.log.events import (Finding, FingerprintCompared, PhaseFinished, RequestFinished, RequestStarted, RunFinished, RunHeader)
from tui.core.report.power import (binom_cdf, evidence_counts, hits_needed, kind_sentence, power_json, power_line,
                                   rounds_needed, sizing_sentence, upper_bound)
from tui.core.report.report import RunReport

ALL_CHECKS = {"foreign": [], "recall": {"status": "exact"}, "empty": False, "repetition": None, "wrong_task": None}


def test_zero_failures_exact_bound_and_rule_of_three():
    assert upper_bound(100) == pytest.approx(0.029513, abs=1e-6)
    assert upper_bound(100) == pytest.approx(3 / 100, abs=0.001)       # the rule of three approximates it
    assert upper_bound(1000) == pytest.approx(3 / 1000, abs=1e-5)
    assert upper_bound(34) == pytest.approx(0.08434, abs=1e-5)
    assert upper_bound(1) == pytest.approx(0.95)


def test_nothing_checked_has_no_bound():
    assert upper_bound(0) is None
    assert upper_bound(0, 0, 0.99) is None


def test_clopper_pearson_with_failures():
    assert upper_bound(10, 1) == pytest.approx(0.3942, abs=1e-4)
    assert upper_bound(34, 1) == pytest.approx(0.13207, abs=1e-4)
    assert upper_bound(10, 10) == 1.0
    # the defining property: at the bound, so few failures have probability exactly 1 - confidence
    for n, k in ((10, 1), (50, 3), (200, 7), (5000, 2)):
        assert binom_cdf(k, n, upper_bound(n, k)) == pytest.approx(0.05, abs=1e-7)
    # the zero-failure closed form agrees with the binomial
    assert binom_cdf(0, 100, upper_bound(100)) == pytest.approx(0.05)
    assert upper_bound(10, 1, 0.99) > upper_bound(10, 1, 0.95)


def test_bound_is_monotonic():
    bounds = [upper_bound(n) for n in range(1, 400)]
    assert all(a > b for a, b in zip(bounds, bounds[1:]))
    with_one = [upper_bound(n, 1) for n in range(2, 400)]
    assert all(a > b for a, b in zip(with_one, with_one[1:]))
    assert all(upper_bound(50, k) < upper_bound(50, k + 1) for k in range(49))


def test_bad_arguments():
    for args in ((10, -1), (10, 11), (10, 0, 1.0), (10, 0, 0.0)):
        with pytest.raises(ValueError):
            upper_bound(*args)
    for args in ((0.0,), (1.0,), (0.01, 1.0)):
        with pytest.raises(ValueError):
            hits_needed(*args)
    with pytest.raises(ValueError):
        rounds_needed(0.01, 0.95, hits_per_round=0)


def test_sizing_from_a_target():
    assert hits_needed(0.01, 0.95) == 299 == math.ceil(math.log(0.05) / math.log(0.99))
    assert rounds_needed(0.01, 0.95, hits_per_round=4) == math.ceil(299 / 4) + 1 == 76
    assert rounds_needed(0.01, 0.95, hits_per_round=2) == 151
    assert hits_needed(0.5, 0.75) == 2
    sentence = sizing_sentence(0.01, 0.95, slots=4)
    assert "1 hit in 100" in sentence and "95% probability" in sentence
    assert "299 hits" in sentence and "76 rotation rounds" in sentence and "151 for recall" in sentence


def _req(rid, phase, *, code=None, task="recall", arm="main", cached=800, checks=None, seq=None):
    return [RequestStarted(seq=seq if seq is not None else 2 * rid, request=rid, phase=phase, code=code, task=task,
                           arm=arm, expect="hit" if cached else "cold"),
            RequestFinished(seq=(seq if seq is not None else 2 * rid) + 1, request=rid, phase=phase,
                            cached_tokens=cached, checks=dict(ALL_CHECKS if checks is None else checks))]


def _report(*requests, findings=(), extra=()):
    events = [RunHeader(seq=0)]
    for r in requests:
        events += r
    events += list(findings) + list(extra)
    return RunReport.from_events(events)


def test_evidence_counts_count_main_arm_hits_only():
    reqs = [_req(1, "cold_hit", code="1111-2222-3333", cached=0),                       # cold: no
            _req(2, "cold_hit", code="1111-2222-3333"),                                  # hit, one code only
            _req(3, "rotation", code="4444-5555-6666", cached=0),                        # cold
            _req(4, "rotation", code="1111-2222-3333"),                                  # hit, 2 codes seen
            _req(5, "rotation", code="4444-5555-6666", task="summary",
                 checks={"foreign": [], "empty": False, "repetition": None}),            # no recall check
            _req(6, "rotation", code="1111-2222-3333", arm="control", cached=0),         # control arm
            _req(7, "rotation", code="1111-2222-3333", arm="isolation")]                 # isolation arm
    counts = evidence_counts(_report(*reqs))
    assert counts["recall"]["checked_hits"] == 2              # requests 2 and 4
    assert counts["foreign"]["checked_hits"] == 2             # 4 and 5: a second code existed before them
    assert counts["empty"]["checked_hits"] == counts["repetition"]["checked_hits"] == 3
    assert counts["determinism"]["checked_hits"] == 0 and counts["determinism"]["upper_bound_95"] is None
    assert counts["recall"]["upper_bound_95"] == round(upper_bound(2), 4)
    assert "no greedy hits" in counts["determinism"]["sentence"]


def test_failures_are_fail_class_findings_on_checked_hits():
    reqs = [_req(i, "rotation", code=f"{1000 + i}-{2000 + i}-{3000 + i}") for i in range(1, 11)]
    findings = [Finding(seq=100, kind="recall_miss", severity="fail", phase="rotation", request=3),
                Finding(seq=101, kind="recall_miss", severity="info", phase="rotation", request=4),   # model fault
                Finding(seq=102, kind="foreign_code", severity="warn", phase="rotation", request=5),  # one group
                Finding(seq=103, kind="foreign_code", severity="fail", phase="rotation", request=6)]
    counts = evidence_counts(_report(*reqs, findings=findings))
    assert counts["recall"] == {"checked_hits": 10, "failures": 1, "upper_bound_95": round(upper_bound(10, 1), 4),
                                "sentence": kind_sentence("recall", 10, 1)}
    assert counts["foreign"]["checked_hits"] == 9 and counts["foreign"]["failures"] == 1
    assert "1 wrong (10%)" in counts["recall"]["sentence"] and "at most 39.4%" in counts["recall"]["sentence"]


def test_determinism_counts_only_a_classification_that_can_tell():
    def det(kind, severity=None):
        reqs = [_req(1, "determinism", code="1111-2222-3333", task="determinism", cached=0, checks={"foreign": []}),
                _req(2, "determinism", code="1111-2222-3333", task="determinism", checks={"foreign": []}),
                _req(3, "determinism", code="1111-2222-3333", task="determinism", checks={"foreign": []})]
        findings = [Finding(seq=49, kind="cache_path_divergence", severity=severity, phase="determinism",
                            request=2)] if severity else []
        end = PhaseFinished(seq=50, phase="determinism", status="pass",
                            summary={"determinism": {"kind": kind, "hit_vs_cold": 4 if kind != "identical" else None}})
        return evidence_counts(_report(*reqs, findings=findings, extra=[end]))["determinism"]
    assert det("identical")["checked_hits"] == 2 and det("identical")["failures"] == 0
    assert det("cache_path_divergence", "fail")["failures"] == 2  # hit == hit != cold: both diverged
    # a near-tied flip judged info is numerics: the power count agrees with the verdict (no failure)
    assert det("cache_path_divergence", "info") == {**det("identical"), "sentence": det("identical")["sentence"]}
    assert det("kernel_nondeterminism")["checked_hits"] == 0      # the kernel varies: hit vs cold tells nothing


def test_whole_greedy_answers_held_against_their_cold_run_count_as_greedy_hits_compared():
    """Issue 32: every hit whose whole greedy answer the judge compared with its prompt's cold answer counts,
    once, with the determinism phase's own; a fail-class divergence on one of them is a failure."""
    reqs = [_req(i, "rotation", code=f"{1000 + i}-{2000 + i}-{3000 + i}") for i in range(1, 6)]
    compared = [FingerprintCompared(seq=100 + i, request=i, own_request=0, verdict="match", phase="rotation",
                                    text_same=i != 4) for i in range(1, 5)]            # 5: not compared
    compared.append(FingerprintCompared(seq=110, request=1, own_request=0, verdict="match", phase="rotation",
                                        text_same=True))                                # counted once
    compared.append(FingerprintCompared(seq=111, request=5, own_request=0, verdict="match", phase="rotation"))
    findings = [Finding(seq=120, kind="cache_path_divergence", severity="fail", phase="rotation", request=4)]
    counts = evidence_counts(_report(*reqs, findings=compared + findings))["determinism"]
    assert counts["checked_hits"] == 4 and counts["failures"] == 1
    assert counts["sentence"].startswith("4 greedy hits compared with their cold run, 1 diverged")


def test_power_line_on_known_counts():
    codes = [f"{1000 + i}-{2000 + i}-{3000 + i}" for i in range(40)]
    reqs = [_req(i + 1, "rotation", code=codes[i], task="recall" if i < 34 else "summary",
                 checks=ALL_CHECKS if i < 34 else {"foreign": [], "empty": False, "repetition": None})
            for i in range(40)]
    report = _report(*reqs, extra=[RunFinished(seq=999, verdict="pass", exit_code=0)])
    line = power_line(report)
    assert "34 hits checked for their own code, 0 wrong (above 8.4% would have shown)" in line
    assert "39 hits checked for foreign codes, 0 seen (above 7.4% would have shown)" in line   # the first has no other code
    assert "40 hits checked for empty answers" in line and "no greedy hits compared" in line
    assert line.startswith("power at 95% confidence")
    data = power_json(report)
    assert data["evidence"]["recall"]["upper_bound_95"] == pytest.approx(0.0843, abs=1e-4)
    assert data["sizing"]["rotation_rounds"] == 76 and data["line"] == line
