"""What people read never shows a raw Python None, and the headless summary fits 80 columns.

One real log (a launched reference server whose restores are wrong, with --isolate: findings,
isolation verdicts, an incident record) is rendered in every report format (text, markdown, json,
junit, html), as the headless summary and on each app screen (the soak view, a request's detail, the
isolation dialog) - as recorded, with every optional field null, with every field but the ones that
say what an event is about removed, and cut in half (no run_end). None of it may say "None"."""

from __future__ import annotations

import dataclasses
import html
import io
import json
import re
import sys
from pathlib import Path

import pytest
from rich.console import Console

from support.cli import run_hitproof, scenario
from tui import cli
from tui.app.app import build_app
from tui.app.replay import ReplaySource
from tui.app.screens import IsolationProgress, RequestDetail
from tui.core.log.events import EVENT_TYPES
from tui.core.log.reader import iter_log
from tui.core.report.report import RunReport
from tui.headless import summary_renderable

FORMATS = ("text", "markdown", "json", "junit", "html")
SMALL = """
[scenario]
phases = ["cold_hit", "conversation", "rotation"]
[evidence]
memo_tokens = 300
[phases.conversation]
turns = 2
[phases.rotation]
slots = 2
rounds = 2
memo_tokens = 300
[isolation]
k = 2
"""
# what an event is about: kept when every other field is dropped
IDENTITY = {"type", "seq", "t", "request", "phase", "kind", "severity", "memo", "slot", "round"}
NONE_WORD = re.compile(r"\bNone\b")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A real run: a launched reference server restoring zeros on hits, isolation on."""
    import asyncio

    folder = tmp_path_factory.mktemp("readable")
    log = folder / "run.jsonl"
    launch = f"{sys.executable} -m tui.refserver --port {{port}} --fault zero_state"

    async def go():
        return await run_hitproof("run", "--launch", launch, "--scenario", str(scenario(folder, SMALL)),
                                  "--headless", "--isolate", "--record", str(log))

    result = asyncio.run(go())
    assert result.code == 1, result.out + result.err
    return log


def _defaults(kind: str) -> dict[str, object]:
    cls = EVENT_TYPES[kind]
    return {f.name: (f.default if f.default is not dataclasses.MISSING else f.default_factory())
            for f in dataclasses.fields(cls)}


def nulled(value):
    """Every scalar inside a record null, its shape (dicts, lists) kept."""
    if isinstance(value, dict):
        return {k: nulled(v) for k, v in value.items()}
    if isinstance(value, list):
        return [nulled(v) for v in value]
    return None


def variant(log: Path, how: str, out: Path) -> Path:
    lines = log.read_text().splitlines()
    events = [json.loads(line) for line in lines]
    if how == "nulls":          # every optional field null, and every value in the nested records
        for event in events:
            for key, default in _defaults(event["type"]).items():
                if default is None:
                    event[key] = None
                elif isinstance(event.get(key), dict) and key not in ("assignment", "values"):
                    event[key] = nulled(event[key])
    elif how == "nested-null":  # the nested records themselves null, one by one as a reader meets them
        for event in events:
            for key, value in list(event.items()):
                if isinstance(value, dict) and key not in ("assignment", "values"):
                    event[key] = {k: None for k in value}
    elif how == "dropped":
        events = [{k: v for k, v in e.items() if k in IDENTITY} for e in events]
    elif how == "truncated":
        events = events[:len(events) // 2]
    # as the recorder writes: compact, "type" first (the replay index classifies lines by that prefix)
    out.write_text("".join(json.dumps(e, separators=(",", ":"), ensure_ascii=False) + "\n" for e in events))
    return out


@pytest.fixture(scope="module", params=["recorded", "nulls", "nested-null", "dropped", "truncated"])
def log(request, recorded, tmp_path_factory):
    if request.param == "recorded":
        return recorded
    return variant(recorded, request.param, tmp_path_factory.mktemp(request.param) / "run.jsonl")


def strings(value, path=""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from strings(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from strings(v, f"{path}[{i}]")
    elif isinstance(value, str):
        yield path, value


def no_none(text: str, where: str) -> None:
    found = [line for line in text.splitlines() if NONE_WORD.search(line)]
    assert not found, f"{where} shows a raw None:\n" + "\n".join(found[:5])


@pytest.mark.parametrize("fmt", FORMATS)
def test_report_formats_never_say_none(log, fmt, capsys):
    code = cli.main(["report", str(log), "--format", fmt])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert out.out.strip() and "Traceback" not in out.err
    if fmt == "json":         # null is JSON's word; the server's own labels are quoted as it wrote them
        bad = [(path, value) for path, value in strings(json.loads(out.out))
               if NONE_WORD.search(value) and "cache_config" not in path]
        assert not bad, f"report --format json says None: {bad[:5]}"
    else:
        no_none(out.out, f"report --format {fmt}")
    no_none(out.err, f"report --format {fmt} (stderr)")


def render_summary(log: Path, width: int = 80) -> str:
    report = RunReport.from_events(iter_log(log))
    out = io.StringIO()
    Console(file=out, width=width, color_system=None, force_terminal=False).print(summary_renderable(report))
    return out.getvalue()


def test_headless_summary_never_says_none(log):
    no_none(render_summary(log), "the headless summary")


def test_headless_summary_fits_80_columns(recorded):
    text = render_summary(recorded)
    phases = len(RunReport.from_events(iter_log(recorded)).phases)
    table = "\n".join(text.splitlines()[:5 + phases])      # title, 3 header lines, the rule, a row a phase
    assert "…" not in table, table                       # no header or cell cut short
    assert max(len(line) for line in text.splitlines()) <= 80
    header = " ".join(table.splitlines()[1:4])
    for word in ("phase", "status", "req", "hits", "cached", "tokens", "TTFT", "cold", "hit", "f/w/i"):
        assert word in header.split(), header


def test_the_table_fits_80_columns_with_wide_values(recorded):
    """The widest things a row can hold: the longest phase name, "inconclusive", 7-digit cached tokens."""
    report = RunReport.from_events(iter_log(recorded))
    report.phases["cold_hit"].update(status="inconclusive", requests=999, hits=999, cached_tokens=9_999_999,
                                     ttft_cold_ms=9_999.0, ttft_hit_ms=99_999.0,
                                     findings={"fail": 12, "warn": 3, "info": 40})
    report.phases = {"shared_concurrency": report.phases["cold_hit"], **report.phases}
    out = io.StringIO()
    Console(file=out, width=80, color_system=None, force_terminal=False).print(summary_renderable(report))
    rows = [line for line in out.getvalue().splitlines() if line.startswith("shared_concurrency")]
    assert rows and "…" not in rows[0] and "inconclusive" in rows[0] and "9999999" in rows[0], rows


def screen_text(app) -> str:
    svg = app.export_screenshot()
    words = re.findall(r"<text[^>]*>(.*?)</text>", svg, flags=re.S)
    return html.unescape("".join(words)).replace("\xa0", " ")


async def test_app_screens_never_say_none(log):
    app = build_app(ReplaySource(log))
    async with app.run_test(size=(100, 32)) as pilot:
        for _ in range(300):
            if app.source.ready:
                break
            await pilot.pause(0.1)
        assert app.source.ready
        await pilot.pause(0.3)
        assert app.source.position == len(app.source.index) > 0          # the replay opened on the whole log
        no_none(screen_text(app), "the soak screen")
        requests = sorted(app.model.requests)
        flagged = sorted({f.request for f in app.model.findings if f.request in app.model.requests})
        for request in (flagged[:2] or requests[:1]):
            app.push_screen(RequestDetail(app.model, request))
            await pilot.pause(0.3)
            no_none(screen_text(app), f"request {request}'s detail")
            app.pop_screen()
            await pilot.pause(0.1)
        if flagged:
            app.push_screen(IsolationProgress(app.model, flagged[0]))
            await pilot.pause(0.3)
            no_none(screen_text(app), "the isolation dialog")
            app.pop_screen()
        await pilot.press("q")


def test_rounds_are_numbered_from_0_everywhere():
    """The phase list, a slot panel, a finding's place and the log say the same round number."""
    from tui.app.model import RunModel
    from tui.app.render import phase_table, slot_panel
    from tui.core.log import events as ev
    from tui.core.report.facts import where
    from tui.headless import format_finding

    model = RunModel()
    for event in (ev.PhaseStarted(phase="rotation", title="rotation", slots=1, rounds=6, planned_requests=6),
                  ev.RoundStarted(phase="rotation", round=2, rounds=6),
                  ev.RequestStarted(request=7, phase="rotation", slot=0, round=2, memo="m1", task="recall")):
        model.apply(event)
    out = io.StringIO()
    Console(file=out, width=60, color_system=None).print(phase_table(model))
    assert "r2/5" in out.getvalue()
    assert " r2 " in slot_panel(0, model.requests[7], model, 16, compact=False).plain
    finding = ev.Finding(kind="recall_miss", severity="fail", phase="rotation", slot=0, round=2, request=7)
    assert "round 2" in where(finding) and "round 2" in format_finding(finding)


