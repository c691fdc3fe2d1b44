"""checks/rehits.py: a deviation that never repeats, on every re-hit, while every cold run reproduces."""

from tui.core.checks.rehits import may_vary_on_hits, varies_on_hits

OFF, RIGHT, COLD = False, True, None       # a re-hit off its cold fingerprint, within what resuming costs, not a hit


def test_every_re_hit_off_while_every_cold_run_reproduces_varies():
    assert varies_on_hits(False, [OFF] * 5, cold_reproduced=5, reproduced=False, runs=5)


def test_one_re_hit_within_the_resume_cost_is_not_called_a_wrong_state():
    assert not varies_on_hits(False, [OFF, OFF, RIGHT, OFF, OFF], cold_reproduced=5, reproduced=False, runs=5)


def test_a_re_hit_the_cache_did_not_serve_leaves_it_open():
    assert not varies_on_hits(False, [OFF, OFF, COLD, OFF, OFF], cold_reproduced=5, reproduced=False, runs=5)
    assert not varies_on_hits(False, [OFF] * 4, cold_reproduced=5, reproduced=False, runs=5)   # one missing


def test_an_unsteady_cold_path_is_the_kernel():
    assert not varies_on_hits(False, [OFF] * 5, cold_reproduced=4, reproduced=False, runs=5)


def test_a_hit_within_the_resume_cost_or_a_repeated_deviation_is_judged_elsewhere():
    assert not varies_on_hits(True, [OFF] * 5, cold_reproduced=5, reproduced=False, runs=5)
    assert not varies_on_hits(False, [OFF] * 5, cold_reproduced=5, reproduced=True, runs=5)   # the twin's case


def test_the_judge_asks_where_hits_resumed_only_where_the_answer_can_be_yes():
    """may_vary_on_hits (the judge's gate before it walks each hit's lineage) is False only where varies_on_hits
    is False whatever the hits' answers are."""
    import itertools
    for cold, reproduced in itertools.product(range(6), (False, True)):
        for hit, *rehits in itertools.product((True, False), *[(True, False, None)] * 5):
            if varies_on_hits(hit, rehits, cold_reproduced=cold, reproduced=reproduced, runs=5):
                assert may_vary_on_hits(cold, reproduced, 5)
    assert may_vary_on_hits(5, False, 5) and not may_vary_on_hits(5, True, 5) and not may_vary_on_hits(4, False, 5)
