"""Where hitproof's own scenarios and launch profiles are, so that a bare name ("quick",
"vllm-prefix-on") is found from any folder: ./scenarios first (a user's own), then hitproof's.

hitproof's are the top-level scenarios/ folder, which pyproject.toml maps into the package as
`tui.scenarios`: an installed wheel (or an sdist's) has them in tui/scenarios/, a source checkout
or an editable install in scenarios/ beside tui/."""

from __future__ import annotations

from pathlib import Path

_TUI = Path(__file__).resolve().parents[2]
INSTALLED_SCENARIOS = _TUI / "scenarios"          # in a wheel: site-packages/tui/scenarios
PROJECT_SCENARIOS = _TUI.parent / "scenarios"     # in a checkout: the top-level scenarios/


def builtin_folder() -> Path:
    """hitproof's own scenarios folder, wherever this install has it."""
    return INSTALLED_SCENARIOS if INSTALLED_SCENARIOS.is_dir() else PROJECT_SCENARIOS


def find(name_or_path: str, subfolder: str = "") -> Path:
    """A path as given when it is one (exists, ends in .toml, or has a slash); else NAME.toml in
    ./scenarios[/subfolder] or in hitproof's scenarios[/subfolder]; else the name as a path (whose
    reader then says it was not found)."""
    candidate = Path(name_or_path)
    if candidate.exists() or candidate.suffix == ".toml" or "/" in name_or_path:
        return candidate
    for folder in (Path.cwd() / "scenarios", builtin_folder()):
        found = folder / subfolder / f"{name_or_path}.toml"
        if found.exists():
            return found
    return candidate
