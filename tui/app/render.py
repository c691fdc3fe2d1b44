"""Rich renderables built from the model: shared by the widgets and the screens (no Textual here)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from ..core.report import fmt
from ..core.report.progress import Estimate, RunProgress, done_text, left_text, power_text
from .model import PhaseView, RequestView, RunModel

HIGHLIGHT_STYLE = {
    "own": "bold black on green",
    "foreign": "bold white on red",
    "repeat": "bold black on yellow",
    "divergence": "bold white on magenta",
}
BADGE_STYLE = {"ok": "bold black on green", "fail": "bold white on red", "warn": "bold black on yellow",
               "info": "black on grey70", "pending": "black on cyan"}
STATUS_GLYPH = {"pending": ("·", "grey50"), "running": ("▶", "cyan"), "pass": ("✓", "green"),
                "fail": ("✗", "bold red"), "inconclusive": ("?", "yellow")}
PHASE_LABEL = {"shared_concurrency": "shared", "agent_replay": "agent replay"}
SPARK = "▁▂▃▄▅▆▇█"


def phase_table(model: RunModel, progress: RunProgress | None = None) -> Table:
    """Every phase of the run: started ones with their status and requests done of expected, the
    ones still to come (from the run's plan) greyed."""
    table = Table.grid(padding=(0, 1))
    table.add_column(width=1)
    table.add_column(no_wrap=True, overflow="ellipsis")
    table.add_column(justify="right", no_wrap=True)
    estimates = {e.name: e for e in progress.phases} if progress is not None else {}
    names = list(dict.fromkeys([*model.phases, *estimates]))
    for name in names:
        phase = model.phases.get(name)
        if phase is None:
            table.add_row(Text("·", style="grey50"), Text(PHASE_LABEL.get(name, name), style="grey50"),
                          Text(_planned(estimates[name]), style="grey50"))
            continue
        glyph, style = STATUS_GLYPH.get(phase.status, ("?", ""))
        table.add_row(Text(glyph, style=style), Text(PHASE_LABEL.get(phase.name, phase.name),
                                                     style=style if phase.status == "running" else ""),
                      Text(_progress(phase, estimates.get(name)), style="grey70"))
    return table


def _planned(estimate: Estimate) -> str:
    return "?" if estimate.expected is None else (f"~{estimate.expected}" if estimate.planned is not None
                                                  and estimate.expected < estimate.planned else str(estimate.expected))


def _progress(phase: PhaseView, estimate: Estimate | None = None) -> str:
    parts = []
    if phase.rounds and phase.round is not None and phase.status == "running":
        # rounds are numbered from 0 everywhere (the log, reports, slot panels): round 0 of rotation is
        # cold; "r2/5" is round 2 of rounds 0 to 5 (short: the phase column is narrow)
        parts.append(f"r{phase.round}/{phase.rounds - 1}")
    parts.append(done_text(estimate) if estimate is not None and phase.status == "running"
                 else f"{phase.done}/{phase.planned}" if phase.status == "running" else str(phase.done))
    return " ".join(parts)


def progress_strip(progress: RunProgress, width: int = 80) -> Text:
    """One line to plan by: the run (requests done of expected, elapsed, the rest), the running
    phase, and the power target's checked hits of needed."""
    run = progress.run
    out = Text()
    out.append("run ", style="bold")
    out.append(f"{done_text(run)} req ", style="bold")
    out.append(fmt.clock(run.elapsed_s), style="grey70")
    out.append(f" {left_text(run)}", style="cyan" if run.status != "done" else "green")
    running = progress.running
    if running is not None:
        out.append("  │ ", style="grey50")
        out.append(PHASE_LABEL.get(running.name, running.name), style="bold cyan")
        out.append(f" {done_text(running)} {fmt.clock(running.elapsed_s)} ", style="grey70")
        out.append(left_text(running), style="cyan")
    power = progress.power
    if power is not None:
        out.append("  │ ", style="grey50")
        out.append(power_text(power), style=("green" if power.reached else "yellow" if power.reached is False
                                             else "magenta"))
        if power.reached is None and width - out.cell_len >= 12:
            cells = 10
            filled = min(cells, int(cells * power.checked / power.needed)) if power.needed else cells
            out.append(" ▕", style="grey50")
            out.append("█" * filled, style="magenta")
            out.append("░" * (cells - filled) + "▏", style="grey50")
    out.truncate(width, overflow="ellipsis")
    return out


def answer_text(view: RequestView, registry: dict[str, str], *, tail: int | None = None) -> Text:
    """The answer with its highlights at their offsets; `tail` keeps only the last characters."""
    text = view.text
    start = 0
    if tail is not None and len(text) > tail:
        start = len(text) - tail
    out = Text(("…" if start else "") + text[start:].replace("\n", "⏎"))
    shift = 1 if start else 0
    for mark in view.highlights(registry):
        a, b = max(mark.start, start), min(mark.end, len(text))
        if a < b:
            out.stylize(HIGHLIGHT_STYLE[mark.style], a - start + shift, b - start + shift)
    return out


def cache_bar(view: RequestView, grid: int, width: int) -> Text:
    """Prompt tokens as a bar (cached share filled), the counts, and TTFT, within `width` cells."""
    prompt = view.prompt_tokens
    ttft = f" {view.ttft * 1000:.0f}ms" if view.ttft is not None else ""
    if not prompt:
        return Text("░" * max(4, width - 2) + " …", style="grey50")
    cached = view.cached_tokens or 0
    counts = f" {cached}/{prompt}"
    blocks = f" {cached // grid}blk" if grid and cached else ""
    room = width - len(counts) - len(ttft)
    if room - len(blocks) < 6:
        blocks = ""
    bar_width = max(3, min(16, room - len(blocks)))
    filled = round(bar_width * cached / prompt)
    bar = Text("█" * filled, style="green" if cached else "grey50")
    bar.append("░" * (bar_width - filled), style="grey50")
    bar.append(counts, style="grey70")
    bar.append(blocks, style="grey50")
    if (view.checks.get("checkpoint") or {}).get("restored"):
        bar.append(" ckpt", style="magenta")            # the hit resumed from a restored checkpoint
    bar.append(ttft, style="grey70")
    return bar


def badge(view: RequestView | None) -> Text:
    name = view.badge if view else "pending"
    label = {"ok": " OK ", "fail": "FAIL", "warn": "WARN", "info": "INFO", "pending": " .. "}[name]
    return Text(label, style=BADGE_STYLE[name])


def slot_panel(slot: int, view: RequestView | None, model: RunModel, grid: int, *, compact: bool,
               width: int = 40) -> Text:
    if view is None:
        return Text(f"slot {slot}: idle", style="grey50")
    head = Text()
    head.append_text(badge(view))
    head.append(f" slot {slot}", style="bold")
    if view.round is not None:
        head.append(f" r{view.round}")
    head.append(f" {view.task}", style="cyan")
    if compact:
        ttft = f"{view.ttft * 1000:.0f}ms" if view.ttft is not None else "…"
        head.append(f" {view.memo or '-'}", style="cyan")
        head.append(f" {view.cached_tokens or 0}/{view.prompt_tokens or '?'} {ttft} ", style="grey70")
        head.append_text(answer_text(view, model.registry, tail=max(10, width - head.cell_len - 2)))
        head.truncate(width)
        return head
    lines = Text()
    lines.append_text(head)
    lines.append(f"\n{view.memo or '-'} ", style="cyan")
    if view.code:
        lines.append(view.code, style="green")
    lines.append("\n")
    lines.append_text(cache_bar(view, grid, width))
    lines.append("\n")
    notes = [f for f in view.findings if f.severity in ("fail", "warn")]
    if notes:
        f = notes[0]
        lines.append(f"{f.kind} @ {'-' if f.offset is None else f.offset}\n", style="bold red" if f.severity == "fail" else "yellow")
    lines.append_text(answer_text(view, model.registry, tail=max(20, width * 2)))
    return lines


def sparkline(values: list[float], width: int = 24) -> str:
    values = values[-width:]
    if not values:
        return ""
    top = max(values) or 1.0
    return "".join(SPARK[min(len(SPARK) - 1, int(v / top * (len(SPARK) - 1)))] for v in values)


def metrics_line(model: RunModel) -> Text:
    out = Text()
    rate = model.hit_rate_series()
    overall = model.cumulative_hit_rate()
    if rate:
        out.append("hit rate ", style="bold")
        out.append(f"{overall * 100:3.0f}% " if overall is not None else "  ?% ", style="green")
        out.append(sparkline(rate), style="green")
    cached = model.metric_series("vllm:prefix_cache_hits_total", rate=True)
    if cached:
        out.append("  cached tok/s ", style="bold")
        out.append(sparkline(cached), style="cyan")
    for label, name in (("preempt", "vllm:num_preemptions_total"), ("run", "vllm:num_requests_running"),
                        ("wait", "vllm:num_requests_waiting")):
        value = model.latest(name)
        if value is not None:
            out.append(f"  {label} {value:.0f}")
    drafts = model.metric_series("vllm:spec_decode_num_drafts_total", rate=True)
    accepted = model.metric_series("vllm:spec_decode_num_accepted_tokens_total", rate=True)
    if drafts and accepted and sum(drafts[-5:]):
        out.append(f"  accept len {1 + sum(accepted[-5:]) / sum(drafts[-5:]):.2f}")
    if not out.plain:
        out.append("metrics: unknown (the server exposes no /metrics)", style="grey50")
    return out


def title_bar(model: RunModel, *, badge: Text | None, replay_status: str | None, paused: bool) -> Text:
    """The title bar: the matrix's badge, a replay's position, the verdict (else running or paused), the
    run's clock, the scenario and the server."""
    m = model
    out = Text("hitproof ", style="bold")
    if badge is not None:
        out.append_text(badge)
    if replay_status is not None:
        out.append(f" {replay_status} ", style="bold black on magenta")
        out.append(" ")
    if m.report.end is not None:
        verdict = m.report.verdict
        out.append(f" {verdict.upper()} exit {m.report.exit_code} ",
                   style={"pass": "bold black on green", "fail": "bold white on red"}.get(
                       verdict, "bold black on yellow"))
    elif paused:
        out.append(" PAUSED ", style="bold black on yellow")
    else:
        out.append(" RUNNING ", style="bold black on cyan")
    out.append(f" {m.last_t:.1f}s")
    if m.report.header:
        out.append(f"  {(m.report.header.scenario or {}).get('name') or 'scenario unknown'}", style="bold")
    server = m.report.server
    if server:
        out.append("  " + " ".join(str(part) for part in (server.dialect, server.version, server.model, server.url)
                                   if part), style="cyan")
    elif m.report.header:
        out.append(f"  {m.report.header.target.get('url') or ''}", style="cyan")
    return out


def run_totals(model: RunModel, status_line: str) -> Text:
    """Requests, hits and findings so far (before the run's first event: a launched server's start-up line)."""
    t = model.totals()
    if not model.events_seen and status_line:
        return Text(status_line, style="cyan")
    out = Text(f"{t['requests']} req {t['hits']} hits\n")
    out.append(f"{t['fail']} fail", style="bold red" if t["fail"] else "grey50")
    out.append(f" {t['warn']} warn", style="yellow" if t["warn"] else "grey50")
    out.append(f" {t['info']} info", style="grey50")
    if model.report.end is not None:
        out.append(f"\n{model.report.end.message}", style="grey70")
    return out
