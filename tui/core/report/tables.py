"""Slim per-request tables for the run report: a few dozen bytes a request instead of whole events."""

from __future__ import annotations

from array import array
from collections import namedtuple
from collections.abc import Mapping
from typing import Any, Iterable, Iterator

from ..log.events import RequestFinished, RequestStarted
from .power import proven_hit

# --- slim per-request tables ----------------------------------------------------------------------
#
# A RunReport lives as long as the run and sees every request. Keeping each RequestStarted and
# RequestFinished whole (answer text, checks, log-probabilities) grows by kilobytes a request; these
# tables keep, in compact typed columns, the fields the summaries read: a few dozen bytes a request.
# They read like the dicts they replace (len, in, [], get, keys, values, items; starts in arrival
# order, ends in request order);
# a row is a light object with the event's attribute names (an end's `checks` is the set of the
# names of the checks that ran: their results are in the log and in the app's model). Rows are
# namedtuples: StartRow(request, seq, slot, round, phase, code, task, arm) and
# EndRow(request, cached_tokens, error, checks).
#
# Bounded (issue 26): even slim, a row a request grew a night's soak by ~18 bytes a request (0.6 MB
# an hour at 34,000 requests). What the reports read of them is len() (every request ever added,
# kept as a count), the end table's `hits` (a count) and, for a finding, its request's row
# (html.py: the code to mark in the answer). So a table keeps the rows of its last WINDOW ids, and
# the rows of ids `pin`ned (RunReport pins every finding's request as the finding arrives, which is
# right after the request, or after the flagged requests that isolation re-runs: the Requester keeps
# only 512 recent records for later checks). Older rows are dropped once 2 x WINDOW are held (at
# most ~150 KB for both tables); iteration and `in` see the rows kept. A table whose ids stop
# arriving in order keeps everything, as before.

_NONE = -1
_WIDER = {"b": "h", "B": "H", "h": "i", "H": "I", "i": "q", "I": "q"}


class _Strings:
    """Interned strings as small integers (0 is None)."""

    def __init__(self) -> None:
        self.values: list[Any] = [None]
        self.index: dict[Any, int] = {None: 0}

    def __call__(self, value) -> int:
        at = self.index.get(value)
        if at is None:
            at = self.index[value] = len(self.values)
            self.values.append(value)
        return at


StartRow = namedtuple("StartRow", "request seq slot round phase code task arm")
EndRow = namedtuple("EndRow", "request cached_tokens error checks")     # checks: names of the checks run
_row = tuple.__new__


class _Table(Mapping):
    """request id -> row. Rows live in typed columns indexed by id - (the first id), with a presence
    byte; columns widen when a value outgrows them. ORDERED tables iterate in insertion order (an
    order column is kept only once ids stop arriving in increasing order); the others in id order.
    Ids far from the first (never, from the Requester) go to a dict."""

    TYPECODES: tuple[str, ...] = ()
    ORDERED = True
    SPAN = 1 << 24
    WINDOW = 4_096                                    # rows of the latest ids always kept (see above)

    def __init__(self) -> None:
        self._cols = [array(code) for code in self.TYPECODES]
        self._present = bytearray()
        self._n = 0
        self._base: int | None = None
        self._last = -1                               # offset of the last new row while in order
        self._order: array | None = None              # offsets in insertion order, once out of order
        self._far: dict[int, tuple] = {}
        self._writes = 0
        self._items: tuple[int, list] | None = None     # (writes, items): a report reads them several times
        self._pinned: set[int] = set()                  # ids whose rows outlive the window

    def _offset(self, rid) -> int:
        """The column index of rid when it is stored there, else _NONE."""
        if self._base is None or not isinstance(rid, int):
            return _NONE
        offset = rid - self._base
        if 0 <= offset < len(self._present) and self._present[offset]:
            return offset
        return _NONE

    def _store(self, rid: int, values: tuple) -> None:
        self._writes += 1
        base = self._base
        if base is not None:                           # the usual case: room for it, a new row, in order
            offset = rid - base
            present = self._present
            if 0 <= offset < len(present) and not present[offset] and offset == self._last + 1 \
                    and self._order is None:
                present[offset] = 1
                self._n += 1
                self._last = offset
                try:
                    for column, value in zip(self._cols, values):
                        column[offset] = value
                    if offset >= 2 * self.WINDOW:
                        self._slide()
                    return
                except OverflowError:
                    pass                               # widen below (the row is already counted)
        if self._base is None:
            self._base = rid
        offset = rid - self._base
        if not 0 <= offset < self.SPAN:
            if rid not in self._far:
                self._note_order(offset)
            self._far[rid] = values
            return
        present = self._present
        if offset >= len(present):
            missing = max(offset + 1 - len(present), 1024)      # grow in blocks, not per row
            present.extend(bytes(missing))
            for i, column in enumerate(self._cols):
                column.extend(array(column.typecode, bytes(column.itemsize * missing)))
        if not present[offset]:
            present[offset] = 1
            self._note_order(offset)
        try:
            for column, value in zip(self._cols, values):
                column[offset] = value
        except OverflowError:                          # a value outgrew its column: widen, then write again
            cols = self._cols
            for i, value in enumerate(values):
                try:
                    cols[i][offset] = value
                except OverflowError:
                    cols[i] = _widened(cols[i], value)
                    cols[i][offset] = value
        if self._last >= 2 * self.WINDOW:
            self._slide()

    def pin(self, rid) -> None:
        """Keep this id's row (present or still to come) past the window."""
        if isinstance(rid, int):
            self._pinned.add(rid)

    def _slide(self) -> None:
        """Drop the rows before the last WINDOW offsets; pinned ones move to the far dict."""
        if self._order is not None:                    # out of order: offsets are referenced, keep all
            return
        drop = self._last + 1 - self.WINDOW
        base, present, cols = self._base, self._present, self._cols
        for rid in self._pinned:
            offset = rid - base
            if 0 <= offset < drop and present[offset]:
                self._far[rid] = tuple(column[offset] for column in cols)
        for column in cols:
            del column[:drop]
        del present[:drop]
        self._base = base + drop
        self._last -= drop
        self._writes += 1

    def _note_order(self, offset: int) -> None:
        self._n += 1
        if not self.ORDERED:                          # read in id order: only the highest offset matters
            if 0 <= offset < self.SPAN and offset > self._last:
                self._last = offset
            return
        if self._order is None:
            if offset == self._last + 1:
                self._last = offset
                return
            self._order = array("i", range(self._last + 1))
        try:
            self._order.append(offset)
        except OverflowError:
            self._order = _widened(self._order, offset)
            self._order.append(offset)

    def _offsets(self) -> Iterable[int]:
        if not self.ORDERED:
            present = self._present
            near = [offset for offset in range(self._last + 1) if present[offset]]
            base = self._base
            far = sorted(rid - base for rid in self._far)
            return [o for o in far if o < 0] + near + [o for o in far if o >= 0]
        if self._order is None:
            if self._far:                                # rows kept past the window (pinned): first
                return sorted(rid - self._base for rid in self._far) + list(range(self._last + 1))
            return range(self._last + 1)
        return self._order

    def __len__(self) -> int:
        return self._n

    def __contains__(self, rid) -> bool:
        return self._offset(rid) != _NONE or (bool(self._far) and rid in self._far)

    def __iter__(self) -> Iterator[int]:
        base = self._base
        return iter([base + offset for offset in self._offsets()]) if base is not None else iter(())

    def __getitem__(self, rid):
        row = self.get(rid, _MISSING)
        if row is _MISSING:
            raise KeyError(rid)
        return row

    def get(self, rid, default=None):
        offset = self._offset(rid)
        if offset != _NONE:
            return self._make(rid, [column[offset] for column in self._cols])
        if self._far and rid in self._far:
            return self._make(rid, self._far[rid])
        return default

    def values(self):
        return [row for _, row in self.items()]

    def items(self):
        """Every (id, row), built from whole columns at once; kept until the next write, as a report
        reads them all several times."""
        base = self._base
        if base is None:
            return []
        if self._items is not None and self._items[0] == self._writes:
            return list(self._items[1])
        make = self._make
        rows = list(zip(*[column.tolist() for column in self._cols]))
        size = len(rows)
        out = []
        for offset in self._offsets():
            rid = base + offset
            out.append((rid, make(rid, rows[offset] if 0 <= offset < size else self._far[rid])))
        self._items = (self._writes, out)
        return list(out)

    def _make(self, rid: int, values):
        raise NotImplementedError


