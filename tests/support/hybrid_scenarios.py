"""The small fingerprint-only scenario the real hybrid tests soak with (models that cannot recall)."""

from __future__ import annotations


def small_fingerprint_scenario(phases: str = '["cold_hit", "rotation"]', rounds: int = 3) -> str:
    return f"""
[scenario]
phases = {phases}
[evidence]
codes = false
fingerprints = true
fingerprint_tolerance = 0.05
recall_max_tokens = 12
summary_max_tokens = 12
[phases.rotation]
slots = 4
rounds = {rounds}
memo_tokens = 1200
"""
