"""llama.cpp slot state over HTTP: save, restore, erase a slot; list the slots.

llama-server started with `--slot-save-path DIR` writes a slot's KV cache (and its token list)
to DIR/FILENAME and reads it back, into any slot of any server of the same model that was
given the same folder:

    async with SlotClient("http://127.0.0.1:8080") as slots:
        saved = await slots.save(0, "memo-a.bin")        # SlotResult(tokens=1295, bytes=800772, ...)
        restored = await slots.restore(0, "memo-a.bin")  # on another server: state that moved
        await slots.erase(0)
        for slot in await slots.list():                  # GET /slots
            ...

A request is pinned to a slot with `"id_slot": N` in its body (llama.cpp's own /completion and
the OpenAI endpoints alike, measured). Every failure is a SlotError with one readable line: the
server's refusal (HTTP status and its message), an unreachable or dead server, or an answer
that is not what llama.cpp answers. A restore that the server accepts is not yet a hit: the
next request may still re-process everything (llama.cpp #26676, #25913); only its cached tokens
say (tui/embedded/NOTES-router-slots.md has what happened here; the restore phase,
tui/core/soak/phases/restore.py, judges by them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import httpx

__all__ = ["SlotClient", "SlotError", "SlotResult", "SlotInfo", "valid_filename"]

# What llama.cpp accepts as a slot file name (fs_validate_filename): no folders, no "..".
_FILENAME = re.compile(r"^[A-Za-z0-9._-]{1,200}$")
# action -> (token-count key, byte-count key, timing key) in llama.cpp's answer
_KEYS = {
    "save": ("n_saved", "n_written", "save_ms"),
    "restore": ("n_restored", "n_read", "restore_ms"),
    "erase": ("n_erased", None, None),
}


class SlotError(Exception):
    """One line: what was asked, of which server, and what went wrong."""

    def __init__(self, message: str, *, status: int | None = None, refused: bool = False) -> None:
        super().__init__(message)
        self.status = status  # the HTTP status when the server answered
        self.refused = refused  # the server answered and said no (not a transport failure)


@dataclass(frozen=True)
class SlotResult:
    action: str  # save | restore | erase
    slot: int
    filename: str | None
    tokens: int | None  # n_saved / n_restored / n_erased
    bytes: int | None  # n_written / n_read
    ms: float | None  # the server's own timing of the file operation
    body: dict = field(default_factory=dict)  # the whole answer


@dataclass(frozen=True)
class SlotInfo:
    id: int
    n_ctx: int | None
    is_processing: bool | None
    n_prompt_tokens: int | None  # tokens the slot holds (absent on an unused slot)
    body: dict = field(default_factory=dict)


def valid_filename(name: str) -> bool:
    """True for a name llama.cpp accepts for a slot file (letters, digits, '.', '_', '-'; no folders)."""
    return bool(_FILENAME.match(name)) and name not in (".", "..") and ".." not in name


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        text = response.text.strip().replace("\n", " ")
        return text[:200] or "(empty answer)"
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
    return str(body)[:200]


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class SlotClient:
    """Slot actions on one llama-server; use as an async context manager or pass an httpx client."""

    def __init__(self, base_url: str, *, client: httpx.AsyncClient | None = None, timeout: float = 120.0) -> None:
        self.url = base_url.rstrip("/")
        if self.url.endswith("/v1"):
            self.url = self.url[:-3]
        self._own = client is None
        self._client = client or httpx.AsyncClient(timeout=timeout, trust_env=False)

    async def __aenter__(self) -> "SlotClient":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._own:
            await self._client.aclose()

    async def _request(self, what: str, method: str, path: str, json: dict | None = None) -> Any:
        try:
            response = await self._client.request(method, self.url + path, json=json)
        except httpx.HTTPError as e:
            raise SlotError(f"{what} on {self.url} failed: {type(e).__name__}: {e or 'no answer'}") from None
        if response.status_code != 200:
            status = response.status_code
            if status == 501 or (status == 404 and path.startswith("/slots")):
                hint = " (was it started with --slot-save-path?)" if "action" in path else ""
            else:
                hint = ""
            raise SlotError(f"{what} refused by {self.url}: HTTP {status}: {_message(response)}{hint}",
                            status=status, refused=True)
        try:
            return response.json()
        except ValueError:
            raise SlotError(f"{what} on {self.url}: the answer is not JSON: {response.text[:120]!r}") from None

    async def _action(self, action: str, slot: int, filename: str | None) -> SlotResult:
        what = f"{action} slot {slot}" + (f" {'to' if action == 'save' else 'from'} {filename}" if filename else "")
        if not isinstance(slot, int) or isinstance(slot, bool) or slot < 0:
            raise SlotError(f"{what}: the slot id must be a whole number >= 0")
        if filename is not None and not valid_filename(filename):
            raise SlotError(f"{what}: {filename!r} is not a plain file name (letters, digits, '.', '_', '-')")
        body = await self._request(what, "POST", f"/slots/{slot}?action={action}",
                                   {"filename": filename} if filename is not None else None)
        if not isinstance(body, dict):
            raise SlotError(f"{what} on {self.url}: unexpected answer {str(body)[:120]!r}")
        n_key, bytes_key, ms_key = _KEYS[action]
        timings = body.get("timings") if isinstance(body.get("timings"), dict) else {}
        ms = timings.get(ms_key) if ms_key else None
        return SlotResult(action, _int(body.get("id_slot")) if "id_slot" in body else slot, body.get("filename", filename),
                          _int(body.get(n_key)), _int(body.get(bytes_key)) if bytes_key else None,
                          float(ms) if isinstance(ms, (int, float)) else None, body)

    async def save(self, slot: int, filename: str) -> SlotResult:
        """Write the slot's state to the server's slot folder (tokens = what was saved)."""
        return await self._action("save", slot, filename)

    async def restore(self, slot: int, filename: str) -> SlotResult:
        """Load a saved state into the slot; SlotError(refused=True) when the server rejects the file."""
        return await self._action("restore", slot, filename)

    async def erase(self, slot: int) -> SlotResult:
        """Forget the slot's state (tokens = how many it held)."""
        return await self._action("erase", slot, None)

    async def list(self) -> list[SlotInfo]:
        """GET /slots: every slot with its context size and the tokens it holds."""
        body = await self._request("list slots", "GET", "/slots")
        if not isinstance(body, list):
            raise SlotError(f"list slots on {self.url}: expected a list, got {str(body)[:120]!r}")
        out = []
        for entry in body:
            if isinstance(entry, dict) and _int(entry.get("id")) is not None:
                processing = entry.get("is_processing")
                out.append(SlotInfo(entry["id"], _int(entry.get("n_ctx")),
                                    processing if isinstance(processing, bool) else None,
                                    _int(entry.get("n_prompt_tokens")), entry))
        return out
