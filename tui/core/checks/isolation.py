"""Isolation re-run: send a flagged request alone k times as hits and k times cold.

A whole foreign code is a leak whether or not it reproduces (no sampling can produce a code the
request never saw); isolation says whether it reproduces alone. A foreign *fingerprint* (another
request's state, seen through log-probabilities) is weaker evidence: it is a leak when it
reproduces on a hit and never cold. Hit wrong but cold right is corruption on the hit path.
Anything that does not reproduce alone is a fluke (the detail says when the cause could also be
a fault that needs concurrency). Only kinds about one answer can be isolated; the others (a cold
request that was not cold, a missing hit, a counter that disagrees, a server error) say why not.
Counts travel with the verdict, never just a label.
"""

from __future__ import annotations

from dataclasses import dataclass

ISOLATABLE = frozenset({"any", "foreign_code", "foreign_state", "recall_miss", "empty_answer", "repetition",
                        "hit_path_divergence",
                        "wrong_task", "cache_path_divergence", "fingerprint_mismatch"})
# Why a kind is not isolated: re-sending one request alone cannot tell anything about it.
NOT_ISOLATED = {
    "cold_not_cold": "a cold request that reused tokens is about the server's cache keys, not about one answer",
    "no_hits": "a missing hit is about the server's cache, not about one answer",
    "hits_disagree": "the counter and the per-request reports disagree over a whole phase",
    "hit_not_faster": "timing is judged on the phase's cold and hit requests, not on one answer",
    "hit_not_block_aligned": "the cached-token count is the server's bookkeeping, not the answer",
    "checkpoint_miss": "a missing checkpoint is the server's, not the answer's",
    "fingerprint_indistinct": "two memos looking alike is about the evidence, not about one answer",
    "fingerprint_unavailable": "there is nothing to compare without log-probabilities",
    "resume_cost": "a hit equal to its twin restored the right state; its distance from cold is arithmetic",
    "reuse_short": "reusing less than the grid promises is the server's bookkeeping, not the answer",
    "twin_unavailable": "the server could not resume the prompt at the hit's grid line under a fresh salt",
    "acceptance_collapse": "acceptance is measured over a whole turn of the replay",
    "server_error": "the server failed; there is no answer to re-send",
    "engine_log": "a server log line is not an answer",
    "partition_leak": "a leak across identities is about two identities on the same tokens: the phase ran its "
                      "own cold controls and re-runs",
    "partition_no_reuse": "a missing same-identity hit is about the server's cache, not about one answer",
    "no_evictions": "a pool that fits in the cache is about the phase's size, not about one answer",
}


@dataclass(frozen=True)
class IsolationResult:
    verdict: str           # leak | hit_path_corruption | fluke | not_isolated
    k: int
    hit_runs: int          # re-sends as hits (same salt as the original)
    cold_runs: int         # re-sends under fresh salts
    reproduced: int        # hit runs that showed the same problem
    cold_reproduced: int   # cold runs that showed it
    detail: str


def why_not_isolated(kind: str) -> str | None:
    """None when the kind can be isolated; else the reason it cannot."""
    if kind in ISOLATABLE:
        return None
    return NOT_ISOLATED.get(kind, f"{kind.replace('_', ' ')} is not about one answer")


def classify(kind: str, k: int, hit_bad: int, cold_bad: int, *, whole_code: bool = True) -> tuple[str, str]:
    """(verdict, detail with the counts). `whole_code`: for foreign_code, whether the flagged answer
    carried a whole code (or a single group judged fail-class) rather than one group too likely by chance."""
    if kind == "foreign_code" and whole_code:
        alone = "reproduces alone" if hit_bad else "does not reproduce alone (only under concurrency)"
        return "leak", f"a foreign code is a leak whether or not it reproduces; it {alone} ({hit_bad}/{k} hits)"
    if kind in ("foreign_code", "foreign_state") and hit_bad and not cold_bad:
        what = "another request's state" if kind == "foreign_state" else "the foreign group"
        return "leak", f"{what} comes back on {hit_bad}/{k} hits alone and on 0/{k} cold runs"
    if hit_bad and not cold_bad:
        return "hit_path_corruption", f"wrong on {hit_bad}/{k} hits, right on {k - cold_bad}/{k} cold runs"
    if cold_bad:
        return "fluke", (f"the cold path fails too ({cold_bad}/{k} cold, {hit_bad}/{k} hits): the model, "
                         f"not the cache")
    return "fluke", (f"does not reproduce alone (0/{k} hits, 0/{k} cold): a sampling fluke, or a fault that "
                     f"needs concurrency")
