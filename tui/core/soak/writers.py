"""Which earlier request wrote the prefix a hit resumed from (the twin's lineage, twin.py).

The writer is, among the records kept (the recent ones and the flagged), the earlier one under the same salt
(none, for the main arm) and identity whose prompt shares the longest beginning with the hit's, the latest of
equals. Records are indexed by their prompt's first BUCKET_CHARS characters: any record that shares that much
shares more than every record that does not, so when the hit's bucket holds a candidate the answer is in it,
and only a hit with none there scans them all. A memo's prompts start with its own heading, so a bucket is one
memo's requests (tens), not the 512 kept: scanning them all for each hit was 23% of hitproof's CPU at 32 streams
on an H100 after the answers were kept (cProfile, 2026-12-05: 234,476 prompt comparisons in 2,561 requests).
"""

from __future__ import annotations

import collections

from .record import Record, prompt_text, shared_chars

BUCKET_CHARS = 256       # a prompt's beginning that names its bucket (a memo's heading and first sentences)
KEEP_ANSWERS = 4096      # answers kept (a lineage asks again for every writer on its chain)


class Writers:
    def __init__(self) -> None:
        self._records: dict[int, tuple[Record, str]] = {}        # request -> (record, its prompt text)
        self._buckets: dict[str, dict[int, Record]] = {}
        self._short: dict[int, Record] = {}                       # prompts shorter than BUCKET_CHARS
        # by (salt, model, api): where a hit's bucket holds no writer, only records under its salt can be one (a
        # salted control or twin request scanned all 512 kept records, none of them under its fresh salt)
        self._alike: dict[tuple, dict[int, Record]] = {}
        self._answers: collections.OrderedDict[int, tuple[object, Record | None]] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._records)

    def add(self, record: Record) -> None:
        """A record a later hit may have resumed from (kept until `drop`)."""
        if record.request in self._records:
            return
        text = prompt_text(record.spec)
        self._records[record.request] = (record, text)
        self._alike.setdefault(_identity(record.spec), {})[record.request] = record
        if len(text) < BUCKET_CHARS:
            self._short[record.request] = record
        else:
            self._buckets.setdefault(text[:BUCKET_CHARS], {})[record.request] = record

    def drop(self, request: int) -> None:
        kept = self._records.pop(request, None)
        if kept is None:
            return
        text = kept[1]
        alike = self._alike.get(_identity(kept[0].spec))
        if alike is not None:
            alike.pop(request, None)
            if not alike:
                del self._alike[_identity(kept[0].spec)]
        if len(text) < BUCKET_CHARS:
            self._short.pop(request, None)
            return
        bucket = self._buckets.get(text[:BUCKET_CHARS])
        if bucket is not None:
            bucket.pop(request, None)
            if not bucket:
                del self._buckets[text[:BUCKET_CHARS]]

    def writer_of(self, record: Record) -> Record | None:
        """Found once per request, among the records known then (a copy of a record with another prompt, a
        twin's, is its own question)."""
        known = self._answers.get(record.request)
        if known is not None and known[0] is record.spec:
            return known[1]
        text = prompt_text(record.spec)
        best = None
        if len(text) >= BUCKET_CHARS:
            bucket = self._buckets.get(text[:BUCKET_CHARS])
            if bucket:
                best = self._best(record, text, bucket.values())
        if best is None:
            best = self._best(record, text, self._alike.get(_identity(record.spec), {}).values())
        self._answers[record.request] = (record.spec, best)
        if len(self._answers) > KEEP_ANSWERS:
            self._answers.popitem(last=False)
        return best

    def _best(self, record: Record, text: str, candidates) -> Record | None:
        spec = record.spec
        identity = (spec.salt, spec.model, spec.extra, spec.api)
        best, best_len = None, 0
        for other in candidates:
            theirs = other.spec
            if other.request >= record.request or (theirs.salt, theirs.model, theirs.extra, theirs.api) != identity:
                continue
            shared = shared_chars(self._records[other.request][1], text)
            if shared > best_len or shared == best_len and best is not None and other.request > best.request:
                best, best_len = other, shared
        return best


def _identity(spec) -> tuple:
    """What _best requires equal, less the extra fields (a dict: compared there)."""
    return spec.salt, spec.model, spec.api
