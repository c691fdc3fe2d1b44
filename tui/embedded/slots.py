"""llama.cpp slot save/restore/erase: the client lives in the core (tui/core/server/slots.py), where
the restore phase uses it; this name stays for the embedded side and the real-server tests."""

from ..core.server.slots import SlotClient, SlotError, SlotInfo, SlotResult, valid_filename

__all__ = ["SlotClient", "SlotError", "SlotInfo", "SlotResult", "valid_filename"]
