"""The hitproof Textual app: the same event stream as headless, drawn at a capped frame rate. Sources are
ports.Source; the matrix's part of the app is matrix_mode.py; `hitproof matrix` builds it in matrix_view.py."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import DataTable, Footer, Log, Static
from textual.worker import WorkerCancelled

from ..core.log import events as ev
from ..core.config.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, HitproofError
from .matrix_mode import MatrixMode, StreamPort
from .matrix_table import MatrixTable
from .messages import StatusLine
from .model import RunModel
from .ports import Source
from .render import run_totals, title_bar
from .screens import IsolationProgress, RequestDetail
from .stream import Stream
from .widgets import (FindingsTable, MetricsStrip, PhaseList, ProgressStrip, ReplicaStrip, SlotGrid, SlotPanel,
                      TtftHistogram)

QUIT_TIMEOUT = 60.0      # seconds the soak may take to end after the user quits
FRAME_RATE = 24          # frames per second at most; events are folded in between frames


class HitproofApp(MatrixMode, App):
    CSS_PATH = "app.tcss"
    TITLE = "hitproof"
    BINDINGS = [
        Binding("escape", "back_to_live", "live"),
        Binding("q,ctrl+c", "quit_app", "quit"),
        Binding("p", "pause", "pause"),
        Binding("space", "play", "play/pause"),
        Binding("1", "speed('1')", "real time", show=False),
        Binding("2", "speed('2')", "x10", show=False),
        Binding("3", "speed('3')", "max", show=False),
        Binding("n", "next_finding", "next finding"),
        Binding("j", "next_phase", "next phase"),
        Binding("home", "seek('start')", "start", show=False, priority=True),
        Binding("end", "seek('end')", "end", show=False, priority=True),
        Binding("i", "isolate", "isolate"),
        Binding("enter", "open_detail", "detail", show=True),
        Binding("l", "toggle_log", "server log"),
        Binding("c", "toggle_compact", "compact"),
        Binding("s", "screenshot", "screenshot"),
        Binding("m", "focus_matrix", "matrix"),
    ]

    def __init__(self, source: Source, *, screenshot_dir: str | Path = "screenshots", frame_rate: float = FRAME_RATE):
        super().__init__()
        self.source = source                   # what the run view shows: the live source, or a replay
        self.main_source = source              # what the app was built for (in a matrix: the matrix)
        self.matrix = bool(getattr(source, "matrix", False))
        self.stream = Stream()                 # the stream on screen
        self.live_stream: Stream | None = self.stream if self.matrix else None   # the running profile's
        self.viewing: int | None = None        # in a matrix: the row whose log is being replayed below
        self._replay_port: StreamPort | None = None
        self._replay_worker = None
        self._matrix_table: MatrixTable | None = None
        self.matrix_seconds: float | None = None
        self.screenshot_dir = Path(screenshot_dir)
        self.frame_rate = frame_rate
        self._drawn_version = -1
        self._drawn_model: RunModel | None = None
        self._log_shown = 0
        self.paused = False
        self.force_compact: bool | None = None
        self.exit_code: int | None = None
        # what went wrong where the app alone sees it (the soak worker failed, it did not stop in time):
        # one line the CLI prints after the app has closed, with exit_code; never dropped
        self.failure: str | None = None
        self.quit_timeout = QUIT_TIMEOUT
        self.frames = 0
        self.status_line = ""
        self._widgets: tuple | None = None
        self._totals_shown: Text | None = None
        self._title_shown: Text | None = None

    REPLAY_ONLY = {"play", "speed", "next_finding", "next_phase", "seek"}

    @property
    def model(self) -> RunModel:
        """The model on screen (in a matrix: the running profile's, or the replayed row's)."""
        return self.stream.model

    @model.setter
    def model(self, model: RunModel) -> None:
        self.stream.model = model

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        """Live runs and replays show only their own keys in the footer."""
        if action == "pause" and not self.source.live:
            return False
        if action in self.REPLAY_ONLY and self.source.live:
            return False
        if action == "focus_matrix" and not self.matrix:
            return False
        if action == "back_to_live" and self.viewing is None:
            return False
        return True

    # --- layout -----------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Static(id="title")
        if self.matrix:
            with VerticalScroll(id="matrix-box"):
                yield MatrixTable(self.main_source.rows, id="matrix")
        yield ProgressStrip(id="progress")
        with Horizontal(id="top"):
            with Vertical(id="left"):
                yield PhaseList(id="phases")
                yield Static(id="totals")
                yield TtftHistogram(id="ttft")
            yield SlotGrid(id="slots")
        yield MetricsStrip(id="metrics")
        yield ReplicaStrip(id="replicas")
        yield FindingsTable(id="findings", classes="-matrix" if self.matrix else "")
        yield Log(id="server-log", max_lines=2000, classes="hidden")
        yield Footer()

    def on_mount(self) -> None:
        self.set_interval(1 / self.frame_rate, self.draw_frame)
        self.set_interval(1.0, self._tick)          # elapsed and estimates move on without events too
        self.source_worker = self.run_worker(self._run_source(), name="source", group="source", exit_on_error=False)
        self.draw_frame()

    async def _run_source(self) -> None:
        try:
            code = await self.source.run(self)
        except HitproofError as exc:
            self.fail(str(exc), exc.exit_code)
            return
        except Exception as exc:          # a bug: said on screen and after the app closes, exit 6
            self.fail(f"the soak failed: {type(exc).__name__}: {exc}", EXIT_INTERNAL)
            return
        if code is not None:
            self.exit_code = code

    def fail(self, message: str, code: int) -> None:
        """A failure the user must see: on screen now, as one line once the app closes, as the exit code."""
        if self.failure is None:
            self.failure = " ".join(message.split())
            self.exit_code = code
            if self.model.report.end is None:
                self.feed(ev.RunFinished(verdict="error", exit_code=code, message=self.failure))
            self.notify(self.failure, severity="error", timeout=30)

    # --- the stream -------------------------------------------------------------------------

    def feed(self, event: ev.Event) -> None:
        """The listener sources call. It only queues; the next frame folds and draws."""
        self.stream.feed(event)

    def replace_model(self, model: RunModel) -> None:
        """Swap in a model folded elsewhere (a replay jump); every widget redraws from it."""
        self.stream.model = model
        self.stream.pending.clear()
        self.draw_frame()

    def _reset_view(self) -> None:
        """A new model on screen: every widget redraws from scratch."""
        title, phases, totals, slots, metrics, findings, ttft, progress, log = self._widgets
        self._drawn_version = -1
        self._log_shown = 0
        findings.reset_rows()
        slots.reset()
        self._totals_shown = self._title_shown = None
        metrics._drawn = None
        phases._drawn = None
        ttft._drawn = None
        progress._drawn = None
        self.query_one(ReplicaStrip)._drawn = None
        log.clear()

    def _tick(self) -> None:
        self._drawn_version = -1
        self.draw_frame()

    def now(self) -> float:
        """The run's clock for estimates: live, the last event's time plus what passed since it
        was folded; a replay, the position in the log."""
        model = self.model
        if self.source.live and not model.finished and model.events_seen:
            return model.last_t + (time.monotonic() - self.stream.folded_at)
        return model.last_t

    def draw_frame(self) -> None:
        if not self.is_running:
            return
        if self._widgets is None:
            self._widgets = (self.query_one("#title", Static), self.query_one(PhaseList),
                             self.query_one("#totals", Static), self.query_one(SlotGrid),
                             self.query_one(MetricsStrip), self.query_one(FindingsTable), self.query_one(TtftHistogram),
                             self.query_one(ProgressStrip), self.query_one("#server-log", Log))
            self._matrix_table = self.query_one(MatrixTable) if self.matrix else None
        live = self.live_stream
        if live is not None and live is not self.stream:
            live.fold()                                           # the running profile, off screen
        self.stream.fold()
        if self.stream.model is not self._drawn_model:
            self._drawn_model = self.stream.model
            self._reset_view()
        if self._matrix_table is not None:
            self._show_matrix()
        replay_status = getattr(self.source, "status", None)
        if self.model.version == self._drawn_version and replay_status is None:
            return
        self._drawn_version = self.model.version
        self.frames += 1
        model = self.model
        grid = model.report.server.grid if model.report.server else 0
        title, phases, totals, slots, metrics, findings, ttft, progress_strip, log = self._widgets
        title_text = self._title()
        if title_text != self._title_shown:
            self._title_shown = title_text
            title.update(title_text, layout=False)                # one line, fixed height
        progress = model.progress.estimate(self.now())
        progress_strip.show(progress)
        phases.show(model, progress)
        totals_text = self._totals()
        if totals_text != self._totals_shown:                     # height auto: a layout pass only on change
            self._totals_shown = totals_text
            totals.update(totals_text)
        if slots.show(model, grid, self.force_compact):
            self._drawn_version = -1                              # a slot put its repaint off: next frame
        metrics.show(model)
        self.query_one(ReplicaStrip).show(model)
        findings.show(model)
        ttft.show(model)
        if model.server_log_total > self._log_shown:
            new = min(model.server_log_total - self._log_shown, len(model.server_log))
            log.write_lines(list(model.server_log)[-new:])
            self._log_shown = model.server_log_total

    def _title(self) -> Text:
        replay_status = getattr(self.source, "status", None)
        return title_bar(self.model, badge=self._matrix_badge() if self.matrix else None,
                          replay_status=replay_status() if replay_status is not None else None, paused=self.paused)

    def on_status_line(self, message: StatusLine) -> None:
        """Start-up progress of a launched server (before the run's first event)."""
        self.status_line = message.line[-300:]
        self._drawn_version = -1

    def _totals(self) -> Text:
        return run_totals(self.model, self.status_line)

    # --- selection and actions --------------------------------------------------------------

    def selected_request(self) -> tuple[int | None, str | None]:
        """The request under the cursor: a focused slot, else the highlighted finding."""
        focused = self.focused
        if isinstance(focused, SlotPanel):
            return focused.request, None
        table = self.query_one(FindingsTable)
        if table.row_count and table.cursor_row is not None and table.cursor_row < len(self.model.findings):
            finding = self.model.findings[table.cursor_row]
            return finding.request, finding.kind
        slots = self.model.slot_requests()
        return (slots[0][1].request, None) if slots and slots[0][1] else (None, None)

    def on_data_table_row_selected(self, message: DataTable.RowSelected) -> None:
        self.action_open_detail()

    def on_slot_panel_selected(self, message: SlotPanel.Selected) -> None:
        if message.request is not None:
            self.open_detail(message.request)

    def action_open_detail(self) -> None:
        request, _ = self.selected_request()
        if request is not None:
            self.open_detail(request)

    def open_detail(self, request: int) -> None:
        self.draw_frame()
        if request in self.model.requests:
            self.push_screen(RequestDetail(self.model, request))
        else:
            self.notify(f"request {request} is no longer kept in memory", severity="warning")

    def action_isolate(self) -> None:
        request, kind = self.selected_request()
        if request is None:
            self.notify("select a slot or a finding first", severity="warning")
            return
        self.isolate_request(request, kind)

    def isolate_request(self, request: int, kind: str | None = None) -> None:
        if kind is None:
            kinds = [f.kind for f in self.model.findings if f.request == request and f.severity != "info"]
            kind = kinds[0] if kinds else None
        if self.model.active_isolation is not None:
            self.notify("an isolation re-run is already in progress", severity="warning")
            return

        async def go() -> None:
            try:
                possible = await self.source.isolate(request, kind)
            except HitproofError as exc:     # e.g. the server went away: said, and the next one may start
                self.draw_frame()             # its start event folded first, then cleared
                self.model.active_isolation = None
                self.notify(f"isolation of request {request} failed: {exc}", severity="error", timeout=30)
                return
            except Exception as exc:         # a bug: said, and the exit code says it too
                self.draw_frame()
                self.model.active_isolation = None
                self.fail(f"isolation of request {request} failed: {type(exc).__name__}: {exc}", EXIT_INTERNAL)
                return
            if not possible:
                self.notify("isolation needs a live server (this is a replay)", severity="warning")

        self.push_screen(IsolationProgress(self.model, request))
        self.run_worker(go(), group="isolation", exit_on_error=False)

    def action_pause(self) -> None:
        self.paused = not self.paused
        self.source.set_paused(self.paused)
        self._drawn_version = -1
        self.draw_frame()
        self.notify("paused before the next request" if self.paused else "resumed")

    def action_toggle_log(self) -> None:
        self.query_one("#server-log").toggle_class("hidden")
        self.query_one("#findings").toggle_class("hidden")

    def action_toggle_compact(self) -> None:
        current = self.query_one(SlotGrid).compact
        self.force_compact = not current
        self._drawn_version = -1
        self.draw_frame()

    def action_screenshot(self) -> None:
        self.screenshot_dir.mkdir(parents=True, exist_ok=True)
        path = self.save_screenshot(path=str(self.screenshot_dir))
        self.notify(f"saved {path}")

    def action_play(self) -> None:
        self.source.toggle()

    def action_speed(self, key: str) -> None:
        self.source.set_speed(key)

    def action_next_finding(self) -> None:
        self.source.next_mark("finding")

    def action_next_phase(self) -> None:
        self.source.next_mark("phase_start")

    def action_seek(self, where: str) -> None:          # home: the start, end: the end
        self.source.seek(0 if where == "start" else len(self.source.index))

    async def action_quit_app(self) -> None:
        if self.matrix:
            self._stop_replay()
            if not self.main_source.finished:      # the rows done so far stay in the files
                self.source_worker.cancel()
                await self._wait_for_source("stop")
                if self.failure is None:
                    self.exit_code = EXIT_INTERRUPTED
            self.exit(return_code=self.exit_code if self.exit_code is not None else EXIT_INTERRUPTED)
            return
        if self.model.report.end is None and self.source.live and self.failure is None:
            self.source_worker.cancel()
            await self._wait_for_source("stop")
            if self.failure is None:
                self.exit_code = EXIT_INTERRUPTED
        quit_event = getattr(self.source, "quit_requested", None)
        if quit_event is not None:
            quit_event.set()
            await self._wait_for_source("finish")
        code = self.exit_code if self.exit_code is not None else self.model.report.exit_code
        self.exit(return_code=code)

    async def _wait_for_source(self, what: str) -> None:
        """Wait for the soak worker after quitting; a soak that does not end in time is said, not dropped
        (its failures reach fail() from the worker itself)."""
        done, _ = await asyncio.wait({asyncio.ensure_future(self.source_worker.wait())}, timeout=self.quit_timeout)
        if not done:
            self.fail(f"the soak did not {what} within {self.quit_timeout:g} s of quitting; the log may lack its "
                      f"last events", EXIT_INTERNAL)
            return
        error = next(iter(done)).exception()
        if error is not None and not isinstance(error, WorkerCancelled):
            self.fail(f"the soak failed: {type(error).__name__}: {error}", EXIT_INTERNAL)


def build_app(source: Source, **options) -> HitproofApp:
    """The one factory: the CLI and the tests build the app the same way."""
    return HitproofApp(source, **options)
