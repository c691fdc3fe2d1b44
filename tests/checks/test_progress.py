"""Progress you can plan by (tui/core/report/progress.py): done of planned, elapsed, an estimate of
the rest from the rates seen so far, and the power target's checked hits of needed. Pure: fed
synthetic events here, and a real recorded run against the reference server at the end."""

import json
import re

import pytest

from support.cli import ROOT, run_hitproof
from tui.core.log.events import (PhaseFinished, PhaseStarted, PowerJudged, RequestFinished, RequestStarted,
                                 RunFinished, RunHeader, decode)
from tui.core.report.power import hits_needed
from tui.core.report.progress import ProgressFold, done_text, left_text, power_text, progress_line
from tui.refserver import start_refserver


def _plain(widget) -> str:
    from rich.console import Console

    console = Console(width=widget.content_size.width or 40, record=True, color_system=None)
    console.print(widget.content)
    return console.export_text()


class Run:
    """Feeds a ProgressFold one event at a time, with request ids handed out in order."""

    def __init__(self, settings=None, plan=None):
        self.fold = ProgressFold()
        self.request = 0
        self.fold.feed(RunHeader(t=0.0, scenario={"settings": settings or {}, "plan": plan or {}}))

    def phase(self, name, t, planned):
        self.fold.feed(PhaseStarted(t=t, phase=name, planned_requests=planned))

    def request_done(self, phase, t_start, t_end, *, cached=0, task="turn", arm="main", code=None):
        self.request += 1
        self.fold.feed(RequestStarted(t=t_start, request=self.request, phase=phase, arm=arm, task=task, code=code))
        self.fold.feed(RequestFinished(t=t_end, request=self.request, phase=phase, cached_tokens=cached,
                                       checks={"recall": {"ok": True}} if task == "recall" else {}))

    def end_phase(self, name, t, status="pass"):
        self.fold.feed(PhaseFinished(t=t, phase=name, status=status))


def test_a_running_phase_estimates_from_its_own_rate():
    run = Run(settings={"phases": ["cold_hit", "conversation"]},
              plan={"cold_hit": {"planned_requests": 4}, "conversation": {"planned_requests": 6}})
    run.phase("cold_hit", 0.0, 4)
    run.request_done("cold_hit", 0.0, 2.0)
    run.request_done("cold_hit", 2.0, 4.0)
    p = run.fold.estimate(4.0)
    cold = p.phase("cold_hit")
    assert (cold.status, cold.done, cold.planned, cold.expected) == ("running", 2, 4, 4)
    assert cold.elapsed_s == 4.0 and cold.remaining_s == pytest.approx(4.0) and cold.basis == "own rate"
    # the phase not started yet: its plan from the run header, at the run's rate (2 s a request)
    conv = p.phase("conversation")
    assert (conv.status, conv.done, conv.expected) == ("pending", 0, 6)
    assert conv.remaining_s == pytest.approx(12.0) and conv.basis == "run rate"
    assert p.run.planned == 10 and p.run.done == 2 and p.run.remaining_s == pytest.approx(16.0)
    assert p.running is cold and p.power is None
    assert done_text(cold) == "2/4" and left_text(cold) == "~4s left"
    assert progress_line(p) == "cold_hit 2/4 4s ~4s left; run 2/10 requests 4s ~16s left"


def test_the_clock_runs_between_events_and_controls_do_not_count():
    run = Run(settings={"phases": ["control"]}, plan={"control": {"planned_requests": 4}})
    run.phase("control", 1.0, 4)
    run.request_done("control", 1.0, 3.0)
    run.request_done("control", 3.0, 3.5, arm="control")      # a control arm re-send: not a planned request
    early, later = run.fold.estimate(3.5), run.fold.estimate(9.0)
    assert early.phase("control").done == 1 and early.phase("control").elapsed_s == 2.5
    assert later.phase("control").elapsed_s == 8.0 and later.run.elapsed_s == 9.0
    # no faster than what the clock shows: 1 of 4 in 8 s, 3 more at 8 s each
    assert later.phase("control").remaining_s == pytest.approx(24.0)


def test_before_any_request_finishes_there_is_no_estimate():
    run = Run(settings={"phases": ["cold_hit"]}, plan={"cold_hit": {"planned_requests": 3}})
    run.phase("cold_hit", 0.0, 3)
    p = run.fold.estimate(1.0)
    assert p.phase("cold_hit").remaining_s is None and p.run.remaining_s is None
    assert left_text(p.phase("cold_hit")) == "estimating" and done_text(p.phase("cold_hit")) == "0/3"


def test_an_unknown_plan_says_so():
    run = Run(settings={"phases": ["agent_replay"]}, plan={"agent_replay": {"planned_requests": 0}})
    p = run.fold.estimate(0.0)
    assert p.phase("agent_replay").expected is None and done_text(p.phase("agent_replay")) == "0/?"
    assert p.run.planned is None


def test_finished_phases_and_run_say_done():
    run = Run(settings={"phases": ["cold_hit"]}, plan={"cold_hit": {"planned_requests": 2}})
    run.phase("cold_hit", 0.0, 2)
    run.request_done("cold_hit", 0.0, 1.0)
    run.request_done("cold_hit", 1.0, 2.0, cached=500)
    run.end_phase("cold_hit", 2.0, "fail")
    run.fold.feed(RunFinished(t=2.5, verdict="fail", exit_code=1))
    p = run.fold.estimate(100.0)                     # the clock stops at the run's end
    assert p.phase("cold_hit").finished and p.phase("cold_hit").status == "fail"
    assert p.run.status == "done" and p.run.elapsed_s == 2.5 and p.run.remaining_s == 0.0
    assert done_text(p.run) == "2" and left_text(p.run) == "done"


