"""The live text's pace: the app gets a streaming answer's text as deltas every 0.1 s; a headless run, which
nobody watches, records them at most once a second (tui.headless.LIVE_TEXT_UNWATCHED), so answers that
stream for less than a second leave no delta and request_end holds their whole text. Against the in-process
reference server at 12 ms a token: each answer streams for about 0.4 s."""

import json

from support.cli import run_hitproof, scenario
from tui.core.config.scenario import parse_scenario
from tui.core.soak.engine import Target
from tui.refserver import start_refserver
from tui.runner import RunHooks, run

SLOW_ANSWERS = """
[scenario]
name = "pace"
phases = ["cold_hit"]
[evidence]
memo_tokens = 300
recall_max_tokens = 16
fingerprints = false
[phases.cold_hit]
suffix_tokens = 40
"""


def types_and_texts(log) -> tuple[int, list[str]]:
    events = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    deltas = sum(1 for e in events if e["type"] == "delta")
    return deltas, [e["text"] for e in events if e["type"] == "request_end"]


async def test_the_app_gets_deltas_and_a_headless_run_records_none_for_answers_under_a_second(tmp_path):
    handle = await start_refserver(port=0, fault="none", decode_ms_per_token=12)
    try:
        app_log, headless_log = tmp_path / "app.jsonl", tmp_path / "headless.jsonl"
        outcome = await run(parse_scenario(SLOW_ANSWERS), Target(url=handle.url), RunHooks(), record=app_log)
        assert outcome.exit_code == 0, outcome.message
        result = await run_hitproof("run", "--attach", handle.url, "--scenario",
                                    str(scenario(tmp_path, SLOW_ANSWERS)), "--headless", "--record",
                                    str(headless_log))
        assert result.code == 0, result.out + result.err
    finally:
        await handle.close()
    app_deltas, app_texts = types_and_texts(app_log)
    headless_deltas, headless_texts = types_and_texts(headless_log)
    assert app_deltas >= len(app_texts) >= 3                   # the app's pace: a delta or more per answer
    assert headless_deltas == 0 and len(headless_texts) == len(app_texts)
    assert all(text.strip() for text in headless_texts)        # the whole text, in request_end
