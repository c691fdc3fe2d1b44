"""Widgets. Each draws from the model it is handed (attributes down) and posts messages up."""

from __future__ import annotations

from rich.text import Text
from textual.containers import Grid, VerticalScroll
from textual.message import Message
from textual.widgets import DataTable, Static

from .model import RunModel
from .render import metrics_line, phase_table, slot_panel

SEVERITY_STYLE = {"fail": "bold red", "warn": "yellow", "info": "grey62"}


class PhaseList(Static):
    def show(self, model: RunModel) -> None:
        self.update(phase_table(model))


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

    def show(self, model: RunModel, grid: int, compact: bool) -> None:
        view = model.slots.get(self.slot)
        request = model.requests.get(view.request) if view and view.request else None
        self.request = request.request if request else None
        width = self.content_size.width or 40
        key = (self.request, request.rev if request else None, width, compact)
        if key == self._drawn:
            return
        self._drawn = key
        self.update(slot_panel(self.slot, request, model, grid, compact=compact, width=width))
        for badge in ("ok", "fail", "warn", "info", "pending"):
            self.set_class(request is not None and request.badge == badge, f"-{badge}")

    def on_click(self) -> None:
        self.post_message(self.Selected(self.request))


class SlotGrid(VerticalScroll):
    """The slots of the running phase; a grid at a few slots, one line each when many."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.compact = False
        self._slots: tuple[int, ...] = ()
        self._inner: Grid | None = None

    def reset(self) -> None:
        self._slots = ()
        self._inner = None
        self.remove_children()

    def show(self, model: RunModel, grid: int, force_compact: bool | None) -> None:
        slots = tuple(sorted(model.slots))
        compact = force_compact if force_compact is not None else len(slots) > 8
        if slots != self._slots or compact != self.compact or self._inner is None:
            self._slots, self.compact = slots, compact
            self.remove_children()
            inner = Grid(*[SlotPanel(s, classes="slot") for s in slots], classes="slot-inner")
            inner.set_class(compact, "-compact")
            inner.styles.grid_size_columns = 1 if compact or len(slots) <= 1 else 2
            self.mount(inner)
            self._inner = inner
        if self._inner is not None:
            for panel in self._inner.query(SlotPanel):
                panel.show(model, grid, compact)


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
    def show(self, model: RunModel) -> None:
        self.update(metrics_line(model))


def _dash(value) -> str:
    return "-" if value is None else str(value)
