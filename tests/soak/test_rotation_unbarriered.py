"""Rotation's rounds after the cold one have no barrier (issue 34): slot s asks its round-r memo once
that memo's round r-1 request has ended. Held here: no memo is ever on two slots at once, a slow slot
holds up its neighbour and not the whole width, a stop ends every slot at the same round, and the
raw replay of rate.py waits for what hitproof waited for, not for what merely ended first."""

from __future__ import annotations

import asyncio
import random
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tui.core.soak.phases.rotation import rotate

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import evidence_rate  # noqa: E402


class Rounds:
    """The Requester's part rotate() uses: announcing a round."""

    def __init__(self):
        self.announced = []

    def round(self, state, round_, rounds, assignment):
        self.announced.append((round_, rounds, assignment))


def run_rotate(slots: int, delay, stop, planned: int = 3):
    memos = [SimpleNamespace(memo_id=f"m{j}") for j in range(slots)]
    spans, clock = [], {"now": 0}
    rq = Rounds()

    async def one(slot, round_):
        clock["now"] += 1
        began = clock["now"]
        await asyncio.sleep(delay(slot, round_))
        clock["now"] += 1
        spans.append((slot, round_, (slot + round_) % slots, began, clock["now"]))

    rounds, why = asyncio.run(rotate(rq, None, memos, one, planned, stop))
    return spans, rounds, why, rq.announced


def test_no_memo_is_on_two_slots_at_once_and_rounds_overlap():
    rng = random.Random(7)
    delays = {(s, r): rng.uniform(0, 0.004) for s in range(8) for r in range(12)}
    delays[3, 1] = 0.03                         # long enough for other slots to be into round 2
    spans, rounds, why, announced = run_rotate(8, lambda s, r: delays[s, r],
                                               lambda r, unsettled: "planned rounds done" if r >= 12 else None)
    assert (rounds, why) == (12, "planned rounds done")
    assert sorted((s, r) for s, r, *_ in spans) == [(s, r) for s in range(8) for r in range(1, 12)]
    for memo in range(8):
        on = sorted((b, e) for s, r, m, b, e in spans if m == memo)
        assert all(e <= b2 for (_, e), (b2, _) in zip(on, on[1:])), f"memo {memo} on two slots at once"
    overlapped = sum(1 for s, r, m, b, e in spans for s2, r2, m2, b2, e2 in spans if r2 == r + 1 and b2 < e)
    assert overlapped > 0, "a barrier: no request of round r+1 began before every request of round r ended"
    assert [a[0] for a in announced] == list(range(1, 12))
    assert announced[0][2] == {str(s): f"m{(s + 1) % 8}" for s in range(8)}


def test_a_slow_slot_holds_up_its_neighbour_not_the_whole_width():
    """Slot 0 takes 40 ms a request, the others 1 ms: slot 7 (which asks slot 0's memos next) waits for
    it, yet slots far from it run ahead; with a barrier every slot would begin each round together."""
    spans, *_ = run_rotate(8, lambda s, r: 0.04 if s == 0 else 0.001, lambda r, unsettled: "done" if r >= 6 else None)
    began = {(s, r): b for s, r, m, b, e in spans}
    ended = {(s, r): e for s, r, m, b, e in spans}
    assert began[1, 3] < ended[0, 1]          # slot 1 is two rounds on before slot 0 ends round 1


def test_a_stop_ends_every_slot_at_the_last_round_any_slot_began():
    checked = {"n": 0}

    def stop(round_, unsettled):
        checked["n"] += 1
        return "power target reached" if checked["n"] > 20 else None

    rng = random.Random(3)
    spans, rounds, why, _ = run_rotate(6, lambda s, r: rng.uniform(0, 0.003), stop)
    assert why == "power target reached"
    per_round = {}
    for s, r, *_ in spans:
        per_round.setdefault(r, set()).add(s)
    assert sorted(per_round) == list(range(1, rounds))
    assert all(len(slots) == 6 for slots in per_round.values()), "a round left part-wide"


def test_a_round_begun_by_a_slot_waiting_for_its_memo_is_ended_by_every_slot():
    """Slot 0 begins round 2 and waits for its memo (slot 1's, slow); slot 2 then asks to stop. Round 2 was
    begun: every slot ends it (a round announced only after the memo's wait was left one slot wide)."""
    asked = []

    def stop(round_, unsettled):                     # round 1 goes on; so does round 2, asked first
        asked.append(round_)
        return None if round_ == 1 or asked == [1, 2] else "power target reached"

    delays = {0: 0.001, 1: 0.03, 2: 0.01}
    spans, rounds, why, announced = run_rotate(3, lambda s, r: delays[s], stop)
    assert (rounds, why) == (3, "power target reached")
    assert sorted((s, r) for s, r, *_ in spans) == [(s, r) for s in range(3) for r in (1, 2)]
    assert [a[0] for a in announced] == [1, 2]


