"""The headless console: Rich progress while running, findings as they come, a summary at the end."""

from __future__ import annotations

import io
import re

from rich.console import Console, Group
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from .core.log.events import (Event, Finding, IsolationFinished, IsolationStarted, PhaseFinished, PhaseStarted,
                              RequestFinished, RequestStarted, RunFinished, ServerInfo)
from .core.report import fmt
from .core.report import facts
from .core.report.latency import table_lines
from .core.report.power import power_line
from .core.report.report import RunReport

SEVERITY_STYLE = {"fail": "bold red", "warn": "yellow", "info": "dim"}
STATUS_STYLE = {"pass": "green", "fail": "bold red", "inconclusive": "yellow", "running": "cyan",
                "error": "bold red", "interrupted": "yellow", "incomplete": "yellow"}


class HeadlessConsole:
    """An event listener. Live progress on a terminal, plain lines otherwise."""

    def __init__(self, console: Console | None = None, show_info: bool = False):
        self.console = console or Console(stderr=False, highlight=False)
        self.show_info = show_info
        self.live = self.console.is_terminal
        self.progress = Progress(TextColumn("{task.description:<20}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[hits]} hits"), TimeElapsedColumn(),
                                 console=self.console, transient=False)
        self._tasks: dict[str, int] = {}
        self._hits: dict[str, int] = {}
        self._main: dict[int, str] = {}

    def __call__(self, event: Event) -> None:
        if isinstance(event, ServerInfo):
            self.console.print(f"server {event.url}: {event.dialect} {event.version or ''}, model {event.model}, "
                               f"grid {event.grid} tokens ({event.grid_source}), tokenizer {event.tokenizer}, "
                               f"metrics {'yes' if event.metrics_available else 'no'}")
        elif isinstance(event, PhaseStarted):
            self._hits[event.phase] = 0
            if self.live:
                if not self.progress.live.is_started:
                    self.progress.start()
                self._tasks[event.phase] = self.progress.add_task(event.phase, total=event.planned_requests,
                                                                  hits=0)
            else:
                self.console.print(f"phase {event.phase}: {event.planned_requests} requests")
        elif isinstance(event, RequestStarted) and event.arm == "main":
            self._main[event.request] = event.phase
        elif isinstance(event, RequestFinished) and event.request in self._main:
            phase = self._main.pop(event.request)
            if event.cached_tokens:
                self._hits[phase] = self._hits.get(phase, 0) + 1
            if phase in self._tasks:
                self.progress.update(self._tasks[phase], advance=1, hits=self._hits[phase])
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
        elif isinstance(event, RunFinished):
            self.stop()

    def stop(self) -> None:
        if self.progress.live.is_started:
            self.progress.stop()


def format_finding(f: Finding) -> str:
    where = [f.phase]
    if f.slot is not None:
        where.append(f"slot {f.slot}")
    if f.round is not None:
        where.append(f"round {f.round}")
    if f.request is not None:
        where.append(f"request {f.request}")
    if f.offset is not None:
        where.append(f"offset {f.offset}")
    return f"{f.severity.upper():<5} {f.kind:<22} {', '.join(where)}: {f.detail}"


def format_isolation(e: IsolationFinished) -> str:
    return (f"isolation of request {e.request} ({e.kind}): {e.verdict.upper()}: reproduced on "
            f"{e.reproduced}/{e.hit_runs} hits, {e.cold_reproduced}/{e.cold_runs} cold; {e.detail}")


def summary_renderable(report: RunReport, show_info: bool = True) -> Group:
    table = Table(title="hitproof summary", title_justify="left", padding=(0, 1))
    for column in ("phase", "status", "req", "hits", "cached tok", "TTFT cold", "TTFT hit", "f/w/i"):
        table.add_column(column, justify="left" if column in ("phase", "status") else "right", no_wrap=True)
    for name, phase in report.phases.items():
        counts = phase.get("findings") or {}
        table.add_row(
            name, Text(phase.get("status", "?"), style=STATUS_STYLE.get(phase.get("status", ""), "")),
            str(phase.get("requests", "")), str(phase.get("hits", "")), str(phase.get("cached_tokens", "")),
            fmt.duration_ms(phase.get("ttft_cold_ms")), fmt.duration_ms(phase.get("ttft_hit_ms")),
            f"{counts.get('fail', 0)}/{counts.get('warn', 0)}/{counts.get('info', 0)}")
    lines: list = [table]
    proof = proof_line(report)
    if proof:
        lines.append(Text(f"  {proof}"))
    for name, phase in report.phases.items():
        for reason in phase.get("reasons") or []:
            lines.append(Text(f"  {name}: {reason}", style="yellow"))
        if name == "long_prompt" and phase.get("ttft_cut_pct") is not None:
            lines.append(Text(f"  long prompt ({phase.get('prompt_tokens')} tokens): TTFT "
                              f"{phase.get('ttft_cold_s')} s cold -> {phase.get('ttft_hit_s')} s hit "
                              f"({phase['ttft_cut_pct']}% cut)"))
        if name == "determinism" and phase.get("determinism"):
            lines.append(Text(f"  {facts.determinism_line(report)}"))
        if name == "partition":
            rows, notes = facts.partition_rows(report)
            if rows:
                lines.append(Text("\n".join(["  partition: identity pairs tried"]
                                             + facts.text_table(facts.PARTITION_HEADER, rows, "  "))))
            lines += [Text(f"  {note}") for note in notes]
        if name == "eviction":
            sentences, passes = facts.eviction_rows(report)
            lines += [Text(f"  {s}") for s in sentences]
            if passes:
                lines.append(Text("\n".join(facts.text_table(facts.EVICTION_HEADER, passes, "  "))))
    percentiles = table_lines(report.latency, report.phases)
    if percentiles:
        lines.append(Text("\n".join(percentiles)))
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
        console.print(Text(f"run {header.run_id} at {header.started_at}, scenario "
                           f"{header.scenario.get('name')}, seed {facts.settings(report).get('seed')}, sampling "
                           f"{fmt.kv(facts.sampling(report)) or 'default'}"))
    console.print(summary_renderable(report))
    console.print(Text(power_line(report)))
    return _ANSI.sub("", out.getvalue())


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
