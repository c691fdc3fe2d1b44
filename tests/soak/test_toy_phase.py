"""A phase is one module (issue 25): a toy phase, written to a file of its own and put in the registry
(the one line a new phase adds), is parsed from its scenario section with its own keys, minimums and
checks, runs against the reference server, and shows in the headless summary and in every report format
(its lines, its section, its turn table, its typed result's key in the JSON), through nothing but what
its module declares."""

import asyncio
import importlib.util
import json
import sys

import pytest

from tui.cli import main
from tui.core.config.scenario import parse_scenario
from tui.core.config.errors import BadInput
from tui.core.soak import phases
from tui.refserver import start_refserver

TOY = '''
from dataclasses import dataclass

from tui.core.report.phase_facts import Section, TurnTable
from tui.core.soak.results import UNSET, PhaseResult

TITLE = "toy"


@dataclass(frozen=True)
class Settings:
    memo_tokens: int = 200
    repeats: int = 2


MINIMUMS = {"memo_tokens": 64, "repeats": 1}


def check(s):
    return ("phases.toy", "repeats", "at most 5 repeats") if s.repeats > 5 else None


@dataclass
class Result(PhaseResult):
    toy_repeats_hit: int = UNSET


def plan(scenario):
    return {"slots": 1, "rounds": 1, "planned_requests": 1 + scenario.toy.repeats}


async def run(rq, state):
    toy = rq.scenario.toy
    memo = await rq.memo(state, tokens=toy.memo_tokens, tag="toy")
    spec = rq.question(memo.text, "recall")
    await rq.send(state, spec, task="recall", memo=memo, expect="cold")
    hits = 0
    for _ in range(toy.repeats):
        hits += bool((await rq.send(state, spec, task="recall", memo=memo, expect="hit")).hit)
    state.result = Result(toy_repeats_hit=hits)


def console_lines(summary):
    return [f"toy: {Result.read(summary).toy_repeats_hit} repeats hit (console)"]


def timing_lines(summary):
    return [f"toy: {Result.read(summary).toy_repeats_hit} repeats hit (timing)"]


def section(summary):
    return Section("Toy section", "toy", ("repeats hit",), [[str(Result.read(summary).toy_repeats_hit)]],
                   paragraphs=["the toy phase's own paragraph"])


def turn_table(summary, settings):
    repeats = settings["repeats"]
    return TurnTable("Toy turns", "toy-turns", ["repeat", "of"], [[str(n), str(repeats)] for n in range(repeats)],
                     list(range(repeats)), [set() for _ in range(repeats)], sentence="toy turns, one a repeat")
'''

SCENARIO = """
[scenario]
phases = ["cold_hit", "toy"]

[evidence]
memo_tokens = 200

[phases.toy]
repeats = 3
"""


@pytest.fixture
def toy(tmp_path, monkeypatch):
    path = tmp_path / "toy_phase.py"
    path.write_text(TOY)
    spec = importlib.util.spec_from_file_location("toy_phase", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "toy_phase", module)
    spec.loader.exec_module(module)
    monkeypatch.setitem(phases.PHASES, "toy", module)      # the registry line
    return module


def test_the_toy_section_is_parsed_with_its_own_keys_and_checks(toy):
    s = parse_scenario(SCENARIO, "toy.toml")
    assert s.phases == ("cold_hit", "toy") and s.toy == toy.Settings(memo_tokens=200, repeats=3)
    assert s.to_dict()["toy"] == {"memo_tokens": 200, "repeats": 3}
    assert "toy" in parse_scenario("").phases                  # a default phase unless it says OPTIONAL
    for table, message in (("rounds = 1", "toy.toml:3: phases.toy.rounds: unknown key (known: memo_tokens, repeats)"),
                           ("repeats = 0", "toy.toml:3: phases.toy.repeats: must be at least 1, got 0"),
                           ("repeats = 9", "toy.toml:3: phases.toy.repeats: at most 5 repeats")):
        with pytest.raises(BadInput) as caught:
            parse_scenario(f"[scenario]\n[phases.toy]\n{table}\n", "toy.toml")
        assert str(caught.value) == message


async def test_the_toy_phase_runs_and_every_report_shows_it(toy, tmp_path, capsys):
    (tmp_path / "toy.toml").write_text(SCENARIO)
    log = tmp_path / "toy.jsonl"
    server = await start_refserver(port=0, fault="none")
    try:
        code = await asyncio.to_thread(main, ["run", "--attach", server.url, "--scenario", str(tmp_path / "toy.toml"),
                                              "--headless", "--record", str(log)])
    finally:
        await server.close()
    out = capsys.readouterr().out
    assert code == 0, out
    assert "toy: 3 repeats hit (console)" in out                 # the headless summary, from its module

    def report(fmt: str) -> str:
        assert main(["report", str(log), "--format", fmt]) == 0
        return capsys.readouterr().out

    summary = json.loads(report("json"))["phases"]["toy"]
    assert summary["status"] == "pass" and summary["requests"] == 4 and summary["toy_repeats_hit"] == 3
    markdown = report("markdown")
    assert "### Toy section" in markdown and "the toy phase's own paragraph" in markdown
    assert "### Toy turns" in markdown and "toy turns, one a repeat." in markdown
    assert "- toy: 3 repeats hit (timing)" in markdown and "| toy |" in markdown
    html = report("html")
    assert '<h3 id="toy">Toy section</h3>' in html and "<td>toy</td>" in html
    assert '<h3 id="toy-turns">Toy turns</h3>' in html and '<tr data-turn="2">' in html
    assert 'name="toy' in report("junit")
    text = report("text")
    assert "toy: 3 repeats hit (console)" in text and "toy turns, one a repeat" in text
