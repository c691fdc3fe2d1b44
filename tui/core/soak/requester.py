"""What phases use to run a soak: memos, request specs, sending (with the cold control arm and every
check through the Judge), request numbering and the records kept for isolation."""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any, Iterable

from ..checks.answers import ALL_JUDGES, evaluate
from ..config.errors import ServerProblem
from ..evidence.memos import Memo, build_memo, filler_text
from ..evidence.text import DETERMINISM_QUESTION, RECALL_QUESTION, SUMMARY_QUESTION, determinism_suffix, recall_suffix, summary_suffix
from ..evidence.codes import CodeOwner
from ..evidence.tokens import TokenCounter
from ..log.events import Finding, MemoPlanted, RequestFinished, RequestStarted, RoundStarted
from ..server.adapters import label_of
from ..server.client import RequestSpec
from ..server.prefix import prefix_text
from .context import SoakContext
from .judge import Judge
from .memo_stock import MemoStock
from ..server.replicas import ROUTER_SEND_FAILED, Served, Signature, named_by_response
from .proof import UNKNOWN, CacheProof, CounterWindows
from .record import DeltaCoalescer, Overlap, Record, concurrently, joined_prompt
from .writers import Writers
from .replica_proof import ReplicaWindows
from .state import PhaseState
from .tolerance import ColdTolerance

KEEP_RECENT = 512             # records kept for isolation beyond the flagged ones (bounded memory)


