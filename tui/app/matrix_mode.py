"""The app in a matrix: the table of rows above, the running profile live below it, or a finished
row's log replayed there (HitproofApp mixes this in; the table widget is matrix_table.py).

The state is the app's (HitproofApp.__init__): main_source (the MatrixSource), live_stream (the
running profile's), viewing (the row replayed below), matrix_seconds, _matrix_table, _replay_port and
_replay_worker.
"""

from __future__ import annotations

import time
from typing import Any

from rich.text import Text

from ..core.config.errors import HitproofError
from ..core.log import events as ev
from .matrix_table import MatrixTable, live_cells
from .messages import MatrixDone, MatrixProfileStarted, MatrixRowDone
from .model import RunModel
from .replay import ReplaySource
from .stream import Stream


class StreamPort:
    """What a replay inside the matrix sees of the app (an EventSink, ports.py): its own stream (feed,
    replace_model) and notifications. Detached when the view moves on, so a late event goes nowhere."""

    def __init__(self, app: MatrixMode, stream: Stream) -> None:
        self.app = app
        self.stream = stream
        self.attached = True

    def feed(self, event: ev.Event) -> None:
        if self.attached:
            self.stream.feed(event)

    def replace_model(self, model: RunModel) -> None:
        if self.attached:
            self.stream.model = model
            self.stream.pending.clear()
            self.app.draw_frame()

    def notify(self, *args: Any, **kwargs: Any) -> None:
        if self.attached:
            self.app.notify(*args, **kwargs)


class MatrixMode:
    """The matrix's handlers and actions of HitproofApp (a Textual App: notify, run_worker, draw_frame)."""

    def _show_matrix(self) -> None:
        source = self.main_source
        running = source.running
        live = None
        if running is not None and self.live_stream is not None:
            started = time.monotonic() - (source.started_at or time.monotonic())
            live = live_cells(self.live_stream.model, started)
        self._matrix_table.show(running=running, live=live, viewing=self.viewing)

    def on_matrix_profile_started(self, message: MatrixProfileStarted) -> None:
        """A matrix profile starts: its events go to the stream it brings, on screen unless a replay is."""
        if self.stream is self.live_stream:
            self.stream = message.stream
        self.live_stream = message.stream
        self.status_line = ""
        self._drawn_version = -1

    def on_matrix_row_done(self, message: MatrixRowDone) -> None:
        self.main_source.rows[message.index] = message.row
        self._drawn_version = -1

    def on_matrix_done(self, message: MatrixDone) -> None:
        self.matrix_seconds = message.seconds
        self._drawn_version = -1
        self.notify(f"matrix done in {message.seconds:.0f} s; enter on a row replays its run", timeout=8)

    def on_matrix_table_selected(self, message: MatrixTable.Selected) -> None:
        self.show_row(message.index)

    def show_row(self, index: int) -> None:
        """Below the rows: the running profile live, or a finished one's log as a replay."""
        source = self.main_source
        row = source.rows[index]
        if index == source.running:
            self.action_back_to_live()
            return
        if row["verdict"] == "not_run" or not row.get("log"):
            self.notify(f"{row['profile']}: not run yet" if row["verdict"] == "not_run"
                        else f"{row['profile']}: no log ({row['message']})", severity="warning")
            return
        try:
            replay = ReplaySource(row["log"])
        except HitproofError as exc:
            self.notify(f"{row['profile']}: {exc}", severity="error")
            return
        self._stop_replay()
        stream = Stream()
        port = StreamPort(self, stream)
        self._replay_port = port
        self.source, self.stream, self.viewing = replay, stream, index
        self._replay_worker = self.run_worker(replay.run(port), group="replay", exit_on_error=False)
        self.refresh_bindings()
        self._drawn_version = -1

    def _stop_replay(self) -> None:
        if self._replay_port is not None:
            self._replay_port.attached = False
            self._replay_port = None
        if self.source is not self.main_source:
            stop = getattr(self.source, "stop", None)
            if stop is not None:
                stop()
        if self._replay_worker is not None:
            self._replay_worker.cancel()
            self._replay_worker = None

    def action_back_to_live(self) -> None:
        if self.viewing is None:
            return
        self._stop_replay()
        self.source, self.viewing = self.main_source, None
        self.stream = self.live_stream if self.live_stream is not None else Stream()
        self.refresh_bindings()
        self._drawn_version = -1
        self.draw_frame()

    def action_focus_matrix(self) -> None:
        if self._matrix_table is not None:
            self._matrix_table.focus()

    def _matrix_badge(self) -> Text:
        """Which matrix row the run below belongs to, and how far the matrix is."""
        source = self.main_source
        rows = source.rows
        out = Text()
        if source.finished:
            seconds = f" in {self.matrix_seconds:.0f}s" if self.matrix_seconds is not None else ""
            out.append(f" MATRIX done{seconds} ", style="bold black on green")
        elif source.running is not None:
            out.append(f" MATRIX {source.running + 1}/{len(rows)} ", style="bold black on cyan")
        else:
            out.append(" MATRIX ", style="bold black on cyan")
        index = self.viewing if self.viewing is not None else source.running
        if index is None:
            index = max((i for i, r in enumerate(rows) if r["verdict"] != "not_run"), default=None)
        if index is not None:
            out.append(f" {rows[index]['profile']} ", style="bold")
        return out
