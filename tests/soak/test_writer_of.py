"""writers.Writers.writer_of: the earlier request whose prompt shares the longest beginning with a hit's, found
once per request (a lineage asks again for every writer on its chain: rescanning every record at each step made
the judge half of hitproof's CPU on a GPU), and looked for first among the records whose prompts begin as the
hit's does (scanning all 512 kept for each new hit was still 23% of it)."""

from __future__ import annotations

import random

from tui.core.server.client import RequestSpec
from tui.core.server.wire import Completion
from tui.core.soak import writers as writers_module
from tui.core.soak.record import Record, shared_chars
from tui.core.soak.writers import BUCKET_CHARS, Writers


def record(request: int, prompt: str, salt: str | None = None) -> Record:
    return Record(request=request, phase="rotation", task="summary",
                  spec=RequestSpec(api="completions", max_tokens=12, prompt=prompt, salt=salt),
                  memo=None, slot=None, round=None, turn=None, completion=Completion(), checks={})


def kept(records: list[Record]) -> Writers:
    writers = Writers()
    for r in records:
        writers.add(r)
    return writers


def test_the_longest_shared_beginning_under_the_same_salt_and_the_latest_of_equals():
    memo = "memo text " * 200
    records = [record(1, memo + "Q1"), record(2, memo + "Q2"), record(3, memo + "Q1", salt="s"),
               record(4, "other " * 300), record(5, memo + "Q1")]
    writers = kept(records)
    assert writers.writer_of(records[4]).request == 1             # all of Q1's prompt; salt s apart
    assert writers.writer_of(record(6, memo + "Q3")).request == 5  # 1, 2 and 5 share as much: the latest
    assert writers.writer_of(record(7, "nothing alike")) is None
    assert writers.writer_of(records[0]) is None                  # nothing earlier
    assert writers.writer_of(record(8, "memo text short")).request == 5     # outside every bucket: all scanned


def scanning(monkeypatch) -> list:
    compared: list = []

    def counted(a, b):
        compared.append((a, b))
        return shared_chars(a, b)

    monkeypatch.setattr(writers_module, "shared_chars", counted)
    return compared


def test_asked_again_the_answer_is_kept_not_scanned_again(monkeypatch):
    memo = "memo text " * 200
    records = [record(n, memo + "Q1") for n in range(1, 40)]
    writers = kept(records)
    compared = scanning(monkeypatch)
    first = writers.writer_of(records[-1])
    scans = len(compared)
    for _ in range(5):
        assert writers.writer_of(records[-1]) is first
    assert len(compared) == scans
    # the same request number with another prompt (a twin's copy of the record) is its own question
    other = record(39, "other " * 300)
    assert writers.writer_of(other) is None
    assert len(compared) > scans


def test_a_hit_compares_only_its_own_memos_prompts_and_answers_as_a_scan_of_all_would(monkeypatch):
    rng = random.Random(5)
    memos = [f"Memo m{i:02d}, run abc. " + " ".join(rng.choice(["alpha", "beta", "gamma"]) for _ in range(200))
             for i in range(20)]
    records = []
    for n in range(1, 400):
        memo = rng.choice(memos)
        cut = rng.choice([len(memo), len(memo) // 2, 40])       # some prompts shorter than a bucket's name
        records.append(record(n, memo[:cut] + rng.choice(["Q1", "Q2", "Q3"]),
                              salt=rng.choice([None, None, "s", f"fresh{n}"])))
    writers = kept(records)

    def scanned_all(hit):
        best, best_len = None, 0
        for other in records:
            if other.request >= hit.request or other.spec.salt != hit.spec.salt:
                continue
            shared = shared_chars(other.spec.prompt, hit.spec.prompt)
            if shared > best_len or shared == best_len and best is not None and other.request > best.request:
                best, best_len = other, shared
        return best

    compared = scanning(monkeypatch)
    for hit in records[-50:]:
        assert writers.writer_of(hit) is scanned_all(hit), hit.request
    long_hits = [h for h in records[-50:] if len(h.spec.prompt) >= BUCKET_CHARS]
    assert long_hits and len(compared) < 50 * len(records) / 4          # buckets, not every record per hit


def test_dropped_records_are_no_longer_writers():
    memo = "memo text " * 200
    records = [record(1, memo + "Q1"), record(2, memo + "Q2"), record(3, "short")]
    writers = kept(records)
    writers.drop(1)
    writers.drop(3)
    writers.drop(99)                                                  # never kept: nothing to do
    assert len(writers) == 1
    assert writers.writer_of(record(4, memo + "Q1")).request == 2
    writers.drop(2)
    assert writers.writer_of(record(5, memo + "Q1")) is None


def test_a_salted_request_with_no_writer_in_its_bucket_reads_only_its_salts_records(monkeypatch):
    """A control or twin request under a fresh salt: no kept record shares its salt, so none is compared (all 512
    kept ones were, each a prompt comparison, before the records were kept by salt as well)."""
    memo = "memo text " * 200
    records = [record(n, memo + f"Q{n % 3}") for n in range(1, 200)] + [record(200, "memo tex" + "x" * 400, salt="t")]
    writers = kept(records)
    compared = scanning(monkeypatch)
    assert writers.writer_of(record(201, memo + "Q1", salt="fresh")) is None
    assert compared == []
    assert writers.writer_of(record(202, memo + "Q1", salt="t")).request == 200     # its salt's, outside the bucket
    assert len(compared) == 1
    writers.drop(200)
    assert writers.writer_of(record(203, memo + "Q1", salt="t")) is None