class Requester:
    """What phases use: make memos, send requests, judge them. It owns request numbering. It knows the run
    only through its SoakContext (no engine): the client, the event stream, the registry of codes, the
    pause gate, the server's metrics and checkpoint lines, the evidence tally."""

    def __init__(self, ctx: SoakContext, counter: TokenCounter):
        self.ctx = ctx
        self.counter = counter
        self.server = ctx.server
        self.scenario = ctx.scenario
        self.registry = ctx.registry
        self.emit = ctx.emit
        self.nonce = ctx.nonce
        server = ctx.server
        self._next_request = 0
        self._next_memo = 0
        self._next_salt = 0
        self._shared: Memo | None = None
        # Recent records, for isolation re-runs; flagged ones are kept for the whole run.
        self._recent: collections.OrderedDict[int, Record] = collections.OrderedDict()
        self._flagged: dict[int, Record] = {}
        self.writers = Writers()                  # the recent and flagged records, for writer_of
        self.judge = Judge(self)
        self.fingerprints = self.judge.fingerprints          # the run's cold fingerprints
        self.long_memo: Memo | None = None
        # Without per-request cached tokens, the server's counter is attributed to requests in
        # windows between quiet moments (tui.core.soak.proof).
        self.windows = (CounterWindows(ctx.scrape, server.cached_counter, server.cached_queries or None)
                        if server.cached_report == "counter" and server.cached_counter else None)
        # Behind a router: each request's replica, from the response or from the replicas' counters.
        self.replicas = ctx.replicas
        self.replica_windows = (ReplicaWindows(ctx.replica_scrape) if self.replicas is not None and ctx.replica_scrape
                                is not None and server.replica_attribution == "counter" else None)
        self._served_memos: dict[int, set[str]] = {}          # replica -> memo ids it has served
        self.overlap = Overlap()           # who streamed beside whom (any arm)
        self.cold_tolerance = ColdTolerance(self.counter, self.nonce, server.dialect)
        self.stock = MemoStock(self._draw_memo, self._size_memo, self.cold_tolerance.count_memos)

    # --- evidence --------------------------------------------------------------------------

    def fresh_salt(self) -> str:
        self._next_salt += 1
        return f"hp-{self.nonce}-{self._next_salt}"

    async def memo(self, state: PhaseState, *, tokens: int, with_code: bool = True, slot: int | None = None,
                   tag: str = "") -> Memo:
        return (await self.memos(state, [(tokens, slot, tag)], with_code=with_code))[0]

    async def memos(self, state: PhaseState, wanted: list[tuple[int, int | None, str]], *,
                    with_code: bool = True) -> list[Memo]:
        """A memo for each (tokens, slot, tag): from the stock when it was ordered ahead (memo_stock.py), else
        its id and code drawn now, in order; sized at once (a wide rotation's 128 memos are not sized one
        after another), planted in order."""
        jobs, fresh = [], []
        for tokens, _, tag in wanted:
            job = self.stock.take(tokens, tag, with_code)
            if job is None:
                memo_id, code = self._draw_memo(tag, with_code)
                fresh.append(memo_id)
                job = self._size_memo(memo_id, tokens, code)
            jobs.append(job)
        built = list(await asyncio.gather(*jobs, self.cold_tolerance.count_memos(fresh)))[:-1]
        for memo, (_, slot, _) in zip(built, wanted):
            self.register_memo(state, memo, slot=slot)
        return built

    def _draw_memo(self, tag: str, with_code: bool) -> tuple[str, str | None]:
        self._next_memo += 1
        return (f"m{self._next_memo:02d}{('-' + tag) if tag else ''}",
                self.new_code() if with_code and self.scenario.evidence.codes else None)

    async def _size_memo(self, memo_id: str, tokens: int, code: str | None) -> Memo:
        e = self.scenario.evidence
        return await build_memo(self.counter, memo_id=memo_id, nonce=self.nonce, code=code, target_tokens=tokens,
                                grid=self.server.grid, code_position=e.code_position, seed=self.scenario.seed,
                                code_position_max=e.code_position_max)

    def register_memo(self, state: PhaseState, memo: Memo, slot: int | None = None) -> None:
        """Put the memo's code in the registry and the memo on the event stream."""
        if memo.code:
            self.registry.register(CodeOwner(code=memo.code, memo=memo.memo_id, phase=state.name, slot=slot))
        self.emit(MemoPlanted(memo=memo.memo_id, phase=state.name, code=memo.code, tokens=memo.tokens,
                                     sizing=memo.sizing, code_offset=memo.code_offset,
                                     code_tokens=[memo.code_token_start, memo.code_token_end],
                                     grid=memo.grid, text=memo.text))

    async def filler(self, seed: str, tokens: int) -> str:
        return await filler_text(self.counter, seed=f"{self.scenario.seed}:{self.nonce}:{seed}",
                                 tokens=tokens)

    def record(self, request: int | None) -> Record | None:
        if request is None:
            return None
        return self._flagged.get(request) or self._recent.get(request)

    def writer_of(self, record: Record) -> Record | None:
        """The earlier request most likely to have written the prefix a hit resumed from (writers.py)."""
        return self.writers.writer_of(record)

    async def prefix_text(self, spec: RequestSpec, tokens: int) -> str | None:
        """The beginning of a completions prompt that is exactly `tokens` tokens, by the server's tokenizer."""
        if spec.prompt is None or self.replicas is not None:
            return None
        return await prefix_text(self.ctx.client, spec.prompt, spec.model or self.server.model, tokens)

    def _remember(self, record: Record) -> None:
        self._recent[record.request] = record
        self.writers.add(record)
        while len(self._recent) > KEEP_RECENT:
            request, _ = self._recent.popitem(last=False)
            if request not in self._flagged:
                self.writers.drop(request)

    def round(self, state: PhaseState, round_: int, rounds: int, assignment: dict[str, str]) -> float:
        """Announce a round; the run time it started at (seconds, as every event's t)."""
        return self.emit(RoundStarted(phase=state.name, round=round_, rounds=rounds, assignment=assignment)).t

    async def shared_memo(self, state: PhaseState) -> tuple[Memo, bool]:
        """The memo phases 1-3 share; (memo, True) the first time it is made (it is cold then)."""
        if self._shared is not None:
            return self._shared, False
        self._shared = await self.memo(state, tokens=self.scenario.evidence.memo_tokens, tag="shared")
        return self._shared, True

    async def redraw_shared_memo(self, state: PhaseState, attempt: int) -> Memo:
        """A fresh shared memo in place of one whose code the model missed cold (phases 2-3 get this one)."""
        self._shared = await self.memo(state, tokens=self.scenario.evidence.memo_tokens, tag=f"shared-recall{attempt}")
        return self._shared

    def question(self, context: str, kind: str, *, max_tokens: int | None = None,
                 salt: str | None = None, logprobs: int | None = None) -> RequestSpec:
        """A question about `context`: completion-style for base models, one user turn for chat."""
        e = self.scenario.evidence
        suffix, chat_question, default_max = {
            "recall": (recall_suffix(), f"{RECALL_QUESTION} Reply with the code only.", e.recall_max_tokens),
            "summary": (summary_suffix(), SUMMARY_QUESTION, e.summary_max_tokens),
            "determinism": (determinism_suffix(), DETERMINISM_QUESTION, e.summary_max_tokens),
        }[kind]
        max_tokens = max_tokens or default_max
        if self.scenario.api == "chat":
            return self.spec(messages=[{"role": "user", "content": f"{context}\n\n{chat_question}"}],
                             max_tokens=max_tokens, salt=salt, logprobs=logprobs)
        return self.spec(prompt=joined_prompt(context, suffix), max_tokens=max_tokens, salt=salt, logprobs=logprobs)

    def spec(self, *, prompt: str | None = None, messages: list | None = None, max_tokens: int,
             salt: str | None = None, stop: list[str] | None = None, logprobs: int | None = None) -> RequestSpec:
        s = self.scenario
        if s.evidence.fingerprints and logprobs is None:
            logprobs = s.evidence.fingerprint_top_k
            max_tokens = max(max_tokens, s.evidence.fingerprint_tokens)
        return RequestSpec(api="chat" if messages is not None else "completions", prompt=prompt,
                           messages=messages, max_tokens=max_tokens, temperature=s.sampling.temperature,
                           seed=s.sampling.seed, salt=salt, stop=stop, model=self.server.model, logprobs=logprobs)

    # --- sending -----------------------------------------------------------------------------

    async def send(self, state: PhaseState, spec: RequestSpec, *, task: str, memo: Memo | None = None,
                   slot: int | None = None, round: int | None = None, turn: int | None = None,
                   expect: str = "any", arm: str = "main", of_request: int | None = None,
                   judges: Iterable[str] = ALL_JUDGES, control: bool = True, replica: int | None = None,
                   fingerprints: bool = True) -> Record:
        """Send, check, judge. `control=False`: the phase runs its own control arm and judges
        hit-path problems and fingerprints itself (foreign codes, wrong tasks and cold checks are still
        judged here). `replica`: send to that replica directly instead of through the router.
        `fingerprints=False`: the phase compares log-probabilities itself (the partition phase, whose
        references are per identity).

        Behind a router, a request meant to hit that lands on a replica which never served its memo
        is a routing miss, not a cache miss: it is sent again (as a new request, judged as usual)
        until it reaches a replica that has the memo, at most once per other replica."""
        kw = dict(task=task, memo=memo, slot=slot, round=round, turn=turn, expect=expect, arm=arm,
                  of_request=of_request, judges=judges, control=control, replica=replica,
                  fingerprints=fingerprints)
        record = await self._via_router(state, spec, kw)
        retries = len(self.replicas) - 1 if self.replicas is not None and replica is None else 0
        while record.routed_away and expect == "hit" and arm == "main" and retries > 0:
            retries -= 1
            state.routing_misses += 1
            record = await self._via_router(state, spec, kw)
        return record

    async def _via_router(self, state: PhaseState, spec: RequestSpec, kw: dict) -> Record:
        """A router that could not send a request to its worker (HTTP 500 "error sending request for
        url": the worker had closed the keep-alive connection the router reused; the request never
        reached it) is asked once more; an info finding names the replica."""
        try:
            return await self._send_once(state, spec, **kw)
        except ServerProblem as exc:
            if self.replicas is None or kw["replica"] is not None or ROUTER_SEND_FAILED not in str(exc):
                raise
            who = next((r.index for r in self.replicas.replicas if r.hostport and r.hostport in str(exc)), None)
            self.finding(state, "router_send_failed", "info", replica=who,
                         detail=f"{exc}; sent again: the router could not send it to that replica (no answer "
                                f"was lost)")
            return await self._send_once(state, spec, **kw)

    async def _send_once(self, state: PhaseState, spec: RequestSpec, *, task: str, memo: Memo | None,
                         slot: int | None, round: int | None, turn: int | None, expect: str, arm: str,
                         of_request: int | None, judges: Iterable[str], control: bool,
                         replica: int | None, fingerprints: bool = True) -> Record:
        if arm != "isolation":               # isolation re-runs go alone while the soak waits
            await self.ctx.gate.wait()
        self._next_request += 1
        index = self._next_request
        # a copy: one spec may be sent by several slots at once, each send under its own id
        spec = spec.with_request_id(f"hitproof-{self.nonce}-{index}")
        emit = self.emit
        tail = (spec.prompt or (spec.messages or [{}])[-1].get("content", ""))[-160:]
        emit(RequestStarted(request=index, phase=state.name, slot=slot, round=round, turn=turn,
                            memo=memo.memo_id if memo else None, code=memo.code if memo else None,
                            task=task, arm=arm, of_request=of_request, salt=spec.salt, api=spec.api,
                            expect=expect, prompt_chars=spec.prompt_chars(), prompt_tail=tail,
                            max_tokens=spec.max_tokens, request_id=spec.request_id,
                            identity=label_of(spec.model, spec.extra, self.server.model, self.server.adapters)))
        on_text = DeltaCoalescer(emit, index, self.ctx.live_text_every)
        tolerance = await self.cold_tolerance.of(spec)
        sent_at = time.monotonic()
        window = await self.windows.enter() if self.windows is not None else None
        mark = self.overlap.enter()
        direct = replica is not None and self.replicas is not None
        rwindow = await self.replica_windows.enter() if self.replica_windows is not None and not direct else None
        client = self.replicas.clients[replica] if direct else self.ctx.client
        try:
            completion = await client.stream(spec, on_text, on_text.every)
        except ServerProblem as exc:                 # one line naming the request: "request 12 (rotation): ..."
            self._abandon(window, rwindow)
            where = f", sent to {self.replicas.label(replica)}" if direct else ""
            raise type(exc)(f"request {index} ({state.name}{where}): {exc}") from None
        except BaseException:
            self._abandon(window, rwindow)
            raise
        finally:
            company = self.overlap.leave(mark)
        served = await self._served(completion, rwindow, index, replica if direct else None)
        if completion.cached_tokens is not None:
            proof = CacheProof.reported(completion.cached_tokens)
            if window is not None:
                await self.windows.leave(window, index, completion.prompt_tokens, tolerance=tolerance)
        elif window is not None:
            proof = await self.windows.leave(window, index, completion.prompt_tokens, tolerance=tolerance)
        else:
            proof = UNKNOWN
        cached = proof.exact
        if self.ctx.checkpoints_seen():
            await self._await_checkpoint_line(sent_at, cached)
        # no last delta: RequestFinished carries the whole text (an answer shorter than DELTA_INTERVAL, most
        # of them, would otherwise be published twice: the event and its log line, per request)
        found = evaluate(completion.text, task, memo.code if memo else None, self.registry.codes(),
                         tuple(judges))
        if completion.notes:
            found["stream"] = completion.notes       # tolerated oddities (no [DONE] after the finish_reason)
        if memo is not None and cached and proof.source == "request" and self.server.grid_source == "server":
            found["block_aligned"] = cached % self.server.grid == 0
        checkpoint_lines = self.ctx.checkpoints_since(sent_at)
        restored = [c for c in checkpoint_lines if c.kind == "restored" and c.n_past == cached]
        if restored:
            found["checkpoint"] = {"restored": restored[0].n_past, "n_tokens": restored[0].n_tokens}
        reprocessed = [c for c in checkpoint_lines if c.kind == "full_reprocess"]
        if reprocessed and not cached:
            found["checkpoint"] = {"full_reprocess": reprocessed[0].line}
        record = Record(index, state.name, task, spec, memo, slot, round, turn, completion, found, proof, tolerance,
                        concurrent=mark[0], company=company, replica=served.replica,
                        replica_source=served.source)
        self._note_replica(record)
        emit(RequestFinished(request=index, phase=state.name, slot=slot, round=round, text=completion.text,
                             prompt_tokens=completion.prompt_tokens, cached_tokens=cached,
                             ttft=completion.ttft_s, total=completion.total_s,
                             output_tokens=completion.completion_tokens,
                             finish_reason=completion.finish_reason, checks=found,
                             logprobs=completion.logprobs, cached_source=proof.source,
                             cached_min=proof.low if proof.source != "unknown" else None,
                             cached_max=proof.high, cold_tolerance=tolerance, replica=served.replica,
                             replica_source=served.source, server_id=completion.server_id))
        state.note(record, arm)
        self._remember(record)
        if arm == "main":
            await self.judge.judge(state, record, expect, tuple(judges), control, fingerprints)
        return record

    def _abandon(self, window, rwindow) -> None:
        if window is not None:
            self.windows.abandon(window)
        if rwindow is not None:
            self.replica_windows.abandon(rwindow)

    async def _served(self, completion, rwindow, request: int, direct: int | None) -> Served:
        """The replica that served this answer: the one it was sent to, the one the response names,
        or the one the replicas' counters single out (None where nothing does)."""
        if rwindow is not None:
            signature = Signature(completion.completion_tokens, completion.prompt_tokens, completion.cached_tokens)
            index = await self.replica_windows.leave(rwindow, request, signature)
            return Served(index, "counter" if index is not None else "")
        if self.replicas is None:
            return Served(None)
        if direct is not None:
            return Served(direct, "direct")
        return named_by_response(self.replicas.replicas, completion.model, completion.headers)

    def _note_replica(self, record: Record) -> None:
        if self.replicas is None or record.replica is None or record.memo is None or record.replica_source == "direct":
            return
        served = self._served_memos.setdefault(record.replica, set())
        record.routed_away = not record.hit and record.memo.memo_id not in served and any(
            record.memo.memo_id in other for i, other in self._served_memos.items() if i != record.replica)
        served.add(record.memo.memo_id)
        if record.routed_away:
            record.checks["routing"] = {"replica": record.replica, "routed_away": True}

    async def _await_checkpoint_line(self, since: float, cached: int | None, wait: float = 0.5) -> None:
        """The server logs a hit's checkpoint restore before it answers, but its pipe is read
        apart from the answer: give the line a moment to arrive (a busy machine needs more)."""
        deadline = time.monotonic() + (wait if cached else wait / 5)
        while time.monotonic() < deadline:
            lines = self.ctx.checkpoints_since(since)
            if any((c.kind == "restored" and c.n_past == cached) or (not cached and c.kind == "full_reprocess")
                   for c in lines):
                return
            await asyncio.sleep(0.01)

    def finding(self, state: PhaseState, kind: str, severity: str, record: Record | None = None, *,
                offset: int | None = None, detail: str = "", replica: int | None = None, **evidence: Any) -> None:
        """Emit a finding (the engine counts it in the running phase); a flagged request's record is
        kept for the whole run, for isolation. It names the replica that served the record (or `replica`)."""
        if record is not None:
            record.findings.append((kind, severity))
            if severity in ("fail", "warn"):
                self._flagged[record.request] = record
                self.writers.add(record)
        self.emit(Finding(kind=kind, severity=severity, phase=state.name,
            slot=record.slot if record else None, round=record.round if record else None,
            request=record.request if record else None, offset=offset, detail=detail,
            memo=record.memo.memo_id if record and record.memo else None, evidence=evidence,
            replica=record.replica if record is not None and record.replica is not None else replica))

    # --- what phases may ask of the run -----------------------------------------------------------

    def new_code(self) -> str:
        return self.ctx.codes.new_code()

    @property
    def metrics_available(self) -> bool:
        return self.ctx.metrics_available

    async def scrape(self):     # the server's metrics now (not recorded as an event); None when it has none
        return await self.ctx.scrape()

    def checked(self, evidence: str) -> tuple[int, int]:
        """(hits checked with this kind of evidence so far, fail-class faults among them)."""
        return self.ctx.tally.checked[evidence], self.ctx.tally.failures[evidence]

    def note_indistinct(self, state: PhaseState, a, b, record: Record | None) -> None:
        self.judge.note_indistinct(state, a, b, record)

    def fingerprint_verdict(self, record: Record) -> str | None:
        return self.judge.fingerprint_verdict(record)


async def run_round(rq: Requester, state: PhaseState, round_: int, rounds: int, slots: int, memo_of, one) -> list:
    """One round of a concurrent phase: announce which memo each slot gets, send every slot at once."""
    rq.round(state, round_, rounds, {str(slot): memo_of(slot).memo_id for slot in range(slots)})
    return await concurrently(*(one(slot, round_) for slot in range(slots)))
