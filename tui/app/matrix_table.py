"""The matrix's table on screen: one row per profile, filled as profiles finish, the running one live.

The rows are the ones `hitproof matrix` writes to DIR/matrix.json (tui.matrix); the running row
takes its numbers from the live run's model. `enter` on a row asks the app to show that profile's
run below (a finished one as a replay of its log, the running one live).
"""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.widgets import Static

from ..core.report import fmt
from ..core.report.progress import done_text, left_text
from ..matrix import RESULT
from .model import RunModel

RESULT_STYLE = {"pass": "bold black on green", "fail": "bold white on red", "inconclusive": "bold black on yellow",
                "error": "bold white on red", "interrupted": "bold black on yellow", "incomplete": "bold black on yellow",
                "not_run": "grey50", "running": "bold black on cyan"}


def _seconds(value: Any) -> str:
    return fmt.clock(value) if isinstance(value, (int, float)) else fmt.MISSING


def live_cells(model: RunModel, started_wall_s: float) -> dict[str, Any]:
    """The running row's numbers from the live model: progress, hits, fail kinds, start-up, soak."""
    report = model.report
    header_t = report.header.t if report.header is not None else None
    fails = sorted({f.kind for f in model.findings if f.severity == "fail"})
    progress = model.progress.estimate(model.last_t)
    if header_t is None:
        state = "starting"
    else:
        running = progress.run
        state = f"{done_text(running)} {left_text(running)}"
    return {"state": state, "hits": report.cache_hits() if header_t is not None else None, "fail_kinds": fails,
            "startup_s": header_t if header_t is not None else started_wall_s,
            "startup_final": header_t is not None,
            "soak_s": (model.last_t - header_t) if header_t is not None else None}


def matrix_table(rows: list[dict[str, Any]], *, running: int | None, live: dict[str, Any] | None,
                 cursor: int | None, viewing: int | None, focused: bool, width: int = 80) -> Table:
    """The ablation table, one line a profile: what changed, the result, hits, fail kinds, start-up and
    soak time (and the profile's name from 100 columns on; narrower, the title bar names it)."""
    wide = width >= 100
    table = Table(expand=True, box=None, padding=(0, 1), show_edge=False, header_style="bold")
    table.add_column("", width=1, no_wrap=True)
    if wide:
        table.add_column("profile", ratio=2, no_wrap=True, overflow="ellipsis")
    table.add_column("what changed", ratio=3, no_wrap=True, overflow="ellipsis")
    table.add_column("result", no_wrap=True)
    table.add_column("hits", justify="right", no_wrap=True)
    table.add_column("fail kinds", ratio=2, no_wrap=True, overflow="ellipsis")
    table.add_column("start", justify="right", no_wrap=True)
    table.add_column("soak", justify="right", no_wrap=True)
    for index, row in enumerate(rows):
        fail_kinds = row["findings"]["fail_kinds"]
        if index == running and live is not None:
            result = Text(" RUNNING ", style=RESULT_STYLE["running"])
            hits = fmt.cell(live["hits"])
            fail_kinds = live["fail_kinds"]
            start = _seconds(live["startup_s"]) + ("" if live["startup_final"] else "…")
            soak = _seconds(live["soak_s"])
        else:
            verdict = row["verdict"]
            result = Text(f" {RESULT.get(verdict, verdict.upper())} ", style=RESULT_STYLE.get(verdict, "bold"))
            if wide and row.get("exit_code") is not None and verdict != "not_run":
                result.append(f" exit {row['exit_code']}", style="grey70")
            hits = str(row["cache_hits"]) if verdict != "not_run" else fmt.MISSING
            start = _seconds(row.get("startup_s"))
            soak = _seconds(row.get("soak_s"))
        marker = Text("▶" if index == viewing else " ", style="bold magenta")
        kinds = Text(", ".join(fail_kinds) if fail_kinds else fmt.MISSING, style="red" if fail_kinds else "grey50")
        changed = Text(row.get("description") or row["profile"], style="" if wide else "bold")
        cells = [marker] + ([Text(row["profile"], style="bold")] if wide else []) + [changed, result, hits, kinds,
                                                                                     start, soak]
        style = ("on #264f78" if focused else "on grey23") if index == cursor else ""
        table.add_row(*cells, style=style)
    return table


class MatrixTable(Static, can_focus=True):
    """The matrix's rows; up/down move the cursor, enter shows that profile's run below."""

    BINDINGS = [Binding("up", "move(-1)", "up", show=False), Binding("down", "move(1)", "down", show=False),
                Binding("enter", "select", "show run")]

    class Selected(Message):
        def __init__(self, index: int) -> None:
            self.index = index
            super().__init__()

    def __init__(self, rows: list[dict[str, Any]], **kwargs) -> None:
        super().__init__(**kwargs)
        self.rows = rows
        self.cursor = 0
        self.running: int | None = None
        self.viewing: int | None = None
        self._live: dict[str, Any] | None = None
        self._drawn: tuple | None = None

    def show(self, *, running: int | None, live: dict[str, Any] | None, viewing: int | None) -> None:
        self.running, self._live, self.viewing = running, live, viewing
        key = (tuple((r["verdict"], r["cache_hits"], r.get("soak_s")) for r in self.rows), running,
               None if live is None else tuple((k, str(v)) for k, v in live.items()), viewing, self.cursor,
               self.has_focus, self.content_size.width)
        if key == self._drawn:
            return
        self._drawn = key
        self.update(matrix_table(self.rows, running=running, live=live, cursor=self.cursor, viewing=viewing,
                                 focused=self.has_focus, width=self.content_size.width or 80))

    def redraw(self) -> None:
        self._drawn = None
        self.show(running=self.running, live=self._live, viewing=self.viewing)

    def on_focus(self) -> None:
        self.redraw()

    def on_blur(self) -> None:
        self.redraw()

    def action_move(self, step: int) -> None:
        if self.rows:
            self.cursor = max(0, min(len(self.rows) - 1, self.cursor + step))
            self.redraw()
            box = self.parent
            if box is not None and hasattr(box, "scroll_to"):     # the header is line 0, row i line i + 1
                box.scroll_to(y=max(0, self.cursor + 1 - (box.size.height - 1)), animate=False)

    def action_select(self) -> None:
        if self.rows:
            self.post_message(self.Selected(self.cursor))
