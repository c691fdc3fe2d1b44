"""`hitproof matrix` in the app (no --headless): built by the CLI's factory (matrix_app ->
build_app(MatrixSource)), driven with Pilot over the reference-server profiles the manual names (docs/launch.md).
Rows fill as profiles finish, the running profile is live below them, `enter` on a finished row
replays its log, `escape` goes back, `q` mid-matrix interrupts and keeps the rows done so far."""

import json

from support.app import SCREENSHOTS, text_of, wait_for
from support.cli import ROOT
from tui.app.matrix_table import MatrixTable
from tui.app.matrix_view import matrix_app
from tui.app.replay import ReplaySource
from tui.app.sources import MatrixSource
from tui.app.widgets import ProgressStrip, SlotPanel
from tui.core.config.scenario import load_scenario
from tui.core.server.profiles import load_profile

PROFILES = ROOT / "scenarios" / "profiles"
QUICK = ROOT / "scenarios" / "quick.toml"


def _app(out, *names):
    profiles = [load_profile(PROFILES / f"{name}.toml") for name in names]
    return matrix_app(load_scenario(QUICK), profiles, out, argv=["hitproof", "matrix"], screenshot_dir=SCREENSHOTS)


def _plain(app, widget) -> str:
    """What a widget shows, as text (rendered at its width)."""
    from rich.console import Console

    console = Console(width=widget.content_size.width or 80, record=True, color_system=None)
    console.print(widget.content)
    return console.export_text()


async def test_rows_fill_the_running_soak_is_live_and_enter_replays_a_row(tmp_path):
    out = tmp_path / "m"
    app, source = _app(out, "refserver-none", "refserver-zero-state")
    assert isinstance(source, MatrixSource) and app.matrix
    async with app.run_test(size=(100, 32)) as pilot:
        # the second profile running: the first row filled, the running soak's slots below
        await wait_for(pilot, lambda: source.running == 1 and app.live_stream is not None
                       and "rotation" in app.live_stream.model.phases and len(app.query(SlotPanel)) >= 1, timeout=180)
        table = _plain(app, app.query_one(MatrixTable))
        assert "PASS" in table and "RUNNING" in table and "reference server, no fault" in table
        assert source.rows[0]["verdict"] == "pass" and source.rows[1]["verdict"] == "not_run"
        assert app.model is app.live_stream.model
        assert "refserver-zero-state" in text_of(app.query_one("#title"))
        progress = text_of(app.query_one(ProgressStrip))
        assert "run " in progress and "req" in progress
        app.save_screenshot(str(SCREENSHOTS / "matrix-running.svg"))

        await wait_for(pilot, lambda: source.finished and app.matrix_seconds is not None, timeout=180)
        await pilot.pause(0.3)
        table = _plain(app, app.query_one(MatrixTable))
        assert [r["verdict"] for r in source.rows] == ["pass", "fail"]
        kinds = source.rows[1]["findings"]["fail_kinds"]
        assert "FAIL" in table and kinds and kinds[0][:10] in table       # the first fail kind (ellipsized)
        assert "MATRIX done" in text_of(app.query_one("#title"))
        app.save_screenshot(str(SCREENSHOTS / "matrix-done.svg"))
        # the files are the field report's ablation table, the same rows
        rows = json.loads((out / "matrix.json").read_text())
        assert [r["verdict"] for r in rows] == ["pass", "fail"]
        assert "| refserver-zero-state | reference server, hits restore zeros | **FAIL** |" in \
            (out / "matrix.md").read_text()

        # enter on the first (finished) row: its run as a replay, below the rows
        await pilot.press("m")
        assert app.query_one(MatrixTable).has_focus
        await pilot.press("up")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.viewing == 0 and app.model.finished, timeout=60)
        assert isinstance(app.source, ReplaySource)
        title = text_of(app.query_one("#title"))
        assert "REPLAY" in title and "refserver-none" in title
        assert app.model.report.verdict == "pass" and app.model is not app.live_stream.model
        assert "▶" in _plain(app, app.query_one(MatrixTable))
        app.save_screenshot(str(SCREENSHOTS / "matrix-replay.svg"))

        # the failing row replays too, then escape goes back to the last live run
        await pilot.press("down")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.viewing == 1 and app.model.finished, timeout=60)
        assert app.model.report.verdict == "fail" and "refserver-zero-state" in text_of(app.query_one("#title"))
        await pilot.press("escape")
        await pilot.pause(0.2)
        assert app.viewing is None and app.model is app.live_stream.model and app.source is source
        await pilot.press("q")
    assert app.return_code == 0


async def test_enter_on_a_row_not_run_yet_says_so_and_quit_interrupts(tmp_path):
    out = tmp_path / "m"
    app, source = _app(out, "refserver-zero-state", "refserver-none")
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: source.running == 0 and app.live_stream is not None
                       and app.live_stream.model.report.cache_hits() >= 2, timeout=120)
        await pilot.press("m")
        await pilot.press("down")
        await pilot.press("enter")                    # the second row has not run: a notice, no replay
        await pilot.pause(0.3)
        assert app.viewing is None and app.source is source
        assert any("not run yet" in str(n.message) for n in app._notifications)
        await pilot.press("up")
        await pilot.press("enter")                    # the running row: it is already on screen, live
        await pilot.pause(0.2)
        assert app.viewing is None and app.model is app.live_stream.model
        await pilot.press("q")
    assert app.return_code == 130
    rows = json.loads((out / "matrix.json").read_text())
    assert rows[0]["verdict"] == "interrupted" and rows[1]["verdict"] == "not_run"
    assert "not run" in rows[1]["message"]


async def test_a_profile_that_never_serves_is_an_error_row_and_the_matrix_goes_on(tmp_path):
    from tui.core.server.profiles import parse_profile

    broken = parse_profile('name = "broken"\ndescription = "server exits at once"\n'
                           'command = "{python} -c \\"import sys; sys.exit(3)\\" {port}"\nstartup_timeout = 30\n',
                           str(tmp_path / "broken.toml"), base=tmp_path)
    out = tmp_path / "m"
    app, source = matrix_app(load_scenario(QUICK), [broken, load_profile(PROFILES / "refserver-none.toml")], out,
                             argv=["hitproof", "matrix"], screenshot_dir=tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: source.finished, timeout=180)
        await pilot.pause(0.3)
        assert [r["verdict"] for r in source.rows] == ["error", "pass"]
        table = _plain(app, app.query_one(MatrixTable))
        assert "ERROR" in table and "PASS" in table and "None" not in table
        await pilot.press("m")
        await pilot.press("enter")                    # the error row has no log to replay: a notice
        await pilot.pause(0.3)
        assert app.viewing is None
        assert any("broken" in str(n.message) for n in app._notifications)
        await pilot.press("q")
    assert app.return_code == 0
