"""Progress you can plan by: per phase and for the run, requests done of planned, elapsed, and an
estimate of the rest from the rates seen so far; with a power target, its checked hits of needed. Pure.

Folded from the event stream (live or a log) like the report. What it knows and how it guesses:

- **planned**: a phase's main-arm requests as it announced them (PhaseStarted), or, before it started,
  as the run header's plan says (`scenario.plan`, written by the engine; a log without one knows only
  the phases that started). A phase that plans 0 (an agent capture not read yet) is unknown.
- **rate**: seconds per finished main-arm request. A running phase uses its own (elapsed so far over
  requests done: concurrency is in it); a phase not started yet, or one without a finished request,
  uses the run's so far (every phase's time over every phase's requests). Phases cost differently
  (a long cold prompt is slower than a hit): the estimate of a phase not started is a rough one,
  and sharpens as soon as the phase has finished a request.
- **rotation with a power target** (its module's `progress_expected`, `progress_remaining`) goes on
  after its planned rounds until the run's checked hits reach the target, its time budget is spent,
  or a checked hit fails. Its expected length is the rounds that reach the target at the rate hits
  were checked so far (a priori: one check per recall slot a round after the cold round 0), never
  fewer than its own rounds nor more than the plan's upper bound, and its time never beyond the budget.
- Isolation re-runs (`--isolate`) after the phases are not planned and not estimated.

`estimate(now)` gives the picture at a moment (`now`: seconds on the run's clock, the events' `t`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..log.events import (Event, PhaseFinished, PhaseStarted, PowerJudged, RequestFinished, RequestStarted,
                          RunFinished, RunHeader)
from ..config.phase_registry import hook
from . import fmt
from .power import EvidenceTally, hits_needed


@dataclass
class _Phase:
    name: str
    planned: int | None = None           # main-arm requests it plans; None: unknown
    done: int = 0
    started: float | None = None
    ended: float | None = None
    status: str = "pending"              # pending | running | pass | fail | inconclusive
    checked_at_start: int = 0            # the power evidence's checked hits when it started


@dataclass(frozen=True)
class Estimate:
    """One line of progress: a phase, or the whole run."""
    name: str
    status: str
    done: int
    planned: int | None                  # as planned (rotation with a target: its upper bound); None: unknown
    expected: int | None                 # the best guess of the total (rotation with a target: fewer)
    elapsed_s: float
    remaining_s: float | None            # None: no rate seen yet, or something unknown
    basis: str = ""                      # how remaining_s was guessed: "own rate" | "run rate" | "" (none)

    @property
    def finished(self) -> bool:
        return self.status not in ("pending", "running")


@dataclass(frozen=True)
class PowerProgress:
    evidence: str                        # recall | fingerprint
    fault_rate: float
    confidence: float
    checked: int
    needed: int
    failures: int
    reached: bool | None                 # None until the run judged it (PowerJudged)


@dataclass(frozen=True)
class RunProgress:
    phases: list[Estimate]
    run: Estimate
    power: PowerProgress | None

    def phase(self, name: str) -> Estimate | None:
        return next((p for p in self.phases if p.name == name), None)

    @property
    def running(self) -> Estimate | None:
        return next((p for p in self.phases if p.status == "running"), None)


class ProgressFold:
    """Feed it every event (or at least headers, phases, requests, findings, fingerprints, power).

    `tally`: the run's EvidenceTally when the caller already feeds one (RunReport's); without it the
    fold keeps its own."""

    def __init__(self, tally: EvidenceTally | None = None) -> None:
        self._own_tally = tally is None
        self.tally = tally if tally is not None else EvidenceTally()
        self.t0 = 0.0
        self.last_t = 0.0
        self.ended: float | None = None
        self.phases: dict[str, _Phase] = {}
        self._open: dict[int, str] = {}            # main-arm request -> phase
        self.settings: dict[str, Any] = {}
        self.power_judged: PowerJudged | None = None
        self.version = 0

    # --- folding ----------------------------------------------------------------------------

    def feed(self, event: Event) -> None:
        if self._own_tally:
            self.tally.feed(event)
        if event.t > self.last_t:
            self.last_t = event.t
        handler = _HANDLERS.get(type(event))
        if handler is not None:
            handler(self, event)
            self.version += 1

    def _on_header(self, e: RunHeader) -> None:
        self.t0 = e.t
        scenario = e.scenario or {}
        self.settings = scenario.get("settings") or {}
        plan = scenario.get("plan") or {}
        for name in self.settings.get("phases") or plan:
            entry = plan.get(name) or {}
            planned = entry.get("planned_requests") if isinstance(entry, dict) else None
            self.phases.setdefault(name, _Phase(name, _known(planned)))

    def _on_phase_start(self, e: PhaseStarted) -> None:
        phase = self.phases.setdefault(e.phase, _Phase(e.phase))
        phase.planned = _known(e.planned_requests)
        phase.started, phase.status, phase.done = e.t, "running", 0
        phase.checked_at_start = self._checked()

    def _on_request_start(self, e: RequestStarted) -> None:
        if e.arm == "main":
            self._open[e.request] = e.phase

    def _on_request_end(self, e: RequestFinished) -> None:
        name = self._open.pop(e.request, None)
        if name is not None and name in self.phases:
            self.phases[name].done += 1

    def _on_phase_end(self, e: PhaseFinished) -> None:
        phase = self.phases.setdefault(e.phase, _Phase(e.phase))
        phase.ended, phase.status = e.t, e.status
        if phase.started is None:
            phase.started = e.t

    def _on_power(self, e: PowerJudged) -> None:
        self.power_judged = e

    def _on_run_end(self, e: RunFinished) -> None:
        self.ended = e.t

    def running_phase(self) -> str | None:
        return next((p.name for p in self.phases.values() if p.status == "running"), None)

    # --- the power target -------------------------------------------------------------------

    def target(self) -> tuple[str, float, float, int] | None:
        """(evidence, fault rate, confidence, checked hits needed), or None without a target."""
        power = self.settings.get("power") or {}
        rate = power.get("fault_rate") or 0.0
        if not 0.0 < rate < 1.0:
            return None
        confidence = power.get("confidence") or 0.95
        evidence = power.get("evidence") or ("recall" if (self.settings.get("evidence") or {}).get("codes", True)
                                             else "fingerprint")
        return evidence, rate, confidence, hits_needed(rate, confidence)

    def _checked(self) -> int:
        target = self.target()
        return self.tally.checked.get(target[0], 0) if target else 0

    def power(self) -> PowerProgress | None:
        judged = self.power_judged
        if judged is not None:
            return PowerProgress(judged.evidence, judged.fault_rate, judged.confidence, judged.checked,
                                 judged.needed, judged.failures, judged.reached)
        target = self.target()
        if target is None:
            return None
        evidence, rate, confidence, needed = target
        return PowerProgress(evidence, rate, confidence, self.tally.checked.get(evidence, 0), needed,
                             self.tally.failures.get(evidence, 0), None)

    # --- the picture at a moment -----------------------------------------------------------------

    def estimate(self, now: float | None = None) -> RunProgress:
        now = max(self.last_t, now if now is not None else self.last_t)
        if self.ended is not None:
            now = self.ended
        spent = done = 0.0
        for p in self.phases.values():
            if p.started is not None and p.done:
                spent += (p.ended if p.ended is not None else now) - p.started
                done += p.done
        run_rate = spent / done if done else None
        rows = []
        for p in self.phases.values():
            rows.append(self._row(p, now, run_rate))
        power = self.power()
        total_done = sum(r.done for r in rows)
        planned = None if any(r.planned is None for r in rows) else sum(r.planned or 0 for r in rows)
        expected = None if any(r.expected is None for r in rows) else sum(r.expected or 0 for r in rows)
        finished = self.ended is not None
        open_rows = [r for r in rows if not r.finished]
        if finished:
            remaining: float | None = 0.0
        elif any(r.remaining_s is None for r in open_rows):
            remaining = None
        else:
            remaining = sum(r.remaining_s or 0.0 for r in open_rows)
        bases = {r.basis for r in open_rows if r.basis}
        status = "done" if finished else ("running" if any(p.started is not None for p in self.phases.values())
                                          else "pending")
        run = Estimate("run", status, total_done, planned, expected if not finished else total_done,
                       max(0.0, now - self.t0), remaining,
                       "run rate" if "run rate" in bases else ("own rate" if bases else ""))
        return RunProgress(rows, run, power)

    def _row(self, p: _Phase, now: float, run_rate: float | None) -> Estimate:
        elapsed = 0.0 if p.started is None else max(0.0, (p.ended if p.ended is not None else now) - p.started)
        if p.status not in ("pending", "running"):
            return Estimate(p.name, p.status, p.done, p.planned, p.done, elapsed, 0.0, "")
        expected = p.planned
        own_guess = hook(p.name, "progress_expected")  # a phase whose length is not its plan says its own
        guess = own_guess(self, p) if own_guess is not None else None
        if guess is not None:
            expected = guess
        if expected is not None and p.status == "running":
            expected = max(expected, p.done)
        own = elapsed / p.done if p.status == "running" and p.done else None
        rate, basis = (own, "own rate") if own is not None else (run_rate, "run rate" if run_rate is not None else "")
        if expected is None or rate is None:
            return Estimate(p.name, p.status, p.done, p.planned, expected, elapsed, None, "")
        remaining = max(0, expected - p.done) * rate
        bound = hook(p.name, "progress_remaining")     # ... and when it stops
        if bound is not None:
            remaining = bound(self, p, remaining, rate, elapsed)
        return Estimate(p.name, p.status, p.done, p.planned, expected, elapsed, remaining, basis)


_HANDLERS = {RunHeader: ProgressFold._on_header, PhaseStarted: ProgressFold._on_phase_start,
             RequestStarted: ProgressFold._on_request_start, RequestFinished: ProgressFold._on_request_end,
             PhaseFinished: ProgressFold._on_phase_end, PowerJudged: ProgressFold._on_power,
             RunFinished: ProgressFold._on_run_end}


def _known(planned: Any) -> int | None:
    return planned if isinstance(planned, int) and planned > 0 else None


# --- words ----------------------------------------------------------------------------------------

def done_text(e: Estimate) -> str:
    """'12/40', '12/~31' (expected below the plan), '12/?' (unknown); '40' once finished."""
    if e.finished or e.status == "done":
        return str(e.done)
    if e.expected is None:
        return f"{e.done}/?"
    if e.planned is not None and e.expected < e.planned:
        return f"{e.done}/~{e.expected}"
    return f"{e.done}/{e.expected}"


def left_text(e: Estimate) -> str:
    """'~1m20s left', 'done', 'estimating' (no rate yet)."""
    if e.finished or e.status == "done":
        return "done"
    if e.remaining_s is None:
        return "estimating"
    if e.remaining_s < 0.5:
        return "<1s left"
    return f"~{fmt.clock(e.remaining_s)} left"


def power_text(p: PowerProgress) -> str:
    """'power 35/99 hits (3%)', with ' reached' / ' not reached' once judged."""
    out = f"power {p.checked}/{p.needed} hits ({fmt.pct(p.fault_rate)})"
    if p.failures:
        out += f", {p.failures} failed"
    if p.reached is not None:
        out += ", reached" if p.reached else ", not reached"
    return out


def progress_line(progress: RunProgress) -> str:
    """One line for a console: the running phase, the run, the power target."""
    parts = []
    running = progress.running
    if running is not None:
        parts.append(f"{running.name} {done_text(running)} {fmt.clock(running.elapsed_s)} {left_text(running)}")
    run = progress.run
    parts.append(f"run {done_text(run)} requests {fmt.clock(run.elapsed_s)} {left_text(run)}")
    if progress.power is not None:
        parts.append(power_text(progress.power))
    return "; ".join(parts)
