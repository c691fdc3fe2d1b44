"""Scenario files: TOML -> frozen dataclasses, with errors that name file, line and key."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import builtin, toml
from .errors import BadInput

PHASE_NAMES = (
    "cold_hit",
    "conversation",
    "shared_concurrency",
    "rotation",
    "long_prompt",
    "determinism",
    "control",
    "agent_replay",
    "mix",
    "partition",
    "eviction",
)
# Phases a scenario must ask for (never in the default list): restore needs launched llama.cpp replicas.
OPTIONAL_PHASES = ("restore",)
KNOWN_PHASES = PHASE_NAMES + OPTIONAL_PHASES
APIS = ("completions", "chat")


@dataclass(frozen=True)
class Evidence:
    memo_tokens: int = 1600          # size of the shared memo (phases 1-3)
    block_size: int = 0              # 0: read the grid from the server; else override
    code_position: float = 0.5       # where the code sits, as a fraction of the memo
    recall_max_tokens: int = 24
    summary_max_tokens: int = 100
    turn_max_tokens: int = 32
    codes: bool = True               # plant codes (models that can read them back)
    fingerprints: bool = False       # compare every hit's greedy tokens and log-probabilities with the
                                     # cold run of the same prompt, and with the other memos' (any model)
    fingerprint_tokens: int = 12     # how many leading output tokens make a fingerprint
    fingerprint_top_k: int = 5       # log-probabilities per token
    fingerprint_tolerance: float = 0.0   # nats; exact on llama.cpp CPU, small for GPU kernels
    # nats two memos' cold fingerprints must be apart beyond the tolerance to count as distinct
    # (a phase that relies on fingerprints re-draws a memo that is not)
    fingerprint_margin: float = 0.0


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    seed: int = 1234


@dataclass(frozen=True)
class ColdHit:
    suffix_tokens: int = 300         # extra text appended for the "hit with a longer suffix" request


@dataclass(frozen=True)
class Conversation:
    turns: int = 6                   # turns before the recall turn
    turn_tokens: int = 160           # user text added per turn (at least one block is used)


@dataclass(frozen=True)
class SharedConcurrency:
    streams: int = 4
    rounds: int = 2
    length_step_tokens: int = 60     # stream s appends s * step tokens: different lengths


@dataclass(frozen=True)
class Rotation:
    slots: int = 4
    rounds: int = 14                 # at least; a power target can add rounds
    memo_tokens: int = 4500
    tasks: tuple[str, ...] = ("recall", "summary")   # slot s asks tasks[s % len(tasks)]


@dataclass(frozen=True)
class LongPrompt:
    memo_tokens: int = 11000


@dataclass(frozen=True)
class Determinism:
    max_tokens: int = 120
    short_memo_tokens: int = 1200
    short_runs: int = 4
    logprobs: int = 5                # top-k log-probabilities asked per token (0: text only)
    # A hit that matches cold to within this many nats until a choice this close flips is a
    # numerical difference (prefill from cache vs in full), not a wrong state. 0: exact only.
    # Measured here: llama.cpp, Gemma 3 270M Q4_K, 3,000 tokens: cold vs hit differ by up to
    # 0.23 nats with identical tokens; a zeroed or foreign state moves them by several nats.
    logprob_tolerance: float = 0.5


@dataclass(frozen=True)
class Control:
    requests: int = 4
    concurrency: int = 2


@dataclass(frozen=True)
class AgentReplay:
    source: str = ""                 # a JSONL capture of chat requests; empty: the built-in generator
    turns: int = 6                   # generator: requests in the conversation
    tools: int = 8                   # generator: tool schemas in the first block
    growth_tokens: int = 200         # generator: tool-result text added per turn (at least a block)
    integrity_every: int = 2         # generator: ask for the planted code every k turns (and last)
    max_tokens: int = 24
    control_arm: bool = True         # replay again with a fresh cache_salt per request
    acceptance_collapse: float = 1.05   # a drafter's acceptance length at or below this has collapsed


@dataclass(frozen=True)
class Mix:
    """The phase that searches instead of replaying: seeded random traffic over a pool of memos."""
    workers: int = 4                 # concurrent requests
    memos: int = 6                   # the pool, more than a server's slots
    turns: int = 3                   # turns per memo's conversation (each appends to the one before)
    memo_tokens: int = 600
    turn_tokens: int = 140           # appended per turn (at least one alignment block)
    requests: int = 200              # draws, bounded
    partial_rate: float = 0.15       # share of draws that share only the memo's first part (a short prefix)
    reproduce: int = 5               # re-sends each way (hits, cold) before a deviation is the cache's


RESTORE_DAMAGES = ("truncated", "short", "magic", "flipped", "scrambled")   # tui/core/soak/phases/restore.py


@dataclass(frozen=True)
class Restore:
    """llama.cpp slot state that moves: saved on one replica, restored on another and after a restart."""
    memo_tokens: int = 600
    slot: int = 0                    # the slot the memo is prefilled in, saved from and restored into
    damaged_slot: int = 1            # where the damaged files are restored (then checked, then erased)
    damages: tuple[str, ...] = ("truncated", "magic", "scrambled")   # see tui/core/soak/phases/restore.py


@dataclass(frozen=True)
class Partition:
    """The paired assertion: the same tokens under two identities (cache_salt, LoRA adapter) must not
    share cached blocks, and a repeat under the same identity must hit."""
    memo_tokens: int = 1200
    salts: bool = True               # cache_salt pairs, where the dialect has salts (llama.cpp has none)
    lora: bool = True                # adapter pairs, where the server serves adapters
    adapters: tuple[str, ...] = ()   # the adapters to pair; empty: the first two the server lists
    base: bool = True                # the base model is one of the identities
    base_selection: str = "explicit"   # "explicit": the base model named (llama.cpp: every adapter at
                                     # scale 0); "default": no adapter field (the server's default set)
    orders: int = 3                  # adapter orders, each on its own memo (rotations of the identities)
    concurrent: bool = True          # also every identity at once on the same memo
    calibrate: bool = True           # fingerprint tolerance from the server's own same-identity noise
                                     # (checks.detectors.calibrated_tolerance), never above the scenario's


@dataclass(frozen=True)
class Eviction:
    """A memo pool larger than the cache, cycled so every memo is evicted and re-admitted."""
    memo_tokens: int = 1200
    capacity_tokens: int = 0         # 0: from the server (vLLM num_gpu_blocks x block_size; llama.cpp slots)
    pool_factor: float = 1.5         # the pool holds this many times the capacity
    min_memos: int = 3
    max_memos: int = 64              # a bound on the pool, whatever the capacity says
    cycles: int = 3                  # passes that re-admit every memo (after the first admission)
    concurrency: int = 2             # memos sent at once in the concurrent passes (every second pass)


@dataclass(frozen=True)
class Isolation:
    k: int = 4


@dataclass(frozen=True)
class Power:
    """A per-hit fault rate the run must rule out: the rotation phase keeps going (more rounds,
    every hit checked) until enough hits were checked for their own code, or its time is up."""
    fault_rate: float = 0.0          # 0: no target (the report still states the power reached)
    confidence: float = 0.95
    budget_s: float = 600.0          # the most the rotation phase may run, planned rounds included
    evidence: str = ""               # "recall" (codes) | "fingerprint"; empty: recall when codes are planted


@dataclass(frozen=True)
class Scenario:
    name: str = "default"
    description: str = ""
    api: str = "completions"
    model: str = ""                  # empty: the first model the server lists
    phases: tuple[str, ...] = PHASE_NAMES
    seed: int = 7                    # seeds memo text and codes (the run nonce stays random)
    request_timeout: float = 600.0
    evidence: Evidence = field(default_factory=Evidence)
    sampling: Sampling = field(default_factory=Sampling)
    cold_hit: ColdHit = field(default_factory=ColdHit)
    conversation: Conversation = field(default_factory=Conversation)
    shared_concurrency: SharedConcurrency = field(default_factory=SharedConcurrency)
    rotation: Rotation = field(default_factory=Rotation)
    long_prompt: LongPrompt = field(default_factory=LongPrompt)
    determinism: Determinism = field(default_factory=Determinism)
    control: Control = field(default_factory=Control)
    agent_replay: AgentReplay = field(default_factory=AgentReplay)
    mix: Mix = field(default_factory=Mix)
    restore: Restore = field(default_factory=Restore)
    partition: Partition = field(default_factory=Partition)
    eviction: Eviction = field(default_factory=Eviction)
    isolation: Isolation = field(default_factory=Isolation)
    power: Power = field(default_factory=Power)
    source: str = "<built-in>"       # file it came from
    text: str = ""                   # the file's text, recorded in the log header

    @property
    def power_evidence(self) -> str:
        """The kind of evidence a power target counts: planted codes when there are any."""
        return self.power.evidence or ("recall" if self.evidence.codes else "fingerprint")

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.pop("text")
        return data


# Sections of the TOML file and the dataclass each one fills.
_SECTIONS: dict[str, type] = {
    "evidence": Evidence,
    "sampling": Sampling,
    "isolation": Isolation,
    "power": Power,
    "phases.cold_hit": ColdHit,
    "phases.conversation": Conversation,
    "phases.shared_concurrency": SharedConcurrency,
    "phases.rotation": Rotation,
    "phases.long_prompt": LongPrompt,
    "phases.determinism": Determinism,
    "phases.control": Control,
    "phases.agent_replay": AgentReplay,
    "phases.mix": Mix,
    "phases.restore": Restore,
    "phases.partition": Partition,
    "phases.eviction": Eviction,
}
_TOP_KEYS = {"name", "description", "api", "model", "phases", "seed", "request_timeout"}
_MINIMUMS = {
    "memo_tokens": 64, "recall_max_tokens": 8, "summary_max_tokens": 1, "turn_max_tokens": 1,
    "turns": 1, "turn_tokens": 8, "streams": 1, "rounds": 1, "slots": 2, "max_tokens": 1,
    "short_memo_tokens": 32, "short_runs": 2, "requests": 1, "concurrency": 1, "k": 1,
    "fingerprint_tokens": 1, "fingerprint_top_k": 1, "fingerprint_tolerance": 0.0, "fingerprint_margin": 0.0,
    "tools": 1, "growth_tokens": 8, "integrity_every": 1, "acceptance_collapse": 1.0,
    "block_size": 0, "suffix_tokens": 1, "logprobs": 0, "logprob_tolerance": 0.0, "length_step_tokens": 0, "request_timeout": 1,
    "fault_rate": 0.0, "budget_s": 1.0, "workers": 1, "memos": 2, "partial_rate": 0.0, "reproduce": 1,
    "orders": 1, "capacity_tokens": 0, "pool_factor": 1.0, "min_memos": 2, "max_memos": 2, "cycles": 1,
}


def load_scenario(path: str | Path) -> Scenario:
    return parse_scenario(toml.read_text(path, "scenario"), str(path))


def parse_scenario(text: str, source: str = "<scenario>") -> Scenario:
    return _build(toml.parse(text, source), text, source)


def _fail(text: str, source: str, section: str, key: str | None, message: str) -> BadInput:
    return toml.located(text, source, section, key, message)


def _build(data: dict, text: str, source: str) -> Scenario:
    top = data.get("scenario", {})
    if not isinstance(top, dict):
        raise _fail(text, source, "", "scenario", "must be a table [scenario]")
    for key in data:
        if key not in ("scenario", "phases") and key not in _SECTIONS:
            raise _fail(text, source, key, None, f"unknown section [{key}] (known: scenario, "
                        + ", ".join(sorted(_SECTIONS)) + ")")
    for key in top:
        if key not in _TOP_KEYS:
            raise _fail(text, source, "scenario", key,
                        f"unknown key (known: {', '.join(sorted(_TOP_KEYS))})")
    values: dict[str, Any] = {}
    defaults = Scenario()
    for key in _TOP_KEYS:
        if key in top:
            values[key] = _coerce(text, source, "scenario", key, top[key], getattr(defaults, key))
    if "api" in values and values["api"] not in APIS:
        raise _fail(text, source, "scenario", "api", f"must be one of {', '.join(APIS)}")
    if "phases" in values:
        seen = set()
        for name in values["phases"]:
            if name not in KNOWN_PHASES:
                raise _fail(text, source, "scenario", "phases",
                            f"unknown phase {name!r} (known: {', '.join(KNOWN_PHASES)})")
            if name in seen:
                raise _fail(text, source, "scenario", "phases", f"phase {name!r} listed twice")
            seen.add(name)
        if not values["phases"]:
            raise _fail(text, source, "scenario", "phases", "lists no phase")
        values["phases"] = tuple(values["phases"])
    phases_table = data.get("phases", {})
    if not isinstance(phases_table, dict):
        raise _fail(text, source, "", "phases", "must be tables [phases.NAME]")
    for name in phases_table:
        if f"phases.{name}" not in _SECTIONS:
            raise _fail(text, source, f"phases.{name}", None,
                        f"unknown phase {name!r} (known: {', '.join(KNOWN_PHASES)})")
    for section, cls in _SECTIONS.items():
        table = phases_table.get(section.split(".", 1)[1]) if section.startswith("phases.") \
            else data.get(section)
        attr = section.split(".")[-1]
        values[attr] = _section(text, source, section, cls, table or {})
    if "name" not in values and source not in ("<scenario>", "<built-in>"):
        values["name"] = Path(source).stem          # a scenario without a name is called after its file
    scenario = Scenario(**values, source=source, text=text)
    _check_relations(scenario, text, source)
    return scenario


def _section(text: str, source: str, section: str, cls: type, table: Any):
    if not isinstance(table, dict):
        raise _fail(text, source, section, None, "must be a table")
    known = {f.name: f for f in dataclasses.fields(cls)}
    defaults = cls()
    kwargs = {}
    for key, value in table.items():
        if key not in known:
            raise _fail(text, source, section, key, f"unknown key (known: {', '.join(known)})")
        kwargs[key] = _coerce(text, source, section, key, value, getattr(defaults, key))
    return cls(**kwargs)


def _coerce(text: str, source: str, section: str, key: str, value: Any, default: Any) -> Any:
    kind = type(default)
    if kind is tuple:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise _fail(text, source, section, key, "must be a list of strings")
        return tuple(value)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool) != (kind is bool):
        raise _fail(text, source, section, key,
                    f"must be {kind.__name__}, got {type(value).__name__} {value!r}")
    minimum = _MINIMUMS.get(key)
    if minimum is not None and value < minimum:
        raise _fail(text, source, section, key, f"must be at least {minimum}, got {value}")
    return value


def _check_relations(s: Scenario, text: str, source: str) -> None:
    if not 0.0 < s.evidence.code_position < 1.0:
        raise _fail(text, source, "evidence", "code_position", "must be between 0 and 1 (exclusive)")
    if not s.evidence.codes and not s.evidence.fingerprints:
        raise _fail(text, source, "evidence", "codes", "with codes off, fingerprints must be on: nothing else "
                    "would be checked on a hit")
    if s.evidence.fingerprints and s.sampling.temperature != 0:
        raise _fail(text, source, "sampling", "temperature", "fingerprints compare greedy runs: use temperature = 0")
    if s.sampling.temperature < 0:
        raise _fail(text, source, "sampling", "temperature", "must be >= 0")
    if any(d not in RESTORE_DAMAGES for d in s.restore.damages):
        raise _fail(text, source, "phases.restore", "damages", f"must list damages from {', '.join(RESTORE_DAMAGES)}")
    if s.restore.slot == s.restore.damaged_slot or min(s.restore.slot, s.restore.damaged_slot) < 0:
        raise _fail(text, source, "phases.restore", "damaged_slot", "must be a slot number other than `slot`")
    if not s.rotation.tasks or any(t not in ("recall", "summary") for t in s.rotation.tasks):
        raise _fail(text, source, "phases.rotation", "tasks", 'must list "recall" and/or "summary"')
    if s.mix.partial_rate > 1.0:
        raise _fail(text, source, "phases.mix", "partial_rate", "must be between 0 and 1")
    if s.mix.workers > 256:
        raise _fail(text, source, "phases.mix", "workers", "at most 256 concurrent workers")
    if not 0.0 <= s.power.fault_rate < 1.0:
        raise _fail(text, source, "power", "fault_rate", "must be at least 0 and below 1 (0.01 is 1 fault in 100 hits)")
    if not 0.0 < s.power.confidence < 1.0:
        raise _fail(text, source, "power", "confidence", "must be between 0 and 1 (exclusive), e.g. 0.95")
    if s.power.evidence not in ("", "recall", "fingerprint"):
        raise _fail(text, source, "power", "evidence", "must be \"recall\" or \"fingerprint\"")
    if s.power.evidence == "recall" and not s.evidence.codes or \
            s.power.evidence == "fingerprint" and not s.evidence.fingerprints:
        raise _fail(text, source, "power", "evidence", f"{s.power.evidence} evidence is switched off in [evidence]")
    if s.partition.base_selection not in ("explicit", "default"):
        raise _fail(text, source, "phases.partition", "base_selection", 'must be "explicit" or "default"')
    if s.eviction.max_memos < s.eviction.min_memos:
        raise _fail(text, source, "phases.eviction", "max_memos", f"must be at least min_memos ({s.eviction.min_memos})")
    if s.rotation.slots > 256 or s.shared_concurrency.streams > 256:
        raise _fail(text, source, "phases.rotation", "slots", "at most 256 concurrent slots")


def resolve_scenario_path(name_or_path: str) -> Path:
    """A path, or a bare name looked up in ./scenarios and hitproof's own scenarios."""
    return builtin.find(name_or_path)
