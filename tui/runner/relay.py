"""A launched server's output on the event bus: each line a ServerLog event (after the run header), a
trouble line an `engine_log` finding; every process of a launch (one server, or replicas and their
router) gets its own relay, and a relay that fails stops the soak (`Relays`)."""

from __future__ import annotations

import asyncio
import collections
from typing import Callable

from ..core.config.errors import HitproofError, InternalError
from ..core.config.redact import Redactor
from ..core.log.events import CheckpointSeen, Event, EventBus, Finding, RunFinished, ServerLog, RunHeader
from ..core.server import enginelog
from ..core.server.checkpoints import parse_checkpoint_line
from ..core.soak.engine import Outcome, SoakEngine


class ServerLogRelay:
    """A launched server's output lines become ServerLog events, but only after the header (the log's
    first line); lines that mean trouble (tui.core.server.enginelog) also become `engine_log` findings,
    which the soak engine counts like any other: in the running phase, else the next one, else the last.
    After the run has ended, lines are still relayed (the app keeps the server for isolation re-runs)
    but make no findings; once the soak has returned (detach), they only go to `echo`.
    """

    MAX_PER_KIND = 20           # a crash loop must not bury the log in findings
    CONTEXT = 5                 # lines before the classified one kept in the evidence

    def __init__(self, bus: EventBus, echo: Callable[[str], None] | None = None, *, tag: str = "",
                 replica: int | None = None):
        self.bus = bus
        self.echo = echo
        self.tag = tag                  # several servers: each line says whose it is ("[r1] ...")
        self.replica = replica          # ... and a finding from a replica's line names it
        self.buffer: list[str] = []
        self.open = False
        self.detached = False
        self.engine: SoakEngine | None = None
        self.ended = False
        self.line_no = 0
        self.recent: collections.deque[str] = collections.deque(maxlen=self.CONTEXT)
        self.per_kind: collections.Counter[str] = collections.Counter()
        self.suppressed = 0
        self.on_error: Callable[[Exception, str], None] | None = None    # a line it could not relay
        self.redact: Callable[[str], str] | None = None      # the run's secrets out of every line

    def on_event(self, event: Event) -> None:
        if isinstance(event, RunHeader) and not self.open:
            asyncio.get_running_loop().call_soon(self._flush)
        elif isinstance(event, RunFinished):
            self.ended = True

    def _flush(self) -> None:
        self.open = True
        for line in self.buffer:
            try:
                self._emit(line)
            except Exception as exc:     # called from the loop: raising here would only be logged
                if self.on_error is None:
                    raise
                self.on_error(exc, line)
        self.buffer.clear()

    def __call__(self, line: str) -> None:
        if self.redact is not None:
            line = self.redact(line)
        if self.tag:
            line = f"[{self.tag}] {line}"
        if self.echo is not None:
            self.echo(line)
        if self.detached:
            return
        if self.open:
            self._emit(line)
        else:
            self.buffer.append(line)

    def _emit(self, line: str) -> None:
        self.line_no += 1
        self.bus.emit(ServerLog(line=line))
        checkpoint = parse_checkpoint_line(line)
        if checkpoint is not None:
            self.bus.emit(CheckpointSeen(kind=checkpoint.kind, slot=checkpoint.slot, n_tokens=checkpoint.n_tokens,
                                         n_past=checkpoint.n_past, reason=checkpoint.reason, line=checkpoint.raw))
        found = None if self.ended else enginelog.classify(line)
        if found is not None:
            kind, severity = found
            self.per_kind[kind] += 1
            if self.per_kind[kind] > self.MAX_PER_KIND:
                self.suppressed += 1
            else:
                self._finding(line, kind, severity)
        self.recent.append(line)

    def _finding(self, line: str, kind: str, severity: str) -> None:
        engine = self.engine
        running = engine.running_phase() if engine is not None else ""
        started = bool(engine is not None and engine.phase_states)
        self.bus.emit(Finding(
            kind="engine_log", severity=severity, phase=running,
            detail=f"server log ({kind.replace('_', ' ')}): {line.strip()[:400]}",
            evidence={"line": line, "match": kind, "matched": enginelog.matched_text(line),
                      "line_no": self.line_no, "before": list(self.recent),
                      "when": "running" if running else ("between phases" if started else "startup")},
            replica=self.replica))

    def detach(self) -> None:
        self.detached = True


class Relays:
    """The relays of one launch: subscribed to the bus, told the engine once it exists, detached when the
    servers stop. A line one of them could not relay may have carried a fail finding: the soak stops
    with that error (exit 6, one line), also when it happens after the soak has ended (`settle`)."""

    def __init__(self, bus: EventBus, echo: Callable[[str], None] | None, redactor: Redactor | None):
        self.bus = bus
        self.echo = echo
        self.redactor = redactor
        self.all: list[ServerLogRelay] = []
        self.failures: list[HitproofError] = []
        self.engine: SoakEngine | None = None

    def new(self, *, tag: str = "", replica: int | None = None) -> ServerLogRelay:
        relay = ServerLogRelay(self.bus, echo=self.echo, tag=tag, replica=replica)
        relay.on_error = self.failed
        relay.redact = self.redactor.text if self.redactor else None
        relay.engine = self.engine
        self.bus.subscribe(relay.on_event)
        self.all.append(relay)
        return relay

    def failed(self, exc: Exception, line: str) -> None:
        if self.failures:
            return
        self.failures.append(exc if isinstance(exc, HitproofError) else InternalError(
            f"relaying the server's output failed on the line {line.strip()[:80]!r} ({type(exc).__name__}: "
            f"{exc}); its engine-log findings could be lost, so the soak stops here"))
        if self.engine is not None:
            self.engine.stop_with(self.failures[0])

    def attach(self, engine: SoakEngine) -> None:
        self.engine = engine
        for relay in self.all:
            relay.engine = engine
        if self.failures:
            engine.stop_with(self.failures[0])

    def settle(self, outcome: Outcome) -> Outcome:
        """The soak's outcome, unless a relay failed after the soak had ended."""
        if self.failures and outcome.message != str(self.failures[0]):
            return Outcome("error", self.failures[0].exit_code, str(self.failures[0]))
        return outcome

    def detach(self) -> None:
        for relay in self.all:
            relay.detach()
