"""hitproof's reference fault server: an OpenAI-compatible server with a real prefix
cache whose restores can be told to go wrong.  It shares no code with ``tui.core`` and
the core never imports it.  See README.md in this folder."""

from .config import RefServerConfig
from .faults import FAULTS
from .server import RefServerHandle, start_refserver

__all__ = ["FAULTS", "RefServerConfig", "RefServerHandle", "start_refserver"]
