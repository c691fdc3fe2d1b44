"""Phase: eviction. A pool of memos larger than the server's cache, cycled so every memo is evicted and
re-admitted several times, alone and under concurrency; every re-admitted hit is checked (its own
code, foreign codes, its cold fingerprint) by the judge as everywhere.

The capacity comes from the scenario (`capacity_tokens`), else from the server: vLLM's
`num_gpu_blocks` x `block_size` (vllm:cache_config_info; an upper bound on hybrid models, whose
sliding-window groups take blocks of their own), llama.cpp's slots (each keeps its last prompt;
`--cache-ram` is not in /props: state it). The pool holds `pool_factor` times that, between
`min_memos` and `max_memos`. Pass 0 admits every memo (cold, then the same request: a hit); each
later pass sends every memo again (a miss after having hit is an eviction observed: whole, or
partial when fewer tokens come back) and once more (the re-admitted hit), alone on odd passes and
`concurrency` at a time on even ones. Each pass's start and end are run times (the t of every event),
so its KV usage, preemptions and findings line up with the log's metrics samples. A pool that fits (no memo evicted in a pass) is doubled, up to
`max_memos`. No eviction observed at all is inconclusive; the summary counts the evictions of each
memo, and each pass has its KV usage, preemptions and findings, time-aligned.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
import math
import time

from ...log.metric_names import KV_USAGE, PREEMPTIONS
from ..record import concurrently
from ..results import UNSET, PhaseResult
from ...report import fmt
from ...report.facts import text_table
from ...report.phase_facts import Section

TITLE = "eviction"
MAX_GROWTH = 4                # doublings of a pool that fits in the cache
SAMPLE_S = 0.5                # KV usage read this often while requests run


@dataclass(frozen=True)
class Settings:
    """[phases.eviction]: a memo pool larger than the cache, cycled so every memo is evicted and re-admitted."""
    memo_tokens: int = 1200
    capacity_tokens: int = 0         # 0: from the server (vLLM num_gpu_blocks x block_size; llama.cpp slots)
    pool_factor: float = 1.5         # the pool holds this many times the capacity
    min_memos: int = 3
    max_memos: int = 64              # a bound on the pool, whatever the capacity says
    cycles: int = 3                  # passes that re-admit every memo (after the first admission)
    concurrency: int = 2             # memos sent at once in the concurrent passes (every second pass)


MINIMUMS = {"memo_tokens": 64, "capacity_tokens": 0, "pool_factor": 1.0, "min_memos": 2, "max_memos": 2, "cycles": 1,
            "concurrency": 1}


def check(s: Settings) -> tuple[str, str, str] | None:
    if s.max_memos < s.min_memos:
        return "phases.eviction", "max_memos", f"must be at least min_memos ({s.min_memos})"
    return None


def capacity(rq) -> tuple[int | None, str]:
    """(capacity in tokens, where it comes from); None when neither the scenario nor the server says."""
    ev, server = rq.scenario.eviction, rq.server
    if ev.capacity_tokens:
        return ev.capacity_tokens, "scenario"
    labels = server.cache_config or {}
    try:
        blocks, size = int(labels.get("num_gpu_blocks") or 0), int(labels.get("block_size") or 0)
    except ValueError:
        blocks = size = 0
    if blocks and size:
        return blocks * size, f"server: num_gpu_blocks {blocks} x block_size {size}"
    props = (server.facts or {}).get("props") or {}
    slots = props.get("total_slots")
    if isinstance(slots, int) and slots > 0:
        return slots * ev.memo_tokens, (f"server: {slots} slots keep one prompt each (a RAM prompt cache, "
                                        f"--cache-ram, is not in /props: state capacity_tokens to count it)")
    return None, "unknown (the server states no cache size: set [phases.eviction] capacity_tokens)"


def pool_size(ev, tokens: int | None) -> int:
    if not tokens:
        return ev.min_memos
    return max(ev.min_memos, min(ev.max_memos, math.ceil(ev.pool_factor * tokens / ev.memo_tokens)))



@dataclass
class Result(PhaseResult):
    capacity_tokens: int | None = UNSET   # the cache's size, None when nobody states it
    capacity_source: str = UNSET          # where that size came from, in words
    passes: list[dict] = UNSET            # one row per pass (see run_pass)
    pool_memos: int = UNSET
    pool_tokens: int = UNSET
    evictions: int = UNSET
    evictions_partial: int = UNSET
    evictions_per_memo: dict[str, int] = UNSET
    every_memo_evicted: bool = UNSET
    min_evictions_per_memo: int = UNSET
    readmit_missed: int = UNSET
    not_evicted: list[str] = UNSET

    def update(self, **values) -> None:
        for key, value in values.items():
            setattr(self, key, value)


def plan(scenario) -> dict:
    ev = scenario.eviction
    pool = ev.min_memos if not ev.capacity_tokens else pool_size(ev, ev.capacity_tokens)
    return {"slots": ev.concurrency, "rounds": ev.cycles + 1, "planned_requests": 2 * pool * (ev.cycles + 1)}


class Pool:
    """Each memo's last proven hit and the evictions observed on it."""

    def __init__(self):
        self.memos: list = []
        self.last_hit: dict[str, int] = {}
        self.evictions: dict[str, int] = {}
        self.partial: dict[str, int] = {}
        self.readmit_missed = 0

    def after_first(self, memo, record) -> str | None:
        """A memo sent again: 'evicted' (nothing came back), 'partial' (less), None (all of it, or unknown)."""
        before = self.last_hit.get(memo.memo_id)
        if before is None or record.proof.source == "unknown":
            return None
        if record.cold:
            self.evictions[memo.memo_id] = self.evictions.get(memo.memo_id, 0) + 1
            return "evicted"
        if record.proof.high is not None and record.proof.high < before:
            self.partial[memo.memo_id] = self.partial.get(memo.memo_id, 0) + 1
            self.evictions[memo.memo_id] = self.evictions.get(memo.memo_id, 0) + 1
            return "partial"
        return None

    def after_hit(self, memo, record) -> None:
        if record.hit:
            self.last_hit[memo.memo_id] = record.proof.low
        else:
            self.readmit_missed += 1


