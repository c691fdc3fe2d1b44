"""Fuzzing with hypothesis (bounded example counts, fast tier): the SSE reader, the HTTP framing of
the answer-stream transport (llhttp behind a real loopback socket), the log reader, the scenario and
profile loaders. Whatever the input: no crash; every rejection is the documented error type
(StreamError / BadInput) with a one-line message."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from tui.core.server.client import OpenAIClient, RequestSpec, StreamError
from tui.core.config.errors import BadInput, HitproofError
from tui.core.log.events import Finding, RequestFinished, RunFinished, RunHeader
from tui.core.server.profiles import parse_profile
from tui.core.log.recorder import encode_line
from tui.core.log.reader import iter_log, read_log
from tui.core.config.scenario import parse_scenario
from tui.core.server.sse import SSEDecoder

ROOT = Path(__file__).resolve().parents[2]
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def one_line(exc: BaseException) -> None:
    text = str(exc)
    assert text and "\n" not in text and "\r" not in text and len(text) < 600, repr(text)
    assert "Traceback" not in text


def cut(data: bytes, points: list[int]) -> list[bytes]:
    points = sorted({p % (len(data) + 1) for p in points} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:]) if b > a]


# --- the SSE reader -------------------------------------------------------------------------------------

SSE_BYTES = st.one_of(
    st.binary(max_size=400),
    st.lists(st.sampled_from([b"data:", b"data: ", b"event:", b"id:", b"retry:", b":", b"\r", b"\n", b"\r\n",
                              b"\xef\xbb\xbf", b"\x00", b"[DONE]", b"{}", b"x", b" ", b"\xff", b"12"]),
             max_size=60).map(b"".join),
)


@FUZZ
@given(data=SSE_BYTES, points=st.lists(st.integers(0, 1 << 12), max_size=20))
def test_the_sse_reader_takes_any_bytes_cut_anywhere(data, points):
    whole, pieces = SSEDecoder(), SSEDecoder()
    once = whole.feed(data) + whole.close()
    parts = []
    for part in cut(data, points):
        parts += pieces.feed(part)
    parts += pieces.close()
    assert parts == once                    # how the body was cut never changes what it says
    for event in once:
        assert isinstance(event.data, str) and isinstance(event.event, str) and event.event


# --- HTTP framing (llhttp through the real transport, on a loopback socket) --------------------------------------

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
EVENT = b'data: {"choices": [{"index": 0, "text": "ab", "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'
GOOD = b"%x\r\n%s\r\n0\r\n\r\n" % (len(EVENT), EVENT)


@st.composite
def damaged_bodies(draw):
    """A valid chunked body with a few bytes replaced, inserted or removed, or random bytes."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=300))
    body = bytearray(GOOD)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(body)))
        what = draw(st.sampled_from(["replace", "insert", "delete"]))
        byte = draw(st.sampled_from([b"0", b"x", b"+", b"_", b"-", b" ", b";", b"\r", b"\n", b"f", b"\xff"]))
        if what == "replace" and at < len(body):
            body[at:at + 1] = byte
        elif what == "insert":
            body[at:at] = byte
        elif at < len(body):
            del body[at]
    return bytes(body)


