"""Replay: the same app fed from the log shows what the live run showed; damaged logs are handled."""

import json

import pytest

from support.app import live_app, text_of, wait_for
from support.cli import ROOT, run_hitproof
from tui.app.app import build_app
from tui.app.replay import ReplaySource
from tui.app.widgets import FindingsTable, SlotPanel
from tui.core.config.errors import BadInput
from tui.core.log.logindex import LogIndex
from tui.refserver import start_refserver

QUICK = ROOT / "scenarios" / "quick.toml"


def screen_state(app):
    """What the user sees: every slot panel's text and every findings row."""
    slots = [text_of(panel) for panel in app.query(SlotPanel)]
    table = app.query_one(FindingsTable)
    rows = [tuple(str(c) for c in table.get_row_at(i)) for i in range(table.row_count)]
    return slots, rows


async def replay_final_state(log, size=(100, 30)):
    app = build_app(ReplaySource(log))
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.source.ready, timeout=60)
        await pilot.pause(0.3)
        state = screen_state(app)
        verdict = app.model.report.verdict
        await pilot.press("q")
    return state, verdict


async def live_then_replay(url, log, scenario=QUICK):
    app = live_app(url, scenario, record=log)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.model.finished, timeout=120)
        await pilot.pause(0.3)
        live = screen_state(app)
        verdict = app.model.report.verdict
        await pilot.press("q")
    replayed, replay_verdict = await replay_final_state(log)
    return live, verdict, replayed, replay_verdict


async def test_refserver_fault_log_replays_as_seen_live(tmp_path):
    handle = await start_refserver(port=0, fault="foreign_state", seed=0, decode_ms_per_token=2)
    try:
        live, verdict, replayed, replay_verdict = await live_then_replay(handle.url, tmp_path / "fs.jsonl")
    finally:
        await handle.close()
    assert verdict == replay_verdict == "fail"
    assert live[1] and any("foreign_code" in row for row in live[1])
    assert replayed == live          # same slot panels, same findings rows


async def test_playback_from_start_and_jump_to_finding(tmp_path):
    handle = await start_refserver(port=0, fault="zero_state", seed=0, decode_ms_per_token=0)
    log = tmp_path / "z.jsonl"
    try:
        result = await run_hitproof("run", "--attach", handle.url, "--scenario", str(QUICK), "--headless",
                                    "--record", str(log))
    finally:
        await handle.close()
    assert result.code == 1
    app = build_app(ReplaySource(log))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.source.ready)
        total = len(app.source.index)
        assert app.source.position == total and app.model.finished        # opens on the final state
        await pilot.press("home")
        await wait_for(pilot, lambda: app.model.events_seen <= 1 and app.source.position == 0)
        assert not app.model.findings
        await pilot.press("n")                                             # next finding
        first = app.source.index.marks["finding"][0]
        await wait_for(pilot, lambda: app.source.position == first + 1)
        assert len(app.model.findings) == 1
        assert "REPLAY" in text_of(app.query_one("#title")) and f"{first + 1:,}/{total:,}" in text_of(
            app.query_one("#title"))
        await pilot.press("3", "space")                                    # as fast as possible
        await wait_for(pilot, lambda: app.source.position == total, timeout=30)
        await pilot.pause(0.3)
        assert app.model.finished and app.model.report.verdict == "fail"
        await pilot.press("j")                                             # to the next phase start
        await wait_for(pilot, lambda: app.source.position == app.source.index.marks["phase_start"][0] + 1)
        await pilot.press("q")


async def test_truncated_log_replays_up_to_last_good_event(tmp_path):
    handle = await start_refserver(port=0, fault="none", decode_ms_per_token=0)
    log = tmp_path / "t.jsonl"
    try:
        await run_hitproof("run", "--attach", handle.url, "--scenario", str(QUICK), "--headless", "--record", str(log))
    finally:
        await handle.close()
    lines = log.read_bytes().split(b"\n")
    keep = len(lines) // 2
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(b"\n".join(lines[:keep]) + b"\n" + lines[keep][:25])    # a crash mid-write
    index = LogIndex(cut)
    index.scan()
    assert len(index) == keep and "cut short" in index.warning
    app = build_app(ReplaySource(cut))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.source.ready)
        assert app.model.events_seen == sum(1 for line in lines[:keep] if not line.startswith(b'{"type":"delta"'))
        assert not app.model.finished and app.model.report.verdict == "incomplete"
        await pilot.press("q")
    report = await run_hitproof("report", str(cut), "--format", "json")
    assert report.code == 0 and "warning" in report.err and json.loads(report.out)["verdict"] == "incomplete"


def test_newer_schema_and_non_logs_are_clear_errors(tmp_path):
    newer = tmp_path / "new.jsonl"
    newer.write_text('{"type":"header","seq":1,"t":0,"schema":99}\n')
    with pytest.raises(BadInput, match="newer than this hitproof"):
        ReplaySource(newer)
    other = tmp_path / "other.jsonl"
    other.write_text('{"hello": 1}\n')
    with pytest.raises(BadInput, match="not a hitproof log"):
        ReplaySource(other)


async def test_replay_cli_errors_are_one_line(tmp_path):
    result = await run_hitproof("replay", str(tmp_path / "missing.jsonl"))
    assert result.code == 2 and result.err.strip().startswith("hitproof: error: cannot open log")
