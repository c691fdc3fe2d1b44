"""The one event stream: typed events, the JSONL codec, and the bus that fans them out.

The engine emits; the console, the recorder, the report and the app consume. Replay
decodes the same JSONL back into the same types, so what replay shows is what live showed.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import orjson

SCHEMA_VERSION = 1


@dataclass
class Event:
    type: ClassVar[str] = "event"
    seq: int = 0
    t: float = 0.0              # seconds since run start


@dataclass
class RunHeader(Event):
    type: ClassVar[str] = "header"
    schema: int = SCHEMA_VERSION
    run_id: str = ""
    nonce: str = ""
    started_at: str = ""        # ISO 8601, UTC
    tool: dict[str, Any] = field(default_factory=dict)       # name, version, python, argv
    scenario: dict[str, Any] = field(default_factory=dict)   # name, source, sha256, settings, text
    target: dict[str, Any] = field(default_factory=dict)     # url, engine, launch command, env of interest


@dataclass
class ServerInfo(Event):
    type: ClassVar[str] = "server"
    url: str = ""
    dialect: str = ""
    version: str | None = None
    models: list[str] = field(default_factory=list)
    model: str = ""
    cache_config: dict[str, str] = field(default_factory=dict)
    grid: int = 0
    grid_source: str = ""       # "server" | "scenario" | "default"
    tokenizer: str = ""         # "server" | "estimate"
    metrics_available: bool = False
    salts: str = ""             # how a cold request is forced: "cache_salt" | "cache_prompt=false"
    # How hits are proven: "request" (per-request cached tokens), "counter" (the server's counter,
    # attributed), "none" (neither: no hit can be proven); "" in older logs.
    cached_report: str = ""
    cached_counter: str = ""    # the counter used when cached_report is "counter"
    cached_queries: str = ""    # its query counter, to tell other clients' traffic apart
    cached_fix: str = ""        # the server option that would make it report per-request cached tokens
    facts: dict[str, Any] = field(default_factory=dict)
    # Behind a router: the replicas hitproof reads directly ({index, label, url, models}) and how each
    # request is attributed to one ("header NAME" | "model field" | "counter" | "none"); empty without.
    replicas: list[dict[str, Any]] = field(default_factory=list)
    replica_attribution: str = ""
    # LoRA adapters it serves: [{"name", "model", "extra", ...}] (tui.core.server.adapters)
    adapters: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class MemoPlanted(Event):
    type: ClassVar[str] = "memo"
    memo: str = ""
    phase: str = ""
    code: str | None = None
    tokens: int = 0
    sizing: str = ""
    code_offset: int | None = None
    code_tokens: list[int | None] = field(default_factory=list)
    grid: int = 0
    text: str = ""


@dataclass
class PhaseStarted(Event):
    type: ClassVar[str] = "phase_start"
    phase: str = ""
    index: int = 0
    title: str = ""
    slots: int = 0
    rounds: int = 0
    planned_requests: int = 0


@dataclass
class RoundStarted(Event):
    type: ClassVar[str] = "round"
    phase: str = ""
    round: int = 0
    rounds: int = 0
    assignment: dict[str, str] = field(default_factory=dict)   # slot -> memo id


@dataclass
class RequestStarted(Event):
    type: ClassVar[str] = "request_start"
    request: int = 0
    phase: str = ""
    slot: int | None = None
    round: int | None = None
    turn: int | None = None
    memo: str | None = None
    code: str | None = None
    task: str = ""              # recall | summary | turn | determinism | continuation
    arm: str = "main"           # main | control | isolation
    of_request: int | None = None   # for control/isolation: the request it re-sends
    salt: str | None = None
    api: str = "completions"
    expect: str = ""            # cold | hit | any
    prompt_chars: int = 0
    prompt_tail: str = ""       # the question, for the UI
    max_tokens: int = 0
    identity: str | None = None     # the adapter it runs under (None: the base model, nothing chosen)
    request_id: str | None = None   # sent as X-Request-Id: vLLM's log and answer id name the request by it


@dataclass
class AnswerDelta(Event):
    type: ClassVar[str] = "delta"
    request: int = 0
    text: str = ""              # coalesced text since the previous delta (0.1 s apart or more in the app, 1 s headless; the rest: request_end)


@dataclass
class RequestFinished(Event):
    type: ClassVar[str] = "request_end"
    request: int = 0
    phase: str = ""
    slot: int | None = None
    round: int | None = None
    text: str = ""
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    ttft: float | None = None
    total: float = 0.0
    output_tokens: int | None = None
    finish_reason: str | None = None
    checks: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    logprobs: list[list] = field(default_factory=list)   # [token, logprob, [[alt, logprob], ...]] when asked
    # How cached_tokens is known (tui.core.soak.proof): "request" (the server reported it), "counter"
    # (attributed from the server's counter), "unknown"; "" in logs from before this field.
    # cached_min/cached_max bound it when only bounds are known (cached_tokens is then None).
    cached_source: str = ""
    cached_min: int | None = None
    cached_max: int | None = None
    cold_tolerance: int | None = None    # tokens a cold request may share (before the run nonce)
    replica: int | None = None           # the replica that served it (behind a router), None: unknown
    replica_source: str = ""             # how that is known: "header" | "model" | "counter" | ""
    server_id: str | None = None         # the answer's own id (vLLM: "cmpl-" + request_id), None: not given


@dataclass
class Finding(Event):
    type: ClassVar[str] = "finding"
    kind: str = ""
    severity: str = "info"      # fail | warn | info
    phase: str = ""
    slot: int | None = None
    round: int | None = None
    request: int | None = None
    offset: int | None = None
    detail: str = ""
    memo: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    replica: int | None = None  # the replica that served the request it is about (behind a router)


@dataclass
class FingerprintCompared(Event):
    type: ClassVar[str] = "fingerprint"
    request: int = 0
    own_request: int = 0        # the cold run of the same prompt
    verdict: str = ""           # match | foreign_state | mismatch
    agreeing: int = 0           # leading tokens the same as the own fingerprint
    distance: float = 0.0       # largest log-probability difference from it (nats)
    closest: str | None = None  # for foreign_state: the memo whose fingerprint it matches
    second: float = 0.0         # the second-largest per-position difference (nats; absent in older logs)
    # the hit's whole greedy answer against its cold run's (issue 32): True the same, False different,
    # None not compared (no cold text, another max_tokens, or a phase that compares its own); absent in older logs
    text_same: bool | None = None
    phase: str = ""             # the phase the hit belongs to ("" in older logs)
    # False: another live memo's fingerprint on this question is alike to the hit's own, so the comparison
    # cannot show one's state given to the other: not counted toward the power target (None in older logs)
    told_apart: bool | None = None


@dataclass
class MetricsSample(Event):
    type: ClassVar[str] = "metrics"
    values: dict[str, float] = field(default_factory=dict)


@dataclass
class ServerLog(Event):
    type: ClassVar[str] = "server_log"
    line: str = ""


@dataclass
class IsolationStarted(Event):
    type: ClassVar[str] = "isolation_start"
    request: int = 0            # the flagged request being re-sent
    kind: str = ""              # the finding kind it was flagged for
    k: int = 0


@dataclass
class IsolationFinished(Event):
    type: ClassVar[str] = "isolation_end"
    request: int = 0
    kind: str = ""
    verdict: str = ""           # leak | hit_path_corruption | fluke
    k: int = 0
    hit_runs: int = 0
    cold_runs: int = 0
    reproduced: int = 0         # hit runs that showed the same problem
    cold_reproduced: int = 0
    detail: str = ""


@dataclass
class CheckpointSeen(Event):
    type: ClassVar[str] = "checkpoint"
    kind: str = ""              # created | restored | erased | full_reprocess | prompt_cache
    slot: int | None = None
    n_tokens: int | None = None
    n_past: int | None = None   # restored: tokens reused, equal to the request's cached tokens
    reason: str | None = None
    line: str = ""


@dataclass
class PowerJudged(Event):
    """The scenario's power target, judged once every phase has run (tui.core.report.power)."""
    type: ClassVar[str] = "power"
    evidence: str = ""          # recall | fingerprint: the checked hits counted
    fault_rate: float = 0.0     # the per-hit fault rate to rule out
    confidence: float = 0.95
    checked: int = 0            # hits checked with that evidence
    failures: int = 0
    needed: int = 0             # checked hits with no failure that rule the rate out
    reached: bool = False
    upper_bound: float | None = None
    sentence: str = ""