def test_startup_progress_without_a_terminal_prints_a_line_when_it_changes():
    from tui.headless import StartupLines

    out = io.StringIO()
    lines = StartupLines(Console(file=out, force_terminal=False, width=200), "vllm")
    for elapsed, last in ((2, "loading weights"), (4, "loading weights"), (6, "loading weights"),
                          (8, "compiling"), (10, "compiling")):
        lines(f"waiting for http://127.0.0.1:8000 ({elapsed}s): {last}")
    lines("server ready at http://127.0.0.1:8000 after 11s")
    assert out.getvalue().splitlines() == [
        "[vllm] waiting for http://127.0.0.1:8000 (2s): loading weights",
        "[vllm] waiting for http://127.0.0.1:8000 (8s): compiling",
        "[vllm] server ready at http://127.0.0.1:8000 after 11s"]
    tty = io.StringIO()
    lines = StartupLines(Console(file=tty, force_terminal=True, width=200, color_system=None), "vllm")
    for elapsed in (2, 4):
        lines(f"waiting for http://127.0.0.1:8000 ({elapsed}s): loading weights")
    assert len(tty.getvalue().splitlines()) == 2           # on a terminal the count goes on


async def test_a_launched_server_that_says_nothing_new_gives_one_waiting_line(tmp_path):
    """Through the real CLI, stderr not a terminal: a server silent for 5 s before it serves."""
    launch = (f"sh -c 'echo loading; sleep 5; exec {sys.executable} -m tui.refserver --port {{port}}'")
    small = scenario(tmp_path, '[scenario]\nphases = ["cold_hit"]\n[evidence]\nmemo_tokens = 300\n')
    result = await run_hitproof("run", "--launch", launch, "--scenario", str(small), "--headless", "--no-record")
    assert result.code == 0, result.err
    waiting = [line for line in result.err.splitlines() if "waiting for" in line]
    assert waiting and len({re.sub(r"\(\d+s\)", "", line) for line in waiting}) == len(waiting), result.err
