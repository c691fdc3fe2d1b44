"""The event loop a run goes on (tui.core.server.eventloop): uvloop's unless HITPROOF_EVENT_LOOP=asyncio, a bad
value in one line, and the answer-stream transport's own tests passing on uvloop's loop as on asyncio's (the
rest of the suite runs on pytest-asyncio's, asyncio's own)."""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import warnings

import pytest
import uvloop

import test_direct
import test_transport
from support.cli import run_hitproof
from tui.core.config.errors import BadInput
from tui.core.server import eventloop


def test_the_loop_is_uvloops_unless_asked_otherwise():
    assert eventloop.loop_kind({}) == "uvloop"
    assert eventloop.loop_kind({"HITPROOF_EVENT_LOOP": "uvloop"}) == "uvloop"
    assert eventloop.loop_kind({"HITPROOF_EVENT_LOOP": " Asyncio "}) == "asyncio"


def test_a_bad_choice_is_one_line(monkeypatch):
    with pytest.raises(BadInput, match="HITPROOF_EVENT_LOOP must be asyncio or uvloop, not 'uv'"):
        eventloop.loop_kind({"HITPROOF_EVENT_LOOP": "uv"})
    monkeypatch.setattr(eventloop, "_uvloop", None)
    with pytest.raises(BadInput, match="uvloop is not installed here"):
        eventloop.loop_kind({"HITPROOF_EVENT_LOOP": "uvloop"})
    assert eventloop.loop_kind({}) == "asyncio"           # not installed, not asked for: asyncio's


def test_run_goes_on_the_chosen_loop(monkeypatch):
    async def which():
        return type(asyncio.get_running_loop())

    monkeypatch.delenv("HITPROOF_EVENT_LOOP", raising=False)
    assert eventloop.run(which()) is uvloop.Loop
    monkeypatch.setenv("HITPROOF_EVENT_LOOP", "asyncio")
    assert not issubclass(eventloop.run(which()), uvloop.Loop)


def test_a_bad_choice_runs_nothing_and_leaves_no_coroutine_behind(monkeypatch):
    ran = []

    async def main():
        ran.append(1)

    monkeypatch.setenv("HITPROOF_EVENT_LOOP", "tokio")
    with warnings.catch_warnings():
        warnings.simplefilter("error")                    # "coroutine ... was never awaited" would fail here
        with pytest.raises(BadInput):
            eventloop.run(main())
    assert ran == []


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
@pytest.mark.parametrize("sigint", [signal.default_int_handler, signal.SIG_IGN], ids=["sigint-default", "sigint-ignored"])
def test_sigterm_cancels_the_main_task_then_interrupts(monkeypatch, loop, sigint):
    """SIGTERM ends a run as Ctrl-C does: the main task cancelled (its cleanup runs), then KeyboardInterrupt,
    whether or not SIGINT is ignored; the handlers before it are back afterwards."""
    cleaned = []

    async def main():
        asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGTERM)
        try:
            await asyncio.sleep(30)
        finally:
            cleaned.append(asyncio.current_task().cancelling())

    monkeypatch.setenv("HITPROOF_EVENT_LOOP", loop)
    before_int = signal.signal(signal.SIGINT, sigint)
    before_term = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with pytest.raises(KeyboardInterrupt):
            eventloop.run(main())
        assert cleaned == [1]                                  # cancelled once, and its finally ran
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL and signal.getsignal(signal.SIGINT) == sigint
    finally:
        signal.signal(signal.SIGINT, before_int)
        signal.signal(signal.SIGTERM, before_term)


def test_an_ignored_sigterm_stays_ignored(monkeypatch):
    async def main():
        return signal.getsignal(signal.SIGTERM)

    before = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        assert eventloop.run(main()) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before)


async def test_the_command_line_says_a_bad_choice_in_one_line(tmp_path):
    out = await run_hitproof("run", "--attach", "http://127.0.0.1:9", "--headless", "--record",
                             str(tmp_path / "l.jsonl"), env={"HITPROOF_EVENT_LOOP": "tokio"})
    assert out.code == 2, out.out + out.err
    assert out.err.strip() == "hitproof: error: HITPROOF_EVENT_LOOP must be asyncio or uvloop, not 'tokio'"


_ON_UVLOOP = [f for module in (test_transport, test_direct) for name, f in vars(module).items()
              if name.startswith("test_") and inspect.iscoroutinefunction(f) and not inspect.signature(f).parameters]


@pytest.mark.parametrize("case", _ON_UVLOOP, ids=lambda f: f.__name__)
def test_the_transport_on_uvloop(case, monkeypatch):
    monkeypatch.delenv("HITPROOF_EVENT_LOOP", raising=False)
    assert len(_ON_UVLOOP) >= 18
    eventloop.run(case())