@dataclass
class ResumeCalibrated(Event):
    """What resuming at a grid line costs on this server, measured once at the start of the run
    (tui.core.soak.resume): the keys of `calibration` are resume.Calibration.to_dict's."""
    type: ClassVar[str] = "resume"
    phase: str = ""
    detail: str = ""            # the sentence a person reads (what is put down to resuming, and the margin)
    calibration: dict[str, Any] = field(default_factory=dict)


@dataclass
class ReplicasJudged(Event):
    """Behind a router, once every phase has run: per replica what it served, and whether the
    routing let every replica be checked (a replica that never hits while others do is not a pass)."""
    type: ClassVar[str] = "replicas"
    attribution: str = ""       # how requests were attributed (ServerInfo.replica_attribution)
    rows: list[dict[str, Any]] = field(default_factory=list)   # index, url, requests, hits, ...
    unattributed: int = 0       # requests whose replica stayed unknown
    routing_ok: bool = True     # False: some replica never hit while another did
    detail: str = ""


@dataclass
class PhaseFinished(Event):
    type: ClassVar[str] = "phase_end"
    phase: str = ""
    status: str = ""            # pass | fail | inconclusive
    reasons: list[str] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunFinished(Event):
    type: ClassVar[str] = "run_end"
    verdict: str = ""           # pass | fail | inconclusive | error | interrupted
    exit_code: int = 0
    message: str = ""


