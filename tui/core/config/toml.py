"""The one TOML reader for hitproof's files (scenarios, launch profiles): every mistake is one line
naming the file, the line and the key ("broken.toml:3: phases.rotation.rouns: unknown key ...")."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from .errors import BadInput


def read_text(path: str | Path, what: str) -> str:
    """The file's text; BadInput ("PATH: WHAT file not found" / "cannot read WHAT") otherwise."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadInput(f"{path}: {what} file not found") from None
    except IsADirectoryError:
        raise BadInput(f"{path}: is a folder, not a {what} file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: cannot read {what}: {exc}") from None


def parse(text: str, source: str) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        line = re.search(r"line (\d+)", message)
        where = f"{source}:{line.group(1)}" if line else source
        raise BadInput(f"{where}: invalid TOML: {message}") from None


def locate(text: str, section: str, key: str | None) -> int:
    """Line (1-based) where `key` is set inside `[section]` ("" is the top level), or the section's
    header when key is None or not found; 0 if absent."""
    current = ""
    header_line = 0
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        match = re.match(r"^\[\s*([^\[\]]+?)\s*\]", stripped)
        if match:
            current = match.group(1).replace(" ", "").replace('"', "")
            if current == section:
                header_line = number
            continue
        if current == section and key is not None:
            if re.match(rf"^\"?{re.escape(key)}\"?\s*=", stripped):
                return number
    return header_line


def located(text: str, source: str, section: str, key: str | None, message: str) -> BadInput:
    """A BadInput that points at the key: "SOURCE:LINE: SECTION.KEY: MESSAGE"."""
    line = locate(text, section, key)
    if not line and key is not None:         # a table of its own ([env] in a profile)
        line = locate(text, f"{section}.{key}" if section else key, None)
    where = f"{source}:{line}" if line else source
    dotted = ".".join(part for part in (section, key) if part)
    return BadInput(f"{where}: {dotted}: {message}")