def test_a_target_the_requests_in_flight_may_reach_is_waited_for_not_overshot():
    """Hits are checked as requests end: with 20 needed and 4 slots, rounds 1 to 5 give 20. A slot that
    ends round 5 first must not start round 6 while the other round-5 requests may still reach it."""
    done = {"n": 0}
    memos = [SimpleNamespace(memo_id=f"m{j}") for j in range(4)]

    async def one(slot, round_):
        await asyncio.sleep(0.001 + 0.004 * slot)          # slot 0 ends each round first
        done["n"] += 1

    def stop(round_, unsettled):
        if done["n"] >= 20:
            return "power target reached"
        return "" if done["n"] + unsettled >= 20 else None

    rounds, why = asyncio.run(rotate(Rounds(), None, memos, one, 3, stop))
    assert (rounds, why, done["n"]) == (6, "power target reached", 20)      # rounds 0 to 5, none more


def test_a_failing_slot_ends_the_phase_with_its_error():
    async def go():
        memos = [SimpleNamespace(memo_id=f"m{j}") for j in range(4)]

        async def one(slot, round_):
            await asyncio.sleep(0.001)
            if (slot, round_) == (2, 3):
                raise RuntimeError("server gone")

        await rotate(Rounds(), None, memos, one, 3, lambda r, unsettled: None)

    with pytest.raises(RuntimeError, match="server gone"):
        asyncio.run(asyncio.wait_for(go(), 10))


def log_of(requests):
    """A read_log() result from (request, phase, slot, round, memo, arm, start seq, end seq)."""
    starts = {r: {"seq": s, "phase": p, "slot": sl, "round": rd, "arm": a, "memo": m}
              for r, p, sl, rd, m, a, s, e in requests}
    ends = {r: {"seq": e, "ttft": 0.01, "cached": 0, "error": None} for r, p, sl, rd, m, a, s, e in requests}
    order = [r for r, *_ in sorted(requests, key=lambda x: x[6])]
    return {"nonce": "abcdefgh", "soak_s": 1.0, "verdict": "pass", "order": order, "starts": starts, "ends": ends}


def test_the_replay_waits_for_its_slot_and_its_memo_in_barrier_free_rounds():
    requests = [
        (1, "cold_hit", None, None, "a", "main", 1, 2),
        (2, "rotation", 0, 0, "m0", "main", 3, 6),         # round 0: together, barriered
        (3, "rotation", 1, 0, "m1", "main", 4, 5),
        (4, "rotation", 1, 1, "m0", "main", 7, 10),        # slot 1 takes m0 after slot 0's round 0
        (5, "rotation", 0, 1, "m1", "main", 8, 9),
        (6, "rotation", 0, 2, "m0", "main", 11, 12),       # slot 0 waits for m0 (4) and for its slot (5)
        (7, "rotation", 1, 2, "m1", "main", 13, 14),       # 6 had ended too: not waited for
        (8, "rotation", 1, 2, "m1", "isolation", 15, 16),  # a re-run after every phase: all before it
        (9, "determinism", None, None, "d", "main", 17, 18),
    ]
    log = log_of(requests)
    kept = [{"request": None, "body": "probe abcdefgh"}] + [{"request": r[0], "body": f"b{r[0]} abcdefgh"}
                                                            for r in requests]
    plan, facts = evidence_rate.build_plan(log, kept, 8000, random.Random(1))
    deps = {r["key"]: (r["deps"], r["after"]) for r in plan["requests"]}
    assert deps["2"] == ([0, 1], 0) and deps["3"] == ([0, 1], 0)            # as before: all that had ended
    assert deps["4"] == ([], 4) and deps["5"] == ([], 4)                    # after everything before round 1
    assert deps["6"] == ([4, 5], 4)                                         # its memo's (4) and its slot's (5)
    assert deps["7"] == ([4, 5], 4)                                         # slot 1's (4), memo m1's (5)
    assert deps["8"][0] == list(range(8)) and deps["9"][0] == list(range(9))
    assert facts["nonce_replaced"] == 10


def test_the_replay_keeps_a_barrier_free_plan_in_order(monkeypatch):
    """replay() honours "after": a request that must wait for every earlier one does."""
    seen = []

    async def fake_one(pool, request):
        seen.append(("start", request.rsplit(b"\n", 1)[-1]))
        await asyncio.sleep(0.02 if request.endswith(b"slow") else 0)
        seen.append(("end", request.rsplit(b"\n", 1)[-1]))
        return {"ttft": 0.0, "raw": b""}

    async def no_connections(self, n):
        return None

    monkeypatch.setattr(evidence_rate, "raw_one", fake_one)
    monkeypatch.setattr(evidence_rate.Pool, "fill", no_connections)
    plan = {"port": 1, "max_in_flight": 0, "requests": [
        {"key": "0", "body": "slow", "deps": [], "after": 0},
        {"key": "1", "body": "fast", "deps": [], "after": 0},
        {"key": "2", "body": "later", "deps": [], "after": 2}]}
    result = asyncio.run(evidence_rate.replay(plan))
    assert seen.index(("start", b"later")) > seen.index(("end", b"slow"))
    assert seen.index(("start", b"fast")) < seen.index(("end", b"slow"))      # no wait it was not given
    assert [r["key"] for r in result["requests"]] == ["0", "1", "2"]
