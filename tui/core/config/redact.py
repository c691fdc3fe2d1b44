"""Secrets never written: API keys and tokens are replaced by "<redacted>" wherever hitproof writes or
shows text it did not make (a launch command, a server's output lines, the log).

The secrets of a run are known before it starts: the API key hitproof sends ($HITPROOF_API_KEY, else
$OPENAI_API_KEY), the value of every secret-looking flag of the launch command (--api-key X,
--hf-token=X, ...) and of every secret-looking variable of the server's environment (a name with KEY,
TOKEN, SECRET, PASSWORD or CREDENTIAL in it). Pure: no I/O, no imports from the rest of hitproof."""

from __future__ import annotations

import json
import os
import re
import shlex
from typing import Iterable, Mapping

REDACTED = "<redacted>"
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.I)
# A secret word between dashes: --api-key, --hf-token, --token-file; not --enable-prompt-tokens-details
# (a boolean whose name holds "tokens": it hid the next flag's value, `--max-model-len 16384`).
SECRET_FLAG = re.compile(r"^--?([A-Za-z0-9_]+[-_])*(api[-_]?key|token|secret|password|passwd)([-_][A-Za-z0-9_-]*)?$",
                         re.I)
MIN_FREE_TEXT = 6        # shorter values (TOKENIZERS_PARALLELISM=false) are not hunted in free text
API_KEY_ENV = ("HITPROOF_API_KEY", "OPENAI_API_KEY")


def redact_argv(argv: Iterable[str]) -> list[str]:
    """The command with the value of every secret-looking flag replaced (`--api-key X`, `--api-key=X`)."""
    out: list[str] = []
    hide_next = False
    for word in argv:
        if hide_next and not _is_flag(word):     # a value that is the next flag is no secret
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        flag, eq, _ = word.partition("=")
        if SECRET_FLAG.match(flag):
            if eq:
                out.append(f"{flag}={REDACTED}")
            else:
                out.append(word)
                hide_next = True
            continue
        out.append(word)
    return out


def _is_flag(word: str) -> bool:
    return word.startswith("--")


def secrets_of(argv: Iterable[str] | None = None, env: Mapping[str, str] | None = None,
               environ: Mapping[str, str] | None = None) -> list[str]:
    """The values to hide in a run: hitproof's API key, secret flags' values, secret env values."""
    environ = os.environ if environ is None else environ
    found = [environ.get(name) or "" for name in API_KEY_ENV]
    words = list(argv or [])
    for i, word in enumerate(words):
        flag, eq, value = word.partition("=")
        if SECRET_FLAG.match(flag):
            following = words[i + 1] if i + 1 < len(words) else ""
            found.append(value if eq else ("" if _is_flag(following) else following))
    found += [value for name, value in (env or {}).items() if SECRET_NAME.search(name)]
    # the longest first: a secret containing another is replaced whole
    return sorted({s for s in found if len(s) >= MIN_FREE_TEXT}, key=len, reverse=True)


class Redactor:
    """Replaces each secret (and its JSON-escaped form) in text or in an encoded log line."""

    def __init__(self, secrets: Iterable[str]):
        self.secrets = [s for s in secrets if s]
        forms = {s for s in self.secrets} | {json.dumps(s)[1:-1] for s in self.secrets}
        self._text = sorted(forms, key=len, reverse=True)
        self._bytes = [(s.encode(), REDACTED.encode()) for s in self._text]

    def __bool__(self) -> bool:
        return bool(self.secrets)

    def text(self, value: str) -> str:
        for secret in self._text:
            if secret in value:
                value = value.replace(secret, REDACTED)
        return value

    def line(self, value: bytes) -> bytes:
        for secret, mark in self._bytes:
            if secret in value:
                value = value.replace(secret, mark)
        return value

    def command(self, argv: Iterable[str]) -> list[str]:
        return [self.text(word) for word in redact_argv(argv)]

    def command_line(self, argv: Iterable[str]) -> str:
        """The command as a shell line, the marker left unquoted so it reads as what it is."""
        return " ".join(word if REDACTED in word else shlex.quote(word) for word in self.command(argv))
