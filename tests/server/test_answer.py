"""AnswerReader: reads before the first text parsed as they come (the time to first token), later reads
kept and parsed together, at the end and at most every TEXT_EVERY_NS for a live listener; the same text,
chunks, log-probabilities and errors however the body is cut."""

import json

import pytest

from tui.core.server.answer import TEXT_EVERY_NS, AnswerReader, StreamError
from tui.core.server.wire import Completion

MS = 1_000_000


def sse(*objs) -> bytes:
    return b"".join(b"data: " + json.dumps(o).encode() + b"\n\n" for o in objs) + b"data: [DONE]\n\n"


def chunk(text, finish=None, logprob=None):
    choice = {"index": 0, "text": text, "finish_reason": finish}
    if logprob is not None:
        choice["logprobs"] = {"tokens": [text], "token_logprobs": [logprob], "top_logprobs": [{text: logprob}]}
    return {"choices": [choice]}


def read(reads: list[tuple[bytes, int]], on_text=None) -> tuple[Completion, AnswerReader]:
    result = Completion()
    reader = AnswerReader(result, False, on_text)
    for raw, arrived in reads:
        reader.feed(raw, arrived, 0)
    reader.finish()
    return result, reader


def test_the_first_text_is_stamped_with_its_own_read_and_told_at_once():
    role_only = b'data: {"choices": [{"index": 0, "text": ""}]}\n\n'
    first, second = sse(chunk(" 7395", logprob=-0.5)).split(b"data: [DONE]")[0], sse(chunk("-2841", "length"))
    seen = []
    result, reader = read([(role_only, 5 * MS), (first, 9 * MS), (second, 12 * MS)], seen.append)
    assert result.ttft_s == 0.009                   # the read with text, not the first read
    assert result.first_byte_s == 0.005             # the first read, text or not
    assert seen == [" 7395"]                        # what came 3 ms later waits for the end
    assert result.text == " 7395-2841" and result.chunks == 3 and reader.done
    assert result.finish_reason == "length" and result.logprobs == [[" 7395", -0.5, [[" 7395", -0.5]]]]


def test_a_listener_gets_the_text_at_most_every_interval_and_the_end_is_the_completions_alone():
    pieces = [b"data: " + json.dumps(chunk(f" w{i}")).encode() + b"\n\n" for i in range(6)] + [b"data: [DONE]\n\n"]
    step = TEXT_EVERY_NS // 2
    seen = []
    arrivals = [(i + 1) * step for i in range(6)] + [6 * step + 1]       # [DONE] right after w5
    result, reader = read(list(zip(pieces, arrivals)), seen.append)
    # w0 at once (the first text); w1 half an interval later waits; w2 an interval after w0: w1 and w2 together;
    # w5 and [DONE] come within the interval: parsed at the end, for the Completion only
    assert seen == [" w0", " w1 w2", " w3 w4"]
    assert result.text == " w0 w1 w2 w3 w4 w5" and reader.done


def test_a_slower_pace_holds_the_reads_longer_and_tells_the_listener_less_often():
    """A headless run's pace (tui.headless.LIVE_TEXT_UNWATCHED: 1 s): the same reads as at the app's pace
    give the listener only the first text, and the reader holds later reads until a second after it."""
    pieces = [b"data: " + json.dumps(chunk(f" w{i}")).encode() + b"\n\n" for i in range(6)] + [b"data: [DONE]\n\n"]
    step = TEXT_EVERY_NS // 2
    arrivals = [(i + 1) * step for i in range(6)] + [6 * step + 1]
    seen = []
    result = Completion()
    reader = AnswerReader(result, False, seen.append, 10 * TEXT_EVERY_NS)
    for raw, arrived in zip(pieces, arrivals):
        reader.feed(raw, arrived, 0)
        if result.ttft_s is not None:
            assert reader.hold_until() == step + 10 * TEXT_EVERY_NS       # a second after the first text
    reader.finish()
    assert seen == [" w0"] and result.text == " w0 w1 w2 w3 w4 w5" and reader.done


@pytest.mark.parametrize("cut", [1, 3, 7, 64])
def test_the_same_answer_however_the_body_is_cut(cut):
    body = sse(chunk(" a", logprob=-1.0), chunk(" b", logprob=-2.0), chunk(" c", "stop", logprob=-3.0),
               {"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 3,
                                         "prompt_tokens_details": {"cached_tokens": 32}}})
    result, reader = read([(body[i:i + cut], i) for i in range(0, len(body), cut)])
    whole, _ = read([(body, 0)])
    assert (result.text, result.chunks, result.logprobs, result.cached_tokens, result.prompt_tokens) == \
        (whole.text, whole.chunks, whole.logprobs, whole.cached_tokens, whole.prompt_tokens) == \
        (" a b c", 4, whole.logprobs, 32, 40)
    assert [p[0] for p in result.logprobs] == [" a", " b", " c"] and reader.done


def test_a_malformed_chunk_after_the_first_text_is_still_an_error():
    good = sse(chunk(" a")).split(b"data: [DONE]")[0]
    with pytest.raises(StreamError, match="malformed stream chunk"):
        read([(good, 1 * MS), (b"data: {not json\n\n", 2 * MS), (b"data: [DONE]\n\n", 3 * MS)])
    with pytest.raises(StreamError, match="server error in stream"):
        read([(good, 1 * MS), (b"event: error\ndata: overloaded\n\n", 2 * MS)])


@pytest.mark.parametrize("data", [
    {"tokens": [" a"], "token_logprobs": [-0.5], "top_logprobs": [{" a": -0.5, " b": -1.0}]},
    {"tokens": [" a"], "token_logprobs": [], "top_logprobs": []},
    {"tokens": [" a"]},
    {"tokens": [" a"], "token_logprobs": [None], "top_logprobs": [None]},
])
def test_one_token_logprobs_read_as_the_loop_reads_them(data):
    """A streamed chunk's one token (the shortcut) reads as the same token among others would."""
    from tui.core.server.wire import parse_logprobs

    two = {"tokens": data["tokens"] * 2, "token_logprobs": (data.get("token_logprobs") or [None]) * 2,
           "top_logprobs": (data.get("top_logprobs") or [None]) * 2}
    assert parse_logprobs(data) == parse_logprobs(two)[:1]
