"""What the Requester (and so every phase) may use of the run: the engine builds one and hands it over,
so the soak's parts never reach into the engine itself."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Awaitable, Callable

from ..config.scenario import Scenario
from ..evidence.codes import CodeBook, Registry
from ..log.events import CheckpointSeen, Event, ServerInfo
from ..report.power import EvidenceTally
from ..server.client import OpenAIClient
from ..server.metrics import MetricSnapshot
from ..server.replicas import ClusterSnapshot, ReplicaSet
from .record import DELTA_INTERVAL


@dataclass
class SoakContext:
    scenario: Scenario
    server: ServerInfo
    client: OpenAIClient
    emit: Callable[[Event], Event]
    nonce: str
    codes: CodeBook
    registry: Registry
    gate: asyncio.Event                                       # cleared: the soak pauses before its next request
    scrape: Callable[[], Awaitable[MetricSnapshot | None]]   # the server's metrics now, not recorded
    checkpoints_since: Callable[[float], list[CheckpointSeen]]
    checkpoints_seen: Callable[[], bool]                      # whether the server's log has shown any
    tally: EvidenceTally                                      # hits checked per kind of evidence
    metrics_available: bool
    # Behind a router (--replica): the replicas read directly, their counters, what each served;
    # and, when hitproof launched them, a way to restart one and the folder their slots are saved in.
    replicas: ReplicaSet | None = None
    replica_scrape: Callable[[], Awaitable[ClusterSnapshot]] | None = None
    restart_replica: Callable[[int], Awaitable[None]] | None = None
    slot_dir: str | None = None
    live_text_every: float = DELTA_INTERVAL                  # seconds between a streaming answer's deltas
