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
import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

import orjson

from ..checks import detectors as checks
from ..server.client import Completion, RequestSpec
from ..log.events import (AnswerDelta, Finding, FingerprintCompared, MemoPlanted, RequestFinished, RequestStarted,
                          RoundStarted, ServerInfo)
from ..evidence.text import (DETERMINISM_QUESTION, RECALL_QUESTION, SUMMARY_QUESTION, CodeOwner, determinism_suffix,
                             recall_suffix, summary_suffix)
from ..checks.fingerprints import Fingerprint, FingerprintBook
from ..evidence.memos import Memo, build_memo, filler_text
from ..server.metrics import (LLAMA_CACHED, PREEMPTIONS, PREFIX_HITS, PREFIX_QUERIES, MetricSnapshot,
                              cached_tokens_delta, delta)
from .proof import UNKNOWN, CacheProof, CounterWindows, quantum
from ..evidence.tokens import TokenCounter

if TYPE_CHECKING:
    from .engine import SoakEngine

DELTA_INTERVAL = 0.1          # seconds between coalesced answer deltas per request
KEEP_RECENT = 512             # records kept for isolation beyond the flagged ones (bounded memory)
ALL_JUDGES = ("foreign", "recall", "empty", "repetition", "wrong_task")
DEFAULT_ALARM_RATE = 0.01    # a single foreign group is fail-class below these odds when no power target is set
CHAT_TEMPLATE_TOKENS = 8      # turn markers a chat template puts before the first message (Gemma: 4)


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
    proof: CacheProof = UNKNOWN          # what is known of its cached tokens, and how
    cold_tolerance: int = 0              # tokens it may reuse and still be cold (before the nonce)

    @property
    def text(self) -> str:
        return self.completion.text

    @property
    def cached(self) -> int | None:
        """Cached tokens when known exactly (reported, or attributed exactly); None when unknown."""
        return self.proof.exact

    @property
    def hit(self) -> bool:
        """A proven hit: more cached tokens than the template a cold request shares (those before the
        run nonce), by the server's report or its counter."""
        return self.proof.low > self.cold_tolerance

    @property
    def cold(self) -> bool:
        """Proven cold: at most the tokens before the run nonce were reused."""
        return self.proof.cold(self.cold_tolerance)


