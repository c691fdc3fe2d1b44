"""Sending one request and judging it: checks, findings, and the cold control arm.

A fail-class finding needs the hit path wrong where the cold path of the same request is
right; the cold path is learned by re-sending the request under a fresh salt. A foreign
code needs no control: no cold path can produce a code the request never saw.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import time
import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

import orjson

from . import checks
from .client import Completion, RequestSpec
from .errors import ServerProblem
from .events import (AnswerDelta, Finding, FingerprintCompared, MemoPlanted, RequestFinished, RequestStarted, RoundStarted,
                     ServerInfo)
from .evidence import (DETERMINISM_QUESTION, RECALL_QUESTION, SUMMARY_QUESTION, CodeOwner, determinism_suffix,
                       recall_suffix, summary_suffix)
from .memos import Memo, build_memo, filler_text
from .metrics import PREEMPTIONS, PREFIX_QUERIES, MetricSnapshot, cached_tokens_delta, delta
from .tokens import TokenCounter

if TYPE_CHECKING:
    from .engine import SoakEngine

DELTA_INTERVAL = 0.1          # seconds between coalesced answer deltas per request
KEEP_RECENT = 512             # records kept for isolation beyond the flagged ones (bounded memory)
ALL_JUDGES = ("foreign", "recall", "empty", "repetition", "wrong_task")


class DeltaCoalescer:
    """The answer text as it streams, emitted as AnswerDelta events at most every DELTA_INTERVAL
    seconds per request (the UI never gets one event per token). Call it with each piece of text;
    flush() emits what is left when the stream ends."""

    __slots__ = ("emit", "request", "pending", "last")

    def __init__(self, emit, request: int):
        self.emit = emit
        self.request = request
        self.pending: list[str] = []
        self.last = time.monotonic()

    def __call__(self, text: str) -> None:
        pending = self.pending
        pending.append(text)
        now = time.monotonic()
        if now - self.last >= DELTA_INTERVAL:
            self.emit(AnswerDelta(request=self.request, text="".join(pending)))
            pending.clear()
            self.last = now

    def flush(self) -> None:
        if self.pending:
            self.emit(AnswerDelta(request=self.request, text="".join(self.pending)))
            self.pending.clear()


@dataclass
class Record:
    request: int
    phase: str
    task: str
    spec: RequestSpec
    memo: Memo | None
    slot: int | None
    round: int | None
    turn: int | None
    completion: Completion
    checks: dict[str, Any]

    @property
    def text(self) -> str:
        return self.completion.text

    @property
    def cached(self) -> int | None:
        return self.completion.cached_tokens

    @property
    def hit(self) -> bool:
        return bool(self.completion.cached_tokens)


@dataclass
class PhaseState:
    """What a phase has seen, as running totals: a night-long phase keeps its memory flat."""

    name: str
    requests: int = 0                 # main arm
    hit_count: int = 0
    unknown_cached: int = 0           # main-arm requests whose server did not report cached tokens
    cached_tokens: int = 0
    prompt_tokens: int = 0
    control_requests: int = 0
    reported_cached: int = 0          # main + control + isolation, for the metric comparison
    reported_unknown: bool = False
    ttft_cold: list[float] = field(default_factory=list)
    ttft_hit: list[float] = field(default_factory=list)
    last: Record | None = None
    inconclusive: list[str] = field(default_factory=list)
    findings: dict[str, int] = field(default_factory=lambda: {"fail": 0, "warn": 0, "info": 0})
    expected_hits: int = 0
    cold_failures: int = 0
    model_failures: int = 0
    hits_required: bool = True
    metrics_before: MetricSnapshot | None = None
    metrics_after: MetricSnapshot | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    finished: bool = False

    def note(self, record: Record, arm: str) -> None:
        if record.cached is None:
            self.reported_unknown = True
        else:
            self.reported_cached += record.cached
        if arm != "main":
            self.control_requests += arm == "control"
            return
        self.requests += 1
        self.last = record
        self.cached_tokens += record.cached or 0
        self.prompt_tokens += record.completion.prompt_tokens or 0
        ttft = record.completion.ttft_s
        if record.cached is None:
            self.unknown_cached += 1
        elif record.hit:
            self.hit_count += 1
            if ttft:
                self.ttft_hit.append(ttft)
        elif ttft:
            self.ttft_cold.append(ttft)

    @property
    def fail_findings(self) -> int:
        return self.findings["fail"]

    def mark_inconclusive(self, reason: str) -> None:
        if reason not in self.inconclusive:
            self.inconclusive.append(reason)

    def status(self) -> tuple[str, list[str]]:
        reasons = list(self.inconclusive)
        if self.hits_required and self.requests and not self.hit_count and not self.unknown_cached:
            reasons.append("no request got a cache hit")
        if self.fail_findings:
            return "fail", reasons
        return ("inconclusive", reasons) if reasons else ("pass", [])

    def summary(self) -> dict[str, Any]:
        reported_sum = None if self.reported_unknown else self.reported_cached
        metric_hits = cached_tokens_delta(self.metrics_before, self.metrics_after)
        summary = {
            "requests": self.requests,
            "control_requests": self.control_requests,
            "hits": self.hit_count,
            "expected_hits": self.expected_hits,
            "cached_tokens": self.cached_tokens,
            "prompt_tokens": self.prompt_tokens,
            "ttft_cold_ms": _ms(statistics.median(self.ttft_cold)) if self.ttft_cold else None,
            "ttft_hit_ms": _ms(statistics.median(self.ttft_hit)) if self.ttft_hit else None,
            "cold_failures": self.cold_failures,
            "model_failures": self.model_failures,
            "findings": dict(self.findings),
            "metrics": {
                "prefix_cache_queries": delta(self.metrics_before, self.metrics_after, PREFIX_QUERIES),
                "prefix_cache_hits": metric_hits,
                "preemptions": delta(self.metrics_before, self.metrics_after, PREEMPTIONS),
            },
            "reported_cached_tokens": reported_sum,
            "hits_agree": (None if metric_hits is None or reported_sum is None
                           else int(metric_hits) == reported_sum),
        }
        summary.update(self.extra)
        return summary


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


class Requester:
    """What phases use: make memos, send requests, judge them. It owns request numbering."""

    def __init__(self, engine: SoakEngine, counter: TokenCounter, server: ServerInfo):
        self.engine = engine
        self.counter = counter
        self.server = server
        self.scenario = engine.scenario
        self._next_request = 0
        self._next_memo = 0
        self._next_salt = 0
        self._shared: Memo | None = None
        # Recent records, for isolation re-runs; flagged ones are kept for the whole run.
        self._recent: collections.OrderedDict[int, Record] = collections.OrderedDict()
        self._flagged: dict[int, Record] = {}
        self.fingerprints: dict[str, Fingerprint] = {}      # prompt key -> its cold run
        self._fingerprint_notes: set[str] = set()
        self.long_memo: Memo | None = None
        # llama.cpp matches prompts token by token: a fresh memo still shares the first few
        # tokens ("<bos>Memo") with whatever its slot held, so "cold" allows those.
        self.cold_tolerance = 8 if server.dialect == "llamacpp" else 0

    # --- evidence --------------------------------------------------------------------------

    def fresh_salt(self) -> str:
        self._next_salt += 1
        return f"hp-{self.engine.nonce}-{self._next_salt}"

    async def memo(self, state: PhaseState, *, tokens: int, with_code: bool = True, slot: int | None = None,
                   tag: str = "") -> Memo:
        self._next_memo += 1
        memo_id = f"m{self._next_memo:02d}{('-' + tag) if tag else ''}"
        code = self.engine.codes.new_code() if with_code and self.scenario.evidence.codes else None
        memo = await build_memo(self.counter, memo_id=memo_id, nonce=self.engine.nonce, code=code,
                                target_tokens=tokens, grid=self.server.grid,
                                code_position=self.scenario.evidence.code_position, seed=self.scenario.seed)
        self.register_memo(state, memo, slot=slot)
        return memo

    def register_memo(self, state: PhaseState, memo: Memo, slot: int | None = None) -> None:
        """Put the memo's code in the registry and the memo on the event stream."""
        if memo.code:
            self.engine.registry.register(CodeOwner(code=memo.code, memo=memo.memo_id, phase=state.name, slot=slot))
        self.engine.emit(MemoPlanted(memo=memo.memo_id, phase=state.name, code=memo.code, tokens=memo.tokens,
                                     sizing=memo.sizing, code_offset=memo.code_offset,
                                     code_tokens=[memo.code_token_start, memo.code_token_end],
                                     grid=memo.grid, text=memo.text))

    async def filler(self, seed: str, tokens: int) -> str:
        return await filler_text(self.counter, seed=f"{self.scenario.seed}:{self.engine.nonce}:{seed}",
                                 tokens=tokens)

    def record(self, request: int | None) -> Record | None:
        if request is None:
            return None
        return self._flagged.get(request) or self._recent.get(request)

    def _remember(self, record: Record) -> None:
        self._recent[record.request] = record
        while len(self._recent) > KEEP_RECENT:
            self._recent.popitem(last=False)

    def round(self, state: PhaseState, round_: int, rounds: int, assignment: dict[str, str]) -> None:
        self.engine.emit(RoundStarted(phase=state.name, round=round_, rounds=rounds, assignment=assignment))

    async def shared_memo(self, state: PhaseState) -> tuple[Memo, bool]:
        """The memo phases 1-3 share; (memo, True) the first time it is made (it is cold then)."""
        if self._shared is not None:
            return self._shared, False
        self._shared = await self.memo(state, tokens=self.scenario.evidence.memo_tokens, tag="shared")
        return self._shared, True

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
        return self.spec(prompt=context + suffix, max_tokens=max_tokens, salt=salt, logprobs=logprobs)

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
                   judges: Iterable[str] = ALL_JUDGES, control: bool = True) -> Record:
        """Send, check, judge. `control=False`: the phase runs its own control arm and judges
        hit-path problems itself (foreign codes, wrong tasks and cold checks are still judged here)."""
        if arm != "isolation":               # isolation re-runs go alone while the soak waits
            await self.engine.gate.wait()
        self._next_request += 1
        index = self._next_request
        emit = self.engine.emit
        tail = (spec.prompt or (spec.messages or [{}])[-1].get("content", ""))[-160:]
        emit(RequestStarted(request=index, phase=state.name, slot=slot, round=round, turn=turn,
                            memo=memo.memo_id if memo else None, code=memo.code if memo else None,
                            task=task, arm=arm, of_request=of_request, salt=spec.salt, api=spec.api,
                            expect=expect, prompt_chars=spec.prompt_chars(), prompt_tail=tail,
                            max_tokens=spec.max_tokens))
        on_text = DeltaCoalescer(emit, index)
        sent_at = time.monotonic()
        try:
            completion = await self.engine.client.stream(spec, on_text)
        except ServerProblem as exc:                 # one line naming the request: "request 12 (rotation): ..."
            raise type(exc)(f"request {index} ({state.name}): {exc}") from None
        if self.engine.checkpoints:
            await self._await_checkpoint_line(sent_at, completion.cached_tokens)
        on_text.flush()
        found = evaluate(completion.text, task, memo.code if memo else None, self.engine.registry.codes(),
                         tuple(judges))
        if completion.notes:
            found["stream"] = completion.notes       # tolerated oddities (no [DONE] after the finish_reason)
        if memo is not None and completion.cached_tokens and self.server.grid_source == "server":
            found["block_aligned"] = completion.cached_tokens % self.server.grid == 0
        checkpoint_lines = self.engine.checkpoints_since(sent_at)
        restored = [c for c in checkpoint_lines if c.kind == "restored" and c.n_past == completion.cached_tokens]
        if restored:
            found["checkpoint"] = {"restored": restored[0].n_past, "n_tokens": restored[0].n_tokens}
        reprocessed = [c for c in checkpoint_lines if c.kind == "full_reprocess"]
        if reprocessed and not completion.cached_tokens:
            found["checkpoint"] = {"full_reprocess": reprocessed[0].line}
        emit(RequestFinished(request=index, phase=state.name, slot=slot, round=round, text=completion.text,
                             prompt_tokens=completion.prompt_tokens, cached_tokens=completion.cached_tokens,
                             ttft=completion.ttft_s, total=completion.total_s,
                             output_tokens=completion.completion_tokens,
                             finish_reason=completion.finish_reason, checks=found,
                             logprobs=completion.logprobs))
        record = Record(index, state.name, task, spec, memo, slot, round, turn, completion, found)
        state.note(record, arm)
        self._remember(record)
        if arm == "main":
            await self._judge(state, record, expect, tuple(judges), control)
        return record

    async def _await_checkpoint_line(self, since: float, cached: int | None, wait: float = 0.5) -> None:
        """The server logs a hit's checkpoint restore before it answers, but its pipe is read
        apart from the answer: give the line a moment to arrive (a busy machine needs more)."""
        deadline = time.monotonic() + (wait if cached else wait / 5)
        while time.monotonic() < deadline:
            lines = self.engine.checkpoints_since(since)
            if any((c.kind == "restored" and c.n_past == cached) or (not cached and c.kind == "full_reprocess")
                   for c in lines):
                return
            await asyncio.sleep(0.01)

    # --- judging -------------------------------------------------------------------------------

    def finding(self, state: PhaseState, kind: str, severity: str, record: Record | None = None, *,
                offset: int | None = None, detail: str = "", **evidence: Any) -> None:
        state.findings[severity] += 1
        if record is not None and severity in ("fail", "warn"):
            self._flagged[record.request] = record
        self.engine.emit(Finding(
            kind=kind, severity=severity, phase=state.name,
            slot=record.slot if record else None, round=record.round if record else None,
            request=record.request if record else None, offset=offset, detail=detail,
            memo=record.memo.memo_id if record and record.memo else None, evidence=evidence))

    async def _judge(self, state: PhaseState, record: Record, expect: str, judges: tuple[str, ...],
                     control: bool = True) -> None:
        c = record.checks
        for foreign in c.get("foreign", []):
            whole = foreign["groups"] >= 2
            self.finding(state, "foreign_code", "fail" if whole else "warn", record, offset=foreign["offset"],
                         detail=(f"answer carries {'code' if whole else 'one group of code'} {foreign['code']} "
                                 f"owned by memo {foreign['owner']} at offset {foreign['offset']}"),
                         code=foreign["code"], owner=foreign["owner"], matched=foreign["matched"])
        if c.get("wrong_task") is not None:
            self.finding(state, "wrong_task", "warn", record, offset=c["wrong_task"],
                         detail=f"a {record.task} request answered with its own code (a candidate fluke, not a leak)")
        if expect == "cold" and record.cached is not None and record.cached > self.cold_tolerance:
            state.mark_inconclusive(f"request {record.request} should be cold but had {record.cached} cached tokens")
            self.finding(state, "cold_not_cold", "warn", record,
                         detail=f"expected a cold request, got {record.cached} cached tokens")
        if expect == "hit":
            state.expected_hits += 1
            miss = (c.get("checkpoint") or {}).get("full_reprocess")
            if miss and not record.cached:
                self.finding(state, "checkpoint_miss", "info", record,
                             detail="a shared prefix got no hit: the server had no usable checkpoint inside it "
                                    "(neither a pass nor a fail)", line=miss)
        if self.scenario.evidence.fingerprints and record.memo is not None:
            await self._judge_fingerprint(state, record)
        problems = hit_path_problems(c)
        if not problems or not control:
            return
        if record.cached is not None and record.cached <= self.cold_tolerance:
            state.cold_failures += 1
            # A model that cannot give its own code back cold proves nothing by recall; one that
            # loops or stops on its own still leaves the other evidence (codes elsewhere, fingerprints).
            if expect == "cold" and any(kind == "recall_miss" for kind, _, _ in problems):
                state.mark_inconclusive(f"cold baseline failed on request {record.request} (recall_miss)")
            for kind, offset, detail in problems:
                self.finding(state, kind, "info", record, offset=offset,
                             detail=f"{detail}; on a cold request (no hit): the model, not the cache")
            return
        control = await self.send(state, dataclasses.replace(record.spec, salt=self.fresh_salt()),
                                  task=record.task, memo=record.memo, slot=record.slot, round=record.round,
                                  turn=record.turn, expect="cold", arm="control", of_request=record.request,
                                  judges=judges)
        control_problems = {kind for kind, _, _ in hit_path_problems(control.checks)}
        control_cold = control.cached is None or control.cached <= self.cold_tolerance
        for foreign in control.checks.get("foreign", []):
            self.finding(state, "foreign_code", "fail", control, offset=foreign["offset"],
                         detail=f"the cold control carries code {foreign['code']} of memo {foreign['owner']}",
                         code=foreign["code"], owner=foreign["owner"])
        for kind, offset, detail in problems:
            if not control_cold:
                self.finding(state, kind, "warn", record, offset=offset,
                             detail=f"{detail}; no cold control possible (the salted re-send had "
                                    f"{control.cached} cached tokens)", control_request=control.request)
            elif kind in control_problems:
                state.model_failures += 1
                self.finding(state, kind, "info", record, offset=offset,
                             detail=f"{detail}; the cold control (request {control.request}) fails the same "
                                    f"way: the model, not the cache", control_request=control.request)
            else:
                self.finding(state, kind, "fail", record, offset=offset,
                             detail=f"{detail} on a hit ({record.cached} cached tokens), while the cold "
                                    f"control (request {control.request}) is right",
                             control_request=control.request, cached_tokens=record.cached,
                             control_text=control.text[:400])

    # --- fingerprints ------------------------------------------------------------------------

    async def _cold_fingerprint(self, state: PhaseState, record: Record) -> Fingerprint | None:
        """The cold run of this exact prompt: this record if it was cold, else one more request."""
        key = prompt_key(record.spec)
        if key in self.fingerprints:
            return self.fingerprints[key]
        if record.cached is not None and record.cached <= self.cold_tolerance:
            source = record
        else:
            source = await self.send(state, dataclasses.replace(record.spec, salt=self.fresh_salt()),
                                     task=record.task, memo=record.memo, slot=record.slot, round=record.round,
                                     turn=record.turn, expect="cold", arm="control", of_request=record.request)
            if source.cached and source.cached > self.cold_tolerance:
                return None                      # no cold run to be had: cold_not_cold was reported
        if not source.completion.logprobs:
            self._note_once(state, "no_logprobs", "the server returned no log-probabilities: fingerprints "
                            "cannot be compared", record)
            return None
        fingerprint = Fingerprint(record.memo.memo_id, record.task, source.request, source.completion.logprobs)
        self.fingerprints[key] = fingerprint
        self._check_distinct(state, fingerprint, record)
        return fingerprint

    def _check_distinct(self, state: PhaseState, new: Fingerprint, record: Record) -> None:
        e = self.scenario.evidence
        for other in self.fingerprints.values():
            if other.memo == new.memo or other.task != new.task:
                continue
            if checks.fingerprint_match(new.logprobs, other.logprobs, e.fingerprint_tokens).matches(
                    e.fingerprint_tolerance):
                self._note_once(state, f"indistinct:{state.name}",
                                f"memos {other.memo} and {new.memo} have the same fingerprint (requests "
                                f"{other.request} and {new.request}): leak detection by fingerprint is inconclusive "
                                f"in this phase", record, inconclusive=True)

    def _note_once(self, state: PhaseState, key: str, detail: str, record: Record, inconclusive: bool = False) -> None:
        if key in self._fingerprint_notes:
            return
        self._fingerprint_notes.add(key)
        if inconclusive:
            state.mark_inconclusive(detail)
        self.finding(state, "fingerprint_indistinct" if inconclusive else "fingerprint_unavailable", "info",
                     record, detail=detail)

    async def _judge_fingerprint(self, state: PhaseState, record: Record) -> None:
        e = self.scenario.evidence
        own = await self._cold_fingerprint(state, record)
        if own is None or not record.hit or own.request == record.request:
            return
        run = record.completion.logprobs
        mine = checks.fingerprint_match(run, own.logprobs, e.fingerprint_tokens)
        others = {fp.memo: checks.fingerprint_match(run, fp.logprobs, e.fingerprint_tokens)
                  for fp in self.fingerprints.values() if fp.task == record.task and fp.memo != own.memo}
        verdict, owner = checks.classify_fingerprint(mine, others, e.fingerprint_tolerance, e.fingerprint_tokens)
        record.checks["fingerprint"] = {"verdict": verdict, "own_distance": mine.distance,
                                        "own_agreeing": mine.agreeing, "closest": owner}
        self.engine.emit(FingerprintCompared(request=record.request, own_request=own.request, verdict=verdict,
                                             agreeing=mine.agreeing, distance=mine.distance, closest=owner))
        if verdict == "match":
            return
        indistinct = any(key.startswith("indistinct:") and key.endswith(state.name) for key in self._fingerprint_notes)
        if verdict == "foreign_state" and not indistinct:
            theirs = others[owner]
            self.finding(state, "foreign_state", "fail", record,
                         detail=(f"the hit's continuation is closer to memo {owner}'s cold fingerprint ({theirs.agreeing} "
                                 f"tokens agree, log-probabilities within {theirs.distance:.4f}) than to its own "
                                 f"({mine.agreeing} tokens, {mine.distance:.4f}): another request's state"),
                         owner=owner, own_request=own.request, own_distance=mine.distance,
                         owner_distance=theirs.distance)
            return
        # Differs from its own fingerprint. Fail only if both paths reproduce themselves: a second cold
        # run matches the fingerprint and a second hit repeats the same deviation. Kernel
        # nondeterminism (top-k ties, batch-dependent numerics) does neither reliably.
        again = await self.send(state, dataclasses.replace(record.spec, salt=self.fresh_salt()), task=record.task,
                                memo=record.memo, slot=record.slot, round=record.round, turn=record.turn,
                                expect="cold", arm="control", of_request=record.request)
        rehit = await self.send(state, record.spec, task=record.task, memo=record.memo, slot=record.slot,
                                round=record.round, turn=record.turn, expect="hit", arm="control",
                                of_request=record.request)
        cold_again = checks.fingerprint_match(again.completion.logprobs, own.logprobs, e.fingerprint_tokens)
        hit_again = checks.fingerprint_match(rehit.completion.logprobs, run, e.fingerprint_tokens)
        where = f"first {mine.agreeing} tokens agree, log-probabilities {mine.distance:.4f} apart"
        evidence = dict(own_request=own.request, control_request=again.request, rehit_request=rehit.request,
                        own_distance=mine.distance)
        if cold_again.matches(e.fingerprint_tolerance) and rehit.hit and hit_again.matches(e.fingerprint_tolerance):
            self.finding(state, "fingerprint_mismatch", "fail", record,
                         detail=(f"the hit differs from its own cold fingerprint ({where}); a second cold run "
                                 f"(request {again.request}) reproduces the fingerprint and a second hit (request "
                                 f"{rehit.request}) the deviation: corruption on the hit path"), **evidence)
        else:
            why = ("the second cold run differs from the fingerprint too" if not cold_again.matches(e.fingerprint_tolerance)
                   else "the second hit does not repeat the deviation")
            self.finding(state, "fingerprint_mismatch", "info", record,
                         detail=f"the hit differs from its cold fingerprint ({where}), but {why}: "
                                f"not reproducible, the kernel rather than the cache", **evidence)

