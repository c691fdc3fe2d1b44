"""The registry: one module per phase, in the default scenario's order; a new phase is one module and
one line here. A phase module declares all of its phase (tui/core/README.md, "where to add"): TITLE,
Settings (its `[phases.NAME]` keys and defaults), MINIMUMS, check (relations between its keys), OPTIONAL
(not in the default list), plan(scenario) -> dict, async run(requester, state), Result (its typed part
of the summary, results.PhaseResult) and its report hooks (report/phase_facts.py); a phase that sizes many
memos at once may declare memos_ahead(scenario) (soak/memo_stock.py). The scenario schema
and the reports find them through config/phase_registry.py."""

from . import (agent_replay, cold_hit, control, conversation, determinism, eviction, long_prompt, mix, partition,
               restore, rotation, shared_concurrency)

PHASES = {
    "cold_hit": cold_hit,
    "conversation": conversation,
    "shared_concurrency": shared_concurrency,
    "rotation": rotation,
    "long_prompt": long_prompt,
    "determinism": determinism,
    "control": control,
    "agent_replay": agent_replay,
    "mix": mix,
    "restore": restore,
    "partition": partition,
    "eviction": eviction,
}
