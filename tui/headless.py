"""The headless console: Rich progress while running, findings as they come, a summary at the end."""

from __future__ import annotations

import textwrap

import io
import re

from rich import box
from rich.console import Console, Group
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table
from rich.text import Text

from .core.log.events import (Event, Finding, IsolationFinished, IsolationStarted, PhaseFinished, PhaseStarted,
                              RequestFinished, RequestStarted, RunFinished, ServerInfo)
from .core.report import fmt
from .core.report import facts, phase_facts
from .core.report.latency import table_lines
from .core.report.power import EvidenceTally, power_line
from .core.report.replicas import replica_lines
from .core.report.progress import ProgressFold, RunProgress, done_text, left_text, power_text, progress_line
from .core.report.report import RunReport

SEVERITY_STYLE = {"fail": "bold red", "warn": "yellow", "info": "dim"}
STATUS_STYLE = {"pass": "green", "fail": "bold red", "inconclusive": "yellow", "running": "cyan",
                "error": "bold red", "interrupted": "yellow", "incomplete": "yellow"}


# Seconds between a streaming answer's text deltas in a run shown on a console, not in the app (headless, the
# matrix): the deltas only go to the log, for a replay's live text. Each costs a wake of the answer's reader
# and an event through every listener; at 0.1 s (the app's pace) the reference server at 40 ms a token gave
# 2.70 ms of hitproof's CPU a request against 1.91 ms without deltas (4 streams, 4 deltas a request,
# 2026-12-06). At this pace an answer streaming less than a second has none: request_end holds its text.
LIVE_TEXT_UNWATCHED = 1.0


class HeadlessConsole:
    """An event listener. Live progress on a terminal, plain lines otherwise.

    On a terminal each phase is a bar with its requests done of expected, elapsed and an estimate of
    the rest, below a line for the run (and the power target's checked hits of needed); plain output
    gets that line at every phase end and every PLAIN_EVERY seconds of a long phase."""

    PLAIN_EVERY = 30.0           # seconds of run time between progress lines in plain output
    REFRESH = 0.25               # seconds of run time between estimates on a terminal

    def __init__(self, console: Console | None = None, show_info: bool = False, tally: EvidenceTally | None = None):
        """`tally`: the run's EvidenceTally when a listener before this one already feeds it (RunReport's),
        as the app's model shares it; otherwise the fold keeps its own (one tally fewer per event)."""
        self.console = console or Console(stderr=False, highlight=False)
        self.show_info = show_info
        self.live = self.console.is_terminal
        self.progress = Progress(TextColumn("{task.description:<20}"), BarColumn(bar_width=24),
                                 TextColumn("{task.fields[count]:>9}"), TextColumn("{task.fields[hits]}"),
                                 TextColumn("{task.fields[clock]:>6}"), TextColumn("{task.fields[left]}"),
                                 console=self.console, transient=False)
        self.fold = ProgressFold(tally)
        self._tasks: dict[str, int] = {}
        self._run_task: int | None = None
        self._hits: dict[str, int] = {}
        self._main: dict[int, str] = {}
        self._estimated_at = -1.0
        self._printed_at = 0.0

    def __call__(self, event: Event) -> None:
        self.fold.feed(event)
        if isinstance(event, ServerInfo):
            self.console.print(f"server {event.url}: {event.dialect} {event.version or ''}, model {event.model}, "
                               f"grid {event.grid} tokens ({event.grid_source}), tokenizer {event.tokenizer}, "
                               f"metrics {'yes' if event.metrics_available else 'no'}")
            if event.replicas:
                self.console.print(f"replicas: {', '.join(r['label'] + ' ' + r['url'] for r in event.replicas)}; "
                                   f"attributed by {event.replica_attribution or 'nothing'}")
        elif isinstance(event, PhaseStarted):
            self._hits[event.phase] = 0
            if self.live:
                if not self.progress.live.is_started:
                    self.progress.start()
                if self._run_task is None:
                    self._run_task = self.progress.add_task("run", total=None, count="", hits="", clock="", left="")
                self._tasks[event.phase] = self.progress.add_task(event.phase, total=event.planned_requests or None,
                                                                  count="", hits="0 hits", clock="", left="")
            else:
                self.console.print(f"phase {event.phase}: {event.planned_requests} requests")
            self._printed_at = event.t
        elif isinstance(event, RequestStarted) and event.arm == "main":
            self._main[event.request] = event.phase
        elif isinstance(event, RequestFinished) and event.request in self._main:
            phase = self._main.pop(event.request)
            if event.cached_tokens:
                self._hits[phase] = self._hits.get(phase, 0) + 1
        elif isinstance(event, Finding):
            if event.severity != "info" or self.show_info:
                self.console.print(Text(format_finding(event), style=SEVERITY_STYLE.get(event.severity, "")))
        elif isinstance(event, IsolationStarted):
            self.console.print(f"isolating request {event.request} ({event.kind}): {event.k} hits alone, "
                               f"{event.k} cold")
        elif isinstance(event, IsolationFinished):
            self.console.print(Text(format_isolation(event), style="bold"))
        elif isinstance(event, PhaseFinished):
            if not self.live:
                self.console.print(f"phase {event.phase}: {event.status}"
                                   + (f" ({'; '.join(event.reasons)})" if event.reasons else ""))
                self.console.print(Text(f"  progress: {progress_line(self.fold.estimate(event.t))}", style="grey62"))
                self._printed_at = event.t
        elif isinstance(event, RunFinished):
            self._show(self.fold.estimate(event.t))
            self.stop()
            return
        if self.live:
            if event.t - self._estimated_at >= self.REFRESH or isinstance(event, (PhaseStarted, PhaseFinished)):
                self._estimated_at = event.t
                self._show(self.fold.estimate(event.t))
        elif event.t - self._printed_at >= self.PLAIN_EVERY and self.fold.running_phase():
            self._printed_at = event.t
            self.console.print(Text(f"  progress: {progress_line(self.fold.estimate(event.t))}", style="grey62"))

    def _show(self, progress: RunProgress) -> None:
        """The bars' fields from an estimate (a terminal only)."""
        if not self.progress.live.is_started:
            return
        for row in progress.phases:
            task = self._tasks.get(row.name)
            if task is None:
                continue
            total = row.expected if row.expected else None
            self.progress.update(task, completed=row.done, total=total, count=done_text(row),
                                 hits=f"{self._hits.get(row.name, 0)} hits", clock=fmt.clock(row.elapsed_s),
                                 left=left_text(row) if not row.finished else row.status)
        if self._run_task is not None:
            run = progress.run
            power = f"  {power_text(progress.power)}" if progress.power is not None else ""
            self.progress.update(self._run_task, completed=run.done, total=run.expected or None, count=done_text(run),
                                 hits="", clock=fmt.clock(run.elapsed_s), left=left_text(run) + power)

    def stop(self) -> None:
        if self.progress.live.is_started:
            self.progress.stop()


