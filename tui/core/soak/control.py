"""What a caller may do to a running soak, and nothing more: pause it before its next request, resume
it, re-send a flagged request alone (isolation). The app and the matrix hold a SoakControl, never the
engine: its gate, requester and findings stay its own (issue 25: a narrow port, no reaching in)."""

from __future__ import annotations

from ..log.events import Finding
from .engine import SoakEngine


class SoakControl:
    def __init__(self, engine: SoakEngine) -> None:
        self._engine = engine

    @property
    def paused(self) -> bool:
        return not self._engine.gate.is_set()

    def set_paused(self, paused: bool) -> None:
        """Paused: the soak sends nothing new (requests in flight finish); else it goes on."""
        (self._engine.gate.clear if paused else self._engine.gate.set)()

    async def isolate(self, request: int, kind: str | None) -> bool:
        """Re-send a flagged request alone (the soak pauses meanwhile); False when that is not possible
        (the engine has not started requesting, or the request is no longer kept)."""
        engine = self._engine
        record = engine.requester.record(request) if engine.requester is not None else None
        if record is None:
            return False
        finding = next((f for f in engine.findings if f.request == request and (kind is None or f.kind == kind)),
                       None)
        if finding is None:
            finding = Finding(kind="any", severity="info", phase=record.phase, slot=record.slot,
                              round=record.round, request=request)
        was_running = not self.paused
        self.set_paused(True)            # alone: the soak sends nothing new while isolation runs
        try:
            await engine.isolate(finding)
        finally:
            if was_running:
                self.set_paused(False)
        return True
