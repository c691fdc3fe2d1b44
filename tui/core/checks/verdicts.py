"""How findings and phase outcomes become a run verdict and an exit code (one place, used by all)."""

from __future__ import annotations

from typing import Iterable

from ..config.errors import EXIT_FAIL, EXIT_INCONCLUSIVE, EXIT_INTERRUPTED, EXIT_PASS, EXIT_SERVER

def run_verdict(phase_statuses: Iterable[str], fail_findings: int, power_reached: bool = True) -> str:
    """fail beats everything; then a phase that proved nothing, or a power target the run asked for
    and did not reach, makes the run inconclusive; only then pass."""
    statuses = list(phase_statuses)
    if fail_findings or "fail" in statuses:
        return "fail"
    if not statuses or "inconclusive" in statuses or not power_reached:
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
