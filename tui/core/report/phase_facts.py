"""What each phase adds to the reports, asked of the phase's own module (tui/core/soak/phases/NAME.py,
found through the registry: this part cannot import a phase). Every hook is optional and reads only the
phase's summary as the log holds it (`report.phases[name]`), so an old log reports as it always did:

- `console_lines(summary) -> list[str]`: lines under the headless summary table (and `--format text`)
- `timing_lines(summary) -> list[str]`: sentences of the markdown "Timing and determinism" section
- `section(summary) -> Section | None`: a section of its own in markdown and html
- `ttft_label(summary) -> str`: words after the phase's name on its TTFT-cut line ("(N prompt tokens)")
- `turn_table(summary, settings) -> TurnTable | None`: a table of its turns, in every format

The reports call them in the order the phases ran. Elsewhere a phase may declare: its kind of power
evidence (`POWER_EVIDENCE`, `POWER_TASK`, `POWER_FAILS`, `POWER_UNIT`, `power_evidence`: power.py), its
own length under a power target (`progress_expected`, `progress_remaining`: progress.py), checks of its
own in JUnit (`junit_checks`, `junit_skip`, `JUNIT_RELATED`: junit.py), the name of its turns chart
(`TURNS_LABEL`, `TURNS_CONTROL`: html.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..config.phase_registry import hook
from .report import RunReport


@dataclass
class Section:
    """A phase's own section of the markdown and html reports: paragraphs, then a table, then notes."""
    title: str                                  # "Eviction"
    anchor: str                                 # its html id
    header: tuple[str, ...] = ()
    rows: list[list[str]] = field(default_factory=list)
    paragraphs: list[str] = field(default_factory=list)          # markdown: one paragraph each
    html_paragraphs: list[str] | None = None    # html: one <p> each (None: the markdown paragraphs)
    notes: list[str] = field(default_factory=list)               # markdown: bullets after the table


@dataclass
class TurnTable:
    """A phase's table of its turns (the agent replay's): one row of cells a turn, some cells flagged."""
    title: str                                  # "Agent replay, turn by turn"
    anchor: str                                 # its html id and table class
    headers: list[str]
    rows: list[list[str]]
    keys: list[Any]                             # html: each row's data-turn
    flagged: list[set[int]]                     # each row's columns to flag (red: a collapsed acceptance)
    text_columns: tuple[int, ...] = ()          # words, left-aligned (the rest are numbers)
    wrap_columns: tuple[int, ...] = ()          # the console may wrap these
    data_columns: dict[int, str] = field(default_factory=dict)   # html: column -> data-NAME holding the cell
    sentence: str = ""                          # under the table


def contributions(report: RunReport, what: str) -> list[tuple[str, Any]]:
    """(phase, what the phase's hook made of its summary) for every phase that ran and has the hook."""
    out = []
    for name, summary in report.phases.items():
        made = hook(name, what)
        if made is not None:
            out.append((name, made(summary)))
    return out


def console_lines(report: RunReport, name: str) -> list[str]:
    made = hook(name, "console_lines")
    return made(report.phases.get(name) or {}) if made is not None else []


def timing_lines(report: RunReport) -> list[str]:
    return [line for _, lines in contributions(report, "timing_lines") for line in lines]


def sections(report: RunReport) -> list[Section]:
    return [made for _, made in contributions(report, "section") if made is not None]


def turn_tables(report: RunReport) -> list[TurnTable]:
    """`turn_table(summary, settings)`: the phase's settings as the log header recorded them."""
    settings = ((report.header.scenario if report.header else None) or {}).get("settings") or {}
    out = []
    for name, summary in report.phases.items():
        made = hook(name, "turn_table")
        table = made(summary, settings.get(name) or {}) if made is not None else None
        if table is not None:
            out.append(table)
    return out


def ttft_label(name: str, summary: dict[str, Any]) -> str:
    made = hook(name, "ttft_label")
    return made(summary) if made is not None else ""
