"""A long validation of the drafter, moved out of CI (its time budget): the agent replay's matrix row
with and without the drafter (two more servers). CI keeps the drafter's counters, its acceptance per
turn and the stripped-drafter collapse (tests/test_real_drafter.py). Run: see README.md here."""

import json

from support.cli import ROOT, report_json, run_hitproof

import pytest

pytestmark = pytest.mark.realserver


async def test_matrix_row_with_and_without_the_drafter(tmp_path):
    """The agent replay on llamacpp-drafter.toml and llamacpp-no-drafter.toml: both pass; the
    drafter row's turns carry an acceptance length (measured 4.75-5.0 of 5 with 4 draft tokens),
    the other none, and each header names its speculative method."""
    profiles = ROOT / "scenarios" / "profiles"
    out = tmp_path / "matrix"
    result = await run_hitproof("matrix", "--profile", str(profiles / "llamacpp-drafter.toml"),
                                "--profile", str(profiles / "llamacpp-no-drafter.toml"),
                                "--scenario", str(ROOT / "scenarios" / "agent-quick.toml"),
                                "--out", str(out), "--headless", timeout=1800)
    assert result.code == 0, result.out + result.err
    rows = {row["profile"]: row for row in json.loads((out / "matrix.json").read_text())}
    assert rows["llamacpp-drafter"]["verdict"] == rows["llamacpp-no-drafter"]["verdict"] == "pass"
    with_drafter = report_json(out / "llamacpp-drafter.jsonl")["phases"]["agent_replay"]["turns"]
    without = report_json(out / "llamacpp-no-drafter.jsonl")["phases"]["agent_replay"]["turns"]
    assert with_drafter and all(turn["acceptance"] > 2.0 for turn in with_drafter), with_drafter
    assert all(turn.get("acceptance") is None for turn in without), without
    header = json.loads((out / "llamacpp-drafter.jsonl").read_text().splitlines()[0])
    assert header["target"]["incident"]["speculative"]["method"] == "draft-simple"


