"""Event codec, the bus, the recorder and the tolerant log reader."""

import json
import time

import pytest

from tui.core.config.errors import BadInput
from tui.core.log.events import (SCHEMA_VERSION, EventBus, Finding, RequestFinished, RunHeader, decode, encode)
from tui.core.log.recorder import Recorder
from tui.core.log.reader import read_log


def test_round_trip_keeps_fields():
    f = Finding(seq=3, t=1.5, kind="foreign_code", severity="fail", phase="rotation", slot=2, round=1,
                request=17, offset=12, detail="d", memo="m02", evidence={"code": "1"})
    back = decode(encode(f))
    assert back == f and isinstance(back, Finding)


def test_unknown_type_decodes_to_plain_event():
    e = decode('{"type": "from_the_future", "seq": 4, "t": 0.5, "x": 1}')
    assert (e.type, e.seq) == ("event", 4)


def test_bus_stamps_seq_and_time_in_order():
    clock = iter([10.0, 10.5, 11.25])
    bus = EventBus(clock=lambda: next(clock))
    seen = []
    bus.subscribe(seen.append)
    bus.emit(RunHeader())
    bus.emit(Finding(kind="x"))
    assert [(e.seq, e.t) for e in seen] == [(1, 0.5), (2, 1.25)]


async def test_recorder_flushes_each_event(tmp_path):
    path = tmp_path / "run.jsonl"
    rec = Recorder(path)
    await rec.start()
    bus = EventBus()
    bus.subscribe(rec)
    bus.emit(RunHeader(run_id="r1"))
    bus.emit(RequestFinished(request=1, text="héllo"))
    await rec.close()
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["type"] == "header"
    log = read_log(path)
    assert log.header.run_id == "r1" and log.events[1].text == "héllo" and log.warning is None


async def test_recorder_writes_a_lone_event_at_once_and_batches_a_burst(tmp_path, monkeypatch):
    """One write per batch, by the recorder's own thread: a burst right after a write waits up to LINGER
    for its batch (here long, so the wait is seen), a lone event does not wait, and close() writes what
    waits."""
    import asyncio
    monkeypatch.setattr(Recorder, "LINGER", 30.0)
    path = tmp_path / "run.jsonl"
    rec = Recorder(path)
    await rec.start()
    batches = []
    write = rec._write_batch

    def counted(lines):
        batches.append(len(lines))
        write(lines)
    rec._write_batch = counted
    rec(RunHeader(run_id="r1"))
    for _ in range(100):                                 # the lone first event: written without waiting
        await asyncio.sleep(0.01)
        if path.read_bytes().count(b"\n") == 1:
            break
    assert batches == [1]
    for request in range(1, 6):                          # a burst within LINGER of that write: waits
        rec(RequestFinished(request=request))
        await asyncio.sleep(0.02)
    assert path.read_bytes().count(b"\n") == 1 and batches == [1]
    closing = time.monotonic()
    await rec.close()                                    # ... and is written, one batch, at close
    assert time.monotonic() - closing < 10               # without waiting LINGER out
    assert batches == [1, 5] and [e.request for e in read_log(path).events[1:]] == [1, 2, 3, 4, 5]


async def test_recorder_puts_no_work_on_the_event_loop_per_batch(tmp_path):
    """The writer thread takes the lines: while events are written, the loop runs no callback for them (it
    ran two a batch through run_in_executor: the future's and the self-pipe's); the thread's end is heard
    once, at close() (then aiofiles closes the file through the executor)."""
    import asyncio
    path = tmp_path / "run.jsonl"
    rec = Recorder(path)
    await rec.start()
    loop = asyncio.get_running_loop()
    called = []
    threadsafe = loop.call_soon_threadsafe
    loop.call_soon_threadsafe = lambda *args, **kw: (called.append(args[0]), threadsafe(*args, **kw))[1]
    try:
        for request in range(1, 41):
            rec(RequestFinished(request=request))
            await asyncio.sleep(0.002)
        for _ in range(200):
            await asyncio.sleep(0.01)
            if path.read_bytes().count(b"\n") == 40:
                break
        assert path.read_bytes().count(b"\n") == 40 and called == []
        await rec.close()
    finally:
        del loop.call_soon_threadsafe
    assert called[0] == rec._writer_ended and called.count(rec._writer_ended) == 1 and rec.written == 40


def _write(path, *events, tail=""):
    path.write_text("".join(encode(e) + "\n" for e in events) + tail, encoding="utf-8")


