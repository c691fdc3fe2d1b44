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


def test_a_report_reading_the_engines_tally_counts_what_it_counts_itself():
    """A live headless run's report reads the tally the engine feeds (RunHooks.tally: the engine hears each
    event on the bus before any listener) instead of feeding one of its own: after every event of a real
    soak's log both count the same hits checked and failed, and the same power."""
    from tui.core.report.power import EvidenceTally

    events = [decode_line(line) for line in gzip.decompress(FIXTURE.read_bytes()).splitlines() if line.strip()]
    engines = EvidenceTally()
    shared, own = RunReport(tally=engines, feeds_tally=False), RunReport()
    for event in events:
        engines.feed(event)
        shared.feed(event)
        own.feed(event)
        assert (shared.tally.checked, shared.tally.failures) == (own.tally.checked, own.tally.failures)
    assert shared.tally.counts() == own.tally.counts()
    assert sum(own.tally.checked.values()) > 0
    unfed = RunReport(feeds_tally=False)        # nothing feeds it: it counts nothing (the flag is what changed)
    for event in events:
        unfed.feed(event)
    assert sum(unfed.tally.checked.values()) == 0
