"""The memo stock (tui/core/soak/memo_stock.py, issue 34): a wide phase's memos are sized from the start of
the run, in the background, so that the server does not wait while a phase sizes 128 of them. Ids and codes
are drawn when ordered; a phase takes what was ordered and draws the rest; narrow scenarios order nothing."""

from __future__ import annotations

import asyncio
import json
import types
from pathlib import Path

import pytest

from support.cli import ROOT, report_json, run_hitproof, scenario
from tui.commands.run import with_streams
from tui.core.config.scenario import load_scenario
from tui.core.evidence.memos import Memo
from tui.core.soak import memo_stock
from tui.core.soak.memo_stock import BACKGROUND, MemoStock, memos_ahead
from tui.core.soak.phases import PHASES
from tui.refserver import start_refserver

GRID = types.SimpleNamespace(cache_config={"mamba_cache_mode": "align"}, dialect="vllm")
NO_GRID = types.SimpleNamespace(cache_config={}, dialect="vllm")


class Sizer:
    """draw, size and count_prefixes for a stock, recording what happened (no server)."""

    def __init__(self, fail: str | None = None):
        self.drawn: list[str] = []
        self.sizing = self.most = 0
        self.counted: list[list[str]] = []
        self.fail = fail
        self.release = asyncio.Event()

    def draw(self, tag: str, with_code: bool):
        self.drawn.append(f"m{len(self.drawn) + 1:02d}-{tag}")
        return self.drawn[-1], "1234-5678-9012" if with_code else None

    async def size(self, memo_id: str, tokens: int, code):
        self.sizing += 1
        self.most = max(self.most, self.sizing)
        await asyncio.sleep(0)                      # a round trip: another sizing may start meanwhile
        await self.release.wait()
        self.sizing -= 1
        if self.fail and memo_id.endswith(self.fail):
            raise ValueError(f"cannot size {memo_id}")
        return Memo(memo_id=memo_id, code=code, text=memo_id, tokens=tokens, sizing="estimate", code_offset=None,
                    code_token_start=None, code_token_end=None, grid=16)

    async def count_prefixes(self, ids):
        self.counted.append(list(ids))


def stock_of(sizer: Sizer) -> MemoStock:
    return MemoStock(sizer.draw, sizer.size, sizer.count_prefixes)


async def test_ids_are_drawn_when_ordered_and_memos_sized_two_at_a_time_until_taken():
    sizer = Sizer()
    stock = stock_of(sizer)
    stock.order([(1200, f"rot{i}", True) for i in range(40)])
    assert sizer.drawn == [f"m{i + 1:02d}-rot{i}" for i in range(40)]      # in order, before any sizing
    await asyncio.sleep(0.01)
    assert sizer.sizing == sizer.most == BACKGROUND     # the event loop stays free for the running phase
    taken = [stock.take(1200, f"rot{i}", True) for i in range(40)]
    await asyncio.sleep(0.01)
    assert sizer.sizing == 40                           # what a phase takes unsized is sized at once
    sizer.release.set()
    memos = await asyncio.gather(*taken)
    assert [m.memo_id for m in memos] == sizer.drawn and all(m.code for m in memos)
    assert sizer.counted == [sizer.drawn]               # every prefix counted beside the sizing, once
    assert stock.take(1200, "rot0", True) is None       # taken once
    assert stock.take(1200, "rot99", True) is None      # never ordered: the phase draws it itself
    assert stock.take(800, "rot1", True) is None and stock.waiting == 0
    await stock.close()


async def test_the_background_sizes_everything_ordered_in_order():
    sizer = Sizer()
    sizer.release.set()
    stock = stock_of(sizer)
    stock.order([(1200, f"resume-wide{i}", False) for i in range(5)])
    stock.order([(1200, f"rot{i}", True) for i in range(5)])
    for _ in range(100):
        await asyncio.sleep(0)
    first = stock.take(1200, "resume-wide0", False)
    last = stock.take(1200, "rot4", True)
    assert first.done() and last.done() and sizer.most == BACKGROUND    # two workers, not four
    await stock.close()


