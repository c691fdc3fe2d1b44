"""The phases as the parts below the soak see them: one module each, in tui/core/soak/phases/.

A phase module declares everything about its phase (its `[phases.NAME]` settings, plan, run, and what
it adds to each report); the registry in tui/core/soak/phases/__init__.py lists them. The scenario
schema (this part) and the reports cannot import a phase: a phase imports the soak, which imports them.
They find the phases here instead, loaded when first asked for, never at import time (the way
harlequin's adapters are found through entry points: the modules below discover, nothing lists twice)."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

PHASES_PACKAGE = "tui.core.soak.phases"


_registry: dict[str, ModuleType] | None = None


def registry() -> dict[str, ModuleType]:
    """Every phase module by name, in the default scenario's order. The dict is kept once loaded: the report
    asks for a phase's hooks on every request's events, and import_module's lookup cost 2% of hitproof's CPU
    at 128 streams (py-spy, 2026-12-07). A test that adds a phase adds it to this same dict."""
    global _registry
    if _registry is None:
        _registry = importlib.import_module(PHASES_PACKAGE).PHASES
    return _registry


def phase(name: str) -> ModuleType | None:
    return registry().get(name)


def default_phases() -> tuple[str, ...]:
    """The phases a scenario runs when it names none (an OPTIONAL phase must be asked for)."""
    return tuple(name for name, module in registry().items() if not getattr(module, "OPTIONAL", False))


def known_phases() -> tuple[str, ...]:
    """Every phase a scenario may name: the default ones first, then the optional ones."""
    optional = tuple(name for name, module in registry().items() if getattr(module, "OPTIONAL", False))
    return default_phases() + optional


def hook(name: str | None, what: str) -> Any:
    """What the phase of that name declares under `what` (None: no such phase, or it declares nothing)."""
    module = registry().get(name) if name else None
    return getattr(module, what, None) if module is not None else None


def providers(what: str, value: Any) -> dict[str, ModuleType]:
    """The phase modules that declare `what` as `value` (the phases counting a kind of power evidence)."""
    return {name: module for name, module in registry().items() if getattr(module, what, None) == value}
