"""Phase 8: replay an ordered agent conversation whose prompt grows every turn, then the same
replay with a fresh cache_salt per request (the control arm).

A turn that fails with reuse and passes without it is a fail-class finding naming the first
bad request; failing both ways is the model. With a speculative drafter, acceptance length is
recorded per turn and a collapse to 1.00 on reuse (and not in the control arm) is flagged.
"""

from __future__ import annotations

from dataclasses import dataclass

from pathlib import Path

from ...evidence.agent import AgentTurn, Conversation, generate, load_capture
from ...evidence.memos import Memo
from ...server.metrics import acceptance_length
from ...checks.answers import hit_path_problems
from ...evidence.tokens import estimate_tokens
from ..results import UNSET, PhaseResult
from .conversation import judge_rise
from ...report import fmt
from ...report.phase_facts import TurnTable

TURNS_LABEL = "agent turns"          # its cached tokens per turn, charted in the html report,
TURNS_CONTROL = True                 # with the salted control arm's beside them
TITLE = "agent replay"


@dataclass(frozen=True)
class Settings:
    """[phases.agent_replay]"""
    source: str = ""                 # a JSONL capture of chat requests; empty: the built-in generator
    turns: int = 6                   # generator: requests in the conversation
    tools: int = 8                   # generator: tool schemas in the first block
    growth_tokens: int = 200         # generator: tool-result text added per turn (at least a block)
    integrity_every: int = 2         # generator: ask for the planted code every k turns (and last)
    max_tokens: int = 24
    control_arm: bool = True         # replay again with a fresh cache_salt per request
    acceptance_collapse: float = 1.05   # a drafter's acceptance length at or below this has collapsed


MINIMUMS = {"turns": 1, "tools": 1, "growth_tokens": 8, "integrity_every": 1, "max_tokens": 1,
            "acceptance_collapse": 1.0}



@dataclass
class Result(PhaseResult):
    source: str = UNSET                       # the capture replayed, or the generator
    turns: list[dict] = UNSET                 # one per turn: tokens, TTFT, problems, acceptance (and control's)
    cached_by_turn: list[int | None] = UNSET


def plan(scenario) -> dict:
    a = scenario.agent_replay
    turns = a.turns if not a.source else 0
    return {"slots": 1, "rounds": turns, "planned_requests": turns}


def conversation(rq, state) -> Conversation:
    a = rq.scenario.agent_replay
    if a.source:
        path = Path(a.source)
        if not path.is_absolute() and rq.scenario.source not in ("<built-in>", "<scenario>"):
            path = Path(rq.scenario.source).parent / path
        return load_capture(path, max_tokens=a.max_tokens)
    code = rq.new_code()
    growth = max(a.growth_tokens, rq.server.grid + 16)
    return generate(tools=a.tools, turns=a.turns, growth_tokens=growth, integrity_every=a.integrity_every,
                    code=code, seed=f"{rq.scenario.seed}:{rq.nonce}", nonce=rq.nonce,
                    max_tokens=a.max_tokens,
                    recall_max_tokens=rq.scenario.evidence.recall_max_tokens)


def spec_for(rq, turn: AgentTurn, salt: str | None):
    if turn.messages is not None:
        spec = rq.spec(messages=turn.messages, max_tokens=turn.max_tokens, salt=salt)
        spec.tools = turn.tools
        return spec
    return rq.spec(prompt=turn.prompt, max_tokens=turn.max_tokens, salt=salt, stop=turn.stop)


async def replay(rq, state, convo: Conversation, memo: Memo | None, *, control: bool) -> list[dict]:
    """One pass over the conversation; per turn its record, its problems and acceptance length."""
    out = []
    for turn in convo.turns:
        before = await rq.scrape() if rq.metrics_available else None
        record = await rq.send(state, spec_for(rq, turn, rq.fresh_salt() if control else None), task=turn.task,
                               memo=memo, round=turn.index, turn=turn.index + 1,
                               expect="cold" if control or turn.index == 0 else "hit",
                               arm="control" if control else "main", control=False)
        after = await rq.scrape() if before is not None else None
        out.append({"turn": turn.index + 1, "record": record,
                    "problems": {kind: (offset, detail) for kind, offset, detail in hit_path_problems(record.checks)},
                    "acceptance": acceptance_length(before, after)})
    return out


async def run(rq, state) -> None:
    a = rq.scenario.agent_replay
    convo = conversation(rq, state)
    memo = None
    if convo.code:
        memo = Memo(memo_id="agent", code=convo.code, text=convo.opening, tokens=estimate_tokens(convo.opening),
                    sizing="estimate", code_offset=convo.opening.find(convo.code), code_token_start=None,
                    code_token_end=None, grid=rq.server.grid)
        rq.register_memo(state, memo)
    main = await replay(rq, state, convo, memo, control=False)
    control = await replay(rq, state, convo, memo, control=True) if a.control_arm else []
    judge(rq, state, main, control, a.acceptance_collapse)
    state.result = Result(source=convo.source,
                          turns=[summary(m, c) for m, c in zip(main, control or [None] * len(main))],
                          cached_by_turn=[m["record"].cached for m in main])