async def test_ordering_the_same_memo_twice_draws_it_once():
    sizer = Sizer()
    stock = stock_of(sizer)
    stock.order([(1200, "mix0", True), (1200, "mix1", True)])
    stock.order([(1200, "mix1", True), (1200, "mix2", False)])
    assert sizer.drawn == ["m01-mix0", "m02-mix1", "m03-mix2"]
    sizer.release.set()
    assert (await stock.take(1200, "mix2", False)).code is None
    await stock.close()


async def test_a_sizing_error_is_raised_where_the_phase_awaits_it():
    sizer = Sizer(fail="rot1")
    stock = stock_of(sizer)
    stock.order([(1200, "rot0", True), (1200, "rot1", True)])
    sizer.release.set()
    assert (await stock.take(1200, "rot0", True)).memo_id == "m01-rot0"
    with pytest.raises(ValueError, match="cannot size m02-rot1"):
        await stock.take(1200, "rot1", True)
    await stock.close()


async def test_close_stops_what_no_phase_took(recwarn):
    sizer = Sizer()
    stock = stock_of(sizer)
    stock.order([(1200, f"rot{i}", True) for i in range(20)])
    await asyncio.sleep(0.01)
    await stock.close()
    assert stock.waiting == 0 and sizer.sizing == BACKGROUND    # cancelled while sizing, none finished
    assert not [w for w in recwarn if "never retrieved" in str(w.message)]


def test_what_is_ordered_ahead():
    gpu = with_streams(load_scenario(ROOT / "scenarios" / "gpu-quick.toml"), 16)
    ahead = memos_ahead(gpu, PHASES, GRID, False)
    calibration = [(1200, f"resume-wide{i}", False) for i in range(16)]
    rotation = [(1200, f"rot{i}", True) for i in range(16)]
    assert ahead == calibration + rotation                 # the calibration's first: it is asked for first
    assert memos_ahead(gpu, PHASES, NO_GRID, False) == rotation      # no grid: no calibration to size
    assert memos_ahead(gpu, PHASES, NO_GRID, True) == calibration + rotation   # llama.cpp's checkpoints seen
    narrow = load_scenario(ROOT / "scenarios" / "hybrid-quick.toml")
    assert narrow.rotation.slots < memo_stock.AHEAD_FROM
    assert memos_ahead(narrow, PHASES, GRID, False) == []   # four slots: memos sized when asked, as before
    wanted = PHASES["rotation"].memos_ahead(gpu)
    assert wanted == rotation       # what rotation.run asks rq.memos for, key for key (tokens, tag, with_code)


def memo_numbers(log: Path) -> dict[str, int]:
    memos = [json.loads(line) for line in open(log) if line[8:14] == '"memo"']
    return {m["memo"]: int(m["memo"][1:].split("-")[0]) for m in memos}


async def test_a_wide_run_plants_the_memos_sized_ahead(tmp_path):
    """gpu-quick at 16 streams on the reference server (align mode: a grid): the calibration's 16 wide memos and
    rotation's 16 were drawn before any phase ran, so their numbers come before the three solo calibration
    memos' and cold_hit's; each is still planted by the phase that uses it, and the run passes."""
    text = (ROOT / "scenarios" / "gpu-quick.toml").read_text().replace(
        'phases = ["cold_hit", "conversation", "shared_concurrency", "rotation", "long_prompt", "determinism", "control"]',
        'phases = ["cold_hit", "rotation"]')
    handle = await start_refserver(port=0)
    try:
        log = tmp_path / "run.jsonl"
        result = await run_hitproof("run", "--attach", handle.url, "--scenario", str(scenario(tmp_path, text)),
                                    "--streams", "16", "--headless", "--record", str(log))
    finally:
        await handle.close()
    assert result.code == 0, result.out + result.err
    numbers = memo_numbers(log)
    wide = [n for memo, n in numbers.items() if "-resume-wide" in memo]
    rotation = [n for memo, n in numbers.items() if "-rot" in memo and "redraw" not in memo]
    later = [n for memo, n in numbers.items() if "-resume-wide" not in memo and "-rot" not in memo]
    assert sorted(wide) == list(range(1, 17)) and sorted(rotation)[:16] == list(range(17, 33)), numbers
    assert later and min(later) > 32, numbers
    planted = {json.loads(line)["memo"]: json.loads(line)["phase"] for line in open(log) if line[8:14] == '"memo"'}
    assert {planted[m] for m in numbers if "-rot" in m} == {"rotation"}
    assert report_json(log)["verdict"] == "pass"
