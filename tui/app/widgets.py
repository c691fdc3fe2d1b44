"""Widgets. Each draws from the model it is handed (attributes down) and posts messages up."""

from __future__ import annotations

from rich.text import Text
from textual.containers import Grid, VerticalScroll
from textual.message import Message
from textual.widgets import DataTable, Static

from ..core.report import fmt
from ..core.report.latency import LatencyFold, histogram, percentile
from .model import RunModel
from ..core.report.progress import RunProgress
from .render import metrics_line, phase_table, progress_strip, slot_panel

SEVERITY_STYLE = {"fail": "bold red", "warn": "yellow", "info": "grey62"}
# In the compact view (many slots, one line each) a streaming answer repaints on one frame in
# COMPACT_STREAM_TURNS, the slots taking turns (slot number modulo the turns): every frame repaints a
# share of the grid instead of every other frame repainting all of it, so frames stay evenly spaced
# and each costs a fraction (the compositor re-renders every changed line). A new request, a
# finished one and a badge change repaint at once.
COMPACT_STREAM_TURNS = 5


class PhaseList(Static):
    _drawn: tuple | None = None

    def show(self, model: RunModel, progress: RunProgress | None = None) -> None:
        key = (tuple((p.name, p.status, p.round, p.rounds, p.done, p.planned) for p in model.phases.values()),
               tuple((e.name, e.expected) for e in progress.phases) if progress is not None else ())
        if key == self._drawn:
            return                      # unchanged: no re-render, no layout pass
        self._drawn = key
        self.update(phase_table(model, progress))


class ProgressStrip(Static):
    """One line: the run's requests done of expected, elapsed and an estimate of the rest, the
    running phase's, and the power target's checked hits of needed."""

    _drawn: Text | None = None

    def show(self, progress: RunProgress) -> None:
        text = progress_strip(progress, self.content_size.width or 80)
        if text == self._drawn:
            return
        self._drawn = text
        self.update(text, layout=False)                     # one line, fixed height


