"""How findings and phase outcomes become a run verdict and an exit code (one place, used by all)."""

from __future__ import annotations

from typing import Iterable

from .errors import EXIT_FAIL, EXIT_INCONCLUSIVE, EXIT_INTERRUPTED, EXIT_PASS, EXIT_SERVER

FINDING_KINDS = (
    "foreign_code", "recall_miss", "wrong_task", "empty_answer", "repetition",
    "cache_path_divergence", "kernel_nondeterminism", "no_hits", "cold_not_cold", "server_error",
    "acceptance_collapse", "foreign_state", "fingerprint_mismatch", "fingerprint_indistinct",
    "fingerprint_unavailable", "engine_log", "checkpoint_miss",
)
SEVERITIES = ("fail", "warn", "info")


def run_verdict(phase_statuses: Iterable[str], fail_findings: int) -> str:
    statuses = list(phase_statuses)
    if fail_findings or "fail" in statuses:
        return "fail"
    if not statuses or "inconclusive" in statuses:
        return "inconclusive"
    return "pass"


def exit_code(verdict: str) -> int:
    return {
        "pass": EXIT_PASS,
        "fail": EXIT_FAIL,
        "inconclusive": EXIT_INCONCLUSIVE,
        "error": EXIT_SERVER,
        "interrupted": EXIT_INTERRUPTED,
    }.get(verdict, EXIT_FAIL)