class StartupLines:
    """The start-up progress of a launched server ("waiting for URL (12s): its last output line"), on
    the console: on a terminal every line, elsewhere (a CI log, a pipe) a line only when it says
    something new, the elapsed seconds aside, instead of the same line every 2 seconds."""

    _ELAPSED = re.compile(r"^(waiting for \S+) \(\d+s\)")

    def __init__(self, console: Console, label: str) -> None:
        self.console, self.label = console, label
        self._last: str | None = None

    def __call__(self, line: str) -> None:
        if not self.console.is_terminal:
            key = self._ELAPSED.sub(r"\1", line)
            if key == self._last:
                return
            self._last = key
        self.console.print(f"[{self.label}] {line}", markup=False, highlight=False)


def format_finding(f: Finding) -> str:
    where = [f.phase]
    if f.slot is not None:
        where.append(f"slot {f.slot}")
    if f.round is not None:
        where.append(f"round {f.round}")
    if f.request is not None:
        where.append(f"request {f.request}")
    if f.replica is not None:
        where.append(f"replica r{f.replica}")
    if f.offset is not None:
        where.append(f"offset {f.offset}")
    return f"{f.severity.upper():<5} {f.kind:<22} {', '.join(where)}: {f.detail}"


def format_isolation(e: IsolationFinished) -> str:
    return (f"isolation of request {e.request} ({e.kind}): {e.verdict.upper()}: reproduced on "
            f"{e.reproduced}/{e.hit_runs} hits, {e.cold_reproduced}/{e.cold_runs} cold; {e.detail}")


SUMMARY_COLUMNS = ("phase", "status", "req", "hits", "cached\ntokens", "TTFT\ncold", "TTFT\nhit", "f/w/i")


