"""The restore phase as the real-server tests and benchmarks/real_bugs.py run it: fingerprints (the tiny
hybrids cannot recall), a tight tolerance, the memo size, codes and damaged files chosen per run."""

RESTORE = """[scenario]
name = "restore-{name}"
phases = ["restore"]
[evidence]
memo_tokens = {tokens}
codes = {codes}
fingerprints = true
fingerprint_tokens = 12
fingerprint_top_k = 5
fingerprint_tolerance = 0.05
recall_max_tokens = 12
[sampling]
temperature = 0.0
seed = 1234
[phases.restore]
memo_tokens = {tokens}
damages = {damages}
"""


def restore_scenario(*, tokens: int, codes: bool, damages: str, name: str = "real") -> str:
    return RESTORE.format(name=name, tokens=tokens, codes=str(codes).lower(), damages=damages)
