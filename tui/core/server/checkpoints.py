"""llama-server's context-checkpoint log lines -> typed events (pure; no I/O).

On hybrid recurrent models (Qwen3-Next, Granite-4.0-H) and sliding-window models, llama.cpp
cannot roll its recurrent state back to an arbitrary prefix: a prefix-cache hit restores a
*context checkpoint* (a saved copy of the state at some token count) and re-processes the rest.
With `-lv 4` (trace) the server says what it did with them, one line each:

    0.03.109.685 I slot create_check: id  1 | task 0 | created context checkpoint 2 of 32 (pos_min = 3036, pos_max = 3036, n_tokens = 3037, size = 0.111 MiB)
    0.03.195.324 I slot   operator(): id  1 | task 16 | restored context checkpoint (pos_min = 3036, pos_max = 3036, n_tokens = 3037, n_past = 3037, size = 0.111 MiB)
    0.03.568.889 I slot   operator(): id  1 | task 42 | forcing full prompt re-processing due to lack of cache data (likely due to SWA or hybrid/recurrent memory, see https://...)

`parse_checkpoint_line(line)` turns such a line into a `CheckpointEvent` and anything else into
None. Kinds:

- `created`: a checkpoint was saved (`index` of `limit`, at `n_tokens`);
- `restored`: a hit resumed from a checkpoint; `n_past` tokens are reused (the request's cached tokens);
- `erased`: a checkpoint was dropped; `reason` says why: `invalidated` (the new prompt diverges
  before it: pos_max > pos_next), `old` (the slot had `--ctx-checkpoints` already),
  `too_close` (within `--checkpoint-min-step` of an earlier one), `superseded` (replaced by a
  new one at the same n_tokens: routine on every hit, not a loss);
- `full_reprocess`: the slot had cached tokens but no usable checkpoint inside the shared prefix,
  so the whole prompt is processed again (cached tokens 0): a shared prefix that got no hit;
- `prompt_cache`: the RAM prompt cache (`--cache-ram`) swapped a better-matching saved prompt
  into the slot (`f_keep`, `f_sim`) before the checkpoint search.

`parse_checkpoint_config(line)` reads the start-up line `context checkpoints enabled, max = 32,
min spacing = 8192` (or `context checkpoints disabled`).

Lines may carry llama.cpp's prefix (`0.03.195.324 I `), colour codes, or neither.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["CheckpointEvent", "CheckpointConfig", "KINDS", "parse_checkpoint_line", "parse_checkpoint_config"]

KINDS = ("created", "restored", "erased", "full_reprocess", "prompt_cache")

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# "... slot create_check: id  1 | task 0 | <message>"; task is -1 while a slot has none.
_SLOT = re.compile(r"\bid\s+(?P<slot>-?\d+)\s*\|\s*task\s+(?P<task>-?\d+)\s*\|\s*(?P<msg>.*)$")
_FIELD = re.compile(r"\b(?P<key>[a-z_]+)\s*=\s*(?P<value>-?\d+(?:\.\d+)?)")
_CREATED = re.compile(r"^created context checkpoint (?P<index>\d+) of (?P<limit>\d+)\b")
_RESTORED = re.compile(r"^restored context checkpoint\b")
_ERASED = (
    (re.compile(r"^erased invalidated context checkpoint\b"), "invalidated"),
    (re.compile(r"^erasing old context checkpoint\b"), "old"),
    (re.compile(r"^erasing context checkpoint too close to an earlier one\b"), "too_close"),
    (re.compile(r"^superseding context checkpoint at\b"), "superseded"),
)
_FULL = re.compile(r"^forcing full prompt re-processing\b")
_PROMPT_CACHE = re.compile(r"\bload:\s+-\s+found better prompt with\b(?P<rest>.*)$")
_CONFIG = re.compile(r"context checkpoints (?:enabled, max = (?P<max>\d+), min spacing = (?P<min>-?\d+)|(?P<off>disabled))")

_INT_FIELDS = ("pos_min", "pos_max", "n_tokens", "n_past", "n_swa", "pos_next")


@dataclass(frozen=True)
class CheckpointEvent:
    kind: str  # one of KINDS
    raw: str  # the line as the server printed it (trailing newline removed)
    slot: int | None = None  # llama-server's slot id (None for prompt_cache lines: they are server-wide)
    task: int | None = None  # llama-server's task id (-1: no task yet)
    reason: str | None = None  # erased: invalidated | old | too_close | superseded
    index: int | None = None  # created: checkpoint `index` of `limit`
    limit: int | None = None
    pos_min: int | None = None
    pos_max: int | None = None
    n_tokens: int | None = None  # tokens covered by the checkpoint
    n_past: int | None = None  # restored: tokens reused from the cache
    n_swa: int | None = None  # erased invalidated
    pos_next: int | None = None  # erased invalidated: where processing resumes
    size_mib: float | None = None
    f_keep: float | None = None  # prompt_cache
    f_sim: float | None = None


@dataclass(frozen=True)
class CheckpointConfig:
    enabled: bool
    max_per_slot: int | None = None  # --ctx-checkpoints
    min_spacing: int | None = None  # --checkpoint-min-step (tokens)


def _fields(text: str) -> dict:
    out: dict = {}
    for m in _FIELD.finditer(text):
        key, value = m["key"], m["value"]
        if key in _INT_FIELDS:
            out[key] = int(value)
        elif key == "size":
            out["size_mib"] = float(value)
        elif key in ("f_keep", "f_sim"):
            out[key] = float(value)
    return out


def parse_checkpoint_line(line: str) -> CheckpointEvent | None:
    """The checkpoint event a llama-server log line reports, or None for any other line."""
    raw = line.rstrip("\r\n")
    if "checkpoint" not in raw and "re-processing" not in raw and "better prompt" not in raw:
        return None  # the fast path: most lines are none of these
    text = _ANSI.sub("", raw)
    if (m := _PROMPT_CACHE.search(text)) is not None:
        return CheckpointEvent("prompt_cache", raw, **_fields(m["rest"]))
    m = _SLOT.search(text)
    if m is None:
        return None
    slot, task, msg = int(m["slot"]), int(m["task"]), m["msg"].strip()
    if (c := _CREATED.match(msg)) is not None:
        return CheckpointEvent("created", raw, slot, task, index=int(c["index"]), limit=int(c["limit"]),
                               **_fields(msg[c.end():]))
    if _RESTORED.match(msg):
        return CheckpointEvent("restored", raw, slot, task, **_fields(msg))
    for pattern, reason in _ERASED:
        if pattern.match(msg):
            return CheckpointEvent("erased", raw, slot, task, reason=reason, **_fields(msg))
    if _FULL.match(msg):
        return CheckpointEvent("full_reprocess", raw, slot, task)
    return None  # e.g. "checking checkpoint with [a, b] against c...", speculative checkpoints


def parse_checkpoint_config(line: str) -> CheckpointConfig | None:
    """The start-up line saying whether context checkpoints are on, how many per slot, how far apart."""
    m = _CONFIG.search(_ANSI.sub("", line))
    if m is None:
        return None
    if m["off"]:
        return CheckpointConfig(False)
    return CheckpointConfig(True, int(m["max"]), int(m["min"]))