EVENT_TYPES: dict[str, type[Event]] = {
    cls.type: cls for cls in (RunHeader, ServerInfo, MemoPlanted, PhaseStarted, RoundStarted,
                              RequestStarted, AnswerDelta, RequestFinished, Finding, FingerprintCompared,
                              MetricsSample,
                              ServerLog, CheckpointSeen, IsolationStarted, IsolationFinished, PowerJudged, ReplicasJudged,
                              ResumeCalibrated, PhaseFinished,
                              RunFinished)
}
_FIELDS = {name: {f.name for f in dataclasses.fields(cls)} for name, cls in EVENT_TYPES.items()}


def encode(event: Event) -> str:
    # "type" first: readers classify a line by its prefix without parsing it.
    data = {"type": event.type}
    data.update(dataclasses.asdict(event))
    return orjson.dumps(data).decode()


class DecodeError(ValueError):
    pass


def decode(line: str | bytes) -> Event:
    try:
        data = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise DecodeError("not an event object")
    cls = EVENT_TYPES.get(data.pop("type"))
    if cls is None:
        return Event(seq=data.get("seq", 0), t=data.get("t", 0.0))   # unknown newer type: skip-able
    known = _FIELDS[cls.type]
    return cls(**{k: v for k, v in data.items() if k in known})


class EventBus:
    """Stamps seq and t, then hands each event to every listener in subscription order."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._start = clock()
        self._seq = 0
        self._listeners: list[Callable[[Event], None]] = []

    def subscribe(self, listener: Callable[[Event], None]) -> None:
        self._listeners.append(listener)

    def emit(self, event: Event) -> Event:
        self._seq += 1
        event.seq = self._seq
        event.t = round(self._clock() - self._start, 6)
        for listener in self._listeners:
            listener(event)
        return event
