"""Replay a recorded soak in the same app: the final state first, then play from anywhere.

The log is indexed in a background thread (never loaded whole); the app shows the header at
once, the final state when the fold is done, and plays events through the same model.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ..core.log.logindex import LogIndex
from .model import RunModel

if TYPE_CHECKING:
    from .ports import EventSink

SPEEDS = {"1": 1.0, "2": 10.0, "3": None}     # None: as fast as possible
MAX_WAIT = 2.0                                # seconds; long gaps in a log are not replayed in full
BATCH = 500                                   # events per frame at full speed


class ReplaySource:
    live = False

    def __init__(self, path):
        self.index = LogIndex(path)           # raises BadInput (clear one-line error) before the app starts
        self.position = 0                     # index of the next event to play
        self.playing = False
        self.speed: float | None = 10.0
        self.progress = 0.0
        self.ready = False
        self.app: EventSink | None = None
        self._player: asyncio.Task | None = None

    # --- Source protocol -----------------------------------------------------------------------

    async def run(self, app: EventSink) -> int | None:
        self.app = app
        app.feed(self.index.header)
        model = await asyncio.to_thread(self._scan_and_fold)
        self.ready = True
        self.position = len(self.index)
        app.replace_model(model)
        if self.index.warning:
            app.notify(self.index.warning, severity="warning", timeout=10)
        return model.report.exit_code if model.report.end is not None else None

    async def isolate(self, request: int, kind: str | None) -> bool:
        return False

    def set_paused(self, paused: bool) -> None:
        self.toggle(play=not paused)

    # --- folding ------------------------------------------------------------------------------------

    def _scan_and_fold(self) -> RunModel:
        def progress(fraction: float) -> None:
            self.progress = fraction

        self.index.scan(progress)
        return self._fold(len(self.index))

    def _fold(self, stop: int) -> RunModel:
        model = RunModel()
        for event in self.index.events(0, stop, skip_deltas=True):
            model.apply(event)
        return model

    # --- controls ----------------------------------------------------------------------------------------

    def status(self) -> str:
        if not self.ready:
            return f"REPLAY indexing {self.progress * 100:.0f}%"
        speed = "max" if self.speed is None else f"x{self.speed:g}"
        state = "▶" if self.playing else "❚❚"
        return f"REPLAY {state} {speed} {self.position:,}/{len(self.index):,}"

    def toggle(self, play: bool | None = None) -> None:
        if not self.ready:
            return
        play = (not self.playing) if play is None else play
        if play and self.position >= len(self.index):
            self.seek(0, play=True)
            return
        self.playing = play
        if play and (self._player is None or self._player.done()):
            self._player = asyncio.get_running_loop().create_task(self._play())

    def stop(self) -> None:
        """Stop playing for good (the matrix moves its view elsewhere)."""
        self.playing = False
        if self._player is not None and not self._player.done():
            self._player.cancel()

    def set_speed(self, key: str) -> None:
        self.speed = SPEEDS.get(key, self.speed)

    def seek(self, index: int, *, play: bool = False) -> None:
        """State as it was just before event `index`, then (maybe) play on from there."""
        if not self.ready:
            return
        self.playing = False
        index = max(0, min(index, len(self.index)))

        async def go() -> None:
            if self._player is not None and not self._player.done():
                self._player.cancel()
                await asyncio.gather(self._player, return_exceptions=True)
            model = await asyncio.to_thread(self._fold, index)
            self.position = index
            self.app.replace_model(model)
            if play:
                self.toggle(play=True)

        asyncio.get_running_loop().create_task(go())

    def next_mark(self, kind: str) -> None:
        marks = [i for i in self.index.marks.get(kind, []) if i >= self.position]
        if not marks and self.index.marks.get(kind):
            marks = self.index.marks[kind][:1]             # wrap around to the first one
        if marks:
            self.seek(marks[0] + 1)                      # just after it: the finding is on screen

    async def _play(self) -> None:
        previous_t: float | None = None
        while self.playing and self.position < len(self.index):
            if self.speed is None:
                stop = min(len(self.index), self.position + BATCH)
                for event in self.index.events(self.position, stop):
                    self.app.feed(event)
                self.position = stop
                await asyncio.sleep(1 / 30)
                continue
            event = self.index.read(self.position)
            if previous_t is not None:
                wait = max(0.0, min(MAX_WAIT, (event.t - previous_t) / self.speed))
                if wait:
                    await asyncio.sleep(wait)
            previous_t = event.t
            if not self.playing:
                break
            self.app.feed(event)
            self.position += 1
        if self.position >= len(self.index):
            self.playing = False