async def run(rq, state) -> None:
    ev = rq.scenario.eviction
    tokens, source = capacity(rq)
    pool = Pool()
    passes: list[dict] = []
    result = state.result = Result(capacity_tokens=tokens, capacity_source=source, passes=passes)

    async def grow(to: int, pass_no: int) -> None:
        new = [await rq.memo(state, tokens=ev.memo_tokens, slot=len(pool.memos) + i, tag=f"ev{len(pool.memos) + i}")
               for i in range(to - len(pool.memos))]
        pool.memos += new
        await _pass(rq, state, pool, new, pass_no, admit=True, group=1, passes=passes)

    await grow(pool_size(ev, tokens), 0)
    done, growth, number = 0, 0, 1
    while done < ev.cycles:
        group = ev.concurrency if number % 2 == 0 else 1
        evicted = await _pass(rq, state, pool, pool.memos, number, admit=False, group=group, passes=passes)
        number += 1
        if not evicted and len(pool.memos) < ev.max_memos and growth < MAX_GROWTH:
            growth += 1
            await grow(min(ev.max_memos, 2 * len(pool.memos)), number)    # it fits: a bigger pool, passes anew
            number += 1
            done = 0
            continue
        done += 1
    _conclude(rq, state, pool, tokens, source)


async def _pass(rq, state, pool: Pool, memos: list, number: int, *, admit: bool, group: int, passes: list) -> int:
    """One pass over `memos`: each sent (admitted, or a miss after having hit), then again (the hit)."""
    before = dict(state.findings)
    first_metrics = await rq.scrape()
    kv_max = _value(first_metrics, KV_USAGE)
    evicted = partial = hits = 0
    mode = "admit" if admit else ("alone" if group == 1 else f"{group} at once")
    t0 = rq.round(state, number, number + 1, {str(i): m.memo_id for i, m in enumerate(memos[:group])})
    clock = time.monotonic()
    sampler = KvSampler(rq, kv_max)
    for at in range(0, len(memos), group):
        chunk = memos[at:at + group]

        def send(memo, expect):
            return rq.send(state, rq.question(memo.text, "recall"), task="recall", memo=memo,
                           slot=pool.memos.index(memo), round=number, expect=expect)
        firsts = await sampler.during(concurrently(*(send(m, "cold" if admit else "any") for m in chunk)))
        for memo, record in zip(chunk, firsts):
            seen = None if admit else pool.after_first(memo, record)
            evicted += seen == "evicted"
            partial += seen == "partial"
        seconds = await sampler.during(concurrently(*(send(m, "hit") for m in chunk)))
        for memo, record in zip(chunk, seconds):
            pool.after_hit(memo, record)
            hits += record.hit
    kv_max = sampler.max
    last_metrics = await rq.scrape()
    preempted = _delta(first_metrics, last_metrics, PREEMPTIONS)
    passes.append({"pass": number, "mode": mode, "memos": len(memos), "t_start_s": round(t0, 2),
                   "t_end_s": round(t0 + time.monotonic() - clock, 2), "evicted": evicted, "partial": partial,
                   "rehits": hits, "kv_usage_max": None if kv_max is None else round(kv_max, 4),
                   "preemptions": preempted,
                   "findings": {k: state.findings[k] - before.get(k, 0) for k in state.findings}})
    return evicted + partial


