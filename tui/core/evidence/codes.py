"""Planted evidence that names its owner: the run nonce, codes like 7395-2841-6620 (no 4-digit group
ever used twice in a run, so even one group is attributable), and the registry of who owns which."""

from __future__ import annotations

import random
import secrets
from dataclasses import dataclass


def new_nonce() -> str:
    # Letters only: the memo must hold no four-digit number other than its code.
    return "".join(secrets.choice("abcdefghijkmnpqrstuvwxyz") for _ in range(8))


def _usable_group(group: int) -> bool:
    text = f"{group:04d}"
    if text[0] == "0" or 1900 <= group <= 2099:      # no leading zero, nothing that reads as a year
        return False
    if len(set(text)) < 3:                          # no 1111 / 1212-like groups a model might invent
        return False
    return True


class CodeBook:
    """Issues codes like 7395-2841-6620; no 4-digit group is ever used twice in a run."""

    def __init__(self, rng: random.Random):
        self._rng = rng
        self._used: set[str] = set()

    def new_code(self) -> str:
        groups: list[str] = []
        while len(groups) < 3:
            value = self._rng.randrange(1000, 10000)
            text = f"{value:04d}"
            if _usable_group(value) and text not in self._used and text not in groups:
                groups.append(text)
        self._used.update(groups)
        return "-".join(groups)


@dataclass(frozen=True)
class CodeOwner:
    code: str
    memo: str
    phase: str
    slot: int | None = None


class Registry:
    """Every code planted in the run and which memo owns it."""

    def __init__(self) -> None:
        self.owners: dict[str, CodeOwner] = {}
        self._codes: dict[str, str] | None = None

    def register(self, owner: CodeOwner) -> None:
        if owner.code in self.owners:
            raise ValueError(f"code {owner.code} registered twice")
        self.owners[owner.code] = owner
        self._codes = None

    def codes(self) -> dict[str, str]:
        """code -> memo id, the shape the pure checks take. Made once per registered code, not once per
        answer (every answer is checked against it); the checks only read it."""
        if self._codes is None:
            self._codes = {code: owner.memo for code, owner in self.owners.items()}
        return self._codes