def summary_renderable(report: RunReport, show_info: bool = True) -> Group:
    # fits 80 columns: no side borders, one space and a blank divider between columns, two-line headers
    table = Table(title="hitproof summary", title_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
                  padding=(0, 1, 0, 0), pad_edge=False)
    for column in SUMMARY_COLUMNS:
        table.add_column(column, justify="left" if column in ("phase", "status") else "right", no_wrap=True)
    for name, phase in report.phases.items():
        counts = {k: v or 0 for k, v in (phase.get("findings") or {}).items()}
        status = phase.get("status") or "?"
        table.add_row(
            name, Text(status, style=STATUS_STYLE.get(status, "")),
            fmt.cell(phase.get("requests")), fmt.cell(phase.get("hits")), fmt.cell(phase.get("cached_tokens")),
            fmt.duration_ms(phase.get("ttft_cold_ms")), fmt.duration_ms(phase.get("ttft_hit_ms")),
            f"{counts.get('fail', 0)}/{counts.get('warn', 0)}/{counts.get('info', 0)}")
    lines: list = [table]
    proof = proof_line(report)
    if proof:
        lines.append(Text(f"  {proof}"))
    # what resuming costs on this server, calibrated at the start (core/soak/resume.py), and its margin
    if report.resume is not None:       # (wrapped: a console line fits 80 columns)
        lines.append(Text("\n".join(textwrap.wrap(report.resume.detail, 78, initial_indent="  ",
                                                   subsequent_indent="    "))))
    for name, phase in report.phases.items():
        for reason in phase.get("reasons") or []:
            lines.append(Text(f"  {name}: {reason}", style="yellow"))
        lines += [Text(f"  {line}") for line in phase_facts.console_lines(report, name)]
    replicas = replica_lines(report.replicas)
    if replicas:
        lines.append(Text("\n".join(replicas)))
    percentiles = table_lines(report.latency, report.phases)
    if percentiles:
        lines.append(Text("\n".join(percentiles)))
    for turns in phase_facts.turn_tables(report):
        table = Table(title=turns.title.lower(), title_justify="left", padding=(0, 1))
        for i, column in enumerate(turns.headers):    # two-word headers on two lines: 80 columns wide
            table.add_column(column.replace(" ", "\n"), justify="left" if i in turns.text_columns else "right",
                             no_wrap=i not in turns.wrap_columns)
        for row, flagged in zip(turns.rows, turns.flagged):
            styled = [Text(cell) for cell in row]
            for at in flagged:
                styled[at].stylize("bold red")
            table.add_row(*styled)
        lines += [table, Text(f"  {turns.sentence}")]
    shown = [f for f in report.findings if show_info or f.severity != "info"]
    if shown:
        lines.append(Text("findings:", style="bold"))
        for f in shown:
            lines.append(Text("  " + format_finding(f), style=SEVERITY_STYLE.get(f.severity, "")))
    for iso in report.isolations.values():
        lines.append(Text("  " + format_isolation(iso)))
    verdict = report.verdict
    message = report.end.message if report.end else "the log ends before the run did"
    lines.append(Text(f"verdict: {verdict.upper()} (exit {report.exit_code}): {message}; "
                      f"{len(report.starts)} requests, {report.cache_hits()} cache hits, "
                      f"{report.last_t:.1f} s", style=STATUS_STYLE.get(verdict, "bold")))
    if report.warning:
        lines.append(Text(f"warning: {report.warning}", style="yellow"))
    return Group(*lines)


def proof_line(report: RunReport) -> str:
    """How the run's hits were proven: per request (the server said), or by its counter."""
    server = report.server
    how = getattr(server, "cached_report", "") if server else ""
    if how == "request":
        return "hits proven per request (the server reports cached tokens)"
    proven = {name: p.get("hits_proven") for name, p in report.phases.items() if p.get("hits_proven")}
    if how == "counter":
        parts = [f"{name} {text.removeprefix('by counter, ')}" for name, text in proven.items() if "counter" in text]
        return ("hits proven by the server's counter (" + (server.cached_counter or "?") + "), attributed: "
                + ("; ".join(parts) if parts else "none"))
    if how == "none":
        return f"no hit can be proven: the server reports no cached tokens and has no counter ({server.cached_fix})"
    return ""


# --- text ----------------------------------------------------------------------------------

def report_text(report: RunReport) -> str:
    """What `hitproof report --format text` prints: the console summary without colour, plus power."""
    out = io.StringIO()
    console = Console(file=out, width=120, color_system=None, force_terminal=False, highlight=False,
                      emoji=False, markup=False)
    server, header = report.server, report.header
    if server is not None:
        launch = (header.target.get("launch_command") if header else None) or "attached"
        console.print(Text(f"server {server.url}: {server.dialect} {server.version or 'version unknown'}, model "
                           f"{server.model}, grid {server.grid} tokens ({server.grid_source}), launch: {launch}"))
    if header is not None:
        console.print(Text(f"run {header.run_id or 'unknown'} at {header.started_at or 'an unknown time'}, "
                           f"scenario {fmt.word((header.scenario or {}).get('name'))}, seed "
                           f"{fmt.word(facts.settings(report).get('seed'))}, sampling "
                           f"{fmt.kv(facts.sampling(report)) or 'default'}"))
    console.print(summary_renderable(report))
    console.print(Text(power_line(report)))
    return _ANSI.sub("", out.getvalue())


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