@dataclass
class PhaseState:
    """What a phase has seen, as running totals: a night-long phase keeps its memory flat."""

    name: str
    requests: int = 0                 # main arm
    hit_count: int = 0                # main-arm requests proven to hit
    unknown_cached: int = 0           # main-arm requests neither proven hit nor proven cold
    cached_tokens: int = 0            # proven cached tokens (exact, or the proven lower bound)
    prompt_tokens: int = 0
    control_requests: int = 0
    reported_cached: int = 0          # main + control + isolation, for the metric comparison
    reported_unknown: bool = False    # some request's cached tokens were not reported by the server
    proven_by: dict[str, int] = field(default_factory=lambda: {"request": 0, "counter": 0})   # hits
    counter_members: int = 0          # main-arm requests that needed the counter
    counter_attributed: int = 0       # ... and came out proven hit or proven cold
    ttft_cold: list[float] = field(default_factory=list)
    ttft_hit: list[float] = field(default_factory=list)
    last: Record | None = None
    inconclusive: list[str] = field(default_factory=list)
    findings: dict[str, int] = field(default_factory=lambda: {"fail": 0, "warn": 0, "info": 0})
    expected_hits: int = 0
    unproven_expected: int = 0        # requests that should have hit whose hit is not proven
    cold_failures: int = 0
    model_failures: int = 0
    hits_required: bool = True
    redraws_memos: bool = False       # the phase re-draws memos whose fingerprints are not distinct
    no_report_fix: str = ""           # the server option that makes it report cached tokens
    metrics_before: MetricSnapshot | None = None
    metrics_after: MetricSnapshot | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    finished: bool = False

    def note(self, record: Record, arm: str) -> None:
        proof = record.proof
        if proof.source == "request":
            self.reported_cached += proof.low
        else:
            self.reported_unknown = True
        if arm != "main":
            self.control_requests += arm == "control"
            return
        self.requests += 1
        self.last = record
        self.cached_tokens += proof.low
        self.prompt_tokens += record.completion.prompt_tokens or 0
        if proof.source == "counter":
            self.counter_members += 1
        ttft = record.completion.ttft_s
        if record.hit:
            self.hit_count += 1
            self.proven_by[proof.source] = self.proven_by.get(proof.source, 0) + 1
            self.counter_attributed += proof.source == "counter"
            if ttft:
                self.ttft_hit.append(ttft)
        elif record.cold:
            self.counter_attributed += proof.source == "counter"
            if ttft:
                self.ttft_cold.append(ttft)
        else:
            self.unknown_cached += 1      # unknown is never zero: neither a hit nor a cold request

    @property
    def fail_findings(self) -> int:
        return self.findings["fail"]

    def mark_inconclusive(self, reason: str) -> None:
        if reason not in self.inconclusive:
            self.inconclusive.append(reason)

    def status(self) -> tuple[str, list[str]]:
        reasons = list(self.inconclusive)
        if self.hits_required and self.requests and not self.hit_count:
            # a phase that needed hits and proved none is never a pass, whatever the reason
            if self.unknown_cached:
                reasons.append(f"no cache hit proven: cached tokens unknown on {self.unknown_cached} of "
                               f"{self.requests} requests" + (f" ({self.no_report_fix})" if self.no_report_fix else ""))
            else:
                reasons.append("no request got a cache hit")
        if self.fail_findings:
            return "fail", reasons
        return ("inconclusive", reasons) if reasons else ("pass", [])

    def proof_sentence(self) -> str:
        """How this phase's hits were proven, in words ("per request", "by counter, N of M attributed")."""
        if not self.hit_count and not self.counter_members:
            return "no hits" if not self.unknown_cached else "unproven"
        parts = []
        if self.proven_by.get("request"):
            parts.append("per request")
        if self.counter_members:
            parts.append(f"by counter, {self.counter_attributed} of {self.counter_members} attributed")
        return ", ".join(parts) or "unproven"

    def summary(self) -> dict[str, Any]:
        reported_sum = None if self.reported_unknown else self.reported_cached
        metric_hits = cached_tokens_delta(self.metrics_before, self.metrics_after)
        summary = {
            "requests": self.requests,
            "control_requests": self.control_requests,
            "hits": self.hit_count,
            "expected_hits": self.expected_hits,
            "unproven_hits": self.unproven_expected,
            "unknown_cached": self.unknown_cached,
            "hits_proven": self.proof_sentence(),
            "proven_by": {"request": self.proven_by.get("request", 0), "counter": self.proven_by.get("counter", 0),
                          "counter_attributed": self.counter_attributed, "counter_members": self.counter_members},
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
            "hits_agree": self.hits_agree(),
        }
        summary.update(self.extra)
        return summary

    def hits_agree(self) -> bool | None:
        """Per-request cached tokens against the server counter's delta over the phase; None when either
        is unknown. A counter printed with 6 significant digits (llama.cpp) agrees within its steps."""
        reported_sum = None if self.reported_unknown else self.reported_cached
        metric_hits = cached_tokens_delta(self.metrics_before, self.metrics_after)
        if metric_hits is None or reported_sum is None:
            return None
        step = quantum(max(_counter_value(self.metrics_before), _counter_value(self.metrics_after)))
        return abs(metric_hits - reported_sum) <= 2 * step


