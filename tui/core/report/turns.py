"""The agent replay turn by turn, for every format: prompt and cached tokens, time to first token,
the problems each arm showed, and the speculative acceptance length with reuse and in the salted
control arm (1 + accepted / drafts over the turn, from the server's counters; "-" without a drafter).
Pure."""

from __future__ import annotations

from typing import Any

from . import fmt
from .report import RunReport

HEADERS = ["turn", "req", "task", "prompt", "cached", "TTFT ms", "accept hit", "accept ctl",
           "problems"]


def agent_turns(report: RunReport) -> list[dict[str, Any]]:
    """The agent replay's per-turn rows as its phase summary recorded them (empty without the phase)."""
    turns = (report.phases.get("agent_replay") or {}).get("turns")
    return [t for t in turns if isinstance(t, dict)] if isinstance(turns, list) else []


def collapse_threshold(report: RunReport) -> float:
    settings = ((report.header.scenario if report.header else None) or {}).get("settings") or {}
    value = (settings.get("agent_replay") or {}).get("acceptance_collapse")
    return float(value) if isinstance(value, (int, float)) else 1.05


def acceptance(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else fmt.MISSING


def _problems(turn: dict[str, Any]) -> str:
    parts = []
    if turn.get("problems"):
        parts.append("hit: " + ", ".join(turn["problems"]))
    control = turn.get("control") or {}
    if control.get("problems"):
        parts.append("control: " + ", ".join(control["problems"]))
    return "; ".join(parts) or fmt.MISSING


def turn_rows(report: RunReport) -> list[list[str]]:
    """One row of cells a turn, in HEADERS order."""
    rows = []
    for t in agent_turns(report):
        control = t.get("control") or {}
        rows.append([fmt.cell(t.get("turn")), fmt.cell(t.get("request")), fmt.cell(t.get("task")),
                     fmt.cell(t.get("prompt_tokens")), fmt.cell(t.get("cached_tokens")), fmt.ms(t.get("ttft_ms")),
                     acceptance(t.get("acceptance")), acceptance(control.get("acceptance")), _problems(t)])
    return rows


def has_acceptance(report: RunReport) -> bool:
    return any(isinstance(t.get("acceptance"), (int, float)) or
               isinstance((t.get("control") or {}).get("acceptance"), (int, float)) for t in agent_turns(report))


def collapsed(report: RunReport, value: Any) -> bool:
    """An acceptance length at or below the scenario's collapse threshold (the drafter contributes nothing)."""
    return isinstance(value, (int, float)) and value <= collapse_threshold(report)


def acceptance_sentence(report: RunReport) -> str:
    """What the acceptance column says, in words, for the line under the table."""
    if not agent_turns(report):
        return ""
    if not has_acceptance(report):
        return ("acceptance length: none recorded (the server reported no speculative drafts: no drafter, "
                "or no spec-decode counters in /metrics)")
    return ("acceptance length = 1 + accepted / drafts over each turn, from the server's spec-decode counters "
            "(accept hit: with prefix reuse; accept ctl: the salted control arm); "
            f"at or below {collapse_threshold(report):.2f} the drafter contributes nothing")