def judge(rq, state, main: list[dict], control: list[dict], collapse: float) -> None:
    previous = None
    for m in main:
        judge_rise(rq, state, previous, m["record"], m["turn"])
        previous = m["record"]
    kinds = sorted({kind for m in main for kind in m["problems"]})
    for kind in kinds:
        bad = [(i, m) for i, m in enumerate(main) if kind in m["problems"]]
        reuse_only = [(i, m) for i, m in bad if control and kind not in control[i]["problems"]]
        both = [(i, m) for i, m in bad if not control or kind in control[i]["problems"]]
        if reuse_only:
            i, first = reuse_only[0]
            offset, detail = first["problems"][kind]
            rq.finding(state, kind, "fail", first["record"], offset=offset,
                       detail=(f"turn {first['turn']} (request {first['record'].request}) is the first bad request: "
                               f"{detail} with prefix reuse, right in the control arm "
                               f"(request {control[i]['record'].request}, fresh cache_salt)"),
                       first_bad_request=first["record"].request, first_bad_turn=first["turn"],
                       bad_requests=[m["record"].request for _, m in reuse_only],
                       control_request=control[i]["record"].request)
        if both:
            i, first = both[0]
            offset, detail = first["problems"][kind]
            state.model_failures += len(both)
            why = ("fails the same way in the control arm: the model, not the cache" if control
                   else "no control arm was run")
            rq.finding(state, kind, "info", first["record"], offset=offset,
                       detail=f"turn {first['turn']}: {detail}; {why}",
                       bad_requests=[m["record"].request for _, m in both])
    for i, m in enumerate(main):
        acc = m["acceptance"]
        if acc is None or acc > collapse or not m["record"].hit:
            continue
        other = control[i]["acceptance"] if control else None
        if other is not None and other > collapse:
            rq.finding(state, "acceptance_collapse", "fail", m["record"],
                       detail=(f"turn {m['turn']}: speculative acceptance length {acc:.2f} on a prefix-cache hit, "
                               f"{other:.2f} in the control arm: the drafter contributes nothing after reuse"),
                       acceptance=acc, control_acceptance=other)
            break
        rq.finding(state, "acceptance_collapse", "info", m["record"],
                   detail=f"turn {m['turn']}: acceptance length {acc:.2f} (control "
                          f"{'n/a' if other is None else f'{other:.2f}'}): not attributable to the cache")
        break


def summary(m: dict, c: dict | None) -> dict:
    r = m["record"]
    row = {"turn": m["turn"], "request": r.request, "task": r.task, "prompt_tokens": r.completion.prompt_tokens,
           "cached_tokens": r.cached, "ttft_ms": None if r.completion.ttft_s is None
           else round(r.completion.ttft_s * 1000, 1), "problems": sorted(m["problems"]),
           "acceptance": m["acceptance"]}
    if c is not None:
        row["control"] = {"request": c["record"].request, "cached_tokens": c["record"].cached,
                          "problems": sorted(c["problems"]), "acceptance": c["acceptance"]}
    return row


# --- what the phase adds to the reports: its turns, one row each ---------------------------------------
# prompt and cached tokens, time to first token, the problems each arm showed, and the speculative
# acceptance length with reuse and in the salted control arm (1 + accepted / drafts over the turn, from
# the server's counters; "-" without a drafter)

TURN_HEADERS = ["turn", "req", "task", "prompt", "cached", "TTFT ms", "accept hit", "accept ctl", "problems"]
ACCEPTANCE_COLUMNS = (6, 7)


def turn_table(summary: dict, settings: dict) -> TurnTable | None:
    turns = Result.read(summary).turns
    turns = [t for t in turns if isinstance(t, dict)] if isinstance(turns, list) else []
    if not turns:
        return None
    value = settings.get("acceptance_collapse")
    threshold = float(value) if isinstance(value, (int, float)) else 1.05
    rows, flagged = [], []
    for t in turns:
        control = t.get("control") or {}
        values = (t.get("acceptance"), control.get("acceptance"))
        rows.append([fmt.cell(t.get("turn")), fmt.cell(t.get("request")), fmt.cell(t.get("task")),
                     fmt.cell(t.get("prompt_tokens")), fmt.cell(t.get("cached_tokens")), fmt.ms(t.get("ttft_ms")),
                     *map(_acceptance, values), _problems(t)])
        # at or below the scenario's collapse threshold the drafter contributes nothing
        flagged.append({at for at, v in zip(ACCEPTANCE_COLUMNS, values) if isinstance(v, (int, float)) and v <= threshold})
    return TurnTable("Agent replay, turn by turn", "agent-turns", TURN_HEADERS, rows, [t.get("turn") for t in turns],
                     flagged, text_columns=(2, 8), wrap_columns=(8,), data_columns=dict.fromkeys(ACCEPTANCE_COLUMNS,
                                                                                                "acceptance"),
                     sentence=_acceptance_sentence(turns, threshold))


def _acceptance(value) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else fmt.MISSING


def _problems(turn: dict) -> str:
    parts = []
    if turn.get("problems"):
        parts.append("hit: " + ", ".join(turn["problems"]))
    control = turn.get("control") or {}
    if control.get("problems"):
        parts.append("control: " + ", ".join(control["problems"]))
    return "; ".join(parts) or fmt.MISSING


def _acceptance_sentence(turns: list[dict], threshold: float) -> str:
    """What the acceptance columns say, in words, for the line under the table."""
    if not any(isinstance(t.get("acceptance"), (int, float)) or
               isinstance((t.get("control") or {}).get("acceptance"), (int, float)) for t in turns):
        return ("acceptance length: none recorded (the server reported no speculative drafts: no drafter, "
                "or no spec-decode counters in /metrics)")
    return ("acceptance length = 1 + accepted / drafts over each turn, from the server's spec-decode counters "
            "(accept hit: with prefix reuse; accept ctl: the salted control arm); "
            f"at or below {threshold:.2f} the drafter contributes nothing")