def _counter_value(snapshot: MetricSnapshot | None) -> float:
    if snapshot is None:
        return 0.0
    return max(snapshot.get(PREFIX_HITS) or 0.0, snapshot.get(LLAMA_CACHED) or 0.0)


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
        e = self.scenario.evidence
        self.fingerprints = FingerprintBook(e.fingerprint_tokens, e.fingerprint_tolerance, e.fingerprint_margin)
        self._fingerprint_notes: set[str] = set()
        self.long_memo: Memo | None = None
        # Without per-request cached tokens, the server's counter is attributed to requests in
        # windows between quiet moments (tui.core.soak.proof).
        self.windows = (CounterWindows(lambda: engine.scrape(record=False), server.cached_counter,
                                       server.cached_queries or None)
                        if server.cached_report == "counter" and server.cached_counter else None)
        self._tolerances: dict[tuple[str, str], int] = {}
        # A prompt with no run nonce (a user's captured conversation): a cache that matches token by
        # token (llama.cpp, SGLang) still shares a template's first tokens with whatever it held.
        self.fallback_tolerance = 8 if server.dialect in ("llamacpp", "sglang") else 0

    async def cold_tolerance(self, spec: RequestSpec) -> int:
        """Tokens a cold request may share with earlier prompts: those before the run nonce, the
        first token no other run's prompt carries ("<bos>Memo m05, run "). On a cache that matches
        in blocks this is below one block and changes nothing; on one that matches token by token
        (llama.cpp, SGLang's radix cache) a fresh memo does reuse them. Counted with the server's
        tokenizer when it has one (the count includes the BOS token it adds)."""
        if spec.prompt is not None:
            text = spec.prompt
        else:
            text = "\n".join(str(m.get("content") or "") for m in spec.messages or [])
        at = text.find(self.engine.nonce)
        if at < 0:
            return self.fallback_tolerance
        prefix = text[:at]
        key = (spec.api, prefix)
        if key not in self._tolerances:
            tokens = await self.counter.count(prefix) if prefix else 1
            # a chat template adds its turn markers before the first message's text
            self._tolerances[key] = tokens + (CHAT_TEMPLATE_TOKENS if spec.api == "chat" else 0)
        return self._tolerances[key]

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
        tolerance = await self.cold_tolerance(spec)
        sent_at = time.monotonic()
        window = await self.windows.enter() if self.windows is not None else None
        try:
            completion = await self.engine.client.stream(spec, on_text)
        except BaseException:
            if window is not None:
                self.windows.abandon(window)
            raise
        if completion.cached_tokens is not None:
            proof = CacheProof.reported(completion.cached_tokens)
            if window is not None:
                await self.windows.leave(window, index, completion.prompt_tokens, tolerance=tolerance)
        elif window is not None:
            proof = await self.windows.leave(window, index, completion.prompt_tokens, tolerance=tolerance)
        else:
            proof = UNKNOWN
        cached = proof.exact
        if self.engine.checkpoints:
            await self._await_checkpoint_line(sent_at, cached)
        on_text.flush()
        found = evaluate(completion.text, task, memo.code if memo else None, self.engine.registry.codes(),
                         tuple(judges))
        if memo is not None and cached and proof.source == "request" and self.server.grid_source == "server":
            found["block_aligned"] = cached % self.server.grid == 0
        checkpoint_lines = self.engine.checkpoints_since(sent_at)
        restored = [c for c in checkpoint_lines if c.kind == "restored" and c.n_past == cached]
        if restored:
            found["checkpoint"] = {"restored": restored[0].n_past, "n_tokens": restored[0].n_tokens}
        reprocessed = [c for c in checkpoint_lines if c.kind == "full_reprocess"]
        if reprocessed and not cached:
            found["checkpoint"] = {"full_reprocess": reprocessed[0].line}
        emit(RequestFinished(request=index, phase=state.name, slot=slot, round=round, text=completion.text,
                             prompt_tokens=completion.prompt_tokens, cached_tokens=cached,
                             ttft=completion.ttft_s, total=completion.total_s,
                             output_tokens=completion.completion_tokens,
                             finish_reason=completion.finish_reason, checks=found,
                             logprobs=completion.logprobs, cached_source=proof.source,
                             cached_min=proof.low if proof.source != "unknown" else None,
                             cached_max=proof.high, cold_tolerance=tolerance))
        record = Record(index, state.name, task, spec, memo, slot, round, turn, completion, found, proof, tolerance)
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
        single_groups = []
        for foreign in c.get("foreign", []):
            if foreign["groups"] >= 2:
                self.finding(state, "foreign_code", "fail", record, offset=foreign["offset"],
                             detail=f"answer carries code {foreign['code']} owned by memo {foreign['owner']} at "
                                    f"offset {foreign['offset']}",
                             code=foreign["code"], owner=foreign["owner"], matched=foreign["matched"])
            else:
                single_groups.append(foreign)    # judged against the cold control below
        if c.get("wrong_task") is not None:
            self.finding(state, "wrong_task", "warn", record, offset=c["wrong_task"],
                         detail=f"a {record.task} request answered with its own code (a candidate fluke, not a leak)")
        if expect == "cold" and not record.cold:
            if record.proof.low > record.cold_tolerance:
                state.mark_inconclusive(f"request {record.request} should be cold but had {record.proof.low} "
                                        f"cached tokens")
                self.finding(state, "cold_not_cold", "warn", record,
                             detail=f"expected a cold request, got {record.proof.low} cached tokens (at most "
                                    f"{record.cold_tolerance} may be shared before the run nonce)",
                             cached_tokens=record.proof.low, tolerance=record.cold_tolerance)
            else:
                state.mark_inconclusive("cold requests are not proven cold: their cached tokens are unknown"
                                        + (f" ({state.no_report_fix})" if state.no_report_fix else ""))
        if expect == "hit":
            state.expected_hits += 1
            if not record.hit:
                state.unproven_expected += 1
            miss = (c.get("checkpoint") or {}).get("full_reprocess")
            if miss and not record.hit:
                self.finding(state, "checkpoint_miss", "info", record,
                             detail="a shared prefix got no hit: the server had no usable checkpoint inside it "
                                    "(neither a pass nor a fail)", line=miss)
        if self.scenario.evidence.fingerprints and record.memo is not None:
            await self._judge_fingerprint(state, record)
        problems = hit_path_problems(c)
        if not (problems or single_groups) or not control:
            for foreign in single_groups:         # no control to judge it by: a warning
                self._single_group(state, record, foreign, None)
            return
        if record.cold:
            state.cold_failures += bool(problems)
            # A model that cannot give its own code back cold proves nothing by recall; one that
            # loops or stops on its own still leaves the other evidence (codes elsewhere, fingerprints).
            if expect == "cold" and any(kind == "recall_miss" for kind, _, _ in problems):
                state.mark_inconclusive(f"cold baseline failed on request {record.request} (recall_miss)")
            for kind, offset, detail in problems:
                self.finding(state, kind, "info", record, offset=offset,
                             detail=f"{detail}; on a cold request (no hit): the model, not the cache")
            for foreign in single_groups:
                self.finding(state, "foreign_code", "info", record, offset=foreign["offset"],
                             detail=f"one group ({foreign['matched']}) of code {foreign['code']} of memo "
                                    f"{foreign['owner']} on a cold request: the model wrote that number itself",
                             code=foreign["code"], owner=foreign["owner"], matched=foreign["matched"])
            return
        control = await self.send(state, dataclasses.replace(record.spec, salt=self.fresh_salt()),
                                  task=record.task, memo=record.memo, slot=record.slot, round=record.round,
                                  turn=record.turn, expect="cold", arm="control", of_request=record.request,
                                  judges=judges)
        control_problems = {kind for kind, _, _ in hit_path_problems(control.checks)}
        control_cold = control.cold
        for foreign in control.checks.get("foreign", []):
            if foreign["groups"] >= 2:
                self.finding(state, "foreign_code", "fail", control, offset=foreign["offset"],
                             detail=f"the cold control carries code {foreign['code']} of memo {foreign['owner']}",
                             code=foreign["code"], owner=foreign["owner"])
        for foreign in single_groups:
            self._single_group(state, record, foreign, control if control_cold else None)
        on_what = (f"on a hit ({_cached_words(record.proof)})" if record.hit
                   else "on a request whose cache use is unknown")
        for kind, offset, detail in problems:
            if not control_cold:
                self.finding(state, kind, "warn", record, offset=offset,
                             detail=f"{detail}; no cold control possible (the salted re-send is not proven cold: "
                                    f"{_cached_words(control.proof)})", control_request=control.request)
            elif kind in control_problems:
                state.model_failures += 1
                self.finding(state, kind, "info", record, offset=offset,
                             detail=f"{detail}; the cold control (request {control.request}) fails the same "
                                    f"way: the model, not the cache", control_request=control.request)
            else:
                self.finding(state, kind, "fail" if record.hit else "warn", record, offset=offset,
                             detail=f"{detail} {on_what}, while the cold control (request {control.request}) "
                                    f"is right",
                             control_request=control.request, cached_tokens=record.proof.low,
                             control_text=control.text[:400])

    def _single_group(self, state: PhaseState, record: Record, foreign: dict, control: Record | None) -> None:
        """One four-digit group of another memo's code: a mixed state, or a number the model wrote
        by chance. Its false-alarm odds are the chance that the four-digit numbers the answer holds
        hit one of the run's registered groups; below the run's power target, with a cold control
        that does not write it, it is fail-class."""
        groups = 3 * max(0, len(self.engine.registry.owners) - (1 if record.memo and record.memo.code else 0))
        numbers = checks.four_digit_numbers(record.text)
        odds = checks.false_alarm_odds(numbers, groups)
        threshold = self.scenario.power.fault_rate or DEFAULT_ALARM_RATE
        where = dict(code=foreign["code"], owner=foreign["owner"], matched=foreign["matched"], odds=round(odds, 6),
                     numbers=numbers, registered_groups=groups)
        base = (f"one group ({foreign['matched']}) of code {foreign['code']} owned by memo {foreign['owner']} at "
                f"offset {foreign['offset']}; false-alarm odds {_pct(odds)} ({numbers} four-digit number(s) "
                f"against {groups} registered groups)")
        if control is None:
            self.finding(state, "foreign_code", "warn", record, offset=foreign["offset"],
                         detail=f"{base}; no cold control to compare with", **where)
            return
        echoed = any(f["code"] == foreign["code"] for f in control.checks.get("foreign", []))
        if echoed:
            self.finding(state, "foreign_code", "info", record, offset=foreign["offset"],
                         detail=f"{base}; the cold control (request {control.request}) writes it too: the model, "
                                f"not the cache", control_request=control.request, **where)
        elif odds < threshold:
            self.finding(state, "foreign_code", "fail", record, offset=foreign["offset"],
                         detail=f"{base}, below the run's {_pct(threshold)} target, and the cold control (request "
                                f"{control.request}) is clean: a mixed state", control_request=control.request,
                         **where)
        else:
            self.finding(state, "foreign_code", "warn", record, offset=foreign["offset"],
                         detail=f"{base}, not below the run's {_pct(threshold)} target: too likely by chance to "
                                f"call a leak", control_request=control.request, **where)

    # --- fingerprints ------------------------------------------------------------------------

    async def _cold_fingerprint(self, state: PhaseState, record: Record) -> Fingerprint | None:
        """The cold run of this exact prompt: this record if it was cold, else one more request."""
        key = prompt_key(record.spec)
        known = self.fingerprints.get(key)
        if known is not None:
            return known
        if record.cold:
            source = record
        else:
            source = await self.send(state, dataclasses.replace(record.spec, salt=self.fresh_salt()),
                                     task=record.task, memo=record.memo, slot=record.slot, round=record.round,
                                     turn=record.turn, expect="cold", arm="control", of_request=record.request)
            if not source.cold:
                return None                      # no cold run to be had (cold_not_cold, or unknown)
        if not source.completion.logprobs:
            self._note_once(state, "no_logprobs", "the server returned no log-probabilities: fingerprints "
                            "cannot be compared", record)
            return None
        fingerprint = Fingerprint(record.memo.memo_id, record.task, source.request, source.completion.logprobs)
        alike = self.fingerprints.add(key, fingerprint)
        if alike and not state.redraws_memos:    # a phase that re-draws memos judges distinctness itself
            self.note_indistinct(state, alike[0], fingerprint, record)
        return fingerprint

    def note_indistinct(self, state: PhaseState, a: Fingerprint, b: Fingerprint, record: Record | None) -> None:
        self._note_once(state, f"indistinct:{state.name}",
                        f"memos {a.memo} and {b.memo} have the same fingerprint (requests {a.request} and "
                        f"{b.request}): leak detection by fingerprint is inconclusive in this phase", record,
                        inconclusive=True)

    def _note_once(self, state: PhaseState, key: str, detail: str, record: Record | None,
                   inconclusive: bool = False) -> None:
        if key in self._fingerprint_notes:
            return
        self._fingerprint_notes.add(key)
        if inconclusive:
            state.mark_inconclusive(detail)
        self.finding(state, "fingerprint_indistinct" if inconclusive else "fingerprint_unavailable", "info",
                     record, detail=detail)

    def fingerprint_verdict(self, record: Record) -> str | None:
        """match | foreign_state | mismatch for any re-send (isolation), against the cold fingerprints
        seen so far; None when the prompt has no cold fingerprint or the answer no log-probabilities."""
        own = self.fingerprints.get(prompt_key(record.spec))
        if own is None or not record.completion.logprobs:
            return None
        return self.fingerprints.compare(record.completion.logprobs, own)[2]

    async def _judge_fingerprint(self, state: PhaseState, record: Record) -> None:
        tolerance = self.scenario.evidence.fingerprint_tolerance
        own = await self._cold_fingerprint(state, record)
        if own is None or not record.hit or own.request == record.request:
            return
        run = record.completion.logprobs
        mine, others, verdict, owner = self.fingerprints.compare(run, own)
        record.checks["fingerprint"] = {"verdict": verdict, "own_distance": mine.distance,
                                        "own_agreeing": mine.agreeing, "closest": owner}
        self.engine.emit(FingerprintCompared(request=record.request, own_request=own.request, verdict=verdict,
                                             agreeing=mine.agreeing, distance=mine.distance, closest=owner))
        if verdict == "match":
            return
        if verdict == "foreign_state":
            if owner in self.fingerprints.indistinct_from(own.memo, own.task):
                return            # the two memos look alike: no telling them apart (noted when seen)
            theirs = others[owner]
            self.finding(state, "foreign_state", "fail", record,
                         detail=(f"the hit's continuation is closer to memo {owner}'s cold fingerprint ({theirs.agreeing} "
                                 f"tokens agree, log-probabilities within {theirs.distance:.4f}) than to its own "
                                 f"({mine.agreeing} tokens, {mine.distance:.4f}): another request's state"),
                         owner=owner, own_request=own.request, own_distance=mine.distance,
                         owner_distance=theirs.distance)
            return
        # Differs from its own fingerprint. A near-tied choice that flips after log-probabilities that
        # agreed within the tolerance is numerics (prefill from cache runs other batch shapes), not a
        # wrong state: info, as in the determinism phase.
        flip = checks.compare_logprobs(own.logprobs, run)
        if flip.token is not None and flip.near_tie(tolerance):
            self.finding(state, "fingerprint_mismatch", "info", record,
                         detail=f"the hit flips a near-tied token at output token {flip.token} ({flip.margin:.4f} nats "
                                f"behind on the cold path; log-probabilities before it agree to "
                                f"{flip.max_prefix_delta:.4f}): numerics of prefill from cache, not a wrong state",
                         own_request=own.request, token=flip.token, margin=flip.margin)
            return
        # Fail only if both paths reproduce themselves: a second cold run matches the fingerprint and a
        # second hit repeats the same deviation. Kernel nondeterminism (top-k ties, batch-dependent
        # numerics) does neither reliably.
        again = await self.send(state, dataclasses.replace(record.spec, salt=self.fresh_salt()), task=record.task,
                                memo=record.memo, slot=record.slot, round=record.round, turn=record.turn,
                                expect="cold", arm="control", of_request=record.request)
        rehit = await self.send(state, record.spec, task=record.task, memo=record.memo, slot=record.slot,
                                round=record.round, turn=record.turn, expect="hit", arm="control",
                                of_request=record.request)
        cold_again = self.fingerprints.match(again.completion.logprobs, own.logprobs)
        hit_again = self.fingerprints.match(rehit.completion.logprobs, run)
        where = f"first {mine.agreeing} tokens agree, log-probabilities {mine.distance:.4f} apart"
        evidence = dict(own_request=own.request, control_request=again.request, rehit_request=rehit.request,
                        own_distance=mine.distance)
        if cold_again.matches(tolerance) and rehit.hit and hit_again.matches(tolerance):
            self.finding(state, "fingerprint_mismatch", "fail", record,
                         detail=(f"the hit differs from its own cold fingerprint ({where}); a second cold run "
                                 f"(request {again.request}) reproduces the fingerprint and a second hit (request "
                                 f"{rehit.request}) the deviation: corruption on the hit path"), **evidence)
        else:
            why = ("the second cold run differs from the fingerprint too" if not cold_again.matches(tolerance)
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


def _cached_words(proof: CacheProof) -> str:
    if proof.exact is not None:
        return f"{proof.exact} cached tokens"
    if proof.source == "unknown":
        return "cached tokens unknown"
    return f"{proof.low}-{proof.high} cached tokens (by counter)" if proof.high is not None \
        else f"at least {proof.low} cached tokens (by counter)"


def _pct(value: float) -> str:
    text = f"{value * 100:.2f}".rstrip("0").rstrip(".")
    return f"{text}%"


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
