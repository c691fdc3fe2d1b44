"""What each of hitproof's parts costs a request during a soak, by exclusive wall time, with little distortion (issue 34).

    python3 benchmarks/gpu/cost_soak.py [--phase NAME] -- run --attach http://127.0.0.1:8321 \\
        --scenario scenarios/gpu-quick.toml --streams 128 --power 0.3% --headless --record /tmp/cost.jsonl

Runs the hitproof command line given after `--` in this process with the functions in PARTS wrapped: each call
(a coroutine: each resumption) timed with perf_counter_ns, less the time of the wrapped calls inside it, from the
first request's RequestStarted to RunFinished (start-up and the report left out, as rate.py's steady figures are);
with --phase, only while that phase runs. Prints one line a part: microseconds a request and calls a request,
then the main thread's and the process's CPU a request and the cyclic collector's share.

cProfile (profile_soak.py) times every call and so weighs call-heavy code several times over; a sampling profiler
(py-spy) needs ptrace and misattributes native time. This wraps a few dozen functions only (about 0.1-0.3 us a
call), so its shares are close to a soak's own; the rest of the main thread (the event loop, what no part covers)
is printed too. Wall time in the main thread is its CPU while hitproof runs on a core of its own. A part missing
from this tree is skipped with a line on stderr. Exit: hitproof's own code; 3 when no request ran.

Run X (2026-12-07, one H100, gpu-quick at 128 streams) found this way that judging a deviation (the twin's, bf16
resumes) was the largest part on the GPU, where the reference server's profiles had not shown it."""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import importlib
import io
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SYNC = [
    ("tui.core.server.answer", "AnswerReader.finish"), ("tui.core.server.answer", "AnswerReader.feed"),
    ("tui.core.server.connection", "_Connection._readable"), ("tui.core.server.connection", "_Connection.send"),
    ("tui.core.server.transport", "_Response.feed"), ("tui.core.server.transport", "_Response.__init__"),
    ("tui.core.server.wire", "_json_bytes"), ("tui.core.server.client", "leading_count"),
    ("tui.core.log.events", "EventBus.emit"), ("tui.core.log.recorder", "Recorder.__call__"),
    ("tui.core.report.report", "RunReport.feed"), ("tui.headless", "HeadlessConsole.__call__"),
    ("tui.core.checks.answers", "evaluate"), ("tui.core.checks.detectors", "find_repetition"),
    ("tui.core.checks.detectors", "find_foreign_codes"), ("tui.core.checks.detectors", "fingerprint_match"),
    ("tui.core.checks.fingerprints", "FingerprintBook.compare"), ("tui.core.checks.fingerprints", "FingerprintBook.add"),
    ("tui.core.checks.fingerprints", "FingerprintBook.match_all"),
    ("tui.core.evidence.text", "SentenceSource.next_sized"), ("tui.core.evidence.memos", "_resize"),
    ("tui.core.evidence.memos", "_append"), ("tui.core.evidence.tokens", "estimate_tokens"),
    ("tui.core.soak.resume", "landed_on"), ("tui.core.soak.resume", "pair_of"),
    ("tui.core.soak.requester", "Requester._remember"), ("tui.core.soak.requester", "Requester.spec"),
    ("tui.core.soak.requester", "Requester.question"), ("tui.core.soak.record", "DeltaCoalescer.__init__"),
    ("tui.core.soak.record", "DeltaCoalescer.__call__"), ("tui.core.soak.writers", "Writers.add"),
    ("tui.core.soak.writers", "Writers.drop"), ("tui.core.soak.writers", "Writers.writer_of"),
    ("tui.core.soak.twin", "lineage"), ("tui.core.soak.twin_judge", "TwinJudge.chain_bound"),
    ("tui.core.soak.judge", "Judge._foreign_codes"), ("tui.core.soak.judge", "Judge._expectations"),
    ("tui.core.soak.judge", "Judge._keep_fingerprint"), ("tui.core.server.metrics", "parse_metrics"),
]
ASYNC = [
    ("tui.core.soak.requester", "Requester.send"), ("tui.core.soak.requester", "Requester._via_router"),
    ("tui.core.soak.requester", "Requester._send_once"), ("tui.core.soak.requester", "Requester._served"),
    ("tui.core.soak.requester", "Requester._size_memo"), ("tui.core.server.client", "OpenAIClient.stream"),
    ("tui.core.server.client", "OpenAIClient._stream"), ("tui.core.server.client", "OpenAIClient._twice"),
    ("tui.core.server.client", "OpenAIClient.post_for_bytes"), ("tui.core.server.client", "OpenAIClient.tokenize"),
    ("tui.core.server.direct", "DirectStream.__aenter__"), ("tui.core.server.direct", "DirectStream.__aexit__"),
    ("tui.core.server.transport", "StreamingTransport.exchange"),
    ("tui.core.server.transport", "StreamingTransport._read_head"), ("tui.core.server.transport", "_Body.next_block"),
    ("tui.core.server.connection", "_Connection.next_piece"), ("tui.core.server.connection", "_Connection.gather"),
    ("tui.core.server.connection", "_Connection._woken"), ("tui.core.evidence.tokens", "TokenCounter.count"),
    ("tui.core.soak.judge", "Judge.judge"), ("tui.core.soak.judge", "Judge.calibrate"),
    ("tui.core.soak.judge", "Judge._judge_fingerprint"), ("tui.core.soak.judge", "Judge.cold_fingerprint"),
    ("tui.core.soak.judge", "Judge._cold_fingerprint"), ("tui.core.soak.twin_judge", "TwinJudge.judge"),
    ("tui.core.soak.twin", "make_twin"), ("tui.core.server.discovery", "scrape"),
]

