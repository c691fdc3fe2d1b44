"""Scenario files: TOML -> frozen dataclasses, with errors that name file, line and key."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import builtin, toml
from .phase_registry import default_phases, known_phases, registry
from .errors import BadInput

APIS = ("completions", "chat")


@dataclass(frozen=True)
class Evidence:
    memo_tokens: int = 1600          # size of the shared memo (phases 1-3)
    block_size: int = 0              # 0: read the grid from the server; else override
    code_position: float = 0.5       # where the code sits, as a fraction of the memo
    # 0: every memo's code at code_position; above it: each memo's drawn between the two (seeded)
    code_position_max: float = 0.0
    recall_max_tokens: int = 24      # tokens of a recall answer (the code and a few words)
    summary_max_tokens: int = 100    # tokens of a summary answer
    turn_max_tokens: int = 32        # tokens of a conversation turn's answer
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
    temperature: float = 0.0         # 0: greedy (fingerprints need it)
    seed: int = 1234                 # the sampling seed sent with every request


@dataclass(frozen=True)
class Isolation:
    k: int = 4                       # runs each way when a request is isolated: k as hits, k cold


@dataclass(frozen=True)
class Power:
    """A per-hit fault rate the run must rule out: the rotation phase keeps going (more rounds,
    every hit checked) until enough hits were checked for their own code, or its time is up."""
    fault_rate: float = 0.0          # 0: no target (the report still states the power reached)
    confidence: float = 0.95         # the confidence the rate is ruled out at
    budget_s: float = 600.0          # the most the rotation phase may run, planned rounds included
    evidence: str = ""               # "recall" (codes) | "fingerprint"; empty: recall when codes are planted


@dataclass(frozen=True)
class Scenario:
    """A scenario: the run's own settings, the shared sections, and each phase's `[phases.NAME]` settings
    (the dataclass its module declares as `Settings`), read as `scenario.NAME`."""
    name: str = "default"            # the scenario's name (default: its file's name)
    description: str = ""            # one line: what the scenario is for
    api: str = "completions"         # "completions" or "chat": the endpoint every phase uses
    model: str = ""                  # empty: the first model the server lists
    phases: tuple[str, ...] = field(default_factory=default_phases)   # the phases to run, in order
    seed: int = 7                    # seeds memo text and codes (the run nonce stays random)
    request_timeout: float = 600.0   # seconds without a byte from the server before a request fails
    evidence: Evidence = field(default_factory=Evidence)
    sampling: Sampling = field(default_factory=Sampling)
    phase_settings: dict[str, Any] = field(default_factory=lambda: {
        name: module.Settings() for name, module in registry().items()})
    isolation: Isolation = field(default_factory=Isolation)
    power: Power = field(default_factory=Power)
    source: str = "<built-in>"       # file it came from
    text: str = ""                   # the file's text, recorded in the log header

    def __getattr__(self, name: str) -> Any:
        # only called for what is not a field: a phase's settings (scenario.rotation.slots)
        settings = self.__dict__.get("phase_settings")
        if settings is None or name not in settings:
            raise AttributeError(name)
        return settings[name]

    @property
    def power_evidence(self) -> str:
        """The kind of evidence a power target counts: planted codes when there are any."""
        return self.power.evidence or ("recall" if self.evidence.codes else "fingerprint")

    def to_dict(self) -> dict[str, Any]:
        """The settings the log header records: each phase's section under its own name, as before."""
        data: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name == "phase_settings":
                data.update({name: dataclasses.asdict(value) for name, value in self.phase_settings.items()})
            elif f.name != "text":
                value = getattr(self, f.name)
                data[f.name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
        return data


# The sections of the TOML file besides the phases' own (`[phases.NAME]`, from each phase's Settings).
_SECTIONS: dict[str, type] = {
    "evidence": Evidence,
    "sampling": Sampling,
    "isolation": Isolation,
    "power": Power,
}
_TOP_KEYS = {"name", "description", "api", "model", "phases", "seed", "request_timeout"}
# Each phase names its own keys' minimums (its MINIMUMS); these are the shared sections'.
_MINIMUMS = {
    "memo_tokens": 64, "recall_max_tokens": 8, "summary_max_tokens": 1, "turn_max_tokens": 1, "k": 1,
    "fingerprint_tokens": 1, "fingerprint_top_k": 1, "fingerprint_tolerance": 0.0, "fingerprint_margin": 0.0,
    "block_size": 0, "request_timeout": 1, "fault_rate": 0.0, "budget_s": 1.0,
}


def sections() -> dict[str, tuple[type, dict[str, Any]]]:
    """Every section a scenario may hold: its dataclass and its keys' minimums."""
    out = {name: (cls, _MINIMUMS) for name, cls in _SECTIONS.items()}
    for name, module in registry().items():
        out[f"phases.{name}"] = (module.Settings, getattr(module, "MINIMUMS", {}))
    return out


def load_scenario(path: str | Path) -> Scenario:
    return parse_scenario(toml.read_text(path, "scenario"), str(path))


def parse_scenario(text: str, source: str = "<scenario>") -> Scenario:
    return _build(toml.parse(text, source), text, source)


def _fail(text: str, source: str, section: str, key: str | None, message: str) -> BadInput:
    return toml.located(text, source, section, key, message)


def _build(data: dict, text: str, source: str) -> Scenario:
    known_sections = sections()
    known = known_phases()
    top = data.get("scenario", {})
    if not isinstance(top, dict):
        raise _fail(text, source, "", "scenario", "must be a table [scenario]")
    for key in data:
        if key not in ("scenario", "phases") and key not in known_sections:
            raise _fail(text, source, key, None, f"unknown section [{key}] (known: scenario, "
                        + ", ".join(sorted(known_sections)) + ")")
    for key in top:
        if key not in _TOP_KEYS:
            raise _fail(text, source, "scenario", key,
                        f"unknown key (known: {', '.join(sorted(_TOP_KEYS))})")
    values: dict[str, Any] = {}
    defaults = Scenario()
    for key in _TOP_KEYS:
        if key in top:
            values[key] = _coerce(text, source, "scenario", key, top[key], getattr(defaults, key), _MINIMUMS)
    if "api" in values and values["api"] not in APIS:
        raise _fail(text, source, "scenario", "api", f"must be one of {', '.join(APIS)}")
    if "phases" in values:
        seen = set()
        for name in values["phases"]:
            if name not in known:
                raise _fail(text, source, "scenario", "phases",
                            f"unknown phase {name!r} (known: {', '.join(known)})")
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
        if f"phases.{name}" not in known_sections:
            raise _fail(text, source, f"phases.{name}", None,
                        f"unknown phase {name!r} (known: {', '.join(known)})")
    settings: dict[str, Any] = {}
    for section, (cls, minimums) in known_sections.items():
        if section.startswith("phases."):
            name = section.split(".", 1)[1]
            settings[name] = _section(text, source, section, cls, phases_table.get(name) or {}, minimums)
        else:
            values[section] = _section(text, source, section, cls, data.get(section) or {}, minimums)
    if "name" not in values and source not in ("<scenario>", "<built-in>"):
        values["name"] = Path(source).stem          # a scenario without a name is called after its file
    scenario = Scenario(**values, phase_settings=settings, source=source, text=text)
    _check_relations(scenario, text, source)
    return scenario


def _section(text: str, source: str, section: str, cls: type, table: Any, minimums: dict[str, Any]):
    if not isinstance(table, dict):
        raise _fail(text, source, section, None, "must be a table")
    known = {f.name: f for f in dataclasses.fields(cls)}
    defaults = cls()
    kwargs = {}
    for key, value in table.items():
        if key not in known:
            raise _fail(text, source, section, key, f"unknown key (known: {', '.join(known)})")
        kwargs[key] = _coerce(text, source, section, key, value, getattr(defaults, key), minimums)
    return cls(**kwargs)


def _coerce(text: str, source: str, section: str, key: str, value: Any, default: Any,
            minimums: dict[str, Any]) -> Any:
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
    minimum = minimums.get(key)
    if minimum is not None and value < minimum:
        raise _fail(text, source, section, key, f"must be at least {minimum}, got {value}")
    return value


def _check_relations(s: Scenario, text: str, source: str) -> None:
    if not 0.0 < s.evidence.code_position < 1.0:
        raise _fail(text, source, "evidence", "code_position", "must be between 0 and 1 (exclusive)")
    top = s.evidence.code_position_max
    if top != 0.0 and not s.evidence.code_position < top < 1.0:
        raise _fail(text, source, "evidence", "code_position_max",
                    f"must be 0 (every code at code_position) or between code_position "
                    f"({s.evidence.code_position}) and 1 (exclusive), got {top}")
    if not s.evidence.codes and not s.evidence.fingerprints:
        raise _fail(text, source, "evidence", "codes", "with codes off, fingerprints must be on: nothing else "
                    "would be checked on a hit")
    if s.evidence.fingerprints and s.sampling.temperature != 0:
        raise _fail(text, source, "sampling", "temperature", "fingerprints compare greedy runs: use temperature = 0")
    if s.sampling.temperature < 0:
        raise _fail(text, source, "sampling", "temperature", "must be >= 0")
    for name, module in registry().items():         # each phase checks its own settings' relations
        problem = module.check(s.phase_settings[name]) if hasattr(module, "check") else None
        if problem:
            raise _fail(text, source, *problem)
    if not 0.0 <= s.power.fault_rate < 1.0:
        raise _fail(text, source, "power", "fault_rate", "must be at least 0 and below 1 (0.01 is 1 fault in 100 hits)")
    if not 0.0 < s.power.confidence < 1.0:
        raise _fail(text, source, "power", "confidence", "must be between 0 and 1 (exclusive), e.g. 0.95")
    if s.power.evidence not in ("", "recall", "fingerprint"):
        raise _fail(text, source, "power", "evidence", "must be \"recall\" or \"fingerprint\"")
    if s.power.evidence == "recall" and not s.evidence.codes or \
            s.power.evidence == "fingerprint" and not s.evidence.fingerprints:
        raise _fail(text, source, "power", "evidence", f"{s.power.evidence} evidence is switched off in [evidence]")


def resolve_scenario_path(name_or_path: str) -> Path:
    """A path, or a bare name looked up in ./scenarios and hitproof's own scenarios."""
    return builtin.find(name_or_path)
