"""Whether a fingerprint deviation that does not reproduce is a restore wrong in a new way each time.

A hit that differs from its cold fingerprint gets REPRODUCE more cold runs and REPRODUCE more hits
(soak/judge.py). Kernel noise reaches the cold runs as well and rarely deviates the same way twice. A
restore that hands a different wrong state on each hit also fails to repeat the deviation, but every
one of its hits is off while every cold run reproduces: that is the cache, not the kernel.

Re-hits need not resume where the hit did. On vLLM's align mode the hit writes the state of its own last
grid line, so its re-hits resume one line later (measured, 2026-12-05, qwen3next-recurrent-recall with the
plugin's stale_checkpoint, the conversation phase: the hit at 2,688 tokens, every re-hit at 3,072, each
handed the previous line's state, 0.06-2.7 nats off its cold fingerprint against a 0.05 bound). Requiring
the same point left those hits excused as noise. Each re-hit is still held to what resuming costs at its
own point: within the run's calibrated bound, or parting from cold the way resuming can, it is right.
Clean servers (benchmarks/RESULTS.md, "The stale checkpoint, caught where it skips"): no soak fired it
(qwen3next-recurrent-recall float32 and bf16 state, 5 tiny Qwen3-Next bf16-state soaks, 4 reference-server
soaks with resume costs); in 88 earlier clean deviations whose re-hits resumed elsewhere than the hit (the
reference server's wide soaks), every one had a re-hit within its bound or not served from the cache."""

from __future__ import annotations

from typing import Sequence


def varies_on_hits(hit_resumed_right: bool, rehits_resumed_right: Sequence[bool | None], cold_reproduced: int,
                   reproduced: bool, runs: int) -> bool:
    """`rehits_resumed_right`: per re-hit, None when the cache did not serve it (nothing resumed), else
    whether it is within what resuming costs at its own point. True: every cold run reproduced the cold
    fingerprint, the hit and all `runs` re-hits are off, and the deviation did not repeat itself."""
    return (may_vary_on_hits(cold_reproduced, reproduced, runs) and len(rehits_resumed_right) == runs
            and not hit_resumed_right and all(right is False for right in rehits_resumed_right))


def may_vary_on_hits(cold_reproduced: int, reproduced: bool, runs: int) -> bool:
    """Whether varies_on_hits can say True at all, before asking where each hit resumed: only when the deviation
    did not repeat and every cold run reproduced (the judge asks only then; each ask walks the hit's lineage)."""
    return not reproduced and cold_reproduced == runs
