"""The headless console's progress read from the run report's tally (one tally fewer per event, issue 34) says
what it says with its own: the same hits checked, power progress and phase rows after every event of a real soak's log."""

import gzip
import io
from pathlib import Path

from rich.console import Console

from tui.core.log.reader import decode_line
from tui.core.report.report import RunReport
from tui.headless import HeadlessConsole

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-quick-report.jsonl.gz"


def test_the_shared_tally_gives_the_progress_the_own_one_gives():
    events = [decode_line(line) for line in gzip.decompress(FIXTURE.read_bytes()).splitlines() if line.strip()]
    report = RunReport()
    shared = HeadlessConsole(Console(file=io.StringIO()), tally=report.tally)
    own = HeadlessConsole(Console(file=io.StringIO()))
    checked = []
    for event in events:
        report.feed(event)
        shared(event)
        own(event)
        assert shared.fold.power() == own.fold.power()
        assert (shared.fold.tally.checked, shared.fold.tally.failures) == (own.fold.tally.checked, own.fold.tally.failures)
        checked.append(sum(shared.fold.tally.checked.values()))
    assert shared.fold.estimate() == own.fold.estimate()
    assert max(checked) > 0                       # the log has checked hits: the comparison compared something