def test_truncated_last_line_is_tolerated_with_warning(tmp_path):
    path = tmp_path / "cut.jsonl"
    _write(path, RunHeader(seq=1), Finding(seq=2, kind="x"), tail='{"type": "finding", "seq": 3, "ki')
    log = read_log(path)
    assert len(log.events) == 2
    assert "cut short" in log.warning and ":3:" in log.warning


def test_newer_schema_is_a_clear_error(tmp_path):
    path = tmp_path / "new.jsonl"
    _write(path, RunHeader(schema=SCHEMA_VERSION + 1))
    with pytest.raises(BadInput, match="newer than this hitproof"):
        read_log(path)


def test_not_a_log(tmp_path):
    path = tmp_path / "x.jsonl"
    _write(path, Finding(kind="x"))
    with pytest.raises(BadInput, match="not a hitproof log"):
        read_log(path)
    with pytest.raises(BadInput, match="cannot open log"):
        read_log(tmp_path / "missing.jsonl")


def test_damaged_line_in_the_middle_stops_with_warning(tmp_path):
    path = tmp_path / "mid.jsonl"
    _write(path, RunHeader(seq=1), tail='{"type": "finding", "se\n' + encode(Finding(seq=3, kind="x")) + "\n")
    log = read_log(path)
    assert len(log.events) == 1 and "damaged line" in log.warning and ":2:" in log.warning


def _recorded(path, events, tail=""):
    """The log exactly as the Recorder writes it (compact lines), plus an optional raw tail."""
    from tui.core.log.recorder import encode_line
    path.write_bytes(b"".join(encode_line(e) for e in events) + tail.encode())


def test_reading_only_some_types_matches_filtering_the_full_read(tmp_path, monkeypatch):
    """`only` skips other lines unparsed (a C-level scan per block); across small blocks the
    events, their order and the line numbers in warnings are those of the full read."""
    import tui.core.log.reader as reader
    from tui.core.log.events import AnswerDelta, MetricsSample, RequestStarted
    from tui.core.log.reader import iter_log
    events = [RunHeader(seq=1)]
    for i in range(60):
        events += [RequestStarted(seq=0, request=i, phase="p"), AnswerDelta(request=i, text="x" * (i % 7)),
                   MetricsSample(values={"a": float(i)}), RequestFinished(request=i, text="ok")]
    path = tmp_path / "log.jsonl"
    _recorded(path, events, tail='{"type":"request_end","request":9')
    monkeypatch.setattr(reader, "_READ_BLOCK", 301)          # many blocks, lines cut across them
    wanted = {"header", "request_start", "request_end"}
    full_warnings, only_warnings = [], []
    full = [e for e in iter_log(path, full_warnings) if e.type in wanted]
    only = list(iter_log(path, only_warnings, only=wanted))
    assert [(e.type, getattr(e, "request", None)) for e in only] == [(e.type, getattr(e, "request", None)) for e in full]
    assert len(only) == 121 and only_warnings == full_warnings and f":{len(events) + 1}:" in only_warnings[0]


def test_reading_only_some_types_still_stops_at_a_damaged_line(tmp_path):
    from tui.core.log.recorder import encode_line
    from tui.core.log.reader import iter_log
    for damaged in ('{"type":"finding","se', "garbage that is no event"):
        path = tmp_path / "mid.jsonl"
        path.write_bytes(encode_line(RunHeader(seq=1)) + encode_line(Finding(seq=2, kind="x"))
                         + damaged.encode() + b"\n" + encode_line(Finding(seq=4, kind="y")))
        warnings = []
        got = list(iter_log(path, warnings, only={"header", "finding"}))
        assert [e.type for e in got] == ["header", "finding"], damaged
        assert "damaged line" in warnings[0] and ":3:" in warnings[0], warnings


def test_a_gzipped_log_reads_as_the_plain_one_and_a_broken_one_is_one_line(tmp_path):
    """The GPU runs' logs are kept gzipped (benchmarks/gpu/results): report and replay take them as they are."""
    import gzip
    from tui.core.log.compressed import plain
    path = tmp_path / "run.jsonl"
    _write(path, RunHeader(), Finding(kind="x"))
    packed = tmp_path / "run.jsonl.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert [e.type for e in read_log(plain(packed)).events] == [e.type for e in read_log(path).events]
    assert plain(path) == path
    broken = tmp_path / "cut.jsonl.gz"
    broken.write_bytes(gzip.compress(path.read_bytes())[:20])
    with pytest.raises(BadInput, match="does not decompress"):
        plain(broken)
