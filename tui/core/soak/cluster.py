"""The soak's view of several replicas behind a router: the engine hands this the target's replica
URLs and asks it to discover them, to probe how requests can be attributed, to scrape every
replica (each watched for restarts on its own), to restart one (the restore phase), and at the end
to judge whether the routing let every replica be checked."""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from ..config.errors import ServerProblem
from ..log.events import ReplicasJudged
from ..server.client import OpenAIClient
from ..server.discovery import Discovery, discover, probe_request
from ..server.metrics import MetricSnapshot
from ..server.replicas import (ClusterSnapshot, ReplicaSet, Signature, assign, distinct_models, header_naming,
                               named_by_response, replica_deltas)
from ..server.restarts import RestartWatch
from ..report.replicas import ReplicaFold

# how each request is attributed, in words for the summary
METHOD_WORDS = {
    "model": "the answer's model field (each replica serves under its own model id)",
    "header": "a response header naming the replica",
    "counter": "the replicas' counter deltas (the response names no replica)",
    "none": "nothing: the response names no replica and the replicas' counters could not single one out",
}


class ClusterView:
    def __init__(self, urls: list[str], *, router_metrics: str | None, timeout: float, restarts: RestartWatch,
                 restart: Callable[[int], Awaitable[None]] | None = None):
        self.set = ReplicaSet(urls, router_metrics=router_metrics, timeout=timeout)
        self.watches = [RestartWatch() for _ in urls]
        self.tally = ReplicaFold()       # fed every event by the engine
        self.main = restarts            # the engine's watch: a replica's restart ends the soak through it
        self._restart = restart
        self.method = ""                # model | header | counter | none
        self._restarting: set[int] = set()  # replicas being restarted on purpose: their counters go back
        self.words = ""

    @property
    def can_restart(self) -> bool:
        return self._restart is not None

    async def aclose(self) -> None:
        await self.set.aclose()

    async def discover(self, dialect: str | None) -> Discovery:
        """Every replica's model ids, then replica 0's own discovery (dialect, version, props, cache
        config): what a router answers for itself is not a server's (sglang-router answers
        /get_server_info and names its model "unknown"; vllm-router proxies one worker's /metrics)."""
        await self.set.discover()
        found = await discover(self.set.clients[0], dialect=dialect)
        self.set.set_dialect(found.dialect)
        return found

    async def scrape(self) -> ClusterSnapshot:
        """Every replica's counters (and the router's per-worker counts); each replica is watched for a
        restart on its own, and one ends the soak naming it."""
        snapshot = await self.set.scrape()
        for index, snap in snapshot.replicas.items():
            if index in self._restarting:
                continue
            why = self.watches[index].observe(snap)
            if why is not None:
                self.main.flag(f"{self.set.label(index)}: {why}")
                raise ServerProblem(self.main.message)
        return snapshot

    async def combined(self) -> MetricSnapshot | None:
        return (await self.scrape()).combined()

    async def restart(self, index: int) -> None:
        """Restart replica `index` on purpose (its counters start again from zero: not a restart to report)."""
        if self._restart is None:
            raise ServerProblem(f"{self.set.label(index)} cannot be restarted: hitproof did not launch it")
        self._restarting.add(index)
        try:
            await self._restart(index)
        finally:
            self.watches[index] = RestartWatch()
            self._restarting.discard(index)

    async def probe(self, client: OpenAIClient, api: str, model: str, nonce: str) -> str:
        """One tiny request alone through the router: the replica whose counters moved served it, and
        its response names that replica or not. Sets and returns the method (model | header | counter | none)."""
        before = await self.scrape()
        spec = probe_request(api, model, f"hitproof replica probe, run {nonce}.", f"hp-{nonce}-replica")
        try:
            completion = await client.stream(spec)
        except ServerProblem as exc:
            raise type(exc)(f"the replica probe before the first phase: {exc}") from None
        after = await self.scrape()
        deltas = replica_deltas(before, after)
        by_counter = None
        if deltas is not None:
            sig = Signature(completion.completion_tokens, completion.prompt_tokens, completion.cached_tokens)
            by_counter = assign({0: sig}, deltas).get(0)
        named = named_by_response(self.set.replicas, completion.model, completion.headers)
        if named.replica is not None and (by_counter is None or by_counter == named.replica):
            self.method = named.source
            header = header_naming(self.set.replicas, completion.headers) if named.source == "header" else None
            self.words = METHOD_WORDS[named.source] + (f" ({header})" if header else "")
            if by_counter is not None:
                self.words += f"; the probe's replica confirmed by its counters ({self.set.label(by_counter)})"
        elif by_counter is not None:
            self.method = "counter"
            self.words = METHOD_WORDS["counter"]
            if named.replica is not None:
                self.words += (f"; the response named {self.set.label(named.replica)} but the counters "
                               f"{self.set.label(by_counter)}: the response is not trusted")
            elif distinct_models(self.set.replicas):
                self.words += "; the replicas serve distinct model ids but the router rewrote the model field"
        else:
            self.method = "none"
            self.words = METHOD_WORDS["none"]
        return self.method

    def judge(self) -> ReplicasJudged:
        rows = self.tally.rows()
        ok, detail = self.tally.routing()
        return ReplicasJudged(attribution=self.words, rows=rows, unattributed=self.tally.unattributed,
                              routing_ok=ok, detail=detail)

    def server_facts(self) -> list[dict[str, Any]]:
        return self.set.facts()
