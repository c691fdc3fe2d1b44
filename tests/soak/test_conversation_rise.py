"""Conversation turns must resume from the turn before: the rise rule's one exception (conversation.py)."""

from types import SimpleNamespace

from tui.core.soak.phases.conversation import resumed_at_whole_previous


def turn(cached, hit=True):
    return SimpleNamespace(cached=cached, hit=hit)


def test_a_turn_at_the_whole_previous_prompts_grid_line_continues_it_even_without_a_rise():
    # CI, vllm-router before reference servers: turn 1 (1,384 tokens) reused all 1,376 of its own prompt,
    # written by its routed-away first send; turn 2 reused those 1,376: it continued turn 1
    assert resumed_at_whole_previous(turn(1376), turn(1376), 1376)
    assert not resumed_at_whole_previous(turn(1200), turn(1376), 1376)      # fell back below turn 1's prompt
    assert not resumed_at_whole_previous(turn(1376), turn(1200), 1376)      # turn 1 only had the memo: must rise
    assert not resumed_at_whole_previous(turn(1376, hit=False), turn(1376), 1376)
    assert not resumed_at_whole_previous(turn(None), turn(1376), 1376)      # unknown is never proof
    assert not resumed_at_whole_previous(turn(1376), turn(1376), None)      # no grid promise to hold it to
