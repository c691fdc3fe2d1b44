"""Requester.writer_of: the earlier request whose prompt shares the longest beginning with a hit's, found once
per request (a lineage asks again for every writer on its chain: rescanning every record at each step made
the judge half of hitproof's CPU on a GPU)."""

from __future__ import annotations

import collections
from types import SimpleNamespace

from tui.core.server.client import RequestSpec
from tui.core.server.wire import Completion
from tui.core.soak.record import Record
from tui.core.soak.requester import Requester


def record(request: int, prompt: str, salt: str | None = None) -> Record:
    return Record(request=request, phase="rotation", task="summary",
                  spec=RequestSpec(api="completions", max_tokens=12, prompt=prompt, salt=salt),
                  memo=None, slot=None, round=None, turn=None, completion=Completion(), checks={})


class CountingRecords(collections.OrderedDict):
    scans = 0

    def values(self):
        CountingRecords.scans += 1
        return super().values()


def requester(records: list[Record]) -> SimpleNamespace:
    recent = CountingRecords((r.request, r) for r in records)
    return SimpleNamespace(_recent=recent, _flagged={}, _writers=collections.OrderedDict())


def test_the_longest_shared_beginning_under_the_same_salt_and_the_latest_of_equals():
    memo = "memo text " * 200
    records = [record(1, memo + "Q1"), record(2, memo + "Q2"), record(3, memo + "Q1", salt="s"),
               record(4, "other " * 300), record(5, memo + "Q1")]
    rq = requester(records)
    assert Requester.writer_of(rq, records[4]).request == 1             # all of Q1's prompt; salt s apart
    assert Requester.writer_of(rq, record(6, memo + "Q3")).request == 5  # 1, 2 and 5 share as much: the latest
    assert Requester.writer_of(rq, record(7, "nothing alike")) is None
    assert Requester.writer_of(rq, records[0]) is None                  # nothing earlier


def test_asked_again_the_answer_is_kept_not_scanned_again():
    memo = "memo text " * 200
    records = [record(n, memo + "Q1") for n in range(1, 40)]
    rq = requester(records)
    first = Requester.writer_of(rq, records[-1])
    scans = CountingRecords.scans
    for _ in range(5):
        assert Requester.writer_of(rq, records[-1]) is first
    assert CountingRecords.scans == scans
    # the same request number with another prompt (a twin's copy of the record) is its own question
    other = record(39, "other " * 300)
    assert Requester.writer_of(rq, other) is None
    assert CountingRecords.scans == scans + 1
