"""llama.cpp-shaped slot save/restore on the reference server, for the restore phase's fast tests
(the claims are shown on real llama-servers: tests/real/test_real_replicas.py).

    python -m tui.refserver --slot-save-path DIR [--fault slot_noop|slot_trust]

`POST /slots/{id}?action=save|restore|erase` with `{"filename": NAME}` answers as llama-server
does (`n_saved`/`n_written`, `n_restored`/`n_read`, `n_erased`, `timings`); a request pinned with
`"id_slot": N` leaves its prompt's state in slot N. A saved file is `hpslot1 SHA256 COUNT\\n` and the
tokens as JSON; a restore puts them back in the prefix cache, so a request that extends them hits.
A file that fails its checksum or does not parse is refused (HTTP 400, llama.cpp's words). Faults:

``slot_noop``   a restore is accepted (`n_restored` = the saved count) and nothing is reused: the
                silent no-op of llama.cpp #26676 (seen here on Gemma).
``slot_trust``  the checksum is not verified: a damaged file with an intact header is accepted, the
                state read from it is wrong, and the slot stays poisoned: any request pinned to it
                answers one repeated token (llama.cpp #27068, seen here on the hybrid models).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path

from .tokenizer import Token, token_for

SLOT_FAULTS = ("slot_noop", "slot_trust")
MAGIC = b"hpslot1 "
_FILENAME = re.compile(r"^[A-Za-z0-9._-]{1,200}$")
REFUSED = "Unable to restore slot: No available space in KV cache or invalid slot save file"


class SlotRefused(ValueError):
    """One line for an HTTP 400 answer."""


class Slots:
    def __init__(self, folder: str | None, fault: str = "none", n_slots: int = 4) -> None:
        self.folder = Path(folder) if folder else None
        self.fault = fault
        self.n_slots = n_slots
        self.held: dict[int, list[Token]] = {}     # slot -> the state its last request left
        self.poisoned: set[int] = set()

    def remember(self, slot: int | None, state: list[Token]) -> None:
        if slot is not None:
            self.held[slot] = list(state)

    def poison(self, slot: int | None, state: list[Token]) -> list[Token]:
        """The state a request pinned to `slot` reads: one repeated token where a bad restore poisoned it."""
        if slot is None or slot not in self.poisoned or not state:
            return state
        return [token_for("<")] * len(state)

    def _path(self, filename: object) -> Path:
        if self.folder is None:
            raise SlotRefused("This server does not support slots action (no --slot-save-path)")
        if not isinstance(filename, str) or not _FILENAME.match(filename) or ".." in filename:
            raise SlotRefused("Invalid filename")
        return self.folder / filename

    def _slot(self, slot: int) -> int:
        if not 0 <= slot < self.n_slots:
            raise SlotRefused(f"Invalid slot ID {slot}")
        return slot

    def save(self, slot: int, filename: object) -> dict:
        path = self._path(filename)
        started = time.perf_counter()
        tokens = self.held.get(self._slot(slot), [])
        payload = json.dumps([[t.id, t.text] for t in tokens], separators=(",", ":")).encode()
        digest = hashlib.sha256(payload).hexdigest().encode()
        data = MAGIC + digest + b" " + str(len(tokens)).encode() + b"\n" + payload
        path.write_bytes(data)
        return {"id_slot": slot, "filename": filename, "n_saved": len(tokens), "n_written": len(data),
                "timings": {"save_ms": round((time.perf_counter() - started) * 1000, 3)}}

    def restore(self, slot: int, filename: object, store) -> dict:
        """Read the file back into `slot`; `store(tokens)` puts them in the prefix cache."""
        path = self._path(filename)
        slot = self._slot(slot)
        started = time.perf_counter()
        try:
            data = path.read_bytes()
        except OSError:
            raise SlotRefused(REFUSED) from None
        tokens, intact = _parse(data)
        if tokens is None or (not intact and self.fault != "slot_trust"):
            raise SlotRefused(REFUSED)
        self.held[slot] = tokens
        self.poisoned.discard(slot)
        if not intact:
            self.poisoned.add(slot)
            store(self.poison(slot, tokens))
        elif self.fault != "slot_noop":
            store(tokens)
        return {"id_slot": slot, "filename": filename, "n_restored": len(tokens), "n_read": len(data),
                "timings": {"restore_ms": round((time.perf_counter() - started) * 1000, 3)}}

    def erase(self, slot: int) -> dict:
        tokens = self.held.pop(self._slot(slot), [])
        self.poisoned.discard(slot)
        return {"id_slot": slot, "n_erased": len(tokens)}


def _parse(data: bytes) -> tuple[list[Token] | None, bool]:
    """(tokens, the checksum matched); tokens None where the header is not this format's. A payload
    that no longer parses still yields its header's count of tokens (what a trusting reader gets)."""
    head, _, payload = data.partition(b"\n")
    if not head.startswith(MAGIC):
        return None, False
    fields = head[len(MAGIC):].split(b" ")
    if len(fields) != 2 or not fields[1].isdigit():
        return None, False
    digest, count = fields[0], int(fields[1])
    intact = hashlib.sha256(payload).hexdigest().encode() == digest
    try:
        pairs = json.loads(payload)
        tokens = [Token(int(i), str(t)) for i, t in pairs]
    except (ValueError, TypeError):
        if not intact:
            return [token_for("<")] * count, False
        return None, False
    if len(tokens) != count:
        return None, False
    return tokens, intact
