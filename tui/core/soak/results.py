"""A phase's typed result: what it found beyond the running totals, as fields instead of string keys.

Each field, once set, is a key of the phase's PhaseFinished summary under the field's own name: logs and
`hitproof report --format json` read those keys, so a field is never renamed. A field left UNSET is not
written at all (an old log without it reads the same as a run that never set it). `read` rebuilds a
result from a summary, for the reports, which only ever see the log."""

from __future__ import annotations

import dataclasses
from typing import Any


class _Unset:
    """Not set by the run: the key is left out of the summary (None is a value the log states)."""

    def __repr__(self) -> str:
        return "UNSET"

    def __bool__(self) -> bool:
        return False


UNSET: Any = _Unset()


class PhaseResult:
    """The base of every phase's result dataclass."""

    def summary(self) -> dict[str, Any]:
        out = {}
        for f in dataclasses.fields(self):          # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is not UNSET:
                out[f.name] = value
        return out

    @classmethod
    def read(cls, summary: dict[str, Any] | None):
        """The result a log's summary states; a key the log lacks reads as None."""
        summary = summary or {}
        return cls(**{f.name: summary.get(f.name) for f in dataclasses.fields(cls)})   # type: ignore[arg-type]


@dataclasses.dataclass
class HitClaims(PhaseResult):
    """What a hit claims besides its text (cold_hit, long_prompt): whole blocks, and a shorter TTFT."""
    block_aligned: bool | None = UNSET
    ttft_cut_pct: float | None = UNSET


@dataclasses.dataclass
class Reuse(PhaseResult):
    """Reuse lost (a performance fault): how many requests reused less than the grid promised, and the
    turns whose cached tokens did not rise where the grid said they would."""
    reuse_short: int = UNSET
    turns_short: list[int] = UNSET