_clock = time.perf_counter_ns


class Costs:
    def __init__(self) -> None:
        self.on = False
        self.own: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        self.stack: list[int] = []            # per open call: the time of the wrapped calls inside it
        self.gc_ns = 0
        self.gc_runs = 0
        self._gc_start = 0

    def add(self, name: str, spent: int, done: bool) -> None:
        inside = self.stack.pop()
        self.own[name] = self.own.get(name, 0) + spent - inside
        self.calls[name] = self.calls.get(name, 0) + done
        if self.stack:
            self.stack[-1] += spent

    def on_gc(self, phase: str, info: dict) -> None:
        if not self.on:
            return
        if phase == "start":
            self._gc_start = _clock()
        else:
            self.gc_ns += _clock() - self._gc_start
            self.gc_runs += 1


COSTS = Costs()


class _Timed:
    """An awaitable that times each resumption of the coroutine it wraps (exclusive of wrapped calls inside)."""

    __slots__ = ("coro", "name")

    def __init__(self, coro, name: str):
        self.coro, self.name = coro, name

    def __await__(self):
        coro, name, value, error = self.coro, self.name, None, None
        while True:
            timed = COSTS.on
            if timed:
                COSTS.stack.append(0)
                started = _clock()
            done = False
            try:
                sent = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as stop:
                done, result = True, stop.value
            finally:
                if timed:
                    COSTS.add(name, _clock() - started, done)
            if done:
                return result
            try:
                value, error = (yield sent), None
            except BaseException as exc:      # thrown in by the task (a cancel, a timeout): handed on
                value, error = None, exc


def _owner(module: str, qualname: str):
    owner = importlib.import_module(module)
    *path, name = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    return owner, name


def _wrap(module: str, qualname: str, is_async: bool) -> None:
    owner, name = _owner(module, qualname)
    raw = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    static = isinstance(raw, staticmethod)
    fn = raw.__func__ if static else raw
    if is_async:
        @functools.wraps(fn)
        async def wrapped(*args, **kwargs):
            return await _Timed(fn(*args, **kwargs), qualname)
    else:
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            if not COSTS.on:
                return fn(*args, **kwargs)
            COSTS.stack.append(0)
            started = _clock()
            try:
                return fn(*args, **kwargs)
            finally:
                COSTS.add(qualname, _clock() - started, True)
    setattr(owner, name, staticmethod(wrapped) if static else wrapped)
    if not isinstance(owner, type):           # modules that imported the function by name call their own copy
        for other in list(sys.modules.values()):
            if other is not None and getattr(other, name, None) is fn:
                setattr(other, name, wrapped)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("cost_soak.py: give the hitproof command line after --", file=sys.stderr)
        return 2
    split = argv.index("--")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase", help="only while this phase runs (its requests counted)")
    args = parser.parse_args(argv[:split])
    from tui.cli import main as hitproof
    from tui.core.log.events import EventBus, PhaseStarted, RequestStarted, RunFinished

    for parts, is_async in ((SYNC, False), (ASYNC, True)):
        for module, qualname in parts:
            try:
                _wrap(module, qualname, is_async)
            except (ImportError, AttributeError, KeyError) as exc:
                print(f"cost_soak.py: {module}.{qualname} not in this tree ({exc}): skipped", file=sys.stderr)
    gc.callbacks.append(COSTS.on_gc)
    window = {"requests": 0}
    emit = EventBus.emit

    def start() -> None:
        window.update(cpu=time.thread_time_ns(), process=time.process_time_ns())
        COSTS.on = True

    def stop() -> None:
        window.update(cpu=time.thread_time_ns() - window["cpu"], process=time.process_time_ns() - window["process"])
        COSTS.on = False

    def emit_timed(self, event):
        if args.phase and isinstance(event, PhaseStarted):
            if event.phase == args.phase and "cpu" not in window:
                start()
            elif COSTS.on:
                stop()
        if isinstance(event, RequestStarted):
            if not args.phase and "cpu" not in window:
                start()
            window["requests"] += COSTS.on
        out = emit(self, event)
        if isinstance(event, RunFinished) and COSTS.on:
            stop()
        return out

    EventBus.emit = emit_timed
    with contextlib.redirect_stdout(io.StringIO()):
        code = hitproof(argv[split + 1:])
    n = window["requests"]
    if not n:
        print(f"cost_soak.py: no request ran (hitproof exit {code})", file=sys.stderr)
        return 3
    per = lambda ns: ns / 1e3 / n        # noqa: E731  (us a request)
    print(f"hitproof exit {code}, {n} requests{' in ' + args.phase if args.phase else ''}: main thread "
          f"{per(window['cpu']):.1f} us CPU a request, process {per(window['process']):.1f}; cyclic collector "
          f"{COSTS.gc_runs} runs, {per(COSTS.gc_ns):.1f} us a request")
    total = 0
    for name, spent in sorted(COSTS.own.items(), key=lambda item: -item[1]):
        total += spent
        print(f"  {per(spent):7.1f} us  {COSTS.calls.get(name, 0) / n:5.2f} calls  {name}")
    print(f"  {per(total):7.1f} us  in the parts above; the main thread's rest {per(window['cpu'] - total):.1f} us")
    return code


if __name__ == "__main__":
    sys.exit(main())
