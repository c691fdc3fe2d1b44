"""The Textual app, built by the CLI's factory, driven with Pilot against the reference server."""


import pytest

from support.app import SCREENSHOTS, live_app, styles_at, text_of, wait_for
from support.cli import ROOT
from tui.app.render import HIGHLIGHT_STYLE
from tui.app.screens import IsolationProgress, RequestDetail
from tui.app.widgets import FindingsTable, SlotGrid, SlotPanel
from tui.refserver import start_refserver

QUICK = ROOT / "scenarios" / "quick.toml"


@pytest.fixture
async def server(request):
    handle = await start_refserver(port=0, fault=getattr(request, "param", "none"), seed=0,
                                   decode_ms_per_token=3.0)
    yield handle
    await handle.close()


@pytest.mark.parametrize("server", ["none"], indirect=True)
async def test_clean_run_shows_rotating_slots_and_ends_open(server, tmp_path):
    log = tmp_path / "run.jsonl"
    app = live_app(server.url, QUICK, record=log)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: "rotation" in app.model.phases and app.model.phases["rotation"].done >= 6)
        panels = list(app.query(SlotPanel))
        assert len(panels) == 4
        texts = [text_of(p) for p in panels]
        # each slot shows its memo of this round and that memo's code; the rotation moves them
        memos = {m.memo: m.code for m in app.model.memos.values()}
        for panel, text in zip(panels, texts):
            view = app.model.requests[panel.request]
            assert view.memo in text and memos[view.memo] in text and f"slot {panel.slot}" in text
        await wait_for(pilot, lambda: app.model.finished, timeout=120)
        assert app.model.report.verdict == "pass"
        title = text_of(app.query_one("#title"))
        assert "PASS exit 0" in title
        assert not app.query_one("#replicas").display      # one server: no replica strip
        # the final state stays on screen until the user quits
        await pilot.pause(0.5)
        assert app.is_running and app.query(SlotPanel)
        await pilot.press("q")
    assert app.return_code == 0
    assert app.frames < app.model.events_seen     # coalesced: fewer frames than events


@pytest.mark.parametrize("server", ["foreign_state"], indirect=True)
async def test_foreign_code_is_highlighted_at_its_offset(server, tmp_path):
    app = live_app(server.url, QUICK)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: any(f.kind == "foreign_code" and f.severity == "fail"
                                          for f in app.model.findings))
        finding = next(f for f in app.model.findings if f.kind == "foreign_code" and f.severity == "fail")
        view = app.model.requests[finding.request]
        marks = [h for h in view.highlights(app.model.registry) if h.style == "foreign"]
        assert marks and marks[0].start == finding.offset
        assert view.text[finding.offset:].startswith(finding.evidence["code"])
        table = app.query_one(FindingsTable)
        table.focus()
        table.move_cursor(row=app.model.findings.index(finding))
        await pilot.press("enter")
        await pilot.pause(0.3)
        detail = app.screen
        assert isinstance(detail, RequestDetail) and detail.request == finding.request
        answer = detail.query_one("#detail-answer")
        assert HIGHLIGHT_STYLE["foreign"] in styles_at(answer, finding.offset)
        app.save_screenshot(str(SCREENSHOTS / "foreign-code-detail.svg"))
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.model.finished, timeout=120)
        app.save_screenshot(str(SCREENSHOTS / "foreign-code-run.svg"))
        await pilot.press("q")
    assert app.return_code == 1


ZERO_SMALL = """
[scenario]
phases = ["cold_hit", "long_prompt", "determinism"]
[evidence]
memo_tokens = 400
[phases.long_prompt]
memo_tokens = 800
[phases.determinism]
max_tokens = 40
short_memo_tokens = 200
short_runs = 2
[isolation]
k = 3
"""


@pytest.mark.parametrize("server", ["zero_state"], indirect=True)
async def test_divergence_detail_and_isolation_verdict(server):
    app = live_app(server.url, None, text=ZERO_SMALL)
    async with app.run_test(size=(100, 32)) as pilot:
        await wait_for(pilot, lambda: app.model.finished, timeout=120)
        divergence = next(f for f in app.model.findings if f.kind == "cache_path_divergence")
        app.open_detail(divergence.request)
        await pilot.pause(0.3)
        shown = text_of(app.screen.query_one("#detail-divergence"))
        assert f"first difference at character {divergence.offset}" in shown
        app.save_screenshot(str(SCREENSHOTS / "divergence-detail.svg"))
        await pilot.press("escape")
        miss = next(f for f in app.model.findings if f.kind == "recall_miss" and f.severity == "fail")
        table = app.query_one(FindingsTable)
        table.focus()
        table.move_cursor(row=app.model.findings.index(miss))
        await pilot.press("i")
        await pilot.pause(0.2)
        assert isinstance(app.screen, IsolationProgress)
        await wait_for(pilot, lambda: app.model.isolations.get(miss.request) is not None
                       and app.model.isolations[miss.request].result is not None, timeout=60)
        result = app.model.isolations[miss.request].result
        assert (result.verdict, result.reproduced, result.hit_runs, result.cold_reproduced) == \
            ("hit_path_corruption", 3, 3, 0)
        await pilot.pause(0.4)
        body = text_of(app.screen.query_one("#isolation-body"))
        assert "HIT_PATH_CORRUPTION" in body and "3/3 hits" in body and "0/3" in body
        app.save_screenshot(str(SCREENSHOTS / "isolation-verdict.svg"))
        await pilot.press("escape")
        await pilot.press("q")
    assert app.return_code == 1


