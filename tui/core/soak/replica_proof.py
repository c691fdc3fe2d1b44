"""Which replica served a request, when the response does not say: the replicas' counters,
attributed in windows between quiet moments exactly like the cached-token counter
(tui.core.soak.proof.CounterWindows: the same grouping, another attribution). Each member leaves
its window with its Signature (completion, prompt and cached tokens); the closing scrape's per-replica
deltas (and the router's per-worker request counts) give each member the replica every
explanation of them agrees on (tui.core.server.replicas.assign), or None.
"""

from __future__ import annotations

from typing import Any

from ..server.replicas import GENERATED, ClusterSnapshot, Signature, assign, replica_deltas
from .proof import CounterWindows, quantum


class ReplicaWindows(CounterWindows):
    """CounterWindows whose scrape is a ClusterSnapshot and whose result is a replica index (or None)."""

    missing = None

    def __init__(self, scrape):
        super().__init__(scrape, counter="", queries=None)

    def _attribute(self, window, after: ClusterSnapshot | None, tolerance: int) -> dict[int, Any]:
        self.windows += 1
        self.members += len(window.members)
        before = window.before
        if window.failed or before is None or after is None:
            return {rid: None for rid in window.members}
        deltas = replica_deltas(before, after)
        if deltas is None:
            return {rid: None for rid in window.members}
        largest = max((s.get(n) or 0.0 for snaps in (before, after) for s in snaps.replicas.values() if s
                       for n in GENERATED), default=0.0)
        members = {rid: sig if isinstance(sig, Signature) else Signature(None, None, None)
                   for rid, sig in window.members.items()}
        result = assign(members, deltas, quantum(largest))
        self.attributed += sum(1 for v in result.values() if v is not None)
        return result
