"""`hitproof size --streams` (issue 34): what each rotation width buys toward a power target."""

import pytest

from tui.cli import build_parser
from tui.commands.size import _size
from tui.core.config.errors import HitproofError
from tui.core.report.power import hits_needed, width_rows
from rich.console import Console


def said(*argv: str) -> str:
    console = Console(record=True, width=200)
    args = build_parser().parse_args(["size", *argv])
    assert _size(args, console) == 0
    return console.export_text()


def test_each_width_says_checked_hits_a_round_rounds_and_seconds_at_a_measured_rate():
    text = said("--streams", "4,32,128", "--rate", "16,80,150")
    assert "must check 299 hits" in text
    assert "4 slots: 4 checked hits a round, 76 rounds (round 0 cold), 304 requests, 19.0 s" in text
    assert "32 slots: 32 checked hits a round, 11 rounds (round 0 cold), 352 requests, 4.4 s" in text
    assert "128 slots: 128 checked hits a round, 4 rounds (round 0 cold), 512 requests, 3.4 s" in text


def test_rows_agree_with_the_target():
    for row in width_rows(0.01, 0.95, [4, 64, 128], [10.0]):
        assert (row.rounds - 1) * row.checked_per_round >= hits_needed(0.01, 0.95)
        assert (row.rounds - 2) * row.checked_per_round < hits_needed(0.01, 0.95)
        assert row.seconds == pytest.approx(row.requests / 10.0)
    assert [r.checked_per_round for r in width_rows(0.01, 0.95, [4, 5], every_slot=False)] == [2, 3]
    assert width_rows(0.01, 0.95, [8])[0].seconds is None


@pytest.mark.parametrize("argv", [["--streams", "1"], ["--streams", "4,x"], ["--streams", "4,8", "--rate", "1,2,3"],
                                  ["--streams", "4", "--rate", "0"], ["--rate", "5"]])
def test_bad_widths_and_rates_are_one_line(argv):
    args = build_parser().parse_args(["size", *argv])
    with pytest.raises(HitproofError):
        _size(args, Console(record=True))