async def concurrently(*coroutines):
    """gather() that cancels the siblings when one fails, so no slot outlives the phase."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


@dataclass(frozen=True)
class Fingerprint:
    memo: str
    task: str
    request: int
    logprobs: list[list]


def prompt_key(spec: RequestSpec) -> str:
    body = spec.prompt if spec.prompt is not None else orjson.dumps(spec.messages).decode()
    return hashlib.sha1(body.encode()).hexdigest()


def evaluate(text: str, task: str, code: str | None, registry: dict[str, str],
             judges: tuple[str, ...] = ALL_JUDGES) -> dict[str, Any]:
    """All checks of one answer, as plain data for the event stream."""
    found: dict[str, Any] = {}
    if "foreign" in judges:
        found["foreign"] = [dataclasses.asdict(f) for f in checks.find_foreign_codes(text, registry, code)]
    if "recall" in judges and task == "recall" and code:
        recall = checks.check_recall(text, code)
        found["recall"] = {"status": recall.status, "offset": recall.offset, "matched": recall.matched}
    if "empty" in judges:
        found["empty"] = checks.is_empty(text)
    if "repetition" in judges:
        rep = checks.find_repetition(text)
        found["repetition"] = dataclasses.asdict(rep) if rep else None
    if "wrong_task" in judges:
        found["wrong_task"] = checks.wrong_task(text, task, code)
    return found


def hit_path_problems(found: dict[str, Any]) -> list[tuple[str, int | None, str]]:
    """(kind, offset, detail) for what a broken restore produces and a weak model also can."""
    if found.get("empty"):
        return [("empty_answer", 0, "empty answer")]     # an empty answer also misses the code: say it once
    problems = []
    recall = found.get("recall")
    if recall and recall["status"] != "exact":
        problems.append(("recall_miss", recall["offset"],
                         f"code {recall['status']}" + (f" ({recall['matched']!r})" if recall["matched"] else "")))
    rep = found.get("repetition")
    if rep:
        problems.append(("repetition", rep["offset"],
                         f"collapsed into {rep['unit']!r} repeated {rep['count']} times"))
    return problems