async def _serve_once(body: bytes, pieces: list[bytes]):
    async def handle(reader, writer):
        try:
            await reader.readuntil(b"\r\n\r\n")
            head = await reader.read(65536)        # the small JSON body came with the head or right after
            del head
            for piece in pieces:
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(0)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    client = OpenAIClient(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", timeout=5)
    try:
        return await client.stream(RequestSpec(api="completions", prompt="p", max_tokens=2))
    finally:
        await client.aclose()
        server.close()
        await server.wait_closed()


@FEW
@given(body=damaged_bodies(), points=st.lists(st.integers(0, 400), max_size=6))
@example(body=b"0x5\r\n" + EVENT + b"\r\n0\r\n\r\n", points=[])
@example(body=b"+5\r\n" + EVENT + b"\r\n0\r\n\r\n", points=[])
@example(body=GOOD[:-3], points=[7])
def test_damaged_chunked_bodies_are_an_answer_or_one_stream_error(body, points):
    data = HEAD + body
    try:
        result = asyncio.run(_serve_once(data, cut(data, points)))
    except StreamError as exc:
        one_line(exc)
    else:                                   # a damaged byte can land in the JSON text and still parse
        assert isinstance(result.text, str)


def test_the_intact_body_reads_whole():
    assert asyncio.run(_serve_once(HEAD + GOOD, [HEAD + GOOD])).text == "ab"


# --- the log reader --------------------------------------------------------------------------------------

def _log_bytes() -> bytes:
    events = [RunHeader(run_id="r1", nonce="n", started_at="2026-12-01T00:00:00+00:00"),
              RequestFinished(request=1, phase="cold_hit", text=" 7395-2841-6620.", cached_tokens=0),
              Finding(kind="recall_miss", severity="info", phase="cold_hit", request=1, detail="d"),
              RunFinished(verdict="pass", exit_code=0, message="every phase passed")]
    return b"".join(encode_line(e) for e in events)


LOG = _log_bytes()


@st.composite
def damaged_logs(draw):
    kind = draw(st.sampled_from(["truncate", "garbage", "random", "splice", "retype"]))
    if kind == "truncate":
        return LOG[:draw(st.integers(0, len(LOG)))]
    if kind == "random":
        return draw(st.binary(max_size=400))
    lines = LOG.split(b"\n")
    at = draw(st.integers(0, len(lines)))
    if kind == "garbage":
        lines.insert(at, draw(st.binary(max_size=80)).replace(b"\n", b""))
    elif kind == "splice":
        lines.insert(at, draw(st.sampled_from([b'{"type":"header","schema":"x"}', b'{"type":"header","schema":null}',
                                               b'{"type":"header","schema":99}', b"[]", b'{"type":5}', b'"x"',
                                               b'{"type":"request_end","request":"one"}', b"{}", b"null"])))
    else:
        first = json.loads(lines[0])
        first[draw(st.sampled_from(sorted(first)))] = draw(st.sampled_from([None, "x", 1.5, [], {}, -1, True]))
        lines[0] = json.dumps(first).encode()
    return b"\n".join(lines)


@FUZZ
@given(data=damaged_logs())
@example(data=b'{"type":"header","schema":"x"}\n')
@example(data=b"\xff\xfe\n\n")
@example(data=b'{"type":[],"schema":1}\n{"type":{"a":1}}\n')
def test_the_log_reader_reads_what_it_can_and_rejects_in_one_line(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("log") / "run.jsonl"
    path.write_bytes(data)
    for only in (None, {"request_end", "run_end"}):
        warnings: list[str] = []
        try:
            events = list(iter_log(path, warnings, only=only))
        except BadInput as exc:
            one_line(exc)
            continue
        for warning in warnings:
            assert "\n" not in warning
        assert all(getattr(e, "type", None) is not None for e in events)
    try:
        read_log(path, skip_deltas=True)
    except BadInput as exc:
        one_line(exc)


# --- the scenario and profile loaders -------------------------------------------------------------------------

QUICK = (ROOT / "scenarios" / "quick.toml").read_text()
PROFILE = (ROOT / "scenarios" / "profiles" / "refserver-none.toml").read_text()
VALUES = st.one_of(st.integers(-10 ** 12, 10 ** 12), st.floats(allow_nan=True, allow_infinity=True),
                   st.booleans(), st.text(max_size=12), st.lists(st.integers(-3, 3), max_size=3),
                   st.just({}), st.just({"a": 1}), st.just([{"x": 1}]), st.just(["cold_hit", 3]))


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if value != value:
            return "nan"
        if value in (float("inf"), float("-inf")):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + "}"


@st.composite
def mutated_toml(draw, base: str):
    """The file with some `key = value` lines given other values (any type), renamed, duplicated or
    dropped, some section headers renamed, or a random line added; sometimes random text."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.text(max_size=200))
    lines = base.splitlines()
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(lines) - 1))
        line = lines[at]
        match = re.match(r"^(\s*)([A-Za-z_][\w.-]*)\s*=", line)
        action = draw(st.sampled_from(["value", "rename", "drop", "duplicate", "header", "random"]))
        if match and action == "value":
            lines[at] = f"{match.group(1)}{match.group(2)} = {_toml_value(draw(VALUES))}"
        elif match and action == "rename":
            lines[at] = line.replace(match.group(2), draw(st.from_regex(r"[a-z_]{1,12}", fullmatch=True)), 1)
        elif action == "drop":
            del lines[at]
        elif action == "duplicate":
            lines.insert(at, line)
        elif action == "header" and line.startswith("["):
            lines[at] = "[" + draw(st.from_regex(r"[a-z_.]{1,16}", fullmatch=True)) + "]"
        elif action == "random":
            lines.insert(at, draw(st.text(max_size=40)).replace("\n", " "))
        if not lines:
            break
    return "\n".join(lines) + "\n"


@FUZZ
@given(text=mutated_toml(QUICK))
@example(text=QUICK.replace("seed = 7", "seed = 1e400"))
@example(text=QUICK.replace("rounds = 6", "rounds = 99999999999999999999"))
@example(text=QUICK.replace("memo_tokens = 800", "memo_tokens = nan"))
def test_the_scenario_loader_accepts_or_rejects_in_one_line(text):
    try:
        scenario = parse_scenario(text, "fuzz.toml")
    except BadInput as exc:
        one_line(exc)
        assert str(exc).startswith("fuzz.toml")
    else:
        assert scenario.phases and scenario.request_timeout > 0


@FUZZ
@given(text=mutated_toml(PROFILE))
@example(text=PROFILE.replace("startup_timeout = ", "startup_timeout = nan #"))
def test_the_profile_loader_accepts_or_rejects_in_one_line(text, tmp_path_factory):
    base = tmp_path_factory.mktemp("profile")
    try:
        profile = parse_profile(text, "fuzz.toml", base=base)
    except BadInput as exc:
        one_line(exc)
        assert str(exc).startswith("fuzz.toml")
        return
    try:
        profile.plan(port=8123)
    except HitproofError as exc:            # e.g. {llama_server} when llama.cpp is not set up
        one_line(exc)


def test_the_base_files_load():
    assert parse_scenario(QUICK, "quick.toml").phases
    assert parse_profile(PROFILE, "refserver-none.toml", base=ROOT / "scenarios" / "profiles").name


@pytest.mark.parametrize("text", ["\x00", "[scenario]\nphases = []\n", "[[scenario]]\n", "a = 1\n",
                                  "[scenario]\nrequest_timeout = 0\n"])
def test_a_few_known_bad_scenarios(text):
    with pytest.raises(BadInput) as caught:
        parse_scenario(text, "bad.toml")
    one_line(caught.value)


class _Declining(SSEDecoder):
    """The decoder with its fast path off: every block through feed()."""

    __slots__ = ()

    def plain_data(self, data: bytes) -> None:
        return None


def _decoded(decoder: SSEDecoder, data: bytes) -> list[tuple[str, str]]:
    return [(e.event, e.data) for e in decoder.feed(data)]


@FUZZ
@given(data=SSE_BYTES, before=SSE_BYTES)
def test_plain_data_is_what_feed_dispatches_or_declines(data, before):
    """SSEDecoder.plain_data (the answer reader's fast path) gives, for whatever it takes, the data feed()
    would dispatch (as message events) and leaves the decoder as feed() would; anything else it declines."""
    fast, slow = SSEDecoder(), SSEDecoder()
    fast.feed(before)
    slow.feed(before)
    payloads = fast.plain_data(data)
    expected = _decoded(slow, data)
    if payloads is None:
        assert _decoded(fast, data) == expected
    else:
        assert [("message", p.decode("utf-8", "replace")) for p in payloads] == expected
    assert [(e.event, e.data, e.id) for e in fast.feed(b"data: next\n\n") + fast.close()] == \
        [(e.event, e.data, e.id) for e in slow.feed(b"data: next\n\n") + slow.close()]


@FUZZ
@given(events=st.lists(st.one_of(
    st.dictionaries(st.sampled_from(["text", "x", "finish_reason"]), st.text(max_size=8), max_size=3).map(
        lambda choice: b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n"),
    st.sampled_from([b"data: [DONE]\n\n", b": keep-alive\n\n", b"data: {\"choices\": []}\r\n\r\n",
                     b"data: {\"choices\": [{\"text\": \"\xff\xfe\"}]}\n\n", b"data: \n\n", b"data: 7\n\n",
                     b"event: error\ndata: boom\n\n", b"data: {\"a\":\ndata: 1}\n\n"])), max_size=8))
def test_the_answer_reader_reads_the_same_with_and_without_the_fast_path(events):
    """Every body, fast path or not: the same text, chunks, done, and the same error (one line)."""
    from tui.core.server.answer import AnswerReader
    from tui.core.server.wire import Completion

    def read(fast: bool):
        result = Completion()
        reader = AnswerReader(result, False, None)
        if not fast:
            reader.decoder = _Declining()
        try:
            for i, event in enumerate(events):
                reader.feed(event, i + 1, 0)
            reader.finish()
        except StreamError as exc:
            one_line(exc)
            return ("error", str(exc))
        return (result.text, result.chunks, reader.done, result.finish_reason)

    assert read(True) == read(False)