class SlotPanel(Static, can_focus=True):
    """One slot: memo, code, task, cache bar, TTFT, the streaming answer, a verdict badge."""

    class Selected(Message):
        def __init__(self, request: int | None) -> None:
            self.request = request
            super().__init__()

    def __init__(self, slot: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.slot = slot
        self.request: int | None = None
        self._drawn: tuple | None = None
        self._badge: str | None = "-"          # the badge class set last ("-": none yet)

    def show(self, model: RunModel, grid: int, compact: bool, turn: int = 0) -> bool:
        """Draw the slot's request if it changed; True when a repaint was put off (draw again soon).
        `turn` counts frames: a streaming compact line repaints when it is this slot's turn."""
        view = model.slots.get(self.slot)
        request = model.requests.get(view.request) if view and view.request else None
        self.request = request.request if request else None
        width = self.content_size.width or 40
        key = (self.request, request.rev if request else None, width, compact)
        if key == self._drawn:
            return False
        if compact and request is not None and not request.finished and self._drawn is not None \
                and key[0] == self._drawn[0] and key[2:] == self._drawn[2:] \
                and request.badge == self._badge and (turn + self.slot) % COMPACT_STREAM_TURNS:
            return True                 # the same answer, streaming: not this slot's turn
        self._drawn = key
        # a slot's height is fixed by the stylesheet: a new answer needs a repaint, never a layout pass
        self.update(slot_panel(self.slot, request, model, grid, compact=compact, width=width), layout=False)
        badge = request.badge if request is not None else None
        if badge != self._badge:
            self._badge = badge
            for name in ("ok", "fail", "warn", "info", "pending"):
                self.set_class(badge == name, f"-{name}")
        return False

    def on_click(self) -> None:
        self.post_message(self.Selected(self.request))


class SlotGrid(VerticalScroll):
    """The slots of the running phase; a grid at a few slots, one line each when many."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.compact = False
        self._slots: tuple[int, ...] = ()
        self._inner: Grid | None = None
        self._panels: list[SlotPanel] = []
        self._turn = 0

    def reset(self) -> None:
        self._slots = ()
        self._inner = None
        self._panels = []
        self.remove_children()

    def show(self, model: RunModel, grid: int, force_compact: bool | None) -> bool:
        """True when a slot put its repaint off: the app draws again on the next frame."""
        slots = tuple(sorted(model.slots))
        compact = force_compact if force_compact is not None else len(slots) > 8
        if slots != self._slots or compact != self.compact or self._inner is None:
            self._slots, self.compact = slots, compact
            self.remove_children()
            self._panels = [SlotPanel(s, classes="slot") for s in slots]
            if compact:
                for panel in self._panels:
                    panel.styles.text_wrap = "nowrap"     # one line, already cut to its width: no wrapping pass
            inner = Grid(*self._panels, classes="slot-inner")
            inner.set_class(compact, "-compact")
            inner.styles.grid_size_columns = 1 if compact or len(slots) <= 1 else 2
            self.mount(inner)
            self._inner = inner
        deferred = False
        self._turn += 1
        for panel in self._panels:
            deferred = panel.show(model, grid, compact, self._turn) or deferred
        return deferred


class FindingsTable(DataTable):
    """Every finding: severity, kind, phase, slot, round, request, offset, detail."""

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        self.add_columns("sev", "kind", "phase", "slot", "rnd", "req", "offset", "detail")
        self._shown = 0

    def reset_rows(self) -> None:
        self.clear()
        self._shown = 0

    def show(self, model: RunModel) -> None:
        if len(model.findings) < self._shown:
            self.reset_rows()
        for index in range(self._shown, len(model.findings)):
            f = model.findings[index]
            self.add_row(Text(f.severity.upper(), style=SEVERITY_STYLE.get(f.severity, "")), f.kind, f.phase,
                         _dash(f.slot), _dash(f.round), _dash(f.request), _dash(f.offset), f.detail[:200],
                         key=str(index))
        self._shown = len(model.findings)


class MetricsStrip(Static):
    _drawn: int | None = None

    def show(self, model: RunModel) -> None:
        if model.metrics_version == self._drawn:
            return
        self._drawn = model.metrics_version
        self.update(metrics_line(model), layout=False)       # one line, fixed height


class ReplicaStrip(Static):
    """Behind a router: one line per run, a cell per replica (requests, hits, hit rate, fails); hidden
    without replicas. A replica that served requests and never hit while others did is shown in red."""
    _drawn: tuple | None = None

    def show(self, model: RunModel) -> None:
        fold = model.report.replicas
        rows = fold.rows() if fold.active else []
        key = tuple((r["requests"], r["hits"], r["findings"]["fail"]) for r in rows)
        if key == self._drawn:
            return
        self._drawn = key
        self.display = bool(rows)
        if rows:
            self.update(replica_line(rows), layout=False)


def replica_line(rows: list[dict]) -> Text:
    out = Text("replicas", style="bold")
    hitting = any(r["hits"] for r in rows)
    for r in rows:
        rate = "-" if r["hit_rate"] is None else f"{r['hit_rate'] * 100:.0f}%"
        idle = hitting and not r["hits"]
        style = "bold red" if idle or r["findings"]["fail"] else "green" if r["hits"] else "grey70"
        out.append(f"  {r['label']} ", style="bold")
        out.append(f"{r['requests']} req {r['hits']} hits {rate}", style=style)
        if r["findings"]["fail"]:
            out.append(f" {r['findings']['fail']} fail", style="bold red")
        elif idle:
            out.append(" no hit", style="bold red")
    return out


def _dash(value) -> str:
    return "-" if value is None else str(value)


TTFT_STYLE = {"cold": "dodger_blue1", "hit": "dark_orange"}
_BARS = " ▁▂▃▄▅▆▇█"


def ttft_histogram(latency: LatencyFold, bins: int = 12) -> Text:
    """TTFT cold vs hit of the run's main-arm requests (every phase), one histogram line each on
    shared log-scale bins: a column's height is its count relative to that path's fullest bin."""
    series = {arm: latency.all_values(arm) for arm in ("cold", "hit")}
    edges, counts = histogram(series, bins)
    out = Text("TTFT ", style="bold")
    if not edges:
        out.append("none yet", style="grey50")
        return out
    out.append(f"{fmt.seconds(edges[0])}..{fmt.seconds(edges[-1])}", style="grey70")
    for arm in ("cold", "hit"):
        row = counts[arm]
        top = max(row) if row else 0
        out.append(f"\n{arm:<5}")
        for c in row:
            if not c:
                out.append("·", style="grey30")
            else:
                out.append(_BARS[max(1, -(-c * 8 // top))], style=TTFT_STYLE[arm])
        out.append(f" {len(series[arm])}", style="grey70")
    out.append("\np50 ", style="grey70")
    for arm in ("cold", "hit"):
        values = series[arm]
        out.append(fmt.seconds(percentile(sorted(values), 0.5)) if values else "-", style=TTFT_STYLE[arm])
        if arm == "cold":
            out.append(" / ", style="grey70")
    return out


class TtftHistogram(Static):
    """The TTFT histogram (cold vs hit), redrawn only when a new TTFT arrives."""

    _drawn: int | None = None

    def show(self, model: RunModel) -> None:
        latency = model.report.latency
        if latency.version == self._drawn:
            return
        self._drawn = latency.version
        self.update(ttft_histogram(latency), layout=False)         # four lines, fixed height