_MISSING = object()


def _widened(column: array, value: int) -> array:
    code = column.typecode
    while True:
        code = _WIDER[code]
        try:
            array(code, [value])
            return array(code, column)
        except OverflowError:
            continue


class StartTable(_Table):
    TYPECODES = ("I", "b", "h", "B", "H", "B", "B")     # seq, slot, round, phase, code, task, arm

    def __init__(self) -> None:
        super().__init__()
        self._strings = _Strings()

    def add(self, e: RequestStarted) -> None:
        s = self._strings
        self._store(e.request, (e.seq, _NONE if e.slot is None else e.slot, _NONE if e.round is None else e.round,
                                s(e.phase), s(e.code), s(e.task), s(e.arm)))

    def _make(self, rid: int, values) -> StartRow:
        seq, slot, round_, phase, code, task, arm = values
        strings = self._strings.values
        return _row(StartRow, (rid, seq, None if slot == _NONE else slot, None if round_ == _NONE else round_,
                               strings[phase], strings[code], strings[task], strings[arm]))


class EndTable(_Table):
    TYPECODES = ("h", "B", "B")                          # cached tokens, error, names of the checks run
    ORDERED = False                                      # ends come in finish order: read in request order

    def __init__(self) -> None:
        super().__init__()
        self._strings = _Strings()
        self._checks = _Strings()
        self.hits = 0                                     # requests with a proven cache hit

    def add(self, e: RequestFinished) -> None:
        offset = self._offset(e.request)
        if offset != _NONE:                               # a second end for the same request replaces the first
            if self._cols[0][offset] > 0:
                self.hits -= 1
        elif self._far and e.request in self._far and self._far[e.request][0] > 0:
            self.hits -= 1
        # a proven hit's cached tokens (exact, else the lower bound a counter proved); 0 when the
        # request reused no more than a cold one may (the tokens before the run nonce); None unknown
        cached = e.cached_tokens if e.cached_tokens is not None else (e.cached_min or None)
        if proven_hit(e):
            self.hits += 1
        elif cached is not None:
            cached = 0
        self._store(e.request, (_NONE if cached is None else cached, self._strings(e.error),
                                self._checks(frozenset(e.checks or ()))))

    def get(self, rid, default=None):
        base = self._base
        if base is not None and type(rid) is int:          # the hot path of a report: ends.get per start
            offset = rid - base
            present = self._present
            if 0 <= offset < len(present) and present[offset]:
                cached, error, checks = self._cols
                value = cached[offset]
                return _row(EndRow, (rid, None if value == _NONE else value, self._strings.values[error[offset]],
                                     self._checks.values[checks[offset]] or _NO_CHECKS))
        return super().get(rid, default)

    def _make(self, rid: int, values) -> EndRow:
        cached, error, checks = values
        return _row(EndRow, (rid, None if cached == _NONE else cached, self._strings.values[error],
                             self._checks.values[checks] or _NO_CHECKS))


_NO_CHECKS: frozenset[str] = frozenset()
