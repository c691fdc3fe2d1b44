"""Phase 9: seeded random traffic that searches for what fixed scripts miss.

K workers draw, from a seeded RNG, a memo out of a pool of M (more than the server's slots) and
either a turn of its conversation (turn t appends to turn t-1, so later turns share a long prefix
with earlier ones) or, now and then, a prompt that shares only the memo's first part (through its
code sentence) with the others: a short partial prefix. Before the mix, every (memo, turn) prompt
is answered once cold under a fresh salt: the clean reference. Every later hit is compared with its
reference: its own code where the model recalled it cold, greedy tokens and log-probabilities
everywhere (the near-tie rule applies). A deviation is re-sent `reproduce` times as a hit and as
many times cold: wrong on every hit and never cold is `hit_path_divergence` (fail); anything else is
info, with its counts. Foreign codes are judged as everywhere (a leak, no control needed).

The draw order comes from the seed alone (`--seed N` replays it); each finding carries the draw,
the seed and the requests before it that wrote the prefix it hit.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field

from ...checks import detectors as checks
from ...checks.answers import ALL_JUDGES, hit_path_problems
from ...checks.fingerprints import Fingerprint
from ...log.events import FingerprintCompared
from ..record import concurrently, prompt_key
from ..results import UNSET, PhaseResult

TITLE = "mix"
BUCKETS = ("first", "short_partial", "long_partial", "full")
KEEP_SEQUENCE = 6             # earlier same-memo requests a finding lists


@dataclass(frozen=True)
class Settings:
    """[phases.mix]: the phase that searches instead of replaying: seeded random traffic over a pool of memos."""
    workers: int = 4                 # concurrent requests
    memos: int = 6                   # the pool, more than a server's slots
    turns: int = 3                   # turns per memo's conversation (each appends to the one before)
    memo_tokens: int = 600
    turn_tokens: int = 140           # appended per turn (at least one alignment block)
    requests: int = 200              # draws, bounded
    partial_rate: float = 0.15       # share of draws that share only the memo's first part (a short prefix)
    reproduce: int = 5               # re-sends each way (hits, cold) before a deviation is the cache's


MINIMUMS = {"workers": 1, "memos": 2, "turns": 1, "memo_tokens": 64, "turn_tokens": 8, "requests": 1,
            "partial_rate": 0.0, "reproduce": 1}


def check(s: Settings) -> tuple[str, str, str] | None:
    if s.partial_rate > 1.0:
        return "phases.mix", "partial_rate", "must be between 0 and 1"
    if s.workers > 256:
        return "phases.mix", "workers", "at most 256 concurrent workers"
    return None


@dataclass(frozen=True)
class Draw:
    index: int
    memo: int                 # index in the pool
    kind: str                 # "turn" | "header"
    turn: int                 # for "turn": which turn; for "header": the variant number



@dataclass
class Result(PhaseResult):
    seed: int = UNSET                         # the seed that replays the search (--seed)
    draws: list[list] = UNSET                 # [memo, kind, turn] per draw, in order
    coverage: dict = UNSET                    # Coverage.as_dict(): hits and deviations by bucket and concurrency


def memos_ahead(scenario) -> list[tuple[int, str, bool]]:
    """The memos run() asks for (tokens, tag, with a code): the memo stock sizes them ahead (memo_stock.py)."""
    m = scenario.mix
    return [(m.memo_tokens, f"mix{i}", True) for i in range(m.memos)]


def plan(scenario) -> dict:
    m = scenario.mix
    refs = m.memos * m.turns
    return {"slots": m.workers, "rounds": 1, "planned_requests": refs + m.requests}


def draws(seed: int, mix) -> list[Draw]:
    """The whole sequence, from the seed alone (reproducible; the log keeps it)."""
    rng = random.Random(f"mix:{seed}")
    out, variants = [], {}
    for index in range(mix.requests):
        memo = rng.randrange(mix.memos)
        if rng.random() < mix.partial_rate:
            variants[memo] = variants.get(memo, 0) + 1
            out.append(Draw(index, memo, "header", variants[memo]))
        else:
            out.append(Draw(index, memo, "turn", rng.randrange(mix.turns)))
    return out


@dataclass
class Coverage:
    """What the search covered: hits and deviations by bucket, worker and concurrency."""
    buckets: dict = field(default_factory=lambda: {b: {"requests": 0, "hits": 0, "deviations": 0} for b in BUCKETS})
    by_worker: dict = field(default_factory=dict)
    by_concurrency: dict = field(default_factory=dict)
    near_ties: int = 0

    def count(self, bucket: str, worker: int, concurrency: int, hit: bool, deviated: bool) -> None:
        for table, key in ((self.buckets, bucket), (self.by_worker, str(worker)),
                           (self.by_concurrency, _level(concurrency))):
            row = table.setdefault(key, {"requests": 0, "hits": 0, "deviations": 0})
            row["requests"] += 1
            row["hits"] += hit
            row["deviations"] += deviated

    def as_dict(self) -> dict:
        return {"buckets": self.buckets, "by_worker": self.by_worker, "by_concurrency": self.by_concurrency,
                "near_ties": self.near_ties}


def _level(others: int) -> str:
    return "alone" if others == 0 else (str(others + 1) if others < 3 else "4+")


async def run(rq, state) -> None:
    s = rq.scenario
    m = s.mix
    memos = await rq.memos(state, [(tokens, None, tag) for tokens, tag, _ in memos_ahead(s)])   # sized at once
    turn_tokens = max(m.turn_tokens, rq.server.grid + 16)
    notes = [[await rq.filler(f"mix-{memo.memo_id}-{t}", turn_tokens) for t in range(1, m.turns)] for memo in memos]
    sequence = draws(s.seed, m)
    result = state.result = Result(seed=s.seed, draws=[[d.memo, d.kind, d.turn] for d in sequence])

    bodies = {(d.memo, d.turn): await rq.filler(f"mix-{memos[d.memo].memo_id}-h{d.turn}",
                                                _body_tokens(rq, memos[d.memo]))
              for d in sequence if d.kind == "header"}

    def context(d: Draw) -> str:
        memo = memos[d.memo]
        if d.kind == "turn":
            return memo.text + "".join(f"\n\nNote {i + 1}. {notes[d.memo][i]}" for i in range(d.turn))
        return _first_part(memo) + f"\n\nAddendum {d.turn}. {bodies[(d.memo, d.turn)]}"

    refs = await references(rq, state, memos, m.turns, context)
    search = Search(rq, state, memos, refs, context, m)
    queue = iter(sequence)

    async def worker(slot: int) -> None:
        for d in queue:
            await search.one(slot, d)

    await concurrently(*(worker(slot) for slot in range(m.workers)))
    result.coverage = search.coverage.as_dict()


def _first_part(memo) -> str:
    """The memo through its code sentence (its first half when it has no code): what a header draw
    shares with the memo's other prompts."""
    text = memo.text
    if memo.code_offset is not None:
        end = text.find(".", memo.code_offset + len(memo.code))
        end = text.find(".", end + 1) if end >= 0 else -1       # "... is CODE. Keep it verbatim."
        return text[:end + 1] if end > 0 else text[:len(text) // 2]
    return text[:len(text) // 2]


def _body_tokens(rq, memo) -> int:
    """A header draw's own text: at least as long as the shared part, so the shared prefix is at most
    half the prompt (a short partial prefix)."""
    return max(rq.server.grid + 16, memo.tokens // 2 + 16)


async def references(rq, state, memos, turns: int, context) -> dict[str, object]:
    """Every (memo, turn) prompt once cold, under a fresh salt: the clean reference (prompt key -> record)."""
    refs = {}
    for i, memo in enumerate(memos):
        for t in range(turns):
            spec = rq.question(context(Draw(-1, i, "turn", t)), "recall", salt=rq.fresh_salt())
            record = await rq.send(state, spec, task="recall", memo=memo, turn=t, expect="cold", arm="control")
            refs[prompt_key(spec)] = record
            _book(rq, record)
    return refs


def _book(rq, ref) -> None:
    if ref.completion.logprobs:
        rq.fingerprints.add(prompt_key(ref.spec), Fingerprint(ref.memo.memo_id, ref.task, ref.request,
                                                              ref.completion.logprobs))


class Search:
    def __init__(self, rq, state, memos, refs, context, mix):
        self.rq, self.state, self.memos, self.refs, self.context, self.mix = rq, state, memos, refs, context, mix
        self.coverage = Coverage()
        self.sent: dict[str, int] = {}                    # prompt key -> first request that sent it unsalted
        self.by_memo: dict[int, list[tuple[int, Draw]]] = {}

    def bucket(self, d: Draw, key: str) -> str:
        if key in self.sent:
            return "full"
        if d.memo not in self.by_memo:
            return "first"
        return "short_partial" if d.kind == "header" else "long_partial"

    async def one(self, slot: int, d: Draw) -> None:
        rq, memo = self.rq, self.memos[d.memo]
        spec = rq.question(self.context(d), "recall")
        key = prompt_key(spec)
        bucket = self.bucket(d, key)
        earlier = self.by_memo.setdefault(d.memo, [])
        ref = self.refs.get(key)
        recallable = ref is None or bool(ref.checks.get("recall", {}).get("status") == "exact")
        judges = ALL_JUDGES if recallable else tuple(j for j in ALL_JUDGES if j != "recall")
        record = await rq.send(self.state, spec, task="recall", memo=memo, slot=slot, round=d.index,
                               turn=d.turn, expect="any", judges=judges, control=False)
        others = record.concurrent
        self.sent.setdefault(key, record.request)
        sequence = [{"request": r, "draw": e.index, "kind": e.kind, "turn": e.turn} for r, e in earlier[-KEEP_SEQUENCE:]]
        earlier.append((record.request, d))
        deviated = False
        if record.hit:
            if ref is None:                        # a header draw: its reference only now, when it hit
                ref = await self._reference_for(record, memo)
            reasons = self._deviation(record, ref) if ref is not None else []
            if reasons:
                deviated = True
                await self._reproduce(record, ref, reasons, d, bucket, others, sequence)
        self.coverage.count(bucket, slot, others, record.hit, deviated)

    async def _reference_for(self, record, memo):
        rq = self.rq
        spec = dataclass_replace_salt(record.spec, rq.fresh_salt())
        ref = await rq.send(self.state, spec, task="recall", memo=memo, slot=record.slot, round=record.round,
                            turn=record.turn, expect="cold", arm="control", of_request=record.request)
        if not ref.cold:
            return None
        self.refs[prompt_key(record.spec)] = ref
        _book(self.rq, ref)
        return ref

    def _deviation(self, run, ref, emit: bool = True) -> list[str]:
        """How this answer differs from its clean reference (empty when it does not)."""
        reasons = []
        if ref.checks.get("recall", {}).get("status") == "exact" and run.checks.get("recall", {}).get("status") != "exact":
            reasons.append("recall")
        ref_problems = {k for k, _, _ in hit_path_problems(ref.checks)}
        reasons += [k for k, _, _ in hit_path_problems(run.checks) if k not in ref_problems and k != "recall_miss"]
        if ref.completion.logprobs and run.completion.logprobs:
            own = Fingerprint(ref.memo.memo_id, ref.task, ref.request, ref.completion.logprobs)
            mine, _, verdict, owner = self.rq.fingerprints.compare(run.completion.logprobs, own)
            if emit:
                self.rq.emit(FingerprintCompared(request=run.request, own_request=ref.request, verdict=verdict,
                                                 agreeing=mine.agreeing, distance=mine.distance, closest=owner))
            if verdict != "match":
                flip = checks.compare_logprobs(ref.completion.logprobs, run.completion.logprobs)
                if checks.near_tie_explains(mine, flip, self.rq.scenario.evidence.fingerprint_tolerance):
                    self.coverage.near_ties += emit
                else:
                    reasons.append(f"fingerprint ({verdict})")
        return reasons

    def _same(self, a, b) -> bool:
        """The same answer: identical text, and (with log-probabilities) the same fingerprint."""
        if a.text != b.text:
            return False
        if a.completion.logprobs and b.completion.logprobs:
            tolerance = self.rq.scenario.evidence.fingerprint_tolerance
            return self.rq.fingerprints.match(a.completion.logprobs, b.completion.logprobs).matches(tolerance)
        return True

    async def _reproduce(self, record, ref, reasons, d: Draw, bucket: str, others: int, sequence: list) -> None:
        rq, k = self.rq, self.mix.reproduce
        hits = cold = 0
        # The cache's doing only if the cold path is stable and the hit path is not: every cold re-send
        # gives the reference again and every re-sent hit deviates from it (a full hit may deviate
        # otherwise than the partial one did). A kernel that varies on its own (ties, sparse-attention
        # selection) does not give the reference k times in a row: with the reference server's drift,
        # (2/9)^k a deviation, 1 in 2,000 at k = 5.
        for _ in range(k):
            again = await rq.send(self.state, record.spec, task="recall", memo=record.memo, slot=record.slot,
                                  round=record.round, turn=record.turn, expect="hit", arm="control",
                                  of_request=record.request)
            hits += bool(again.hit and self._deviation(again, ref, emit=False))
        for _ in range(k):
            again = await rq.send(self.state, dataclass_replace_salt(record.spec, rq.fresh_salt()), task="recall",
                                  memo=record.memo, slot=record.slot, round=record.round, turn=record.turn,
                                  expect="cold", arm="control", of_request=record.request)
            cold += bool(not self._same(again, ref))
        fail = hits == k and cold == 0
        untold, untold_kind = None, None
        if fail and await self._twin_shows(record, reasons):
            untold_kind = "twin_same"
            untold = ("and its twin (the same prompt resumed at the same grid line from its writers' state) shows "
                      "it too: resuming arithmetic, or a wrong state on every restore, not told apart by text")
        elif fail and self._text_only(reasons) and self.rq.judge.twins.allowed:
            # vLLM's align mode: the state at a grid line depends on how its writer's prefill was split
            # among concurrent requests (each split rounds the state). Measured, vLLM 0.26 on an H200, bf16
            # state: a full hit resumed at 720 tokens looped 5 of 5 times, its cold prefill and its twin (a
            # writer prefilled alone) never, with the fingerprint within tolerance (2026-12-02).
            untold_kind = "align_chunking"
            untold = ("with its fingerprint as cold: on an align-mode hybrid the state depends on how its "
                      "writer's prefill was split among concurrent requests, so a later loop is not told from "
                      "that arithmetic")
        fail = fail and not untold
        what = ", ".join(reasons)
        detail = (f"draw {d.index} (seed {rq.scenario.seed}): a {bucket.replace('_', ' ')} hit ({record.proof.low} "
                  f"cached tokens, {others + 1} in flight) differs from its clean reference (request {ref.request}): "
                  f"{what}; deviating again on {hits}/{k} hits, differing cold on {cold}/{k} re-sends: "
                  + ("the hit path" if fail else untold if untold else "not reproducible, not attributable to the cache"))
        if untold:
            self.state.mark_inconclusive(f"request {record.request}: {what} on every hit, never cold, its "
                                         f"fingerprint as cold: not told apart by text")
        rq.finding(self.state, "hit_path_divergence", "fail" if fail else "warn" if untold else "info", record,
                   detail=detail, **({"untold": untold_kind} if untold else {}),
                   draw=d.index, seed=rq.scenario.seed, bucket=bucket, cached_tokens=record.proof.low,
                   in_flight=others + 1, reference_request=ref.request, reasons=reasons, hit_reproduced=hits,
                   cold_reproduced=cold, k=k, sequence=sequence + [{"request": record.request, "draw": d.index,
                                                                     "kind": d.kind, "turn": d.turn}])

    @staticmethod
    def _text_only(reasons: list[str]) -> bool:
        """The answer's text differs (a loop, an empty answer), its fingerprint and recall as cold."""
        return bool(reasons) and not any(r == "recall" or r.startswith("fingerprint") for r in reasons)

    async def _twin_shows(self, record, reasons: list[str]) -> bool:
        """A text problem on a hit whose fingerprint matched (a loop past it, an empty answer), where its
        twin (the same prompt resumed at the same grid line from its writers' state, twin.py) shows the
        same: the arithmetic of resuming, or a restore wrong on every hit (the twin's too): not told apart
        by text, so warn and inconclusive, never a pass and never a fail. Measured, vLLM 0.26 on an H200, the tiny
        Qwen3-Next with a bf16 state: a full hit resumed at 864 tokens looped into repetition 5 of 5 times,
        its full cold prefill never (2026-12-02)."""
        if self.rq.server.salts != "cache_salt" or not self._text_only(reasons) or not self.rq.judge.twins.allowed:
            return False          # a twin excuses only on a server that resumes on a grid (resume.py)
        for kind in reasons:
            if not await self.rq.judge.twins.same_problem(self.state, record, kind, report=False):
                return False
        return True


def dataclass_replace_salt(spec, salt: str):
    return dataclasses.replace(spec, salt=salt)


# --- what the phase adds to the reports ---------------------------------------------------------------

_BUCKET_NAMES = {"first": "first sight", "short_partial": "short partial prefix", "long_partial": "long partial prefix",
                 "full": "full prefix"}
_LEVEL_NAMES = {"alone": "alone", "2": "2 at once", "3": "3 at once", "4+": "4 or more"}


def console_lines(summary: dict) -> list[str]:
    """What the search covered: hits (of requests) and deviations by cached-length bucket, by
    concurrency at the time, and the seed that replays it."""
    r = Result.read(summary)
    cover = r.coverage
    if not cover:
        return []

    def cells(table: dict, names: dict | None = None) -> str:
        return ", ".join(f"{(names or {}).get(key, key)} {row['hits']}/{row['requests']}"
                         + (f" ({row['deviations']} deviating)" if row.get("deviations") else "")
                         for key, row in table.items() if row.get("requests"))

    return [f"mix covered (hits/requests), by prefix: {cells(cover.get('buckets') or {}, _BUCKET_NAMES)}",
            f"mix by requests in flight: {cells(cover.get('by_concurrency') or {}, _LEVEL_NAMES)}; near ties "
            f"{cover.get('near_ties', 0)}" + (f"; replay with --seed {r.seed}" if r.seed is not None else "")]


timing_lines = console_lines