ROTATION = {"phases": ["rotation"], "rotation": {"slots": 4, "rounds": 2, "tasks": ["recall"]},
            "power": {"fault_rate": 0.1, "confidence": 0.95, "budget_s": 0}}


def _rotation_round(run, rnd, t):
    for slot in range(4):
        run.request_done("rotation", t, t + 1.0, cached=0 if rnd == 0 else 800, task="recall",
                         code=f"1111-2222-{rnd}{slot:03d}")
        t += 1.0
    return t


def test_rotation_with_a_power_target_expects_the_rounds_that_reach_it():
    needed = hits_needed(0.1, 0.95)                  # 29 checked hits
    run = Run(settings=ROTATION, plan={"rotation": {"planned_requests": 400}})
    before = run.fold.estimate(0.0)
    # a priori: round 0 cold, then 4 checked hits a round until 29: 1 + 8 rounds of 4
    assert before.phase("rotation").expected == 4 + 4 * 8 and before.phase("rotation").planned == 400
    assert before.power.checked == 0 and before.power.needed == needed and before.power.reached is None
    run.phase("rotation", 0.0, 400)
    t = 0.0
    for rnd in range(4):
        t = _rotation_round(run, rnd, t)
    p = run.fold.estimate(t)
    rot = p.phase("rotation")
    assert rot.done == 16 and p.power.checked == 12
    assert rot.expected == 16 + 4 * 5             # 17 more hits at 4 a round: 5 rounds
    assert rot.remaining_s == pytest.approx(20.0)  # 1 s a request
    assert done_text(rot) == "16/~36"
    assert power_text(p.power) == f"power 12/{needed} hits (10%)"


def test_rotation_whose_hits_are_not_checked_runs_to_its_plan():
    run = Run(settings=ROTATION, plan={"rotation": {"planned_requests": 400}})
    run.phase("rotation", 0.0, 400)
    for i in range(12):                              # cold answers only: no hit is ever checked
        run.request_done("rotation", float(i), i + 1.0, cached=0, task="recall", code=f"1111-2222-{i:04d}")
    assert run.fold.estimate(12.0).phase("rotation").expected == 400


def test_the_judged_power_target_is_final():
    run = Run(settings=ROTATION, plan={"rotation": {"planned_requests": 400}})
    run.fold.feed(PowerJudged(t=5.0, evidence="recall", fault_rate=0.1, confidence=0.95, checked=31, failures=0,
                              needed=29, reached=True))
    p = run.fold.estimate(5.0)
    assert (p.power.checked, p.power.needed, p.power.reached) == (31, 29, True)
    assert power_text(p.power) == "power 31/29 hits (10%), reached"


async def test_a_recorded_run_folds_to_done_with_every_phase_counted(tmp_path):
    """A real run (reference server, quick scenario): folded from its log, every phase finished with the
    requests its PhaseStarted planned (rotation: at least its rounds), the power target judged."""
    handle = await start_refserver(port=0, fault="none")
    log = tmp_path / "run.jsonl"
    try:
        result = await run_hitproof("run", "--attach", handle.url, "--scenario", str(ROOT / "scenarios" / "quick.toml"),
                                    "--headless", "--record", str(log))
    finally:
        await handle.close()
    assert result.code == 0, result.out + result.err
    fold = ProgressFold()
    events = [decode(line) for line in log.read_text().splitlines()]
    planned = {e.phase: e.planned_requests for e in events if isinstance(e, PhaseStarted)}
    header = json.loads(log.read_text().splitlines()[0])
    assert set(header["scenario"]["plan"]) == set(planned)      # the header carries each phase's plan
    for event in events:
        fold.feed(event)
    p = fold.estimate()
    assert p.run.status == "done" and p.run.remaining_s == 0.0
    for row in p.phases:
        assert row.finished and row.status == "pass", row
        if row.name == "rotation":
            assert row.done >= 24                  # 4 slots x 6 rounds, then on to the power target
        else:
            assert row.done == planned[row.name], row
    assert p.power is not None and p.power.reached is True and p.power.checked >= p.power.needed
    # the headless console printed the same kind of line along the way
    assert "progress: " in result.out and "run " in result.out


async def test_the_app_shows_progress_for_the_run_the_phase_and_the_power_target(tmp_path):
    """Pilot, the app built by the CLI's factory on a live reference-server run: the strip under the
    title says the run's requests done of expected, the running phase's, an estimate of the rest and
    the power target's checked hits of needed; at the end 'done' and whether the target was reached."""
    from support.app import live_app, text_of, wait_for
    from tui.app.widgets import PhaseList, ProgressStrip

    handle = await start_refserver(port=0, fault="none", seed=0, decode_ms_per_token=3.0)
    try:
        app = live_app(handle.url, ROOT / "scenarios" / "quick.toml")
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: "rotation" in app.model.phases and app.model.phases["rotation"].done >= 6,
                           timeout=120)
            strip = text_of(app.query_one(ProgressStrip))
            assert "run " in strip and "req" in strip and "left" in strip, strip
            assert "rotation " in strip and "power " in strip and "/99 hits (3%)" in strip, strip
            phases = _plain(app.query_one(PhaseList))
            rotation = next(line for line in phases.splitlines() if "rotation" in line)
            assert re.search(r"r\d+/\d+ \d+/", rotation), phases   # its round, then requests done of expected
            await wait_for(pilot, lambda: app.model.finished, timeout=180)
            await pilot.pause(1.2)                       # the next tick
            strip = text_of(app.query_one(ProgressStrip))
            assert "done" in strip and "reached" in strip and "not reached" not in strip, strip
            assert "left" not in strip
            await pilot.press("q")
    finally:
        await handle.close()