MANY = """
[scenario]
phases = ["rotation"]
[phases.rotation]
slots = 64
rounds = 2
memo_tokens = 120
[evidence]
recall_max_tokens = 12
summary_max_tokens = 12
"""


@pytest.mark.parametrize("server", ["none"], indirect=True)
async def test_64_slots_use_the_compact_view(server):
    app = live_app(server.url, None, text=MANY)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: len(app.model.slots) == 64)
        grid = app.query_one(SlotGrid)
        assert grid.compact and len(app.query(SlotPanel)) == 64
        await wait_for(pilot, lambda: app.model.finished, timeout=120)
        assert app.model.report.verdict == "pass"
        app.save_screenshot(str(SCREENSHOTS / "compact-64-slots.svg"))
        await pilot.press("q")
    assert app.return_code == 0


@pytest.mark.parametrize("server", ["none"], indirect=True)
async def test_quit_mid_run_interrupts_and_keeps_the_log(server, tmp_path):
    import json
    log = tmp_path / "run.jsonl"
    app = live_app(server.url, QUICK, record=log)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.model.report.cache_hits() >= 2)
        await pilot.press("q")
    assert app.return_code == 130
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert events[-1]["type"] == "run_end" and events[-1]["verdict"] == "interrupted"


@pytest.mark.parametrize("server", ["none"], indirect=True)
async def test_keys_pause_log_compact_screenshot(server, tmp_path):
    app = live_app(server.url, QUICK)
    app.screenshot_dir = tmp_path
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.model.report.cache_hits() >= 1)
        await pilot.press("p")
        assert app.paused and "PAUSED" in text_of(app.query_one("#title"))
        await pilot.pause(0.5)
        sent = len(app.model.report.starts)
        await pilot.pause(0.5)
        in_flight = len(app.model.report.starts)
        assert in_flight - sent <= 4       # nothing new starts while paused (at most in-flight controls)
        await pilot.press("p")
        await pilot.press("l")
        assert not app.query_one("#server-log").has_class("hidden")
        await pilot.press("c")
        await pilot.pause(0.2)
        assert app.query_one(SlotGrid).compact
        await pilot.press("s")
        await pilot.pause(0.2)
        assert list(tmp_path.glob("*.svg"))
        await pilot.press("q")


async def test_the_replica_strip_names_each_replica_and_the_one_that_fails(tmp_path):
    from tui.refserver.replicas import start_replicas

    async with await start_replicas(2, faults={1: "foreign_state"}, decode_ms_per_token=0) as cluster:
        app = live_app(cluster.url, QUICK, record=tmp_path / "run.jsonl", replicas=cluster.replica_urls)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: app.model.finished, timeout=120)
            strip = app.query_one("#replicas")
            text = text_of(strip)
            assert strip.display and "r0 " in text and "r1 " in text and "fail" in text.split("r1 ", 1)[1]
            assert "fail" not in text.split("r1 ", 1)[0]
            await pilot.press("q")


@pytest.mark.parametrize("server", ["none"], indirect=True)
async def test_detail_of_a_request_without_round_or_slot_shows_no_none(server):
    """A control request has no round (and no slot in some phases): its detail leaves the field out."""
    app = live_app(server.url, QUICK)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.model.finished, timeout=180)
        request = next(r for r, v in app.model.requests.items() if v.phase == "control" and v.round is None)
        app.push_screen(RequestDetail(app.model, request))
        await pilot.pause(0.3)
        head = text_of(app.screen.query_one("#detail-head"))
        assert f"request {request}" in head and "phase control" in head
        assert "None" not in head and "round" not in head.splitlines()[0]
        # the reference server answers under the X-Request-Id hitproof sent, as vLLM does
        assert "the server's id cmpl-hitproof-" in head and head.split("cmpl-hitproof-", 1)[1].split()[0].endswith(
            f"-{request}")
        await pilot.press("escape")
        await pilot.press("q")
