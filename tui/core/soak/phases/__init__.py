"""One module per phase. Each has TITLE, plan(scenario) -> dict, and async run(requester, state)."""

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
