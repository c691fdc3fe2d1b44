"""The collector's settings during a soak (tui/runner/collector.py): set for the soak, restored after it,
once for soaks that overlap in one process."""

from __future__ import annotations

import gc

from tui.runner.collector import SOAK_THRESHOLDS, soak_collector


def test_a_soak_freezes_start_up_and_raises_the_threshold_then_puts_both_back():
    before = gc.get_threshold()
    kept = [object() for _ in range(10)]          # noqa: F841  (alive before the soak)
    with soak_collector():
        assert gc.get_threshold() == SOAK_THRESHOLDS
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_overlapping_soaks_restore_only_when_the_last_one_ends():
    before = gc.get_threshold()
    with soak_collector():
        with soak_collector():
            assert gc.get_threshold() == SOAK_THRESHOLDS
        assert gc.get_threshold() == SOAK_THRESHOLDS and gc.get_freeze_count() > 0
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