class KvSampler:
    """KV usage while requests run: a gauge read between requests shows only what idle holds (vLLM
    counts the blocks of running requests; cached free ones are not in it), so it is scraped every
    SAMPLE_S while each group of requests is in flight, and once as it ends."""

    def __init__(self, rq, start: float | None):
        self.rq, self.max = rq, start

    def _take(self, snapshot) -> None:
        kv = _value(snapshot, KV_USAGE)
        if kv is not None:
            self.max = kv if self.max is None else max(self.max, kv)

    async def during(self, work):
        task = asyncio.ensure_future(work)
        try:
            while not task.done():
                await asyncio.wait([task], timeout=SAMPLE_S)
                if not task.done():
                    self._take(await self.rq.scrape())
        finally:
            if not task.done():
                task.cancel()
        self._take(await self.rq.scrape())
        return task.result()


def _value(snapshot, name: str) -> float | None:
    return snapshot.get(name) if snapshot is not None and snapshot.error is None else None


def _delta(a, b, name: str) -> float | None:
    x, y = _value(a, name), _value(b, name)
    return None if x is None or y is None else y - x


def _conclude(rq, state, pool: Pool, tokens: int | None, source: str) -> None:
    result = state.result
    counts = {m.memo_id: pool.evictions.get(m.memo_id, 0) for m in pool.memos}
    every = bool(counts) and all(counts.values())
    result.update(pool_memos=len(pool.memos), pool_tokens=sum(m.tokens for m in pool.memos),
                  evictions=sum(counts.values()), evictions_partial=sum(pool.partial.values()),
                  evictions_per_memo=counts, every_memo_evicted=every,
                  min_evictions_per_memo=min(counts.values()) if counts else 0, readmit_missed=pool.readmit_missed)
    if not any(counts.values()):
        why = (f"no memo was evicted: a pool of {len(pool.memos)} memos ({result.pool_tokens} tokens) fits "
               f"in the cache (capacity {tokens if tokens else 'unknown'}: {source}); raise max_memos or state "
               f"capacity_tokens, or use a small-cache server")
        state.mark_inconclusive(why)
        rq.finding(state, "no_evictions", "warn", state.last, detail=why, pool_memos=len(pool.memos),
                   capacity_tokens=tokens)
    elif not every:
        result.not_evicted = [m for m, n in counts.items() if not n]


# --- what the phase adds to the reports ---------------------------------------------------------------

HEADER = ("pass", "mode", "t (s)", "evicted", "partial", "re-hits", "KV max", "preempt", "f/w/i")


def report_rows(summary: dict) -> tuple[list[str], list[list[str]]]:
    """(sentences: the pool against the capacity and the evictions observed, one row per pass)."""
    r = Result.read(summary)
    if "pool_memos" not in summary:
        return [], []
    capacity = r.capacity_tokens
    lines = [f"eviction: {r.pool_memos} memos, {fmt.cell(r.pool_tokens)} tokens, against a capacity "
             f"of {'unknown' if capacity is None else capacity} tokens",
             f"  ({r.capacity_source})",
             f"eviction: {r.evictions or 0} evictions observed ({r.evictions_partial or 0} partial), "
             f"at least {r.min_evictions_per_memo or 0} per memo"]
    rows = []
    for p in r.passes or []:
        f = p.get("findings") or {}
        kv, pre = p.get("kv_usage_max"), p.get("preemptions")
        rows.append([str(p["pass"]), p["mode"], _span(p["t_start_s"], p["t_end_s"]), str(p["evicted"]),
                     str(p["partial"]), str(p["rehits"]), fmt.pct(kv, 1) if kv is not None else fmt.MISSING,
                     fmt.MISSING if pre is None else str(int(pre)),
                     f"{f.get('fail', 0)}/{f.get('warn', 0)}/{f.get('info', 0)}"])
    return lines, rows


def _span(start: float, end: float) -> str:
    digits = 0 if end >= 100 else 1
    return f"{start:.{digits}f}-{end:.{digits}f}"


def console_lines(summary: dict) -> list[str]:
    sentences, passes = report_rows(summary)
    return sentences + (text_table(HEADER, passes, "") if passes else [])


def section(summary: dict) -> Section | None:
    sentences, passes = report_rows(summary)
    if not sentences:
        return None
    return Section("Eviction", "eviction", HEADER, passes,
                   paragraphs=[" ".join(x.strip() for x in sentences[:2]) + ".", sentences[2] + "."],
                   html_paragraphs=[x.strip() for x in sentences])
