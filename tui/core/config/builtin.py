"""Where hitproof's own scenarios and launch profiles are, so that a bare name ("quick",
"vllm-prefix-on") is found from any folder: ./scenarios first (a user's own), then hitproof's."""

from __future__ import annotations

from pathlib import Path

PROJECT_SCENARIOS = Path(__file__).resolve().parents[3] / "scenarios"


def find(name_or_path: str, subfolder: str = "") -> Path:
    """A path as given when it is one (exists, ends in .toml, or has a slash); else NAME.toml in
    ./scenarios[/subfolder] or in hitproof's scenarios[/subfolder]; else the name as a path (whose
    reader then says it was not found)."""
    candidate = Path(name_or_path)
    if candidate.exists() or candidate.suffix == ".toml" or "/" in name_or_path:
        return candidate
    for folder in (Path.cwd() / "scenarios", PROJECT_SCENARIOS):
        found = folder / subfolder / f"{name_or_path}.toml"
        if found.exists():
            return found
    return candidate
