"""Phase 4: distinct memos rotate across concurrent slots (slot s gets memo (s + r) mod n in round r).

Every slot lands on blocks another slot wrote a round earlier, and every memo has its own
code, so a code from another memo in an answer is unambiguous. Round 0 (cold) goes all at once; the
rounds after it have no barrier, and a memo is never on two slots at once (rotate() below). With a
power target the phase keeps rotating after its planned rounds until the run has checked enough hits
to rule the target rate out, or its time budget is spent (the run then says by how much it fell short).
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
import time

from ...report.power import hits_needed
from ..record import concurrently
from ..requester import run_round
from ..results import UNSET, PhaseResult

TITLE = "rotation"
MAX_ROUNDS = 10_000           # a bound on the loop whatever the budget says


@dataclass(frozen=True)
class Settings:
    """[phases.rotation]"""
    slots: int = 4
    rounds: int = 14                 # at least; a power target can add rounds
    memo_tokens: int = 4500
    tasks: tuple[str, ...] = ("recall", "summary")   # slot s asks tasks[s % len(tasks)]


MINIMUMS = {"slots": 2, "rounds": 1, "memo_tokens": 64}


def check(s: Settings) -> tuple[str, str, str] | None:
    if not s.tasks or any(t not in ("recall", "summary") for t in s.tasks):
        return "phases.rotation", "tasks", 'must list "recall" and/or "summary"'
    if s.slots > 256:
        return "phases.rotation", "slots", "at most 256 concurrent slots"
    return None



@dataclass
class Result(PhaseResult):
    memos_redrawn: int = UNSET            # memos re-drawn until their fingerprints were apart
    memos_redrawn_for_recall: int = UNSET  # memos re-drawn because the model missed their code cold
    fingerprint_closest: dict = UNSET     # the closest pair of memos' cold fingerprints
    rounds: int = UNSET
    stopped: str = UNSET                  # why the phase stopped rotating
    seconds: float = UNSET


def target_rounds(scenario) -> int:
    """Rounds the phase plans: its own, or (with a power target) enough for the target if every hit
    of the phase were checked and no other phase checked any (round 0 is cold: it writes the blocks)."""
    r, p = scenario.rotation, scenario.power
    if not p.fault_rate:
        return r.rounds
    checked_per_round = r.slots if scenario.power_evidence == "fingerprint" else \
        sum(1 for slot in range(r.slots) if r.tasks[slot % len(r.tasks)] == "recall")
    if not checked_per_round:
        return r.rounds
    return max(r.rounds, math.ceil(hits_needed(p.fault_rate, p.confidence) / checked_per_round) + 1)


MAX_REDRAWS = 6               # memos re-drawn in a phase before it gives up on telling them apart
MAX_RECALL_REDRAWS = 3        # draws a slot gets after the model missed its memo's code cold


async def redraw_unrecalled(rq, state, memos: list, one) -> None:
    """Before rotation relies on codes: a memo whose code the model missed on its cold run (no hit yet: the
    model, not the cache) is re-drawn on its slot and sent cold, up to MAX_RECALL_REDRAWS times; a slot whose
    memos all stay unrecalled leaves the phase inconclusive, as any cold miss does elsewhere. Measured: the
    recall-trained qwen3next-recall answered one memo in 80 with a digit wrong, cold and on hits alike
    (3296-8236-5736 as ...-5706), which left rotation without a baseline (2026-12-04)."""
    r = rq.scenario.rotation
    redrawn, given_up = 0, []
    for j in range(len(memos)):
        attempt = 0
        while memos[j].memo_id in state.unrecalled:
            if attempt == MAX_RECALL_REDRAWS:
                given_up.append(memos[j].memo_id)
                break
            attempt += 1
            redrawn += 1
            rq.fingerprints.retire(memos[j].memo_id)
            memos[j] = await rq.memo(state, tokens=r.memo_tokens + 11 * attempt, slot=j, tag=f"rot{j}-recall{attempt}")
            await one(j, 0)           # the new memo's cold run, on its slot, as round 0 would have sent it
    state.unrecalled = None
    state.result.memos_redrawn_for_recall = redrawn
    for memo_id in given_up:
        state.mark_inconclusive(f"cold baseline failed: the model missed the code of memo {memo_id} and of the "
                                f"{MAX_RECALL_REDRAWS} memos drawn after it on its slot (recall_miss)")


async def cold_on_every_task(rq, state, memos: list, slots: list[int]) -> None:
    """Each memo's cold fingerprint on the tasks its own slot does not ask (round 0 measured that one):
    memo j meets every task as it rotates, and a later task's first hit would fetch the same cold run
    anyway, too late for a re-draw. Measured, vLLM 0.26, H200, qwen3next-recall, 32 and 128 slots: memos
    distinct on the recall question were alike on the summary one, found only at round 1, and every
    run ended INCONCLUSIVE (benchmarks/RESULTS.md, run F)."""
    tasks = rq.scenario.rotation.tasks
    await concurrently(*(rq.judge.cold_fingerprint(state, rq.question(memos[j].text, task), task=task, memo=memos[j],
                                                   slot=j, round=0)
                         for j in slots for task in tasks if task != tasks[j % len(tasks)]))


async def redraw_alike(rq, state, memos: list, one) -> None:
    """Before rotation relies on fingerprints: every pair of memos must be distinct on its cold runs, on
    every task it will be asked (round 0 measured its own slot's). A memo alike to an earlier one is
    re-drawn (another id, so other filler, and a slightly different length) and sent cold on its slot,
    until all are apart or the phase gives up: then it says which pair, and hits of memos with a look-alike
    do not count toward power (the phase is inconclusive only if no hit was told apart)."""
    r = rq.scenario.rotation
    await cold_on_every_task(rq, state, memos, list(range(len(memos))))
    for attempt in range(1, MAX_REDRAWS + 1):
        alike = None
        for j, memo in enumerate(memos):
            others = {other for task in r.tasks for other in rq.fingerprints.indistinct_from(memo.memo_id, task)}
            if others & {m.memo_id for m in memos[:j]}:
                alike = j
                break
        if alike is None:
            return
        rq.fingerprints.retire(memos[alike].memo_id)
        memos[alike] = await rq.memo(state, tokens=r.memo_tokens + 7 * attempt, slot=alike,
                                     tag=f"rot{alike}-redraw{attempt}")
        state.result.memos_redrawn = attempt
        await one(alike, 0)           # the new memo's cold run, on its slot, as round 0 would have sent it
        await cold_on_every_task(rq, state, memos, [alike])
    pair = rq.fingerprints.closest({m.memo_id for m in memos})
    if pair is not None and not pair.distinct:
        a = next(fp for fp in rq.fingerprints.live(pair.task) if fp.memo == pair.a)
        b = next(fp for fp in rq.fingerprints.live(pair.task) if fp.memo == pair.b)
        rq.note_indistinct(state, a, b, state.last)


async def rotate(rq, state, memos: list, one, planned: int, stop) -> tuple[int, str]:
    """Rounds 1 on, with no barrier between them: slot s asks its round-r memo as soon as that memo's
    round r-1 request (slot s+1's) has ended, judged, its twin and re-sends included. So no memo is ever
    on two slots at once, as in barriered rounds, yet a slot slow to be judged holds up one neighbour,
    not the whole width: the server is kept fed while the client judges (issue 34: a barrier made every
    round wait for the last answer's judging, 128 of them in a row at 128 slots), and requests enter and
    leave the server's batch at different times, as in real traffic. A stop ends every slot at the last
    round any slot had begun, so each round is full width. Only a slot about to begin a new round asks
    `stop(round_, unsettled)`, `unsettled` being the requests of the rounds begun that are not judged
    yet; it may answer "" (wait: those may reach a power target), so that no round is begun in vain.
    Returns (rounds run, why they stopped)."""
    n = len(memos)
    ended = [0] * n                        # per memo: the last round whose request on it has ended
    moved = [asyncio.Event() for _ in range(n)]
    settled = asyncio.Event()              # set as each request ends, judged
    reached, limit, why, judged = 1, None, "planned rounds done", 0

    async def lane(slot: int) -> None:
        nonlocal reached, limit, why, judged
        round_ = 1
        while True:
            while limit is None and round_ >= reached:      # a round begun is ended by every slot
                reason = stop(round_, n * (reached - 1) - judged)
                if reason is None:
                    break
                if reason:
                    limit, why = reached, reason
                    break
                settled.clear()
                await settled.wait()
            if limit is not None and round_ >= limit:
                return
            if round_ >= reached:                 # begun here, before any wait: a stop now ends it too
                reached = round_ + 1
                rq.round(state, round_, max(planned, reached),
                         {str(s): memos[(s + round_) % n].memo_id for s in range(n)})
            memo = (slot + round_) % n
            while ended[memo] < round_ - 1:       # one waiter per memo: slot s for slot s+1's request
                moved[memo].clear()
                await moved[memo].wait()
            try:
                await one(slot, round_)
            finally:
                judged += 1
                settled.set()
            ended[memo] = round_
            moved[memo].set()
            round_ += 1

    await concurrently(*(lane(slot) for slot in range(n)))
    return reached, why


def memos_ahead(scenario) -> list[tuple[int, str, bool]]:
    """The memos run() asks for (tokens, tag, with a code): the memo stock sizes them ahead (memo_stock.py)."""
    r = scenario.rotation
    return [(r.memo_tokens, f"rot{slot}", True) for slot in range(r.slots)]


def plan(scenario) -> dict:
    r = scenario.rotation
    rounds = target_rounds(scenario)
    return {"slots": r.slots, "rounds": rounds, "planned_requests": r.slots * rounds}


async def run(rq, state) -> None:
    s = rq.scenario
    r, p = s.rotation, s.power
    result = state.result = Result()
    memos = await rq.memos(state, [(tokens, slot, tag) for slot, (tokens, tag, _) in enumerate(memos_ahead(s))])
    needed = hits_needed(p.fault_rate, p.confidence) if p.fault_rate else 0
    evidence = s.power_evidence
    planned = target_rounds(s)
    started = time.monotonic()

    async def one(slot: int, round_: int):
        memo = memos[(slot + round_) % r.slots]
        task = r.tasks[slot % len(r.tasks)]
        return await rq.send(state, rq.question(memo.text, task), task=task, memo=memo, slot=slot,
                             round=round_, expect="cold" if round_ == 0 else "hit")

    if s.evidence.fingerprints:
        state.redraws_memos = True
    if s.evidence.codes:
        state.unrecalled = []
    # round 0, cold: every slot at once (the re-draws rely on all of it)
    await run_round(rq, state, 0, max(planned, 1), r.slots, lambda slot: memos[slot], one)
    if state.unrecalled is not None:
        await redraw_unrecalled(rq, state, memos, one)
    if s.evidence.fingerprints:
        await redraw_alike(rq, state, memos, one)
        state.redraws_memos = False       # memos alike from here on are only noted

    def stop(round_: int, unsettled: int) -> str | None:
        """Why the phase stops before `round_` (None: it goes on; "": ask again once one of the
        `unsettled` requests in flight has been judged, they may reach the target); asked as each slot
        ends a round."""
        if round_ >= MAX_ROUNDS:
            return "planned rounds done"
        if round_ < r.rounds:
            return None
        if not needed:
            return "planned rounds done"
        checked, failed = rq.checked(evidence)
        if checked >= needed:
            return "power target reached"
        if failed:
            return "a checked hit failed: more rounds cannot rule the target out"
        if time.monotonic() - started >= p.budget_s:
            return f"time budget of {p.budget_s:.0f} s spent"
        return "" if checked + unsettled >= needed else None

    round_, stopped = await rotate(rq, state, memos, one, planned, stop)
    closest = rq.fingerprints.closest({m.memo_id for m in memos}) if s.evidence.fingerprints else None
    if closest is not None:
        result.fingerprint_closest = {"memos": [closest.a, closest.b], "task": closest.task,
                                              "agreeing_tokens": closest.agreeing, "distance": closest.distance,
                                              "distinct": closest.distinct}
    result.rounds, result.stopped, result.seconds = round_, stopped, round(time.monotonic() - started, 1)


# --- what the phase adds to the progress estimate (report/progress.py) ---------------------------------

def progress_expected(fold, phase) -> int | None:
    """Main-arm requests the phase is expected to send under a power target (None: no target; the plan
    stands). `fold` is the run's report.progress.ProgressFold, `phase` its row for this phase."""
    target = fold.target()
    if target is None or phase.planned is None:
        return None
    evidence, _, _, needed = target
    rotation = fold.settings.get("rotation") or {}
    slots = int(rotation.get("slots") or 4)
    base = slots * int(rotation.get("rounds") or 1)
    tasks = rotation.get("tasks") or ["recall"]
    per_round = slots if evidence == "fingerprint" else sum(1 for s in range(slots) if tasks[s % len(tasks)] == "recall")
    checked = fold.tally.checked.get(evidence, 0)
    running = phase.status == "running"
    if fold.tally.failures.get(evidence, 0):      # it stops after its own rounds: more cannot rule it out
        return max(base, slots * math.ceil(phase.done / slots)) if running else base
    if not per_round:
        return phase.planned
    more = max(0, needed - checked)
    gained = checked - phase.checked_at_start if running else 0
    if running and phase.done >= 2 * slots and gained <= 0:
        return phase.planned                        # hits are not being checked: it runs to its plan
    if running and phase.done > slots and gained > 0:
        per_round = gained * slots / (phase.done - slots)     # as seen after the cold round 0
        expected = slots * math.ceil(phase.done / slots) + slots * math.ceil(more / per_round)
    else:
        expected = slots + slots * math.ceil(more / per_round)
    return max(base, min(phase.planned, expected))


def progress_remaining(fold, phase, remaining: float, rate: float, elapsed: float) -> float:
    """Past its own rounds it stops once its time budget is spent (its own rounds always run)."""
    if fold.target() is None:
        return remaining
    budget = float((fold.settings.get("power") or {}).get("budget_s") or 0.0)
    rotation = fold.settings.get("rotation") or {}
    own = max(0, int(rotation.get("slots") or 4) * int(rotation.get("rounds") or 1) - phase.done) * rate
    return max(own, min(remaining, max(0.0, budget - elapsed))) if budget > 0 else remaining
