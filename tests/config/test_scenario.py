"""Scenario files: defaults, the shipped files, and errors that name file, line and key."""

from pathlib import Path

import pytest

from tui.core.config.errors import BadInput
from tui.core.config.phase_registry import default_phases
from tui.core.config.scenario import load_scenario, parse_scenario

PHASE_NAMES = default_phases()

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["default", "quick", "agent-quick"])
def test_shipped_scenarios_load(name):
    s = load_scenario(ROOT / "scenarios" / f"{name}.toml")
    expected = {"default": PHASE_NAMES, "quick": PHASE_NAMES[:7], "agent-quick": ("agent_replay",)}[name]
    assert s.phases == expected
    assert s.name == name


def test_quick_keeps_at_least_four_slots_by_six_rounds():
    s = load_scenario(ROOT / "scenarios" / "quick.toml")
    assert s.rotation.slots >= 4 and s.rotation.rounds >= 6


def test_default_has_field_report_sizes():
    s = load_scenario(ROOT / "scenarios" / "default.toml")
    assert s.evidence.memo_tokens == 4500 and s.long_prompt.memo_tokens == 11000
    assert (s.rotation.slots, s.rotation.rounds) == (4, 14)
    assert s.determinism.max_tokens == 120


def _error(text: str) -> str:
    with pytest.raises(BadInput) as info:
        parse_scenario(text, "x.toml")
    return str(info.value)


def test_syntax_error_names_file_and_line():
    message = _error('[scenario]\nname = "a"\nseed = = 3\n')
    assert message.startswith("x.toml:3: invalid TOML")


def test_unknown_key_names_line_and_key():
    message = _error('[scenario]\nname = "a"\n\n[phases.rotation]\nslots = 4\nround = 6\n')
    assert message.startswith("x.toml:6: phases.rotation.round: unknown key")


def test_wrong_type_names_line_and_key():
    message = _error('[evidence]\nmemo_tokens = "big"\n')
    assert message.startswith("x.toml:2: evidence.memo_tokens: must be int")


def test_unknown_phase_in_list():
    message = _error('[scenario]\nphases = ["cold_hit", "warp"]\n')
    assert message.startswith("x.toml:2: scenario.phases: unknown phase 'warp'")


def test_unknown_phase_table():
    message = _error('[phases.warp]\nx = 1\n')
    assert message.startswith("x.toml:1: phases.warp: unknown phase 'warp'")


def test_unknown_section():
    assert _error('[evidense]\nmemo_tokens = 3\n').startswith("x.toml:1: evidense: unknown section")


def test_minimum_enforced():
    assert _error('[phases.rotation]\nslots = 1\n').startswith("x.toml:2: phases.rotation.slots: must be at least 2")


def test_bad_api():
    assert _error('[scenario]\napi = "grpc"\n').startswith("x.toml:2: scenario.api: must be one of")


def test_missing_file():
    with pytest.raises(BadInput, match="scenario file not found"):
        load_scenario("/nonexistent/s.toml")


def test_overrides_and_defaults():
    s = parse_scenario('[scenario]\nphases = ["rotation"]\n[phases.rotation]\nrounds = 3\n[sampling]\ntemperature = 0\n')
    assert s.phases == ("rotation",) and s.rotation.rounds == 3 and s.rotation.slots == 4
    assert s.sampling.temperature == 0.0


def test_code_position_max_is_zero_or_above_code_position():
    assert parse_scenario('[evidence]\ncode_position = 0.2\ncode_position_max = 0.9\n').evidence.code_position_max == 0.9
    assert parse_scenario('[evidence]\ncode_position = 0.2\n').evidence.code_position_max == 0.0
    assert _error('[evidence]\ncode_position = 0.5\ncode_position_max = 0.4\n').startswith(
        "x.toml:3: evidence.code_position_max: must be 0 (every code at code_position) or between code_position (0.5)")
    assert "got 1.0" in _error('[evidence]\ncode_position = 0.5\ncode_position_max = 1.0\n')
